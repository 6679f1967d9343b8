// actors/replay_guard.hpp: a tag is accepted once, within its time window,
// only for its bytes and key; nonces are forgotten once they would expire
// anyway; malformed tags are refused.
#include "actors/replay_guard.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

namespace shardline::actors {
namespace actors_replay_guard_test {

using V = ReplayGuard::Verdict;

ClusterKey new_key() {
  auto k = ClusterKey::generate();
  EXPECT_TRUE(k);
  return std::move(k).value();
}

TEST(ReplayGuard, AcceptsOnceThenRefusesAsReplayedThenAsExpired) {
  const ClusterKey key = new_key();
  ReplayGuard guard(std::chrono::seconds(60));
  const std::int64_t t0 = 1'800'000'000'000;  // 2027-01-15
  const std::string nonce(32, '7');
  const std::string tag = make_message_tag(key, "submit job 1", t0, nonce);
  EXPECT_EQ(guard.admit(key, tag, "submit job 1", t0 + 10), V::accepted);
  EXPECT_EQ(guard.admit(key, tag, "submit job 1", t0 + 20), V::replayed);
  EXPECT_EQ(guard.admit(key, tag, "submit job 1", t0 + 59'999), V::replayed);
  // Past the window the nonce is forgotten, and the tag has expired.
  EXPECT_EQ(guard.admit(key, tag, "submit job 1", t0 + 60'001), V::expired);
  EXPECT_EQ(guard.remembered(), 0u);
  // Signed too far in the future (a sender's clock ahead by more than the window).
  EXPECT_EQ(guard.admit(key, make_message_tag(key, "x", t0 + 61'000, std::string(32, '1')), "x", t0), V::expired);
  EXPECT_EQ(guard.admit(key, make_message_tag(key, "x", t0 + 59'000, std::string(32, '1')), "x", t0), V::accepted);
}

TEST(ReplayGuard, TheMacCoversTheBytesTheTimeAndTheNonce) {
  const ClusterKey key = new_key();
  const ClusterKey other = new_key();
  ReplayGuard guard;
  const std::int64_t now = unix_now_ms();
  const std::string tag = make_message_tag(key, "bytes", now, std::string(32, 'a'));
  EXPECT_EQ(guard.admit(other, tag, "bytes", now), V::bad_tag);
  EXPECT_EQ(guard.admit(key, tag, "bytez", now), V::bad_tag);
  // The same MAC with another time or nonce does not verify.
  const std::string mac = tag.substr(tag.rfind('.') + 1);
  EXPECT_EQ(guard.admit(key, std::to_string(now + 1) + "." + std::string(32, 'a') + "." + mac, "bytes", now), V::bad_tag);
  EXPECT_EQ(guard.admit(key, std::to_string(now) + "." + std::string(32, 'b') + "." + mac, "bytes", now), V::bad_tag);
  for (const std::string bad : {std::string(), std::string("."), std::string(".."), key.sign("bytes"),
                                std::string("-5.") + std::string(32, 'a') + "." + mac,
                                std::string("12x.") + std::string(32, 'a') + "." + mac,
                                std::to_string(now) + "." + std::string(31, 'a') + "." + mac,
                                std::to_string(now) + "." + std::string(32, 'A') + "." + mac})
    EXPECT_EQ(guard.admit(key, bad, "bytes", now), V::bad_tag) << bad;
  EXPECT_EQ(guard.remembered(), 0u);
  EXPECT_EQ(guard.admit(key, tag, "bytes", now), V::accepted);
  EXPECT_TRUE(message_tag_is_authentic(key, tag, "bytes"));
  EXPECT_FALSE(message_tag_is_authentic(other, tag, "bytes"));
}

TEST(ReplayGuard, FreshTagsHaveDistinctNoncesAndAreAccepted) {
  const ClusterKey key = new_key();
  ReplayGuard guard;
  std::set<std::string> nonces;
  for (int i = 0; i < 1000; ++i) {
    const std::string tag = make_message_tag(key, "same bytes");
    const std::size_t a = tag.find('.');
    nonces.insert(tag.substr(a + 1, 32));
    EXPECT_EQ(guard.admit(key, tag, "same bytes", unix_now_ms()), V::accepted);
  }
  EXPECT_EQ(nonces.size(), 1000u);
  EXPECT_EQ(guard.remembered(), 1000u);
}

TEST(ReplySeal, OpensOnlyForItsRequestAndKey) {
  const ClusterKey key = new_key();
  const ClusterKey other = new_key();
  const std::string request = make_message_tag(key, "job status 1");
  const std::string sealed = seal_reply(key, request, "status of job 1");
  ASSERT_EQ(sealed.size(), kReplySealHex + 15);
  auto opened = open_reply(key, request, sealed);
  ASSERT_TRUE(opened) << opened.error().message;
  EXPECT_EQ(*opened, "status of job 1");
  // Another request's tag (an old reply passed off as this one), another
  // key, altered bytes, no seal, nothing.
  const std::string later = make_message_tag(key, "job status 1");
  for (const auto& [tag, reply, k] :
       {std::tuple{later, sealed, &key}, std::tuple{request, seal_reply(other, request, "status of job 1"), &key},
        std::tuple{request, sealed.substr(0, sealed.size() - 1) + "2", &key}, std::tuple{request, sealed, &other},
        std::tuple{request, std::string("status of job 1"), &key}, std::tuple{request, std::string(), &key}}) {
    auto bad = open_reply(*k, tag, reply);
    ASSERT_FALSE(bad) << reply;
    EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(bad.error().message.rfind("unauthenticated reply: ", 0), 0u) << bad.error().message;
  }
  EXPECT_EQ(seal_reply(key, request, ""), "");  // no reply stays no reply
}

}  // namespace
}  // namespace shardline::actors
