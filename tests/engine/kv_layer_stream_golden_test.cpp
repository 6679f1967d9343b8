// Golden, on the shipped stories260K: DéjàVu's layer-by-layer prompt
// streaming (seed 003 §4.1.1 (3)). With set_stream_prompt_by_layer, every
// prefill chunk leaves the engine as one increment per layer, pushed while
// the forward pass runs (before the step's sampling and before any later
// increment of the request); decode positions still go out after their step.
// Merged, the layer increments hold exactly the bytes that step-end
// streaming produces, and the outputs do not change.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "engine/group/engine_builder.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/kv_host_tier.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_kv_layer_stream_golden_test {

using testing_support::HostTier;
using testing_support::kStoriesDir;

constexpr int kRequests = 6;

EngineInstance make_engine() {
  EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 64;
  o.max_num_batched_tokens = 24;  // prompts of ~40 tokens prefill in chunks
  o.max_model_len = 256;
  o.check_integrity = true;
  o.num_threads = 1;
  auto e = build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  return std::move(e).value();
}

struct Pushed {
  kvstore::KvRange range;
  std::size_t token_ids = 0;
  int step = 0;  ///< engine steps completed when it was pushed
};

struct RecordingSink final : KvStreamSink {
  std::map<std::uint64_t, std::unique_ptr<HostTier>>* tiers = nullptr;
  std::map<std::uint64_t, std::vector<Pushed>> pushed;
  const int* steps_done = nullptr;
  bool accepting() const override { return true; }
  void push(KvIncrement inc) override {
    pushed[inc.request_id].push_back({inc.range, inc.token_ids.size(), *steps_done});
    (*tiers)[inc.request_id]->merge(inc.range, inc.chunk);
  }
};

struct StreamedRun {
  std::map<std::uint64_t, RequestOutput> outputs;
  std::map<std::uint64_t, std::unique_ptr<HostTier>> tiers;
  std::map<std::uint64_t, std::vector<Pushed>> pushed;
  std::map<std::uint64_t, int> prompt_len;
  int num_layers = 0;
};

StreamedRun run(bool by_layer) {
  EngineInstance e = make_engine();
  StreamedRun r;
  const kvstore::KvModelShape shape = e.executor->kv_model_shape();
  r.num_layers = shape.num_layers;
  int steps = 0;
  RecordingSink sink;
  sink.tiers = &r.tiers;
  sink.steps_done = &steps;
  e.engine->set_kv_sink(&sink);
  e.engine->set_stream_prompt_by_layer(by_layer);
  const char* texts[] = {"Once upon a time there was a little girl named Lily who loved to play in the park",
                         "The little dog ran to the big tree and looked up at the bird",
                         "Tom and his mom went to the store to buy some apples and bread for lunch",
                         "One day, a bird"};
  const auto params = testing_support::mixed_sampling_params(kRequests, 20);
  for (std::uint64_t id = 0; id < kRequests; ++id) {
    r.tiers[id] = std::make_unique<HostTier>(shape);
    std::vector<std::int32_t> prompt = e.tokenizer->encode(texts[id % 4], true);
    r.prompt_len[id] = static_cast<int>(prompt.size());
    EXPECT_TRUE(e.engine->add_request(id, std::move(prompt), params[id]).ok());
  }
  while (e.engine->has_unfinished()) {
    auto outs = e.engine->step();
    EXPECT_TRUE(outs.ok()) << (outs.ok() ? "" : outs.error().to_string());
    if (!outs.ok()) break;
    ++steps;
    for (auto& o : *outs) r.outputs[o.request_id] = std::move(o);
  }
  r.pushed = std::move(sink.pushed);
  return r;
}

TEST(KvLayerStreamGolden, PrefillChunksGoOutLayerByLayerWithTheSameBytes) {
  const StreamedRun step_end = run(false);
  const StreamedRun by_layer = run(true);
  ASSERT_EQ(by_layer.outputs.size(), static_cast<std::size_t>(kRequests));
  const int layers = by_layer.num_layers;
  ASSERT_GT(layers, 1);
  int layer_increments = 0;
  for (std::uint64_t id = 0; id < kRequests; ++id) {
    SCOPED_TRACE("request " + std::to_string(id));
    const RequestOutput& want = step_end.outputs.at(id);
    const RequestOutput& got = by_layer.outputs.at(id);
    EXPECT_EQ(got.token_ids, want.token_ids);
    EXPECT_EQ(got.text, want.text);

    // Prefill chunks arrive as per-layer increments, each chunk's layers in
    // order and within one step; decode positions as all-layer increments
    // after their step. Together they cover every position once, in order.
    // (A one-token prefill remainder goes out with its step, all layers.)
    const int prompt = by_layer.prompt_len.at(id);
    const std::vector<Pushed>& p = by_layer.pushed.at(id);
    int covered = 0;
    int layer_covered = 0;  // positions that went out layer by layer
    for (std::size_t i = 0; i < p.size();) {
      if (p[i].range.num_layers() == layers) {
        EXPECT_EQ(p[i].range.token_begin, covered);
        covered = p[i].range.token_end;
        ++i;
        continue;
      }
      const kvstore::KvRange chunk{0, layers, p[i].range.token_begin, p[i].range.token_end};
      EXPECT_EQ(chunk.token_begin, covered);
      EXPECT_LE(chunk.token_end, prompt) << "a decode position went out by layer";
      const std::size_t first = i;
      for (int l = 0; l < layers; ++l, ++i) {
        ASSERT_LT(i, p.size());
        EXPECT_EQ(p[i].range, (kvstore::KvRange{l, l + 1, chunk.token_begin, chunk.token_end}));
        EXPECT_EQ(p[i].token_ids, static_cast<std::size_t>(chunk.num_tokens()));
        EXPECT_EQ(p[i].step, p[first].step) << "a chunk's layers span steps";
        ++layer_increments;
      }
      covered = chunk.token_end;
      layer_covered += chunk.num_tokens();
    }
    EXPECT_GE(layer_covered, prompt - 1) << "the prompt did not go out layer by layer";
    // Every position up to the finishing step's (a finished sequence's last
    // KV is not streamed) is bit-identical to step-end streaming.
    const int streamed = prompt + static_cast<int>(got.token_ids.size()) - 2;
    EXPECT_EQ(covered, streamed);
    EXPECT_TRUE(by_layer.tiers.at(id)->prefix(streamed) == step_end.tiers.at(id)->prefix(streamed));
  }
  EXPECT_GT(layer_increments, kRequests * layers) << "no prompt was chunked over several steps";
  // Step-end streaming sends all layers at once.
  for (const auto& [id, p] : step_end.pushed)
    for (const Pushed& x : p) EXPECT_EQ(x.range.num_layers(), layers);
}

}  // namespace
}  // namespace shardline::engine
