// DéjàVu on CUDA (issue 41 item 7): model::CudaKvCopier over the REAL CUDA
// runner's and CudaShardGroup's device KV caches, on the FAKE CUDA device.
//  - The copier gives the canonical chunk the CPU runner's views give for
//    the same step (the same model and tokens), and copy_in then copy_out
//    round-trips bit for bit without touching the blocks' other tokens.
//  - A group's copier (every rank's cache, split by layer and head) gives
//    one device's chunk: bit for bit under SP x PP, within the TP bound
//    under TP.
//  - Through the engine: swap preemption on an oversubscribed CUDA cache
//    gives the outputs (ids and logits, bit for bit) of a run that never
//    preempts; every step's KV increment streams out, and each request
//    resumed in a fresh engine from the streamed KV of its first r
//    positions computes only the positions after r and gives the same
//    outputs.
//  - Buffered copies (seed 003 §4.1.1 (1)): a batch of sequences' ranges
//    is one gather launch and one transfer per cache (one per pass of a
//    smaller device slot), the same bytes as each range alone; a group's
//    caches on two devices merge into one device's chunk.
//  - Layer-by-layer prompt streaming (§4.1.1 (3)): copies begun from the
//    runner's layer hook return without waiting for the device and land
//    behind their layer's KV write (deferred timing: a copy that did not
//    wait for the runner's stream would read the cache before the step
//    wrote it); through the engine, prompt chunks stream a layer at a time
//    and merge into the step-end streaming's bytes, outputs unchanged.
//  - Seesaw's phases (seed 000 §4.2) on a CUDA runner and on a CUDA pp=2
//    group: every sequence's KV leaves the device through the copier when
//    its prefill ends and comes back for decode (on the mover's thread),
//    and the outputs are the mixed run's, ids and logits bit for bit. With
//    two configs (§4.1: prefill in cp, decode in cd over the same ranks,
//    each rank's two caches in one allocation) the KV is re-sharded on its
//    way through the buffer: pairs without TP are bit-identical, pp=2 ->
//    tp=2 within the TP bound.
// Both timings of the fake.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/llm_engine.hpp"
#include "engine/seesaw/seesaw_phases.hpp"
#include "model/cpu_runner.hpp"
#include "model/cuda/cuda_kv_copier.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/cuda_shard_group.hpp"
#include "tests/model/cuda/dummy_archs.hpp"
#include "tests/model/cuda/fake_device.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/kv_host_tier.hpp"
#include "text/id_tokenizer.hpp"

namespace shardline::engine {
namespace model_cuda_cuda_kv_copier_fake_device_test {

namespace fc = testing_support::fake_cuda;
using testing_support::kDummyBlocks;
using testing_support::run_all;

class CudaKvCopierFakeDevice : public testing_support::FakeDeviceTimingTest {};

INSTANTIATE_TEST_SUITE_P(Timing, CudaKvCopierFakeDevice, testing_support::fake_timings(),
                         testing_support::fake_timing_name);

/// The runner options of the direct steps below: a 32-token budget.
model::CudaRunnerOptions step_options() {
  model::CudaRunnerOptions o = testing_support::dummy_cuda_options();
  o.max_num_batched_tokens = 32;
  return o;
}

/// One 20-token prefill of sequence 1 over physical blocks `table` (16 tokens each).
model::StepInput prefill_step(const std::vector<std::int32_t>& table, int vocab) {
  model::StepInput in;
  in.block_size = 16;
  model::StepSeq s;
  s.seq_id = 1;
  s.num_new_tokens = 20;
  s.needs_logits = true;
  s.block_table = table;
  in.seqs = {s};
  for (int p = 0; p < 20; ++p) {
    in.token_ids.push_back(3 + (29 * p) % (vocab - 3));
    in.positions.push_back(p);
    in.slot_mapping.push_back(table[static_cast<std::size_t>(p / 16)] * 16 + p % 16);
  }
  in.logits_rows = {19};
  return in;
}

std::vector<float> as_floats(const std::vector<std::byte>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

void expect_close(const std::vector<std::byte>& got, const std::vector<std::byte>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const auto a = as_floats(got), b = as_floats(want);
  float worst = 0.0f;
  for (std::size_t i = 0; i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0f, std::fabs(b[i])));
  EXPECT_LT(worst, 1e-4f) << what;
}

std::vector<std::byte> chunk_of(kvstore::KvCopier& c, const kvstore::KvModelShape& shape,
                                const std::vector<std::int32_t>& table, const kvstore::KvRange& range) {
  std::vector<std::byte> out(kvstore::chunk_bytes(shape, range));
  const Status s = c.copy_out(table, range, out);
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return out;
}

TEST_P(CudaKvCopierFakeDevice, CopyOutGivesTheCpuChunkAndCopyInRoundTrips) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const std::vector<std::int32_t> table = {5, 2};
  auto gpu = model::CudaModelRunner::create(w, step_options());
  ASSERT_TRUE(gpu.ok()) << gpu.error().to_string();
  model::CpuRunnerOptions po;
  po.num_kv_blocks = kDummyBlocks;
  auto cpu = model::CpuModelRunner::create(w, po);
  ASSERT_TRUE(cpu.ok()) << cpu.error().to_string();
  { auto st = (*gpu)->execute(prefill_step(table, vocab)); ASSERT_TRUE(st.ok()) << st.error().to_string(); }
  ASSERT_TRUE((*cpu)->execute(prefill_step(table, vocab)).ok());

  const kvstore::KvModelShape shape = (*gpu)->kv_model_shape();
  EXPECT_EQ(shape.num_layers, 2);
  EXPECT_EQ(shape.num_kv_heads, 2);
  kvstore::KvCopier* copier = (*gpu)->kv_copier();
  ASSERT_NE(copier, nullptr);
  EXPECT_TRUE(copier->supports_streaming());
  kvstore::KvViewsCopier cpu_copier(shape, (*cpu)->kv_cache_views());
  for (const kvstore::KvRange& range : {kvstore::KvRange{0, 2, 0, 20}, kvstore::KvRange{1, 2, 3, 18}}) {
    const std::string what = "layers [" + std::to_string(range.layer_begin) + ", " + std::to_string(range.layer_end) +
                             ") tokens [" + std::to_string(range.token_begin) + ", " + std::to_string(range.token_end) + ")";
    expect_close(chunk_of(*copier, shape, table, range), chunk_of(cpu_copier, shape, table, range), what);
  }

  // Into other blocks and back, bit for bit. Out: one gather launch and
  // one transfer for both blocks, every layer and K|V.
  const kvstore::KvRange all{0, 2, 0, 20};
  auto* cuda_copier = dynamic_cast<model::CudaKvCopier*>(copier);
  ASSERT_NE(cuda_copier, nullptr);
  const std::uint64_t copies_before = cuda_copier->num_copies();
  const std::uint64_t gathers_before = cuda_copier->num_gather_launches();
  const std::vector<std::byte> original = chunk_of(*copier, shape, table, all);
  EXPECT_EQ(cuda_copier->num_copies() - copies_before, 1u);
  EXPECT_EQ(cuda_copier->num_gather_launches() - gathers_before, 1u);
  const std::vector<std::int32_t> other = {7, 9};
  ASSERT_TRUE(copier->copy_in(other, all, original).ok());
  EXPECT_EQ(chunk_of(*copier, shape, other, all), original);
  // Tokens [4, 9) overwritten: only they change, in every layer.
  const kvstore::KvRange middle{0, 2, 4, 9};
  std::vector<std::byte> ones(kvstore::chunk_bytes(shape, middle));
  const std::vector<float> one(ones.size() / 4, 1.0f);
  std::memcpy(ones.data(), one.data(), ones.size());
  ASSERT_TRUE(copier->copy_in(other, middle, ones).ok());
  EXPECT_EQ(chunk_of(*copier, shape, other, middle), ones);
  EXPECT_EQ(chunk_of(*copier, shape, other, kvstore::KvRange{0, 2, 0, 4}),
            chunk_of(*copier, shape, table, kvstore::KvRange{0, 2, 0, 4}));
  EXPECT_EQ(chunk_of(*copier, shape, other, kvstore::KvRange{0, 2, 9, 20}),
            chunk_of(*copier, shape, table, kvstore::KvRange{0, 2, 9, 20}));

  // Bad calls are refused and change nothing.
  std::vector<std::byte> chunk(kvstore::chunk_bytes(shape, all));
  const auto refused = [](const Status& s) { return !s.ok() && s.error().code == ErrorCode::invalid_argument; };
  const std::vector<std::int32_t> short_table = {5}, outside = {5, kDummyBlocks};
  EXPECT_TRUE(refused(copier->copy_out(short_table, all, chunk)));
  EXPECT_TRUE(refused(copier->copy_out(outside, all, chunk)));
  EXPECT_TRUE(refused(copier->copy_out(table, kvstore::KvRange{0, 2, 5, 5}, chunk)));
  EXPECT_TRUE(refused(copier->copy_in(table, all, std::span<const std::byte>(chunk).first(chunk.size() - 4))));
  EXPECT_EQ(chunk_of(*copier, shape, table, all), original);
}

TEST_P(CudaKvCopierFakeDevice, AGroupsCopierGivesOneDevicesChunk) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_group");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const std::vector<std::int32_t> table = {5, 2};
  const kvstore::KvRange all{0, 2, 0, 20};
  std::vector<std::byte> want;
  {
    auto one = model::CudaModelRunner::create(w, step_options());
    ASSERT_TRUE(one.ok()) << one.error().to_string();
    ASSERT_TRUE((*one)->execute(prefill_step(table, vocab)).ok());
    want = chunk_of(*(*one)->kv_copier(), (*one)->kv_model_shape(), table, all);
  }
  // (tp, pp, sp): SP x PP is bit-identical to one device; TP within its bound.
  for (const auto& [tp, pp, sp] : {std::tuple{1, 2, 2}, std::tuple{1, 1, 4}, std::tuple{2, 1, 1}}) {
    const std::string name = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " sp=" + std::to_string(sp);
    auto group = model::CudaShardGroup::create(w, step_options(), tp, pp, sp);
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    ASSERT_TRUE((*group)->execute(prefill_step(table, vocab)).ok()) << name;
    kvstore::KvCopier* copier = (*group)->kv_copier();
    ASSERT_NE(copier, nullptr) << name;
    EXPECT_EQ(copier->num_devices(), tp * pp * sp) << name;
    const std::vector<std::byte> got = chunk_of(*copier, (*group)->kv_model_shape(), table, all);
    if (tp == 1)
      EXPECT_EQ(got, want) << name << ": not bit-identical to one device";
    else
      expect_close(got, want, name);
    // Written into every rank holding each (layer, head), read back whole.
    const std::vector<std::int32_t> other = {7, 9};
    ASSERT_TRUE(copier->copy_in(other, all, got).ok()) << name;
    EXPECT_EQ(chunk_of(*copier, (*group)->kv_model_shape(), other, all), got) << name;
  }
}

TEST_P(CudaKvCopierFakeDevice, ABatchIsOneGatherPerCacheOrOnePerPassOfTheSlot) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_batch");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const std::vector<std::int32_t> table = {5, 2};
  auto gpu = model::CudaModelRunner::create(w, step_options());
  ASSERT_TRUE(gpu.ok()) << gpu.error().to_string();
  ASSERT_TRUE((*gpu)->execute(prefill_step(table, vocab)).ok());
  const kvstore::KvModelShape shape = (*gpu)->kv_model_shape();
  // A second sequence's table over other blocks, holding the same KV.
  const std::vector<std::int32_t> other = {7, 9};
  const kvstore::KvRange all{0, 2, 0, 20};
  ASSERT_TRUE((*gpu)->kv_copier()->copy_in(other, all, chunk_of(*(*gpu)->kv_copier(), shape, table, all)).ok());
  const std::vector<kvstore::KvCopyItem> items = {
      {table, all}, {other, kvstore::KvRange{1, 2, 3, 18}}, {table, kvstore::KvRange{0, 1, 16, 20}}};
  // Each item alone, through the per-item path of the base class.
  std::vector<std::vector<std::byte>> want;
  for (const kvstore::KvCopyItem& it : items) {
    std::vector<std::byte> c(kvstore::chunk_bytes(shape, it.range));
    ASSERT_TRUE((*gpu)->kv_copier()->copy_out(it.block_table, it.range, c).ok());
    want.push_back(std::move(c));
  }
  // qwen3 dummy: 2 x 2 heads x 32 dims x 4 B = 512 B per layer and token.
  // A 4 KiB slot takes item 0 a layer at a time (10 KiB per layer: a pass
  // each), item 1 (7.5 KiB) alone and item 2 (2 KiB) in a pass of its own.
  for (const auto& [slot_bytes, passes] : {std::pair<std::size_t, std::uint64_t>{model::CudaKvCopier::kGatherSlotBytes, 1},
                                           std::pair<std::size_t, std::uint64_t>{4096, 4}}) {
    auto copier = model::CudaKvCopier::create(shape, {(*gpu)->device_kv_cache()}, slot_bytes);
    ASSERT_TRUE(copier.ok()) << copier.error().to_string();
    std::vector<std::vector<std::byte>> got(items.size());
    std::vector<std::span<std::byte>> spans;
    for (std::size_t i = 0; i < items.size(); ++i) {
      got[i].resize(kvstore::chunk_bytes(shape, items[i].range));
      spans.emplace_back(got[i]);
    }
    ASSERT_TRUE((*copier)->copy_out_batch(items, spans).ok());
    EXPECT_EQ(got, want) << "slot of " << slot_bytes << " bytes";
    EXPECT_EQ((*copier)->num_gather_launches(), passes) << "slot of " << slot_bytes << " bytes";
    EXPECT_EQ((*copier)->num_copies(), passes) << "one transfer per pass";
    // Bad batches are refused whole.
    const auto refused = [](const Status& st) { return !st.ok() && st.error().code == ErrorCode::invalid_argument; };
    EXPECT_TRUE(refused((*copier)->copy_out_batch(items, std::span(spans).first(2))));
    const std::vector<std::int32_t> outside = {5, kDummyBlocks};
    const std::vector<kvstore::KvCopyItem> bad = {items[0], {outside, all}};
    EXPECT_TRUE(refused((*copier)->copy_out_batch(bad, std::span(spans).first(2))));
  }
  // A group's caches on two devices: each rank's pieces merged, as one device's.
  fc::set_device_count(2);
  auto group = model::CudaShardGroup::create(w, step_options(), 1, 2, 1, {}, std::nullopt, {0, 1});
  ASSERT_TRUE(group.ok()) << group.error().to_string();
  ASSERT_TRUE((*group)->execute(prefill_step(table, vocab)).ok());
  std::vector<std::byte> whole(kvstore::chunk_bytes(shape, all)), tail(kvstore::chunk_bytes(shape, items[2].range));
  const std::span<std::byte> two[2] = {whole, tail};
  const std::vector<kvstore::KvCopyItem> group_items = {{table, all}, items[2]};
  ASSERT_TRUE((*group)->kv_copier()->copy_out_batch(group_items, two).ok());
  EXPECT_EQ(whole, want[0]);
  EXPECT_EQ(tail, want[2]);
}

TEST_P(CudaKvCopierFakeDevice, ABatchTakesEachHeadFromItsFirstHolderAsTheHostPlanDoes) {
  // Three caches whose heads overlap with different bytes (as replicated
  // heads would if they ever differed): every (layer, head) of every item
  // must come from the first cache holding it, as kvstore::copy_out's plan.
  const kvstore::KvModelShape shape{2, 2, 4, DType::f32};
  const std::vector<kvstore::KvRankLayout> layouts = {
      {0, 2, {1}, 6, 4}, {0, 1, {0, 1}, 6, 4}, {1, 2, {0}, 6, 4}};  // head 1 of layer 0 twice
  std::vector<std::vector<float>> host(layouts.size());
  std::vector<kvstore::KvCacheView> views;
  std::vector<model::DeviceKvCache> caches;
  std::vector<void*> device;
  for (std::size_t c = 0; c < layouts.size(); ++c) {
    host[c].resize(kvstore::cache_bytes(shape, layouts[c]) / 4);
    for (std::size_t i = 0; i < host[c].size(); ++i) host[c][i] = static_cast<float>(1000 * (c + 1) + i);
    views.push_back({host[c].data(), layouts[c]});
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, host[c].size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, host[c].data(), host[c].size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    device.push_back(d);
    caches.push_back({d, layouts[c], 0, nullptr});
  }
  // The uploads land on the legacy stream, which the copy stream does not wait for.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    auto copier = model::CudaKvCopier::create(shape, caches);
    ASSERT_TRUE(copier.ok()) << copier.error().to_string();
    const std::vector<std::int32_t> t1 = {3, 0, 5}, t2 = {1, 4};
    const std::vector<kvstore::KvCopyItem> items = {
        {t1, kvstore::KvRange{0, 2, 2, 11}}, {t2, kvstore::KvRange{1, 2, 0, 7}}, {t1, kvstore::KvRange{0, 1, 4, 5}}};
    std::vector<std::vector<std::byte>> got(items.size()), want(items.size());
    std::vector<std::span<std::byte>> spans;
    for (std::size_t i = 0; i < items.size(); ++i) {
      got[i].resize(kvstore::chunk_bytes(shape, items[i].range));
      want[i].resize(got[i].size());
      spans.emplace_back(got[i]);
      ASSERT_TRUE(kvstore::copy_out(shape, views, items[i].block_table, items[i].range, want[i]).ok());
    }
    ASSERT_TRUE((*copier)->copy_out_batch(items, spans).ok());
    for (std::size_t i = 0; i < items.size(); ++i) EXPECT_EQ(got[i], want[i]) << "item " << i;
    EXPECT_EQ((*copier)->num_gather_launches(), 3u) << "one per cache that supplies something";
  }
  for (void* d : device) ASSERT_EQ(cudaFree(d), cudaSuccess);
}

TEST_P(CudaKvCopierFakeDevice, LayerCopiesBegunDuringTheStepLandBehindTheirLayersKvWrites) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_layers");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const std::vector<std::int32_t> table = {5, 2};
  auto gpu = model::CudaModelRunner::create(w, step_options());
  ASSERT_TRUE(gpu.ok()) << gpu.error().to_string();
  ASSERT_TRUE((*gpu)->supports_layer_kv_hook());
  auto* copier = dynamic_cast<model::CudaKvCopier*>((*gpu)->kv_copier());
  ASSERT_NE(copier, nullptr);
  ASSERT_TRUE(copier->copies_in_stream_order());
  const kvstore::KvModelShape shape = (*gpu)->kv_model_shape();
  // First, each layer's copies begun and ended inside the hook: in
  // deferred timing the runner's stream has run none of the step yet, so
  // the bytes are right only if the copy waited for the layer's write on
  // the device (as far as it, and no further: the fake runs a stream up to
  // the record a wait names, so layer 1's write is still pending when layer
  // 0's copy lands).
  std::vector<std::vector<std::byte>> ended_in_hook;
  std::vector<int> queued_behind;  // [layers] device operations still queued when begin_copy_out returned
  (*gpu)->set_layer_kv_hook([&](int layer) {
    const kvstore::KvCopyItem item{table, kvstore::KvRange{layer, layer + 1, 0, 20}};
    Result<std::uint64_t> t = copier->begin_copy_out({&item, 1});
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    ended_in_hook.emplace_back(kvstore::chunk_bytes(shape, item.range));
    const std::span<std::byte> spans[1] = {ended_in_hook.back()};
    ASSERT_TRUE(copier->end_copy_out(*t, spans).ok());
  });
  ASSERT_TRUE((*gpu)->execute(prefill_step(table, vocab)).ok());
  (*gpu)->set_layer_kv_hook({});
  ASSERT_EQ(ended_in_hook.size(), 2u);
  for (int layer = 0; layer < 2; ++layer)
    EXPECT_EQ(ended_in_hook[static_cast<std::size_t>(layer)],
              chunk_of(*copier, shape, table, kvstore::KvRange{layer, layer + 1, 0, 20}))
        << "layer " << layer << ": the copy did not wait for its KV write";
  std::vector<std::pair<int, std::uint64_t>> tickets;
  // Then every layer's ticket left open until the step returned.
  (*gpu)->set_layer_kv_hook([&](int layer) {
    const kvstore::KvCopyItem item{table, kvstore::KvRange{layer, layer + 1, 0, 20}};
    Result<std::uint64_t> t = copier->begin_copy_out({&item, 1});
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    tickets.emplace_back(layer, *t);
    queued_behind.push_back(fc::pending_ops());
  });
  ASSERT_TRUE((*gpu)->execute(prefill_step(table, vocab)).ok());
  (*gpu)->set_layer_kv_hook({});
  ASSERT_EQ(tickets.size(), 2u);
  EXPECT_EQ(tickets[0].first, 0);
  EXPECT_EQ(tickets[1].first, 1);
  if (fc::execution() == fc::Execution::deferred)
    for (int q : queued_behind) EXPECT_GT(q, 0) << "begin_copy_out must return without waiting for the device";
  EXPECT_EQ(copier->open_tickets(), 2u);
  // Out of order: refused, and nothing ends.
  std::vector<std::byte> c1(kvstore::chunk_bytes(shape, kvstore::KvRange{1, 2, 0, 20}));
  const std::span<std::byte> one[1] = {c1};
  const Status early = copier->end_copy_out(tickets[1].second, one);
  EXPECT_FALSE(early.ok());
  EXPECT_EQ(copier->open_tickets(), 2u);
  for (const auto& [layer, ticket] : tickets) {
    const kvstore::KvRange r{layer, layer + 1, 0, 20};
    std::vector<std::byte> got(kvstore::chunk_bytes(shape, r));
    const std::span<std::byte> spans[1] = {got};
    ASSERT_TRUE(copier->end_copy_out(ticket, spans).ok()) << "layer " << layer;
    // The same bytes a copy after the step gives: the copy waited for its layer's write.
    EXPECT_EQ(got, chunk_of(*copier, shape, table, r)) << "layer " << layer;
  }
  EXPECT_EQ(copier->open_tickets(), 0u);
}

// ---- through the engine ------------------------------------------------------------

/// A sink that merges every increment into per-request host tiers.
struct TierSink final : KvStreamSink {
  std::map<std::uint64_t, std::unique_ptr<testing_support::HostTier>>* tiers = nullptr;
  int pushes = 0;
  bool accepting() const override { return true; }
  void push(KvIncrement inc) override {
    ++pushes;
    (*tiers)[inc.request_id]->merge(inc.range, inc.chunk);
  }
};

struct Request {
  std::vector<std::int32_t> prompt;
  sampling::SamplingParams params;
};

/// Six greedy requests (3 to 38 prompt tokens, 10 tokens each).
std::vector<Request> requests(int vocab) {
  std::vector<Request> out;
  for (int r = 0; r < 6; ++r) {
    Request q;
    for (int t = 0; t < 3 + 7 * r; ++t) q.prompt.push_back(3 + (37 * r + 11 * t) % (vocab - 3));
    q.params.temperature = 0.0f;
    q.params.max_tokens = 10;
    q.params.ignore_eos = true;
    out.push_back(q);
  }
  return out;
}

EngineConfig engine_config(PreemptionMode mode, int max_model_len = testing_support::kDummyLen) {
  EngineConfig ec;
  ec.max_num_seqs = testing_support::kDummySeqs;
  ec.max_num_batched_tokens = testing_support::kDummyBudget;
  ec.max_model_len = max_model_len;
  ec.eos_token_ids = {2};
  ec.capture_logits = true;
  ec.check_integrity = true;
  ec.preemption_mode = mode;
  return ec;
}

int computed_tokens(const LlmEngine& engine) {
  int n = 0;
  for (const StepStats& s : engine.step_stats()) n += s.num_prefill_tokens + s.num_decode_tokens;
  return n;
}

TEST_P(CudaKvCopierFakeDevice, SwapPreemptionOnTheCudaCacheGivesTheUnpreemptedOutputs) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_swap");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const text::IdTokenizer tok(vocab, 1, 2);
  const auto reqs = requests(vocab);
  auto run = [&](int num_blocks, PreemptionMode mode, int* preemptions, KvIoStats* io) {
    model::CudaRunnerOptions co = testing_support::dummy_cuda_options();
    co.num_kv_blocks = num_blocks;
    auto gpu = model::CudaModelRunner::create(w, co);
    EXPECT_TRUE(gpu.ok()) << gpu.error().to_string();
    auto eng = LlmEngine::create(**gpu, tok, engine_config(mode, 64));  // 48 tokens at most
    EXPECT_TRUE(eng.ok()) << eng.error().to_string();
    EXPECT_TRUE((*eng)->kv_io().can_copy_kv());
    EXPECT_TRUE((*eng)->kv_io().can_move_kv());
    for (std::uint64_t id = 0; id < reqs.size(); ++id)
      EXPECT_TRUE((*eng)->add_request(id, reqs[id].prompt, reqs[id].params).ok());
    auto out = run_all(**eng);
    *preemptions = (*eng)->scheduler().total_preemptions();
    *io = (*eng)->kv_io().stats();
    return out;
  };
  int ref_preemptions = 0, swap_preemptions = 0;
  KvIoStats ref_io, swap_io;
  const auto ref = run(kDummyBlocks, PreemptionMode::swap, &ref_preemptions, &ref_io);
  // 6 sequences of up to 48 tokens need 14 blocks of 16; 8 oversubscribe.
  const auto swp = run(8, PreemptionMode::swap, &swap_preemptions, &swap_io);
  EXPECT_EQ(ref_preemptions, 0);
  ASSERT_GT(swap_preemptions, 0) << "the cache must be oversubscribed";
  EXPECT_EQ(swap_io.swap_outs, static_cast<std::uint64_t>(swap_preemptions));
  EXPECT_EQ(swap_io.swap_ins, swap_io.swap_outs);
  EXPECT_EQ(swap_io.swap_fallbacks, 0u);
  ASSERT_EQ(swp.size(), ref.size());
  for (const auto& [id, want] : ref)
    EXPECT_TRUE(testing_support::bit_identical(swp.at(id), want)) << "request " << id << " differs after swaps";
}

// Prefix caching on the CUDA cache (issue 42): six requests behind one
// 40-token head (2 full blocks of 16 and 8 tokens), one at a time. The later
// ones share the head's full blocks and copy the KV of its last 8 tokens out
// of the block an earlier request filled (copy-on-write through the
// runner's copier); the outputs are the uncached run's, bit for bit, with a
// 16-token step budget that chunks every prompt.
TEST_P(CudaKvCopierFakeDevice, PrefixCachingSharesAndCopiesBlocksOnTheCudaCache) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_prefix");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const text::IdTokenizer tok(vocab, 1, 2);
  std::vector<Request> reqs;
  for (int r = 0; r < 6; ++r) {
    Request q;
    for (int t = 0; t < 40; ++t) q.prompt.push_back(3 + (13 * t + 5) % (vocab - 3));
    for (int t = 0; t < 3 + r; ++t) q.prompt.push_back(3 + (41 * r + 7 * t + 1) % (vocab - 3));
    q.params.temperature = 0.0f;
    q.params.max_tokens = 10;
    q.params.ignore_eos = true;
    reqs.push_back(q);
  }
  auto run = [&](bool caching, long long* hits, KvIoStats* io) {
    auto gpu = model::CudaModelRunner::create(w, testing_support::dummy_cuda_options());
    EXPECT_TRUE(gpu.ok()) << gpu.error().to_string();
    EngineConfig ec = engine_config(PreemptionMode::recompute);
    ec.max_num_seqs = 1;
    ec.prefix_cache.enabled = caching;
    auto eng = LlmEngine::create(**gpu, tok, ec);
    EXPECT_TRUE(eng.ok()) << eng.error().to_string();
    for (std::uint64_t id = 0; id < reqs.size(); ++id)
      EXPECT_TRUE((*eng)->add_request(id, reqs[id].prompt, reqs[id].params).ok());
    auto out = run_all(**eng);
    *hits = (*eng)->scheduler().prefix_hit_tokens();
    *io = (*eng)->kv_io().stats();
    return out;
  };
  long long ref_hits = 0, hits = 0;
  KvIoStats ref_io, io;
  const auto ref = run(false, &ref_hits, &ref_io);
  const auto got = run(true, &hits, &io);
  EXPECT_EQ(ref_hits, 0);
  EXPECT_EQ(hits, 5 * 40) << "the head, for each later request";
  EXPECT_EQ(io.prefix_copied_tokens, 5u * 8u) << "its last 8 tokens copied, not computed";
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [id, want] : ref)
    EXPECT_TRUE(testing_support::bit_identical(got.at(id), want)) << "request " << id << " differs with caching";
}

TEST_P(CudaKvCopierFakeDevice, StreamedKvResumesRequestsWithoutRecomputingIt) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_resume");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const text::IdTokenizer tok(vocab, 1, 2);
  const auto reqs = requests(vocab);
  std::map<std::uint64_t, RequestOutput> ref;
  std::map<std::uint64_t, std::unique_ptr<testing_support::HostTier>> tiers;
  {
    auto gpu = model::CudaModelRunner::create(w, testing_support::dummy_cuda_options());
    ASSERT_TRUE(gpu.ok()) << gpu.error().to_string();
    auto eng = LlmEngine::create(**gpu, tok, engine_config(PreemptionMode::recompute));
    ASSERT_TRUE(eng.ok()) << eng.error().to_string();
    for (std::uint64_t id = 0; id < reqs.size(); ++id)
      tiers[id] = std::make_unique<testing_support::HostTier>((*gpu)->kv_model_shape());
    TierSink sink;
    sink.tiers = &tiers;
    (*eng)->set_kv_sink(&sink);
    for (std::uint64_t id = 0; id < reqs.size(); ++id)
      ASSERT_TRUE((*eng)->add_request(id, reqs[id].prompt, reqs[id].params).ok());
    ref = run_all(**eng);
    EXPECT_GT(sink.pushes, 0);
    EXPECT_GT((*eng)->kv_io().stats().streamed_bytes, 0u);
  }
  // Each request cut after 4 generated tokens, resumed from the KV of all
  // its known positions but the last.
  auto gpu = model::CudaModelRunner::create(w, testing_support::dummy_cuda_options());
  ASSERT_TRUE(gpu.ok()) << gpu.error().to_string();
  auto eng = LlmEngine::create(**gpu, tok, engine_config(PreemptionMode::recompute));
  ASSERT_TRUE(eng.ok()) << eng.error().to_string();
  constexpr int kCut = 4;
  int expected_computed = 0, expected_restored = 0;
  for (std::uint64_t id = 0; id < reqs.size(); ++id) {
    const RequestOutput& want = ref.at(id);
    const int prompt = static_cast<int>(reqs[id].prompt.size());
    const int r = prompt + kCut - 1;
    ASSERT_GE(tiers[id]->covered, r) << "request " << id << ": its KV was not streamed";
    ResumeState rs;
    rs.output_ids.assign(want.token_ids.begin(), want.token_ids.begin() + kCut);
    rs.num_kv_tokens = r;
    rs.kv_chunk = tiers[id]->prefix(r);
    ASSERT_TRUE((*eng)->add_request(id, reqs[id].prompt, reqs[id].params, std::move(rs)).ok());
    expected_computed += prompt + static_cast<int>(want.token_ids.size()) - 1 - r;
    expected_restored += r;
  }
  const auto got = run_all(**eng);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [id, want] : ref) EXPECT_EQ(got.at(id).token_ids, want.token_ids) << "request " << id;
  EXPECT_EQ(computed_tokens(**eng), expected_computed) << "only positions after r are computed";
  EXPECT_EQ((*eng)->kv_io().stats().restored_tokens, static_cast<std::uint64_t>(expected_restored));
}

/// A sink that records each increment's range and merges it into per-request tiers.
struct RangeSink final : KvStreamSink {
  std::map<std::uint64_t, std::unique_ptr<testing_support::HostTier>>* tiers = nullptr;
  std::vector<kvstore::KvRange> ranges;
  bool accepting() const override { return true; }
  void push(KvIncrement inc) override {
    ranges.push_back(inc.range);
    (*tiers)[inc.request_id]->merge(inc.range, inc.chunk);
  }
};

TEST_P(CudaKvCopierFakeDevice, PromptKvStreamsLayerByLayerBehindTheForward) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_by_layer");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const text::IdTokenizer tok(vocab, 1, 2);
  const auto reqs = requests(vocab);
  struct Run {
    std::map<std::uint64_t, RequestOutput> out;
    std::map<std::uint64_t, std::unique_ptr<testing_support::HostTier>> tiers;
    std::vector<kvstore::KvRange> ranges;
    std::uint64_t gathers = 0;
  };
  const auto run = [&](bool by_layer) {
    Run r;
    auto gpu = model::CudaModelRunner::create(w, testing_support::dummy_cuda_options());
    EXPECT_TRUE(gpu.ok()) << gpu.error().to_string();
    auto eng = LlmEngine::create(**gpu, tok, engine_config(PreemptionMode::recompute));
    EXPECT_TRUE(eng.ok()) << eng.error().to_string();
    for (std::uint64_t id = 0; id < reqs.size(); ++id)
      r.tiers[id] = std::make_unique<testing_support::HostTier>((*gpu)->kv_model_shape());
    RangeSink sink;
    sink.tiers = &r.tiers;
    (*eng)->set_kv_sink(&sink);
    (*eng)->set_stream_prompt_by_layer(by_layer);
    for (std::uint64_t id = 0; id < reqs.size(); ++id)
      EXPECT_TRUE((*eng)->add_request(id, reqs[id].prompt, reqs[id].params).ok());
    r.out = run_all(**eng);
    r.ranges = sink.ranges;
    r.gathers = dynamic_cast<model::CudaKvCopier*>((*gpu)->kv_copier())->num_gather_launches();
    EXPECT_EQ(dynamic_cast<model::CudaKvCopier*>((*gpu)->kv_copier())->open_tickets(), 0u);
    return r;
  };
  const Run after_step = run(false);
  const Run layered = run(true);
  ASSERT_EQ(layered.out.size(), after_step.out.size());
  for (const auto& [id, want] : after_step.out)
    EXPECT_TRUE(testing_support::bit_identical(layered.out.at(id), want)) << "request " << id;
  // Prompt chunks went out a layer at a time; decode positions after their step.
  int layer_increments = 0;
  for (const kvstore::KvRange& r : layered.ranges) layer_increments += r.num_layers() == 1;
  EXPECT_GT(layer_increments, 0);
  for (const kvstore::KvRange& r : after_step.ranges) EXPECT_EQ(r.num_layers(), 2);
  // The same KV in the end, bit for bit.
  for (const auto& [id, tier] : after_step.tiers) {
    ASSERT_EQ(layered.tiers.at(id)->covered, tier->covered) << "request " << id;
    EXPECT_EQ(layered.tiers.at(id)->prefix(tier->covered), tier->prefix(tier->covered)) << "request " << id;
  }
  // Step-end increments: one gather per step for every sequence, however many.
  EXPECT_LT(after_step.gathers, after_step.ranges.size());
}

/// The six requests through an engine over `x` with swap preemption, a
/// 64-token max_model_len and a host KV buffer of one such sequence; with
/// `seesaw`, Seesaw's phases (async KV moves). `stats`: its phase counters.
std::map<std::uint64_t, RequestOutput> run_phased(model::ModelExecutor& x, const text::Tokenizer& tok,
                                                  const std::vector<Request>& reqs, bool seesaw,
                                                  SeesawStats* stats = nullptr, KvIoStats* io = nullptr) {
  // qwen3 dummy KV: 2 layers x K,V x 2 heads x 32 dims x 4 B = 1 KiB per token.
  constexpr std::uint64_t kBytesPerToken = 2 * 2 * 2 * 32 * 4;
  EngineConfig ec = engine_config(PreemptionMode::swap, 64);
  ec.swap_space_bytes = 64 * kBytesPerToken;
  if (seesaw) ec.step_phases = seesaw_phases(SeesawOptions{SeesawPolicyOptions{}, /*async_kv=*/true, std::nullopt});
  auto eng = LlmEngine::create(x, tok, ec);
  EXPECT_TRUE(eng.ok()) << eng.error().to_string();
  if (!eng.ok()) return {};
  for (std::uint64_t id = 0; id < reqs.size(); ++id)
    EXPECT_TRUE((*eng)->add_request(id, reqs[id].prompt, reqs[id].params).ok());
  auto out = run_all(**eng);
  if (stats != nullptr) *stats = seesaw_stats_of(**eng);
  if (io != nullptr) *io = (*eng)->kv_io().stats();
  return out;
}

/// The mixed (no phases) run of the six requests on one fake CUDA device.
std::map<std::uint64_t, RequestOutput> mixed_run(const std::shared_ptr<const model::ModelWeights>& w,
                                                 const text::Tokenizer& tok, const std::vector<Request>& reqs) {
  auto gpu = model::CudaModelRunner::create(w, testing_support::dummy_cuda_options());
  EXPECT_TRUE(gpu.ok()) << gpu.error().to_string();
  if (!gpu.ok()) return {};
  return run_phased(**gpu, tok, reqs, false);
}

TEST_P(CudaKvCopierFakeDevice, SeesawPhasesMoveEveryKvThroughTheHostBuffer) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_seesaw");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const text::IdTokenizer tok(vocab, 1, 2);
  const auto reqs = requests(vocab);
  const auto mixed = mixed_run(w, tok, reqs);
  model::CudaRunnerOptions small = testing_support::dummy_cuda_options();
  small.num_kv_blocks = 8;  // 128 tokens for 6 sequences of up to 48
  for (int pp : {1, 2}) {
    const std::string name = pp == 1 ? "one runner" : "pp=2 group";
    std::unique_ptr<model::ModelExecutor> x;
    if (pp == 1) {
      auto r = model::CudaModelRunner::create(w, small);
      ASSERT_TRUE(r.ok()) << r.error().to_string();
      x = std::move(r).value();
    } else {
      auto g = model::CudaShardGroup::create(w, small, 1, 2);
      ASSERT_TRUE(g.ok()) << g.error().to_string();
      x = std::move(g).value();
    }
    SeesawStats st;
    KvIoStats io;
    const auto got = run_phased(*x, tok, reqs, true, &st, &io);
    ASSERT_EQ(got.size(), mixed.size()) << name;
    for (const auto& [id, want] : mixed)
      EXPECT_TRUE(testing_support::bit_identical(got.at(id), want)) << name << " request " << id;
    EXPECT_GE(st.offloads, reqs.size()) << name << ": every sequence left the device";
    EXPECT_GE(io.onboards, reqs.size()) << name << ": and came back";
    EXPECT_GT(st.prefill_steps, 0u) << name;
    EXPECT_GT(st.decode_steps, 0u) << name;
    EXPECT_EQ(io.offload_fallbacks, 0u) << name;
    EXPECT_EQ(io.swap_space_bytes_used, 0u) << name << ": nothing left behind";
  }
}

TEST_P(CudaKvCopierFakeDevice, SeesawPairsPrefillInCpAndDecodeInCdWithTheKvReshardedThroughTheHost) {
  const auto w = testing_support::load_dummy_arch("qwen3", "kv_copier_pairs");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  const text::IdTokenizer tok(vocab, 1, 2);
  const auto reqs = requests(vocab);
  const auto mixed = mixed_run(w, tok, reqs);
  model::CudaRunnerOptions small = testing_support::dummy_cuda_options();
  small.num_kv_blocks = 8;
  struct Pair {
    model::ShardDims cp, cd;  // {tp, pp, sp}
    bool bitwise;             // no TP in either: bit-identical to one device
  };
  // Ranks sharing GPU 0, and a GPU per rank (NCCL over the fake NCCL).
  fc::set_device_count(2);
  for (const std::vector<int>& devices : {std::vector<int>{}, std::vector<int>{0, 1}})
  for (const Pair& p : {Pair{{1, 2, 1}, {1, 1, 2}, true}, Pair{{1, 1, 2}, {1, 2, 1}, true},
                        Pair{{1, 2, 1}, {2, 1, 1}, false}}) {
#if !SHARDLINE_HAVE_NCCL
    if (!devices.empty()) continue;  // distinct GPUs need NCCL (refused without: CudaShardGroupOnDistinctGpus)
#endif
    const std::string name = "cp tp=" + std::to_string(p.cp.tp) + ",pp=" + std::to_string(p.cp.pp) + ",sp=" +
                             std::to_string(p.cp.sp) + " cd tp=" + std::to_string(p.cd.tp) + ",pp=" +
                             std::to_string(p.cd.pp) + ",sp=" + std::to_string(p.cd.sp) +
                             (devices.empty() ? " on cuda:0x2" : " on cuda:0,1");
    auto group = model::CudaShardGroup::create(w, small, p.cp.tp, p.cp.pp, p.cp.sp, {}, p.cd, devices);
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    ASSERT_TRUE((*group)->has_step_configs());
    for (int r = 0; r < 2; ++r) {
      ASSERT_NE((*group)->decode_rank(r), nullptr);
      EXPECT_EQ((*group)->rank(r).device_kv_cache().device, devices.empty() ? 0 : r) << name;
      EXPECT_EQ((*group)->decode_rank(r)->device_kv_cache().data, (*group)->rank(r).device_kv_cache().data)
          << name << ": one KV allocation per rank";
    }
    SeesawStats st;
    const auto got = run_phased(**group, tok, reqs, true, &st);
    ASSERT_EQ(got.size(), mixed.size()) << name;
    if (p.bitwise) {
      for (const auto& [id, want] : mixed)
        EXPECT_TRUE(testing_support::bit_identical(got.at(id), want)) << name << " request " << id;
    } else {
      testing_support::expect_close_to_cpu(got, mixed, name);
    }
    EXPECT_GT((*group)->base_steps(), 0u) << name << ": prefill ran in cp";
    EXPECT_GT((*group)->decode_steps(), 0u) << name << ": decode ran in cd";
    EXPECT_GE(st.offloads, reqs.size()) << name;
  }
  // A decode config of another size is refused.
  EXPECT_EQ(model::CudaShardGroup::create(w, small, 1, 2, 1, {}, model::ShardDims{2, 2, 1}).error().code,
            ErrorCode::invalid_argument);
}

}  // namespace model_cuda_cuda_kv_copier_fake_device_test
}  // namespace shardline::engine
