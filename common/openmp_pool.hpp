#pragma once
/// \file
/// One idle OpenMP pool too many. libgomp keeps a pool of worker threads
/// for every thread that has run a parallel region, idle or not. Once it
/// manages more threads than CPUs, idle pools included, every team's
/// workers spin only briefly ("throttled") before they sleep, and each
/// parallel region then pays a futex wake per worker. An engine stepping on
/// one thread while another thread's pool sits idle (it built the weights,
/// or measured the machine) ran its decode steps 10-15% slower with 30x the
/// context switches (docs/performance.md); a micro-benchmark of 20,000
/// small regions took 3.5x as long. Freeing the idle pool restores the
/// full spin.

#include <omp.h>

namespace shardline {

/// Frees the calling thread's OpenMP pool (omp_pause_resource_all, soft:
/// the pool's threads exit; the next parallel region on this thread
/// creates a new one). Call it on a thread that is done with OpenMP work
/// before other threads run theirs. Returns false when OpenMP refused
/// (inside a parallel region).
inline bool release_openmp_pool() { return omp_pause_resource_all(omp_pause_soft) == 0; }

}  // namespace shardline
