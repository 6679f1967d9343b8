// SiDP's WaS on CUDA ranks (model/cuda/sidp, seed 002 §4.1-4.2; issue 41
// item 6) on the FAKE CUDA device: each data-parallel rank is a real
// CudaModelRunner holding no FFN weights of its own; its CudaLayerOwner
// holds the layers it owns in its GPU's memory, exposed on an in-process
// device communicator; every other layer comes into cache slots in its GPU's
// memory through WeightCache's housekeeper, whose gets are device copies
// (across GPUs: peer copies). Every rank's greedy run is one plain device's,
// bit for bit (the same GEMMs on the same bytes), on ranks sharing a GPU and
// on a GPU each, with the balanced plan and a plan whose remote layers
// outnumber the slots (the ring refills a slot a layer after its GEMMs),
// on Qwen3 and Llama 3. The rank holds no FFN weights besides its own and
// its slots. An owner that is down fails a step with io after owner_wait;
// once it is back, the next step runs. Both timings of the fake.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/inproc.hpp"
#include "engine/llm_engine.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/cuda/inproc_device_comm.hpp"
#include "model/cuda/sidp/cuda_layer_owner.hpp"
#include "model/cuda/sidp/cuda_was.hpp"
#include "model/sidp/ownership.hpp"
#include "tests/model/cuda/dummy_archs.hpp"
#include "tests/model/cuda/fake_device.hpp"
#include "tests/support/engine_runs.hpp"

namespace shardline::engine {
namespace model_cuda_cuda_was_fake_device_test {

namespace fc = testing_support::fake_cuda;
namespace sidp = model::sidp;

class CudaWasFakeDevice : public testing_support::FakeDeviceTimingTest {
 protected:
  void SetUp() override {
    FakeDeviceTimingTest::SetUp();
    fc::set_device_count(2);
  }
};

INSTANTIATE_TEST_SUITE_P(Timing, CudaWasFakeDevice, testing_support::fake_timings(),
                         testing_support::fake_timing_name);

struct Rank {
  std::shared_ptr<sidp::CudaLayerOwner> owner;
  std::shared_ptr<sidp::CudaWas> was;
  std::unique_ptr<model::CudaModelRunner> runner;
};

/// dp WaS ranks (rank r on gpus[r]); members in destruction order: the
/// runners first, then the caches, the owners, the communicators.
struct Group {
  std::shared_ptr<comm::InProcGroup> weights_group;
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  std::vector<Rank> ranks;
};

/// The group, its owners loaded unless `unloaded` names one.
Group make_group(const std::shared_ptr<const model::ModelWeights>& w, const sidp::OwnershipPlan& plan,
                 const std::vector<int>& gpus, sidp::WeightCacheOptions cache, int unloaded = -1) {
  Group g;
  g.weights_group = comm::InProcGroup::create(plan.dp).value();
  for (int r = 0; r < plan.dp; ++r) {
    auto c = model::InProcDeviceCommunicator::create(g.weights_group->communicator(r).value(),
                                                     gpus[static_cast<std::size_t>(r)]);
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    g.comms.push_back(std::move(c).value());
  }
  for (int r = 0; r < plan.dp; ++r) {
    Rank k;
    auto owner = sidp::CudaLayerOwner::create(plan, r, gpus[static_cast<std::size_t>(r)], w->config, DType::f32);
    EXPECT_TRUE(owner.ok()) << owner.error().to_string();
    k.owner = std::move(owner).value();
    if (r != unloaded) EXPECT_TRUE(k.owner->load(*w, *g.comms[static_cast<std::size_t>(r)]).ok());
    auto was = sidp::CudaWas::create(plan, k.owner, g.comms[static_cast<std::size_t>(r)].get(), cache, true);
    EXPECT_TRUE(was.ok()) << was.error().to_string();
    k.was = std::move(was).value();
    model::CudaRunnerOptions o = testing_support::dummy_cuda_options();
    o.device_index = gpus[static_cast<std::size_t>(r)];
    auto runner = model::CudaModelRunner::create(w, o, {}, {}, k.was);
    EXPECT_TRUE(runner.ok()) << runner.error().to_string();
    k.runner = std::move(runner).value();
    g.ranks.push_back(std::move(k));
  }
  return g;
}

TEST_P(CudaWasFakeDevice, EveryRankIsBitIdenticalToOneDeviceHoldingOnlyItsOwnFfnLayersAndItsSlots) {
  struct Case {
    std::string arch;
    std::string plan;  // "" = balanced
    int slots;
  };
  // Llama 3's "0,1,1": rank 0 owns layer 0 and fetches 1 and 2 through one
  // slot, refilled between them.
  for (const Case& k : {Case{"qwen3", "", 1}, Case{"llama3", "", 2}, Case{"llama3", "0,1,1", 1}}) {
    const auto w = testing_support::load_dummy_arch(k.arch, "cuda_was");
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
      sidp::WeightCacheOptions cache;
      cache.cache_slots = k.slots;
      Group g = make_group(w, *plan, gpus, cache);
      ASSERT_EQ(g.ranks.size(), 2u);
      for (int r = 0; r < 2; ++r) {
        Rank& rank = g.ranks[static_cast<std::size_t>(r)];
        const auto owned = plan->owned_layers(r).size();
        const auto remote = plan->remote_layers(r).size();
        EXPECT_EQ(rank.runner->weight_bytes() + w->config.num_hidden_layers * (layout.gate_up_bytes + layout.down_bytes),
                  plain_bytes)
            << name << ": the runner holds no FFN weights";
        EXPECT_EQ(rank.owner->bytes(), owned * layout.bytes) << name;
        EXPECT_EQ(rank.was->ffn_weight_bytes(), (owned + rank.was->cache_slots()) * layout.bytes) << name;
        if (k.plan == "0,1,1" && r == 0)
          EXPECT_EQ(rank.was->cache_slots(), 1) << name << ": " << remote << " remote layers through one slot";
        const auto got = testing_support::run_dummy_requests(*rank.runner, vocab, true, testing_support::greedy_eight());
        ASSERT_EQ(got.size(), want.size()) << name;
        for (const auto& [id, out] : want)
          EXPECT_TRUE(testing_support::bit_identical(got.at(id), out)) << name << " rank " << r << " request " << id;
        EXPECT_GT(rank.was->cache_stats().fetches, 0u) << name << " rank " << r << ": its remote layers were fetched";
      }
    }
  }
}

// An owner that is down (never loaded here; a killed owner unloads): the
// rank's fetch of its layer waits owner_wait, then the step fails with io
// naming the owner; the ring restarts, and once the owner is loaded the
// next step runs and gives one device's logits.
TEST_P(CudaWasFakeDevice, AnOwnerThatIsDownFailsTheStepWithIoUntilItIsBack) {
  const auto w = testing_support::load_dummy_arch("qwen3", "cuda_was");
  ASSERT_NE(w, nullptr);
  const int vocab = w->config.vocab_size;
  auto plan = sidp::balanced_plan(w->config.num_hidden_layers, 2);
  ASSERT_TRUE(plan.ok());
  sidp::WeightCacheOptions cache;
  cache.owner_wait = std::chrono::milliseconds(200);
  Group g = make_group(w, *plan, {0, 1}, cache, /*unloaded=*/1);
  Rank& rank0 = g.ranks[0];
  const model::StepInput step = testing_support::three_token_step(16);
  auto failed = rank0.runner->execute(step);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, ErrorCode::io) << failed.error().to_string();
  EXPECT_NE(failed.error().message.find("owner 1"), std::string::npos) << failed.error().message;
  ASSERT_TRUE(g.ranks[1].owner->load(*w, *g.comms[1]).ok());
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

}  // namespace model_cuda_cuda_was_fake_device_test
}  // namespace shardline::engine
