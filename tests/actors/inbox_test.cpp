// The shared inbox (actors/inbox.hpp) without an actor system: verify ->
// decode -> dispatch -> encode, the refusal's reply, log line and count.
#include "actors/inbox.hpp"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <variant>

#include "actors/protocol.hpp"

namespace shardline::actors {
namespace actors_inbox_test {

using messages::KvStoreMsg;
using messages::KvStoreReply;

/// Captures spdlog's default logger (message text only) while alive.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    sink->set_pattern("%v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  [[nodiscard]] std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

std::shared_ptr<const ClusterKey> new_key() {
  auto k = ClusterKey::generate();
  EXPECT_TRUE(k.ok()) << k.error().to_string();
  return std::make_shared<const ClusterKey>(std::move(k).value());
}

/// A handler that records what it was called with and answers stats for a
/// StatsQuery, the key for a GetBlocks, an Ack otherwise.
struct Recorder {
  int calls = 0;
  std::string last;
  KvStoreReply operator()(const messages::GetBlocks& m) {
    ++calls;
    last = "getBlocks " + m.key;
    return messages::BlocksData{m.key, "data of " + m.key, true};
  }
  KvStoreReply operator()(const messages::StatsQuery&) {
    ++calls;
    last = "statsQuery";
    return messages::KvStoreStats{1, 2, 3};
  }
  template <class T>
  KvStoreReply operator()(const T& m) {
    ++calls;
    last = messages::kind_name(KvStoreMsg{m});
    return messages::Ack{};
  }
};

/// The reply `sealed` to the message tagged `tag`: its seal checked with
/// `key` (null: an inbox without a key, which does not seal), decoded.
KvStoreReply decoded_reply(const std::string& sealed, const std::string& tag, const ClusterKey* key) {
  std::string bytes = sealed;
  if (key) {
    auto opened = open_reply(*key, tag, sealed);
    EXPECT_TRUE(opened.ok()) << opened.error().to_string();
    if (!opened) return KvStoreReply{Error{}};
    bytes = std::string(*opened);
  }
  auto r = messages::decode_kvstore_reply(bytes);
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.ok() ? std::move(r).value() : KvStoreReply{Error{}};
}

TEST(Inbox, DispatchesTheDecodedAlternativeAndEncodesItsReply) {
  const auto key = new_key();
  auto metrics = std::make_shared<MetricsRegistry>();
  Inbox inbox("kvstore node0/kvstore", key, metrics);
  Recorder rec;
  const Signed s = sign(*key, messages::encode(KvStoreMsg{messages::GetBlocks{"k1"}}));
  const KvStoreReply reply = decoded_reply(inbox.serve({}, s.tag, s.bytes, messages::decode_kvstore, rec), s.tag, key.get());
  EXPECT_EQ(rec.calls, 1);
  EXPECT_EQ(rec.last, "getBlocks k1");
  ASSERT_TRUE(std::holds_alternative<messages::BlocksData>(reply)) << messages::kind_name(reply);
  EXPECT_EQ(std::get<messages::BlocksData>(reply), (messages::BlocksData{"k1", "data of k1", true}));

  const Signed q = sign(*key, messages::encode(KvStoreMsg{messages::DropBlocks{"k2"}}));
  EXPECT_TRUE(std::holds_alternative<messages::Ack>(
      decoded_reply(inbox.serve({}, q.tag, q.bytes, messages::decode_kvstore, rec), q.tag, key.get())));
  EXPECT_EQ(rec.last, "dropBlocks");
  EXPECT_EQ(metrics->get("shardline_auth_failures_total"), 0.0);
}

TEST(Inbox, RefusesABadTagLogsAndCountsIt) {
  const auto key = new_key();
  const auto other = new_key();
  auto metrics = std::make_shared<MetricsRegistry>();
  Inbox inbox("kvstore node0/kvstore", key, metrics);
  Recorder rec;
  const std::string bytes = messages::encode(KvStoreMsg{messages::StatsQuery{}});
  // Another key, none, another message's, and a bare HMAC (no time, no nonce).
  for (const std::string& tag : {make_message_tag(*other, bytes), std::string(), make_message_tag(*key, bytes + "x"),
                                 key->sign(bytes)}) {
    LogCapture log;
    const KvStoreReply reply = decoded_reply(inbox.serve({}, tag, bytes, messages::decode_kvstore, rec), tag, key.get());
    ASSERT_TRUE(std::holds_alternative<Error>(reply)) << messages::kind_name(reply);
    EXPECT_EQ(std::get<Error>(reply).code, ErrorCode::invalid_argument);
    EXPECT_EQ(std::get<Error>(reply).message, "unauthenticated: wrong or missing cluster key");
    EXPECT_EQ(log.text().rfind("kvstore node0/kvstore: refused a message with a bad cluster key tag from ", 0), 0u)
        << log.text();
  }
  EXPECT_EQ(rec.calls, 0);
  EXPECT_EQ(metrics->get("shardline_auth_failures_total"), 4.0);

  // Without a registry the refusal is logged, not counted; without a key every message is refused.
  Inbox uncounted("worker w", key, nullptr);
  EXPECT_TRUE(std::holds_alternative<Error>(
      decoded_reply(uncounted.serve({}, "", bytes, messages::decode_kvstore, rec), "", key.get())));
  Inbox keyless;
  EXPECT_TRUE(std::holds_alternative<Error>(
      decoded_reply(keyless.serve({}, make_message_tag(*key, bytes), bytes, messages::decode_kvstore, rec), "", nullptr)));
  EXPECT_EQ(rec.calls, 0);
}

TEST(Inbox, RefusesAReplayedOrExpiredMessageLogsAndCountsIt) {
  const auto key = new_key();
  auto metrics = std::make_shared<MetricsRegistry>();
  Inbox inbox("orchestrator", key, metrics);
  Recorder rec;
  const Signed s = sign(*key, messages::encode(KvStoreMsg{messages::DropBlocks{"k"}}));
  EXPECT_TRUE(std::holds_alternative<messages::Ack>(
      decoded_reply(inbox.serve({}, s.tag, s.bytes, messages::decode_kvstore, rec), s.tag, key.get())));
  EXPECT_EQ(rec.calls, 1);
  {
    LogCapture log;
    const KvStoreReply again = decoded_reply(inbox.serve({}, s.tag, s.bytes, messages::decode_kvstore, rec), s.tag, key.get());
    ASSERT_TRUE(std::holds_alternative<Error>(again)) << messages::kind_name(again);
    EXPECT_EQ(std::get<Error>(again).code, ErrorCode::invalid_argument);
    EXPECT_EQ(std::get<Error>(again).message.rfind("replayed:", 0), 0u) << std::get<Error>(again).message;
    EXPECT_NE(log.text().find("orchestrator: refused a replayed message from "), std::string::npos) << log.text();
  }
  {
    // Signed (correctly) ten minutes ago: outside the five-minute window.
    const std::string old_tag = make_message_tag(*key, s.bytes, unix_now_ms() - 600'000, std::string(32, 'a'));
    LogCapture log;
    const KvStoreReply old = decoded_reply(inbox.serve({}, old_tag, s.bytes, messages::decode_kvstore, rec), old_tag, key.get());
    ASSERT_TRUE(std::holds_alternative<Error>(old)) << messages::kind_name(old);
    EXPECT_EQ(std::get<Error>(old).message.rfind("expired: signed -600 s", 0), 0u) << std::get<Error>(old).message;
    EXPECT_NE(log.text().find("outside the 300 s window"), std::string::npos) << log.text();
  }
  EXPECT_EQ(rec.calls, 1);
  EXPECT_EQ(metrics->get("shardline_replays_refused_total"), 2.0);
  EXPECT_EQ(metrics->get("shardline_auth_failures_total"), 0.0);
  // A new signature of the same bytes is a new message.
  const Signed fresh = sign(*key, s.bytes);
  EXPECT_TRUE(std::holds_alternative<messages::Ack>(
      decoded_reply(inbox.serve({}, fresh.tag, fresh.bytes, messages::decode_kvstore, rec), fresh.tag, key.get())));
  EXPECT_EQ(rec.calls, 2);
}

TEST(Inbox, AnswersUndecodableBytesWithTheDecodeError) {
  const auto key = new_key();
  Inbox inbox("kvstore n/kvstore", key, nullptr);
  Recorder rec;
  // An orchestrator message is not a KV-store message: signed, but its union
  // member (kvProgressReport, 11) is out of the KV store's range (0..8).
  const std::string bytes = messages::encode(messages::OrchestratorMsg{messages::KvProgressReport{}});
  const std::string garbage(16, '\x01');
  for (const std::string& b : {bytes, garbage, std::string()}) {
    const std::string tag = make_message_tag(*key, b);
    const KvStoreReply reply = decoded_reply(inbox.serve({}, tag, b, messages::decode_kvstore, rec), tag, key.get());
    ASSERT_TRUE(std::holds_alternative<Error>(reply)) << messages::kind_name(reply);
    const auto expected = messages::decode_kvstore(b);
    ASSERT_FALSE(expected.ok());
    EXPECT_EQ(std::get<Error>(reply).code, expected.error().code);
    EXPECT_EQ(std::get<Error>(reply).message, expected.error().message);
  }
  EXPECT_EQ(rec.calls, 0);
}

TEST(Inbox, AnOptionalReplyOfNulloptSendsNoBytes) {
  const auto key = new_key();
  Inbox inbox("orchestrator", key, nullptr);
  auto handler = [](const auto& m) -> std::optional<messages::OrchestratorReply> {
    if constexpr (std::is_same_v<std::decay_t<decltype(m)>, messages::JobStatusQuery>)
      return messages::JobSubmitted{m.job_id};
    return std::nullopt;
  };
  const Signed hb = sign(*key, messages::encode(messages::OrchestratorMsg{messages::WorkerHeartbeat{}}));
  EXPECT_EQ(inbox.serve({}, hb.tag, hb.bytes, messages::decode_orchestrator, handler), "");
  const Signed q = sign(*key, messages::encode(messages::OrchestratorMsg{messages::JobStatusQuery{9}}));
  const std::string sealed = inbox.serve({}, q.tag, q.bytes, messages::decode_orchestrator, handler);
  auto opened = open_reply(*key, q.tag, sealed);
  ASSERT_TRUE(opened) << opened.error().message;
  auto reply = messages::decode_orchestrator_reply(*opened);
  ASSERT_TRUE(reply.ok()) << reply.error().to_string();
  ASSERT_TRUE(std::holds_alternative<messages::JobSubmitted>(*reply)) << messages::kind_name(*reply);
  EXPECT_EQ(std::get<messages::JobSubmitted>(*reply).job_id, 9u);
  // A refused message is answered even by an inbox whose handlers answer nullopt.
  const std::string refused_sealed = inbox.serve({}, "", q.bytes, messages::decode_orchestrator, handler);
  auto refused_opened = open_reply(*key, "", refused_sealed);
  ASSERT_TRUE(refused_opened) << refused_opened.error().message;
  auto refused = messages::decode_orchestrator_reply(*refused_opened);
  ASSERT_TRUE(refused.ok()) << refused.error().to_string();
  EXPECT_TRUE(std::holds_alternative<Error>(*refused));
}

}  // namespace
}  // namespace shardline::actors
