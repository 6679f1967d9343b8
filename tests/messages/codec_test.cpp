// Round trips of every message kind, and the decoder's frame / version /
// limit / field checks on hand-made inputs.

#include "messages/codec.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

#include "messages/kvstore.capnp.h"
#include "messages/orchestrator.capnp.h"
#include "messages/worker.capnp.h"
#include "samples.hpp"

namespace shardline::messages {

using worker::BatchRequest;
using worker::BatchResult;

namespace {

using namespace shardline::messages::testing;  // NOLINT

std::string flat(capnp::MessageBuilder& mb) {
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

void expect_error(const Error& e, ErrorCode code, const std::string& needle) {
  EXPECT_EQ(e.code, code) << e.to_string();
  EXPECT_NE(e.message.find(needle), std::string::npos) << e.to_string();
}

template <class R>
void expect_error(const R& r, ErrorCode code, const std::string& needle) {
  ASSERT_FALSE(r.ok());
  expect_error(r.error(), code, needle);
}

void put_le32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

// ============================================================================
// round trips
// ============================================================================

TEST(MessagesCodec, OrchestratorMessagesRoundTrip) {
  const auto msgs = sample_orchestrator_msgs();
  for (const auto& m : msgs) {
    SCOPED_TRACE(kind_name(m.kind));
    const std::string bytes = encode(m);
    EXPECT_EQ(bytes.size() % 8, 0u);
    auto d = decode_orchestrator(bytes);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    ASSERT_EQ(d->kind, m.kind);
    using K = OrchestratorMsg::Kind;
    switch (m.kind) {
      case K::submit_job: EXPECT_EQ(d->submit_job, m.submit_job); break;
      case K::job_status_query: EXPECT_EQ(d->job_status_query, m.job_status_query); break;
      case K::kill_actor: EXPECT_EQ(d->kill_actor, m.kill_actor); break;
      case K::worker_hello: EXPECT_EQ(d->worker_hello, m.worker_hello); break;
      case K::worker_results: {
        EXPECT_EQ(d->worker_results.worker_name, m.worker_results.worker_name);
        ASSERT_EQ(d->worker_results.results.size(), m.worker_results.results.size());
        for (std::size_t i = 0; i < m.worker_results.results.size(); ++i)
          expect_result_eq(d->worker_results.results[i], m.worker_results.results[i]);
        break;
      }
      case K::worker_heartbeat: EXPECT_EQ(d->worker_heartbeat, m.worker_heartbeat); break;
      case K::actor_list_query:
      case K::shutdown: break;
    }
    // Encoding is deterministic: the decoded value re-encodes to the same bytes.
    EXPECT_EQ(encode(d.value()), bytes);
  }
}

TEST(MessagesCodec, OrchestratorRepliesRoundTrip) {
  for (const auto& m : sample_orchestrator_replies()) {
    SCOPED_TRACE(kind_name(m.kind));
    const std::string bytes = encode(m);
    auto d = decode_orchestrator_reply(bytes);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    ASSERT_EQ(d->kind, m.kind);
    using K = OrchestratorReply::Kind;
    switch (m.kind) {
      case K::job_submitted: EXPECT_EQ(d->job_submitted, m.job_submitted); break;
      case K::job_status_list: EXPECT_EQ(d->job_status_list, m.job_status_list); break;
      case K::actor_list: EXPECT_EQ(d->actor_list, m.actor_list); break;
      case K::error:
        EXPECT_EQ(d->error.code, m.error.code);
        EXPECT_EQ(d->error.message, m.error.message);
        break;
      case K::ack: break;
    }
    EXPECT_EQ(encode(d.value()), bytes);
  }
}

TEST(MessagesCodec, WorkerMessagesRoundTrip) {
  for (const auto& m : sample_worker_msgs()) {
    SCOPED_TRACE(kind_name(m.kind));
    const std::string bytes = encode(m);
    auto d = decode_worker(bytes);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    ASSERT_EQ(d->kind, m.kind);
    using K = WorkerMsg::Kind;
    switch (m.kind) {
      case K::assign_work:
        ASSERT_EQ(d->assign_work.requests.size(), m.assign_work.requests.size());
        for (std::size_t i = 0; i < m.assign_work.requests.size(); ++i)
          expect_request_eq(d->assign_work.requests[i], m.assign_work.requests[i]);
        break;
      case K::cancel_job: EXPECT_EQ(d->cancel_job, m.cancel_job); break;
      case K::status_query:
      case K::shutdown: break;
    }
    EXPECT_EQ(encode(d.value()), bytes);
  }
}

TEST(MessagesCodec, WorkerRepliesRoundTrip) {
  for (const auto& m : sample_worker_replies()) {
    SCOPED_TRACE(kind_name(m.kind));
    const std::string bytes = encode(m);
    auto d = decode_worker_reply(bytes);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    ASSERT_EQ(d->kind, m.kind);
    if (m.kind == WorkerReply::Kind::status) {
      EXPECT_EQ(d->status, m.status);
    }
    if (m.kind == WorkerReply::Kind::error) {
      EXPECT_EQ(d->error.code, m.error.code);
      EXPECT_EQ(d->error.message, m.error.message);
    }
    EXPECT_EQ(encode(d.value()), bytes);
  }
}

TEST(MessagesCodec, KvStoreMessagesRoundTrip) {
  for (const auto& m : sample_kvstore_msgs()) {
    SCOPED_TRACE(kind_name(m.kind));
    const std::string bytes = encode(m);
    auto d = decode_kvstore(bytes);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    ASSERT_EQ(d->kind, m.kind);
    EXPECT_EQ(d->put_blocks, m.put_blocks);
    EXPECT_EQ(d->get_blocks, m.get_blocks);
    EXPECT_EQ(d->drop_blocks, m.drop_blocks);
    EXPECT_EQ(encode(d.value()), bytes);
  }
}

TEST(MessagesCodec, KvStoreRepliesRoundTrip) {
  for (const auto& m : sample_kvstore_replies()) {
    SCOPED_TRACE(kind_name(m.kind));
    const std::string bytes = encode(m);
    auto d = decode_kvstore_reply(bytes);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    ASSERT_EQ(d->kind, m.kind);
    EXPECT_EQ(d->blocks_data, m.blocks_data);
    EXPECT_EQ(d->stats, m.stats);
    EXPECT_EQ(d->error.code, m.error.code);
    EXPECT_EQ(d->error.message, m.error.message);
    EXPECT_EQ(encode(d.value()), bytes);
  }
}

TEST(MessagesCodec, EveryErrorCodeRoundTrips) {
  for (int c = 0; c <= static_cast<int>(ErrorCode::internal); ++c) {
    const Error e{static_cast<ErrorCode>(c), std::string("failure #") + std::to_string(c)};
    auto d = decode_worker_reply(encode(WorkerReply::of(e)));
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    EXPECT_EQ(d->error.code, e.code);
    EXPECT_EQ(d->error.message, e.message);
  }
}

TEST(MessagesCodec, EmptyStringsAndDefaultsRoundTrip) {
  BatchRequest r;  // all defaults: empty prompt, default sampling params
  auto d = decode_worker(encode(WorkerMsg::of(AssignWork{{r}})));
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  ASSERT_EQ(d->assign_work.requests.size(), 1u);
  expect_request_eq(d->assign_work.requests[0], r);

  auto s = decode_orchestrator(encode(OrchestratorMsg::of(SubmitJob{})));
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ(s->submit_job, SubmitJob{});
}

TEST(MessagesCodec, LargeMessagesSpanSegmentsAndRoundTrip) {
  // 8 MiB of KV data and 20k results: both far beyond the first segment.
  const std::string blob = binary_blob(8u << 20, 9);
  auto d = decode_kvstore(encode(KvStoreMsg::of(PutBlocks{"big", blob})));
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(d->put_blocks.data, blob);

  WorkerResults wr{"w", {}};
  for (int i = 0; i < 20000; ++i) wr.results.push_back(sample_result(i));
  auto r = decode_orchestrator(encode(OrchestratorMsg::of(wr)));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->worker_results.results.size(), wr.results.size());
  expect_result_eq(r->worker_results.results[19999], wr.results[19999]);
}

TEST(MessagesCodec, MultiSegmentMessagesFromOtherBuildersDecode) {
  // A builder with tiny fixed-size segments yields many segments and far pointers.
  capnp::MallocMessageBuilder mb(16, capnp::AllocationStrategy::FIXED_SIZE);
  auto root = mb.initRoot<wire::OrchestratorMessage>();
  root.setVersion(kSchemaVersion);
  auto sj = root.initSubmitJob();
  sj.setModelDir("/models/m");
  auto inputs = sj.initInputs(40);
  for (unsigned i = 0; i < 40; ++i) inputs.set(i, ("/in/shard-" + std::to_string(i) + ".jsonl").c_str());
  sj.setOutput("/out.jsonl");
  ASSERT_GT(mb.getSegmentsForOutput().size(), 3u);
  const std::string bytes = flat(mb);
  auto d = decode_orchestrator(bytes);
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  ASSERT_EQ(d->submit_job.inputs.size(), 40u);
  EXPECT_EQ(d->submit_job.inputs[39], "/in/shard-39.jsonl");

  // Every prefix of a multi-segment message is rejected, never a crash.
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_orchestrator(std::string_view(bytes).substr(0, n)).ok()) << n;
}

TEST(MessagesCodec, KindNames) {
  EXPECT_STREQ(kind_name(OrchestratorMsg::Kind::submit_job), "submitJob");
  EXPECT_STREQ(kind_name(OrchestratorReply::Kind::error), "errorReply");
  EXPECT_STREQ(kind_name(WorkerMsg::Kind::assign_work), "assignWork");
  EXPECT_STREQ(kind_name(WorkerReply::Kind::status), "status");
  EXPECT_STREQ(kind_name(KvStoreMsg::Kind::put_blocks), "putBlocks");
  EXPECT_STREQ(kind_name(KvStoreReply::Kind::stats), "stats");
}

// ============================================================================
// version
// ============================================================================

TEST(MessagesCodec, RejectsOtherSchemaVersions) {
  for (std::uint16_t v : {std::uint16_t{0}, std::uint16_t{kSchemaVersion + 1}, std::uint16_t{0xFFFF}}) {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::OrchestratorMessage>();
    root.setVersion(v);
    root.initJobStatusQuery().setJobId(3);
    const std::string expected =
        "schema version " + std::to_string(v) + ", expected " + std::to_string(kSchemaVersion);
    auto d = decode_orchestrator(flat(mb));
    expect_error(d, ErrorCode::invalid_argument, expected);
    expect_error(d, ErrorCode::invalid_argument, "orchestrator message");
  }
  {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::WorkerMessage>();
    root.setVersion(kSchemaVersion + 1);
    root.setShutdown();
    expect_error(decode_worker(flat(mb)), ErrorCode::invalid_argument, "worker message: schema version 2");
  }
  {
    capnp::MallocMessageBuilder mb;
    auto root = mb.initRoot<wire::KvStoreReply>();
    root.setVersion(7);
    root.setAck();
    expect_error(decode_kvstore_reply(flat(mb)), ErrorCode::invalid_argument,
                 "kvstore reply: schema version 7, expected 1");
  }
}

// ============================================================================
// frame
// ============================================================================

TEST(MessagesCodec, RejectsEmptyAndUnalignedSizes) {
  expect_error(decode_orchestrator(""), ErrorCode::corrupt, "orchestrator message: empty message");
  expect_error(decode_worker_reply(""), ErrorCode::corrupt, "worker reply: empty");
  std::string bytes = encode(KvStoreMsg::of(GetBlocks{"k"}));
  expect_error(decode_kvstore(bytes.substr(0, bytes.size() - 3)), ErrorCode::corrupt,
               "not a multiple of 8");
  expect_error(decode_kvstore(bytes + "x"), ErrorCode::corrupt, "not a multiple of 8");
}

TEST(MessagesCodec, DecodesFromUnalignedMemory) {
  const std::string bytes = encode(KvStoreMsg::of(PutBlocks{"key", binary_blob(100, 3)}));
  std::string shifted = "x" + bytes;  // data() + 1 is misaligned
  auto d = decode_kvstore(std::string_view(shifted).substr(1));
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(d->put_blocks.data, binary_blob(100, 3));
}

TEST(MessagesCodec, RejectsOversizedMessages) {
  std::string huge(kMaxMessageBytes + 8, '\0');
  expect_error(decode_kvstore(huge), ErrorCode::invalid_argument, "exceeds the limit");
}

TEST(MessagesCodec, RejectsTrailingBytes) {
  const std::string bytes = encode(WorkerMsg::of(CancelJob{5}));
  expect_error(decode_worker(bytes + std::string(8, '\0')), ErrorCode::corrupt, "segment table declares");
}

TEST(MessagesCodec, RejectsLyingSegmentTables) {
  const std::string good = encode(OrchestratorMsg::of(KillActor{"a"}));
  ASSERT_TRUE(decode_orchestrator(good).ok());
  {  // huge segment size
    std::string b = good;
    put_le32(b, 4, 0xFFFFFFFFu);
    expect_error(decode_orchestrator(b), ErrorCode::corrupt, "segment table declares");
  }
  {  // segment size one word too many / too few
    std::string b = good;
    const std::uint32_t words = static_cast<std::uint32_t>(good.size() / 8 - 1);
    put_le32(b, 4, words + 1);
    expect_error(decode_orchestrator(b), ErrorCode::corrupt, "segment table declares");
    put_le32(b, 4, words - 1);
    expect_error(decode_orchestrator(b), ErrorCode::corrupt, "segment table declares");
  }
  {  // absurd segment count (u32 max -> 2^32 segments)
    std::string b = good;
    put_le32(b, 0, 0xFFFFFFFFu);
    expect_error(decode_orchestrator(b), ErrorCode::corrupt, "segments");
    put_le32(b, 0, 1000);
    expect_error(decode_orchestrator(b), ErrorCode::corrupt, "segments");
    put_le32(b, 0, 200);  // under the limit, but the table is larger than the message
    expect_error(decode_orchestrator(b), ErrorCode::corrupt, "segment table");
  }
  {  // zero-length segment: no root pointer
    std::string b(8, '\0');
    expect_error(decode_orchestrator(b), ErrorCode::corrupt, "orchestrator message");
  }
}

// A hand-made WorkerMessage whose assignWork.requests claims 2^28 zero-sized
// BatchRequests in 5 words: without the traversal limit this would allocate
// ~40 GB of BatchRequest structs.
TEST(MessagesCodec, RejectsZeroSizedStructListAmplification) {
  auto word = [](std::uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
    return s;
  };
  const std::uint64_t elements = std::uint64_t{1} << 28;
  std::string b;
  b += word(std::uint64_t{5} << 32);                        // 1 segment of 5 words
  b += word((std::uint64_t{1} << 48) | (std::uint64_t{1} << 32));  // root: struct, 1 data word, 1 ptr
  b += word(kSchemaVersion);                               // version, which = assignWork (0)
  b += word(std::uint64_t{1} << 48);                       // -> AssignWork: 0 data, 1 ptr
  b += word(1 | (std::uint64_t{7} << 32));                 // -> list, composite, 0 content words
  b += word(elements << 2);                                // tag: `elements` structs of 0 words
  auto d = decode_worker(b);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(d.error().code == ErrorCode::corrupt || d.error().code == ErrorCode::invalid_argument)
      << d.error().to_string();
  EXPECT_NE(d.error().message.find("worker message assignWork"), std::string::npos)
      << d.error().to_string();

  // The same frame with 2 elements is a valid message of two default requests.
  std::string ok = b.substr(0, b.size() - 8) + word(std::uint64_t{2} << 2);
  auto d2 = decode_worker(ok);
  ASSERT_TRUE(d2.ok()) << d2.error().to_string();
  EXPECT_EQ(d2->assign_work.requests.size(), 2u);
  EXPECT_EQ(d2->assign_work.requests[0].params.max_tokens, 16);  // schema default
}

TEST(MessagesCodec, RejectsUnknownUnionMembers) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::OrchestratorMessage>();
  root.setVersion(kSchemaVersion);
  root.setShutdown();
  std::string b = flat(mb);
  // The discriminant is the second u16 of the root's data section (word 2 of the frame).
  ASSERT_EQ(static_cast<unsigned char>(b[16 + 2]), static_cast<unsigned>(wire::OrchestratorMessage::SHUTDOWN));
  b[16 + 2] = 99;
  expect_error(decode_orchestrator(b), ErrorCode::corrupt, "unknown message kind");
}

TEST(MessagesCodec, OutOfBoundsPointersNameTheMessageKind) {
  std::string b = encode(OrchestratorMsg::of(KillActor{"some-actor"}));
  // Frame words: table, root pointer, root data, pointer to KillActor, KillActor's
  // text pointer (bytes 32..39; the high half is element size 2 (byte) | count << 3).
  ASSERT_EQ(static_cast<unsigned char>(b[36]) & 7u, 2u);
  put_le32(b, 36, (0x0FFFFFFFu << 3) | 2u);  // the text claims ~268M bytes
  auto d = decode_orchestrator(b);
  ASSERT_FALSE(d.ok());
  expect_error(d, ErrorCode::corrupt, "orchestrator message killActor: ");
  expect_error(d, ErrorCode::corrupt, "out-of-bounds");
  EXPECT_EQ(d.error().message.find("expected "), std::string::npos) << d.error().message;
}

// ============================================================================
// field checks
// ============================================================================

TEST(MessagesCodec, RejectsInvalidSamplingParams) {
  BatchRequest r = sample_request(0);
  r.params.max_tokens = 0;
  auto d = decode_worker(encode(WorkerMsg::of(AssignWork{{sample_request(1), r}})));
  expect_error(d, ErrorCode::invalid_argument, "worker message assignWork: requests[1].params");
  expect_error(d, ErrorCode::invalid_argument, "max_tokens");

  r = sample_request(0);
  r.params.top_p = std::numeric_limits<float>::quiet_NaN();
  expect_error(decode_worker(encode(WorkerMsg::of(AssignWork{{r}}))), ErrorCode::invalid_argument, "top_p");

  r = sample_request(0);
  r.n = 0;
  expect_error(decode_worker(encode(WorkerMsg::of(AssignWork{{r}}))), ErrorCode::invalid_argument,
               "requests[0].n must be >= 1");

  r = sample_request(1);
  r.prompt_token_ids[2] = -5;
  expect_error(decode_worker(encode(WorkerMsg::of(AssignWork{{r}}))), ErrorCode::invalid_argument,
               "requests[0].promptTokenIds[2]");
}

TEST(MessagesCodec, RejectsInvalidResults) {
  BatchResult r = sample_result(1);
  r.completion_tokens = -1;
  expect_error(decode_orchestrator(encode(OrchestratorMsg::of(WorkerResults{"w", {r}}))),
               ErrorCode::invalid_argument, "orchestrator message workerResults: results[0].completionTokens");
  r = sample_result(1);
  r.choices[1].token_ids[0] = -1;
  expect_error(decode_orchestrator(encode(OrchestratorMsg::of(WorkerResults{"w", {r}}))),
               ErrorCode::invalid_argument, "results[0].choices[1].tokenIds[0]");
}

TEST(MessagesCodec, RejectsUnknownErrorCodes) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<wire::WorkerReply>();
  root.setVersion(kSchemaVersion);
  auto e = root.initErrorReply();
  e.setCode(static_cast<wire::ErrorCode>(200));
  e.setMessage("x");
  expect_error(decode_worker_reply(flat(mb)), ErrorCode::corrupt, "worker reply errorReply: code");
}

}  // namespace
}  // namespace shardline::messages
