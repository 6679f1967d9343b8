// The REAL CUDA runner (model/cuda/cuda_runner.cpp) as tensor-, sequence-
// (Ulysses) and pipeline-parallel ranks (issue 41 item 1) on the FAKE CUDA device
// (tests/model/cuda/fake_device.hpp), as model::CudaShardGroup runs them:
// several ranks sharing device 0 over in-process device communicators
// (model/cuda/inproc_device_comm.hpp), each rank on its own thread, one
// executor (which checks every step that the last stage's ranks agree bit
// for bit). TP against the CPU runner, with the CPU shard runner's layout
// and numerics (model::shard_layout; the CPU TP bound of 1e-4): Qwen3 at
// tp = 2 and at tp = 4 (its 2 KV heads replicated), Qwen2 (an uneven
// vocabulary split: 777 over 2 ranks, biases), Llama 3 (MHA, untied). PP
// stages (the residual copied from stage to stage) against one CUDA device:
// bit-identical logits, even and uneven layer splits, tied and untied
// lm_heads; SP ranks the same (chunks padded, KV heads replicated); tp x sp
// x pp against the CPU. Every rank of the last stage ends each
// step with the same logits and samples the same ids on the device. A
// failing rank fails the step at once; bad shards are refused. Both timings
// of the fake.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>  // cudaError_t values for fault injection

#include <nlohmann/json.hpp>

#include "comm/inproc.hpp"
#include "engine/llm_engine.hpp"
#include "model/cpu_runner.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/cuda_shard_group.hpp"
#include "model/cuda/inproc_device_comm.hpp"
#include "model/weights.hpp"
#include "tests/model/cuda/dummy_archs.hpp"
#include "tests/model/cuda/fake_device.hpp"
#include "tests/support/engine_runs.hpp"
#include "text/id_tokenizer.hpp"

namespace shardline::engine {
namespace model_cuda_cuda_shard_group_fake_device_test {

namespace fc = testing_support::fake_cuda;
using testing_support::run_all;

using testing_support::greedy_eight;
using testing_support::kDummyBlocks;

model::CudaRunnerOptions cuda_options() { return testing_support::dummy_cuda_options(); }

std::shared_ptr<const model::ModelWeights> dummy_model(const std::string& name) {
  return testing_support::load_dummy_arch(name, "fake_tp");
}

std::map<std::uint64_t, RequestOutput> run_requests(model::ModelExecutor& x, int vocab, bool capture_logits,
                                                    const sampling::SamplingParams& p) {
  return testing_support::run_dummy_requests(x, vocab, capture_logits, p);
}

/// The CPU runner's greedy run of the six requests (logits captured).
std::map<std::uint64_t, RequestOutput> cpu_greedy(const std::shared_ptr<const model::ModelWeights>& w) {
  model::CpuRunnerOptions po;
  po.num_kv_blocks = kDummyBlocks;
  auto cpu = model::CpuModelRunner::create(w, po);
  EXPECT_TRUE(cpu.ok()) << cpu.error().to_string();
  if (!cpu.ok()) return {};
  return run_requests(**cpu, w->config.vocab_size, true, greedy_eight());
}

/// One fake CUDA device's (eager) greedy run of the six requests.
std::map<std::uint64_t, RequestOutput> one_device_greedy(const std::shared_ptr<const model::ModelWeights>& w) {
  model::CudaRunnerOptions one = cuda_options();
  one.cuda_graphs = false;
  auto single = model::CudaModelRunner::create(w, one);
  EXPECT_TRUE(single.ok()) << single.error().to_string();
  if (!single.ok()) return {};
  return run_requests(**single, w->config.vocab_size, true, greedy_eight());
}

/// Group shapes (tp, pp, sp) the sampling and failure cases run.
constexpr std::tuple<int, int, int> kConfigs[] = {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1}, {2, 1, 2}};

std::string config_name(int tp, int pp, int sp) {
  return "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " sp=" + std::to_string(sp);
}

class CudaShardGroupFakeDevice : public testing_support::FakeDeviceTimingTest {};

INSTANTIATE_TEST_SUITE_P(Timing, CudaShardGroupFakeDevice, testing_support::fake_timings(),
                         testing_support::fake_timing_name);

TEST_P(CudaShardGroupFakeDevice, TensorParallelRanksMatchTheCpuRunner) {
  struct Case {
    std::string name;
    int tp;
  };
  // qwen3 tp=4: 2 query heads per rank, 1 KV head each (ranks 0-1 and 2-3
  // replicate one); qwen2: 777 vocabulary rows over 2 ranks.
  const std::vector<Case> cases = {{"qwen3", 2}, {"qwen3", 4}, {"qwen2", 2}, {"llama3", 2}};
  for (const Case& k : cases) {
    const std::string name = k.name + " tp=" + std::to_string(k.tp);
    const auto w = dummy_model(k.name);
    ASSERT_NE(w, nullptr);
    auto group = model::CudaShardGroup::create(w, cuda_options(), k.tp);
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    for (int r = 0; r < k.tp; ++r) {
      EXPECT_TRUE((*group)->rank(r).captured_batch_sizes().empty()) << name << ": no graphs under TP";
      EXPECT_EQ((*group)->rank(r).spec().tp_rank, r);
      // What the memory plan counts for the rank is what it uploads.
      EXPECT_EQ((*group)->rank(r).weight_bytes(), model::cuda_runner_weight_bytes(w->config, DType::f32,
                                                                                  (*group)->rank(r).spec()))
          << name << " rank " << r;
    }
    {
      model::CudaRunnerOptions one = cuda_options();
      one.cuda_graphs = false;
      auto single = model::CudaModelRunner::create(w, one);
      ASSERT_TRUE(single.ok()) << single.error().to_string();
      EXPECT_EQ((*single)->weight_bytes(), model::cuda_runner_weight_bytes(w->config, DType::f32)) << k.name;
    }
    const auto got = run_requests(**group, w->config.vocab_size, true, greedy_eight());
    const auto want = cpu_greedy(w);
    ASSERT_EQ(got.size(), 6u) << name;
    testing_support::expect_close_to_cpu(got, want, name);
  }
}

// Collectives in stream order (the runner binds its communicators to its
// stream): the same bits as with a host synchronisation before every
// collective, without those synchronisations. The dummy qwen3 has 2 layers,
// each with two all-reduces under TP and two all-to-alls under SP.
TEST_P(CudaShardGroupFakeDevice, StreamOrderedCollectivesGiveTheSameBitsWithoutHostSyncsInTheStep) {
  const auto w = dummy_model("qwen3");
  ASSERT_NE(w, nullptr);
  // The engine's steps: one device's run of the same requests (one
  // embedding launch each; no graphs).
  long steps = 0;
  {
    model::CudaRunnerOptions one = cuda_options();
    one.cuda_graphs = false;
    auto single = model::CudaModelRunner::create(w, one);
    ASSERT_TRUE(single.ok()) << single.error().to_string();
    const long embeds_before = fc::kernel_runs("embedding");
    (void)run_requests(**single, w->config.vocab_size, true, greedy_eight());
    steps = fc::kernel_runs("embedding") - embeds_before;
  }
  ASSERT_GT(steps, 0);
  for (const auto& [tp, sp] : {std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
    const std::string name = "tp=" + std::to_string(tp) + " sp=" + std::to_string(sp);
    std::map<std::uint64_t, RequestOutput> outs[2];
    long syncs[2] = {0, 0};
    for (int ordered = 0; ordered < 2; ++ordered) {
      model::CudaRunnerOptions o = cuda_options();
      o.stream_ordered_comms = ordered == 1;
      auto group = model::CudaShardGroup::create(w, o, tp, 1, sp);
      ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
      const long syncs_before = fc::counters().host_syncs;
      outs[ordered] = run_requests(**group, w->config.vocab_size, true, greedy_eight());
      syncs[ordered] = fc::counters().host_syncs - syncs_before;
    }
    ASSERT_EQ(outs[1].size(), outs[0].size()) << name;
    for (const auto& [id, want] : outs[0])
      EXPECT_TRUE(testing_support::bit_identical(outs[1].at(id), want)) << name << " request " << id;
    const long rank_steps = steps * tp * sp;
    // Host-synchronised: a wait before each of the 2 layers' 2 (or 4)
    // collectives per rank and step. In stream order, whatever the layers:
    // 2 per rank and step (the end of the forward, sampling), and a device
    // synchronisation each time one of a rank's two staging slots grows
    // (doubling: a few times in a run).
    EXPECT_GE(syncs[0] - syncs[1], 4 * rank_steps) << name << ": " << syncs[0] << " vs " << syncs[1];
    EXPECT_GE(syncs[1], 2 * rank_steps) << name;
    EXPECT_LE(syncs[1], 2 * rank_steps + 10L * tp * sp) << name << ": host syncs in " << rank_steps << " rank steps";
  }
}

// Sampled on the device (seeded, temperature 0.8, top-p): every rank of the
// last stage draws the same ids from its copy of the gathered logits
// (CudaShardGroup checks each step), and they are the ids one fake device
// draws alone, under TP, PP and both.
TEST_P(CudaShardGroupFakeDevice, RanksSampleTheSameIdsAsOneDevice) {
  const auto w = dummy_model("qwen3");
  ASSERT_NE(w, nullptr);
  sampling::SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.max_tokens = 8;
  p.ignore_eos = true;
  std::map<std::uint64_t, RequestOutput> one;
  {
    auto single = model::CudaModelRunner::create(w, cuda_options());
    ASSERT_TRUE(single.ok()) << single.error().to_string();
    one = run_requests(**single, w->config.vocab_size, false, p);
  }
  ASSERT_EQ(one.size(), 6u);
  for (const auto& [tp, pp, sp] : kConfigs) {
    const std::string name = config_name(tp, pp, sp);
    auto group = model::CudaShardGroup::create(w, cuda_options(), tp, pp, sp);
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    const auto got = run_requests(**group, w->config.vocab_size, false, p);
    ASSERT_EQ(got.size(), 6u) << name;
    for (const auto& [id, out] : one) EXPECT_EQ(got.at(id).token_ids, out.token_ids) << name << " request " << id;
  }
}

/// Every request's ids and every step's logits, bit for bit.
void expect_bit_identical(const std::map<std::uint64_t, RequestOutput>& got,
                          const std::map<std::uint64_t, RequestOutput>& want, const std::string& name) {
  ASSERT_EQ(got.size(), want.size()) << name;
  for (const auto& [id, ref] : want) {
    const RequestOutput& out = got.at(id);
    EXPECT_EQ(out.token_ids, ref.token_ids) << name << " request " << id;
    ASSERT_EQ(out.logits.size(), ref.logits.size()) << name << " request " << id;
    for (std::size_t step = 0; step < ref.logits.size(); ++step) {
      ASSERT_EQ(out.logits[step].size(), ref.logits[step].size());
      EXPECT_EQ(0, std::memcmp(out.logits[step].data(), ref.logits[step].data(), ref.logits[step].size() * 4))
          << name << " request " << id << " step " << step << " not bit-identical";
    }
  }
}

// Pipeline stages copy the residual from stage to stage and run the same
// kernels on the same rows: in deterministic mode the logits are one
// device's, bit for bit, with pp micro-batches in flight. Even splits (Qwen3's 2 layers over 2 stages),
// uneven ones (Llama 3's 3 layers over 2: 2 + 1), one layer per stage
// (Llama 3 over 3), a tied lm_head the last stage copies (Qwen3) and untied
// ones (Qwen2, Llama 3). Each stage uploads what the memory plan counts.
TEST_P(CudaShardGroupFakeDevice, PipelineStagesAreBitIdenticalToOneDevice) {
  struct Case {
    std::string name;
    int pp;
  };
  for (const Case& k : std::vector<Case>{{"qwen3", 2}, {"qwen2", 2}, {"llama3", 2}, {"llama3", 3}}) {
    const std::string name = k.name + " pp=" + std::to_string(k.pp);
    const auto w = dummy_model(k.name);
    ASSERT_NE(w, nullptr);
    const auto want = one_device_greedy(w);
    auto group = model::CudaShardGroup::create(w, cuda_options(), 1, k.pp);
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    std::uint64_t bytes = 0;
    for (int r = 0; r < k.pp; ++r) {
      const model::CudaModelRunner& rank = (*group)->rank(r);
      EXPECT_EQ(rank.spec().stage, r);
      EXPECT_TRUE(rank.captured_batch_sizes().empty()) << name << ": no graphs under PP";
      EXPECT_EQ(rank.weight_bytes(), model::cuda_runner_weight_bytes(w->config, DType::f32, rank.spec()))
          << name << " stage " << r;
      bytes += rank.weight_bytes();
    }
    EXPECT_GT(bytes, model::cuda_runner_weight_bytes(w->config, DType::f32)) << name << ": the stages hold more "
                                                                                "than one device (norms, RoPE)";
    EXPECT_EQ((*group)->max_in_flight(), k.pp);
    const auto got = run_requests(**group, w->config.vocab_size, true, greedy_eight());
    expect_bit_identical(got, want, name);
    // The engine kept pp micro-batches in flight: stage s on one while
    // stage s + 1 ran the one before (gLLM's asynchronous pipeline).
    EXPECT_EQ((*group)->max_steps_in_flight_seen(), k.pp) << name;
  }
}

// Ulysses SP (seed 001 Algorithm 2): each rank runs its chunk of the rows
// (the last ones padded) and attends every row for its heads after the
// all-to-all; KV heads go to every rank whose heads read them (Algorithm
// 1). Every kernel is row-independent and batch-invariant, so with tp = 1
// the logits are one device's, bit for bit: Qwen3 over 2 ranks (one KV head
// each) and over 4 (KV heads replicated: two ranks read each), Qwen2 (3
// query heads per rank, biases), Llama 3 over 4 (one head each), and SP
// with pipeline stages.
TEST_P(CudaShardGroupFakeDevice, SequenceParallelRanksAreBitIdenticalToOneDevice) {
  struct Case {
    std::string name;
    int sp, pp;
  };
  for (const Case& k : std::vector<Case>{{"qwen3", 2, 1}, {"qwen3", 4, 1}, {"qwen2", 2, 1}, {"llama3", 4, 1},
                                         {"qwen3", 2, 2}}) {
    const std::string name = k.name + " sp=" + std::to_string(k.sp) + " pp=" + std::to_string(k.pp);
    const auto w = dummy_model(k.name);
    ASSERT_NE(w, nullptr);
    const auto want = one_device_greedy(w);
    auto group = model::CudaShardGroup::create(w, cuda_options(), 1, k.pp, k.sp);
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    for (int r = 0; r < (*group)->group_size(); ++r) {
      EXPECT_EQ((*group)->rank(r).spec().sp_rank, r % k.sp) << name;
      EXPECT_EQ((*group)->rank(r).spec().stage, r / k.sp) << name;
    }
    const auto got = run_requests(**group, w->config.vocab_size, true, greedy_eight());
    expect_bit_identical(got, want, name);
  }
}

// tp x sp x pp: the TP all-reduces inside each stage, Ulysses' all-to-alls
// across the SP ranks, the residual between stages.
TEST_P(CudaShardGroupFakeDevice, TensorSequenceAndPipelineRanksMatchTheCpuRunner) {
  for (const auto& [arch, tp, pp, sp] :
       {std::tuple{std::string("qwen3"), 2, 2, 1}, std::tuple{std::string("llama3"), 2, 3, 1},
        std::tuple{std::string("qwen3"), 2, 1, 2}, std::tuple{std::string("llama3"), 2, 2, 2}}) {
    const std::string name = arch + " " + config_name(tp, pp, sp);
    const auto w = dummy_model(arch);
    ASSERT_NE(w, nullptr);
    auto group = model::CudaShardGroup::create(w, cuda_options(), tp, pp, sp);
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    ASSERT_EQ((*group)->group_size(), tp * pp * sp);
    for (int r = 0; r < tp * pp * sp; ++r) {
      EXPECT_EQ((*group)->rank(r).spec().tp_rank, r % tp) << name;
      EXPECT_EQ((*group)->rank(r).spec().sp_rank, (r / tp) % sp) << name;
      EXPECT_EQ((*group)->rank(r).spec().stage, r / (tp * sp)) << name;
    }
    const auto got = run_requests(**group, w->config.vocab_size, true, greedy_eight());
    const auto want = cpu_greedy(w);
    ASSERT_EQ(got.size(), 6u) << name;
    testing_support::expect_close_to_cpu(got, want, name);
  }
}

// Shift Parallelism (seed 001 §3.3) on a base config of tp=2 x sp=2 (Qwen3:
// one KV head per rank, each on two ranks) and the shift config TP' = 4
// over the same four ranks, rank (t, s) as TP' rank t*2 + s (§3.3.1), on
// the base runners' KV caches. Every step runs in the chooser's config:
// always base, always shift, or by size (decode steps of <= 8 tokens in
// TP', 16-token prefill chunks in SP x TP): KV written in one config is
// read in the other, and the logits stay within the CPU TP bound.
TEST_P(CudaShardGroupFakeDevice, ShiftRunsEachStepInTheChosenConfigOnOneKvCache) {
  const auto w = dummy_model("qwen3");
  ASSERT_NE(w, nullptr);
  const auto want = cpu_greedy(w);
  struct Case {
    std::string name;
    model::CudaShardGroup::ShiftChooser choose;
  };
  const std::vector<Case> cases = {
      {"always base", [](const model::StepInput&) { return false; }},
      {"always shift", [](const model::StepInput&) { return true; }},
      {"by size", [](const model::StepInput& in) { return in.num_tokens() <= 8; }}};
  // Ranks sharing GPU 0, and a GPU per rank (the TP' group over NCCL too).
  fc::set_device_count(4);
  for (const std::vector<int>& devices : {std::vector<int>{}, std::vector<int>{0, 1, 2, 3}})
  for (const Case& k : cases) {
#if !SHARDLINE_HAVE_NCCL
    if (!devices.empty()) continue;
#endif
    auto group = model::CudaShardGroup::create(w, cuda_options(), 2, 1, 2, k.choose, std::nullopt, devices);
    ASSERT_TRUE(group.ok()) << k.name << ": " << group.error().to_string();
    for (int r = 0; r < 4; ++r) {
      const model::CudaModelRunner* shift = (*group)->shift_rank(r);
      ASSERT_NE(shift, nullptr);
      EXPECT_EQ(shift->spec().tp, 4);
      EXPECT_EQ(shift->spec().tp_rank, (r % 2) * 2 + r / 2) << "rank " << r << ": the §3.3.1 order";
      EXPECT_EQ(shift->device_kv_cache().data, (*group)->rank(r).device_kv_cache().data) << "one KV cache";
      EXPECT_EQ(shift->device_kv_cache().layout.kv_heads, (*group)->rank(r).device_kv_cache().layout.kv_heads);
    }
    const auto got = run_requests(**group, w->config.vocab_size, true, greedy_eight());
    ASSERT_EQ(got.size(), 6u) << k.name;
    testing_support::expect_close_to_cpu(got, want, k.name);
    if (k.name == "always base") EXPECT_EQ((*group)->shift_steps(), 0u);
    if (k.name == "always shift") EXPECT_EQ((*group)->base_steps(), 0u);
    if (k.name == "by size") {
      EXPECT_GT((*group)->base_steps(), 0u) << "prefill chunks run in SP x TP";
      EXPECT_GT((*group)->shift_steps(), 0u) << "decode steps run in TP'";
    }
  }
  EXPECT_EQ(model::CudaShardGroup::create(w, cuda_options(), 1, 2, 1, cases[1].choose).error().code,
            ErrorCode::invalid_argument);
  auto plain = model::CudaShardGroup::create(w, cuda_options(), 2);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->shift_rank(0), nullptr);
}

// A rank whose step fails (here the first metadata copy of the step fails
// on whichever rank issues it first) fails the step on every rank at once:
// it is marked dead in its host groups, so a TP peer does not wait in a
// collective, nor a stage for its residual or its send's acknowledgement,
// until the communicator's timeout. The group is broken from then on.
TEST_P(CudaShardGroupFakeDevice, ARankThatFailsFailsTheStepEverywhereAndBreaksTheGroup) {
  const auto w = dummy_model("qwen3");
  ASSERT_NE(w, nullptr);
  for (const auto& [tp, pp, sp] : kConfigs) {
    const std::string name = config_name(tp, pp, sp);
    auto group = model::CudaShardGroup::create(w, cuda_options(), tp, pp, sp);
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    const model::StepInput step = testing_support::three_token_step(16);
    auto good = (*group)->execute(step);
    ASSERT_TRUE(good.ok()) << name << ": " << good.error().to_string();
    EXPECT_EQ(good->logits.size(), static_cast<std::size_t>(w->config.vocab_size)) << name;
    fc::fail_call("cudaMemcpyAsync", cudaErrorLaunchFailure);
    const auto t0 = std::chrono::steady_clock::now();
    auto failed = (*group)->execute(step);
    ASSERT_FALSE(failed.ok()) << name;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << name << ": a peer waited for the timeout";
    EXPECT_TRUE((*group)->broken()) << name;
    auto after = (*group)->execute(step);
    ASSERT_FALSE(after.ok()) << name;
    EXPECT_EQ(after.error().code, ErrorCode::io) << name;
    EXPECT_NE(after.error().message.find("must be rebuilt"), std::string::npos) << after.error().message;
  }
  EXPECT_EQ(model::CudaShardGroup::create(w, cuda_options(), 1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(model::CudaShardGroup::create(w, cuda_options(), 2, 0).error().code, ErrorCode::invalid_argument);
}

TEST_P(CudaShardGroupFakeDevice, ShardsTheRunnerCannotHoldAreRefused) {
  const auto w = dummy_model("qwen3");
  ASSERT_NE(w, nullptr);
  auto expect_refused = [&](const model::ShardSpec& spec, model::ShardComms comms, const std::string& says) {
    auto r = model::CudaModelRunner::create(w, cuda_options(), spec, comms);
    ASSERT_FALSE(r.ok()) << says;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
  };
  auto group = comm::InProcGroup::create(2);
  ASSERT_TRUE(group.ok());
  auto host0 = (*group)->communicator(0);
  ASSERT_TRUE(host0.ok());
  model::ShardSpec sp2;
  sp2.sp = 2;
  expect_refused(sp2, {}, "SP group of size 2 has no communicator");
  expect_refused(sp2, {nullptr, host0->get(), nullptr}, "the SP communicator works on host memory");
  model::ShardSpec pp2;
  pp2.pp = 2;
  expect_refused(pp2, {}, "pipeline of 2 stages has no PP communicator");
  expect_refused(pp2, {nullptr, nullptr, host0->get()}, "the PP communicator works on host memory");
  model::ShardSpec pp3 = pp2;
  pp3.pp = 3;
  expect_refused(pp3, {}, "pp = 3");
  model::ShardSpec tp3;
  tp3.tp = 3;
  expect_refused(tp3, {}, "must divide num_attention_heads = 8");
  model::ShardSpec tp2;
  tp2.tp = 2;
  expect_refused(tp2, {}, "TP group of size 2 has no communicator");
  expect_refused(tp2, {host0->get(), nullptr}, "works on host memory");
  auto three = comm::InProcGroup::create(3);
  ASSERT_TRUE(three.ok());
  auto dev = model::InProcDeviceCommunicator::create(std::move((*three)->communicator(0)).value(), 0);
  ASSERT_TRUE(dev.ok());
  expect_refused(tp2, {dev->get(), nullptr}, "rank 0 of 3, expected rank 0 of 2");
  expect_refused(pp2, {nullptr, nullptr, dev->get()}, "PP communicator is rank 0 of 3, expected stage 0 of 2");
}

// A GPU per rank (issue 41 item 2): each TP, SP and PP group's ranks talk
// over NCCL (comm/nccl.cpp over the fake NCCL: collectives and send / recv
// on each communicator's stream, waiting there for the peers). Every rank's
// runner, KV cache and kernels are on its own GPU (a kernel touching
// another's memory is an anomaly), and every shape gives what the same
// group sharing one GPU gives, bit for bit (the fake NCCL sums in rank
// order, as the in-process device communicator does).
TEST_P(CudaShardGroupFakeDevice, RanksOnDistinctGpusOverNcclMatchRanksSharingOne) {
  const auto w = dummy_model("qwen3");
  ASSERT_NE(w, nullptr);
  fc::set_device_count(8);
  const auto want = cpu_greedy(w);
  std::vector<std::tuple<int, int, int>> shapes(std::begin(kConfigs), std::end(kConfigs));
  shapes.emplace_back(2, 2, 2);
  for (const auto& [tp, pp, sp] : shapes) {
    const std::string name = config_name(tp, pp, sp);
    const int n = tp * pp * sp;
    std::vector<int> devices(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) devices[static_cast<std::size_t>(r)] = n - 1 - r;  // not rank order
    std::map<std::uint64_t, RequestOutput> shared;
    {
      auto group = model::CudaShardGroup::create(w, cuda_options(), tp, pp, sp);
      ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
      shared = run_requests(**group, w->config.vocab_size, true, greedy_eight());
    }
    auto group = model::CudaShardGroup::create(w, cuda_options(), tp, pp, sp, {}, std::nullopt, devices);
#if SHARDLINE_HAVE_NCCL
    ASSERT_TRUE(group.ok()) << name << ": " << group.error().to_string();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ((*group)->rank(r).device_kv_cache().device, n - 1 - r) << name << " rank " << r;
    }
    const auto got = run_requests(**group, w->config.vocab_size, true, greedy_eight());
    expect_bit_identical(got, shared, name + " on a GPU per rank");
    testing_support::expect_close_to_cpu(got, want, name + " on a GPU per rank");
    EXPECT_EQ((*group)->max_steps_in_flight_seen(), pp) << name;
#else
    ASSERT_FALSE(group.ok()) << name;
    EXPECT_EQ(group.error().code, ErrorCode::unsupported) << group.error().to_string();
#endif
  }
  // A group whose ranks neither all share a GPU nor each have their own.
  auto mixed = model::CudaShardGroup::create(w, cuda_options(), 2, 2, 1, {}, std::nullopt, {0, 0, 1, 1});
  auto mixed_tp = model::CudaShardGroup::create(w, cuda_options(), 4, 1, 1, {}, std::nullopt, {0, 0, 1, 1});
#if SHARDLINE_HAVE_NCCL
  ASSERT_TRUE(mixed.ok()) << "TP groups on GPUs 0 and 1, each stage's pair sharing one: " << mixed.error().to_string();
#endif
  ASSERT_FALSE(mixed_tp.ok());
  EXPECT_EQ(mixed_tp.error().code, ErrorCode::unsupported);
  EXPECT_NE(mixed_tp.error().message.find("mixes shared and distinct GPUs"), std::string::npos)
      << mixed_tp.error().message;
  EXPECT_EQ(model::CudaShardGroup::create(w, cuda_options(), 2, 1, 1, {}, std::nullopt, {0, 1, 2}).error().code,
            ErrorCode::invalid_argument);
}

}  // namespace model_cuda_cuda_shard_group_fake_device_test
}  // namespace shardline::engine
