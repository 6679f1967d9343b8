// The codec's tables (messages/codec_<schema>.cpp) against the schemas: every
// alternative of every message variant travels as the union member at its
// index and comes back as itself, and every union member has an alternative.
// A new message whose table entry sets another member, or a schema member
// without an alternative, fails here; an alternative without a table entry
// does not compile.

#include <capnp/message.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <kj/array.h>

#include <cstddef>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "messages/codec.hpp"
#include "messages/kvstore.capnp.h"
#include "messages/orchestrator.capnp.h"
#include "messages/worker.capnp.h"
#include "samples.hpp"

namespace shardline::messages {
namespace messages_codec_table_test {

using namespace shardline::messages::testing;  // NOLINT

/// The union member (which()) of an encoded root, read with Cap'n Proto itself.
template <class Root>
unsigned raw_which(const std::string& bytes) {
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  capnp::FlatArrayMessageReader reader(words.asPtr());
  return static_cast<unsigned>(reader.getRoot<Root>().which());
}

/// Alternative I, default-constructed: encodes as union member I, named as
/// the schema names it, and decodes as alternative I again.
template <class Root, class Msg, std::size_t I>
void expect_alternative_travels_as_its_member(Result<Msg> (*decode)(std::string_view) noexcept) {
  const Msg m(std::in_place_index<I>);
  const auto members = capnp::Schema::from<Root>().getUnionFields();
  ASSERT_LT(I, members.size());
  const std::string member = members[static_cast<unsigned>(I)].getProto().getName().cStr();
  SCOPED_TRACE("alternative " + std::to_string(I) + " (" + member + ")");
  EXPECT_EQ(kind_name(m), member);
  const std::string bytes = encode(m);
  EXPECT_EQ(raw_which<Root>(bytes), I) << "encoded as union member "
                                       << members[raw_which<Root>(bytes)].getProto().getName().cStr();
  auto d = decode(bytes);
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(d->index(), I) << "decoded as " << kind_name(*d);
  EXPECT_EQ(encode(*d), bytes);
}

template <class Root, class Msg>
void expect_table_matches_schema(Result<Msg> (*decode)(std::string_view) noexcept) {
  EXPECT_EQ(std::variant_size_v<Msg>, capnp::Schema::from<Root>().getUnionFields().size())
      << "the variant and the schema's union have different numbers of members";
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (expect_alternative_travels_as_its_member<Root, Msg, I>(decode), ...);
  }(std::make_index_sequence<std::variant_size_v<Msg>>{});
}

/// The samples of the round-trip tests hold every alternative (so each is
/// also checked with content, not only default-constructed).
template <class Msg>
void expect_samples_cover_every_alternative(const std::vector<Msg>& samples) {
  std::set<std::size_t> seen;
  for (const auto& m : samples) seen.insert(m.index());
  for (std::size_t i = 0; i < std::variant_size_v<Msg>; ++i)
    EXPECT_TRUE(seen.count(i)) << "no sample of alternative " << i;
}

TEST(MessagesCodecTable, OrchestratorMessage) {
  expect_table_matches_schema<wire::OrchestratorMessage, OrchestratorMsg>(decode_orchestrator);
  expect_samples_cover_every_alternative(sample_orchestrator_msgs());
}

TEST(MessagesCodecTable, OrchestratorReply) {
  expect_table_matches_schema<wire::OrchestratorReply, OrchestratorReply>(decode_orchestrator_reply);
  expect_samples_cover_every_alternative(sample_orchestrator_replies());
}

TEST(MessagesCodecTable, WorkerMessage) {
  expect_table_matches_schema<wire::WorkerMessage, WorkerMsg>(decode_worker);
  expect_samples_cover_every_alternative(sample_worker_msgs());
}

TEST(MessagesCodecTable, WorkerReply) {
  expect_table_matches_schema<wire::WorkerReply, WorkerReply>(decode_worker_reply);
  expect_samples_cover_every_alternative(sample_worker_replies());
}

TEST(MessagesCodecTable, KvStoreMessage) {
  expect_table_matches_schema<wire::KvStoreMessage, KvStoreMsg>(decode_kvstore);
  expect_samples_cover_every_alternative(sample_kvstore_msgs());
}

TEST(MessagesCodecTable, KvStoreReply) {
  expect_table_matches_schema<wire::KvStoreReply, KvStoreReply>(decode_kvstore_reply);
  expect_samples_cover_every_alternative(sample_kvstore_replies());
}

}  // namespace
}  // namespace shardline::messages
