// engine::build_engine's CUDA paths (engine/group/engine_builder.cpp, issue
// 41 item 3) on the FAKE CUDA device: what `run` / `node start --devices
// cuda:0xK --parallel ...` build for each worker. The memory plan (the
// fake reports an 80 GiB device), the KV budget, the group's shape and its
// extras (Shift's chooser from the ShiftPolicy, Seesaw's decode config and
// phases) come from EngineOptions as the CLI sets them, and each engine's
// greedy outputs match the CPU engine built from the same options within
// the CPU TP bound. Options the CUDA groups cannot serve are refused with
// the flag named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/cuda_shard_group.hpp"
#include "tests/model/cuda/dummy_archs.hpp"
#include "tests/model/cuda/fake_device.hpp"

namespace shardline::engine {
namespace model_cuda_cuda_engine_builder_fake_device_test {

namespace fc = testing_support::fake_cuda;

class CudaEngineBuilderFakeDevice : public ::testing::Test {
 protected:
  void SetUp() override { fc::reset(fc::Execution::deferred); }
  void TearDown() override { testing_support::expect_fake_device_clean_and_reset(); }
};

/// A model folder of dummy Qwen3 weights (the dummy loader reads config.json).
std::string qwen3_dir() {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "engine_builder_qwen3";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << testing_support::dummy_arch("qwen3").dump(2);
  return dir.string();
}

EngineOptions options(model::DeviceKind device, ParallelConfig pc) {
  EngineOptions o;
  o.model_dir = qwen3_dir();
  o.load_format = model::LoadFormat::dummy;
  o.device = device;
  o.parallel = pc;
  o.dtype = DType::f32;
  o.kv_cache_dtype = DType::f32;
  o.deterministic = true;
  o.block_size = 16;
  o.max_model_len = 64;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 16;
  o.kv_cache_bytes = 64ull * 16 * 1024;  // 64 blocks of 16 tokens, 1 KiB per token
  o.num_threads = 1;
  o.capture_logits = true;
  o.swap_space_bytes = 64 * 1024;  // one 64-token sequence (Seesaw's host buffer)
  return o;
}

/// Six greedy prompts of 3 to 38 tokens, 8 tokens each, through `e`.
std::vector<RequestOutput> generate(EngineInstance& e) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (int r = 0; r < 6; ++r) {
    std::vector<std::int32_t> p;
    for (int t = 0; t < 3 + 7 * r; ++t) p.push_back(3 + (37 * r + 11 * t) % 997);
    prompts.push_back(p);
  }
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 8;
  greedy.ignore_eos = true;
  std::vector<LlmEngine*> engines = {e.engine.get()};
  auto out = generate_data_parallel(engines, prompts, greedy);
  EXPECT_TRUE(out.ok()) << out.error().to_string();
  return out.ok() ? std::move(out).value() : std::vector<RequestOutput>{};
}

std::map<std::uint64_t, RequestOutput> by_id(std::vector<RequestOutput> outs) {
  std::map<std::uint64_t, RequestOutput> m;
  for (auto& o : outs) m.emplace(o.request_id, std::move(o));
  return m;
}

TEST_F(CudaEngineBuilderFakeDevice, EveryGroupShapeTheCliAcceptsBuildsAndMatchesTheCpuEngine) {
  struct Case {
    std::string name;
    ParallelConfig pc;  // {tp, pp, sp, dp}
    bool shift = false;
    std::optional<ParallelConfig> decode;  // Seesaw's cd
    bool reload = false;                   // Seesaw's --reshard-weights reload
    std::vector<int> gpus;                 // a GPU per rank (empty: sharing cuda:0)
  };
  const std::vector<Case> cases = {
      {"single", {1, 1, 1, 1}},
      {"tp=2", {2, 1, 1, 1}},
      {"pp=2", {1, 2, 1, 1}},
      {"sp=2", {1, 1, 2, 1}},
      {"tp=2,pp=2", {2, 2, 1, 1}},
      {"sp=2 --shift", {1, 1, 2, 1}, true},
      {"pp=2 --parallel-decode tp=2", {1, 2, 1, 1}, false, ParallelConfig{2, 1, 1, 1}},
      {"pp=2 --parallel-decode sp=2 --reshard-weights reload", {1, 2, 1, 1}, false, ParallelConfig{1, 1, 2, 1}, true},
      {"tp=2 on cuda:0,1", {2, 1, 1, 1}, false, std::nullopt, false, {0, 1}},
      {"tp=2,pp=2 on cuda:0-3", {2, 2, 1, 1}, false, std::nullopt, false, {3, 2, 1, 0}},
      {"tp=2,pp=2, each stage's pair sharing a GPU", {2, 2, 1, 1}, false, std::nullopt, false, {0, 0, 1, 1}},
      {"pp=2 --parallel-decode tp=2 --reshard-weights reload on cuda:0,1", {1, 2, 1, 1}, false,
       ParallelConfig{2, 1, 1, 1}, true, {0, 1}},
  };
  testing_support::fake_cuda::set_device_count(4);
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    auto configure = [&](EngineOptions o) {
      if (k.shift) {
        ShiftOptions so;
        so.policy.threshold = 8;  // decode steps of <= 8 tokens in TP'
        o.shift = so;
      }
      if (k.decode) {
        o.parallel_decode = k.decode;
        o.seesaw = SeesawPolicyOptions{};
        o.preemption_mode = PreemptionMode::swap;
        if (k.reload) o.reshard_weights = ReshardWeights::reload;
      }
      return o;
    };
    auto cpu = build_engine(configure(options(model::DeviceKind::cpu, k.pc)));
    ASSERT_TRUE(cpu.ok()) << cpu.error().to_string();
    const auto want = by_id(generate(*cpu));
    EngineOptions go = configure(options(model::DeviceKind::cuda, k.pc));
    go.group_devices = k.gpus;
    auto gpu = build_engine(go);
    ASSERT_TRUE(gpu.ok()) << gpu.error().to_string();
    EXPECT_EQ(gpu->num_kv_blocks, 32) << "the budget's 64 blocks, capped at 8 sequences of 64 tokens";
    if (k.pc.group_size() == 1) {
      EXPECT_NE(gpu->executor_as<model::CudaModelRunner>(), nullptr);
    } else {
      auto* group = gpu->executor_as<model::CudaShardGroup>();
      ASSERT_NE(group, nullptr);
      EXPECT_EQ(group->tp(), k.pc.tp);
      EXPECT_EQ(group->pp(), k.pc.pp);
      EXPECT_EQ(group->sp(), k.pc.sp);
      EXPECT_EQ(group->shift_rank(0) != nullptr, k.shift);
      EXPECT_EQ(group->has_step_configs(), k.decode.has_value());
      for (int r = 0; r < k.pc.group_size(); ++r) {
        EXPECT_EQ(group->rank(r).options().device_index, k.gpus.empty() ? 0 : k.gpus[static_cast<std::size_t>(r)]);
        // Under reload only the active config (cp) has weights on the GPU.
        if (k.decode) EXPECT_EQ(group->decode_rank(r)->weights_on_device(), !k.reload) << "rank " << r;
      }
    }
    EXPECT_TRUE(gpu->engine->kv_io().can_move_kv()) << "DéjàVu's streaming reaches the CUDA caches";
    const auto got = by_id(generate(*gpu));
    ASSERT_EQ(got.size(), 6u);
    testing_support::expect_close_to_cpu(got, want, k.name);
    if (auto* group = gpu->executor_as<model::CudaShardGroup>(); group != nullptr) {
      if (k.shift) EXPECT_GT(group->shift_steps(), 0u) << "the ShiftPolicy shifted the decode steps";
      if (k.decode) EXPECT_GT(group->decode_steps(), 0u) << "Seesaw decoded in cd";
      if (k.reload) EXPECT_GE(group->weight_reloads(), 2u) << "to cd and back: the weights swapped each time";
      if (k.decode && !k.reload) EXPECT_EQ(group->weight_reloads(), 0u);
    }
  }
}

TEST_F(CudaEngineBuilderFakeDevice, OptionsTheCudaGroupsCannotServeAreRefusedNamingTheFlag) {
  auto expect_refused = [](EngineOptions o, ErrorCode code, const std::string& words) {
    auto e = build_engine(o);
    ASSERT_FALSE(e.ok()) << words;
    EXPECT_EQ(e.error().code, code) << e.error().to_string();
    EXPECT_NE(e.error().message.find(words), std::string::npos) << e.error().message;
  };
  EngineOptions gpus = options(model::DeviceKind::cuda, {2, 1, 1, 1});
  gpus.group_devices = {0, 1, 2};
  expect_refused(gpus, ErrorCode::invalid_argument, "3 GPUs for an engine group of 2 ranks");
  EngineOptions shift_pp = options(model::DeviceKind::cuda, {1, 2, 1, 1});
  shift_pp.shift = ShiftOptions{};
  expect_refused(shift_pp, ErrorCode::unsupported, "pp = 1");
  EngineOptions missing = options(model::DeviceKind::cuda, {2, 1, 1, 1});
  missing.device_index = 1;  // the fake has one device
  expect_refused(missing, ErrorCode::not_found, "cuda:1");
  // The engine that fits still builds afterwards.
  EXPECT_TRUE(build_engine(options(model::DeviceKind::cuda, {2, 1, 1, 1})).ok());
}

}  // namespace model_cuda_cuda_engine_builder_fake_device_test
}  // namespace shardline::engine
