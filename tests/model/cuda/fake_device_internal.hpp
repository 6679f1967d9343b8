#pragma once
// The fake CUDA device's internals that its other translation units (the
// fake NCCL, tests/model/cuda/fake_nccl.cpp) build on. Not for tests: they
// use fake_device.hpp. See that header for the model of the device.

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>

namespace fake_detail {

/// The one process-wide lock over the fake (recursive).
std::recursive_mutex& fake_mutex();

/// Holds fake_mutex and counts this thread's depth, so that a wait can
/// release every level (wait_until).
class FakeLock {
 public:
  FakeLock();
  ~FakeLock();
  FakeLock(const FakeLock&) = delete;
  FakeLock& operator=(const FakeLock&) = delete;
};

/// One kernel, copy or communication on a stream. `run` executes it (checks
/// its ranges, computes). Most operations finish when run returns; one with
/// `done` (a collective waiting for its peers' streams) stays at its
/// stream's head, blocking the operations behind it, until done() holds.
struct Op {
  std::string name;
  bool kernel = true;
  std::function<void()> run;
  std::function<bool()> done;  ///< null: finished when run returns
  int device = -1;             ///< set when queued: the stream's device
  bool started = false;
};

enum class MemKind { device, pinned };

/// Queues `op` on `stream` (immediate mode: runs it now unless earlier work
/// on the stream still waits). Errors: an unknown stream (an anomaly).
cudaError_t enqueue(cudaStream_t stream, Op op);

/// Records what went wrong on the device.
void anomaly(const std::string& what);

/// [p, p + bytes) lies in one live allocation of `kind`, reachable from the
/// device of the operation running now (its own memory, or a peer's with
/// peer access); otherwise an anomaly naming `op` and `what`.
bool check(const char* op, const char* what, const void* p, std::size_t bytes, MemKind kind = MemKind::device);

/// check() as if work on `device` ran now.
bool check_on(int device, const char* op, const char* what, const void* p, std::size_t bytes);

/// The device whose memory p is (-1: not device memory).
int memory_device(const void* p);

/// This thread's current device (cudaSetDevice).
int current_device();

/// The device a stream was made on; -1 for the legacy stream, -2 unknown.
int stream_device(cudaStream_t stream);

/// Waits (the whole lock released between polls) until ready() holds, up
/// to `timeout`; false on timeout. Call with the lock held.
bool wait_until(const std::function<bool()>& ready, std::chrono::milliseconds timeout);

}  // namespace fake_detail

#define FAKE_LOCK fake_detail::FakeLock fake_lock_
