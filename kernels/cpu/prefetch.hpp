#pragma once
/// \file
/// Moving one phase's bytes while another phase computes (issue 17, item 3:
/// the decode step's phases overlap instead of running strictly one after
/// another).
///
/// A LinePrefetchQueue holds runs of cache lines that a later phase will read
/// (the paged KV slabs of the next attention: attention.hpp's kv_line_runs).
/// A GEMM given the queue (linear.hpp's linear(..., side)) pops runs as it
/// goes and issues one `prefetcht2` per line spread over each register
/// tile's sweep of k, so the lines move while the FMA units are busy and
/// the later phase finds them in L2 or L3. This is the "software prefetch of
/// the next layer's weights and KV during the current GEMM" of issue 17;
/// model/shard_runner.hpp's StepOverlap says where the engine uses it.
///
/// Prefetching never changes a result: the same instructions compute the
/// same bits, only the cache state differs.

#include <cstddef>
#include <vector>

namespace shardline::kernels::cpu {

/// `lines` consecutive 64-byte cache lines from `begin`.
struct LineRun {
  const void* begin = nullptr;
  int lines = 0;
};

/// Runs of lines in per-thread slices: slice t is popped, in order, only by
/// OpenMP thread t of the GEMMs that carry the queue (attention.hpp's
/// kv_line_runs builds the slices so that thread t prefetches the
/// sequences it is likely to attend). One queue may be carried by several
/// GEMMs in a row: each pops where the previous one stopped. Each thread
/// touches only its own slice, so no locking.
class LinePrefetchQueue {
 public:
  /// Replaces the runs: per_thread[t] is thread t's slice (any number of
  /// slices; a thread without one pops nothing).
  void assign(std::vector<std::vector<LineRun>> per_thread);
  /// Pops thread t's next run into `run`; false when its slice is empty or
  /// there is no slice t.
  [[nodiscard]] bool pop(int thread, LineRun& run);
  /// Runs not yet popped, over all slices.
  [[nodiscard]] std::size_t runs_left() const;
  /// Runs assigned, over all slices.
  [[nodiscard]] std::size_t size() const;
  /// Lines of all runs assigned.
  [[nodiscard]] std::size_t total_lines() const { return total_lines_; }

 private:
  std::vector<std::vector<LineRun>> slices_;  ///< [threads][runs]
  std::vector<std::size_t> next_;             ///< [threads] next run of each slice
  std::size_t total_lines_ = 0;
};

}  // namespace shardline::kernels::cpu
