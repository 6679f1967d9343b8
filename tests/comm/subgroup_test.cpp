// Sub-group communicators over an in-process parent and over a TCP parent:
// TP-like {0,1},{2,3} and SP-like {0,2},{1,3} groups of a world of 4 used
// interleaved on every rank, with different tag bases.
#include "comm/subgroup.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "comm/tcp.hpp"
#include "tests/comm/comm_test_util.hpp"

namespace shardline::comm {
namespace comm_subgroup_test {

using namespace testing;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr int kTpBase = 1 << 24;
constexpr int kSpBase = 2 << 24;

std::vector<std::unique_ptr<Communicator>> inproc_world(int world) {
  auto g = InProcGroup::create(world).value();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world; ++r) comms.push_back(g->communicator(r).value());
  return comms;
}

std::vector<std::unique_ptr<Communicator>> tcp_world(int world) {
  auto tcp = connect_tcp(world);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (auto& c : tcp) comms.push_back(std::move(c));
  return comms;
}

TEST(Subgroup, MakeSubgroupChecksMembersAndTagBase) {
  auto comms = inproc_world(4);
  Communicator& c = *comms[1];
  EXPECT_EQ(make_subgroup(c, {}, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(make_subgroup(c, {1, 0}, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(make_subgroup(c, {1, 1}, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(make_subgroup(c, {1, 4}, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(make_subgroup(c, {-1, 1}, 0).error().code, ErrorCode::invalid_argument);
  auto not_member = make_subgroup(c, {0, 2}, 0);
  ASSERT_FALSE(not_member.ok());
  EXPECT_NE(not_member.error().message.find("not a member"), std::string::npos);
  EXPECT_EQ(make_subgroup(c, {1, 2}, -1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(make_subgroup(c, {1, 2}, INT_MAX).error().code, ErrorCode::invalid_argument);
  auto sg = make_subgroup(c, {0, 1, 3}, kTpBase);
  ASSERT_TRUE(sg.ok()) << sg.error().to_string();
  EXPECT_EQ((*sg)->rank(), 1);
  EXPECT_EQ((*sg)->world_size(), 3);
  EXPECT_EQ((*sg)->timeout(), c.timeout());
  float f = 0;
  EXPECT_EQ((*sg)->send(&f, 4, 3, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ((*sg)->send(&f, 4, 0, -1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ((*sg)->send(&f, 4, 0, kSubgroupMaxTag + 1).error().code, ErrorCode::invalid_argument);
  // A group of one works alone.
  auto solo = make_subgroup(c, {1}, kSpBase);
  ASSERT_TRUE(solo.ok());
  std::vector<float> v = {1.0f, 2.0f};
  ASSERT_TRUE((*solo)->all_reduce_sum(v.data(), 2).ok());
  EXPECT_EQ(v[1], 2.0f);
}

TEST(Subgroup, AsGivenOrderTakesAnyOrderButNoDuplicates) {
  auto comms = inproc_world(4);
  Communicator& c = *comms[1];
  auto swapped = make_subgroup(c, {1, 0}, 0, MemberOrder::as_given);
  ASSERT_TRUE(swapped.ok()) << swapped.error().to_string();
  EXPECT_EQ((*swapped)->rank(), 0);
  EXPECT_EQ((*swapped)->world_size(), 2);
  for (const std::vector<int>& dup : {std::vector<int>{1, 1}, std::vector<int>{3, 1, 0, 3}}) {
    auto d = make_subgroup(c, dup, 0, MemberOrder::as_given);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(d.error().message.find("listed twice"), std::string::npos) << d.error().message;
  }
  EXPECT_EQ(make_subgroup(c, {1, 4}, 0, MemberOrder::as_given).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(make_subgroup(c, {2, 0}, 0, MemberOrder::as_given).error().code, ErrorCode::invalid_argument);
  // The default still wants them increasing.
  auto inc = make_subgroup(c, {1, 0}, 0);
  ASSERT_FALSE(inc.ok());
  EXPECT_NE(inc.error().message.find("strictly increasing"), std::string::npos) << inc.error().message;
}

/// Every rank of a world of 4 builds the sub-group {0, 2, 1, 3} (the Shift
/// Parallelism TP group of sp=2,tp=2): sub-group rank i is parent rank
/// members[i], so sums run in that order and gathers land in it.
void exercise_permuted(std::vector<std::unique_ptr<Communicator>>& world) {
  ASSERT_EQ(world.size(), 4u);
  const std::vector<int> members = {0, 2, 1, 3};
  run_on<Communicator>(world, [&](Communicator& parent, int r) {
    auto made = make_subgroup(parent, members, 3 << 24, MemberOrder::as_given);
    ASSERT_TRUE(made.ok()) << made.error().to_string();
    Communicator& g = **made;
    const int me = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    EXPECT_EQ(g.rank(), me);
    EXPECT_EQ(g.world_size(), 4);
    const std::size_t n = 513;
    std::vector<float> a(n);
    for (std::size_t i = 0; i < n; ++i) a[i] = value(r, i, 5);
    ASSERT_TRUE(g.all_reduce_sum(a.data(), n).ok());
    const auto want = ref_sum(members, 0, n, 5);
    EXPECT_TRUE(bits_equal(a.data(), want.data(), n)) << "rank " << r << ": not summed in sub-group rank order";
    const auto parent_order = ref_sum(std::vector<int>{0, 1, 2, 3}, 0, n, 5);
    EXPECT_FALSE(bits_equal(want.data(), parent_order.data(), n)) << "the values do not show the order";
    std::vector<float> send(n), gathered(4 * n);
    for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i, 6);
    ASSERT_TRUE(g.all_gather(send.data(), n, gathered.data()).ok());
    for (std::size_t k = 0; k < 4; ++k)
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(gathered[k * n + i], value(members[k], i, 6)) << "slot " << k << " of rank " << r;
    // Point to point in sub-group ranks: to the next sub-group rank.
    const int next = (me + 1) % 4, prev = (me + 3) % 4;
    const int v = 100 + r;
    ASSERT_TRUE(g.send(&v, sizeof v, next, 3).ok());
    int got = -1;
    ASSERT_TRUE(g.recv(&got, sizeof got, prev, 3).ok());
    EXPECT_EQ(got, 100 + members[static_cast<std::size_t>(prev)]);
    ASSERT_TRUE(g.barrier().ok());
  });
}

TEST(Subgroup, AsGivenOrderOverInProcParentUsesTheGivenRankOrder) {
  auto world = inproc_world(4);
  exercise_permuted(world);
}

TEST(Subgroup, AsGivenOrderOverTcpParentUsesTheGivenRankOrder) {
  auto world = tcp_world(4);
  exercise_permuted(world);
}

/// Every rank of a world of 4 builds TP {0,1}/{2,3} and SP {0,2}/{1,3}
/// sub-groups and interleaves every operation on both.
void exercise_tp_sp(std::vector<std::unique_ptr<Communicator>>& world) {
  ASSERT_EQ(world.size(), 4u);
  run_on<Communicator>(world, [&](Communicator& parent, int r) {
    const std::vector<int> tp_members = {r & ~1, r | 1};
    const std::vector<int> sp_members = {r & 1, (r & 1) + 2};
    auto tp_r = make_subgroup(parent, tp_members, kTpBase);
    auto sp_r = make_subgroup(parent, sp_members, kSpBase);
    ASSERT_TRUE(tp_r.ok()) << tp_r.error().to_string();
    ASSERT_TRUE(sp_r.ok()) << sp_r.error().to_string();
    Communicator& tp = **tp_r;
    Communicator& sp = **sp_r;
    EXPECT_EQ(tp.rank(), r & 1);
    EXPECT_EQ(sp.rank(), r >> 1);
    const auto parent_timeout = parent.timeout();

    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
      for (int salt = 0; salt < 3; ++salt) {
        // all_reduce on both, interleaved: rank-order sums over the members.
        std::vector<float> a(n), b(n);
        for (std::size_t i = 0; i < n; ++i) {
          a[i] = value(r, i, salt);
          b[i] = value(r, i, salt + 10);
        }
        ASSERT_TRUE(tp.all_reduce_sum(a.data(), n).ok());
        ASSERT_TRUE(sp.all_reduce_sum(b.data(), n).ok());
        const auto ref_a = ref_sum(tp_members, 0, n, salt);
        const auto ref_b = ref_sum(sp_members, 0, n, salt + 10);
        ASSERT_TRUE(bits_equal(a.data(), ref_a.data(), n)) << "tp rank " << r << " n " << n;
        ASSERT_TRUE(bits_equal(b.data(), ref_b.data(), n)) << "sp rank " << r << " n " << n;
      }
      // all_gather on SP, reduce_scatter on TP, all_to_all on SP, broadcast on TP.
      std::vector<float> send(n), gathered(2 * n);
      for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i, 20);
      ASSERT_TRUE(sp.all_gather(send.data(), n, gathered.data()).ok());
      std::vector<float> rs(2 * n), rs_out(n);
      for (std::size_t i = 0; i < 2 * n; ++i) rs[i] = value(r, i, 21);
      ASSERT_TRUE(tp.reduce_scatter_sum(rs.data(), rs_out.data(), n).ok());
      std::vector<float> a2a(2 * n), a2a_out(2 * n);
      for (std::size_t i = 0; i < 2 * n; ++i) a2a[i] = value(r, i, 22);
      ASSERT_TRUE(sp.all_to_all(a2a.data(), a2a_out.data(), n).ok());
      std::vector<float> bc(n);
      for (std::size_t i = 0; i < n; ++i) bc[i] = value(r, i, 23);
      ASSERT_TRUE(tp.broadcast(bc.data(), n, 1).ok());
      for (int k = 0; k < 2; ++k) {
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(gathered[k * n + i], value(sp_members[k], i, 20));
          ASSERT_EQ(a2a_out[k * n + i], value(sp_members[k], sp.rank() * n + i, 22));
        }
      }
      const auto ref_rs = ref_sum(tp_members, tp.rank() * n, n, 21);
      ASSERT_TRUE(bits_equal(rs_out.data(), ref_rs.data(), n));
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(bc[i], value(tp_members[1], i, 23));
      ASSERT_TRUE(tp.barrier().ok());
      ASSERT_TRUE(sp.barrier().ok());
    }

    // Point to point in sub-group ranks and tags; the same tag in both groups.
    const int tp_peer = 1 - tp.rank(), sp_peer = 1 - sp.rank();
    for (int i = 0; i < 5; ++i) {
      const int v1 = 100 * r + i, v2 = 1000 * r + i;
      ASSERT_TRUE(tp.send(&v1, sizeof v1, tp_peer, 7).ok());
      ASSERT_TRUE(sp.send(&v2, sizeof v2, sp_peer, 7).ok());
    }
    for (int i = 0; i < 5; ++i) {
      int v1 = -1, v2 = -1;
      ASSERT_TRUE(sp.recv(&v2, sizeof v2, sp_peer, 7).ok());
      ASSERT_TRUE(tp.recv(&v1, sizeof v1, tp_peer, 7).ok());
      EXPECT_EQ(v1, 100 * tp_members[tp_peer] + i);
      EXPECT_EQ(v2, 1000 * sp_members[sp_peer] + i);
    }
    int wrong = 0;
    const long long big = 5;
    ASSERT_TRUE(tp.send(&big, sizeof big, tp_peer, 8).ok());
    Status st = tp.recv(&wrong, sizeof wrong, tp_peer, 8);
    EXPECT_EQ(st.error().code, ErrorCode::mismatch) << st.error().to_string();
    long long right = 0;
    ASSERT_TRUE(tp.recv(&right, sizeof right, tp_peer, 8).ok());
    EXPECT_EQ(right, 5);

    // One-sided: the same region name in both sub-groups stays apart.
    std::vector<float> tp_region(16, static_cast<float>(r)), sp_region(16, 100.0f + r);
    ASSERT_TRUE(tp.expose("w", tp_region.data(), 64).ok());
    ASSERT_TRUE(sp.expose("w", sp_region.data(), 64).ok());
    ASSERT_TRUE(tp.barrier().ok());
    ASSERT_TRUE(sp.barrier().ok());
    float got[4];
    ASSERT_TRUE(tp.get(tp_peer, "w", 8, got, 16).ok());
    EXPECT_EQ(got[0], static_cast<float>(tp_members[tp_peer]));
    ASSERT_TRUE(sp.get(sp_peer, "w", 0, got, 16).ok());
    EXPECT_EQ(got[3], 100.0f + sp_members[sp_peer]);
    st = sp.get(sp_peer, "nope", 0, got, 4);
    EXPECT_EQ(st.error().code, ErrorCode::not_found);
    EXPECT_NE(st.error().message.find("'nope'"), std::string::npos) << st.error().message;
    EXPECT_EQ(sp.get(sp_peer, "w", 60, got, 8).error().code, ErrorCode::invalid_argument);
    ASSERT_TRUE(tp.barrier().ok());
    ASSERT_TRUE(sp.barrier().ok());
    ASSERT_TRUE(tp.unexpose("w").ok());
    EXPECT_EQ(tp.unexpose("w").error().code, ErrorCode::not_found);

    // Disagreement inside a sub-group: invalid_argument on both members, still usable.
    std::vector<float> d(8, 1.0f);
    st = tp.all_reduce_sum(d.data(), tp.rank() == 0 ? 4 : 6);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument) << st.error().to_string();
    EXPECT_NE(st.error().message.find("ranks disagree"), std::string::npos);
    ASSERT_TRUE(tp.all_reduce_sum(d.data(), 8).ok());
    EXPECT_EQ(d[0], 2.0f);
    EXPECT_EQ(parent.timeout(), parent_timeout);  // restored after every call
    EXPECT_GT(tp.bytes_sent(), 0u);
    ASSERT_TRUE(sp.barrier().ok());
  });
}

TEST(Subgroup, TpAndSpGroupsOverInProcParentInterleaved) {
  auto world = inproc_world(4);
  exercise_tp_sp(world);
}

TEST(Subgroup, TpAndSpGroupsOverTcpParentInterleaved) {
  auto world = tcp_world(4);
  exercise_tp_sp(world);
}

TEST(Subgroup, WholeWorldSubgroupMatchesParentBitForBit) {
  auto world = tcp_world(3);
  ASSERT_EQ(world.size(), 3u);
  run_on<Communicator>(world, [&](Communicator& parent, int r) {
    auto sg = make_subgroup(parent, {0, 1, 2}, 0).value();
    std::vector<float> a(333), b(333);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] = value(r, i, 4);
    ASSERT_TRUE(sg->all_reduce_sum(a.data(), a.size()).ok());
    ASSERT_TRUE(parent.all_reduce_sum(b.data(), b.size()).ok());
    EXPECT_TRUE(bits_equal(a.data(), b.data(), a.size()));
  });
}

TEST(Subgroup, MissingMemberTimesOutWithIoNamingItAndPoisonsOnlyTheSubgroup) {
  auto world = inproc_world(4);
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {  // SP group {0, 2}: rank 2 never calls the collective
    threads.emplace_back([&, r] {
      Communicator& parent = *world[static_cast<std::size_t>(r)];
      auto sg = make_subgroup(parent, {0, 2}, kSpBase).value();
      if (r == 2) {
        std::this_thread::sleep_for(milliseconds(600));
        return;
      }
      sg->set_timeout(milliseconds(250));
      std::vector<float> d(4, 1.0f);
      const auto t0 = Clock::now();
      Status st = sg->all_reduce_sum(d.data(), 4);
      const auto waited = Clock::now() - t0;
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io);
      const std::string& m = st.error().message;
      EXPECT_NE(m.find("all_reduce_sum: rank 0 timed out after 250 ms waiting for rank 1 (parent rank 2)"),
                std::string::npos)
          << m;
      EXPECT_GE(waited, milliseconds(240));
      EXPECT_LT(waited, milliseconds(250 + 2000));
      EXPECT_EQ(parent.timeout(), kDefaultTimeout);  // restored
      st = sg->barrier();
      EXPECT_EQ(st.error().code, ErrorCode::io);
      EXPECT_NE(st.error().message.find("poisoned"), std::string::npos);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace shardline::comm
