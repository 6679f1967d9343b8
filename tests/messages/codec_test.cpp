// Round trips of every message kind, and the decoder's frame / version /
// limit / field checks on hand-made inputs.

#include "messages/codec.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <variant>

#include "messages/kvstore.capnp.h"
#include "messages/orchestrator.capnp.h"
#include "messages/worker.capnp.h"
#include "samples.hpp"

namespace shardline::messages {

using worker::BatchRequest;
using worker::BatchResult;

namespace messages_codec_test {

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

/// Encodes each sample, decodes it with `decode`, and checks the same
/// alternative and content come back and re-encode to the same bytes.
template <class Msg>
void expect_round_trips(const std::vector<Msg>& samples, Result<Msg> (*decode)(std::string_view) noexcept) {
  for (const auto& m : samples) {
    SCOPED_TRACE(kind_name(m));
    const std::string bytes = encode(m);
    EXPECT_EQ(bytes.size() % 8, 0u);
    auto d = decode(bytes);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    expect_msg_eq(*d, m);
    // Encoding is deterministic: the decoded value re-encodes to the same bytes.
    EXPECT_EQ(encode(d.value()), bytes);
  }
}

TEST(MessagesCodec, OrchestratorMessagesRoundTrip) {
  expect_round_trips(sample_orchestrator_msgs(), decode_orchestrator);
}

TEST(MessagesCodec, OrchestratorRepliesRoundTrip) {
  expect_round_trips(sample_orchestrator_replies(), decode_orchestrator_reply);
}

TEST(MessagesCodec, WorkerMessagesRoundTrip) { expect_round_trips(sample_worker_msgs(), decode_worker); }

TEST(MessagesCodec, WorkerRepliesRoundTrip) { expect_round_trips(sample_worker_replies(), decode_worker_reply); }

TEST(MessagesCodec, KvStoreMessagesRoundTrip) { expect_round_trips(sample_kvstore_msgs(), decode_kvstore); }

TEST(MessagesCodec, KvStoreRepliesRoundTrip) { expect_round_trips(sample_kvstore_replies(), decode_kvstore_reply); }

TEST(MessagesCodec, EveryErrorCodeRoundTrips) {
  for (int c = 0; c <= static_cast<int>(ErrorCode::disk_full); ++c) {
    const Error e{static_cast<ErrorCode>(c), std::string("failure #") + std::to_string(c)};
    auto d = decode_worker_reply(encode(WorkerReply{e}));
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    ASSERT_TRUE(std::holds_alternative<Error>(*d)) << kind_name(*d);
    EXPECT_EQ(std::get<Error>(*d).code, e.code);
    EXPECT_EQ(std::get<Error>(*d).message, e.message);
  }
}

TEST(MessagesCodec, EmptyStringsAndDefaultsRoundTrip) {
  BatchRequest r;  // all defaults: empty prompt, default sampling params
  auto d = decode_worker(encode(WorkerMsg{AssignWork{{r}}}));
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  ASSERT_TRUE(std::holds_alternative<AssignWork>(*d)) << kind_name(*d);
  ASSERT_EQ(std::get<AssignWork>(*d).requests.size(), 1u);
  expect_request_eq(std::get<AssignWork>(*d).requests[0], r);

  auto s = decode_orchestrator(encode(OrchestratorMsg{SubmitJob{}}));
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_EQ(std::get<SubmitJob>(*s), SubmitJob{});
}

TEST(MessagesCodec, LargeMessagesSpanSegmentsAndRoundTrip) {
  // 8 MiB of KV data and 20k results: both far beyond the first segment.
  const std::string blob = binary_blob(8u << 20, 9);
  auto d = decode_kvstore(encode(KvStoreMsg{PutBlocks{"big", blob}}));
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(std::get<PutBlocks>(*d).data, blob);

  WorkerResults wr{"w", {}};
  for (int i = 0; i < 20000; ++i) wr.results.push_back(sample_result(i));
  auto r = decode_orchestrator(encode(OrchestratorMsg{wr}));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const auto& results = std::get<WorkerResults>(*r).results;
  ASSERT_EQ(results.size(), wr.results.size());
  expect_result_eq(results[19999], wr.results[19999]);
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
  const auto& decoded = std::get<SubmitJob>(*d).inputs;
  ASSERT_EQ(decoded.size(), 40u);
  EXPECT_EQ(decoded[39], "/in/shard-39.jsonl");

  // Every prefix of a multi-segment message is rejected, never a crash.
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(decode_orchestrator(std::string_view(bytes).substr(0, n)).ok()) << n;
}

TEST(MessagesCodec, KindNames) {
  EXPECT_STREQ(kind_name(OrchestratorMsg{SubmitJob{}}), "submitJob");
  EXPECT_STREQ(kind_name(OrchestratorMsg{Shutdown{}}), "shutdown");
  EXPECT_STREQ(kind_name(OrchestratorReply{Error{}}), "errorReply");
  EXPECT_STREQ(kind_name(WorkerMsg{AssignWork{}}), "assignWork");
  EXPECT_STREQ(kind_name(WorkerMsg{WorkerStatusQuery{}}), "statusQuery");
  EXPECT_STREQ(kind_name(WorkerReply{WorkerStatus{}}), "status");
  EXPECT_STREQ(kind_name(KvStoreMsg{PutBlocks{}}), "putBlocks");
  EXPECT_STREQ(kind_name(KvStoreReply{KvStoreStats{}}), "stats");
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
  std::string bytes = encode(KvStoreMsg{GetBlocks{"k"}});
  expect_error(decode_kvstore(bytes.substr(0, bytes.size() - 3)), ErrorCode::corrupt,
               "not a multiple of 8");
  expect_error(decode_kvstore(bytes + "x"), ErrorCode::corrupt, "not a multiple of 8");
}

TEST(MessagesCodec, DecodesFromUnalignedMemory) {
  const std::string bytes = encode(KvStoreMsg{PutBlocks{"key", binary_blob(100, 3)}});
  std::string shifted = "x" + bytes;  // data() + 1 is misaligned
  auto d = decode_kvstore(std::string_view(shifted).substr(1));
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(std::get<PutBlocks>(*d).data, binary_blob(100, 3));
}

TEST(MessagesCodec, RejectsOversizedMessages) {
  std::string huge(kMaxMessageBytes + 8, '\0');
  expect_error(decode_kvstore(huge), ErrorCode::invalid_argument, "exceeds the limit");
}

TEST(MessagesCodec, RejectsTrailingBytes) {
  const std::string bytes = encode(WorkerMsg{CancelJob{5}});
  expect_error(decode_worker(bytes + std::string(8, '\0')), ErrorCode::corrupt, "segment table declares");
}

TEST(MessagesCodec, RejectsLyingSegmentTables) {
  const std::string good = encode(OrchestratorMsg{KillActor{"a"}});
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
  const auto& requests = std::get<AssignWork>(*d2).requests;
  EXPECT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].params.max_tokens, 16);  // schema default
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
  std::string b = encode(OrchestratorMsg{KillActor{"some-actor"}});
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
  auto d = decode_worker(encode(WorkerMsg{AssignWork{{sample_request(1), r}}}));
  expect_error(d, ErrorCode::invalid_argument, "worker message assignWork: requests[1].params");
  expect_error(d, ErrorCode::invalid_argument, "max_tokens");

  r = sample_request(0);
  r.params.top_p = std::numeric_limits<float>::quiet_NaN();
  expect_error(decode_worker(encode(WorkerMsg{AssignWork{{r}}})), ErrorCode::invalid_argument, "top_p");

  r = sample_request(0);
  r.n = 0;
  expect_error(decode_worker(encode(WorkerMsg{AssignWork{{r}}})), ErrorCode::invalid_argument,
               "requests[0].n must be >= 1");

  r = sample_request(1);
  r.grammar_kind = "xml";  // not a structured-output kind
  expect_error(decode_worker(encode(WorkerMsg{AssignWork{{r}}})), ErrorCode::invalid_argument,
               "requests[0].grammarKind: unknown kind \"xml\"");

  r = sample_request(1);
  r.prompt_token_ids[2] = -5;
  expect_error(decode_worker(encode(WorkerMsg{AssignWork{{r}}})), ErrorCode::invalid_argument,
               "requests[0].promptTokenIds[2]");
}

TEST(MessagesCodec, RejectsInvalidResults) {
  BatchResult r = sample_result(1);
  r.completion_tokens = -1;
  expect_error(decode_orchestrator(encode(OrchestratorMsg{WorkerResults{"w", {r}}})),
               ErrorCode::invalid_argument, "orchestrator message workerResults: results[0].completionTokens");
  r = sample_result(1);
  r.cached_tokens = -3;
  expect_error(decode_orchestrator(encode(OrchestratorMsg{WorkerResults{"w", {r}}})),
               ErrorCode::invalid_argument, "results[0].cachedTokens");
  r = sample_result(1);
  r.choices[1].token_ids[0] = -1;
  expect_error(decode_orchestrator(encode(OrchestratorMsg{WorkerResults{"w", {r}}})),
               ErrorCode::invalid_argument, "results[0].choices[1].tokenIds[0]");
}

TEST(MessagesCodec, RejectsPrefixBlocksWithoutTokens) {
  const PrefixBlockData no_tokens{11, 10, {}, {}};
  expect_error(decode_kvstore(encode(KvStoreMsg{FetchPrefixBlocks{7, {{12, 11, {1, 2}, {}}, no_tokens}}})),
               ErrorCode::invalid_argument, "kvstore message fetchPrefixBlocks: blocks[1].tokens is empty");
  expect_error(decode_kvstore(encode(KvStoreMsg{PutPrefixBlocks{7, {no_tokens}, ""}})), ErrorCode::invalid_argument,
               "blocks[0].tokens is empty");
  expect_error(decode_kvstore_reply(encode(KvStoreReply{PrefixBlocksData{{}, -1, {}}})), ErrorCode::invalid_argument,
               "stored must be >= 0");
}

TEST(MessagesCodec, RejectsPrefixLinksWithoutNamesOrWithUnevenTokens) {
  const PrefixLinkData good{7, 1, 0x5a17, 0x2007, {11, 12}, {1, 2, 3, 4}};
  PrefixLinkData no_names = good;
  no_names.names.clear();
  PrefixLinkData uneven = good;
  uneven.tokens.push_back(5);
  expect_error(decode_kvstore(encode(KvStoreMsg{PutChunks{{}, "", {good, no_names}}})), ErrorCode::invalid_argument,
               "links[1]: 0 names for 4 tokens");
  expect_error(decode_kvstore(encode(KvStoreMsg{PutChunks{{}, "", {uneven}}})), ErrorCode::invalid_argument,
               "links[0]: 2 names for 5 tokens");
  PrefixLinkData top_bit = good;
  top_bit.job_id |= 1ull << 63;
  expect_error(decode_kvstore(encode(KvStoreMsg{PutChunks{{}, "", {top_bit}}})), ErrorCode::invalid_argument,
               "links[0]: a job id with the top bit");
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
