// InProcDeviceCommunicator (model/cuda/inproc_device_comm.hpp): the
// collectives of ranks that are threads sharing one GPU, on device buffers,
// here on the FAKE device (tests/model/cuda/fake_device.hpp) with the ranks
// on threads. Every reduction is bit-identical to the host in-process
// communicator's on the same data (rank order), the copies are exact, a
// disagreement is refused on every rank and the group stays usable. Both
// timings of the fake: work run at once, and deferred to the next
// synchronisation (where a missing stream sync leaves stale data).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "model/cuda/inproc_device_comm.hpp"
#include "tests/model/cuda/dummy_archs.hpp"
#include "tests/model/cuda/fake_device.hpp"

namespace shardline::model {
namespace model_cuda_inproc_device_comm_fake_device_test {

namespace fc = testing_support::fake_cuda;
using kernels::cuda::DeviceBuffer;

constexpr int kRanks = 3;

/// A group of kRanks device communicators over one in-process host group.
std::vector<std::unique_ptr<comm::Communicator>> device_group(int ranks = kRanks) {
  auto group = comm::InProcGroup::create(ranks);
  EXPECT_TRUE(group.ok());
  std::vector<std::unique_ptr<comm::Communicator>> out;
  for (int r = 0; r < ranks; ++r) {
    auto host = (*group)->communicator(r);
    EXPECT_TRUE(host.ok());
    (*host)->set_timeout(std::chrono::seconds(10));
    auto dev = InProcDeviceCommunicator::create(std::move(host).value(), 0);
    EXPECT_TRUE(dev.ok()) << (dev.ok() ? "" : dev.error().to_string());
    out.push_back(std::move(dev).value());
  }
  return out;
}

/// The host in-process communicators' answer, for comparison.
std::vector<std::unique_ptr<comm::Communicator>> host_group(int ranks = kRanks) {
  auto group = comm::InProcGroup::create(ranks);
  EXPECT_TRUE(group.ok());
  std::vector<std::unique_ptr<comm::Communicator>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(std::move((*group)->communicator(r)).value());
  return out;
}

/// Runs fn(rank) on one thread per rank; the statuses by rank.
std::vector<Status> on_ranks(int ranks, const std::function<Status(int)>& fn) {
  std::vector<Status> st(static_cast<std::size_t>(ranks), Status::ok_status());
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { st[static_cast<std::size_t>(r)] = fn(r); });
  for (auto& t : threads) t.join();
  return st;
}

DeviceBuffer device_copy(const std::vector<float>& host) {
  auto b = DeviceBuffer::allocate(host.size() * sizeof(float));
  EXPECT_TRUE(b.ok());
  EXPECT_TRUE(b->copy_from_host(host.data(), host.size() * sizeof(float)).ok());
  return std::move(b).value();
}

/// The uploads above land before a collective reads them: a copy from
/// pageable memory lands at the legacy stream's next synchronisation, which
/// the communicator's own stream does not wait for (the caller's part of
/// the contract; deferred mode catches a missing one).
void settle() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

std::vector<float> host_copy(const DeviceBuffer& b, std::size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(b.copy_to_host(out.data(), n * sizeof(float)).ok());
  return out;
}

/// Data whose sum depends on the order of its adds.
std::vector<float> awkward(int rank, std::size_t n) {
  std::mt19937 rng(static_cast<unsigned>(77 + rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = u(rng) * (i % 3 == 0 ? 1e8f : 1.0f) * (rank % 2 == 0 ? 1.0f : -1.0f) + (i % 7 == 0 ? 1e-3f : 0.0f);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class InProcDeviceComm : public testing_support::FakeDeviceTimingTest {};

INSTANTIATE_TEST_SUITE_P(Timing, InProcDeviceComm, testing_support::fake_timings(),
                         testing_support::fake_timing_name);

TEST_P(InProcDeviceComm, AllReduceIsBitIdenticalToTheHostCommunicatorsRankOrderSum) {
  constexpr std::size_t n = 1001;  // slices of 334, 334, 333
  std::vector<std::vector<float>> want(kRanks);
  {
    auto host = host_group();
    for (int r = 0; r < kRanks; ++r) want[static_cast<std::size_t>(r)] = awkward(r, n);
    const auto st = on_ranks(kRanks, [&](int r) {
      return host[static_cast<std::size_t>(r)]->all_reduce_sum(want[static_cast<std::size_t>(r)].data(), n);
    });
    for (const Status& s : st) ASSERT_TRUE(s.ok());
  }
  std::vector<DeviceBuffer> bufs;
  for (int r = 0; r < kRanks; ++r) bufs.push_back(device_copy(awkward(r, n)));
  settle();
  {
    auto dev = device_group();
    const auto st = on_ranks(kRanks, [&](int r) {
      return dev[static_cast<std::size_t>(r)]->all_reduce_sum(
          static_cast<float*>(bufs[static_cast<std::size_t>(r)].data()), n);
    });
    for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.error().to_string();
    EXPECT_EQ(dev[0]->bytes_sent(), ((n - 334) + 2 * 334) * sizeof(float));
  }
  for (int r = 0; r < kRanks; ++r)
    EXPECT_TRUE(same_bits(host_copy(bufs[static_cast<std::size_t>(r)], n), want[0])) << "rank " << r;
  // The order matters for this data: a sum in another order differs.
  std::vector<float> reversed(n);
  for (std::size_t i = 0; i < n; ++i) reversed[i] = (awkward(2, n)[i] + awkward(1, n)[i]) + awkward(0, n)[i];
  EXPECT_FALSE(same_bits(reversed, want[0])) << "the test data does not tell the orders apart";
}

TEST_P(InProcDeviceComm, GatherScatterAllToAllAndBroadcastMoveTheRightRows) {
  constexpr std::size_t n = 5;
  auto row = [](int rank, int k) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(1000 * rank + 100 * k + static_cast<int>(i));
    return v;
  };
  std::vector<DeviceBuffer> gather, inplace, scatter_send, scatter_recv, a2a_send, a2a_recv, bcast;
  for (int r = 0; r < kRanks; ++r) {
    std::vector<float> rows, in_place(kRanks * n, -1.0f);
    for (int k = 0; k < kRanks; ++k) {
      const auto v = row(r, k);
      rows.insert(rows.end(), v.begin(), v.end());
    }
    const auto mine = row(r, 0);
    std::copy(mine.begin(), mine.end(), in_place.begin() + static_cast<long>(r * n));
    gather.push_back(device_copy(std::vector<float>(kRanks * n, -1.0f)));
    inplace.push_back(device_copy(in_place));
    scatter_send.push_back(device_copy(rows));
    scatter_recv.push_back(device_copy(std::vector<float>(n, -1.0f)));
    a2a_send.push_back(device_copy(rows));
    a2a_recv.push_back(device_copy(std::vector<float>(kRanks * n, -1.0f)));
    bcast.push_back(device_copy(row(r, 9)));
  }
  std::vector<DeviceBuffer> send0;
  for (int r = 0; r < kRanks; ++r) send0.push_back(device_copy(row(r, 0)));
  settle();
  {
    auto dev = device_group();
    const auto st = on_ranks(kRanks, [&](int r) -> Status {
      auto& c = *dev[static_cast<std::size_t>(r)];
      const auto ur = static_cast<std::size_t>(r);
      auto f = [](DeviceBuffer& b) { return static_cast<float*>(b.data()); };
      if (Status s = c.all_gather(f(send0[ur]), n, f(gather[ur])); !s) return s;
      if (Status s = c.all_gather(f(inplace[ur]) + ur * n, n, f(inplace[ur])); !s) return s;
      if (Status s = c.reduce_scatter_sum(f(scatter_send[ur]), f(scatter_recv[ur]), n); !s) return s;
      if (Status s = c.all_to_all(f(a2a_send[ur]), f(a2a_recv[ur]), n); !s) return s;
      return c.broadcast(f(bcast[ur]), n, 2);
    });
    for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.error().to_string();
  }
  for (int r = 0; r < kRanks; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    std::vector<float> all_rows, sum(n, 0.0f), a2a;
    for (int k = 0; k < kRanks; ++k) {
      const auto v = row(k, 0);
      all_rows.insert(all_rows.end(), v.begin(), v.end());
      const auto w = row(k, r);  // row r of rank k's send
      for (std::size_t i = 0; i < n; ++i) sum[i] += w[i];
      a2a.insert(a2a.end(), w.begin(), w.end());
    }
    EXPECT_EQ(host_copy(gather[ur], kRanks * n), all_rows) << "all_gather, rank " << r;
    EXPECT_EQ(host_copy(inplace[ur], kRanks * n), all_rows) << "all_gather in place, rank " << r;
    EXPECT_EQ(host_copy(scatter_recv[ur], n), sum) << "reduce_scatter_sum, rank " << r;
    EXPECT_EQ(host_copy(a2a_recv[ur], kRanks * n), a2a) << "all_to_all, rank " << r;
    EXPECT_EQ(host_copy(bcast[ur], n), row(2, 9)) << "broadcast, rank " << r;
  }
}

TEST_P(InProcDeviceComm, RanksThatDisagreeAreAllRefusedAndTheGroupStaysUsable) {
  std::vector<DeviceBuffer> bufs;
  for (int r = 0; r < kRanks; ++r) bufs.push_back(device_copy(std::vector<float>(8, static_cast<float>(r + 1))));
  settle();
  auto dev = device_group();
  auto f = [&](int r) { return static_cast<float*>(bufs[static_cast<std::size_t>(r)].data()); };
  const auto bad = on_ranks(kRanks, [&](int r) {
    return dev[static_cast<std::size_t>(r)]->all_reduce_sum(f(r), r == 1 ? 4 : 8);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_FALSE(bad[static_cast<std::size_t>(r)].ok()) << "rank " << r;
    EXPECT_EQ(bad[static_cast<std::size_t>(r)].error().code, ErrorCode::invalid_argument);
    EXPECT_NE(bad[static_cast<std::size_t>(r)].error().message.find("disagree"), std::string::npos);
    EXPECT_EQ(host_copy(bufs[static_cast<std::size_t>(r)], 8), std::vector<float>(8, static_cast<float>(r + 1)))
        << "a refused call changed rank " << r << "'s data";
  }
  const auto good = on_ranks(kRanks, [&](int r) { return dev[static_cast<std::size_t>(r)]->all_reduce_sum(f(r), 8); });
  for (const Status& s : good) ASSERT_TRUE(s.ok());
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(host_copy(bufs[static_cast<std::size_t>(r)], 8), std::vector<float>(8, 6.0f));
  EXPECT_TRUE(dev[0]->on_device());
  EXPECT_FALSE(host_group(1)[0]->on_device());
}

// One-sided get (SiDP's WaS fetch, seed 002 §4.2): rank 1 exposes a device
// region; rank 0 reads a slice of it into its own device buffer with a
// device copy, without rank 1 taking part; the bytes are exact. Ranks on
// one GPU and on two (a peer copy). Unknown regions are not_found, ranges
// outside the region and host memory invalid_argument; an unexposed region
// is gone; a dead peer is io.
TEST_P(InProcDeviceComm, GetCopiesAPeersExposedDeviceRegion) {
  fc::set_device_count(2);
  for (int second_gpu : {0, 1}) {
    auto group = comm::InProcGroup::create(2);
    ASSERT_TRUE(group.ok());
    std::vector<std::unique_ptr<comm::Communicator>> dev;
    for (int r = 0; r < 2; ++r) {
      auto d = InProcDeviceCommunicator::create(std::move((*group)->communicator(r)).value(), r == 1 ? second_gpu : 0);
      ASSERT_TRUE(d.ok()) << d.error().to_string();
      dev.push_back(std::move(d).value());
    }
    ASSERT_EQ(cudaSetDevice(second_gpu), cudaSuccess);
    const std::vector<float> weights = awkward(1, 1000);
    DeviceBuffer region = device_copy(weights);
    settle();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    DeviceBuffer slot = device_copy(std::vector<float>(300, -7.0f));
    settle();
    ASSERT_TRUE(dev[1]->expose("sidp.ffn.3", region.data(), 1000 * sizeof(float)).ok());
    ASSERT_TRUE(dev[0]->get(1, "sidp.ffn.3", 200 * sizeof(float), slot.data(), 300 * sizeof(float)).ok());
    const std::vector<float> got = host_copy(slot, 300);
    EXPECT_TRUE(same_bits(got, std::vector<float>(weights.begin() + 200, weights.begin() + 500))) << second_gpu;

    EXPECT_EQ(dev[0]->get(1, "sidp.ffn.4", 0, slot.data(), 4).error().code, ErrorCode::not_found);
    EXPECT_EQ(dev[0]->get(1, "sidp.ffn.3", 900 * sizeof(float), slot.data(), 200 * sizeof(float)).error().code,
              ErrorCode::invalid_argument);
    std::vector<float> host(4);
    EXPECT_EQ(dev[0]->get(1, "sidp.ffn.3", 0, host.data(), 16).error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(dev[1]->expose("host", host.data(), 16).error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(host_copy(slot, 300), got) << "a refused get wrote nothing";
    ASSERT_TRUE(dev[1]->unexpose("sidp.ffn.3").ok());
    EXPECT_EQ(dev[0]->get(1, "sidp.ffn.3", 0, slot.data(), 4).error().code, ErrorCode::not_found);
    ASSERT_TRUE(dev[1]->expose("sidp.ffn.3", region.data(), 1000 * sizeof(float)).ok());
    ASSERT_TRUE((*group)->mark_dead(1).ok());
    EXPECT_EQ(dev[0]->get(1, "sidp.ffn.3", 0, slot.data(), 4).error().code, ErrorCode::io);
  }
}

// Send / recv (PP's residual): a rendezvous. The bytes arrive exactly, in
// order per tag; the sender's buffer may change once send returns (the
// receiver has copied it). A recv of another size fails both sides and the
// pair stays usable; bad arguments are refused before anything moves.
TEST_P(InProcDeviceComm, SendAndRecvCopyDeviceBuffersAsARendezvous) {
  constexpr std::size_t n = 37;
  auto src = device_copy(awkward(0, n));
  auto dst = device_copy(std::vector<float>(n, -1.0f));
  auto dst2 = device_copy(std::vector<float>(n, -1.0f));
  auto small = device_copy(std::vector<float>(n - 1, -1.0f));
  settle();
  auto dev = device_group(2);
  auto f = [](DeviceBuffer& b) { return static_cast<float*>(b.data()); };
  const std::vector<float> first = awkward(0, n), second = awkward(1, n);
  const auto st = on_ranks(2, [&](int r) -> Status {
    auto& c = *dev[static_cast<std::size_t>(r)];
    if (r == 0) {
      if (Status s = c.send(f(src), n * 4, 1, 7); !s) return s;
      // Returned: rank 1 holds the first message, so the buffer is free.
      if (Status s = src.copy_from_host(second.data(), n * 4); !s) return s;
      if (Status s = cudaDeviceSynchronize() == cudaSuccess ? Status::ok_status()
                                                             : make_error(ErrorCode::internal, "sync");
          !s)
        return s;
      return c.send(f(src), n * 4, 1, 7);
    }
    if (Status s = c.recv(f(dst), n * 4, 0, 7); !s) return s;
    return c.recv(f(dst2), n * 4, 0, 7);
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_TRUE(same_bits(host_copy(dst, n), first));
  EXPECT_TRUE(same_bits(host_copy(dst2, n), second));
  EXPECT_EQ(dev[0]->bytes_sent(), 2 * n * 4);

  const auto mismatch = on_ranks(2, [&](int r) -> Status {
    auto& c = *dev[static_cast<std::size_t>(r)];
    return r == 0 ? c.send(f(src), n * 4, 1, 3) : c.recv(f(small), (n - 1) * 4, 0, 3);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(mismatch[static_cast<std::size_t>(r)].ok()) << "rank " << r;
    EXPECT_EQ(mismatch[static_cast<std::size_t>(r)].error().code, ErrorCode::invalid_argument);
  }
  EXPECT_NE(mismatch[1].error().message.find("which sent 148 bytes"), std::string::npos)
      << mismatch[1].error().message;
  EXPECT_EQ(host_copy(small, n - 1), std::vector<float>(n - 1, -1.0f)) << "a refused recv wrote";
  const auto again = on_ranks(2, [&](int r) -> Status {
    auto& c = *dev[static_cast<std::size_t>(r)];
    return r == 0 ? c.send(f(src), n * 4, 1, 3) : c.recv(f(dst), n * 4, 0, 3);
  });
  for (const Status& s : again) ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_TRUE(same_bits(host_copy(dst, n), second));

  EXPECT_EQ(dev[0]->send(f(src), 4, 1, -1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(dev[0]->send(f(src), 4, 0, 1).error().code, ErrorCode::invalid_argument);  // itself
  EXPECT_EQ(dev[0]->recv(nullptr, 4, 1, 1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(dev[1]->recv(f(dst), 4, 2, 1).error().code, ErrorCode::invalid_argument);
}

// Send / recv between ranks on two GPUs of the process (SiDP's CaS rows on
// `cuda:0,1`): the receiver's copy is a peer copy; the bytes are exact and
// neither side reports an anomaly.
TEST_P(InProcDeviceComm, SendAndRecvCrossTwoGpus) {
  fc::set_device_count(2);
  auto group = comm::InProcGroup::create(2);
  ASSERT_TRUE(group.ok());
  std::vector<std::unique_ptr<InProcDeviceCommunicator>> dev;
  for (int r = 0; r < 2; ++r) {
    auto d = InProcDeviceCommunicator::create(std::move((*group)->communicator(r)).value(), r);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    dev.push_back(std::move(d).value());
  }
  EXPECT_EQ(dev[1]->device(), 1);
  constexpr std::size_t n = 53;
  const std::vector<float> sent = awkward(3, n);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  DeviceBuffer src = device_copy(sent);
  settle();
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  DeviceBuffer dst = device_copy(std::vector<float>(n, -1.0f));
  settle();
  const auto st = on_ranks(2, [&](int r) -> Status {
    if (cudaSetDevice(r) != cudaSuccess) return make_error(ErrorCode::internal, "set device");
    return r == 0 ? dev[0]->send(src.data(), n * 4, 1, 5) : dev[1]->recv(dst.data(), n * 4, 0, 5);
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.error().to_string();
  EXPECT_TRUE(same_bits(host_copy(dst, n), sent));
  EXPECT_TRUE(fc::anomalies().empty()) << fc::anomalies().front();
}

TEST_P(InProcDeviceComm, BoundToTheRanksStreamsCollectivesQueueBehindTheirWorkWithTheSameBits) {
  // Each rank writes its inputs with copies queued on its own stream (never
  // synchronised before a call) and runs five rounds of every collective
  // bound to that stream, the inputs rewritten each round. In deferred
  // timing nothing has run when a call returns: the results are right only
  // if each rank's stream waits for every peer's staged input, and only if
  // a staging slot is not rewritten before every peer has read it.
  constexpr std::size_t n = 257;
  constexpr int kRounds = 5;
  const auto input = [](int rank, int round) { return awkward(rank + 10 * round, kRanks * n); };
  // The host communicators' answers, round by round.
  std::vector<std::vector<std::vector<float>>> want(kRanks, std::vector<std::vector<float>>(kRounds * 5));
  {
    auto host = host_group();
    const auto st = on_ranks(kRanks, [&](int r) -> Status {
      for (int round = 0; round < kRounds; ++round) {
        std::vector<float> in = input(r, round);
        std::vector<float> sum(in.begin(), in.begin() + n);
        if (Status s = host[static_cast<std::size_t>(r)]->all_reduce_sum(sum.data(), n); !s) return s;
        std::vector<float> gathered(kRanks * n);
        if (Status s = host[static_cast<std::size_t>(r)]->all_gather(in.data(), n, gathered.data()); !s) return s;
        std::vector<float> a2a(kRanks * n);
        if (Status s = host[static_cast<std::size_t>(r)]->all_to_all(in.data(), a2a.data(), n); !s) return s;
        std::vector<float> scattered(n);
        if (Status s = host[static_cast<std::size_t>(r)]->reduce_scatter_sum(in.data(), scattered.data(), n); !s)
          return s;
        std::vector<float> bcast(in.begin(), in.begin() + n);
        if (Status s = host[static_cast<std::size_t>(r)]->broadcast(bcast.data(), n, round % kRanks); !s) return s;
        auto& w = want[static_cast<std::size_t>(r)];
        w[static_cast<std::size_t>(round * 5)] = sum;
        w[static_cast<std::size_t>(round * 5 + 1)] = gathered;
        w[static_cast<std::size_t>(round * 5 + 2)] = a2a;
        w[static_cast<std::size_t>(round * 5 + 3)] = scattered;
        w[static_cast<std::size_t>(round * 5 + 4)] = bcast;
      }
      return Status::ok_status();
    });
    for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.error().to_string();
  }
  auto dev = device_group();
  std::vector<std::vector<std::vector<float>>> got(kRanks, std::vector<std::vector<float>>(kRounds * 5));
  std::vector<int> queued_after_call(kRanks, 0);
  const auto st = on_ranks(kRanks, [&](int r) -> Status {
    comm::Communicator& c = *dev[static_cast<std::size_t>(r)];
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
      return make_error(ErrorCode::internal, "stream");
    if (Status s = c.bind_stream(stream); !s) return s;
    if (!c.collectives_in_stream_order()) return make_error(ErrorCode::internal, "not in stream order");
    if (c.bind_stream(reinterpret_cast<cudaStream_t>(&c)).ok()) return make_error(ErrorCode::internal, "rebound");
    // Pinned inputs, one per round (a pinned source is read when its copy runs).
    std::vector<float*> pinned(kRounds, nullptr);
    for (int round = 0; round < kRounds; ++round) {
      if (cudaMallocHost(reinterpret_cast<void**>(&pinned[static_cast<std::size_t>(round)]), kRanks * n * 4) !=
          cudaSuccess)
        return make_error(ErrorCode::internal, "pinned");
      const std::vector<float> in = input(r, round);
      std::memcpy(pinned[static_cast<std::size_t>(round)], in.data(), in.size() * 4);
    }
    auto in = DeviceBuffer::allocate(kRanks * n * 4), a = DeviceBuffer::allocate(kRanks * n * 4);
    if (!in || !a) return make_error(ErrorCode::internal, "device memory");
    std::vector<DeviceBuffer> outs;  // [round * 5 + op]
    for (int i = 0; i < kRounds * 5; ++i) outs.push_back(std::move(DeviceBuffer::allocate(kRanks * n * 4)).value());
    const auto put = [&](float* dst, const float* src, std::size_t count) {
      return cudaMemcpyAsync(dst, src, count * 4, cudaMemcpyDefault, stream) == cudaSuccess
                 ? Status::ok_status()
                 : make_error(ErrorCode::internal, "copy");
    };
    for (int round = 0; round < kRounds; ++round) {
      float* src = pinned[static_cast<std::size_t>(round)];
      auto* inp = in->as<float>();
      const auto out = [&](int op) { return outs[static_cast<std::size_t>(round * 5 + op)].as<float>(); };
      if (Status s = put(inp, src, kRanks * n); !s) return s;
      if (Status s = put(out(0), inp, n); !s) return s;
      if (Status s = c.all_reduce_sum(out(0), n); !s) return s;
      if (round == 0) queued_after_call[static_cast<std::size_t>(r)] = fc::pending_ops();
      if (Status s = c.all_gather(inp, n, out(1)); !s) return s;
      if (Status s = c.all_to_all(inp, out(2), n); !s) return s;
      if (Status s = put(a->as<float>(), inp, kRanks * n); !s) return s;
      if (Status s = c.reduce_scatter_sum(a->as<float>(), out(3), n); !s) return s;
      if (Status s = put(out(4), inp, n); !s) return s;
      if (Status s = c.broadcast(out(4), n, round % kRanks); !s) return s;
      if (round == 1) {
        // Refused calls between the rounds: one the ranks disagree on, one
        // with a host buffer on rank 2 (refused on every rank together).
        // They give their slots back, and the rounds go on.
        const Status disagree = c.all_reduce_sum(out(0), r == 1 ? n / 2 : n);
        if (disagree.ok() || disagree.error().code != ErrorCode::invalid_argument)
          return make_error(ErrorCode::internal, "a disagreement was not refused");
        std::vector<float> host_buf(n);
        const Status not_device = c.all_gather(r == 2 ? host_buf.data() : inp, n, out(1));
        if (not_device.ok() || not_device.error().code != ErrorCode::invalid_argument)
          return make_error(ErrorCode::internal, "a host buffer was not refused on rank " + std::to_string(r));
      }
    }
    if (Status s = c.wait_stream(); !s) return s;  // returns at once: the caller synchronises its stream
    if (cudaStreamSynchronize(stream) != cudaSuccess) return make_error(ErrorCode::internal, "sync");
    const std::size_t sizes[5] = {n, kRanks * n, kRanks * n, n, n};
    for (int i = 0; i < kRounds * 5; ++i)
      got[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] = host_copy(outs[static_cast<std::size_t>(i)], sizes[i % 5]);
    outs.clear();
    for (float* p : pinned) (void)cudaFreeHost(p);
    (void)cudaStreamDestroy(stream);
    return Status::ok_status();
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.error().to_string();
  for (int r = 0; r < kRanks; ++r)
    for (int i = 0; i < kRounds * 5; ++i)
      EXPECT_TRUE(same_bits(got[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)],
                            want[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)]))
          << "rank " << r << " round " << i / 5 << " op " << i % 5;
  if (fc::execution() == fc::Execution::deferred)
    for (int q : queued_after_call) EXPECT_GT(q, 0) << "a call in stream order must not wait for the device";
}

TEST_P(InProcDeviceComm, ARankThatIsNotBoundIsRefusedByEveryRank) {
  auto dev = device_group();
  std::vector<DeviceBuffer> bufs;
  for (int r = 0; r < kRanks; ++r) bufs.push_back(device_copy(std::vector<float>(8, static_cast<float>(r + 1))));
  settle();
  std::vector<cudaStream_t> streams(kRanks, nullptr);
  for (int r = 0; r < kRanks - 1; ++r) {  // the last rank stays unbound
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[static_cast<std::size_t>(r)], cudaStreamNonBlocking), cudaSuccess);
    ASSERT_TRUE(dev[static_cast<std::size_t>(r)]->bind_stream(streams[static_cast<std::size_t>(r)]).ok());
  }
  const auto st = on_ranks(kRanks, [&](int r) {
    return dev[static_cast<std::size_t>(r)]->all_reduce_sum(static_cast<float*>(bufs[static_cast<std::size_t>(r)].data()), 8);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_FALSE(st[static_cast<std::size_t>(r)].ok()) << "rank " << r;
    EXPECT_EQ(st[static_cast<std::size_t>(r)].error().code, ErrorCode::invalid_argument);
    EXPECT_NE(st[static_cast<std::size_t>(r)].error().message.find("bound"), std::string::npos)
        << st[static_cast<std::size_t>(r)].error().message;
    EXPECT_EQ(host_copy(bufs[static_cast<std::size_t>(r)], 8), std::vector<float>(8, static_cast<float>(r + 1)));
  }
  dev.clear();
  for (cudaStream_t s : streams)
    if (s != nullptr) ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace model_cuda_inproc_device_comm_fake_device_test
}  // namespace shardline::model
