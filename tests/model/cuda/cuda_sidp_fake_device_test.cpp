// SiDP on CUDA ranks (model/cuda/sidp, seed 002 §4; issue 41 item 6) on the
// FAKE CUDA device: each data-parallel rank is a real CudaModelRunner
// holding no FFN weights of its own, whose FFNs run through a CudaSidpFfn;
// its CudaLayerOwner holds the layers it owns in its GPU's memory, exposed
// on an in-process device communicator.
//  - WaS: every other layer comes into cache slots in the rank's GPU memory
//    through WeightCache's housekeeper, whose gets are device copies (across
//    GPUs: peer copies). Every rank's greedy run is one plain device's, bit
//    for bit, on ranks sharing a GPU and on a GPU each, with the balanced
//    plan and a plan whose remote layers outnumber the slots, on Qwen3 and
//    Llama 3; the rank holds no FFN weights besides its own and its slots.
//  - CaS: the ranks step on threads in lockstep; the rows of a layer go to
//    its owner, which runs one fused GEMM chain over its own and the peers'
//    rows (more rows than the runner's activations: chunks) and returns each
//    its slice; the shorter rank runs dummy steps until the longer is done.
//    Runs in CaS from the start, and switching WaS -> CaS -> WaS -> CaS at
//    rank-local step counts, are one plain device's, bit for bit.
//  - An owner that is down fails a WaS step with io after owner_wait; once
//    it is back, the next step runs.
// Both timings of the fake.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "engine/llm_engine.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/inproc_device_comm.hpp"
#include "model/cuda/sidp/cuda_layer_owner.hpp"
#include "model/cuda/sidp/cuda_sidp_ffn.hpp"
#include "model/sidp/ownership.hpp"
#include "tests/model/cuda/dummy_archs.hpp"
#include "tests/model/cuda/fake_device.hpp"
#include "tests/support/engine_runs.hpp"

namespace shardline::engine {
namespace model_cuda_cuda_sidp_fake_device_test {

namespace fc = testing_support::fake_cuda;
namespace sidp = model::sidp;

class CudaSidpFakeDevice : public testing_support::FakeDeviceTimingTest {
 protected:
  void SetUp() override {
    FakeDeviceTimingTest::SetUp();
    fc::set_device_count(2);
  }
};

INSTANTIATE_TEST_SUITE_P(Timing, CudaSidpFakeDevice, testing_support::fake_timings(),
                         testing_support::fake_timing_name);

struct Rank {
  std::shared_ptr<sidp::CudaLayerOwner> owner;
  std::shared_ptr<sidp::CudaSidpFfn> ffn;
  std::unique_ptr<model::CudaModelRunner> runner;
};

/// dp ranks (rank r on gpus[r]); members in destruction order: the runners
/// first, then the executors, the owners, the communicators.
struct Group {
  std::shared_ptr<comm::InProcGroup> weights_group, compute_group;
  std::vector<std::unique_ptr<model::InProcDeviceCommunicator>> weights, compute;
  std::vector<Rank> ranks;
};

/// One device communicator per rank over a new in-process group.
std::vector<std::unique_ptr<model::InProcDeviceCommunicator>> device_comms(std::shared_ptr<comm::InProcGroup>& group,
                                                                          const std::vector<int>& gpus) {
  group = comm::InProcGroup::create(static_cast<int>(gpus.size())).value();
  std::vector<std::unique_ptr<model::InProcDeviceCommunicator>> out;
  for (std::size_t r = 0; r < gpus.size(); ++r) {
    auto host = group->communicator(static_cast<int>(r)).value();
    host->set_timeout(std::chrono::seconds(30));
    auto c = model::InProcDeviceCommunicator::create(std::move(host), gpus[r]);
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    out.push_back(std::move(c).value());
  }
  return out;
}

/// The group, its owners loaded unless `unloaded` names one; with a compute
/// group unless `was_only`.
Group make_group(const std::shared_ptr<const model::ModelWeights>& w, const sidp::OwnershipPlan& plan,
                 const std::vector<int>& gpus, sidp::SidpFfnOptions options, int unloaded = -1,
                 bool was_only = true) {
  Group g;
  g.weights = device_comms(g.weights_group, gpus);
  if (!was_only) g.compute = device_comms(g.compute_group, gpus);
  for (int r = 0; r < plan.dp; ++r) {
    const auto i = static_cast<std::size_t>(r);
    Rank k;
    auto owner = sidp::CudaLayerOwner::create(plan, r, gpus[i], w->config, DType::f32);
    EXPECT_TRUE(owner.ok()) << owner.error().to_string();
    k.owner = std::move(owner).value();
    if (r != unloaded) EXPECT_TRUE(k.owner->load(*w, *g.weights[i]).ok());
    auto ffn = sidp::CudaSidpFfn::create(plan, k.owner, g.weights[i].get(), was_only ? nullptr : g.compute[i].get(),
                                         options);
    EXPECT_TRUE(ffn.ok()) << ffn.error().to_string();
    k.ffn = std::move(ffn).value();
    model::CudaRunnerOptions o = testing_support::dummy_cuda_options();
    o.device_index = gpus[i];
    auto runner = model::CudaModelRunner::create(w, o, {}, {}, k.ffn);
    EXPECT_TRUE(runner.ok()) << runner.error().to_string();
    k.runner = std::move(runner).value();
    g.ranks.push_back(std::move(k));
  }
  return g;
}

TEST_P(CudaSidpFakeDevice, EveryRankIsBitIdenticalToOneDeviceHoldingOnlyItsOwnFfnLayersAndItsSlots) {
  struct Case {
    std::string arch;
    std::string plan;  // "" = balanced
    int slots;
  };
  // Llama 3's "0,1,1": rank 0 owns layer 0 and fetches 1 and 2 through one
  // slot, refilled between them.
  for (const Case& k : {Case{"qwen3", "", 1}, Case{"llama3", "", 2}, Case{"llama3", "0,1,1", 1}}) {
    const auto w = testing_support::load_dummy_arch(k.arch, "cuda_sidp");
    ASSERT_NE(w, nullptr);
    const int vocab = w->config.vocab_size;
    auto plan = sidp::parse_plan(k.plan, w->config.num_hidden_layers, 2);
    ASSERT_TRUE(plan.ok()) << plan.error().to_string();
    std::map<std::uint64_t, RequestOutput> want;
    std::size_t plain_bytes = 0;
    {
      model::CudaRunnerOptions o = testing_support::dummy_cuda_options();
      o.cuda_graphs = false;
      auto plain = model::CudaModelRunner::create(w, o);
      ASSERT_TRUE(plain.ok()) << plain.error().to_string();
      plain_bytes = (*plain)->weight_bytes();
      want = testing_support::run_dummy_requests(**plain, vocab, true, testing_support::greedy_eight());
    }
    const sidp::FfnLayout layout = sidp::cuda_ffn_layout(w->config, DType::f32);
    for (const std::vector<int>& gpus : {std::vector<int>{0, 0}, std::vector<int>{0, 1}}) {
      const std::string name = k.arch + " plan " + plan->to_string() + " on cuda:" + std::to_string(gpus[0]) + "," +
                               std::to_string(gpus[1]);
      sidp::SidpFfnOptions options;
      options.cache.cache_slots = k.slots;
      Group g = make_group(w, *plan, gpus, options);
      ASSERT_EQ(g.ranks.size(), 2u);
      for (int r = 0; r < 2; ++r) {
        Rank& rank = g.ranks[static_cast<std::size_t>(r)];
        const auto owned = plan->owned_layers(r).size();
        const auto remote = plan->remote_layers(r).size();
        EXPECT_EQ(rank.runner->weight_bytes() + w->config.num_hidden_layers * (layout.gate_up_bytes + layout.down_bytes),
                  plain_bytes)
            << name << ": the runner holds no FFN weights";
        EXPECT_EQ(rank.owner->bytes(), owned * layout.bytes) << name;
        EXPECT_EQ(rank.ffn->ffn_weight_bytes(), (owned + rank.ffn->cache_slots()) * layout.bytes) << name;
        if (k.plan == "0,1,1" && r == 0)
          EXPECT_EQ(rank.ffn->cache_slots(), 1) << name << ": " << remote << " remote layers through one slot";
        const auto got = testing_support::run_dummy_requests(*rank.runner, vocab, true, testing_support::greedy_eight());
        ASSERT_EQ(got.size(), want.size()) << name;
        for (const auto& [id, out] : want)
          EXPECT_TRUE(testing_support::bit_identical(got.at(id), out)) << name << " rank " << r << " request " << id;
        EXPECT_GT(rank.ffn->stats().cache.fetches, 0u) << name << " rank " << r << ": its remote layers were fetched";
      }
    }
  }
}

// An owner that is down (never loaded here; a killed owner unloads): the
// rank's fetch of its layer waits owner_wait, then the step fails with io
// naming the owner; the ring restarts, and once the owner is loaded the
// next step runs and gives one device's logits.
TEST_P(CudaSidpFakeDevice, AnOwnerThatIsDownFailsTheStepWithIoUntilItIsBack) {
  const auto w = testing_support::load_dummy_arch("qwen3", "cuda_sidp");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  auto plan = sidp::balanced_plan(w->config.num_hidden_layers, 2);
  ASSERT_TRUE(plan.ok());
  sidp::SidpFfnOptions options;
  options.cache.owner_wait = std::chrono::milliseconds(200);
  Group g = make_group(w, *plan, {0, 1}, options, /*unloaded=*/1);
  Rank& rank0 = g.ranks[0];
  const model::StepInput step = testing_support::three_token_step(16);
  auto failed = rank0.runner->execute(step);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, ErrorCode::io) << failed.error().to_string();
  EXPECT_NE(failed.error().message.find("owner 1"), std::string::npos) << failed.error().message;
  ASSERT_TRUE(g.ranks[1].owner->load(*w, *g.weights[1]).ok());
  auto ok = rank0.runner->execute(step);
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  model::CudaRunnerOptions o = testing_support::dummy_cuda_options();
  o.cuda_graphs = false;
  auto plain = model::CudaModelRunner::create(w, o);
  ASSERT_TRUE(plain.ok());
  auto want = (*plain)->execute(step);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(ok->logits, want->logits);
  EXPECT_EQ(static_cast<int>(ok->logits.size()), vocab);
}

/// What a rank announces after its n-th engine step (1-based).
using Schedule = std::map<int, std::pair<sidp::SidpMode, std::uint64_t>>;

/// The six dummy requests on every rank at once (rank r with params[r]),
/// each on its own thread and announcing `schedule` after its own steps; a
/// rank out of work serves its peers with dummy steps (CaS) until no rank
/// has rows. The outputs by rank.
std::vector<std::map<std::uint64_t, RequestOutput>> run_lockstep(Group& g, int vocab,
                                                                 const std::vector<sampling::SamplingParams>& params,
                                                                 const Schedule& schedule) {
  const std::size_t dp = g.ranks.size();
  std::vector<std::map<std::uint64_t, RequestOutput>> out(dp);
  std::vector<std::string> errors(dp);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < dp; ++r)
    threads.emplace_back([&, r] {
      sidp::CudaSidpFfn& ffn = *g.ranks[r].ffn;
      int steps = 0;
      out[r] = testing_support::run_dummy_requests(*g.ranks[r].runner, vocab, true, params[r], [&] {
        const auto it = schedule.find(++steps);
        if (it != schedule.end()) ffn.announce(it->second.first, it->second.second);
      });
      for (;;) {
        if (ffn.mode() == sidp::SidpMode::cas) {
          auto any = ffn.dummy_step();
          if (!any) errors[r] = any.error().to_string();
          if (!any || !*any) break;
        } else if (ffn.join_pending()) {
          if (Status st = ffn.sync_mode(); !st) {
            errors[r] = st.error().to_string();
            break;
          }
        } else {
          break;
        }
      }
    });
  for (std::thread& t : threads) t.join();
  for (std::size_t r = 0; r < dp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

// CaS on CUDA ranks: the ranks step in lockstep, each layer's rows go to its
// owner, which runs one fused GEMM chain over its rows and the peer's (32
// rows in prefill: two chunks of the runner's 16) and returns the slice.
// Rank 1 stops after 5 tokens and serves rank 0 with dummy steps. From the
// start in CaS on one GPU and on two, and switching at step boundaries
// (WaS, then CaS after step 2, WaS after 5, CaS after 7 on each rank):
// every request is one plain device's, bit for bit.
TEST_P(CudaSidpFakeDevice, CasAndModeSwitchingAreBitIdenticalToOneDevice) {
  const auto w = testing_support::load_dummy_arch("qwen3", "cuda_sidp");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  auto plan = sidp::balanced_plan(w->config.num_hidden_layers, 2);
  ASSERT_TRUE(plan.ok());
  std::vector<sampling::SamplingParams> params(2, testing_support::greedy_eight());
  params[1].max_tokens = 5;
  std::vector<std::map<std::uint64_t, RequestOutput>> want;
  {
    model::CudaRunnerOptions o = testing_support::dummy_cuda_options();
    o.cuda_graphs = false;
    auto plain = model::CudaModelRunner::create(w, o);
    ASSERT_TRUE(plain.ok()) << plain.error().to_string();
    for (const auto& p : params) want.push_back(testing_support::run_dummy_requests(**plain, vocab, true, p));
  }
  struct Case {
    std::string name;
    std::vector<int> gpus;
    sidp::SidpMode initial;
    Schedule schedule;
  };
  const Schedule switching = {{2, {sidp::SidpMode::cas, 1}}, {5, {sidp::SidpMode::was, 2}},
                              {7, {sidp::SidpMode::cas, 3}}};
  for (const Case& k : {Case{"CaS on cuda:0x2", {0, 0}, sidp::SidpMode::cas, {}},
                        Case{"CaS on cuda:0,1", {0, 1}, sidp::SidpMode::cas, {}},
                        Case{"switching on cuda:0,1", {0, 1}, sidp::SidpMode::was, switching}}) {
    sidp::SidpFfnOptions options;
    options.initial_mode = k.initial;
    Group g = make_group(w, *plan, k.gpus, options, -1, /*was_only=*/false);
    ASSERT_EQ(g.ranks.size(), 2u);
    const auto got = run_lockstep(g, vocab, params, k.schedule);
    for (int r = 0; r < 2; ++r) {
      const auto i = static_cast<std::size_t>(r);
      ASSERT_EQ(got[i].size(), want[i].size()) << k.name << " rank " << r;
      for (const auto& [id, ref] : want[i])
        EXPECT_TRUE(testing_support::bit_identical(got[i].at(id), ref)) << k.name << " rank " << r << " request " << id;
      const sidp::SidpFfnStats st = g.ranks[i].ffn->stats();
      EXPECT_GT(st.cas_fused_gemms, 0u) << k.name << " rank " << r << " served its layers";
      EXPECT_GT(st.cas_rows_sent, 0u) << k.name << " rank " << r << " sent rows to the other owner";
      if (k.schedule.empty()) {
        EXPECT_EQ(st.was_steps, 0u) << k.name;
        EXPECT_EQ(st.switches_to_cas + st.switches_to_was, 0u) << k.name;
      } else {
        EXPECT_EQ(st.switches_to_cas, 2u) << k.name << " rank " << r;
        EXPECT_EQ(st.switches_to_was, 1u) << k.name << " rank " << r;
        EXPECT_EQ(st.applied_epoch, 3u) << k.name << " rank " << r;
        EXPECT_GE(st.was_steps, 4u) << k.name << " rank " << r;
      }
    }
    EXPECT_GT(g.ranks[1].ffn->stats().dummy_steps, 0u) << k.name << ": the shorter rank served with dummy steps";
  }
}

}  // namespace model_cuda_cuda_sidp_fake_device_test
}  // namespace shardline::engine
