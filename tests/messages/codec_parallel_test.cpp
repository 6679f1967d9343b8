// The parallel-config, token-budget and Seesaw fields of the messages: they round
// trip, a sender that does not know them (an older build) reads as the
// defaults, and bad values are refused with invalid_argument naming the field.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "messages/codec.hpp"
#include "messages/common.capnp.h"
#include "messages/orchestrator.capnp.h"
#include "messages/worker.capnp.h"

namespace shardline::messages {

using worker::BatchRequest;

namespace messages_codec_parallel_test {

std::string flat(capnp::MessageBuilder& mb) {
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

template <class R>
void expect_error(const R& r, ErrorCode code, const std::string& needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, code) << r.error().to_string();
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().to_string();
}

TEST(MessagesCodecParallel, FieldsRoundTrip) {
  SubmitJob sj{"/m", {"/in.jsonl"}, "/out.jsonl", engine::ParallelConfig{2, 2, 1, 3}, "throttle"};
  auto s = decode_orchestrator(encode(OrchestratorMsg{sj}));
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ(std::get<SubmitJob>(*s), sj);

  WorkerHello hello{"n/cpu:0-3", "cpu", 64, engine::ParallelConfig{2, 1, 2, 1}};
  auto h = decode_orchestrator(encode(OrchestratorMsg{hello}));
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  EXPECT_EQ(std::get<WorkerHello>(*h), hello);

  JobProgress p;
  p.job_id = 3;
  p.parallel = "tp=2,pp=1,sp=1,dp=2";
  p.token_budget = "throttle";
  p.paused = "disk_full: output: write /o.jsonl: No space left on device";
  p.cached_tokens = 1234;
  p.prefix_ordered = true;
  p.prefix_ideal_hit_rate = 0.875;
  ActorInfo a{"n/cpu:0-1", "worker", "n", "idle", "tp=2,pp=1,sp=1"};
  auto list = decode_orchestrator_reply(encode(OrchestratorReply{JobStatusList{{p}}}));
  ASSERT_TRUE(list.ok()) << list.error().to_string();
  EXPECT_EQ(std::get<JobStatusList>(*list).jobs.at(0), p);
  auto actors = decode_orchestrator_reply(encode(OrchestratorReply{ActorList{{a}}}));
  ASSERT_TRUE(actors.ok()) << actors.error().to_string();
  EXPECT_EQ(std::get<ActorList>(*actors).actors.at(0), a);

  BatchRequest r;
  r.job_id = 1;
  r.token_budget = "throttle";
  auto w = decode_worker(encode(WorkerMsg{AssignWork{{r, BatchRequest{}}}}));
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  const auto& requests = std::get<AssignWork>(*w).requests;
  EXPECT_EQ(requests.at(0).token_budget, "throttle");
  EXPECT_EQ(requests.at(1).token_budget, "");
}

TEST(MessagesCodecParallel, SendersWithoutTheFieldsReadAsDefaults) {
  {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::OrchestratorMessage>();
    root.setVersion(kSchemaVersion);
    auto sj = root.initSubmitJob();
    sj.setModelDir("/m");
    sj.initInputs(1).set(0, "/in.jsonl");
    sj.setOutput("/out.jsonl");
    auto d = decode_orchestrator(flat(mb));
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    EXPECT_FALSE(std::get<SubmitJob>(*d).parallel.has_value());
    EXPECT_EQ(std::get<SubmitJob>(*d).token_budget, "");
  }
  {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::OrchestratorMessage>();
    root.setVersion(kSchemaVersion);
    auto h = root.initWorkerHello();
    h.setWorkerName("old/cpu:0");
    h.setDevice("cpu");
    h.setMaxBatch(8);
    auto d = decode_orchestrator(flat(mb));
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    EXPECT_EQ(std::get<WorkerHello>(*d).parallel, engine::ParallelConfig{});  // a single device
  }
}

TEST(MessagesCodecParallel, BadValuesAreRefused) {
  {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::OrchestratorMessage>();
    root.setVersion(kSchemaVersion);
    root.initSubmitJob().setParallel("tp=0");
    expect_error(decode_orchestrator(flat(mb)), ErrorCode::invalid_argument,
                 "orchestrator message submitJob: parallel: --parallel 'tp=0'");
  }
  {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::OrchestratorMessage>();
    root.setVersion(kSchemaVersion);
    root.initSubmitJob().setTokenBudget("lavish");
    expect_error(decode_orchestrator(flat(mb)), ErrorCode::invalid_argument,
                 "submitJob: tokenBudget: unknown token budget policy 'lavish'");
  }
  {
    WorkerHello hello{"n/cpu:0-3", "cpu", 64, engine::ParallelConfig{2, 1, 1, 2}};
    expect_error(decode_orchestrator(encode(OrchestratorMsg{hello})), ErrorCode::invalid_argument,
                 "workerHello: parallel: a worker is one engine group, dp must be 1, got 2");
  }
  {
    BatchRequest good;
    BatchRequest bad;
    bad.token_budget = "fast";
    expect_error(decode_worker(encode(WorkerMsg{AssignWork{{good, bad}}})), ErrorCode::invalid_argument,
                 "requests[1].tokenBudget: unknown token budget policy 'fast'");
  }
  {
    WorkerStatus s;
    s.worker_name = "n/cpu:0-1";
    s.seesaw_phase = "decode";
    s.seesaw_transitions = 7;
    auto good = decode_worker_reply(encode(WorkerReply{s}));
    ASSERT_TRUE(good.ok()) << good.error().to_string();
    EXPECT_EQ(std::get<WorkerStatus>(*good), s);
    s.seesaw_phase = "mixed";
    expect_error(decode_worker_reply(encode(WorkerReply{s})), ErrorCode::invalid_argument,
                 "workerStatus.seesawPhase: a Seesaw phase is \"prefill\" or \"decode\" (or empty), got \"mixed\"");
  }
}

}  // namespace
}  // namespace shardline::messages
