#include "comm/nccl.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/exchange.hpp"

namespace shardline::comm {
namespace {

using Clock = std::chrono::steady_clock;
using detail::CollOp;
using detail::ms_text;

static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0);
constexpr std::size_t kIdFloats = sizeof(ncclUniqueId) / sizeof(float);
constexpr std::size_t kDescWords = 4;  // op, count, root, bad

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr std::chrono::milliseconds kMax = std::chrono::hours(24 * 365);
  return Clock::now() + std::clamp(timeout, std::chrono::milliseconds(1), kMax);
}

std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  if (last && *last) s += ": " + std::string(last);
  return s;
}

void pause(int& spins) {
  if (++spins < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

/// Waits until a non-blocking NCCL communicator has left ncclInProgress.
ncclResult_t wait_ready(ncclComm_t comm, Clock::time_point deadline, bool& timed_out) {
  timed_out = false;
  int spins = 0;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) {
      timed_out = true;
      return ncclInProgress;
    }
    pause(spins);
  }
}

/// Is p device-accessible memory of this process?
bool is_device_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(int rank, int world, int device, ncclComm_t comm, cudaStream_t stream, void* scratch,
           std::uint64_t* host_desc, std::chrono::milliseconds timeout, bool check_args)
      : rank_(rank),
        world_(world),
        device_(device),
        comm_(comm),
        stream_(stream),
        scratch_(scratch),
        host_desc_(host_desc),
        check_args_(check_args) {
    set_timeout(timeout);
  }

  [[nodiscard]] bool on_device() const noexcept override { return true; }

  ~NcclComm() override {
    cudaSetDevice(device_);
    if (comm_) {
      bool timed_out = false;
      ncclResult_t rc = ncclCommFinalize(comm_);
      if (rc == ncclSuccess || rc == ncclInProgress) {
        rc = wait_ready(comm_, deadline_after(timeout_), timed_out);
      }
      if (rc == ncclSuccess && !timed_out) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    if (stream_) cudaStreamDestroy(stream_);
    if (scratch_) cudaFree(scratch_);
    if (host_desc_) cudaFreeHost(host_desc_);
  }

  int rank() const noexcept override { return rank_; }
  int world_size() const noexcept override { return world_; }
  void set_timeout(std::chrono::milliseconds t) noexcept override {
    timeout_ = std::max(t, std::chrono::milliseconds(1));
  }
  std::chrono::milliseconds timeout() const noexcept override { return timeout_; }
  std::uint64_t bytes_sent() const noexcept override { return bytes_sent_.load(); }
  CUstream_st* stream() const noexcept override { return stream_; }
  int device() const noexcept override { return device_; }
  std::string poisoned() const override { return poisoned_; }

  Status bind_stream(CUstream_st* stream) override {
    if (stream == nullptr) return make_error(ErrorCode::invalid_argument, who("bind_stream") + ": a null stream");
    if (bound_ != nullptr && bound_ != stream)
      return make_error(ErrorCode::invalid_argument, who("bind_stream") + ": already bound to another stream");
    bound_ = stream;
    return Status();
  }
  bool collectives_in_stream_order() const noexcept override { return bound_ != nullptr; }
  bool point_to_point_in_stream_order() const noexcept override { return bound_ != nullptr; }
  Status wait_stream() override {
    if (bound_ == nullptr) return Status();
    if (!comm_) return poisoned_error("wait_stream");
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return make_error(ErrorCode::io, who("wait_stream") + ": cudaSetDevice: " + cuda_text(e));
    }
    return wait("wait_stream", deadline_after(timeout_), bound_);
  }

  Status barrier() override { return collective(CollOp::barrier, nullptr, nullptr, 0, 0); }
  Status all_reduce_sum(float* data, std::size_t count) override {
    return collective(CollOp::all_reduce_sum, data, data, count, 0);
  }
  Status all_gather(const float* send, std::size_t count, float* recv) override {
    return collective(CollOp::all_gather, send, recv, count, 0);
  }
  Status reduce_scatter_sum(const float* send, float* recv, std::size_t count) override {
    return collective(CollOp::reduce_scatter_sum, send, recv, count, 0);
  }
  Status all_to_all(const float* send, float* recv, std::size_t count) override {
    return collective(CollOp::all_to_all, send, recv, count, 0);
  }
  Status broadcast(float* data, std::size_t count, int root) override {
    return collective(CollOp::broadcast, data, data, count, root);
  }

  Status send(const void* data, std::size_t bytes, int peer, int tag) override {
    return p2p("send", const_cast<void*>(data), bytes, peer, true);
  }
  Status recv(void* data, std::size_t bytes, int peer, int tag) override {
    return p2p("recv", data, bytes, peer, false);
  }

  Status expose(std::string name, const void*, std::size_t) override {
    return unsupported("expose", "'" + name + "'");
  }
  Status unexpose(const std::string& name) override {
    return unsupported("unexpose", "'" + name + "'");
  }
  Status get(int peer, std::string name, std::size_t, void*, std::size_t) override {
    return unsupported("get", "'" + name + "' of rank " + std::to_string(peer));
  }

 private:
  std::string who(const char* op) const { return std::string(op) + ": rank " + std::to_string(rank_); }

  Error unsupported(const char* op, const std::string& what) const {
    return make_error(ErrorCode::unsupported,
                      who(op) + ": one-sided access (" + what +
                          ") is not supported by the NCCL backend; use the TCP or in-process "
                          "communicator");
  }

  Error poisoned_error(const char* op) const {
    return make_error(ErrorCode::io, who(op) + ": the NCCL communicator was aborted (" + poisoned_ +
                                         "); rebuild it");
  }

  Error fail(const char* op, std::string what) {
    if (comm_) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    Error e = make_error(ErrorCode::io, who(op) + " " + std::move(what));
    if (poisoned_.empty()) poisoned_ = e.message;
    return e;
  }

  /// Checks an NCCL enqueue result.
  Status enqueued(const char* op, ncclResult_t rc) {
    if (rc == ncclSuccess || rc == ncclInProgress) return Status();
    return fail(op, "failed: NCCL " + nccl_text(rc, comm_));
  }

  /// Waits for everything enqueued on `stream` (the communicator's own by
  /// default), bounded by the deadline.
  Status wait(const char* op, Clock::time_point deadline, cudaStream_t stream = nullptr) {
    if (stream == nullptr) stream = stream_;
    int spins = 0;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) return fail(op, "failed: NCCL " + nccl_text(rc, comm_));
      if (state != ncclSuccess && state != ncclInProgress) {
        return fail(op, "failed: NCCL " + nccl_text(state, comm_));
      }
      if (state == ncclSuccess) {
        const cudaError_t q = cudaStreamQuery(stream);
        if (q == cudaSuccess) return Status();
        if (q != cudaErrorNotReady) return fail(op, "failed: CUDA " + cuda_text(q));
      }
      if (Clock::now() >= deadline) {
        return fail(op, "timed out after " + ms_text(timeout_) +
                            " (an NCCL peer is missing, dead or disagrees); the communicator "
                            "was aborted");
      }
      pause(spins);
    }
  }

  std::uint8_t check_local(CollOp op, const float* send, float* recv, std::size_t n, int root) const {
    using detail::BadArgs;
    if (op == CollOp::broadcast && (root < 0 || root >= world_)) {
      return static_cast<std::uint8_t>(BadArgs::root_out_of_range);
    }
    if (op == CollOp::barrier || n == 0) return 0;
    if (send == nullptr || recv == nullptr) return static_cast<std::uint8_t>(BadArgs::null_buffer);
    if (!is_device_pointer(send) || !is_device_pointer(recv)) {
      return static_cast<std::uint8_t>(BadArgs::null_buffer);  // reported as "not device memory"
    }
    if (op == CollOp::all_to_all) {
      const std::size_t total = n * static_cast<std::size_t>(world_) * sizeof(float);
      const auto a = reinterpret_cast<std::uintptr_t>(send);
      const auto b = reinterpret_cast<std::uintptr_t>(recv);
      if (a < b + total && b < a + total) return static_cast<std::uint8_t>(BadArgs::overlap);
    }
    return 0;
  }

  static const char* bad_text(std::uint8_t bad) {
    return bad == static_cast<std::uint8_t>(detail::BadArgs::null_buffer)
               ? "null or non-device buffer"
               : detail::bad_args_text(bad);
  }

  /// All-gathers (op, count, root, bad) and returns the common verdict.
  Status agree(const char* name, CollOp op, std::size_t n, int root, std::uint8_t bad,
               Clock::time_point deadline) {
    auto* dev = static_cast<std::uint64_t*>(scratch_);
    std::uint64_t* mine = host_desc_ + static_cast<std::size_t>(world_) * kDescWords;
    mine[0] = static_cast<std::uint64_t>(op);
    mine[1] = n;
    mine[2] = static_cast<std::uint64_t>(static_cast<std::int64_t>(root));
    mine[3] = bad;
    std::uint64_t* dev_mine = dev + static_cast<std::size_t>(rank_) * kDescWords;
    if (cudaError_t e = cudaMemcpyAsync(dev_mine, mine, kDescWords * sizeof(std::uint64_t),
                                        cudaMemcpyHostToDevice, stream_);
        e != cudaSuccess) {
      return fail(name, "failed: CUDA " + cuda_text(e));
    }
    if (Status st = enqueued(name, ncclAllGather(dev_mine, dev, kDescWords, ncclUint64, comm_, stream_));
        !st.ok()) {
      return st;
    }
    if (cudaError_t e = cudaMemcpyAsync(host_desc_, dev,
                                        static_cast<std::size_t>(world_) * kDescWords * sizeof(std::uint64_t),
                                        cudaMemcpyDeviceToHost, stream_);
        e != cudaSuccess) {
      return fail(name, "failed: CUDA " + cuda_text(e));
    }
    if (Status st = wait(name, deadline); !st.ok()) return st;
    auto describe = [](int r, const std::uint64_t* d) {
      std::string s = "rank " + std::to_string(r) + " called " +
                      detail::coll_op_name(static_cast<std::uint8_t>(d[0])) +
                      "(count=" + std::to_string(d[1]);
      if (static_cast<CollOp>(d[0]) == CollOp::broadcast) {
        s += ", root=" + std::to_string(static_cast<std::int64_t>(d[2]));
      }
      return s + ")";
    };
    const std::uint64_t* d0 = host_desc_;
    for (int k = 0; k < world_; ++k) {
      const std::uint64_t* d = host_desc_ + static_cast<std::size_t>(k) * kDescWords;
      if (d[3] != 0) {
        return make_error(ErrorCode::invalid_argument,
                          who(name) + ": rank " + std::to_string(k) + " passed bad arguments to " +
                              detail::coll_op_name(static_cast<std::uint8_t>(d[0])) + ": " +
                              bad_text(static_cast<std::uint8_t>(d[3])));
      }
      if (d[0] != d0[0] || d[1] != d0[1] ||
          (static_cast<CollOp>(d0[0]) == CollOp::broadcast && d[2] != d0[2])) {
        return make_error(ErrorCode::invalid_argument,
                          who(name) + ": ranks disagree: " + describe(0, d0) + ", " + describe(k, d));
      }
    }
    return Status();
  }

  std::uint64_t logical_bytes(CollOp op, std::size_t n, int root) const {
    const std::uint64_t peers = static_cast<std::uint64_t>(world_ - 1);
    switch (op) {
      case CollOp::barrier: return 0;
      case CollOp::all_gather:
      case CollOp::reduce_scatter_sum:
      case CollOp::all_to_all: return peers * n * sizeof(float);
      case CollOp::broadcast: return root == rank_ ? peers * n * sizeof(float) : 0;
      case CollOp::all_reduce_sum: {
        const auto [b, e] = detail::reduce_slice(n, rank_, world_);
        return ((n - (e - b)) + peers * (e - b)) * sizeof(float);
      }
    }
    return 0;
  }

  Status collective(CollOp op, const float* send, float* recv, std::size_t n, int root) {
    const char* name = detail::coll_op_name(static_cast<std::uint8_t>(op));
    if (!comm_) return poisoned_error(name);
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return make_error(ErrorCode::io, who(name) + ": cudaSetDevice: " + cuda_text(e));
    }
    const auto deadline = deadline_after(timeout_);
    const std::uint8_t bad = check_local(op, send, recv, n, root);
    // Bound to the caller's stream (barriers aside): queued there behind its
    // work, not waited for, and the arguments are not compared across ranks
    // (that needs a wait); a rank's own bad arguments are still refused.
    const bool ordered = bound_ != nullptr && op != CollOp::barrier;
    cudaStream_t const stream = ordered ? bound_ : stream_;
    if (ordered) {
      if (bad != 0)
        return make_error(ErrorCode::invalid_argument, who(name) + ": bad arguments: " + std::string(bad_text(bad)));
    } else if (check_args_) {
      if (Status st = agree(name, op, n, root, bad, deadline); !st.ok()) return st;
      if (op == CollOp::barrier) return Status();
    } else if (bad != 0) {
      return make_error(ErrorCode::invalid_argument,
                        who(name) + ": bad arguments: " + std::string(bad_text(bad)));
    }
    if (n == 0 && op != CollOp::barrier) return Status();
    ncclResult_t rc = ncclSuccess;
    switch (op) {
      case CollOp::barrier:
        rc = ncclAllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream);
        break;
      case CollOp::all_reduce_sum:
        rc = ncclAllReduce(send, recv, n, ncclFloat, ncclSum, comm_, stream);
        break;
      case CollOp::all_gather:
        rc = ncclAllGather(send, recv, n, ncclFloat, comm_, stream);
        break;
      case CollOp::reduce_scatter_sum:
        rc = ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, comm_, stream);
        break;
      case CollOp::broadcast:
        rc = ncclBroadcast(send, recv, n, ncclFloat, root, comm_, stream);
        break;
      case CollOp::all_to_all: {
        rc = ncclGroupStart();
        for (int k = 0; k < world_ && (rc == ncclSuccess || rc == ncclInProgress); ++k) {
          const std::size_t off = static_cast<std::size_t>(k) * n;
          rc = ncclSend(send + off, n, ncclFloat, k, comm_, stream);
          if (rc == ncclSuccess || rc == ncclInProgress) {
            rc = ncclRecv(recv + off, n, ncclFloat, k, comm_, stream);
          }
        }
        const ncclResult_t end = ncclGroupEnd();
        if (rc == ncclSuccess || rc == ncclInProgress) rc = end;
        break;
      }
    }
    if (Status st = enqueued(name, rc); !st.ok()) return st;
    if (!ordered)
      if (Status st = wait(name, deadline); !st.ok()) return st;
    bytes_sent_.fetch_add(logical_bytes(op, n, root));
    return Status();
  }

  Status p2p(const char* op, void* data, std::size_t bytes, int peer, bool is_send) {
    if (peer < 0 || peer >= world_) {
      return make_error(ErrorCode::invalid_argument,
                        who(op) + ": peer " + std::to_string(peer) + " is out of range [0, " +
                            std::to_string(world_) + ")");
    }
    if (peer == rank_) {
      return make_error(ErrorCode::unsupported,
                        who(op) + ": point to point with oneself is not supported by NCCL");
    }
    if (bytes > 0 && (data == nullptr || !is_device_pointer(data))) {
      return make_error(ErrorCode::invalid_argument,
                        who(op) + ": data is null or not device memory");
    }
    if (!comm_) return poisoned_error(op);
    if (bytes == 0) return Status();
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return make_error(ErrorCode::io, who(op) + ": cudaSetDevice: " + cuda_text(e));
    }
    const auto deadline = deadline_after(timeout_);
    cudaStream_t const stream = bound_ != nullptr ? bound_ : stream_;
    const ncclResult_t rc = is_send ? ncclSend(data, bytes, ncclInt8, peer, comm_, stream)
                                    : ncclRecv(data, bytes, ncclInt8, peer, comm_, stream);
    if (Status st = enqueued(op, rc); !st.ok()) return st;
    if (bound_ != nullptr) {  // in the caller's stream order: not waited for
      if (is_send) bytes_sent_.fetch_add(bytes);
      return Status();
    }
    if (Status st = wait(op, deadline); !st.ok()) {
      return st.error().message.find("timed out") != std::string::npos
                 ? make_error(ErrorCode::io, st.error().message + " (waiting for rank " +
                                                 std::to_string(peer) + ")")
                 : st;
    }
    if (is_send) bytes_sent_.fetch_add(bytes);
    return Status();
  }

  const int rank_;
  const int world_;
  const int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  cudaStream_t bound_ = nullptr;  // bind_stream's: calls are queued there and not waited for
  void* scratch_;             // device: world * 4 u64 descriptors (>= 1 float)
  std::uint64_t* host_desc_;  // pinned: world * 4 u64 gathered + 4 u64 own
  const bool check_args_;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  std::string poisoned_;
  std::atomic<std::uint64_t> bytes_sent_{0};
};

}  // namespace

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create(Communicator& bootstrap,
                                                                   NcclOptions options) {
  const int rank = bootstrap.rank();
  const int world = bootstrap.world_size();
  const std::string where = "NcclCommunicator::create: rank " + std::to_string(rank);
  const auto deadline = deadline_after(bootstrap.timeout());

  // Local CUDA set-up; a failure is shared with the other ranks below so
  // nobody waits for a rank that will never join.
  std::string local_error;
  ErrorCode local_code = ErrorCode::io;
  int device = options.device;
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    local_error = "no CUDA device" + (e != cudaSuccess ? ": " + cuda_text(e) : std::string());
    local_code = ErrorCode::unsupported;
  } else if (device >= count) {
    local_error = "device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                  " device(s))";
    local_code = ErrorCode::invalid_argument;
  } else if (device >= 0) {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      local_error = "cudaSetDevice(" + std::to_string(device) + "): " + cuda_text(e);
    }
  } else if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    local_error = "cudaGetDevice: " + cuda_text(e);
  }

  // Rank 0 makes the id; it travels as the bytes of floats (broadcast copies
  // them verbatim). Slot 0 says whether rank 0 succeeded.
  std::vector<float> id_msg(1 + kIdFloats, 0.0f);
  ncclUniqueId id{};
  if (rank == 0 && local_error.empty()) {
    if (ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess) {
      local_error = "ncclGetUniqueId: " + nccl_text(rc, nullptr);
    } else {
      id_msg[0] = 1.0f;
      std::memcpy(id_msg.data() + 1, &id, sizeof id);
    }
  }
  if (Status st = bootstrap.broadcast(id_msg.data(), id_msg.size(), 0); !st.ok()) {
    return make_error(st.error().code, where + ": bootstrap broadcast of the NCCL id failed: " +
                                           st.error().message);
  }
  float failed = local_error.empty() ? 0.0f : 1.0f;
  if (Status st = bootstrap.all_reduce_sum(&failed, 1); !st.ok()) {
    return make_error(st.error().code, where + ": bootstrap failed: " + st.error().message);
  }
  if (!local_error.empty()) return make_error(local_code, where + ": " + local_error);
  if (failed > 0.0f || id_msg[0] != 1.0f) {
    return make_error(ErrorCode::io, where + ": " + std::to_string(static_cast<int>(failed)) +
                                         " rank(s) could not set up CUDA / NCCL");
  }
  std::memcpy(&id, id_msg.data() + 1, sizeof id);

  // Join, non-blocking so that a missing rank ends in a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  std::string init_error;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, world, id, rank, &config);
  if (rc == ncclSuccess || rc == ncclInProgress) {
    bool timed_out = false;
    rc = wait_ready(comm, deadline, timed_out);
    if (timed_out) init_error = "ncclCommInitRank timed out after " + ms_text(bootstrap.timeout());
    else if (rc != ncclSuccess) init_error = "ncclCommInitRank: " + nccl_text(rc, comm);
  } else {
    init_error = "ncclCommInitRank: " + nccl_text(rc, comm);
  }
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  std::uint64_t* host_desc = nullptr;
  if (init_error.empty()) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      init_error = "cudaStreamCreate: " + cuda_text(e);
    } else if (cudaError_t e2 = cudaMalloc(&scratch, static_cast<std::size_t>(world) * kDescWords *
                                                         sizeof(std::uint64_t));
               e2 != cudaSuccess) {
      init_error = "cudaMalloc: " + cuda_text(e2);
    } else if (cudaError_t e3 = cudaMallocHost(reinterpret_cast<void**>(&host_desc),
                                               static_cast<std::size_t>(world + 1) * kDescWords *
                                                   sizeof(std::uint64_t));
               e3 != cudaSuccess) {
      init_error = "cudaMallocHost: " + cuda_text(e3);
    }
  }
  // Everyone learns whether everyone joined.
  float init_failed = init_error.empty() ? 0.0f : 1.0f;
  Status agreed = bootstrap.all_reduce_sum(&init_failed, 1);
  if (!init_error.empty() || !agreed.ok() || init_failed > 0.0f) {
    if (comm) ncclCommAbort(comm);
    if (stream) cudaStreamDestroy(stream);
    if (scratch) cudaFree(scratch);
    if (host_desc) cudaFreeHost(host_desc);
    if (!init_error.empty()) return make_error(ErrorCode::io, where + ": " + init_error);
    if (!agreed.ok()) {
      return make_error(agreed.error().code, where + ": bootstrap failed: " + agreed.error().message);
    }
    return make_error(ErrorCode::io, where + ": " + std::to_string(static_cast<int>(init_failed)) +
                                         " other rank(s) failed to join the NCCL communicator");
  }
  return std::unique_ptr<NcclCommunicator>(std::make_unique<NcclComm>(
      rank, world, device, comm, stream, scratch, host_desc, bootstrap.timeout(),
      options.check_args));
}

}  // namespace shardline::comm
