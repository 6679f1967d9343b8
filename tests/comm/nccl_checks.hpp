#pragma once
// The NCCL communicator's checks, shared by the real-GPU test
// (tests/comm/nccl_gpu_test.cpp) and the fake-device one
// (tests/model/cuda/nccl_fake_device_test.cpp, over the fake NCCL): device
// buffers, a group of ranks on threads (rank r on device r), every
// collective against the rank-order reference.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/inproc.hpp"
#include "comm/nccl.hpp"
#include "tests/comm/comm_test_util.hpp"

namespace shardline::comm::nccl_checks {

using namespace shardline::comm::testing;
using std::chrono::milliseconds;

inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {  // no driver / no device: an error here
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// A device buffer of floats with host copies in and out.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t n) : n_(n) {
    if (n > 0) {
      EXPECT_EQ(cudaMalloc(&p_, n * sizeof(float)), cudaSuccess);
    }
  }
  ~DeviceFloats() {
    if (p_) cudaFree(p_);
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() { return static_cast<float*>(p_); }
  void put(const std::vector<float>& v) {
    if (n_ > 0) {
      ASSERT_EQ(cudaMemcpy(p_, v.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      // From pageable memory the copy may land after cudaMemcpy returns, on
      // the legacy stream, which the communicator's non-blocking stream does
      // not wait for: the contract is that the data is in place first.
      ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    }
  }
  std::vector<float> fetch() {
    std::vector<float> v(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return v;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Runs fn(nccl, rank) on `world` threads, rank r on device r.
inline void run_nccl(int world, const std::function<void(NcclCommunicator&, int)>& fn) {
  auto boot = InProcGroup::create(world).value();
  std::vector<std::unique_ptr<Communicator>> boots;
  for (int r = 0; r < world; ++r) boots.push_back(boot->communicator(r).value());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      boots[static_cast<std::size_t>(r)]->set_timeout(milliseconds(60000));
      NcclOptions opt;
      opt.device = r;
      auto c = NcclCommunicator::create(*boots[static_cast<std::size_t>(r)], opt);
      ASSERT_TRUE(c.ok()) << c.error().to_string();
      EXPECT_EQ((*c)->rank(), r);
      EXPECT_EQ((*c)->world_size(), world);
      EXPECT_EQ((*c)->device(), r);
      (*c)->set_timeout(milliseconds(30000));
      fn(**c, r);
    });
  }
  for (auto& t : threads) t.join();
}

inline void check_collectives(NcclCommunicator& c, int r, int w) {
  ASSERT_EQ(cudaSetDevice(c.device()), cudaSuccess);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
    // all_reduce_sum. With 1 or 2 ranks the sum is order-free, so it matches
    // the rank-order reference bit for bit.
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = value(r, i);
    DeviceFloats d(n);
    d.put(h);
    Status st = c.all_reduce_sum(d.get(), n);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    const auto ref = ref_sum(iota_ids(w), 0, n);
    const auto got = d.fetch();
    EXPECT_TRUE(bits_equal(got.data(), ref.data(), n)) << "count " << n;

    // all_gather
    DeviceFloats send(n), gathered(w * n);
    send.put(h);
    ASSERT_TRUE(c.all_gather(send.get(), n, gathered.get()).ok());
    const auto g = gathered.fetch();
    for (int k = 0; k < w; ++k)
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(g[k * n + i], value(k, i));

    // reduce_scatter_sum
    std::vector<float> rs(w * n);
    for (std::size_t i = 0; i < rs.size(); ++i) rs[i] = value(r, i, 2);
    DeviceFloats drs(w * n), dout(n);
    drs.put(rs);
    ASSERT_TRUE(c.reduce_scatter_sum(drs.get(), dout.get(), n).ok());
    const auto ref_rs = ref_sum(iota_ids(w), r * n, n, 2);
    const auto out = dout.fetch();
    EXPECT_TRUE(bits_equal(out.data(), ref_rs.data(), n));

    // all_to_all
    std::vector<float> a2a(w * n);
    for (std::size_t i = 0; i < a2a.size(); ++i) a2a[i] = value(r, i, 3);
    DeviceFloats da(w * n), db(w * n);
    da.put(a2a);
    ASSERT_TRUE(c.all_to_all(da.get(), db.get(), n).ok());
    const auto b = db.fetch();
    for (int k = 0; k < w; ++k)
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(b[k * n + i], value(k, r * n + i, 3));

    // broadcast from the last rank
    DeviceFloats bc(n);
    std::vector<float> hb(n);
    for (std::size_t i = 0; i < n; ++i) hb[i] = value(r, i, 4);
    bc.put(hb);
    ASSERT_TRUE(c.broadcast(bc.get(), n, w - 1).ok());
    const auto bb = bc.fetch();
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(bb[i], value(w - 1, i, 4));
    ASSERT_TRUE(c.barrier().ok());
  }
  // Host memory and one-sided calls are refused with clear codes.
  std::vector<float> host(4, 1.0f);
  EXPECT_EQ(c.all_reduce_sum(host.data(), 4).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(c.expose("w", host.data(), 16).error().code, ErrorCode::unsupported);
  EXPECT_EQ(c.get(0, "w", 0, host.data(), 4).error().code, ErrorCode::unsupported);
  EXPECT_EQ(c.unexpose("w").error().code, ErrorCode::unsupported);
  EXPECT_NE(c.stream(), nullptr);
}

/// Two ranks: point to point (rank 0 sends 256 floats, rank 1 receives them
/// exactly; NCCL's p2p is a rendezvous), sending to oneself refused,
/// disagreeing counts invalid_argument on both ranks and the communicator
/// still usable. Leaves `buf` (256 floats) to the caller.
inline void check_point_to_point_and_disagreement(NcclCommunicator& c, int r, DeviceFloats& buf) {
  ASSERT_EQ(cudaSetDevice(c.device()), cudaSuccess);
  std::vector<float> h(256);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = value(r, i, 7);
  buf.put(h);
  if (r == 0) {
    ASSERT_TRUE(c.send(buf.get(), 256 * sizeof(float), 1, 0).ok());
  } else {
    ASSERT_TRUE(c.recv(buf.get(), 256 * sizeof(float), 0, 0).ok());
    const auto got = buf.fetch();
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], value(0, i, 7));
  }
  EXPECT_EQ(c.send(buf.get(), 4, r, 0).error().code, ErrorCode::unsupported);
  Status st = c.all_reduce_sum(buf.get(), r == 0 ? 4 : 5);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::invalid_argument) << st.error().to_string();
  ASSERT_TRUE(c.all_reduce_sum(buf.get(), 4).ok());
  ASSERT_TRUE(c.barrier().ok());
}

}  // namespace shardline::comm::nccl_checks
