#include "comm/inproc.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/comm/comm_test_util.hpp"

namespace shardline::comm {
namespace comm_inproc_test {

using namespace testing;
using std::chrono::milliseconds;

const int kWorlds[] = {1, 2, 4, 8};
const std::size_t kCounts[] = {0, 1, 7, 33, 1001};

/// Runs fn(comm, rank) on one thread per rank of a fresh group.
void run_ranks(int world, const std::function<void(Communicator&, int)>& fn,
               std::shared_ptr<InProcGroup>* group_out = nullptr) {
  auto group = InProcGroup::create(world);
  ASSERT_TRUE(group.ok()) << group.error().to_string();
  if (group_out) *group_out = *group;
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world; ++r) {
    auto c = (*group)->communicator(r);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    comms.push_back(std::move(c).value());
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(*comms[r], r); });
  for (auto& t : threads) t.join();
}

TEST(InProcGroup, CreateAndTakeErrors) {
  EXPECT_EQ(InProcGroup::create(0).error().code, ErrorCode::invalid_argument);
  auto g = InProcGroup::create(2).value();
  EXPECT_EQ(g->world_size(), 2);
  EXPECT_EQ(g->communicator(2).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(g->communicator(-1).error().code, ErrorCode::invalid_argument);
  auto c = g->communicator(1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->rank(), 1);
  EXPECT_EQ((*c)->world_size(), 2);
  auto again = g->communicator(1);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("already taken"), std::string::npos);
  EXPECT_FALSE(g->mark_dead(5).ok());
}

TEST(InProc, AllReduceSumMatchesSerialRankOrderBitExact) {
  for (int world : kWorlds) {
    for (std::size_t n : kCounts) {
      const auto ref = ref_sum(world, 0, n);
      run_ranks(world, [&](Communicator& c, int r) {
        std::vector<float> data(n);
        for (std::size_t i = 0; i < n; ++i) data[i] = value(r, i);
        const Status st = c.all_reduce_sum(data.data(), n);
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        EXPECT_TRUE(bits_equal(data.data(), ref.data(), n))
            << "world " << world << " count " << n << " rank " << r;
      });
    }
  }
}

TEST(InProc, AllGatherMatchesReferenceAndWorksInPlace) {
  for (int world : kWorlds) {
    for (std::size_t n : kCounts) {
      run_ranks(world, [&](Communicator& c, int r) {
        std::vector<float> send(n), recv(world * n, -1.0f);
        for (std::size_t i = 0; i < n; ++i) send[i] = value(r, i);
        Status st = c.all_gather(send.data(), n, recv.data());
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        for (int k = 0; k < world; ++k)
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(recv[k * n + i], value(k, i)) << "world " << world << " rank " << r;
        // In place: own row already sits in recv.
        std::vector<float> inplace(world * n, 0.0f);
        for (std::size_t i = 0; i < n; ++i) inplace[r * n + i] = value(r, i, 1);
        st = c.all_gather(inplace.data() + r * n, n, inplace.data());
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        for (int k = 0; k < world; ++k)
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(inplace[k * n + i], value(k, i, 1));
      });
    }
  }
}

TEST(InProc, ReduceScatterSumMatchesSerialRankOrderBitExact) {
  for (int world : kWorlds) {
    for (std::size_t n : kCounts) {
      const auto ref = ref_sum(world, 0, world * n);  // row r of the full sum
      run_ranks(world, [&](Communicator& c, int r) {
        std::vector<float> send(world * n);
        for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(r, i);
        std::vector<float> recv(n, -1.0f);
        Status st = c.reduce_scatter_sum(send.data(), recv.data(), n);
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        EXPECT_TRUE(bits_equal(recv.data(), ref.data() + r * n, n))
            << "world " << world << " count " << n << " rank " << r;
        // In place: result lands in row r of send.
        st = c.reduce_scatter_sum(send.data(), send.data() + r * n, n);
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        EXPECT_TRUE(bits_equal(send.data() + r * n, ref.data() + r * n, n));
      });
    }
  }
}

TEST(InProc, AllToAllTransposesRows) {
  for (int world : kWorlds) {
    for (std::size_t n : kCounts) {
      run_ranks(world, [&](Communicator& c, int r) {
        // Row k of rank r's send encodes (sender r, destination k, i).
        std::vector<float> send(world * n), recv(world * n, -1.0f);
        for (int k = 0; k < world; ++k)
          for (std::size_t i = 0; i < n; ++i) send[k * n + i] = value(r, k * 100000 + i);
        const Status st = c.all_to_all(send.data(), recv.data(), n);
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        for (int k = 0; k < world; ++k)
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(recv[k * n + i], value(k, r * 100000 + i))
                << "world " << world << " rank " << r << " row " << k;
      });
    }
  }
}

TEST(InProc, AllToAllRejectsOverlappingBuffersOnEveryRank) {
  run_ranks(2, [&](Communicator& c, int r) {
    std::vector<float> buf(8, 1.0f);
    const Status st = r == 0 ? c.all_to_all(buf.data(), buf.data(), 4)
                             : c.all_to_all(buf.data(), buf.data() + 0, 4);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.error().message.find("overlap"), std::string::npos) << st.error().message;
  });
}

TEST(InProc, BroadcastFromEveryRoot) {
  for (int world : kWorlds) {
    for (std::size_t n : kCounts) {
      for (int root = 0; root < world; ++root) {
        run_ranks(world, [&](Communicator& c, int r) {
          std::vector<float> data(n);
          for (std::size_t i = 0; i < n; ++i) data[i] = value(r, i);
          const Status st = c.broadcast(data.data(), n, root);
          ASSERT_TRUE(st.ok()) << st.error().to_string();
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(data[i], value(root, i));
        });
      }
    }
  }
}

TEST(InProc, BarrierOrdersPhases) {
  std::atomic<int> before{0};
  run_ranks(4, [&](Communicator& c, int) {
    before.fetch_add(1);
    ASSERT_TRUE(c.barrier().ok());
    EXPECT_EQ(before.load(), 4);
  });
}

TEST(InProc, ReductionsAreDeterministicWhateverTheArrivalOrder) {
  constexpr int kWorld = 8;
  constexpr std::size_t kN = 513;
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 3; ++run) {
    std::vector<std::vector<float>> per_rank(kWorld);
    run_ranks(kWorld, [&](Communicator& c, int r) {
      // Vary arrival order between runs.
      std::this_thread::sleep_for(milliseconds(((r + run * 3) % kWorld) * 2));
      std::vector<float> data(kN);
      for (std::size_t i = 0; i < kN; ++i) data[i] = value(r, i, 7);
      ASSERT_TRUE(c.all_reduce_sum(data.data(), kN).ok());
      per_rank[r] = data;
    });
    for (int r = 1; r < kWorld; ++r)
      EXPECT_TRUE(bits_equal(per_rank[r].data(), per_rank[0].data(), kN)) << "rank " << r;
    runs.push_back(per_rank[0]);
  }
  for (const auto& run : runs) EXPECT_TRUE(bits_equal(run.data(), runs[0].data(), kN));
  const auto ref = ref_sum(kWorld, 0, kN, 7);
  EXPECT_TRUE(bits_equal(runs[0].data(), ref.data(), kN));
}

TEST(InProc, DisagreeingRanksAllGetInvalidArgumentAndGroupStaysUsable) {
  run_ranks(3, [&](Communicator& c, int r) {
    std::vector<float> data(8, 1.0f);
    Status st = c.all_reduce_sum(data.data(), r == 2 ? 5 : 8);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.error().message.find("disagree"), std::string::npos) << st.error().message;
    EXPECT_EQ(data[0], 1.0f);  // nothing was touched
    st = c.broadcast(data.data(), 8, 3);  // root out of range on every rank
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("root 3"), std::string::npos) << st.error().message;
    st = c.all_reduce_sum(data.data(), 8);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    EXPECT_EQ(data[0], 3.0f);
  });
}

TEST(InProc, SendRecvWithTagsInBothOrders) {
  run_ranks(2, [&](Communicator& c, int r) {
    c.set_timeout(milliseconds(5000));
    const std::vector<int> a{1, 2, 3}, b{4, 5, 6, 7};
    if (r == 0) {
      // Two tags, received in the opposite order.
      ASSERT_TRUE(c.send(a.data(), a.size() * sizeof(int), 1, 10).ok());
      ASSERT_TRUE(c.send(b.data(), b.size() * sizeof(int), 1, 20).ok());
      // Same tag twice: arrives in order sent.
      const int x = 100, y = 200;
      ASSERT_TRUE(c.send(&x, sizeof x, 1, 30).ok());
      ASSERT_TRUE(c.send(&y, sizeof y, 1, 30).ok());
      // Peer posts its recv first; this send writes straight into it.
      std::this_thread::sleep_for(milliseconds(50));
      ASSERT_TRUE(c.send(b.data(), b.size() * sizeof(int), 1, 40).ok());
      // Reply path.
      int reply = 0;
      ASSERT_TRUE(c.recv(&reply, sizeof reply, 1, 50).ok());
      EXPECT_EQ(reply, 42);
      ASSERT_TRUE(c.send(nullptr, 0, 1, 60).ok());  // empty message
    } else {
      std::vector<int> got_b(4), got_a(3);
      Status st = c.recv(got_b.data(), got_b.size() * sizeof(int), 0, 20);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      st = c.recv(got_a.data(), got_a.size() * sizeof(int), 0, 10);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      EXPECT_EQ(got_a, a);
      EXPECT_EQ(got_b, b);
      int first = 0, second = 0;
      ASSERT_TRUE(c.recv(&first, sizeof first, 0, 30).ok());
      ASSERT_TRUE(c.recv(&second, sizeof second, 0, 30).ok());
      EXPECT_EQ(first, 100);
      EXPECT_EQ(second, 200);
      std::vector<int> direct(4);
      st = c.recv(direct.data(), direct.size() * sizeof(int), 0, 40);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      EXPECT_EQ(direct, b);
      const int reply = 42;
      ASSERT_TRUE(c.send(&reply, sizeof reply, 0, 50).ok());
      ASSERT_TRUE(c.recv(nullptr, 0, 0, 60).ok());
    }
  });
}

TEST(InProc, SendRecvErrors) {
  run_ranks(2, [&](Communicator& c, int r) {
    c.set_timeout(milliseconds(200));
    if (r == 0) {
      const int v[2] = {1, 2};
      ASSERT_TRUE(c.send(v, sizeof v, 1, 1).ok());
      EXPECT_EQ(c.send(v, sizeof v, 2, 1).error().code, ErrorCode::invalid_argument);
      // Self send / recv.
      ASSERT_TRUE(c.send(v, sizeof v, 0, 9).ok());
      int back[2] = {0, 0};
      ASSERT_TRUE(c.recv(back, sizeof back, 0, 9).ok());
      EXPECT_EQ(back[1], 2);
    } else {
      int small = 0;
      Status st = c.recv(&small, sizeof small, 0, 1);  // message is 8 bytes
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::mismatch);
      EXPECT_NE(st.error().message.find("8 bytes"), std::string::npos) << st.error().message;
      int right[2];
      ASSERT_TRUE(c.recv(right, sizeof right, 0, 1).ok());  // message stayed queued
      EXPECT_EQ(right[0], 1);
      // Nobody sends tag 2: bounded wait, clear error.
      const auto t0 = std::chrono::steady_clock::now();
      st = c.recv(&small, sizeof small, 0, 2);
      const auto waited = std::chrono::steady_clock::now() - t0;
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io);
      EXPECT_NE(st.error().message.find("recv: rank 1 timed out"), std::string::npos)
          << st.error().message;
      EXPECT_NE(st.error().message.find("rank 0"), std::string::npos);
      EXPECT_GE(waited, milliseconds(190));
      EXPECT_LT(waited, milliseconds(2000));
    }
  });
}

TEST(InProc, ExposeGetWithOffsetsAndClearErrors) {
  run_ranks(4, [&](Communicator& c, int r) {
    std::vector<float> weights(64);
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = value(r, i, 3);
    ASSERT_TRUE(c.expose("ffn." + std::to_string(r), weights.data(),
                         weights.size() * sizeof(float))
                    .ok());
    ASSERT_TRUE(c.barrier().ok());
    const int peer = (r + 1) % 4;
    const std::string name = "ffn." + std::to_string(peer);
    std::vector<float> tile(16);
    Status st = c.get(peer, name, 8 * sizeof(float), tile.data(), 16 * sizeof(float));
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    for (std::size_t i = 0; i < 16; ++i) ASSERT_EQ(tile[i], value(peer, 8 + i, 3));
    // Last bytes exactly, and an empty read at the end.
    st = c.get(peer, name, 48 * sizeof(float), tile.data(), 16 * sizeof(float));
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    EXPECT_EQ(tile[15], value(peer, 63, 3));
    EXPECT_TRUE(c.get(peer, name, 64 * sizeof(float), tile.data(), 0).ok());

    st = c.get(peer, "ffn.nope", 0, tile.data(), 4);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::not_found);
    EXPECT_NE(st.error().message.find("'ffn.nope'"), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find("rank " + std::to_string(peer)), std::string::npos);

    st = c.get(peer, name, 60 * sizeof(float), tile.data(), 8 * sizeof(float));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.error().message.find("outside region"), std::string::npos) << st.error().message;
    st = c.get(peer, name, SIZE_MAX - 2, tile.data(), 8);  // no overflow
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(c.get(7, name, 0, tile.data(), 4).error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(c.expose("", weights.data(), 4).error().code, ErrorCode::invalid_argument);

    ASSERT_TRUE(c.barrier().ok());
    ASSERT_TRUE(c.unexpose("ffn." + std::to_string(r)).ok());
    EXPECT_EQ(c.unexpose("ffn." + std::to_string(r)).error().code, ErrorCode::not_found);
    ASSERT_TRUE(c.barrier().ok());
    EXPECT_EQ(c.get(peer, name, 0, tile.data(), 4).error().code, ErrorCode::not_found);
  });
}

TEST(InProc, RankThatNeverJoinsTimesOutWithIoNamingOpAndPeer) {
  constexpr int kWorld = 4;
  auto group = InProcGroup::create(kWorld).value();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < kWorld; ++r) comms.push_back(group->communicator(r).value());
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld - 1; ++r) {  // rank 3 never joins
    threads.emplace_back([&, r] {
      Communicator& c = *comms[r];
      c.set_timeout(milliseconds(200));
      std::vector<float> data(16, 1.0f);
      const auto t0 = std::chrono::steady_clock::now();
      const Status st = c.all_reduce_sum(data.data(), data.size());
      const auto waited = std::chrono::steady_clock::now() - t0;
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io);
      const std::string& m = st.error().message;
      EXPECT_NE(m.find("all_reduce_sum"), std::string::npos) << m;
      EXPECT_NE(m.find("rank " + std::to_string(r)), std::string::npos) << m;
      EXPECT_NE(m.find("waiting for rank 3"), std::string::npos) << m;
      EXPECT_GE(waited, milliseconds(190));
      EXPECT_LT(waited, milliseconds(2000));
      EXPECT_EQ(data[0], 1.0f);  // all-or-nothing: not performed
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();

  // The failed collective happened on no rank: once rank 3 shows up, a retry works.
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      comms[r]->set_timeout(milliseconds(5000));
      std::vector<float> data(16, 1.0f);
      const Status st = comms[r]->all_reduce_sum(data.data(), data.size());
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      EXPECT_EQ(data[5], 4.0f);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(InProc, MarkDeadWakesBlockedPeersWithIoError) {
  constexpr int kWorld = 4;
  auto group = InProcGroup::create(kWorld).value();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < kWorld; ++r) comms.push_back(group->communicator(r).value());
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld - 1; ++r) {
    threads.emplace_back([&, r] {
      Communicator& c = *comms[r];
      c.set_timeout(milliseconds(20000));  // the death, not the timeout, ends the wait
      const auto t0 = std::chrono::steady_clock::now();
      Status st;
      if (r == 0) {
        float f = 0;
        st = c.recv(&f, sizeof f, 3, 0);
      } else {
        std::vector<float> data(4, 1.0f);
        st = c.all_gather(data.data(), 1, data.data());
      }
      const auto waited = std::chrono::steady_clock::now() - t0;
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code, ErrorCode::io);
      EXPECT_NE(st.error().message.find(r == 0 ? "recv" : "all_gather"), std::string::npos)
          << st.error().message;
      EXPECT_NE(st.error().message.find("rank 3 is dead"), std::string::npos)
          << st.error().message;
      EXPECT_LT(waited, milliseconds(5000));
    });
  }
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_TRUE(group->abort(3).ok());
  for (auto& t : threads) t.join();
  EXPECT_TRUE(group->is_dead(3));

  // Later calls that need rank 3 fail at once; calls on rank 3 fail too.
  float f = 0;
  EXPECT_EQ(comms[0]->barrier().error().code, ErrorCode::io);
  EXPECT_EQ(comms[0]->send(&f, sizeof f, 3, 0).error().code, ErrorCode::io);
  EXPECT_EQ(comms[0]->get(3, "x", 0, &f, 0).error().code, ErrorCode::io);
  const Status self = comms[3]->barrier();
  ASSERT_FALSE(self.ok());
  EXPECT_NE(self.error().message.find("rank 3 has been marked dead"), std::string::npos)
      << self.error().message;
  // Point to point between live ranks still works.
  ASSERT_TRUE(comms[1]->send(&f, sizeof f, 2, 0).ok());
  EXPECT_TRUE(comms[2]->recv(&f, sizeof f, 1, 0).ok());
}

TEST(InProc, ThousandRepeatedCollectivesWithoutDeadlock) {
  constexpr int kWorld = 8;
  constexpr int kIters = 1000;
  constexpr std::size_t kN = 37;
  const auto ref = ref_sum(kWorld, 0, kN);
  run_ranks(kWorld, [&](Communicator& c, int r) {
    c.set_timeout(milliseconds(30000));
    repeated_collective_mix(c, r, kWorld, kIters, ref);
  });
}

}  // namespace
}  // namespace shardline::comm
