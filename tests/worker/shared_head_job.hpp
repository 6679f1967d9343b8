#pragma once
// A job whose lines share one prompt head, for the prefix tier's and the
// prefix links' golden tests over WorkerRuntime (stories260K).

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/kv_store.hpp"
#include "tests/support/stories_reference.hpp"
#include "worker/worker_runtime.hpp"

namespace shardline::worker::testing {

/// A runtime of stories260K with 16-position blocks, a 2 MiB KV cache and
/// one thread; prefix caching as `caching`.
inline WorkerRuntimeOptions shared_head_options(const std::string& name, bool caching) {
  WorkerRuntimeOptions o;
  o.name = name;
  o.engine.model_dir = testing_support::kStoriesDir;
  o.engine.block_size = 16;
  o.engine.kv_cache_bytes = 2u << 20;
  o.engine.max_num_seqs = 32;
  o.engine.max_num_batched_tokens = 256;
  o.engine.num_threads = 1;
  o.engine.enable_prefix_caching = caching;
  return o;
}

/// WorkerRuntime::create (a failure fails the test: null).
inline std::unique_ptr<WorkerRuntime> make_runtime(WorkerRuntimeOptions o) {
  auto rt = WorkerRuntime::create(std::move(o));
  EXPECT_TRUE(rt.ok()) << (rt.ok() ? "" : rt.error().to_string());
  return rt.ok() ? std::move(rt).value() : nullptr;
}

/// `num_lines` lines of job `job`: 70 shared tokens (4 full blocks of 16
/// and 6 more), then 5 of the line's own; sampled (temperature 0.8),
/// seeded (seed0 + line), `max_tokens` each, two choices per line.
inline std::vector<BatchRequest> shared_head_lines(std::uint64_t job, int num_lines, int max_tokens,
                                                   std::uint64_t seed0) {
  std::vector<std::int32_t> head{1};
  for (int i = 1; i < 70; ++i) head.push_back(2 + (i * 37) % 480);
  std::vector<BatchRequest> out;
  for (int l = 0; l < num_lines; ++l) {
    BatchRequest r;
    r.job_id = job;
    r.line_index = static_cast<std::uint64_t>(l);
    r.custom_id = "line" + std::to_string(l);
    r.prompt_token_ids = head;
    for (int t = 0; t < 5; ++t) r.prompt_token_ids.push_back(3 + (l * 11 + t * 5) % 400);
    r.params.temperature = 0.8f;
    r.params.max_tokens = max_tokens;
    r.params.seed = seed0 + static_cast<std::uint64_t>(l);
    r.params.has_seed = true;
    r.return_token_ids = true;
    r.n = 2;
    out.push_back(std::move(r));
  }
  return out;
}

/// What the KV-store actor answers a put of prefix blocks, from a KvStore.
inline Result<PrefixPutAck> put_prefix_blocks_acked(kvstore::KvStore& store, std::uint64_t salt,
                                                    std::span<const kvstore::PrefixBlockWrite> blocks) {
  auto stored = store.put_prefix_blocks(blocks);
  if (!stored.ok()) return std::move(stored).error();
  PrefixPutAck ack{*stored, {}};
  for (const auto& b : blocks)
    if (store.keeps_prefix_block(salt, b.name, b.tokens.size())) ack.kept.push_back(b.name);
  return ack;
}

/// Each line's choices' token ids, by line.
using LineOutputs = std::map<std::uint64_t, std::vector<std::vector<std::int32_t>>>;

/// Steps `rt` until it has no work; every line must succeed.
inline LineOutputs run_to_end(WorkerRuntime& rt) {
  LineOutputs out;
  for (int i = 0; i < 10000 && rt.has_work(); ++i) {
    auto step = rt.step();
    EXPECT_TRUE(step.ok()) << (step.ok() ? "" : step.error().to_string());
    if (!step.ok()) break;
    for (const BatchResult& r : step->results) {
      EXPECT_TRUE(r.ok) << r.error_message;
      for (const BatchChoice& c : r.choices) out[r.line_index].push_back(c.token_ids);
    }
  }
  return out;
}

}  // namespace shardline::worker::testing
