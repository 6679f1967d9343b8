#include "model/cuda/inproc_device_comm.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "comm/exchange.hpp"
#include "comm/inproc.hpp"
#include "kernels/cuda/ops.hpp"

namespace shardline::model {

namespace kcu = kernels::cuda;

namespace {

enum class Op : std::uint64_t { all_reduce_sum = 1, all_gather, reduce_scatter_sum, all_to_all, broadcast };

constexpr std::size_t kPostFloats = 16;  // eight uint64 words carried as floats (the host all_gather copies bytes)

Status cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::ok_status();
  return make_error(ErrorCode::io, "device communicator: " + what + ": " + cudaGetErrorString(e));
}

float* as_floats(std::uint64_t address) { return reinterpret_cast<float*>(static_cast<std::uintptr_t>(address)); }

bool is_device_memory(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

}  // namespace

InProcDeviceCommunicator::InProcDeviceCommunicator(std::unique_ptr<comm::Communicator> host, int device,
                                                   CUstream_st* stream)
    : host_(std::move(host)), device_(device), stream_(stream) {}

Result<std::unique_ptr<InProcDeviceCommunicator>> InProcDeviceCommunicator::create(
    std::unique_ptr<comm::Communicator> host, int device) {
  if (!host) return make_error(ErrorCode::invalid_argument, "device communicator: no host communicator");
  if (Status s = cuda_status(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")"); !s)
    return s.error();
  cudaStream_t stream = nullptr;
  if (Status s = cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"); !s)
    return s.error();
  return std::unique_ptr<InProcDeviceCommunicator>(new InProcDeviceCommunicator(std::move(host), device, stream));
}

InProcDeviceCommunicator::~InProcDeviceCommunicator() {
  // The bound stream may be gone (its runner is freed first); freeing the
  // slots waits for the device (cudaFree), so no queued copy outlives them.
  scratch_.reset();
  for (auto& slot : slots_) slot.reset();
  for (cudaEvent_t e : slot_events_)
    if (e != nullptr) (void)cudaEventDestroy(e);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Status InProcDeviceCommunicator::bind_stream(CUstream_st* stream) {
  if (stream == nullptr) return make_error(ErrorCode::invalid_argument, "device communicator: bind to a null stream");
  if (bound_ == stream) return Status::ok_status();
  if (bound_ != nullptr)
    return make_error(ErrorCode::invalid_argument, "device communicator: already bound to another stream");
  if (Status s = cuda_status(cudaSetDevice(device_), "cudaSetDevice"); !s) return s;
  for (cudaEvent_t& e : slot_events_)
    if (e == nullptr)
      if (Status s = cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); !s) return s;
  bound_ = stream;
  return Status::ok_status();
}

Status InProcDeviceCommunicator::wait_stream() {
  // Nothing to poll: no peer can leave the stream waiting (every event it
  // waits for was recorded before the exchange that named it), and the
  // caller's own synchronisation covers the work (an unbounded wait here
  // could hang behind another communicator's dead NCCL peer).
  return Status::ok_status();
}

Status InProcDeviceCommunicator::copy(void* dst, const void* src, std::size_t bytes, const char* what) {
  if (dst == src || bytes == 0) return Status::ok_status();
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, work_stream()), what);
}

Status InProcDeviceCommunicator::sum_in_rank_order(float* dst, const std::vector<Post>& posts, std::size_t offset,
                                                   std::size_t count, const char* what) {
  Status work = copy(dst, as_floats(posts[0].send) + offset, count * sizeof(float), what);
  for (int k = 1; k < world_size() && work; ++k)
    work = kcu::add_inplace(dst, as_floats(posts[static_cast<std::size_t>(k)].send) + offset,
                            static_cast<long>(count), work_stream());
  return work;
}

Status InProcDeviceCommunicator::stage_in(const void* src, std::size_t bytes, Post& post) {
  const std::size_t slot = calls_++ % 2;
  kcu::DeviceBuffer& buf = slots_[slot];
  if (buf.size_bytes() < bytes) {
    // Growing (twice the size, so it stops soon) waits for the device first:
    // a peer's read of the old slot, two calls ago, may still be queued. A
    // host synchronisation, but only while the sizes still grow.
    if (Status s = cuda_status(cudaSetDevice(device_), "cudaSetDevice"); !s) return s;
    if (Status s = cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); !s) return s;
    const std::size_t want = std::max(bytes, 2 * buf.size_bytes());
    buf.reset();
    auto grown = kcu::DeviceBuffer::allocate(want);
    if (!grown) return make_error(ErrorCode::io, "device communicator: staging slot: " + grown.error().message);
    buf = std::move(grown).value();
  }
  if (Status s = copy(buf.data(), src, bytes, "staging copy"); !s) return s;
  if (Status s = cuda_status(cudaEventRecord(slot_events_[slot], bound_), "cudaEventRecord"); !s) return s;
  post.send = reinterpret_cast<std::uintptr_t>(buf.data());
  post.event = reinterpret_cast<std::uintptr_t>(slot_events_[slot]);
  return Status::ok_status();
}

Status InProcDeviceCommunicator::wait_for_peers(const std::vector<Post>& posts) {
  for (int k = 0; k < world_size(); ++k) {
    if (k == rank()) continue;
    auto* e = reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(posts[static_cast<std::size_t>(k)].event));
    if (Status s = cuda_status(cudaStreamWaitEvent(bound_, e, 0), "cudaStreamWaitEvent"); !s) return s;
  }
  return Status::ok_status();
}

Result<std::vector<InProcDeviceCommunicator::Post>> InProcDeviceCommunicator::meet(Post mine, const void* src,
                                                                                   std::size_t bytes,
                                                                                   const char* op_name) {
  mine.mode = bound_ != nullptr ? 1 : 0;  // every rank must be in the same mode
  if (bound_ == nullptr || mine.count == 0) return exchange(mine, op_name);
  // Checked and staged here; a local failure still takes part in the
  // exchange with null buffers, so that every rank fails together.
  Status local = Status::ok_status();
  bool staged = false;
  if (src == nullptr || !is_device_memory(src)) {
    local = make_error(ErrorCode::invalid_argument,
                       std::string(op_name) + ": rank " + std::to_string(rank()) + ": the buffer is not device memory");
  } else {
    staged = true;
    local = stage_in(src, bytes, mine);
  }
  if (!local) mine.send = mine.recv = 0;
  auto posts = exchange(mine, op_name);
  if (!local || !posts) {
    // Nobody reads this call's slot: the next call takes it again, so that
    // every slot's rewrite still follows a call that waited for every peer.
    if (staged) --calls_;
    return !local ? local.error() : posts.error();
  }
  if (Status s = wait_for_peers(*posts); !s) return s.error();
  return posts;
}

Status InProcDeviceCommunicator::expose(std::string name, const void* data, std::size_t bytes) {
  if (bytes > 0 && (data == nullptr || !is_device_memory(data)))
    return make_error(ErrorCode::invalid_argument,
                      "device communicator: expose '" + name + "': the region is not device memory");
  return host_->expose(std::move(name), data, bytes);
}

Status InProcDeviceCommunicator::get(int peer, std::string name, std::size_t offset, void* dst, std::size_t bytes) {
  if (bytes > 0 && (dst == nullptr || !is_device_memory(dst)))
    return make_error(ErrorCode::invalid_argument,
                      "device communicator: get '" + name + "': the destination is not device memory");
  return comm::inproc_get_with(*host_, peer, std::move(name), offset, bytes, [&](const void* src) -> Status {
    if (bytes == 0) return Status::ok_status();
    if (Status s = cuda_status(cudaSetDevice(device_), "cudaSetDevice"); !s) return s;
    if (Status s = cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "get's copy"); !s)
      return s;
    return cuda_status(cudaStreamSynchronize(stream_), "get's copy");
  });
}


Result<std::vector<InProcDeviceCommunicator::Post>> InProcDeviceCommunicator::exchange(const Post& mine,
                                                                                      const char* op_name) {
  static_assert(sizeof(Post) == kPostFloats * sizeof(float));
  const int w = world_size();
  std::vector<float> words(kPostFloats * static_cast<std::size_t>(w));
  std::memcpy(words.data() + kPostFloats * static_cast<std::size_t>(rank()), &mine, sizeof(Post));
  if (Status s = host_->all_gather(words.data() + kPostFloats * static_cast<std::size_t>(rank()), kPostFloats,
                                   words.data());
      !s)
    return s.error();
  std::vector<Post> posts(static_cast<std::size_t>(w));
  std::memcpy(posts.data(), words.data(), words.size() * sizeof(float));
  // Every rank reaches the same verdict from the same posts.
  for (int k = 0; k < w; ++k) {
    const Post& p = posts[static_cast<std::size_t>(k)];
    std::string why;
    if (p.op != posts[0].op || p.count != posts[0].count || p.root != posts[0].root)
      why = "ranks disagree on the op, count or root (rank " + std::to_string(k) + ")";
    else if (p.mode != posts[0].mode)
      why = "rank " + std::to_string(k) + (p.mode != 0 ? " is" : " is not") +
            " bound to a stream and rank 0" + (posts[0].mode != 0 ? " is" : " is not");
    else if (p.device != posts[0].device)
      why = "rank " + std::to_string(k) + " is on device " + std::to_string(p.device) + ", rank 0 on " +
            std::to_string(posts[0].device) + ": ranks of this communicator share one device";
    else if (p.count > 0 && (p.recv == 0 || (p.op != static_cast<std::uint64_t>(Op::all_reduce_sum) &&
                                             p.op != static_cast<std::uint64_t>(Op::broadcast) && p.send == 0)))
      why = "rank " + std::to_string(k) + " passed a null buffer";
    else if (p.root >= static_cast<std::uint64_t>(w))
      why = "root " + std::to_string(p.root) + " outside the group";
    if (!why.empty())
      return make_error(ErrorCode::invalid_argument, std::string(op_name) + ": rank " + std::to_string(rank()) +
                                                         ": " + why);
  }
  return posts;
}

Status InProcDeviceCommunicator::finish(Status work) {
  Status synced = cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  Status all = host_->barrier();
  if (!work) return work;
  if (!synced) return synced;
  return all;
}

Status InProcDeviceCommunicator::all_reduce_sum(float* data, std::size_t count) {
  Post mine{static_cast<std::uint64_t>(Op::all_reduce_sum), count, 0, static_cast<std::uint64_t>(device_), 0,
            reinterpret_cast<std::uintptr_t>(data)};
  auto posts = meet(mine, data, count * sizeof(float), "all_reduce_sum");
  if (!posts) return posts.error();
  if (count == 0) return Status::ok_status();
  const int w = world_size();
  if (bound_ != nullptr) {
    // Every rank sums every slot in rank order into its own buffer.
    Status work = sum_in_rank_order(data, *posts, 0, count, "all_reduce_sum copy");
    bytes_sent_ += static_cast<std::uint64_t>(w - 1) * count * sizeof(float);
    return work;
  }
  // Rank r owns slice r: sums it in rank order into rank 0's buffer, then
  // copies the sum into every other rank's (the slices are disjoint).
  const auto [b, e] = comm::detail::reduce_slice(count, rank(), w);
  Status work = Status::ok_status();
  if (e > b) {
    float* acc = as_floats((*posts)[0].recv) + b;
    for (int k = 1; k < w && work; ++k)
      work = kcu::add_inplace(acc, as_floats((*posts)[static_cast<std::size_t>(k)].recv) + b,
                              static_cast<long>(e - b), stream_);
    for (int k = 1; k < w && work; ++k)
      work = cuda_status(cudaMemcpyAsync(as_floats((*posts)[static_cast<std::size_t>(k)].recv) + b, acc,
                                         (e - b) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                         "all_reduce_sum copy");
  }
  const std::uint64_t own = e - b;
  bytes_sent_ += ((count - own) + static_cast<std::uint64_t>(w - 1) * own) * sizeof(float);
  return finish(work);
}

Status InProcDeviceCommunicator::all_gather(const float* send, std::size_t count, float* recv) {
  Post mine{static_cast<std::uint64_t>(Op::all_gather), count, 0, static_cast<std::uint64_t>(device_),
            reinterpret_cast<std::uintptr_t>(send), reinterpret_cast<std::uintptr_t>(recv)};
  auto posts = meet(mine, send, count * sizeof(float), "all_gather");
  if (!posts) return posts.error();
  if (count == 0) return Status::ok_status();
  Status work = Status::ok_status();
  for (int k = 0; k < world_size() && work; ++k)
    work = copy(recv + static_cast<std::size_t>(k) * count, as_floats((*posts)[static_cast<std::size_t>(k)].send),
                count * sizeof(float), "all_gather copy");
  bytes_sent_ += static_cast<std::uint64_t>(world_size() - 1) * count * sizeof(float);
  return done(work);
}

Status InProcDeviceCommunicator::reduce_scatter_sum(const float* send, float* recv, std::size_t count) {
  Post mine{static_cast<std::uint64_t>(Op::reduce_scatter_sum), count, 0, static_cast<std::uint64_t>(device_),
            reinterpret_cast<std::uintptr_t>(send), reinterpret_cast<std::uintptr_t>(recv)};
  const std::size_t all = static_cast<std::size_t>(world_size()) * count;
  auto posts = meet(mine, send, all * sizeof(float), "reduce_scatter_sum");
  if (!posts) return posts.error();
  if (count == 0) return Status::ok_status();
  const std::size_t off = static_cast<std::size_t>(rank()) * count;
  Status work = Status::ok_status();
  float* acc = recv;  // in stream order the inputs are staged: sum straight into recv
  if (bound_ == nullptr) {
    // Summed in a scratch buffer (recv may be this rank's row of its send,
    // which the sum needs to the end), then copied out.
    if (scratch_.size_bytes() < count * sizeof(float)) {
      auto grown = kcu::DeviceBuffer::allocate(count * sizeof(float));
      if (!grown) work = grown.error();
      else scratch_ = std::move(grown).value();
    }
    acc = static_cast<float*>(scratch_.data());
  }
  if (work) work = sum_in_rank_order(acc, *posts, off, count, "reduce_scatter_sum copy");
  if (work && acc != recv) work = copy(recv, acc, count * sizeof(float), "reduce_scatter_sum copy");
  bytes_sent_ += static_cast<std::uint64_t>(world_size() - 1) * count * sizeof(float);
  return done(work);
}

Status InProcDeviceCommunicator::all_to_all(const float* send, float* recv, std::size_t count) {
  Post mine{static_cast<std::uint64_t>(Op::all_to_all), count, 0, static_cast<std::uint64_t>(device_),
            reinterpret_cast<std::uintptr_t>(send), reinterpret_cast<std::uintptr_t>(recv)};
  auto posts = meet(mine, send, static_cast<std::size_t>(world_size()) * count * sizeof(float), "all_to_all");
  if (!posts) return posts.error();
  if (count == 0) return Status::ok_status();
  Status work = Status::ok_status();
  const std::size_t off = static_cast<std::size_t>(rank()) * count;
  for (int k = 0; k < world_size() && work; ++k)
    work = copy(recv + static_cast<std::size_t>(k) * count, as_floats((*posts)[static_cast<std::size_t>(k)].send) + off,
                count * sizeof(float), "all_to_all copy");
  bytes_sent_ += static_cast<std::uint64_t>(world_size() - 1) * count * sizeof(float);
  return done(work);
}

Status InProcDeviceCommunicator::broadcast(float* data, std::size_t count, int root) {
  Post mine{static_cast<std::uint64_t>(Op::broadcast), count, static_cast<std::uint64_t>(root),
            static_cast<std::uint64_t>(device_), 0, reinterpret_cast<std::uintptr_t>(data)};
  if (root < 0) mine.root = static_cast<std::uint64_t>(world_size());  // refused by every rank
  // In stream order every rank stages (each call waits for every peer's event).
  auto posts = meet(mine, data, count * sizeof(float), "broadcast");
  if (!posts) return posts.error();
  if (count == 0) return Status::ok_status();
  Status work = Status::ok_status();
  const auto& from = (*posts)[static_cast<std::size_t>(root)];
  const float* src = as_floats(bound_ != nullptr ? from.send : from.recv);
  if (work && rank() != root) work = copy(data, src, count * sizeof(float), "broadcast copy");
  if (rank() == root) bytes_sent_ += static_cast<std::uint64_t>(world_size() - 1) * count * sizeof(float);
  return done(work);
}

namespace {

/// The acknowledgement tag of a send under `tag` (>= 0).
int ack_tag(int tag) { return -1 - tag; }

/// What a send posts to its receiver and what the receiver answers.
struct P2pPost {
  std::uint64_t device = 0;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};
enum class P2pAck : std::uint64_t { copied = 0, refused = 1, failed = 2 };

}  // namespace

Status InProcDeviceCommunicator::check_peer(int peer, int tag, const void* data, std::size_t bytes,
                                            const char* op) const {
  const auto bad = [&](const std::string& m) {
    return make_error(ErrorCode::invalid_argument,
                      std::string("device communicator: ") + op + ": rank " + std::to_string(rank()) + ": " + m);
  };
  if (tag < 0) return bad("tag " + std::to_string(tag) + " is negative (reserved for acknowledgements)");
  if (peer < 0 || peer >= world_size() || peer == rank())
    return bad("peer " + std::to_string(peer) + " is not another rank of " + std::to_string(world_size()));
  if (data == nullptr && bytes > 0) return bad("null buffer");
  return Status::ok_status();
}

Status InProcDeviceCommunicator::send(const void* data, std::size_t bytes, int peer, int tag) {
  if (Status s = check_peer(peer, tag, data, bytes, "send"); !s) return s;
  const P2pPost post{static_cast<std::uint64_t>(device_), reinterpret_cast<std::uintptr_t>(data), bytes};
  if (Status s = host_->send(&post, sizeof post, peer, tag); !s) return s;
  P2pAck ack = P2pAck::failed;
  if (Status s = host_->recv(&ack, sizeof ack, peer, ack_tag(tag)); !s) return s;
  if (ack == P2pAck::refused)
    return make_error(ErrorCode::invalid_argument, "device communicator: send of " + std::to_string(bytes) +
                                                       " bytes to rank " + std::to_string(peer) +
                                                       " refused: its recv has another size");
  if (ack != P2pAck::copied)
    return make_error(ErrorCode::io, "device communicator: rank " + std::to_string(peer) +
                                         " failed to copy the send of rank " + std::to_string(rank()));
  bytes_sent_ += bytes;
  return Status::ok_status();
}

Status InProcDeviceCommunicator::recv(void* data, std::size_t bytes, int peer, int tag) {
  if (Status s = check_peer(peer, tag, data, bytes, "recv"); !s) return s;
  P2pPost post;
  if (Status s = host_->recv(&post, sizeof post, peer, tag); !s) return s;
  Status work = Status::ok_status();
  P2pAck ack = P2pAck::copied;
  if (post.bytes != bytes) {
    ack = P2pAck::refused;
    work = make_error(ErrorCode::invalid_argument,
                      "device communicator: recv of " + std::to_string(bytes) + " bytes on device " +
                          std::to_string(device_) + " from rank " + std::to_string(peer) + ", which sent " +
                          std::to_string(post.bytes) + " bytes on device " + std::to_string(post.device));
  } else if (bytes > 0) {
    // From another GPU of the process this is a peer copy (unified addressing).
    work = cuda_status(cudaMemcpyAsync(data, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(post.address)),
                                       bytes, cudaMemcpyDeviceToDevice, stream_),
                       "recv copy");
    if (Status synced = cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); work && !synced)
      work = synced;
    if (!work) ack = P2pAck::failed;
  }
  Status told = host_->send(&ack, sizeof ack, peer, ack_tag(tag));
  if (!work) return work;
  return told;
}

}  // namespace shardline::model
