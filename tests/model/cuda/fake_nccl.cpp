// FAKE NCCL (a test double, not an NCCL implementation): the nccl.h calls
// that comm/nccl.cpp makes, defined over the fake CUDA device
// (fake_device.cpp), so that the NCCL communicator and the CUDA groups that
// run over it execute in CI on a machine with no GPU. The model (see
// fake_device.hpp):
//  - ncclGetUniqueId names a clique; ncclCommInitRank(Config) joins rank r
//    on the thread's current device; a non-blocking communicator stays
//    ncclInProgress until every rank has joined. Two ranks on one device fail
//    with ncclInvalidUsage, as NCCL's "duplicate GPU" check does;
//  - every collective and send / recv is an operation on its stream, in call
//    order (collectives numbered per communicator, point to point per
//    (sender, receiver) pair). When it reaches the stream's head it
//    arrives; it waits there, blocking the stream, until every rank's
//    matching operation (the peer's, for send / recv) has arrived; the last
//    to arrive moves the data for all. Ranks that disagree (op, count,
//    dtype, root, a send and recv of different sizes) are an anomaly (NCCL's
//    undefined behaviour) and nothing moves;
//  - sums are in rank order (((x0 + x1) + x2) ...), F32 only; NCCL's own
//    ring / tree order is not modelled;
//  - ncclGroupStart / ncclGroupEnd fuse the calls between them into one
//    operation per stream (so an all-to-all's sends and receives, oneself
//    included, cannot deadlock);
//  - ncclCommAbort releases the communicator's waiting operations (they
//    move nothing); a peer of an aborted rank waits until its own timeout;
//  - ncclCommFinalize is collective: a rank stays ncclInProgress until every
//    rank still there has finalized (so ranks torn down one after another
//    on one thread wait for each other, as on NCCL).
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tests/model/cuda/fake_device_internal.hpp"

namespace {

using fake_detail::anomaly;
using fake_detail::Op;

struct Clique;

struct CommState {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  int device = 0;
  bool aborted = false;
  bool finalizing = false;  ///< ncclCommFinalize was called
  ncclResult_t async = ncclInProgress;
  std::string last_error;
  long next_collective = 0;
  std::map<int, long> next_send, next_recv;  // by peer
};

/// One rank's arrival at an operation: what it passed, and whether it ended.
struct Arrival {
  enum Kind { all_reduce, all_gather, reduce_scatter, broadcast, send, recv } kind = all_reduce;
  std::shared_ptr<CommState> comm;
  const void* send_buf = nullptr;
  void* recv_buf = nullptr;
  std::size_t count = 0;
  ncclDataType_t dtype = ncclFloat;
  int root = 0;
  int peer = 0;
  long seq = 0;
  std::shared_ptr<bool> done = std::make_shared<bool>(false);
};

struct Clique {
  int nranks = 0;
  std::vector<std::weak_ptr<CommState>> members;  // by rank
  int joined = 0;
  std::map<long, std::vector<std::shared_ptr<Arrival>>> collectives;  // by sequence number, by rank
  std::map<std::tuple<int, int, long>, std::shared_ptr<Arrival>> sends, recvs;  // (from, to, seq)
};

}  // namespace

struct ncclComm {
  std::shared_ptr<CommState> state;
};

namespace {

std::map<std::string, std::shared_ptr<Clique>>& cliques() {
  static std::map<std::string, std::shared_ptr<Clique>> m;
  return m;
}
long next_id = 0;
thread_local int group_depth = 0;
thread_local std::vector<std::pair<cudaStream_t, std::shared_ptr<Arrival>>> grouped;
thread_local std::string last_global_error;

std::size_t dtype_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* kind_name(Arrival::Kind k) {
  switch (k) {
    case Arrival::all_reduce: return "ncclAllReduce";
    case Arrival::all_gather: return "ncclAllGather";
    case Arrival::reduce_scatter: return "ncclReduceScatter";
    case Arrival::broadcast: return "ncclBroadcast";
    case Arrival::send: return "ncclSend";
    case Arrival::recv: return "ncclRecv";
  }
  return "nccl";
}

/// p[bytes] is device memory of `device` (the rank's own).
bool on_device(const Arrival& a, const char* what, const void* p, std::size_t bytes) {
  if (bytes == 0) return true;
  if (fake_detail::memory_device(p) != a.comm->device) {
    anomaly(std::string(kind_name(a.kind)) + ": rank " + std::to_string(a.comm->rank) + "'s " + what +
            " is not memory of its device " + std::to_string(a.comm->device));
    return false;
  }
  return fake_detail::check_on(a.comm->device, kind_name(a.kind), what, p, bytes);
}

/// Every rank of collective `all` has arrived: checks they agree, moves the data.
void complete_collective(const std::vector<std::shared_ptr<Arrival>>& all) {
  // An aborted rank's buffers may be gone: nothing moves, the others wait
  // (as NCCL's would, until their own timeout aborts them).
  for (const auto& a : all)
    if (a->comm->aborted) return;
  const Arrival& a0 = *all[0];
  const int n = static_cast<int>(all.size());
  bool ok = true;
  for (const auto& a : all)
    if (a->kind != a0.kind || a->count != a0.count || a->dtype != a0.dtype ||
        (a0.kind == Arrival::broadcast && a->root != a0.root)) {
      anomaly(std::string("fake nccl: ranks disagree on collective #") + std::to_string(a0.seq) + ": rank 0 " +
              kind_name(a0.kind) + "(count=" + std::to_string(a0.count) + "), rank " + std::to_string(a->comm->rank) +
              " " + kind_name(a->kind) + "(count=" + std::to_string(a->count) + ")");
      ok = false;
      break;
    }
  const std::size_t elem = dtype_bytes(a0.dtype);
  const std::size_t bytes = a0.count * elem;
  const bool reduces = a0.kind == Arrival::all_reduce || a0.kind == Arrival::reduce_scatter;
  if (ok && reduces && a0.dtype != ncclFloat32) {
    anomaly(std::string(kind_name(a0.kind)) + ": the fake sums F32 only");
    ok = false;
  }
  const std::size_t send_bytes = a0.kind == Arrival::reduce_scatter ? bytes * n : bytes;
  const std::size_t recv_bytes = a0.kind == Arrival::all_gather ? bytes * n : bytes;
  for (const auto& a : all) {
    if (!ok) break;
    const bool sends = a0.kind != Arrival::broadcast || a->comm->rank == a0.root;
    ok = (!sends || on_device(*a, "send buffer", a->send_buf, send_bytes)) &&
         on_device(*a, "receive buffer", a->recv_buf, recv_bytes);
  }
  if (ok) {
    // Every result is computed before any is written (buffers may alias).
    std::vector<std::vector<char>> out(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      std::vector<char>& o = out[static_cast<std::size_t>(r)];
      o.resize(recv_bytes);
      switch (a0.kind) {
        case Arrival::all_reduce:
        case Arrival::reduce_scatter: {
          const std::size_t off = a0.kind == Arrival::reduce_scatter ? static_cast<std::size_t>(r) * a0.count : 0;
          auto* y = reinterpret_cast<float*>(o.data());
          for (int k = 0; k < n; ++k) {  // rank order
            const float* x = static_cast<const float*>(all[static_cast<std::size_t>(k)]->send_buf) + off;
            for (std::size_t i = 0; i < a0.count; ++i) y[i] = k == 0 ? x[i] : y[i] + x[i];
          }
          break;
        }
        case Arrival::all_gather:
          for (int k = 0; k < n; ++k)
            std::memcpy(o.data() + static_cast<std::size_t>(k) * bytes, all[static_cast<std::size_t>(k)]->send_buf,
                        bytes);
          break;
        case Arrival::broadcast:
          std::memcpy(o.data(), all[static_cast<std::size_t>(a0.root)]->send_buf, bytes);
          break;
        default: break;
      }
    }
    for (int r = 0; r < n; ++r)
      std::memcpy(all[static_cast<std::size_t>(r)]->recv_buf, out[static_cast<std::size_t>(r)].data(), recv_bytes);
  }
  for (const auto& a : all) *a->done = true;
}

void complete_p2p(const Arrival& s, const Arrival& r) {
  if (s.comm->aborted || r.comm->aborted) return;  // as complete_collective
  const std::size_t sb = s.count * dtype_bytes(s.dtype), rb = r.count * dtype_bytes(r.dtype);
  if (sb != rb) {
    anomaly("fake nccl: rank " + std::to_string(s.comm->rank) + " sends " + std::to_string(sb) + " bytes, rank " +
            std::to_string(r.comm->rank) + " receives " + std::to_string(rb));
  } else if (on_device(s, "send buffer", s.send_buf, sb) && on_device(r, "receive buffer", r.recv_buf, rb)) {
    std::memmove(r.recv_buf, s.send_buf, sb);
  }
  *s.done = true;
  *r.done = true;
}

/// `a` reached the head of its stream.
void arrive(const std::shared_ptr<Arrival>& a) {
  CommState& c = *a->comm;
  if (c.aborted) {
    *a->done = true;
    return;
  }
  Clique& q = *c.clique;
  if (a->kind == Arrival::send || a->kind == Arrival::recv) {
    const bool sending = a->kind == Arrival::send;
    const auto key = sending ? std::make_tuple(c.rank, a->peer, a->seq) : std::make_tuple(a->peer, c.rank, a->seq);
    auto& mine = sending ? q.sends : q.recvs;
    auto& theirs = sending ? q.recvs : q.sends;
    const auto it = theirs.find(key);
    if (it == theirs.end()) {
      mine[key] = a;
      return;
    }
    const std::shared_ptr<Arrival> other = it->second;
    theirs.erase(it);
    if (sending)
      complete_p2p(*a, *other);
    else
      complete_p2p(*other, *a);
    return;
  }
  auto& slot = q.collectives[a->seq];
  slot.resize(static_cast<std::size_t>(q.nranks));
  slot[static_cast<std::size_t>(c.rank)] = a;
  for (const auto& x : slot)
    if (x == nullptr) return;
  const std::vector<std::shared_ptr<Arrival>> all = std::move(slot);
  q.collectives.erase(a->seq);
  complete_collective(all);
}

/// Queues one operation of `parts` (all on `stream`).
ncclResult_t enqueue_parts(cudaStream_t stream, std::vector<std::shared_ptr<Arrival>> parts) {
  std::string name = kind_name(parts[0]->kind);
  if (parts.size() > 1) name = "nccl group (" + std::to_string(parts.size()) + " calls)";
  Op op;
  op.name = name;
  op.kernel = true;  // NCCL's work is kernels on the communicator's device
  op.run = [parts] {
    for (const auto& p : parts) arrive(p);
  };
  op.done = [parts] {
    for (const auto& p : parts)
      if (!*p->done && !p->comm->aborted) return false;
    return true;
  };
  if (fake_detail::enqueue(stream, std::move(op)) != cudaSuccess) {
    last_global_error = "the stream is not a live CUDA stream";
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

ncclResult_t submit(std::shared_ptr<Arrival> a, cudaStream_t stream) {
  CommState& c = *a->comm;
  if (c.aborted || c.async != ncclSuccess) {
    last_global_error = "the communicator is not ready (aborted, failed or still joining)";
    return ncclInvalidUsage;
  }
  const int sd = fake_detail::stream_device(stream);
  if (sd != c.device) {
    anomaly(std::string(kind_name(a->kind)) + ": rank " + std::to_string(c.rank) + " (device " +
            std::to_string(c.device) + ") on a stream of device " + std::to_string(sd));
    last_global_error = "the stream is not on the communicator's device";
    return ncclInvalidArgument;
  }
  if (dtype_bytes(a->dtype) == 0) return ncclInvalidArgument;
  if (a->kind == Arrival::send)
    a->seq = c.next_send[a->peer]++;
  else if (a->kind == Arrival::recv)
    a->seq = c.next_recv[a->peer]++;
  else
    a->seq = c.next_collective++;
  if (group_depth > 0) {
    grouped.emplace_back(stream, std::move(a));
    return ncclSuccess;
  }
  return enqueue_parts(stream, {std::move(a)});
}

std::shared_ptr<Arrival> arrival(ncclComm_t comm, Arrival::Kind kind, const void* send, void* recv, std::size_t count,
                                 ncclDataType_t dtype) {
  auto a = std::make_shared<Arrival>();
  a->kind = kind;
  a->comm = comm->state;
  a->send_buf = send;
  a->recv_buf = recv;
  a->count = count;
  a->dtype = dtype;
  return a;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error (fake nccl)";
    case ncclUnhandledCudaError: return "unhandled cuda error (fake nccl)";
    case ncclInvalidArgument: return "invalid argument (fake nccl)";
    case ncclInvalidUsage: return "invalid usage (fake nccl)";
    case ncclRemoteError: return "remote process exited or there was a network error (fake nccl)";
    case ncclInProgress: return "NCCL operation in progress (fake nccl)";
    default: return "fake nccl error";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  FAKE_LOCK;
  return comm != nullptr && !comm->state->last_error.empty() ? comm->state->last_error.c_str()
                                                              : last_global_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  FAKE_LOCK;
  if (uniqueId == nullptr) return ncclInvalidArgument;
  *uniqueId = ncclUniqueId{};
  const std::string id = "fake-nccl-" + std::to_string(next_id++);
  std::memcpy(uniqueId->internal, id.data(), id.size());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  FAKE_LOCK;
  if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  const std::string key(commId.internal, commId.internal + sizeof commId.internal);
  std::shared_ptr<Clique>& q = cliques()[key];
  if (q == nullptr) {
    q = std::make_shared<Clique>();
    q->nranks = nranks;
    q->members.resize(static_cast<std::size_t>(nranks));
  }
  if (q->nranks != nranks || !q->members[static_cast<std::size_t>(rank)].expired()) {
    last_global_error = "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " joined twice or with "
                        "another size";
    return ncclInvalidArgument;
  }
  auto state = std::make_shared<CommState>();
  state->clique = q;
  state->rank = rank;
  state->device = fake_detail::current_device();
  q->members[static_cast<std::size_t>(rank)] = state;
  if (++q->joined == nranks) {
    // Every rank is in: NCCL refuses two ranks of a communicator on one GPU
    // (every rank's init fails), else all are ready.
    std::string duplicate;
    for (std::size_t i = 0; i < q->members.size() && duplicate.empty(); ++i)
      for (std::size_t j = i + 1; j < q->members.size(); ++j) {
        auto a = q->members[i].lock(), b = q->members[j].lock();
        if (a && b && a->device == b->device) {
          duplicate = "Duplicate GPU detected : rank " + std::to_string(i) + " and rank " + std::to_string(j) +
                      " both on CUDA device " + std::to_string(a->device);
          break;
        }
      }
    for (const auto& w : q->members)
      if (auto m = w.lock(); m && m->async == ncclInProgress) {
        m->async = duplicate.empty() ? ncclSuccess : ncclInvalidUsage;
        m->last_error = duplicate;
      }
  }
  *comm = new ncclComm{state};
  const bool blocking = config == nullptr || config->blocking != 0;
  if (!blocking) return state->async == ncclInProgress ? ncclInProgress : state->async;
  (void)fake_detail::wait_until([&] { return state->async != ncclInProgress; }, std::chrono::minutes(2));
  return state->async;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  FAKE_LOCK;
  if (comm == nullptr || asyncError == nullptr) return ncclInvalidArgument;
  *asyncError = comm->state->aborted ? ncclRemoteError : comm->state->async;
  return ncclSuccess;
}

// Finalize is collective (NCCL: it completes once the communicator is
// globally quiescent): a rank stays ncclInProgress until every rank that is
// still there has finalized (aborted or destroyed ranks count as done).
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  FAKE_LOCK;
  if (comm == nullptr) return ncclInvalidArgument;
  CommState& c = *comm->state;
  if (c.async != ncclSuccess) return c.async;
  c.finalizing = true;
  c.async = ncclInProgress;
  bool all = true;
  for (const auto& w : c.clique->members)
    if (auto m = w.lock(); m && !m->aborted && !m->finalizing) all = false;
  if (all)
    for (const auto& w : c.clique->members)
      if (auto m = w.lock(); m && m->finalizing) m->async = ncclSuccess;
  return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  FAKE_LOCK;
  if (comm == nullptr) return ncclInvalidArgument;
  if (!comm->state->finalizing || comm->state->async != ncclSuccess)
    anomaly("ncclCommDestroy of rank " + std::to_string(comm->state->rank) + " before its finalize completed");
  comm->state->aborted = true;  // nothing of it may still wait
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  FAKE_LOCK;
  if (comm == nullptr) return ncclSuccess;
  comm->state->aborted = true;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  FAKE_LOCK;
  if (comm == nullptr || op != ncclSum) return ncclInvalidArgument;
  return submit(arrival(comm, Arrival::all_reduce, sendbuff, recvbuff, count, datatype), stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  FAKE_LOCK;
  if (comm == nullptr) return ncclInvalidArgument;
  return submit(arrival(comm, Arrival::all_gather, sendbuff, recvbuff, sendcount, datatype), stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  FAKE_LOCK;
  if (comm == nullptr || op != ncclSum) return ncclInvalidArgument;
  return submit(arrival(comm, Arrival::reduce_scatter, sendbuff, recvbuff, recvcount, datatype), stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  FAKE_LOCK;
  if (comm == nullptr || root < 0 || root >= comm->state->clique->nranks) return ncclInvalidArgument;
  auto a = arrival(comm, Arrival::broadcast, sendbuff, recvbuff, count, datatype);
  a->root = root;
  return submit(std::move(a), stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  FAKE_LOCK;
  if (comm == nullptr || peer < 0 || peer >= comm->state->clique->nranks) return ncclInvalidArgument;
  auto a = arrival(comm, Arrival::send, sendbuff, nullptr, count, datatype);
  a->peer = peer;
  return submit(std::move(a), stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  FAKE_LOCK;
  if (comm == nullptr || peer < 0 || peer >= comm->state->clique->nranks) return ncclInvalidArgument;
  auto a = arrival(comm, Arrival::recv, nullptr, recvbuff, count, datatype);
  a->peer = peer;
  return submit(std::move(a), stream);
}

ncclResult_t ncclGroupStart() {
  FAKE_LOCK;
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  FAKE_LOCK;
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  // One fused operation per stream, in the order the streams first appear.
  std::vector<std::pair<cudaStream_t, std::vector<std::shared_ptr<Arrival>>>> by_stream;
  for (auto& [stream, a] : grouped) {
    auto it = std::find_if(by_stream.begin(), by_stream.end(), [s = stream](const auto& e) { return e.first == s; });
    if (it == by_stream.end()) {
      by_stream.emplace_back(stream, std::vector<std::shared_ptr<Arrival>>{});
      it = by_stream.end() - 1;
    }
    it->second.push_back(std::move(a));
  }
  grouped.clear();
  ncclResult_t rc = ncclSuccess;
  for (auto& [stream, parts] : by_stream)
    if (ncclResult_t r = enqueue_parts(stream, std::move(parts)); r != ncclSuccess) rc = r;
  return rc;
}

}  // extern "C"
