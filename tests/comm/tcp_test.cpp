// TCP communicator: ranks are threads over loopback (ephemeral ports). The
// fault test (tcp_fault_test.cpp) kills real processes.
#include "comm/tcp.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "tests/comm/comm_test_util.hpp"

namespace shardline::comm {
namespace comm_tcp_test {

using namespace testing;
using std::chrono::milliseconds;
using Comms = std::vector<std::unique_ptr<TcpCommunicator>>;
using Clock = std::chrono::steady_clock;

const std::size_t kCounts[] = {0, 1, 7, 33, 1001};

TEST(TcpGroup, ListenChecksOptions) {
  TcpOptions o;
  o.world_size = 0;
  EXPECT_EQ(TcpGroup::listen(o).error().code, ErrorCode::invalid_argument);
  o.world_size = 2;
  o.rank = 2;
  EXPECT_EQ(TcpGroup::listen(o).error().code, ErrorCode::invalid_argument);
  o.rank = 1;
  o.master_port = 0;  // other ranks need rank 0's actual port
  auto e = TcpGroup::listen(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(e.error().message.find("master_port"), std::string::npos) << e.error().message;
  o.master_port = 70000;
  EXPECT_EQ(TcpGroup::listen(o).error().code, ErrorCode::invalid_argument);
  o.master_port = 1234;
  o.timeout = milliseconds(0);
  EXPECT_EQ(TcpGroup::listen(o).error().code, ErrorCode::invalid_argument);
  o = TcpOptions{};
  o.world_size = 2;
  o.master_host = "no-such-host.invalid";
  EXPECT_EQ(TcpGroup::listen(o).error().code, ErrorCode::io);
}

TEST(TcpGroup, ListenBindsAnEphemeralPortAndConnectRunsOnce) {
  TcpOptions o;
  o.world_size = 1;
  auto single = TcpGroup::listen(o);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->port(), 0);  // a group of one needs no socket
  auto c = single->connect();
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(single->connect().error().code, ErrorCode::invalid_argument);
  std::vector<float> v = {1.5f, 2.5f};
  ASSERT_TRUE((*c)->all_reduce_sum(v.data(), 2).ok());
  EXPECT_EQ(v[1], 2.5f);
  float gathered[2];
  ASSERT_TRUE((*c)->all_gather(v.data(), 2, gathered).ok());
  EXPECT_EQ(gathered[0], 1.5f);
  ASSERT_TRUE((*c)->send(v.data(), 8, 0, 3).ok());  // to oneself
  float back[2];
  ASSERT_TRUE((*c)->recv(back, 8, 0, 3).ok());
  EXPECT_EQ(back[1], 2.5f);

  o.world_size = 3;
  auto g = TcpGroup::listen(o);
  ASSERT_TRUE(g.ok()) << g.error().to_string();
  EXPECT_GT(g->port(), 0);
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->world_size(), 3);
}

TEST(Tcp, AllReduceSumMatchesSerialRankOrderBitExact) {
  for (int world : {1, 2, 3, 4}) {
    auto comms = connect_tcp(world);
    ASSERT_EQ(comms.size(), static_cast<std::size_t>(world));
    run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) {
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.world_size(), world);
      for (std::size_t n : kCounts) {
        const auto ref = ref_sum(iota_ids(world), 0, n);
        std::vector<float> data(n);
        for (std::size_t i = 0; i < n; ++i) data[i] = value(r, i);
        const Status st = c.all_reduce_sum(data.data(), n);
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        EXPECT_TRUE(bits_equal(data.data(), ref.data(), n))
            << "world " << world << " count " << n << " rank " << r;
      }
    });
  }
}

TEST(Tcp, MatchesInProcBackendBitForBit) {
  constexpr int kWorld = 4;
  constexpr std::size_t kN = 517;
  // In-process reference of every collective.
  std::vector<std::vector<float>> inproc_out(kWorld);
  {
    auto g = InProcGroup::create(kWorld).value();
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < kWorld; ++r) comms.push_back(g->communicator(r).value());
    run_on<Communicator>(comms, [&](Communicator& c, int r) {
      std::vector<float> a(kN), rs_in(kWorld * kN), rs_out(kN);
      for (std::size_t i = 0; i < kN; ++i) a[i] = value(r, i, 5);
      for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = value(r, i, 6);
      ASSERT_TRUE(c.all_reduce_sum(a.data(), kN).ok());
      ASSERT_TRUE(c.reduce_scatter_sum(rs_in.data(), rs_out.data(), kN).ok());
      a.insert(a.end(), rs_out.begin(), rs_out.end());
      inproc_out[static_cast<std::size_t>(r)] = a;
    });
  }
  auto comms = connect_tcp(kWorld);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(kWorld));
  run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) {
    std::vector<float> a(kN), rs_in(kWorld * kN), rs_out(kN);
    for (std::size_t i = 0; i < kN; ++i) a[i] = value(r, i, 5);
    for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = value(r, i, 6);
    ASSERT_TRUE(c.all_reduce_sum(a.data(), kN).ok());
    ASSERT_TRUE(c.reduce_scatter_sum(rs_in.data(), rs_out.data(), kN).ok());
    a.insert(a.end(), rs_out.begin(), rs_out.end());
    EXPECT_TRUE(bits_equal(a.data(), inproc_out[static_cast<std::size_t>(r)].data(), a.size()))
        << "rank " << r;
  });
}

TEST(Tcp, AllGatherReduceScatterAllToAllBroadcastBarrier) {
  constexpr int kWorld = 3;
  auto comms = connect_tcp(kWorld);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(kWorld));
  run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) {
    const int w = kWorld;
    for (std::size_t n : kCounts) {
      // all_gather, then in place.
      std::vector<float> send(n), recv(w * n, -1.0f);
      for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i);
      ASSERT_TRUE(c.all_gather(send.data(), n, recv.data()).ok());
      for (int k = 0; k < w; ++k)
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(recv[k * n + i], value(k, i));
      std::vector<float> inplace(w * n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) inplace[r * n + i] = value(r, i, 1);
      ASSERT_TRUE(c.all_gather(inplace.data() + r * n, n, inplace.data()).ok());
      for (int k = 0; k < w; ++k)
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(inplace[k * n + i], value(k, i, 1));

      // reduce_scatter: row r of everyone's send, summed in rank order; in place too.
      std::vector<float> rs(w * n), out(n);
      for (std::size_t i = 0; i < w * n; ++i) rs[i] = value(r, i, 2);
      ASSERT_TRUE(c.reduce_scatter_sum(rs.data(), out.data(), n).ok());
      const auto ref = ref_sum(iota_ids(w), r * n, n, 2);
      EXPECT_TRUE(bits_equal(out.data(), ref.data(), n)) << "count " << n;
      ASSERT_TRUE(c.reduce_scatter_sum(rs.data(), rs.data() + r * n, n).ok());
      EXPECT_TRUE(bits_equal(rs.data() + r * n, ref.data(), n));

      // all_to_all: row k of my recv = row r of rank k's send.
      std::vector<float> a2a(w * n), got(w * n);
      for (std::size_t i = 0; i < w * n; ++i) a2a[i] = value(r, i, 3);
      ASSERT_TRUE(c.all_to_all(a2a.data(), got.data(), n).ok());
      for (int k = 0; k < w; ++k)
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[k * n + i], value(k, r * n + i, 3));

      // broadcast from every root.
      for (int root = 0; root < w; ++root) {
        std::vector<float> b(n);
        for (std::size_t i = 0; i < n; ++i) b[i] = value(r, i, 4);
        ASSERT_TRUE(c.broadcast(b.data(), n, root).ok());
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(b[i], value(root, i, 4));
      }
      ASSERT_TRUE(c.barrier().ok());
    }
  });
}

TEST(Tcp, PointToPointKeepsOrderPerTagAndNeverWaitsForTheRecv) {
  auto comms = connect_tcp(2);
  ASSERT_EQ(comms.size(), 2u);
  constexpr int kMsgs = 200;
  constexpr std::size_t kBig = 24u << 20;  // larger than the socket buffers
  run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) {
    const int peer = 1 - r;
    // Both ranks send a big message first, then receive: sends must not wait.
    std::vector<std::uint8_t> big(kBig), big_in(kBig);
    for (std::size_t i = 0; i < kBig; ++i) big[i] = static_cast<std::uint8_t>(i * 7 + r);
    ASSERT_TRUE(c.send(big.data(), kBig, peer, 99).ok());
    if (r == 0) {
      for (int i = 0; i < kMsgs; ++i) {
        const int tag = 1 + i % 2;
        std::int32_t v = i;
        ASSERT_TRUE(c.send(&v, sizeof v, 1, tag).ok());
      }
      ASSERT_TRUE(c.send(nullptr, 0, 1, 3).ok());  // empty message
    } else {
      // Drain tag 2 first, then tag 1: each in its own send order.
      for (int tag : {2, 1}) {
        for (int i = tag - 1; i < kMsgs; i += 2) {
          std::int32_t v = -1;
          const Status st = c.recv(&v, sizeof v, 0, tag);
          ASSERT_TRUE(st.ok()) << st.error().to_string();
          ASSERT_EQ(v, i) << "tag " << tag;
        }
      }
      ASSERT_TRUE(c.recv(nullptr, 0, 0, 3).ok());
    }
    Status st = c.recv(big_in.data(), kBig, peer, 99);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    for (std::size_t i = 0; i < kBig; i += 4099) {
      ASSERT_EQ(big_in[i], static_cast<std::uint8_t>(i * 7 + peer)) << i;
    }
    ASSERT_TRUE(c.barrier().ok());
  });
  EXPECT_GE(comms[0]->bytes_sent(), kBig + kMsgs * 4);
  EXPECT_GE(comms[1]->bytes_received(), kBig + kMsgs * 4);
  EXPECT_GT(comms[0]->wire_bytes_sent(), comms[0]->bytes_sent());
}

TEST(Tcp, RecvSizeMismatchKeepsMessageQueuedAndMissingMessageTimesOut) {
  auto comms = connect_tcp(2);
  ASSERT_EQ(comms.size(), 2u);
  run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) {
    c.set_timeout(milliseconds(300));
    EXPECT_EQ(c.timeout(), milliseconds(300));
    if (r == 0) {
      const int msg[2] = {1, 2};
      ASSERT_TRUE(c.send(msg, sizeof msg, 1, 1).ok());
      EXPECT_EQ(c.send(msg, 4, 2, 1).error().code, ErrorCode::invalid_argument);
      EXPECT_EQ(c.send(nullptr, 4, 1, 1).error().code, ErrorCode::invalid_argument);
    } else {
      int small = 0;
      Status st = c.recv(&small, sizeof small, 0, 1);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::mismatch);
      EXPECT_NE(st.error().message.find("8 bytes"), std::string::npos) << st.error().message;
      int right[2];
      ASSERT_TRUE(c.recv(right, sizeof right, 0, 1).ok());
      EXPECT_EQ(right[1], 2);
      const auto t0 = Clock::now();
      st = c.recv(&small, sizeof small, 0, 2);
      const auto waited = Clock::now() - t0;
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io);
      EXPECT_NE(st.error().message.find("recv: rank 1 timed out"), std::string::npos)
          << st.error().message;
      EXPECT_NE(st.error().message.find("rank 0"), std::string::npos);
      EXPECT_GE(waited, milliseconds(290));
      EXPECT_LT(waited, milliseconds(2300));
    }
    c.set_timeout(milliseconds(10000));
    ASSERT_TRUE(c.barrier().ok());
  });
}

TEST(Tcp, ExposeGetWithOffsetsAndClearErrors) {
  constexpr int kWorld = 3;
  auto comms = connect_tcp(kWorld);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(kWorld));
  run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) {
    std::vector<float> weights(64);
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = value(r, i, 3);
    ASSERT_TRUE(c.expose("ffn." + std::to_string(r), weights.data(), weights.size() * 4).ok());
    ASSERT_TRUE(c.barrier().ok());
    for (int peer : {(r + 1) % kWorld, r}) {  // a peer, and oneself
      const std::string name = "ffn." + std::to_string(peer);
      std::vector<float> tile(16);
      Status st = c.get(peer, name, 8 * 4, tile.data(), 16 * 4);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      for (std::size_t i = 0; i < 16; ++i) ASSERT_EQ(tile[i], value(peer, 8 + i, 3));
      st = c.get(peer, name, 48 * 4, tile.data(), 16 * 4);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      EXPECT_EQ(tile[15], value(peer, 63, 3));
      EXPECT_TRUE(c.get(peer, name, 64 * 4, tile.data(), 0).ok());

      st = c.get(peer, "ffn.nope", 0, tile.data(), 4);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::not_found);
      EXPECT_NE(st.error().message.find("'ffn.nope'"), std::string::npos) << st.error().message;
      EXPECT_NE(st.error().message.find("rank " + std::to_string(peer)), std::string::npos);
      st = c.get(peer, name, 60 * 4, tile.data(), 8 * 4);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
      EXPECT_NE(st.error().message.find("outside region"), std::string::npos) << st.error().message;
      EXPECT_EQ(c.get(peer, name, SIZE_MAX - 2, tile.data(), 8).error().code,
                ErrorCode::invalid_argument);
    }
    std::vector<float> tile(4);
    EXPECT_EQ(c.get(7, "x", 0, tile.data(), 4).error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(c.expose("", weights.data(), 4).error().code, ErrorCode::invalid_argument);
    // A large region, read whole.
    std::vector<float> big(1 << 20);
    for (std::size_t i = 0; i < big.size(); i += 1000) big[i] = value(r, i, 9);
    ASSERT_TRUE(c.expose("big", big.data(), big.size() * 4).ok());
    ASSERT_TRUE(c.barrier().ok());
    const int peer = (r + 1) % kWorld;
    std::vector<float> copy(big.size());
    ASSERT_TRUE(c.get(peer, "big", 0, copy.data(), copy.size() * 4).ok());
    for (std::size_t i = 0; i < big.size(); i += 1000) ASSERT_EQ(copy[i], value(peer, i, 9));

    ASSERT_TRUE(c.barrier().ok());
    ASSERT_TRUE(c.unexpose("ffn." + std::to_string(r)).ok());
    EXPECT_EQ(c.unexpose("ffn." + std::to_string(r)).error().code, ErrorCode::not_found);
    ASSERT_TRUE(c.barrier().ok());
    EXPECT_EQ(c.get(peer, "ffn." + std::to_string(peer), 0, tile.data(), 4).error().code,
              ErrorCode::not_found);
    ASSERT_TRUE(c.barrier().ok());
  });
}

TEST(Tcp, DisagreeingOrBadArgumentsAreInvalidArgumentOnEveryRankAndGroupStaysUsable) {
  constexpr int kWorld = 3;
  auto comms = connect_tcp(kWorld);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(kWorld));
  run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) {
    std::vector<float> data(8, 1.0f), out(kWorld * 8);
    // Count disagreement.
    Status st = c.all_reduce_sum(data.data(), r == 1 ? 5 : 4);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.error().message.find("ranks disagree"), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find("count=5"), std::string::npos) << st.error().message;
    EXPECT_EQ(data[0], 1.0f);  // untouched
    // Op disagreement.
    st = r == 2 ? c.all_gather(data.data(), 4, out.data()) : c.all_reduce_sum(data.data(), 4);
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    // Root disagreement.
    st = c.broadcast(data.data(), 4, r == 0 ? 1 : 0);
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    // Bad arguments on one rank: everyone hears of it.
    st = c.all_gather(r == 2 ? nullptr : data.data(), 4, out.data());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.error().message.find("rank 2 passed bad arguments"), std::string::npos)
        << st.error().message;
    st = c.broadcast(data.data(), 4, 7);
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    std::vector<float> a2a(kWorld * 8, 1.0f);
    st = c.all_to_all(a2a.data(), a2a.data() + 1, 4);  // overlapping
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    // Not poisoned.
    EXPECT_TRUE(c.poisoned().empty());
    st = c.all_reduce_sum(data.data(), 8);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    EXPECT_EQ(data[7], 3.0f);
  });
}

TEST(Tcp, KeyedGroupConnectsAndWrongKeyIsRefused) {
  // Same key on every rank: fine.
  auto ok = connect_tcp(3, [](TcpOptions& o, int) { o.key = "s3cret"; });
  ASSERT_EQ(ok.size(), 3u);
  run_on<TcpCommunicator>(ok, [](TcpCommunicator& c, int) { ASSERT_TRUE(c.barrier().ok()); });

  for (const std::string& wrong : {std::string("other"), std::string()}) {
    TcpOptions o0;
    o0.world_size = 2;
    o0.key = "s3cret";
    o0.timeout = milliseconds(1500);
    auto g0 = TcpGroup::listen(o0);
    ASSERT_TRUE(g0.ok());
    Result<std::unique_ptr<TcpCommunicator>> r0 = make_error(ErrorCode::internal, "unset");
    const auto t0 = Clock::now();
    std::thread master([&] { r0 = g0->connect(); });
    TcpOptions o1;
    o1.rank = 1;
    o1.world_size = 2;
    o1.master_port = g0->port();
    o1.key = wrong;
    o1.timeout = milliseconds(1500);
    auto r1 = TcpGroup::create(o1);
    master.join();
    const auto waited = Clock::now() - t0;
    ASSERT_FALSE(r1.ok());
    EXPECT_EQ(r1.error().code, ErrorCode::invalid_argument) << r1.error().to_string();
    EXPECT_NE(r1.error().message.find("wrong key"), std::string::npos) << r1.error().message;
    // Rank 0 refused it and kept waiting for a rank 1 with the key.
    ASSERT_FALSE(r0.ok());
    EXPECT_EQ(r0.error().code, ErrorCode::io) << r0.error().to_string();
    EXPECT_NE(r0.error().message.find("wrong key"), std::string::npos) << r0.error().message;
    EXPECT_NE(r0.error().message.find("waiting for rank(s) 1"), std::string::npos)
        << r0.error().message;
    EXPECT_LT(waited, milliseconds(1500 + 2000));
  }
}

TEST(Tcp, RendezvousTimesOutNamingTheMissingRank) {
  TcpOptions o0;
  o0.world_size = 3;
  o0.timeout = milliseconds(600);
  auto g0 = TcpGroup::listen(o0);
  ASSERT_TRUE(g0.ok());
  Result<std::unique_ptr<TcpCommunicator>> r0 = make_error(ErrorCode::internal, "unset");
  const auto t0 = Clock::now();
  std::thread master([&] { r0 = g0->connect(); });
  TcpOptions o1 = o0;
  o1.rank = 1;
  o1.master_port = g0->port();
  auto r1 = TcpGroup::create(o1);  // rank 2 never comes
  master.join();
  const auto waited = Clock::now() - t0;
  ASSERT_FALSE(r0.ok());
  EXPECT_EQ(r0.error().code, ErrorCode::io);
  EXPECT_NE(r0.error().message.find("rank(s) 2"), std::string::npos) << r0.error().message;
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().code, ErrorCode::io);
  EXPECT_LT(waited, milliseconds(600 + 2000));

  // Nobody listens at all: bounded too.
  TcpOptions lone;
  lone.rank = 1;
  lone.world_size = 2;
  lone.master_port = g0->port();  // closed by now
  lone.timeout = milliseconds(300);
  const auto t1 = Clock::now();
  auto r = TcpGroup::create(lone);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::io);
  EXPECT_NE(r.error().message.find("cannot reach rank 0"), std::string::npos) << r.error().message;
  EXPECT_LT(Clock::now() - t1, milliseconds(300 + 2000));
}

TEST(Tcp, WorldSizeDisagreementAndDuplicateRankAreRefused) {
  TcpOptions o0;
  o0.world_size = 2;
  o0.timeout = milliseconds(800);
  auto g0 = TcpGroup::listen(o0);
  ASSERT_TRUE(g0.ok());
  std::thread master([&] { (void)g0->connect(); });
  TcpOptions o1 = o0;
  o1.rank = 1;
  o1.world_size = 3;
  o1.master_port = g0->port();
  auto r1 = TcpGroup::create(o1);
  master.join();
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r1.error().message.find("world size"), std::string::npos) << r1.error().message;
}

TEST(Tcp, CollectiveTimeoutIsIoWithinBoundNamesPeerAndPoisonsTheGroup) {
  constexpr int kWorld = 3;
  auto comms = connect_tcp(kWorld);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(kWorld));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld - 1; ++r) {  // rank 2 never joins the collective
    threads.emplace_back([&, r] {
      TcpCommunicator& c = *comms[static_cast<std::size_t>(r)];
      c.set_timeout(milliseconds(300));
      std::vector<float> data(16, 1.0f);
      const auto t0 = Clock::now();
      Status st = c.all_reduce_sum(data.data(), data.size());
      const auto waited = Clock::now() - t0;
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io);
      const std::string& m = st.error().message;
      EXPECT_NE(m.find("all_reduce_sum: rank " + std::to_string(r)), std::string::npos) << m;
      EXPECT_NE(m.find("timed out after 300 ms waiting for rank 2"), std::string::npos) << m;
      EXPECT_GE(waited, milliseconds(290));
      EXPECT_LT(waited, milliseconds(300 + 2000));
      EXPECT_EQ(data[0], 1.0f);
      // Poisoned: later collectives fail at once.
      const auto t1 = Clock::now();
      st = c.barrier();
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io);
      EXPECT_NE(st.error().message.find("poisoned"), std::string::npos) << st.error().message;
      EXPECT_LT(Clock::now() - t1, milliseconds(100));
      EXPECT_FALSE(c.poisoned().empty());
    });
  }
  for (auto& t : threads) t.join();
  // Point to point still works between live ranks.
  float f = 4.0f;
  ASSERT_TRUE(comms[2]->send(&f, sizeof f, 0, 5).ok());
  float g = 0;
  ASSERT_TRUE(comms[0]->recv(&g, sizeof g, 2, 5).ok());
  EXPECT_EQ(g, 4.0f);
}

TEST(Tcp, PeerThatLeavesMidCollectiveIsIoBeforeTheTimeout) {
  constexpr int kWorld = 3;
  auto comms = connect_tcp(kWorld);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(kWorld));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld - 1; ++r) {
    threads.emplace_back([&, r] {
      TcpCommunicator& c = *comms[static_cast<std::size_t>(r)];
      c.set_timeout(milliseconds(20000));  // the departure, not the timeout, ends it
      std::vector<float> data(1000, 1.0f);
      const auto t0 = Clock::now();
      Status st = c.all_gather(data.data(), 10, data.data() + 100);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io);
      EXPECT_NE(st.error().message.find("peer rank 2 is dead"), std::string::npos)
          << st.error().message;
      EXPECT_LT(Clock::now() - t0, milliseconds(5000));
      EXPECT_TRUE(c.peer_dead(2));
      EXPECT_FALSE(c.peer_dead(1 - r));
      // Sends to it fail; recvs from it fail once nothing is queued.
      float f = 0;
      EXPECT_EQ(c.send(&f, sizeof f, 2, 0).error().code, ErrorCode::io);
      EXPECT_EQ(c.get(2, "x", 0, &f, 4).error().code, ErrorCode::io);
    });
  }
  // Rank 2 sends one message, then goes away.
  float last = 42.0f;
  ASSERT_TRUE(comms[2]->send(&last, sizeof last, 0, 8).ok());
  std::this_thread::sleep_for(milliseconds(200));
  comms[2].reset();
  for (auto& t : threads) t.join();
  // Sent before it died: still delivered.
  float got = 0;
  ASSERT_TRUE(comms[0]->recv(&got, sizeof got, 2, 8).ok());
  EXPECT_EQ(got, 42.0f);
  EXPECT_EQ(comms[0]->recv(&got, sizeof got, 2, 8).error().code, ErrorCode::io);
}

TEST(Tcp, BytesSentCountsPayloads) {
  constexpr int kWorld = 4;
  constexpr std::size_t kN = 1000;
  auto comms = connect_tcp(kWorld);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(kWorld));
  run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) {
    ASSERT_TRUE(c.barrier().ok());
    const std::uint64_t before = c.bytes_sent();
    std::vector<float> a(kN, 1.0f), g(kWorld * kN);
    ASSERT_TRUE(c.all_gather(a.data(), kN, g.data()).ok());
    EXPECT_EQ(c.bytes_sent() - before, (kWorld - 1) * kN * 4);
    const std::uint64_t mid = c.bytes_sent();
    ASSERT_TRUE(c.all_reduce_sum(a.data(), kN).ok());
    // (count - slice) + (world - 1) * slice floats; slice = 250 here.
    EXPECT_EQ(c.bytes_sent() - mid, ((kN - 250) + 3 * 250) * 4);
  });
  // The in-process backend counts the same way.
  auto g = InProcGroup::create(kWorld).value();
  std::vector<std::unique_ptr<Communicator>> ic;
  for (int r = 0; r < kWorld; ++r) ic.push_back(g->communicator(r).value());
  run_on<Communicator>(ic, [&](Communicator& c, int r) {
    std::vector<float> a(kN, 1.0f), gathered(kWorld * kN);
    ASSERT_TRUE(c.all_gather(a.data(), kN, gathered.data()).ok());
    EXPECT_EQ(c.bytes_sent(), (kWorld - 1) * kN * 4);
    ASSERT_TRUE(c.all_reduce_sum(a.data(), kN).ok());
    EXPECT_EQ(c.bytes_sent(), (kWorld - 1) * kN * 4 + ((kN - 250) + 3 * 250) * 4);
  });
}

TEST(Tcp, WildcardListenAddressIsAdvertisedAsSeen) {
  auto comms = connect_tcp(3, [](TcpOptions& o, int) { o.listen_host = "0.0.0.0"; });
  ASSERT_EQ(comms.size(), 3u);
  run_on<TcpCommunicator>(comms, [](TcpCommunicator& c, int r) {
    float v = static_cast<float>(r);
    ASSERT_TRUE(c.all_reduce_sum(&v, 1).ok());
    EXPECT_EQ(v, 3.0f);
  });
}

TEST(Tcp, ManyRepeatedCollectivesWithoutDeadlock) {
  constexpr int kWorld = 4;
  constexpr int kIters = 400;
  constexpr std::size_t kN = 37;
  const auto ref = ref_sum(iota_ids(kWorld), 0, kN);
  auto comms = connect_tcp(kWorld);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(kWorld));
  run_on<TcpCommunicator>(comms, [&](TcpCommunicator& c, int r) { repeated_collective_mix(c, r, kWorld, kIters, ref); });
}

}  // namespace
}  // namespace shardline::comm
