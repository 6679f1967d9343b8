#pragma once
/// \file
/// NCCL communicator backend (library shardline_comm_nccl; built only when
/// CUDA and NCCL are found, which defines SHARDLINE_HAVE_NCCL): one rank per
/// GPU, in one process (threads) or several.
///
///   auto world = TcpGroup::create(opts).value();          // or an InProcGroup rank
///   auto gpu = NcclCommunicator::create(*world, {.device = local_rank}).value();
///   gpu->all_reduce_sum(d_activations, n);                // DEVICE pointer
///
/// Differences from the Communicator contract (comm/communicator.hpp):
///  - Every float* / void* buffer is a DEVICE pointer (cudaMalloc'd or
///    managed memory on this rank's device); host pointers are refused with
///    invalid_argument.
///  - Each call enqueues on the communicator's own stream and waits for it
///    (polling, bounded by the timeout). On timeout or an NCCL / CUDA error the
///    NCCL communicator is aborted (ncclCommAbort) and the call fails with io;
///    the communicator is then poisoned: every later call fails with io and
///    it must be rebuilt from a bootstrap group.
///  - Bound to the caller's stream (bind_stream: a runner's), every call but
///    barrier is queued on that stream, behind the caller's work, and
///    returns without waiting (NCCL's own stream semantics; no host
///    synchronisation between a GEMM and its all-reduce). The arguments are
///    then not compared across ranks (check_args needs a wait); a rank's own
///    bad arguments are still refused. Failures and dead peers surface at
///    wait_stream(), which polls the bound stream up to the timeout and
///    aborts the communicator (io) when it expires.
///  - Reductions follow NCCL's ring / tree order, not rank order: results can
///    differ in the last bits from the CPU backends, and across world sizes
///    or NCCL versions. (With 2 ranks a + b is order-free, so it matches.)
///  - Argument agreement: with NcclOptions::check_args (default) every
///    collective first all-gathers a 32-byte descriptor (op, count, root,
///    bad-argument flag) so that ranks that disagree all get
///    invalid_argument, as in the other backends; this costs one small NCCL
///    all-gather per call. Without it, disagreeing ranks are undefined
///    behaviour in NCCL (typically a hang, ended by the timeout as io).
///  - send / recv use ncclSend / ncclRecv: NCCL point to point has no tags
///    (the tag is ignored; messages between two ranks match in call order)
///    and is a rendezvous: send returns once the peer has received, so two
///    ranks that both send to each other first end in io at the timeout.
///    Sizes are not checked by NCCL: a recv of the wrong size is undefined
///    (do not rely on mismatch). Sending to oneself is unsupported.
///  - expose / unexpose / get return ErrorCode::unsupported (NCCL has no
///    one-sided reads; use the TCP or in-process backends for those).
///  - bytes_sent() counts the logical payload of the direct exchange (as in
///    communicator.hpp), not NCCL's actual ring traffic.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "common/result.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace shardline::comm {

struct NcclOptions {
  /// CUDA device of this rank; -1 = the calling thread's current device.
  int device = -1;
  /// All-gather a descriptor before each collective (see above).
  bool check_args = true;
};

class NcclCommunicator : public Communicator {
 public:
  /// Collective over `bootstrap` (a group with the same ranks, e.g. TCP or
  /// in-process): rank 0 creates the NCCL unique id and broadcasts it over
  /// `bootstrap` as bytes, then every rank joins the NCCL communicator. The
  /// whole set-up is bounded by bootstrap.timeout(), which also becomes this
  /// communicator's timeout. Either every rank succeeds or every rank that
  /// can still talk over `bootstrap` gets the error.
  /// Errors: unsupported (no CUDA device / driver), io (NCCL or CUDA failure,
  /// a rank missing), and the bootstrap's own errors.
  [[nodiscard]] static Result<std::unique_ptr<NcclCommunicator>> create(Communicator& bootstrap,
                                                                        NcclOptions options = {});

  /// The stream every call enqueues on (cudaStream_t).
  [[nodiscard]] virtual CUstream_st* stream() const noexcept = 0;
  /// The CUDA device of this rank.
  [[nodiscard]] virtual int device() const noexcept = 0;
  /// Empty while usable; otherwise why the communicator was aborted.
  [[nodiscard]] virtual std::string poisoned() const = 0;
};

}  // namespace shardline::comm
