// actors/client.hpp opens every reply with its request's tag (issue 46,
// item 1: replies are signed and verified too). An orchestrator stand-in
// that answers with an unsealed reply, a reply sealed with another key, or
// a genuine reply it kept from an earlier request gets an "unauthenticated
// reply" error to the caller, never the forged content.
#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <memory>
#include <string>

#include "actors/client.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"

namespace shardline::actors {
namespace actors_client_reply_test {

std::shared_ptr<const ClusterKey> new_key() {
  auto k = ClusterKey::generate();
  EXPECT_TRUE(k);
  return std::make_shared<const ClusterKey>(std::move(k).value());
}

enum class Forgery { none, unsealed, other_key, old_reply };

/// Answers every request "job 7 submitted", sealed as `how` says.
caf::behavior stand_in(caf::event_based_actor*, std::shared_ptr<const ClusterKey> key,
                       std::shared_ptr<const ClusterKey> other, Forgery how) {
  auto first_tag = std::make_shared<std::string>();
  return {[=](msg_atom, const std::string& tag, const std::string&) -> std::string {
    const std::string bytes = messages::encode(messages::OrchestratorReply{messages::JobSubmitted{7}});
    if (first_tag->empty()) *first_tag = tag;
    switch (how) {
      case Forgery::none:
        return seal_reply(*key, tag, bytes);
      case Forgery::unsealed:
        return bytes;
      case Forgery::other_key:
        return seal_reply(*other, tag, bytes);
      case Forgery::old_reply:
        return seal_reply(*key, *first_tag, bytes);  // right for the first request only
    }
    return {};
  }};
}

TEST(ClientReply, OnlyAReplySealedToThisRequestWithTheKeyIsAccepted) {
  caf::actor_system_config cfg;
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  const auto key = new_key();
  const auto other = new_key();
  const messages::OrchestratorMsg query{messages::JobStatusQuery{7}};
  for (Forgery how : {Forgery::none, Forgery::unsealed, Forgery::other_key, Forgery::old_reply}) {
    caf::actor orchestrator = sys.spawn(stand_in, key, other, how);
    auto client = Client::local(sys, orchestrator, key);
    auto first = client->call<messages::JobSubmitted>(query);
    auto second = client->call<messages::JobSubmitted>(query);
    if (how == Forgery::none || how == Forgery::old_reply) {
      ASSERT_TRUE(first) << first.error().message;
      EXPECT_EQ(first->job_id, 7u);
    }
    if (how == Forgery::none) {
      ASSERT_TRUE(second) << second.error().message;
    } else {
      ASSERT_FALSE(second) << static_cast<int>(how);
      EXPECT_EQ(second.error().code, ErrorCode::io);
      EXPECT_NE(second.error().message.find("unauthenticated reply"), std::string::npos) << second.error().message;
    }
    caf::anon_send_exit(orchestrator, caf::exit_reason::user_shutdown);
  }
}

}  // namespace
}  // namespace shardline::actors
