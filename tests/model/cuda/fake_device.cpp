// FAKE CUDA device (a test double): the CUDA runtime calls of
// model/cuda/cuda_runner.cpp and the kernels::cuda API, defined on the CPU.
// See fake_device.hpp for the model of the device. Thread-safe by one
// process-wide lock (fake_mutex); kernels may use OpenMP inside.
#include "tests/model/cuda/fake_device.hpp"

// The declarations every definition below must match exactly.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/dtype.hpp"
#include "sampling/rng.hpp"
#include "sampling/sampler.hpp"
#include "sampling/sampling_params.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/device_buffer.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/kv_gather.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/cuda/roofline.hpp"
#include "kernels/cuda/sampling.hpp"

#include "tests/model/cuda/fake_device_internal.hpp"

// The opaque runtime types (only forward-declared by driver_types.h).
struct CUstream_st {
  unsigned flags = 0;
  bool legacy = false;
  int device = 0;  ///< the device current when it was made (the legacy stream: -1, any)
  bool capturing = false;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  std::thread::id capture_thread;  ///< the thread that began the capture
  bool invalidated = false;  ///< the capture hit a prohibited call
  std::vector<fake_detail::Op> captured;
  std::deque<fake_detail::Op> pending;  ///< deferred mode: queued, not run yet
};
struct CUgraph_st {
  std::vector<fake_detail::Op> ops;
};
struct CUgraphExec_st {
  std::vector<fake_detail::Op> ops;
};
/// What an event's operations share (they may outlive cudaEventDestroy, as
/// on a GPU): how many records were made, how many have run.
struct FakeEventState {
  int device = 0;                     ///< the device current when it was made
  std::vector<CUstream_st*> streams;  ///< [records] the stream of each record
  std::vector<char> ran;              ///< [records] whether each record has run
  long recorded = 0;
  [[nodiscard]] bool reached(long gen) const { return gen <= 0 || ran[static_cast<std::size_t>(gen - 1)] != 0; }
};
struct CUevent_st {
  std::shared_ptr<FakeEventState> state = std::make_shared<FakeEventState>();
};

namespace fake_detail {

using shardline::testing_support::fake_cuda::Counters;
using shardline::testing_support::fake_cuda::Execution;

struct Alloc {
  std::size_t bytes = 0;
  MemKind kind = MemKind::device;
  int device = -1;  ///< device memory: the device current at allocation
};

struct Injection {
  cudaError_t error = cudaSuccess;
  int skip = 0;
};

struct State {
  Execution mode = Execution::immediate;
  Counters counters;
  std::vector<std::string> anomalies;
  std::map<std::uintptr_t, Alloc> allocs;  // by first byte
  std::deque<std::pair<void*, std::size_t>> quarantine;
  std::size_t quarantine_bytes = 0;
  std::set<CUstream_st*> streams;
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> execs;
  std::set<CUevent_st*> events;
  int device_count = 1;
  std::size_t memory_bytes = std::size_t{80} << 30;  ///< each device's, as query_devices reports it
  std::set<std::pair<int, int>> peer_access;  ///< (device, peer): device's work may touch peer's memory
  int running_device = -1;                    ///< the device of the operation running now (-1: none / host)
  std::map<std::string, Injection> injections;
  std::map<std::string, long> kernel_runs;  // by kernel name
  CUstream_st legacy;
  State() {
    legacy.legacy = true;
    legacy.device = -1;
  }
};

State& st() {
  static State s;
  return s;
}

/// One process-wide lock over the whole fake: every runtime call, kernel
/// launch and control call holds it, so that ranks on threads (a tensor-
/// parallel group sharing one device) see one device, serialised as the
/// GPU serialises their streams. Recursive: entry points call each other
/// (DeviceBuffer::copy_from_host -> cudaMemcpy, launch -> enqueue).
std::recursive_mutex& fake_mutex() {
  static std::recursive_mutex mu;
  return mu;
}

thread_local int lock_depth = 0;  // how many FakeLocks this thread holds
thread_local int current_device_ = 0;

FakeLock::FakeLock() {
  fake_mutex().lock();
  ++lock_depth;
}
FakeLock::~FakeLock() {
  --lock_depth;
  fake_mutex().unlock();
}

int current_device() { return current_device_; }

bool wait_until(const std::function<bool()>& ready, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    const int depth = lock_depth;
    for (int i = 0; i < depth; ++i) fake_mutex().unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    for (int i = 0; i < depth; ++i) fake_mutex().lock();
  }
  return true;
}

thread_local cudaError_t last_error = cudaSuccess;

constexpr std::size_t kQuarantineBytes = std::size_t{256} << 20;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

void anomaly(const std::string& what) { st().anomalies.push_back(what); }


/// A pending fault injection for `call` fires (and is consumed) here.
bool injected(const char* call, cudaError_t* err) {
  auto& inj = st().injections;
  const auto it = inj.find(call);
  if (it == inj.end()) return false;
  if (it->second.skip > 0) {
    --it->second.skip;
    return false;
  }
  *err = it->second.error;
  inj.erase(it);
  return true;
}

// ---- memory --------------------------------------------------------------------

const Alloc* find_alloc(std::uintptr_t a, std::uintptr_t* begin) {
  auto& m = st().allocs;
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  if (a >= it->first + it->second.bytes) return nullptr;
  *begin = it->first;
  return &it->second;
}

/// [p, p + bytes) inside one live allocation of `kind`.
bool in_memory(const void* p, std::size_t bytes, MemKind kind) {
  if (bytes == 0) return true;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t begin = 0;
  const Alloc* al = find_alloc(a, &begin);
  return al != nullptr && al->kind == kind && a + bytes <= begin + al->bytes && a + bytes >= a;
}

int memory_device(const void* p) {
  std::uintptr_t begin = 0;
  const Alloc* a = find_alloc(reinterpret_cast<std::uintptr_t>(p), &begin);
  return a != nullptr && a->kind == MemKind::device ? a->device : -1;
}

/// Device `device`'s work may touch device memory of `owner`.
bool reachable(int device, int owner) {
  return device < 0 || owner < 0 || device == owner || st().peer_access.count({device, owner}) != 0;
}

bool check(const char* op, const char* what, const void* p, std::size_t bytes, MemKind kind) {
  if (in_memory(p, bytes, kind)) {
    const int owner = kind == MemKind::device ? memory_device(p) : -1;
    if (reachable(st().running_device, owner)) return true;
    anomaly(std::string(op) + ": " + what + " is device " + std::to_string(owner) +
            "'s memory, touched by work on device " + std::to_string(st().running_device) +
            "'s stream without peer access");
    return false;
  }
  anomaly(std::string(op) + ": " + what + " [" + std::to_string(reinterpret_cast<std::uintptr_t>(p)) + ", +" +
          std::to_string(bytes) + ") is not inside one live " + (kind == MemKind::device ? "device" : "pinned") +
          " allocation");
  return false;
}

bool check_on(int device, const char* op, const char* what, const void* p, std::size_t bytes) {
  const int outer = st().running_device;
  st().running_device = device;
  const bool ok = check(op, what, p, bytes, MemKind::device);
  st().running_device = outer;
  return ok;
}

/// Bytes spanned by `rows` rows of `width` elements with row stride `stride`.
std::size_t span_bytes(long rows, long stride, long width, std::size_t elem) {
  if (rows <= 0 || width <= 0) return 0;
  return static_cast<std::size_t>((rows - 1) * stride + width) * elem;
}

const void* offset(const void* base, long long bytes) {
  return reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(base) + static_cast<std::uintptr_t>(bytes));
}

void* allocate(std::size_t bytes, MemKind kind) {
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return nullptr;
  std::memset(p, 0xFF, rounded);  // "uninitialised": NaN floats, -1 ints
  st().allocs[reinterpret_cast<std::uintptr_t>(p)] = Alloc{bytes, kind, kind == MemKind::device ? current_device_ : -1};
  return p;
}

bool release(void* p, MemKind kind) {
  auto& m = st().allocs;
  const auto it = m.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == m.end() || it->second.kind != kind) return false;
  const std::size_t bytes = it->second.bytes;
  m.erase(it);
  // Quarantine: a stale pointer must never land in a newer buffer.
  State& s = st();
  s.quarantine.emplace_back(p, bytes);
  s.quarantine_bytes += bytes;
  while (s.quarantine_bytes > kQuarantineBytes && !s.quarantine.empty()) {
    std::free(s.quarantine.front().first);
    s.quarantine_bytes -= s.quarantine.front().second;
    s.quarantine.pop_front();
  }
  return true;
}

// ---- streams -------------------------------------------------------------------

CUstream_st* resolve(cudaStream_t s) {
  State& g = st();
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &g.legacy;
  return g.streams.count(s) != 0 ? s : nullptr;
}

int stream_device(cudaStream_t s) {
  CUstream_st* q = resolve(s);
  return q == nullptr ? -2 : q->device;
}

bool capture_active() {
  for (CUstream_st* s : st().streams)
    if (s->capturing) return true;
  return false;
}

/// CUDA's rule for potentially unsafe calls (cudaMalloc, cudaFree, syncs):
/// a capture in global mode prohibits them on every thread; one in
/// thread-local mode on the thread that began it; a relaxed one nowhere.
/// (So two engines of one process may allocate while the other captures.)
bool prohibits(const CUstream_st& s) {
  if (!s.capturing) return false;
  if (s.capture_mode == cudaStreamCaptureModeGlobal) return true;
  return s.capture_mode == cudaStreamCaptureModeThreadLocal && s.capture_thread == std::this_thread::get_id();
}

bool capture_prohibits_here() {
  for (CUstream_st* s : st().streams)
    if (prohibits(*s)) return true;
  return false;
}

/// A blocking stream (not cudaStreamNonBlocking) is capturing: work on the
/// legacy stream would depend on it, which CUDA refuses.
bool blocking_capture_active() {
  for (CUstream_st* s : st().streams)
    if (s->capturing && (s->flags & cudaStreamNonBlocking) == 0) return true;
  return false;
}

void run(Op& op) {
  Counters& c = st().counters;
  ++c.ops_run;
  if (op.kernel) {
    ++c.kernels_run;
    ++st().kernel_runs[op.name];
  }
  op.started = true;
  const int outer = st().running_device;
  // A kernel reaches its own device's memory (and its peers'); copies go
  // anywhere (unified addressing: cudaMemcpy*Async between devices works
  // without peer access, through the host if it must).
  st().running_device = op.kernel ? op.device : -1;
  op.run();
  st().running_device = outer;
}

thread_local std::set<CUstream_st*> progressing;  // streams progress() is inside (an event wait recurses)

/// Runs q's operations in order while they can finish, until `enough`
/// holds (null: until q is empty); true when q is empty (or `enough` held).
bool progress(CUstream_st* q, const std::function<bool()>& enough = {}) {
  if (!progressing.insert(q).second) return q->pending.empty();  // a wait cycle: no progress here
  struct Leave {
    CUstream_st* q;
    ~Leave() { progressing.erase(q); }
  } leave{q};
  while (!q->pending.empty() && !(enough && enough())) {
    Op& head = q->pending.front();
    if (!head.started) run(head);
    if (head.done && !head.done()) return false;  // waits for its peers (a collective)
    q->pending.pop_front();
  }
  return true;
}

/// Completes every operation of `streams` (waiting, with the lock released,
/// for operations that wait on other threads' streams: NCCL's collectives).
/// An operation still waiting after kDeadlock is a deadlock: an anomaly, and
/// it is dropped.
constexpr std::chrono::seconds kDeadlock{120};
template <class Streams>
void settle(Streams streams) {
  const auto all_done = [&] {
    bool done = true;
    for (CUstream_st* s : streams()) done = progress(s) && done;
    return done;
  };
  if (wait_until(all_done, kDeadlock)) return;
  for (CUstream_st* s : streams())
    while (!s->pending.empty() && !progress(s)) {
      anomaly(s->pending.front().name + ": waited " + std::to_string(kDeadlock.count()) +
              " s for its peers (a deadlock: a rank never joined the collective)");
      s->pending.pop_front();
    }
}

std::vector<CUstream_st*> all_streams() {
  std::vector<CUstream_st*> v(st().streams.begin(), st().streams.end());
  v.push_back(&st().legacy);
  return v;
}

void drain(CUstream_st* q) {
  settle([q] { return std::vector<CUstream_st*>{q}; });
}

/// The legacy stream waits for (and is waited on by) blocking streams only.
void drain_blocking() {
  settle([] {
    std::vector<CUstream_st*> v;
    for (CUstream_st* s : st().streams)
      if ((s->flags & cudaStreamNonBlocking) == 0) v.push_back(s);
    return v;
  });
}

/// Completes the legacy default stream's work (and the blocking streams').
void drain_legacy() {
  drain_blocking();
  drain(&st().legacy);
}

void drain_all() { settle(all_streams); }

/// Completes device `device`'s work (its streams' and the legacy stream's):
/// what cudaDeviceSynchronize and cudaFree wait for. Another device's work
/// is not waited for (it may wait for this thread: a collective).
void drain_device(int device) {
  settle([device] {
    std::vector<CUstream_st*> v;
    for (CUstream_st* s : st().streams)
      if (s->device == device) v.push_back(s);
    v.push_back(&st().legacy);
    return v;
  });
}

/// A call CUDA prohibits while a stream captures (capture_prohibits_here):
/// invalidates the captures that prohibit it and fails.
bool prohibited_during_capture(const char* call, cudaError_t* err) {
  if (!capture_prohibits_here()) return false;
  for (CUstream_st* s : st().streams)
    if (prohibits(*s)) s->invalidated = true;
  anomaly(std::string(call) + " during a stream capture (invalidates it)");
  *err = fail(cudaErrorStreamCaptureUnsupported);
  return true;
}

/// `call` on a capturing stream (or on the legacy stream while a blocking
/// stream captures): refused on any thread, the stream's capture invalidated.
cudaError_t refused_on_capturing_stream(CUstream_st& q, const std::string& call) {
  cudaError_t err;
  if (prohibited_during_capture(call.c_str(), &err)) return err;
  q.invalidated = q.capturing;
  anomaly(call + " on a capturing stream");
  return fail(cudaErrorStreamCaptureUnsupported);
}

cudaError_t enqueue(cudaStream_t stream, Op op) {
  CUstream_st* q = resolve(stream);
  if (q == nullptr) {
    anomaly(op.name + ": queued on an unknown stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  op.device = q->legacy ? current_device_ : q->device;
  op.started = false;
  if (q->capturing) {
    if (q->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    q->captured.push_back(std::move(op));
    ++st().counters.ops_captured;
    return cudaSuccess;
  }
  if (q->legacy) {
    cudaError_t err = cudaSuccess;
    if (prohibited_during_capture((op.name + " on the legacy stream").c_str(), &err)) return err;
    drain_blocking();  // the legacy stream's work follows the blocking streams'
  }
  q->pending.push_back(std::move(op));
  // Immediate: runs now, behind whatever still waits on this stream.
  if (st().mode == Execution::immediate) (void)progress(q);
  return cudaSuccess;
}

/// Where a host-side copy endpoint lives.
enum class Where { device, pinned, pageable };
Where where(const void* p) {
  std::uintptr_t begin = 0;
  const Alloc* a = find_alloc(reinterpret_cast<std::uintptr_t>(p), &begin);
  if (a == nullptr) return Where::pageable;
  return a->kind == MemKind::device ? Where::device : Where::pinned;
}

/// Checks a copy's endpoints against its kind; the error or success.
cudaError_t check_copy_kind(const char* call, void* dst, const void* src, std::size_t count, cudaMemcpyKind kind) {
  const Where d = where(dst), s = where(src);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = d == Where::device && s != Where::device; break;
    case cudaMemcpyDeviceToHost: ok = s == Where::device && d != Where::device; break;
    case cudaMemcpyDeviceToDevice: ok = s == Where::device && d == Where::device; break;
    case cudaMemcpyHostToHost: ok = s != Where::device && d != Where::device; break;
    case cudaMemcpyDefault: break;
    default: ok = false;
  }
  if (!ok) {
    anomaly(std::string(call) + ": endpoints do not match cudaMemcpyKind " + std::to_string(static_cast<int>(kind)));
    return fail(cudaErrorInvalidValue);
  }
  if (d != Where::pageable && !in_memory(dst, count, d == Where::device ? MemKind::device : MemKind::pinned)) {
    anomaly(std::string(call) + ": destination range overruns its allocation (" + std::to_string(count) + " bytes)");
    return fail(cudaErrorInvalidValue);
  }
  if (s != Where::pageable && !in_memory(src, count, s == Where::device ? MemKind::device : MemKind::pinned)) {
    anomaly(std::string(call) + ": source range overruns its allocation (" + std::to_string(count) + " bytes)");
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

/// The copy as an operation: at run time both ranges must still be live.
Op copy_op(void* dst, const void* src, std::size_t count) {
  const Where d = where(dst), s = where(src);
  return Op{"cudaMemcpyAsync", false, [=] {
              if (d != Where::pageable &&
                  !check("cudaMemcpyAsync", "destination", dst, count,
                         d == Where::device ? MemKind::device : MemKind::pinned))
                return;
              if (s != Where::pageable &&
                  !check("cudaMemcpyAsync", "source", src, count, s == Where::device ? MemKind::device : MemKind::pinned))
                return;
              std::memmove(dst, src, count);
            }};
}

}  // namespace fake_detail

// ==== the CUDA runtime API (exact declarations of cuda_runtime_api.h) ===========

using namespace fake_detail;

extern "C" {

const char* cudaGetErrorString(cudaError_t error) {
  FAKE_LOCK;
  switch (error) {
    case cudaSuccess: return "no error (fake device)";
    case cudaErrorInvalidValue: return "invalid argument (fake device)";
    case cudaErrorMemoryAllocation: return "out of memory (fake device)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (fake device)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (fake device)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (fake device)";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state (fake device)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (fake device)";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (fake device)";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream (fake device)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (fake device)";
    default: return "fake device error";
  }
}

cudaError_t cudaGetLastError(void) {
  FAKE_LOCK;
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaGetDeviceCount(int* count) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaGetDeviceCount", &err)) return fail(err);
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  if (st().device_count < 0) return fail(cudaErrorNoDevice);
  *count = st().device_count;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaSetDevice", &err)) return fail(err);
  if (device < 0 || device >= st().device_count) return fail(cudaErrorInvalidDevice);
  current_device_ = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  FAKE_LOCK;
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (st().device_count < 0) return fail(cudaErrorNoDevice);
  *device = current_device_;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  FAKE_LOCK;
  const int n = st().device_count;
  if (canAccessPeer == nullptr || device < 0 || device >= n || peerDevice < 0 || peerDevice >= n)
    return fail(cudaErrorInvalidDevice);
  *canAccessPeer = device != peerDevice ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  FAKE_LOCK;
  if (flags != 0 || peerDevice < 0 || peerDevice >= st().device_count || peerDevice == current_device_)
    return fail(cudaErrorInvalidDevice);
  if (!st().peer_access.insert({current_device_, peerDevice}).second)
    return fail(cudaErrorPeerAccessAlreadyEnabled);
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t error) {
  FAKE_LOCK;
  return error == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}

/// Does not wait: runs what can run; cudaErrorNotReady while work remains
/// (an operation waiting for its peers).
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  FAKE_LOCK;
  CUstream_st* q = resolve(stream);
  if (q == nullptr) {
    anomaly("cudaStreamQuery of an unknown stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (q->capturing) return fail(cudaErrorStreamCaptureUnsupported);
  return progress(q) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaMalloc", &err) || prohibited_during_capture("cudaMalloc", &err)) return fail(err);
  if (devPtr == nullptr) return fail(cudaErrorInvalidValue);
  *devPtr = allocate(std::max<std::size_t>(size, 1), MemKind::device);
  return *devPtr == nullptr ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  FAKE_LOCK;
  if (devPtr == nullptr) return cudaSuccess;
  if (capture_prohibits_here()) anomaly("cudaFree during a stream capture");
  drain_device(memory_device(devPtr));  // cudaFree waits for the device, as on a GPU
  if (!release(devPtr, MemKind::device)) {
    anomaly("cudaFree of an unknown device pointer");
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  FAKE_LOCK;
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  *attributes = cudaPointerAttributes{};
  std::uintptr_t begin = 0;
  const Alloc* a = find_alloc(reinterpret_cast<std::uintptr_t>(ptr), &begin);
  if (a == nullptr) {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    return cudaSuccess;
  }
  attributes->type = a->kind == MemKind::device ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  attributes->device = a->kind == MemKind::device ? a->device : current_device_;
  attributes->devicePointer = const_cast<void*>(ptr);
  attributes->hostPointer = a->kind == MemKind::pinned ? const_cast<void*>(ptr) : nullptr;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaStreamCreateWithFlags", &err)) return fail(err);
  if (pStream == nullptr || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) return fail(cudaErrorInvalidValue);
  auto* s = new CUstream_st;
  s->flags = flags;
  s->device = current_device_;
  st().streams.insert(s);
  *pStream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  FAKE_LOCK;
  State& g = st();
  if (stream == nullptr || g.streams.count(stream) == 0) {
    anomaly("cudaStreamDestroy of an unknown stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (stream->capturing) anomaly("cudaStreamDestroy of a capturing stream");
  drain(stream);  // its queued work completes, then the resources go
  g.streams.erase(stream);
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  FAKE_LOCK;
  ++st().counters.host_syncs;
  cudaError_t err;
  if (injected("cudaStreamSynchronize", &err)) return fail(err);
  CUstream_st* q = resolve(stream);
  if (q == nullptr) {
    anomaly("cudaStreamSynchronize of an unknown stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (q->capturing || (q->legacy && blocking_capture_active())) {
    return refused_on_capturing_stream(*q, "cudaStreamSynchronize");
  }
  if (q->legacy)
    drain_legacy();
  else
    drain(q);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  FAKE_LOCK;
  ++st().counters.host_syncs;
  cudaError_t err;
  if (injected("cudaDeviceSynchronize", &err)) return fail(err);
  if (prohibited_during_capture("cudaDeviceSynchronize", &err)) return err;
  drain_device(current_device_);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaMemcpy", &err)) return fail(err);
  if (prohibited_during_capture("cudaMemcpy", &err)) return err;
  if (count == 0) return cudaSuccess;
  if ((err = check_copy_kind("cudaMemcpy", dst, src, count, kind)) != cudaSuccess) return err;
  // On the legacy stream, which the runner's non-blocking stream neither
  // waits for nor is waited on by. Host to device from pageable memory
  // returns once the source is staged, device to device at once: the copy
  // itself may land later. Every other direction returns when it is done.
  const Where d = where(dst), s = where(src);
  if (d == Where::device && s == Where::pageable) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + count);
    return enqueue(nullptr, Op{"cudaMemcpy", false, [=] {
                                 if (check("cudaMemcpy", "destination", dst, count)) std::memcpy(dst, staged->data(), count);
                               }});
  }
  if (d == Where::device && s == Where::device) return enqueue(nullptr, copy_op(dst, src, count));
  drain_legacy();
  std::memmove(dst, src, count);
  ++st().counters.ops_run;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaMemcpyAsync", &err)) return fail(err);
  CUstream_st* q = resolve(stream);
  if (q == nullptr) {
    anomaly("cudaMemcpyAsync on an unknown stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (count == 0) return cudaSuccess;
  if ((err = check_copy_kind("cudaMemcpyAsync", dst, src, count, kind)) != cudaSuccess) return err;
  const Where d = where(dst), s = where(src);
  if (d == Where::pageable || s == Where::pageable) {
    if (q->capturing || (q->legacy && blocking_capture_active())) {
      return refused_on_capturing_stream(*q, "cudaMemcpyAsync of pageable host memory");
    }
    if (s == Where::pageable && d == Where::device) {
      // From pageable memory: the source is staged before the call returns,
      // the copy lands in stream order.
      auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                        static_cast<const char*>(src) + count);
      return enqueue(stream, Op{"cudaMemcpyAsync", false, [=] {
                                  if (check("cudaMemcpyAsync", "destination", dst, count))
                                    std::memcpy(dst, staged->data(), count);
                                }});
    }
    // To (or between) pageable memory: the call returns once the copy is
    // done, after the stream's earlier work.
    if (q->legacy)
      drain_legacy();
    else
      drain(q);
    Op op = copy_op(dst, src, count);
    run(op);
    return cudaSuccess;
  }
  return enqueue(stream, copy_op(dst, src, count));
}

// Device to device (the runner's TP logits layout, SP's packing) and between
// device and PINNED host memory (the KV copier's staging): `height` rows of
// `width` bytes, at pitches dpitch / spitch, in stream order.
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaMemcpy2DAsync", &err)) return fail(err);
  if (resolve(stream) == nullptr) {
    anomaly("cudaMemcpy2DAsync on an unknown stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (width == 0 || height == 0) return cudaSuccess;
  const bool kind_ok = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost ||
                       kind == cudaMemcpyHostToDevice;
  if (!kind_ok || width > dpitch || width > spitch) {
    anomaly("cudaMemcpy2DAsync: only device / pinned copies with width <= pitch are modelled");
    return fail(cudaErrorInvalidValue);
  }
  const MemKind dkind = kind == cudaMemcpyDeviceToHost ? MemKind::pinned : MemKind::device;
  const MemKind skind = kind == cudaMemcpyHostToDevice ? MemKind::pinned : MemKind::device;
  const auto at = [](MemKind k) { return k == MemKind::device ? Where::device : Where::pinned; };
  const std::size_t dspan = (height - 1) * dpitch + width, sspan = (height - 1) * spitch + width;
  if (where(dst) != at(dkind) || where(src) != at(skind) || !in_memory(dst, dspan, dkind) ||
      !in_memory(src, sspan, skind)) {
    anomaly("cudaMemcpy2DAsync: a range is not inside one allocation of the kind's memory (pageable host memory is "
            "not modelled)");
    return fail(cudaErrorInvalidValue);
  }
  return enqueue(stream, Op{"cudaMemcpy2DAsync", false, [=] {
                              if (!check("cudaMemcpy2DAsync", "destination", dst, dspan, dkind) ||
                                  !check("cudaMemcpy2DAsync", "source", src, sspan, skind))
                                return;
                              for (std::size_t r = 0; r < height; ++r)
                                std::memmove(static_cast<char*>(dst) + r * dpitch,
                                             static_cast<const char*>(src) + r * spitch, width);
                            }});
}

// Device memory, on the legacy stream (synchronous for the host, as
// cudaMemset is with respect to it here: its work is queued there).
cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaMemset", &err)) return fail(err);
  if (prohibited_during_capture("cudaMemset", &err)) return err;
  if (count == 0) return cudaSuccess;
  if (where(devPtr) != Where::device || !in_memory(devPtr, count, MemKind::device)) {
    anomaly("cudaMemset: the range is not inside one device allocation");
    return fail(cudaErrorInvalidValue);
  }
  return enqueue(nullptr, Op{"cudaMemset", false, [=] {
                               if (check("cudaMemset", "destination", devPtr, count)) std::memset(devPtr, value, count);
                             }});
}

// Device memory only (what the runner uses: SP's padding rows), in stream order.
cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaMemsetAsync", &err)) return fail(err);
  if (resolve(stream) == nullptr) {
    anomaly("cudaMemsetAsync on an unknown stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (count == 0) return cudaSuccess;
  if (where(dst) != Where::device || !in_memory(dst, count, MemKind::device)) {
    anomaly("cudaMemsetAsync: the range is not inside one device allocation");
    return fail(cudaErrorInvalidValue);
  }
  return enqueue(stream, Op{"cudaMemsetAsync", false, [=] {
                              if (check("cudaMemsetAsync", "destination", dst, count)) std::memset(dst, value, count);
                            }});
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaMallocHost", &err)) return fail(err);
  if (prohibited_during_capture("cudaMallocHost", &err)) return err;
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = allocate(std::max<std::size_t>(size, 1), MemKind::pinned);
  return *ptr == nullptr ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  FAKE_LOCK;
  cudaError_t err;
  if (prohibited_during_capture("cudaFreeHost", &err)) return err;
  if (ptr == nullptr) return cudaSuccess;
  drain_device(current_device_);  // cudaFreeHost waits for the device, as on a GPU
  if (!release(ptr, MemKind::pinned)) {
    anomaly("cudaFreeHost of a pointer cudaMallocHost did not return");
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// ---- events: stream-ordered dependencies between streams ---------------------------
// A record is an operation on its stream; a wait is an operation that stays
// at its stream's head until the record it names has run (running the
// recording stream's queue as far as needed: a wait is how one stream's
// work makes another's run, in deferred mode too). A wait on an event never
// recorded waits for nothing. Records and waits on a capturing stream are
// not modelled (an anomaly).

bool known_event(cudaEvent_t e) { return e != nullptr && st().events.count(e) != 0; }

/// True once the event's record number `gen` has run (running its stream's
/// queue up to that record, as far as it can).
bool event_reached(const std::shared_ptr<FakeEventState>& ev, long gen) {
  if (ev->reached(gen)) return true;
  // Only as far as the record: the work queued after it stays behind.
  CUstream_st* q = ev->streams[static_cast<std::size_t>(gen - 1)];
  if (st().streams.count(q) != 0 || q == &st().legacy) (void)progress(q, [&] { return ev->reached(gen); });
  return ev->reached(gen);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaEventCreateWithFlags", &err)) return fail(err);
  constexpr unsigned kKnown = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~kKnown) != 0) return fail(cudaErrorInvalidValue);
  auto* e = new CUevent_st;
  e->state->device = current_device_;
  st().events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  FAKE_LOCK;
  if (!known_event(event)) {
    anomaly("cudaEventDestroy of an unknown event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  st().events.erase(event);
  delete event;  // queued records and waits keep its state
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  FAKE_LOCK;
  if (!known_event(event)) {
    anomaly("cudaEventRecord of an unknown event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  CUstream_st* q = resolve(stream);
  if (q == nullptr) {
    anomaly("cudaEventRecord on an unknown stream");
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (q->capturing) {
    anomaly("cudaEventRecord on a capturing stream (not modelled by the fake)");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  std::shared_ptr<FakeEventState> ev = event->state;
  const int device = q->legacy ? current_device_ : q->device;
  if (device != ev->device) {
    anomaly("cudaEventRecord of device " + std::to_string(ev->device) + "'s event on a stream of device " +
            std::to_string(device));
    return fail(cudaErrorInvalidResourceHandle);
  }
  ev->streams.push_back(q);
  ev->ran.push_back(0);
  const long gen = ++ev->recorded;
  return enqueue(stream, Op{"cudaEventRecord", false, [ev, gen] { ev->ran[static_cast<std::size_t>(gen - 1)] = 1; }});
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  FAKE_LOCK;
  if (!known_event(event)) {
    anomaly("cudaStreamWaitEvent on an unknown event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  CUstream_st* q = resolve(stream);
  if (q == nullptr || flags != 0) return fail(q == nullptr ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  if (q->capturing) {
    anomaly("cudaStreamWaitEvent on a capturing stream (not modelled by the fake)");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  std::shared_ptr<FakeEventState> ev = event->state;
  if (ev->recorded == 0) return cudaSuccess;  // an event never recorded: nothing to wait for
  const long gen = ev->recorded;
  return enqueue(stream, Op{"cudaStreamWaitEvent", false, [] {}, [ev, gen] { return event_reached(ev, gen); }});
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  FAKE_LOCK;
  ++st().counters.host_syncs;
  cudaError_t err;
  if (injected("cudaEventSynchronize", &err)) return fail(err);
  if (!known_event(event)) {
    anomaly("cudaEventSynchronize of an unknown event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (prohibited_during_capture("cudaEventSynchronize", &err)) return err;
  std::shared_ptr<FakeEventState> ev = event->state;
  const long gen = ev->recorded;
  if (!wait_until([&] { return event_reached(ev, gen); }, kDeadlock)) {
    anomaly("cudaEventSynchronize: waited " + std::to_string(kDeadlock.count()) + " s (a deadlock)");
    return fail(cudaErrorLaunchTimeout);
  }
  return cudaSuccess;
}

/// Does not wait: runs what can run; cudaErrorNotReady until the last record has run.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  FAKE_LOCK;
  if (!known_event(event)) {
    anomaly("cudaEventQuery of an unknown event");
    return fail(cudaErrorInvalidResourceHandle);
  }
  std::shared_ptr<FakeEventState> ev = event->state;
  return event_reached(ev, ev->recorded) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaStreamBeginCapture", &err)) return fail(err);
  CUstream_st* q = resolve(stream);
  if (q == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (q->legacy) return fail(cudaErrorStreamCaptureUnsupported);
  if (q->capturing) return fail(cudaErrorIllegalState);
  if (mode != cudaStreamCaptureModeThreadLocal && mode != cudaStreamCaptureModeGlobal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  q->capturing = true;
  q->capture_mode = mode;
  q->capture_thread = std::this_thread::get_id();
  q->invalidated = false;
  q->captured.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  FAKE_LOCK;
  CUstream_st* q = resolve(stream);
  if (q == nullptr || pGraph == nullptr) return fail(cudaErrorInvalidValue);
  if (!q->capturing) return fail(cudaErrorIllegalState);
  q->capturing = false;
  std::vector<Op> ops = std::move(q->captured);
  q->captured.clear();
  cudaError_t err;
  if (q->invalidated || injected("cudaStreamEndCapture", &err)) {
    *pGraph = nullptr;
    q->invalidated = false;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  auto* g = new CUgraph_st{std::move(ops)};
  st().graphs.insert(g);
  ++st().counters.graphs_captured;
  *pGraph = g;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaGraphInstantiate", &err)) return fail(err);
  if (pGraphExec == nullptr || graph == nullptr || st().graphs.count(graph) == 0) return fail(cudaErrorInvalidValue);
  if (flags != 0) return fail(cudaErrorInvalidValue);  // the fake supports plain instantiation only
  auto* e = new CUgraphExec_st{graph->ops};
  st().execs.insert(e);
  *pGraphExec = e;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  FAKE_LOCK;
  if (graph == nullptr || st().graphs.erase(graph) == 0) {
    anomaly("cudaGraphDestroy of an unknown graph");
    return fail(cudaErrorInvalidValue);
  }
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  FAKE_LOCK;
  if (graphExec == nullptr || st().execs.erase(graphExec) == 0) {
    anomaly("cudaGraphExecDestroy of an unknown graph exec");
    return fail(cudaErrorInvalidValue);
  }
  delete graphExec;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  FAKE_LOCK;
  cudaError_t err;
  if (injected("cudaGraphLaunch", &err)) return fail(err);
  if (graphExec == nullptr || st().execs.count(graphExec) == 0) {
    anomaly("cudaGraphLaunch of an unknown graph exec");
    return fail(cudaErrorInvalidValue);
  }
  if (resolve(stream) == nullptr) return fail(cudaErrorInvalidResourceHandle);
  ++st().counters.graph_launches;
  for (const Op& op : graphExec->ops) {
    ++st().counters.graph_ops_replayed;
    if ((err = enqueue(stream, op)) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // extern "C"

// ==== the fake's control API ====================================================

namespace shardline::testing_support::fake_cuda {

void reset(Execution mode) {
  FAKE_LOCK;
  State& g = st();
  g.mode = mode;
  g.counters = Counters{};
  g.anomalies.clear();
  g.injections.clear();
  g.kernel_runs.clear();
  g.device_count = 1;
  g.memory_bytes = std::size_t{80} << 30;
  g.peer_access.clear();
  current_device_ = 0;
  last_error = cudaSuccess;
}

Execution execution() {
  FAKE_LOCK;
  return st().mode;
}
std::vector<std::string> anomalies() {
  FAKE_LOCK;
  return st().anomalies;
}
Counters counters() {
  FAKE_LOCK;
  return st().counters;
}
long kernel_runs(const std::string& name) {
  FAKE_LOCK;
  const auto it = st().kernel_runs.find(name);
  return it == st().kernel_runs.end() ? 0 : it->second;
}

std::size_t live_device_bytes() {
  FAKE_LOCK;
  std::size_t n = 0;
  for (const auto& [a, al] : st().allocs)
    if (al.kind == MemKind::device) n += al.bytes;
  return n;
}
int live_device_allocations() {
  FAKE_LOCK;
  int n = 0;
  for (const auto& [a, al] : st().allocs) n += al.kind == MemKind::device;
  return n;
}
int live_pinned_allocations() {
  FAKE_LOCK;
  int n = 0;
  for (const auto& [a, al] : st().allocs) n += al.kind == MemKind::pinned;
  return n;
}
int live_streams() {
  FAKE_LOCK;
  return static_cast<int>(st().streams.size());
}
int live_graphs() {
  FAKE_LOCK;
  return static_cast<int>(st().graphs.size());
}
int live_events() {
  FAKE_LOCK;
  return static_cast<int>(st().events.size());
}
int live_graph_execs() {
  FAKE_LOCK;
  return static_cast<int>(st().execs.size());
}
int pending_ops() {
  FAKE_LOCK;
  int n = 0;
  for (CUstream_st* s : st().streams) n += static_cast<int>(s->pending.size());
  return n + static_cast<int>(st().legacy.pending.size());
}
void set_device_count(int n) {
  FAKE_LOCK;
  st().device_count = n;
}
void set_memory_bytes(std::size_t bytes) {
  FAKE_LOCK;
  st().memory_bytes = bytes;
}

void fail_call(const std::string& call, int error, int skip) {
  FAKE_LOCK;
  st().injections[call] = Injection{static_cast<cudaError_t>(error), skip};
}

}  // namespace shardline::testing_support::fake_cuda

// ==== kernels::cuda on the CPU ====================================================

namespace shardline::kernels::cuda {
namespace {

namespace cpu = shardline::kernels::cpu;

Error bad(const std::string& why) { return make_error(ErrorCode::invalid_argument, "fake cuda: " + why); }

Status launch_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::ok_status();
  (void)cudaGetLastError();
  return make_error(ErrorCode::internal, "fake cuda: " + what + ": " + cudaGetErrorString(e));
}

/// Queues a kernel on `stream` (recorded instead while it captures).
Status launch(Stream stream, const char* name, std::function<void()> body) {
  return launch_status(enqueue(stream, Op{name, true, std::move(body)}), name);
}

bool dtype_ok(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

float widen(const void* w, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(w)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(w)[i]);
    default: return f16_to_f32(static_cast<const std::uint16_t*>(w)[i]);
  }
}

bool check_cache(const char* op, const cpu::KvCacheLayer& c) {
  const std::size_t bytes = static_cast<std::size_t>(c.num_blocks) * c.num_kv_heads * c.block_size * c.head_dim *
                            dtype_size(c.dtype);
  return check(op, "K cache", c.k, bytes) && check(op, "V cache", c.v, bytes);
}

/// y[i, :] = x[i, :] . w^T (+ y) row by row, k in order 0..K-1 (F32; w widened exactly).
void gemm_rows(const float* x, int x_stride, int m, int k, const void* w, DType w_dtype, int n, float* y,
               int y_stride, bool accumulate) {
#pragma omp parallel for schedule(static) if (static_cast<long>(m) * n * k > 65536)
  for (int i = 0; i < m; ++i) {
    std::vector<float> xr(static_cast<std::size_t>(k));
    for (int j = 0; j < k; ++j) xr[static_cast<std::size_t>(j)] = x[static_cast<long>(i) * x_stride + j];
    float* yr = y + static_cast<long>(i) * y_stride;
    for (int c = 0; c < n; ++c) {
      float acc = 0.0f;
      const std::size_t w0 = static_cast<std::size_t>(c) * k;
      for (int j = 0; j < k; ++j) acc += xr[static_cast<std::size_t>(j)] * widen(w, w_dtype, w0 + j);
      yr[c] = accumulate ? yr[c] + acc : acc;
    }
  }
}

}  // namespace

Status synchronize(Stream stream) { return launch_status(cudaStreamSynchronize(stream), "synchronize"); }

Status embedding(const std::int32_t* token_ids, int num_tokens, const void* table, DType dtype, int hidden,
                 float* out, Stream stream) {
  FAKE_LOCK;
  if (num_tokens < 0 || hidden < 0) return bad("embedding: negative size");
  if (!dtype_ok(dtype)) return make_error(ErrorCode::unsupported, "fake cuda: embedding dtype");
  if (num_tokens == 0 || hidden == 0) return Status::ok_status();
  if (token_ids == nullptr || table == nullptr || out == nullptr) return bad("embedding: null pointer");
  return launch(stream, "embedding", [=] {
    const char* op = "embedding";
    const std::size_t row = static_cast<std::size_t>(hidden) * dtype_size(dtype);
    if (!check(op, "token_ids", token_ids, static_cast<std::size_t>(num_tokens) * 4) ||
        !check(op, "out", out, static_cast<std::size_t>(num_tokens) * hidden * 4))
      return;
    for (int t = 0; t < num_tokens; ++t)
      if (!check(op, "table row", offset(table, static_cast<long long>(token_ids[t]) * static_cast<long long>(row)), row))
        return;
    cpu::embedding(token_ids, num_tokens, table, dtype, hidden, out);
  });
}

Status rms_norm(const float* x, int x_stride, const float* weight, float* y, int y_stride, int rows, int dim, float eps,
                Stream stream) {
  FAKE_LOCK;
  if (rows < 0 || dim < 0) return bad("rms_norm: negative size");
  if (rows == 0 || dim == 0) return Status::ok_status();
  if (x_stride < dim || y_stride < dim) return bad("rms_norm: stride < dim");
  if (x == nullptr || weight == nullptr || y == nullptr) return bad("rms_norm: null pointer");
  return launch(stream, "rms_norm", [=] {
    const char* op = "rms_norm";
    if (!check(op, "x", x, span_bytes(rows, x_stride, dim, 4)) || !check(op, "y", y, span_bytes(rows, y_stride, dim, 4)) ||
        !check(op, "weight", weight, static_cast<std::size_t>(dim) * 4))
      return;
    cpu::rms_norm(x, x_stride, weight, y, y_stride, rows, dim, eps);
  });
}

Status rms_norm_heads(float* x, int num_tokens, int row_stride, int num_heads, int head_dim, const float* weight,
                      float eps, Stream stream) {
  FAKE_LOCK;
  if (num_tokens < 0 || num_heads < 0 || head_dim < 0) return bad("rms_norm_heads: negative size");
  if (row_stride < num_heads * head_dim) return bad("rms_norm_heads: row_stride < num_heads * head_dim");
  if (num_tokens == 0 || num_heads == 0 || head_dim == 0) return Status::ok_status();
  if (x == nullptr || weight == nullptr) return bad("rms_norm_heads: null pointer");
  return launch(stream, "rms_norm_heads", [=] {
    const char* op = "rms_norm_heads";
    if (!check(op, "x", x, span_bytes(num_tokens, row_stride, num_heads * head_dim, 4)) ||
        !check(op, "weight", weight, static_cast<std::size_t>(head_dim) * 4))
      return;
    for (int t = 0; t < num_tokens; ++t) {
      float* xt = x + static_cast<long>(t) * row_stride;
      cpu::rms_norm(xt, head_dim, weight, xt, head_dim, num_heads, head_dim, eps);
    }
  });
}

Status rms_norm_rows(const float* x, int x_stride, const std::int32_t* row_ids, int num_rows, const float* weight,
                     float* y, int y_stride, int dim, float eps, Stream stream) {
  FAKE_LOCK;
  if (num_rows < 0 || dim < 0) return bad("rms_norm_rows: negative size");
  if (num_rows == 0 || dim == 0) return Status::ok_status();
  if (x_stride < dim || y_stride < dim) return bad("rms_norm_rows: stride < dim");
  if (x == nullptr || row_ids == nullptr || weight == nullptr || y == nullptr) return bad("rms_norm_rows: null pointer");
  return launch(stream, "rms_norm_rows", [=] {
    const char* op = "rms_norm_rows";
    if (!check(op, "row_ids", row_ids, static_cast<std::size_t>(num_rows) * 4) ||
        !check(op, "y", y, span_bytes(num_rows, y_stride, dim, 4)) ||
        !check(op, "weight", weight, static_cast<std::size_t>(dim) * 4))
      return;
    for (int i = 0; i < num_rows; ++i) {
      const float* xr = static_cast<const float*>(offset(x, static_cast<long long>(row_ids[i]) * x_stride * 4));
      if (!check(op, "x row", xr, static_cast<std::size_t>(dim) * 4)) return;
    }
    for (int i = 0; i < num_rows; ++i)
      cpu::rms_norm(x + static_cast<long>(row_ids[i]) * x_stride, x_stride, weight, y + static_cast<long>(i) * y_stride,
                    y_stride, 1, dim, eps);
  });
}

Status add_bias(float* y, int y_stride, const float* bias, int rows, int n, Stream stream) {
  FAKE_LOCK;
  if (rows < 0 || n < 0) return bad("add_bias: negative size");
  if (rows == 0 || n == 0) return Status::ok_status();
  if (y_stride < n) return bad("add_bias: y_stride < n");
  if (y == nullptr || bias == nullptr) return bad("add_bias: null pointer");
  return launch(stream, "add_bias", [=] {
    if (!check("add_bias", "y", y, span_bytes(rows, y_stride, n, 4)) ||
        !check("add_bias", "bias", bias, static_cast<std::size_t>(n) * 4))
      return;
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < n; ++j) y[static_cast<long>(r) * y_stride + j] += bias[j];
  });
}

Status add_rms_norm(float* residual, const float* x, const float* weight, float* y, int rows, int dim, float eps,
                    Stream stream) {
  FAKE_LOCK;
  if (rows < 0 || dim < 0) return bad("add_rms_norm: negative size");
  if (rows == 0 || dim == 0) return Status::ok_status();
  if (residual == nullptr || x == nullptr || weight == nullptr || y == nullptr) return bad("add_rms_norm: null pointer");
  return launch(stream, "add_rms_norm", [=] {
    const std::size_t bytes = static_cast<std::size_t>(rows) * dim * 4;
    if (!check("add_rms_norm", "residual", residual, bytes) || !check("add_rms_norm", "x", x, bytes) ||
        !check("add_rms_norm", "y", y, bytes) || !check("add_rms_norm", "weight", weight, static_cast<std::size_t>(dim) * 4))
      return;
    cpu::add_rms_norm(residual, x, weight, y, rows, dim, eps);
  });
}

Status add_inplace(float* residual, const float* x, long n, Stream stream) {
  FAKE_LOCK;
  if (n < 0) return bad("add_inplace: negative size");
  if (n == 0) return Status::ok_status();
  if (residual == nullptr || x == nullptr) return bad("add_inplace: null pointer");
  return launch(stream, "add_inplace", [=] {
    if (!check("add_inplace", "residual", residual, static_cast<std::size_t>(n) * 4) ||
        !check("add_inplace", "x", x, static_cast<std::size_t>(n) * 4))
      return;
    cpu::add_inplace(residual, x, n);
  });
}

Status silu_and_mul(const float* gate_up, float* out, int rows, int inter, Stream stream) {
  FAKE_LOCK;
  if (rows < 0 || inter < 0) return bad("silu_and_mul: negative size");
  if (rows == 0 || inter == 0) return Status::ok_status();
  if (gate_up == nullptr || out == nullptr) return bad("silu_and_mul: null pointer");
  return launch(stream, "silu_and_mul", [=] {
    if (!check("silu_and_mul", "gate_up", gate_up, static_cast<std::size_t>(rows) * 2 * inter * 4) ||
        !check("silu_and_mul", "out", out, static_cast<std::size_t>(rows) * inter * 4))
      return;
    cpu::silu_and_mul(gate_up, out, rows, inter);
  });
}

Status rope(float* x, int num_tokens, int row_stride, int num_heads, int head_dim, const std::int32_t* positions,
            const float* inv_freq, Stream stream) {
  FAKE_LOCK;
  if (num_tokens < 0 || num_heads < 0 || head_dim < 0) return bad("rope: negative size");
  if (head_dim % 2 != 0) return bad("rope: odd head_dim");
  if (row_stride < num_heads * head_dim) return bad("rope: row_stride < num_heads * head_dim");
  if (num_tokens == 0 || num_heads == 0 || head_dim == 0) return Status::ok_status();
  if (x == nullptr || positions == nullptr || inv_freq == nullptr) return bad("rope: null pointer");
  return launch(stream, "rope", [=] {
    if (!check("rope", "x", x, span_bytes(num_tokens, row_stride, num_heads * head_dim, 4)) ||
        !check("rope", "positions", positions, static_cast<std::size_t>(num_tokens) * 4) ||
        !check("rope", "inv_freq", inv_freq, static_cast<std::size_t>(head_dim / 2) * 4))
      return;
    cpu::rope(x, num_tokens, row_stride, num_heads, head_dim, positions, inv_freq);
  });
}

Status write_kv(const float* k, const float* v, int row_stride, int num_tokens, const std::int32_t* slot_mapping,
                const cpu::KvCacheLayer& cache, Stream stream) {
  FAKE_LOCK;
  if (num_tokens < 0) return bad("write_kv: negative size");
  if (cache.dtype != DType::f32 && cache.dtype != DType::bf16)
    return make_error(ErrorCode::unsupported, "fake cuda: write_kv dtype");
  if (num_tokens == 0) return Status::ok_status();
  const int width = cache.num_kv_heads * cache.head_dim;
  if (row_stride < width) return bad("write_kv: row_stride < num_kv_heads * head_dim");
  if (k == nullptr || v == nullptr || slot_mapping == nullptr || cache.k == nullptr || cache.v == nullptr)
    return bad("write_kv: null pointer");
  const cpu::KvCacheLayer c = cache;
  return launch(stream, "write_kv", [=] {
    const char* op = "write_kv";
    if (!check(op, "slot_mapping", slot_mapping, static_cast<std::size_t>(num_tokens) * 4) ||
        !check(op, "k", k, span_bytes(num_tokens, row_stride, width, 4)) ||
        !check(op, "v", v, span_bytes(num_tokens, row_stride, width, 4)) || !check_cache(op, c))
      return;
    const long slots = static_cast<long>(c.num_blocks) * c.block_size;
    for (int t = 0; t < num_tokens; ++t) {
      const std::int32_t slot = slot_mapping[t];
      if (slot < 0 || slot >= slots) continue;  // skipped, as documented
      cpu::write_kv(k + static_cast<long>(t) * row_stride, v + static_cast<long>(t) * row_stride, row_stride, 1, &slot, c);
    }
  });
}

Status gather_kv(const KvGatherCache& cache, const KvGatherPiece* pieces, int num_pieces, int max_piece_layers,
                 const std::int32_t* blocks, void* out, Stream stream) {
  FAKE_LOCK;
  if (num_pieces < 0 || max_piece_layers < 0 || cache.num_blocks < 0 || cache.num_kv_heads < 0 ||
      cache.block_size <= 0 || cache.head_dim < 0)
    return bad("gather_kv: bad size");
  if (!dtype_ok(cache.dtype)) return make_error(ErrorCode::unsupported, "fake cuda: gather_kv dtype");
  if (num_pieces == 0 || max_piece_layers == 0 || cache.num_kv_heads == 0 || cache.head_dim == 0)
    return Status::ok_status();
  if (cache.data == nullptr || pieces == nullptr || blocks == nullptr || out == nullptr)
    return bad("gather_kv: null pointer");
  if (static_cast<long>(max_piece_layers) * 2 * cache.num_kv_heads > 65535) return bad("gather_kv: grid limit");
  const KvGatherCache c = cache;
  return launch(stream, "gather_kv", [=] {
    const char* op = "gather_kv";
    const std::size_t es = dtype_size(c.dtype);
    const long heads = c.num_kv_heads, bs = c.block_size, hd = c.head_dim;
    const std::size_t cache_elems = static_cast<std::size_t>(c.num_layers) * 2 * c.num_blocks * heads * bs * hd;
    if (!check(op, "cache", c.data, cache_elems * es) ||
        !check(op, "pieces", pieces, static_cast<std::size_t>(num_pieces) * sizeof(KvGatherPiece)))
      return;
    const auto* src = static_cast<const char*>(c.data);
    auto* dst = static_cast<char*>(out);
    for (int i = 0; i < num_pieces; ++i) {
      const KvGatherPiece p = pieces[i];
      if (p.num_layers < 0 || p.num_layers > max_piece_layers || p.layer < 0 || p.layer + p.num_layers > c.num_layers ||
          p.token_begin < 0 || p.num_tokens < 0 || p.out_offset < 0 || p.blocks_offset < 0) {
        anomaly("gather_kv: piece " + std::to_string(i) + " is outside the cache or the launch's grid");
        return;
      }
      if (p.num_tokens == 0 || p.num_layers == 0) continue;
      const long first = p.token_begin / bs, last = (p.token_begin + p.num_tokens - 1) / bs;
      const std::int32_t* table = blocks + p.blocks_offset;
      const std::size_t piece_elems = static_cast<std::size_t>(p.num_layers) * 2 * heads * p.num_tokens * hd;
      if (!check(op, "blocks", table, static_cast<std::size_t>(last - first + 1) * 4) ||
          !check(op, "out", dst + p.out_offset * static_cast<long>(es), piece_elems * es))
        return;
      for (long b = 0; b <= last - first; ++b)
        if (table[b] < 0 || table[b] >= c.num_blocks) {
          anomaly("gather_kv: piece " + std::to_string(i) + " reads block " + std::to_string(table[b]) +
                  " outside the cache's " + std::to_string(c.num_blocks));
          return;
        }
      std::size_t o = static_cast<std::size_t>(p.out_offset);
      for (long l = 0; l < p.num_layers; ++l)
        for (long kv = 0; kv < 2; ++kv)
          for (long h = 0; h < heads; ++h)
            for (long t = 0; t < p.num_tokens; ++t)
              for (long d = 0; d < hd; ++d, ++o) {
                const long pos = p.token_begin + t;
                const long blk = table[pos / bs - first], off = pos % bs;
                const long slab = (((p.layer + l) * 2 + kv) * c.num_blocks + blk) * heads + h;
                const long e = slab * bs * hd + (kv == 0 ? d * bs + off : off * hd + d);
                std::memcpy(dst + o * es, src + static_cast<std::size_t>(e) * es, es);
              }
    }
  });
}

Status paged_attention(const float* q, int q_stride, const AttentionSeq* seqs, int num_seqs, int max_num_q,
                       int max_context_len, const cpu::KvCacheLayer& cache, int num_heads, float scale, float* out,
                       int out_stride, void* workspace, std::size_t workspace_bytes, Stream stream) {
  FAKE_LOCK;
  const int hd = cache.head_dim;
  const int kvh = cache.num_kv_heads;
  if (num_seqs < 0 || max_num_q < 0 || max_context_len < 0 || num_heads < 0 || kvh < 0 || hd < 0)
    return bad("paged_attention: negative size");
  if (cache.dtype != DType::f32 && cache.dtype != DType::bf16)
    return make_error(ErrorCode::unsupported, "fake cuda: paged_attention KV dtype");
  if (!attention_head_dim_supported(hd)) return make_error(ErrorCode::unsupported, "fake cuda: head_dim");
  if (num_seqs == 0 || max_num_q == 0) return Status::ok_status();
  if (kvh == 0 || num_heads % kvh != 0) return bad("paged_attention: num_heads not a multiple of num_kv_heads");
  if (q_stride < num_heads * hd || out_stride < num_heads * hd) return bad("paged_attention: stride");
  if (q == nullptr || seqs == nullptr || out == nullptr || cache.k == nullptr || cache.v == nullptr)
    return bad("paged_attention: null pointer");
  if (max_context_len < max_num_q) return bad("paged_attention: max_context_len < max_num_q");
  if (num_seqs > 65535 || kvh > 65535) return bad("paged_attention: grid limit");
  const std::size_t need = paged_attention_workspace_bytes(num_seqs, num_heads, hd, max_context_len);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr))
    return bad("paged_attention: workspace of " + std::to_string(workspace_bytes) + " bytes < " + std::to_string(need));
  const cpu::KvCacheLayer c = cache;
  return launch(stream, "paged_attention", [=] {
    const char* op = "paged_attention";
    if (!check(op, "seqs", seqs, static_cast<std::size_t>(num_seqs) * sizeof(AttentionSeq)) || !check_cache(op, c))
      return;
    if (need > 0 && !check(op, "workspace", workspace, need)) return;
    const auto splits = [](int len) { return (len + kDecodeSplitTokens - 1) / kDecodeSplitTokens; };
    std::vector<AttentionSeq> run;
    for (int i = 0; i < num_seqs; ++i) {
      const AttentionSeq s = seqs[i];
      const std::string who = std::string(op) + ": sequence " + std::to_string(i);
      if (s.num_q <= 0) continue;
      if (s.num_q > max_num_q) {
        anomaly(who + " has num_q " + std::to_string(s.num_q) + " > max_num_q " + std::to_string(max_num_q) +
                " (the kernel skips it)");
        continue;
      }
      if (s.num_q == 1 && splits(s.context_len) > splits(max_context_len)) {
        anomaly(who + " has context_len " + std::to_string(s.context_len) + " beyond max_context_len " +
                std::to_string(max_context_len) + " (the decode kernel skips it)");
        continue;
      }
      if (s.context_len < s.num_q || s.q_start < 0) {
        anomaly(who + ": context_len " + std::to_string(s.context_len) + " < num_q or negative q_start");
        continue;
      }
      const int nblocks = (s.context_len + c.block_size - 1) / c.block_size;
      if (!check(op, "block table", s.block_table, static_cast<std::size_t>(nblocks) * 4)) continue;
      bool ok = true;
      for (int b = 0; b < nblocks && ok; ++b)
        if (s.block_table[b] < 0 || s.block_table[b] >= c.num_blocks) {
          anomaly(who + ": block id " + std::to_string(s.block_table[b]) + " outside the cache");
          ok = false;
        }
      ok = ok && check(op, "q rows", offset(q, static_cast<long long>(s.q_start) * q_stride * 4),
                       span_bytes(s.num_q, q_stride, static_cast<long>(num_heads) * hd, 4));
      ok = ok && check(op, "out rows", offset(out, static_cast<long long>(s.q_start) * out_stride * 4),
                       span_bytes(s.num_q, out_stride, static_cast<long>(num_heads) * hd, 4));
      if (ok) run.push_back(s);
    }
    cpu::paged_attention(q, q_stride, std::span<const AttentionSeq>(run), c, num_heads, scale, out, out_stride);
  });
}

// ---- GEMM ------------------------------------------------------------------------

// As the real context: a cuBLASLt workspace (unused here) and a cast scratch
// of max_rows x cast_row_stride(max_k) 16-bit elements in device memory,
// into which 16-bit-weight linears cast x before their GEMM.
struct GemmContext::Impl {
  DeviceBuffer workspace;
  DeviceBuffer scratch;
  std::set<std::tuple<int, int, int, int, int, int, bool>> plans;  // fast-mode problems seen
};

Result<std::unique_ptr<GemmContext>> GemmContext::create(int max_rows, int max_k) {
  FAKE_LOCK;
  if (max_rows < 0 || max_k < 0) return bad("GemmContext: negative limits");
  auto g = std::unique_ptr<GemmContext>(new GemmContext());
  g->impl_ = std::make_unique<Impl>();
  g->max_rows_ = max_rows;
  g->max_k_ = max_k;
  auto ws = DeviceBuffer::allocate(kGemmWorkspaceBytes);
  if (!ws) return std::move(ws).error();
  g->impl_->workspace = std::move(ws).value();
  auto sc = DeviceBuffer::allocate(static_cast<std::size_t>(max_rows) * static_cast<std::size_t>(cast_row_stride(max_k)) * 2);
  if (!sc) return std::move(sc).error();
  g->impl_->scratch = std::move(sc).value();
  return g;
}

GemmContext::~GemmContext() = default;

std::size_t GemmContext::cached_plans() const noexcept { return impl_ ? impl_->plans.size() : 0; }

Status GemmContext::linear(const float* x, int x_stride, int m, int k, const void* w, DType w_dtype, int n, float* y,
                           int y_stride, bool accumulate, GemmMode mode, Stream stream) {
  FAKE_LOCK;
  if (Status s = check_linear_args(x, x_stride, m, k, w, w_dtype, n, y, y_stride, mode, max_rows_, max_k_); !s) return s;
  if (m == 0) return Status::ok_status();
  if (mode == GemmMode::fast)
    impl_->plans.emplace(m, n, k, static_cast<int>(w_dtype), x_stride, y_stride, accumulate);
  auto* scratch = impl_->scratch.as<std::uint16_t>();
  return launch(stream, "linear", [=] {
    const char* op = "linear";
    if (!check(op, "x", x, span_bytes(m, x_stride, k, 4)) ||
        !check(op, "w", w, static_cast<std::size_t>(n) * k * dtype_size(w_dtype)) ||
        !check(op, "y", y, span_bytes(m, y_stride, n, 4)))
      return;
    if (w_dtype == DType::f32) {
      gemm_rows(x, x_stride, m, k, w, w_dtype, n, y, y_stride, accumulate);
      return;
    }
    // 16-bit weights: x cast to the weight dtype into the scratch, then the GEMM on it.
    const long xs16 = cast_row_stride(k);
    if (!check(op, "cast scratch", scratch, span_bytes(m, xs16, k, 2))) return;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < k; ++j) {
        const float v = x[static_cast<long>(i) * x_stride + j];
        scratch[i * xs16 + j] = w_dtype == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
      }
    std::vector<float> xf(static_cast<std::size_t>(m) * k);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < k; ++j) xf[static_cast<std::size_t>(i) * k + j] = widen(scratch, w_dtype, i * xs16 + j);
    gemm_rows(xf.data(), k, m, k, w, w_dtype, n, y, y_stride, accumulate);
  });
}

Status GemmContext::linear_lowp(const void* x16, int x_stride, int m, int k, const void* w, DType dtype, int n,
                                float* y, int y_stride, bool accumulate, Stream stream) {
  FAKE_LOCK;
  if (Status s = check_linear_args(x16, x_stride, m, k, w, dtype, n, y, y_stride, GemmMode::fast, m, k); !s) return s;
  if (dtype == DType::f32) return make_error(ErrorCode::unsupported, "fake cuda: linear_lowp of F32");
  if (m == 0) return Status::ok_status();
  return launch(stream, "linear_lowp", [=] {
    const char* op = "linear_lowp";
    if (!check(op, "x16", x16, span_bytes(m, x_stride, k, 2)) ||
        !check(op, "w", w, static_cast<std::size_t>(n) * k * 2) || !check(op, "y", y, span_bytes(m, y_stride, n, 4)))
      return;
    std::vector<float> xf(static_cast<std::size_t>(m) * k);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < k; ++j)
        xf[static_cast<std::size_t>(i) * k + j] = widen(x16, dtype, static_cast<std::size_t>(i) * x_stride + j);
    gemm_rows(xf.data(), k, m, k, w, dtype, n, y, y_stride, accumulate);
  });
}

Status cast_f32(const float* x, long n, DType dtype, void* out, Stream stream) {
  FAKE_LOCK;
  if (n < 0) return bad("cast_f32: negative size");
  if (!dtype_ok(dtype)) return make_error(ErrorCode::unsupported, "fake cuda: cast_f32 dtype");
  if (n == 0) return Status::ok_status();
  if (x == nullptr || out == nullptr) return bad("cast_f32: null pointer");
  return launch(stream, "cast_f32", [=] {
    if (!check("cast_f32", "x", x, static_cast<std::size_t>(n) * 4) ||
        !check("cast_f32", "out", out, static_cast<std::size_t>(n) * dtype_size(dtype)))
      return;
    for (long i = 0; i < n; ++i) {
      if (dtype == DType::f32) static_cast<float*>(out)[i] = x[i];
      else if (dtype == DType::bf16) static_cast<std::uint16_t*>(out)[i] = f32_to_bf16(x[i]);
      else static_cast<std::uint16_t*>(out)[i] = f32_to_f16(x[i]);
    }
  });
}

// ---- sampling ----------------------------------------------------------------------

Status sample(float* logits, int num_rows, int vocab, const SampleRow* rows, std::int32_t* out_ids, Stream stream) {
  FAKE_LOCK;
  if (num_rows < 0 || vocab < 0) return bad("sample: negative size");
  if (num_rows == 0) return Status::ok_status();
  if (logits == nullptr || rows == nullptr || out_ids == nullptr) return bad("sample: null pointer");
  return launch(stream, "sample", [=] {
    const char* op = "sample";
    if (!check(op, "logits", logits, static_cast<std::size_t>(num_rows) * vocab * 4) ||
        !check(op, "rows", rows, static_cast<std::size_t>(num_rows) * sizeof(SampleRow)) ||
        !check(op, "out_ids", out_ids, static_cast<std::size_t>(num_rows) * 4))
      return;
    for (int i = 0; i < num_rows; ++i) {
      const SampleRow r = rows[i];
      if (r.num_penalty_ids < 0 || r.num_masked_ids < 0 || r.num_output_tokens < 0) {
        anomaly("sample: row " + std::to_string(i) + " has negative counts");
        return;
      }
      const auto np = static_cast<std::size_t>(r.num_penalty_ids);
      if (!check(op, "penalty_ids", r.penalty_ids, np * 4) || !check(op, "output_counts", r.output_counts, np * 4) ||
          !check(op, "masked_ids", r.masked_ids, static_cast<std::size_t>(r.num_masked_ids) * 4) ||
          (r.token_bitmask != nullptr &&
           !check(op, "token_bitmask", r.token_bitmask, (static_cast<std::size_t>(vocab) + 31) / 32 * 4)))
        return;
      float* row = logits + static_cast<long>(i) * vocab;
      if (r.token_bitmask != nullptr)  // the grammar mask first, as the kernel's step 0
        for (int t = 0; t < vocab; ++t)
          if (((r.token_bitmask[t / 32] >> (t % 32)) & 1u) == 0u) row[t] = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < np; ++j)
        if (r.output_counts[j] < 0 || (j > 0 && r.penalty_ids[j] <= r.penalty_ids[j - 1])) {
          anomaly("sample: row " + std::to_string(i) + ": penalty list not distinct ascending ids with counts >= 0");
          return;
        }
      // The sampling::SamplingParams + SampleContext the row stands for: the
      // listed ids as the prompt, each id repeated by its output count (then
      // out-of-range padding up to num_output_tokens) as the output.
      sampling::SamplingParams p;
      p.temperature = r.temperature;
      p.top_k = r.top_k;
      p.top_p = r.top_p;
      p.min_p = r.min_p;
      p.repetition_penalty = r.repetition_penalty;
      p.presence_penalty = r.presence_penalty;
      p.frequency_penalty = r.frequency_penalty;
      p.min_tokens = r.min_tokens;
      std::vector<std::int32_t> prompt(r.penalty_ids, r.penalty_ids + np);
      std::vector<std::int32_t> output;
      for (std::size_t j = 0; j < np; ++j) output.insert(output.end(), static_cast<std::size_t>(r.output_counts[j]), r.penalty_ids[j]);
      if (static_cast<int>(output.size()) > r.num_output_tokens) {
        anomaly("sample: row " + std::to_string(i) + " counts more output tokens than num_output_tokens");
        return;
      }
      output.resize(static_cast<std::size_t>(r.num_output_tokens), -1);
      std::vector<std::int32_t> masked(r.masked_ids, r.masked_ids + r.num_masked_ids);
      sampling::SampleContext ctx;
      ctx.seed = r.seed;
      ctx.position = r.position;
      ctx.prompt_ids = prompt;
      ctx.output_ids = output;
      ctx.min_tokens_masked_ids = masked;
      out_ids[i] = vocab == 0 ? 0 : sampling::sample(std::span<float>(row, vocab), p, ctx);
    }
  });
}

Status philox_uniforms(const std::uint64_t* seeds, const std::int32_t* positions, int n, float* out, Stream stream) {
  FAKE_LOCK;
  if (n < 0) return bad("philox_uniforms: negative size");
  if (n == 0) return Status::ok_status();
  if (seeds == nullptr || positions == nullptr || out == nullptr) return bad("philox_uniforms: null pointer");
  return launch(stream, "philox_uniforms", [=] {
    if (!check("philox_uniforms", "seeds", seeds, static_cast<std::size_t>(n) * 8) ||
        !check("philox_uniforms", "positions", positions, static_cast<std::size_t>(n) * 4) ||
        !check("philox_uniforms", "out", out, static_cast<std::size_t>(n) * 4))
      return;
    for (int i = 0; i < n; ++i) out[i] = sampling::philox_uniform(seeds[i], static_cast<std::uint64_t>(positions[i]));
  });
}

// ---- DeviceBuffer --------------------------------------------------------------------

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
  FAKE_LOCK;
  other.ptr_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  FAKE_LOCK;
  if (this != &other) {
    reset();
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Result<DeviceBuffer> DeviceBuffer::allocate(std::size_t bytes) {
  FAKE_LOCK;
  if (bytes == 0) return DeviceBuffer{};
  cudaError_t err;
  if (injected("cudaMalloc", &err) || prohibited_during_capture("cudaMalloc", &err)) {
    const ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::internal;
    return make_error(code, "cudaMalloc of " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(fail(err)));
  }
  DeviceBuffer b;
  b.ptr_ = fake_detail::allocate(bytes, MemKind::device);
  if (b.ptr_ == nullptr) return make_error(ErrorCode::out_of_memory, "cudaMalloc of " + std::to_string(bytes) + " bytes");
  b.bytes_ = bytes;
  return b;
}

Status DeviceBuffer::copy_from_host(const void* src, std::size_t bytes, std::size_t off) {
  FAKE_LOCK;
  if (off > bytes_ || bytes > bytes_ - off) return bad("copy_from_host: range exceeds the buffer");
  if (bytes == 0) return Status::ok_status();
  return launch_status(cudaMemcpy(static_cast<char*>(ptr_) + off, src, bytes, cudaMemcpyHostToDevice), "copy_from_host");
}

Status DeviceBuffer::copy_to_host(void* dst, std::size_t bytes, std::size_t off) const {
  FAKE_LOCK;
  if (off > bytes_ || bytes > bytes_ - off) return bad("copy_to_host: range exceeds the buffer");
  if (bytes == 0) return Status::ok_status();
  return launch_status(cudaMemcpy(dst, static_cast<const char*>(ptr_) + off, bytes, cudaMemcpyDeviceToHost),
                       "copy_to_host");
}

Status DeviceBuffer::fill_bytes(int value) {
  FAKE_LOCK;
  if (ptr_ == nullptr) return Status::ok_status();
  cudaError_t err;
  if (prohibited_during_capture("cudaMemset", &err)) return launch_status(err, "fill_bytes");
  drain_legacy();  // cudaMemset on the legacy stream, then cudaStreamSynchronize(nullptr)
  std::memset(ptr_, value, bytes_);
  return Status::ok_status();
}

void DeviceBuffer::reset() noexcept {
  FAKE_LOCK;
  if (ptr_ == nullptr) return;
  if (capture_prohibits_here()) anomaly("cudaFree during a stream capture");
  drain_device(memory_device(ptr_));  // cudaFree waits for the device, as on a GPU
  if (!release(ptr_, MemKind::device)) anomaly("cudaFree of an unknown device pointer");
  ptr_ = nullptr;
  bytes_ = 0;
}

// ---- devices -------------------------------------------------------------------------

DeviceQuery query_devices() {
  FAKE_LOCK;
  DeviceQuery q;
  if (st().device_count < 0) {
    q.error = cudaGetErrorString(cudaErrorNoDevice);
    return q;
  }
  for (int i = 0; i < st().device_count; ++i) {
    DeviceInfo d;
    d.index = i;
    d.name = "fake CUDA device (CPU test double)";
    d.sm_major = 9;
    d.total_memory_bytes = st().memory_bytes;
    d.free_memory_bytes = d.total_memory_bytes;
    q.devices.push_back(d);
  }
  return q;
}

// ---- roofline (bench --device cuda) -------------------------------------------------

// A fake device has no bandwidth or FLOP/s worth measuring: the benchmark's
// hardware limits are refused, not invented.
Result<double> measure_d2d_bandwidth_gbs(std::size_t, int) {
  return make_error(ErrorCode::unsupported, "fake cuda: a fake device has no memory bandwidth to measure");
}

Result<double> measure_gemm_tflops(DType, int, int, int, int) {
  return make_error(ErrorCode::unsupported, "fake cuda: a fake device has no GEMM throughput to measure");
}

}  // namespace shardline::kernels::cuda
