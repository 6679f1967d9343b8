// Link emulation: the LinkModel's reservation arithmetic with an injected
// clock (exact, no sleeping), LinkSpec checks, and the PacedCommunicator
// over an in-process group (data forwarded unchanged, real-time lower bounds
// only: upper bounds on timing flake on a shared machine).
#include "comm/paced.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"

namespace shardline::comm {
namespace comm_paced_test {

using std::chrono::nanoseconds;
using TimePoint = LinkModel::TimePoint;
using Clock = LinkModel::Clock;

const TimePoint kT0 = TimePoint{} + std::chrono::seconds(1000);

std::shared_ptr<LinkModel> model(int world, double gbps, double latency_us = 0) {
  auto m = LinkModel::create(world, LinkSpec{gbps, latency_us});
  EXPECT_TRUE(m.ok()) << m.error().to_string();
  return m.ok() ? m.value() : nullptr;
}

/// Nanoseconds after kT0 at which a transfer reserved at `now` ends.
std::int64_t end_ns(LinkModel& m, int src, int dst, std::uint64_t bytes, TimePoint now = kT0) {
  auto end = m.reserve(src, dst, bytes, now);
  EXPECT_TRUE(end.ok()) << end.error().to_string();
  if (!end.ok()) return -1;
  return std::chrono::duration_cast<nanoseconds>(end.value() - kT0).count();
}

// ---- LinkSpec ---------------------------------------------------------------

TEST(LinkSpec, ValidateRejectsBadValuesWithClearErrors) {
  EXPECT_TRUE(validate(LinkSpec{900, 0}).ok());
  EXPECT_TRUE(validate(LinkSpec{0.5, 2.5}).ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double gbps : {0.0, -1.0, nan, inf}) {
    Status st = validate(LinkSpec{gbps, 1});
    ASSERT_FALSE(st.ok()) << gbps;
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.error().message.find("bandwidth"), std::string::npos) << st.error().message;
  }
  for (double lat : {-0.001, nan, inf}) {
    Status st = validate(LinkSpec{1, lat});
    ASSERT_FALSE(st.ok()) << lat;
    EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st.error().message.find("latency"), std::string::npos) << st.error().message;
  }
  EXPECT_EQ(LinkModel::create(2, LinkSpec{0, 0}).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(LinkModel::create(2, LinkSpec{1, -1}).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(LinkModel::create(0, LinkSpec{1, 0}).error().code, ErrorCode::invalid_argument);
}

TEST(LinkSpec, ParseReadsBothNumbersAndRejectsJunk) {
  auto spec = parse_link_spec("3.8", "1.5");
  ASSERT_TRUE(spec.ok()) << spec.error().to_string();
  EXPECT_EQ(spec->gbps, 3.8);
  EXPECT_EQ(spec->latency_us, 1.5);
  auto zero_latency = parse_link_spec("900", "0");
  ASSERT_TRUE(zero_latency.ok());
  EXPECT_EQ(zero_latency->latency_us, 0.0);
  const std::pair<const char*, const char*> bad[] = {
      {"", "1"}, {"abc", "1"}, {"3.8x", "1"}, {" 3.8", "1"}, {"0", "1"}, {"-2", "1"},
      {"inf", "1"}, {"nan", "1"}, {"1", ""}, {"1", "-1"}, {"1", "1us"}};
  for (const auto& [bw, lat] : bad) {
    auto r = parse_link_spec(bw, lat);
    ASSERT_FALSE(r.ok()) << "'" << bw << "', '" << lat << "'";
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find("link spec"), std::string::npos) << r.error().message;
  }
}

// ---- LinkModel reservation arithmetic ------------------------------------------

TEST(LinkModel, TransferTimeIsLatencyPlusBytesOverBandwidth) {
  auto m = model(2, 2.0, 1.0);  // 2 bytes/ns, 1000 ns latency
  ASSERT_TRUE(m);
  EXPECT_EQ(m->transfer_time(0), nanoseconds(1000));
  EXPECT_EQ(m->transfer_time(1000), nanoseconds(1500));
  EXPECT_EQ(m->transfer_time(3), nanoseconds(1002));  // 1001.5 ns rounds half up
  auto h200 = model(2, 900.0, 0.0);
  ASSERT_TRUE(h200);
  EXPECT_EQ(h200->transfer_time(900'000'000), nanoseconds(1'000'000));  // 0.9 GB at 900 GB/s: 1 ms
}

TEST(LinkModel, SingleTransferOnAnIdleLinkStartsNow) {
  auto m = model(2, 2.0, 1.0);
  ASSERT_TRUE(m);
  EXPECT_EQ(end_ns(*m, 0, 1, 1000), 1500);
}

TEST(LinkModel, BackToBackTransfersOnOneLinkQueue) {
  auto m = model(2, 1.0);
  ASSERT_TRUE(m);
  EXPECT_EQ(end_ns(*m, 0, 1, 1000), 1000);
  EXPECT_EQ(end_ns(*m, 0, 1, 1000), 2000);
  // Issued at 500, while the link is busy until 2000.
  EXPECT_EQ(end_ns(*m, 0, 1, 500, kT0 + nanoseconds(500)), 2500);
  // Issued after the link went idle: starts when issued.
  EXPECT_EQ(end_ns(*m, 0, 1, 100, kT0 + nanoseconds(10'000)), 10'100);
}

TEST(LinkModel, ThreeReadersOfOneOwnerSerializeOnItsEgress) {
  auto m = model(4, 1.0);
  ASSERT_TRUE(m);
  EXPECT_EQ(end_ns(*m, 0, 1, 1000), 1000);
  EXPECT_EQ(end_ns(*m, 0, 2, 1000), 2000);
  EXPECT_EQ(end_ns(*m, 0, 3, 1000), 3000);
}

TEST(LinkModel, ReadersOfDifferentOwnersRunInParallel) {
  auto m = model(4, 1.0);
  ASSERT_TRUE(m);
  EXPECT_EQ(end_ns(*m, 0, 1, 1000), 1000);
  EXPECT_EQ(end_ns(*m, 2, 3, 1000), 1000);
  // Full duplex: the reverse directions are separate ports.
  EXPECT_EQ(end_ns(*m, 1, 0, 1000), 1000);
  EXPECT_EQ(end_ns(*m, 3, 2, 1000), 1000);
}

TEST(LinkModel, ReaderPullingFromTwoOwnersSerializesOnItsIngress) {
  auto m = model(3, 1.0);
  ASSERT_TRUE(m);
  EXPECT_EQ(end_ns(*m, 0, 2, 1000), 1000);
  EXPECT_EQ(end_ns(*m, 1, 2, 1000), 2000);
  // Owner 1's egress is held until 2000 by that transfer too.
  EXPECT_EQ(end_ns(*m, 1, 0, 1000), 3000);
}

TEST(LinkModel, LatencyIsAddedToEveryTransfer) {
  auto m = model(3, 1.0, 2.0);  // 1 byte/ns, 2000 ns latency
  ASSERT_TRUE(m);
  EXPECT_EQ(end_ns(*m, 0, 1, 100), 2100);
  EXPECT_EQ(end_ns(*m, 0, 1, 100), 4200);
  EXPECT_EQ(end_ns(*m, 0, 2, 0), 6200);  // an empty transfer still pays latency
}

TEST(LinkModel, SelfTransferUsesNoLinkAndBadRanksFail) {
  auto m = model(2, 1.0, 5.0);
  ASSERT_TRUE(m);
  EXPECT_EQ(end_ns(*m, 1, 1, 1'000'000), 0);
  EXPECT_EQ(end_ns(*m, 0, 1, 1000), 6000);  // rank 1's ingress was not taken
  for (auto [src, dst] : {std::pair{-1, 0}, {0, 2}, {2, 0}, {0, -1}}) {
    auto r = m->reserve(src, dst, 1, kT0);
    ASSERT_FALSE(r.ok()) << src << " -> " << dst;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  }
}

// ---- PacedCommunicator --------------------------------------------------------

struct PacedGroup {
  std::vector<std::unique_ptr<Communicator>> inner;
  std::vector<std::unique_ptr<PacedCommunicator>> paced;
};

PacedGroup paced_group(int world, LinkSpec spec) {
  PacedGroup g;
  auto group = InProcGroup::create(world).value();
  auto link = LinkModel::create(world, spec).value();
  for (int r = 0; r < world; ++r) {
    g.inner.push_back(group->communicator(r).value());
    g.paced.push_back(PacedCommunicator::create(*g.inner.back(), link).value());
  }
  return g;
}

void run_paced(PacedGroup& g, const std::function<void(PacedCommunicator&, int)>& fn) {
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < g.paced.size(); ++r) {
    threads.emplace_back([&, r] { fn(*g.paced[r], static_cast<int>(r)); });
  }
  for (auto& t : threads) t.join();
}

std::vector<std::uint8_t> pattern(std::size_t n, int salt) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 131 + salt * 7) ^ (i >> 8));
  return v;
}

TEST(PacedCommunicator, CreateChecksTheLinkModel) {
  auto group = InProcGroup::create(2).value();
  auto c = group->communicator(0).value();
  EXPECT_EQ(PacedCommunicator::create(*c, nullptr).error().code, ErrorCode::invalid_argument);
  auto wrong = PacedCommunicator::create(*c, LinkModel::create(3, LinkSpec{1, 0}).value());
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::invalid_argument);
  auto ok = PacedCommunicator::create(*c, LinkModel::create(2, LinkSpec{1, 0}).value());
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->rank(), 0);
  EXPECT_EQ((*ok)->world_size(), 2);
  (*ok)->set_timeout(std::chrono::milliseconds(1234));
  EXPECT_EQ(c->timeout(), std::chrono::milliseconds(1234));
  EXPECT_EQ((*ok)->timeout(), std::chrono::milliseconds(1234));
}

TEST(PacedCommunicator, ForwardsGetSendRecvAndCollectivesUnchanged) {
  constexpr std::size_t kBytes = 10'000;
  PacedGroup g = paced_group(3, LinkSpec{100.0, 1.0});  // fast: pacing is ~0.1 ms
  run_paced(g, [&](PacedCommunicator& c, int r) {
    const std::vector<std::uint8_t> mine = pattern(kBytes, r);
    ASSERT_TRUE(c.expose("w", mine.data(), mine.size()).ok());
    ASSERT_TRUE(c.barrier().ok());
    const int owner = (r + 1) % 3;
    const std::vector<std::uint8_t> theirs = pattern(kBytes, owner);
    std::vector<std::uint8_t> got(kBytes);
    Status st = c.get(owner, "w", 0, got.data(), kBytes);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    EXPECT_EQ(std::memcmp(got.data(), theirs.data(), kBytes), 0);
    std::vector<std::uint8_t> part(100);
    ASSERT_TRUE(c.get(owner, "w", 777, part.data(), part.size()).ok());
    EXPECT_EQ(std::memcmp(part.data(), theirs.data() + 777, part.size()), 0);
    // Errors pass through and move nothing over the link.
    EXPECT_EQ(c.get(owner, "nope", 0, got.data(), 1).error().code, ErrorCode::not_found);
    EXPECT_EQ(c.get(owner, "w", kBytes, got.data(), 1).error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(c.get(3, "w", 0, got.data(), 1).error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(c.send(mine.data(), 1, -1, 0).error().code, ErrorCode::invalid_argument);
    // A get of one's own region is not paced.
    ASSERT_TRUE(c.get(r, "w", 0, got.data(), kBytes).ok());
    EXPECT_EQ(std::memcmp(got.data(), mine.data(), kBytes), 0);

    // Point to point around the ring.
    ASSERT_TRUE(c.send(mine.data(), kBytes, (r + 1) % 3, 5).ok());
    const int from = (r + 2) % 3;
    std::vector<std::uint8_t> in(kBytes);
    st = c.recv(in.data(), kBytes, from, 5);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    const std::vector<std::uint8_t> expect = pattern(kBytes, from);
    EXPECT_EQ(std::memcmp(in.data(), expect.data(), kBytes), 0);

    // Collectives and accounting are the inner communicator's.
    std::vector<float> v = {static_cast<float>(r), 1.0f};
    ASSERT_TRUE(c.all_reduce_sum(v.data(), v.size()).ok());
    EXPECT_EQ(v[0], 3.0f);
    EXPECT_EQ(v[1], 3.0f);
    ASSERT_TRUE(c.barrier().ok());
    EXPECT_EQ(c.paced_bytes(), kBytes + 100 + kBytes);  // two gets, one send
    EXPECT_EQ(c.bytes_sent(), g.inner[static_cast<std::size_t>(r)]->bytes_sent());
    EXPECT_GT(c.bytes_sent(), 0u);
    ASSERT_TRUE(c.unexpose("w").ok());
    EXPECT_EQ(c.unexpose("w").error().code, ErrorCode::not_found);
  });
}

// Real time, lower bounds only. 0.02 GB/s: 100 kB take 5 ms.
constexpr double kSlowGbps = 0.02;
constexpr std::size_t kSlowBytes = 100'000;
const auto kSlowTransfer = std::chrono::milliseconds(5);

TEST(PacedCommunicator, GetTakesAtLeastBytesOverBandwidthAndIncastSerializes) {
  PacedGroup g = paced_group(3, LinkSpec{kSlowGbps, 0});
  std::vector<Clock::time_point> entered(3), done(3);
  const std::vector<std::uint8_t> region = pattern(kSlowBytes, 9);
  run_paced(g, [&](PacedCommunicator& c, int r) {
    if (r == 0) {
      ASSERT_TRUE(c.expose("w", region.data(), region.size()).ok());
    }
    entered[static_cast<std::size_t>(r)] = Clock::now();
    ASSERT_TRUE(c.barrier().ok());
    if (r != 0) {
      std::vector<std::uint8_t> got(kSlowBytes);
      const auto t0 = Clock::now();
      ASSERT_TRUE(c.get(0, "w", 0, got.data(), got.size()).ok());
      done[static_cast<std::size_t>(r)] = Clock::now();
      EXPECT_GE(done[static_cast<std::size_t>(r)] - t0, kSlowTransfer);
      EXPECT_EQ(c.paced_bytes(), kSlowBytes);
      EXPECT_GT(c.link_wait_ns(), 0u);
    }
    ASSERT_TRUE(c.barrier().ok());
  });
  // Both readers issued after everyone entered the barrier; they share rank
  // 0's egress, so the later one is done two transfers after that.
  const auto last_entered = std::max({entered[0], entered[1], entered[2]});
  EXPECT_GE(std::max(done[1], done[2]) - last_entered, 2 * kSlowTransfer);
}

TEST(PacedCommunicator, GetAndSendLeavingOneRankShareItsEgress) {
  // Rank 1 gets from rank 0 while rank 0 sends to rank 2: both leave rank 0
  // (a get is a transfer owner -> reader), so they serialize.
  PacedGroup g = paced_group(3, LinkSpec{kSlowGbps, 0});
  std::vector<Clock::time_point> entered(3), done(3);
  const std::vector<std::uint8_t> region = pattern(kSlowBytes, 4);
  run_paced(g, [&](PacedCommunicator& c, int r) {
    if (r == 0) {
      ASSERT_TRUE(c.expose("w", region.data(), region.size()).ok());
    }
    entered[static_cast<std::size_t>(r)] = Clock::now();
    ASSERT_TRUE(c.barrier().ok());
    std::vector<std::uint8_t> buf(kSlowBytes);
    if (r == 0) {
      ASSERT_TRUE(c.send(region.data(), region.size(), 2, 1).ok());
    } else if (r == 1) {
      ASSERT_TRUE(c.get(0, "w", 0, buf.data(), buf.size()).ok());
    } else {
      ASSERT_TRUE(c.recv(buf.data(), buf.size(), 0, 1).ok());
    }
    done[static_cast<std::size_t>(r)] = Clock::now();
    ASSERT_TRUE(c.barrier().ok());
  });
  const auto last_entered = std::max({entered[0], entered[1], entered[2]});
  EXPECT_GE(std::max(done[1], done[2]) - last_entered, 2 * kSlowTransfer);
}

TEST(PacedCommunicator, SendIsDeliveredNoEarlierThanTheLinkAllows) {
  PacedGroup g = paced_group(2, LinkSpec{kSlowGbps, 1000.0});  // + 1 ms latency
  const std::vector<std::uint8_t> msg = pattern(kSlowBytes, 3);
  run_paced(g, [&](PacedCommunicator& c, int r) {
    const auto entered = Clock::now();
    ASSERT_TRUE(c.barrier().ok());
    if (r == 0) {
      ASSERT_TRUE(c.send(msg.data(), msg.size(), 1, 0).ok());
      EXPECT_GE(Clock::now() - entered, kSlowTransfer + std::chrono::milliseconds(1));
      EXPECT_EQ(c.paced_bytes(), kSlowBytes);
    } else {
      std::vector<std::uint8_t> in(kSlowBytes);
      ASSERT_TRUE(c.recv(in.data(), in.size(), 0, 0).ok());
      // The sender issued after this rank entered the barrier.
      EXPECT_GE(Clock::now() - entered, kSlowTransfer + std::chrono::milliseconds(1));
      EXPECT_EQ(std::memcmp(in.data(), msg.data(), kSlowBytes), 0);
      EXPECT_EQ(c.paced_bytes(), 0u);  // recv is not paced on the receiver
    }
  });
}


// ---- paced collectives (the in-process engine groups' TP / SP links) ----------

// A two-rank group on ports {2, 3} of a four-device link: the collectives
// give the inner results, and each one holds the ring link for the bytes
// a ring moves per rank (all_reduce_sum 2 (w-1)/w * count * 4), so it lasts
// at least that long and counts those bytes.
TEST(PacedCommunicator, OwningWithPacedCollectivesPacesTheRingOnItsDevicesPorts) {
  auto group = InProcGroup::create(2).value();
  auto link = LinkModel::create(4, LinkSpec{kSlowGbps, 0}).value();
  std::vector<std::unique_ptr<PacedCommunicator>> paced;
  for (int r = 0; r < 2; ++r) {
    auto c = PacedCommunicator::create(group->communicator(r).value(), link, {2 + r, 3 - r}, true);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    paced.push_back(std::move(c).value());
  }
  constexpr std::size_t kCount = kSlowBytes / 4;  // all_reduce over 2 ranks moves kSlowBytes per rank
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      PacedCommunicator& c = *paced[static_cast<std::size_t>(r)];
      std::vector<float> v(kCount, static_cast<float>(r + 1));
      const auto t0 = Clock::now();
      ASSERT_TRUE(c.all_reduce_sum(v.data(), v.size()).ok());
      EXPECT_GE(Clock::now() - t0, kSlowTransfer);
      EXPECT_EQ(v.front(), 3.0f);
      EXPECT_EQ(v.back(), 3.0f);
      EXPECT_EQ(c.paced_bytes(), kSlowBytes);
      std::vector<float> all(2 * 4);
      const std::vector<float> mine(4, static_cast<float>(r));
      ASSERT_TRUE(c.all_gather(mine.data(), mine.size(), all.data()).ok());
      EXPECT_EQ(all[0], 0.0f);
      EXPECT_EQ(all[4], 1.0f);
      EXPECT_EQ(c.paced_bytes(), kSlowBytes + 16);  // (w-1) * 4 floats
      ASSERT_TRUE(c.barrier().ok());                // latency only
      EXPECT_EQ(c.paced_bytes(), kSlowBytes + 16);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(PacedCommunicator, OwningCreateChecksThePorts) {
  std::vector<std::shared_ptr<InProcGroup>> groups;  // a fresh group per try: a rank is taken once
  const auto fresh = [&](int rank) {
    groups.push_back(InProcGroup::create(2).value());
    return groups.back()->communicator(rank).value();
  };
  auto link = LinkModel::create(3, LinkSpec{1, 0}).value();
  const auto refused = [&](std::vector<int> ports, const std::string& words) {
    auto c = PacedCommunicator::create(fresh(0), link, std::move(ports), true);
    ASSERT_FALSE(c.ok()) << words;
    EXPECT_EQ(c.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(c.error().message.find(words), std::string::npos) << c.error().message;
  };
  refused({0}, "1 link ports for 2 ranks");
  refused({0, 3}, "link port 3 outside the link's 3 ports");
  refused({1, 1}, "link port 1 given twice");
  EXPECT_EQ(PacedCommunicator::create(nullptr, link, {0, 1}, true).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(PacedCommunicator::create(fresh(1), nullptr, {0, 1}, true).error().code, ErrorCode::invalid_argument);
  auto ok = PacedCommunicator::create(fresh(1), link, {2, 0}, true);
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  EXPECT_EQ((*ok)->rank(), 1);
  EXPECT_EQ((*ok)->world_size(), 2);
}

}  // namespace
}  // namespace shardline::comm
