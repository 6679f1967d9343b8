#pragma once
// A FAKE CUDA device for tests (a test double, not a CUDA implementation):
// tests/model/cuda/fake_device.cpp defines, on the CPU, the CUDA runtime
// calls model/cuda/cuda_runner.cpp makes (cudaMemcpyAsync, streams, graph
// capture / replay, pinned memory, ...) and the kernels::cuda API it uses
// (embedding, rms_norm, rope, write_kv, paged_attention, GemmContext,
// sample, DeviceBuffer, ...), so that the real runner's host logic runs end
// to end on a machine without a GPU. The test executable compiles
// cuda_runner.cpp with this file instead of linking cudart / shardline_cuda.
//
// Model of the device:
//  - device memory is host memory (256-byte aligned, filled with 0xFF bytes
//    -- NaN floats, -1 ints -- when allocated, like uninitialised memory);
//    freeing waits for the device (cudaFree / cudaFreeHost synchronise, as
//    on a GPU); freed blocks are quarantined, so stale pointers never alias
//    new buffers;
//  - every kernel and copy is an operation queued on a stream. In
//    Execution::immediate it runs at once; in Execution::deferred it runs
//    only when the program must wait for it (cudaStreamSynchronize,
//    cudaDeviceSynchronize, a copy to pageable host memory, ...): the two
//    extremes of a real GPU's timing. The legacy default stream defers too:
//    a cudaMemcpy from pageable memory to the device returns once its source
//    is staged and lands at the legacy stream's next synchronisation, which
//    the runner's non-blocking stream does not wait for (as on a GPU);
//  - while a stream captures, operations queued on it are recorded into the
//    graph instead of running; cudaGraphLaunch queues the recorded
//    operations in order. Operations capture their pointer and size
//    arguments by value and read memory when they run, as a graph replay
//    does. Calls CUDA forbids during a (thread-local) capture -- cudaMalloc,
//    cudaMemcpy, memset, synchronisation, copies of pageable memory -- fail
//    with cudaErrorStreamCaptureUnsupported, invalidate the capture and are
//    recorded as anomalies (so is a cudaFree);
//  - events (cudaEventRecord / cudaStreamWaitEvent / cudaEventSynchronize):
//    a record is an operation on its stream; a wait stays at its stream's
//    head until the record it names has run, running the recording stream
//    as far as needed (so in deferred mode a copy stream that waits for a
//    compute stream's event sees exactly that stream's work up to the
//    record, and one that does not wait sees none of it). Records and waits
//    while a stream captures are not modelled (anomalies);
//  - kernels compute with the CPU reference kernels (kernels/cpu) and
//    sampling::sample, row by row (GEMMs: a plain F32 loop over k in order,
//    16-bit weights widened exactly after x is cast to their dtype in the
//    context's scratch, as the real fast path does): a row's result depends
//    only on that row. Host-side argument checks mirror the real kernels';
//  - when an operation runs it checks every range it reads or writes lies in
//    one live device allocation (pinned host memory for copies from / to
//    it), every block id of a block table is inside the KV cache, and every
//    attention sequence is within the max_num_q / max_context_len bounds it
//    was launched with. A violation is recorded as an anomaly (and the
//    operation is skipped, like a faulting kernel): tests expect none;
//  - N devices (set_device_count; default 1), shared by threads: every call
//    holds one process-wide lock, so ranks of a group on threads are
//    serialised as a GPU serialises their streams. cudaSetDevice is per
//    thread; an allocation and a stream belong to the device current when
//    they were made. A kernel that touches another device's memory without
//    peer access (cudaDeviceEnablePeerAccess) is an anomaly; copies may go
//    between devices (unified addressing). Graph capture is process-wide:
//    capture only while no other thread calls the fake;
//  - a fake NCCL (tests/model/cuda/fake_nccl.cpp: the nccl.h calls of
//    comm/nccl.cpp): a communicator per rank, one rank per device (two on
//    one device fail as NCCL's "duplicate GPU"), every call an operation on
//    its stream that waits at the stream's head until every rank's (or the
//    peer's) has reached it, then moves the data (sums in rank order:
//    NCCL's own ring / tree order is not modelled), group calls fused. A
//    synchronisation that waits for a peer releases the lock; one still
//    waiting after 120 s is a deadlock anomaly.

#include <cstddef>
#include <string>
#include <vector>

namespace shardline::testing_support::fake_cuda {

enum class Execution { immediate, deferred };

struct Counters {
  long ops_run = 0;          ///< kernels and async copies executed (eager or replayed)
  long ops_captured = 0;     ///< operations recorded into graphs
  long graphs_captured = 0;  ///< successful cudaStreamEndCapture
  long graph_launches = 0;
  long graph_ops_replayed = 0;
  long kernels_run = 0;      ///< kernels (not copies) executed
  long host_syncs = 0;       ///< cudaStreamSynchronize, cudaDeviceSynchronize and cudaEventSynchronize calls
};

/// Starts a fresh fake: sets the execution mode, clears counters, anomalies
/// and fault injections, 1 device. Expects no live streams or allocations.
void reset(Execution mode);
[[nodiscard]] Execution execution();

/// What went wrong on the device (out-of-bounds ranges, use after free, bad
/// block ids, skipped attention sequences, misused API); empty when fine.
[[nodiscard]] std::vector<std::string> anomalies();
[[nodiscard]] Counters counters();
/// Executions of the kernel `name` ("embedding", "linear", "sample", ...).
[[nodiscard]] long kernel_runs(const std::string& name);

/// Live resources (for leak checks after a runner is destroyed).
[[nodiscard]] std::size_t live_device_bytes();
[[nodiscard]] int live_device_allocations();
[[nodiscard]] int live_pinned_allocations();
[[nodiscard]] int live_streams();
[[nodiscard]] int live_graphs();
[[nodiscard]] int live_graph_execs();
/// Events made and not destroyed.
[[nodiscard]] int live_events();
/// Operations queued and not run yet (deferred mode), all streams.
[[nodiscard]] int pending_ops();

/// cudaGetDeviceCount's answer (default 1; negative: cudaErrorNoDevice).
void set_device_count(int n);
/// Each device's memory as query_devices reports it (default 80 GiB; the
/// fake allocates what is asked of host memory, whatever this says).
void set_memory_bytes(std::size_t bytes);

/// Fault injection: the next call of `call` (a runtime name such as
/// "cudaGraphInstantiate", "cudaMallocHost", "cudaStreamBeginCapture", or
/// "cudaMalloc" for DeviceBuffer::allocate) after `skip` successful ones
/// fails with `error` (a cudaError_t value). One pending injection per name.
void fail_call(const std::string& call, int error, int skip = 0);

}  // namespace shardline::testing_support::fake_cuda
