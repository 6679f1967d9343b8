// The SiDP messages (seed 002): a worker's group in its hello, the layer
// owners' registration, the orchestrator's mode directive and the groups'
// switching state in job status. Round trips are in codec_test (samples.hpp);
// here the fields the codec refuses, each with the error naming the field.
#include <gtest/gtest.h>

#include "messages/codec.hpp"
#include "tests/messages/samples.hpp"

namespace shardline::messages {
namespace messages_codec_sidp_test {

using testing::sample_sidp_group;
using testing::sample_status;

void expect_refused(const Result<WorkerMsg>& d, const std::string& what) {
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(d.error().message.find(what), std::string::npos) << d.error().message;
}

TEST(MessagesCodecSidp, SwitchRoundTripsAndRefusesBadModeOrEpoch) {
  auto ok = decode_worker(encode(WorkerMsg{SidpSwitch{"n/sidp", "cas", 7}}));
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  EXPECT_EQ(std::get<SidpSwitch>(*ok), (SidpSwitch{"n/sidp", "cas", 7}));
  expect_refused(decode_worker(encode(WorkerMsg{SidpSwitch{"n/sidp", "CaS", 7}})),
                 "worker message sidpSwitch: mode: a SiDP mode is \"was\" or \"cas\", got \"CaS\"");
  expect_refused(decode_worker(encode(WorkerMsg{SidpSwitch{"n/sidp", "", 7}})), "mode: a SiDP mode");
  expect_refused(decode_worker(encode(WorkerMsg{SidpSwitch{"n/sidp", "was", 0}})), "epoch: must be >= 1");
}

TEST(MessagesCodecSidp, HelloWithABadRankIsRefused) {
  WorkerHello hello{"n/cpu:1", "cpu", 64, engine::ParallelConfig{}, {}, "n/sidp", 2, 2};
  auto d = decode_orchestrator(encode(OrchestratorMsg{hello}));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("workerHello: sidpRank: a SiDP group has >= 2 ranks and rank < ranks, got rank 2 of 2"),
            std::string::npos)
      << d.error().message;
  hello.sidp_rank = 0;
  hello.sidp_ranks = 1;
  EXPECT_FALSE(decode_orchestrator(encode(OrchestratorMsg{hello})).ok());
  hello.sidp_ranks = 2;
  auto good = decode_orchestrator(encode(OrchestratorMsg{hello}));
  ASSERT_TRUE(good.ok()) << good.error().to_string();
  EXPECT_EQ(std::get<WorkerHello>(*good), hello);
  // Not SiDP: the rank fields are not looked at.
  hello.sidp_group.clear();
  hello.sidp_ranks = 0;
  hello.sidp_rank = 5;
  EXPECT_TRUE(decode_orchestrator(encode(OrchestratorMsg{hello})).ok());
}

TEST(MessagesCodecSidp, StatusModesAreChecked) {
  WorkerStatus s = sample_status();
  s.sidp_mode = "";
  EXPECT_TRUE(decode_worker_reply(encode(WorkerReply{s})).ok());
  s.sidp_mode = "both";
  auto d = decode_worker_reply(encode(WorkerReply{s}));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("workerStatus.sidpMode: a SiDP mode is \"was\" or \"cas\" (or empty), got \"both\""),
            std::string::npos)
      << d.error().message;

  SidpGroupStatus g = sample_sidp_group();
  g.switches[1].to_mode = "WAS";
  auto list = decode_orchestrator_reply(encode(OrchestratorReply{JobStatusList{{}, {sample_sidp_group(), g}}}));
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.error().message.find("sidpGroups[1].switches[1].toMode"), std::string::npos) << list.error().message;
}

TEST(MessagesCodecSidp, SubmitJobWeightSharingIsNoneSidpOrNotGiven) {
  for (const std::string ws : {"", "none", "sidp"}) {
    SubmitJob sj{"/m", {"/in"}, "/out", std::nullopt, "", ws};
    auto d = decode_orchestrator(encode(OrchestratorMsg{sj}));
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    EXPECT_EQ(std::get<SubmitJob>(*d), sj);
  }
  SubmitJob bad{"/m", {"/in"}, "/out", std::nullopt, "", "SiDP"};
  auto d = decode_orchestrator(encode(OrchestratorMsg{bad}));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("submitJob: weightSharing: \"none\" or \"sidp\", got \"SiDP\""),
            std::string::npos)
      << d.error().message;
}

}  // namespace
}  // namespace shardline::messages
