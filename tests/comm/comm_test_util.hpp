#pragma once
// Helpers shared by the communicator tests: deterministic values whose sums
// show the summation order, bitwise comparison, rank-order references, and a
// TCP group of threads over loopback.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/tcp.hpp"

namespace shardline::comm::testing {

/// Deterministic values spanning many magnitudes, so summation order shows.
inline float value(int rank, std::size_t i, int salt = 0) {
  std::uint32_t x = static_cast<std::uint32_t>(rank) * 2654435761u ^
                    static_cast<std::uint32_t>(i) * 40503u ^ static_cast<std::uint32_t>(salt) * 97u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  const float mant = static_cast<float>(x & 0xffffu) / 65536.0f - 0.5f;
  const int exp = static_cast<int>((x >> 16) % 24) - 12;
  return std::ldexp(mant, exp);
}

inline bool bits_equal(const float* a, const float* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

/// Serial reference: for each i, sum in order over ids of value(id, base + i).
inline std::vector<float> ref_sum(const std::vector<int>& ids, std::size_t base, std::size_t n,
                                  int salt = 0) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    float acc = value(ids[0], base + i, salt);
    for (std::size_t k = 1; k < ids.size(); ++k) acc += value(ids[k], base + i, salt);
    out[i] = acc;
  }
  return out;
}

inline std::vector<int> iota_ids(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

/// ref_sum over ranks 0..world-1.
inline std::vector<float> ref_sum(int world, std::size_t base, std::size_t n, int salt = 0) {
  return ref_sum(iota_ids(world), base, n, salt);
}

/// `iters` rounds on one rank of a `world`-rank group: an all-reduce of
/// value(rank, i) that must equal `ref` bit for bit, then an all-gather, a
/// broadcast from a moving root or a barrier in turn (no deadlock, no drift).
inline void repeated_collective_mix(Communicator& c, int rank, int world, int iters, const std::vector<float>& ref) {
  const std::size_t n = ref.size();
  std::vector<float> data(n), gathered(static_cast<std::size_t>(world) * n);
  for (int it = 0; it < iters; ++it) {
    for (std::size_t i = 0; i < n; ++i) data[i] = value(rank, i);
    Status st = c.all_reduce_sum(data.data(), n);
    ASSERT_TRUE(st.ok()) << "iteration " << it << ": " << st.error().to_string();
    ASSERT_TRUE(bits_equal(data.data(), ref.data(), n)) << "iteration " << it;
    switch (it % 3) {
      case 0: st = c.all_gather(data.data(), n, gathered.data()); break;
      case 1: st = c.broadcast(data.data(), n, it % world); break;
      default: st = c.barrier(); break;
    }
    ASSERT_TRUE(st.ok()) << "iteration " << it << ": " << st.error().to_string();
  }
}

/// Connects `world` ranks over loopback, one thread each (rank 0 on an
/// ephemeral port); `tweak(options, rank)` may change each rank's options.
inline std::vector<std::unique_ptr<TcpCommunicator>> connect_tcp(
    int world, const std::function<void(TcpOptions&, int)>& tweak = {},
    std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  std::vector<std::unique_ptr<TcpCommunicator>> comms(static_cast<std::size_t>(world));
  TcpOptions o0;
  o0.rank = 0;
  o0.world_size = world;
  o0.timeout = timeout;
  if (tweak) tweak(o0, 0);
  auto g0 = TcpGroup::listen(o0);
  EXPECT_TRUE(g0.ok()) << g0.error().to_string();
  if (!g0.ok()) return {};
  const int port = g0->port();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Result<std::unique_ptr<TcpCommunicator>> c = [&]() -> Result<std::unique_ptr<TcpCommunicator>> {
        if (r == 0) return g0->connect();
        TcpOptions o;
        o.rank = r;
        o.world_size = world;
        o.master_port = port;
        o.timeout = timeout;
        if (tweak) tweak(o, r);
        return TcpGroup::create(o);
      }();
      if (c.ok()) comms[static_cast<std::size_t>(r)] = std::move(c).value();
      else errors[static_cast<std::size_t>(r)] = c.error().to_string();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(errors[static_cast<std::size_t>(r)].empty())
        << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
    if (!errors[static_cast<std::size_t>(r)].empty()) return {};
  }
  return comms;
}

/// Runs fn(comm, rank) on one thread per communicator.
template <class C>
void run_on(std::vector<std::unique_ptr<C>>& comms,
            const std::function<void(C&, int)>& fn) {
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { fn(*comms[r], static_cast<int>(r)); });
  }
  for (auto& t : threads) t.join();
}

}  // namespace shardline::comm::testing
