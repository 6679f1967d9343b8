#include "model/cuda/cuda_kv_copier.hpp"

#include <cuda_runtime.h>

#include "kernels/cuda/kv_gather.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace shardline::model {

namespace {

Status cuda_status(const char* what, cudaError_t err) {
  if (err == cudaSuccess) return Status::ok_status();
  (void)cudaGetLastError();
  return make_error(ErrorCode::internal, std::string("cuda KV copier: ") + what + ": " + cudaGetErrorString(err));
}

Error invalid(const std::string& m) { return make_error(ErrorCode::invalid_argument, "cuda KV copier: " + m); }

/// Restores the calling thread's CUDA device when a call returns (the
/// copier switches to each cache's device).
class DeviceRestorer {
 public:
  DeviceRestorer() {
    if (cudaGetDevice(&device_) != cudaSuccess) {
      (void)cudaGetLastError();
      device_ = -1;
    }
  }
  ~DeviceRestorer() {
    if (device_ >= 0) (void)cudaSetDevice(device_);
  }
  DeviceRestorer(const DeviceRestorer&) = delete;
  DeviceRestorer& operator=(const DeviceRestorer&) = delete;

 private:
  int device_ = -1;
};

/// n rounded up to a multiple of `unit`.
constexpr std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }
constexpr std::size_t kMiB = std::size_t{1} << 20;

/// `range` is a non-empty part of the model's layers and a non-empty token
/// range, and `table` reaches its last token (blocks of `block_size`).
/// Errors: invalid_argument, the message after `what`.
Status check_range(const kvstore::KvModelShape& shape, int block_size, std::span<const std::int32_t> table,
                   const kvstore::KvRange& range, const std::string& what) {
  if (range.token_begin < 0 || range.token_end <= range.token_begin || range.layer_begin < 0 ||
      range.layer_end <= range.layer_begin || range.layer_end > shape.num_layers)
    return invalid(what + "empty or bad range: layers [" + std::to_string(range.layer_begin) + ", " +
                   std::to_string(range.layer_end) + "), tokens [" + std::to_string(range.token_begin) + ", " +
                   std::to_string(range.token_end) + ")");
  if (static_cast<int>(table.size()) <= (range.token_end - 1) / block_size)
    return invalid(what + "block table of " + std::to_string(table.size()) + " blocks does not reach token " +
                   std::to_string(range.token_end));
  return Status::ok_status();
}

/// chunks[i] holds exactly items[i]'s canonical chunk.
Status check_chunks(const kvstore::KvModelShape& shape, std::span<const kvstore::KvCopyItem> items,
                    std::span<const std::span<std::byte>> chunks) {
  if (chunks.size() != items.size())
    return invalid(std::to_string(chunks.size()) + " chunks for " + std::to_string(items.size()) + " items");
  for (std::size_t i = 0; i < items.size(); ++i)
    if (chunks[i].size() != kvstore::chunk_bytes(shape, items[i].range))
      return invalid("chunks[" + std::to_string(i) + "] has " + std::to_string(chunks[i].size()) +
                     " bytes, its range needs " + std::to_string(kvstore::chunk_bytes(shape, items[i].range)));
  return Status::ok_status();
}

/// Bytes of one (layer, K|V, block) slab of a cache.
std::size_t slab_bytes(const kvstore::KvModelShape& shape, const kvstore::KvRankLayout& layout) {
  return layout.kv_heads.size() * static_cast<std::size_t>(layout.block_size) * static_cast<std::size_t>(shape.head_dim) *
         dtype_size(shape.dtype);
}

}  // namespace

CudaKvCopier::CudaKvCopier(kvstore::KvModelShape shape, std::vector<DeviceKvCache> caches,
                           std::vector<CUstream_st*> streams, std::vector<std::size_t> stream_of_cache,
                           std::vector<int> stream_devices)
    : shape_(shape),
      caches_(std::move(caches)),
      streams_(std::move(streams)),
      stream_of_cache_(std::move(stream_of_cache)),
      stream_devices_(std::move(stream_devices)),
      slots_(streams_.size(), nullptr),
      slot_bytes_(streams_.size(), 0),
      free_events_(streams_.size()),
      writer_events_(caches_.size(), nullptr) {}

Result<std::unique_ptr<CudaKvCopier>> CudaKvCopier::create(kvstore::KvModelShape shape,
                                                           std::vector<DeviceKvCache> caches,
                                                           std::size_t gather_slot_bytes) {
  if (caches.empty()) return invalid("no caches");
  if (gather_slot_bytes == 0) return invalid("a gather slot of 0 bytes");
  for (std::size_t i = 0; i < caches.size(); ++i) {
    if (caches[i].data == nullptr) return invalid("cache " + std::to_string(i) + " has no memory");
    if (Status s = kvstore::check_layout(shape, caches[i].layout); !s)
      return invalid("cache " + std::to_string(i) + ": " + s.error().message);
    if (caches[i].layout.block_size != caches[0].layout.block_size)
      return invalid("caches of one block table need one block size");
  }
  // A copy stream per device; each cache copies on its device's.
  std::vector<cudaStream_t> streams;        // [devices]
  std::vector<int> stream_devices;          // [devices]
  std::vector<std::size_t> stream_of_cache;  // [caches] index into streams
  Status made = Status::ok_status();
  for (const DeviceKvCache& cache : caches) {
    const auto it = std::find(stream_devices.begin(), stream_devices.end(), cache.device);
    stream_of_cache.push_back(static_cast<std::size_t>(it - stream_devices.begin()));
    if (it != stream_devices.end()) continue;
    cudaStream_t stream = nullptr;
    made = cuda_status("set device", cudaSetDevice(cache.device));
    if (made) made = cuda_status("copy stream", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (!made) break;
    streams.push_back(stream);
    stream_devices.push_back(cache.device);
  }
  auto copier = std::unique_ptr<CudaKvCopier>(new CudaKvCopier(shape, std::move(caches), std::move(streams),
                                                                std::move(stream_of_cache), std::move(stream_devices)));
  copier->gather_slot_bytes_ = gather_slot_bytes;
  if (!made) return made.error();  // the destructor frees the streams made
  return copier;
}

CudaKvCopier::~CudaKvCopier() {
  for (cudaStream_t stream : streams_) (void)cudaStreamSynchronize(stream);
  for (Ticket& t : open_)
    for (cudaEvent_t e : t.done)
      if (e != nullptr) (void)cudaEventDestroy(e);
  for (auto& pool : free_events_)
    for (cudaEvent_t e : pool) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : writer_events_)
    if (e != nullptr) (void)cudaEventDestroy(e);
  open_.clear();
  release_retired();
  for (std::byte* p : slots_)
    if (p != nullptr) (void)cudaFree(p);
  if (arena_ != nullptr) (void)cudaFreeHost(arena_);
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
  for (cudaStream_t stream : streams_) (void)cudaStreamDestroy(stream);
}

std::uint64_t CudaKvCopier::num_copies() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_copies_;
}

std::uint64_t CudaKvCopier::num_gather_launches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_gathers_;
}

std::size_t CudaKvCopier::open_tickets() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_.size();
}

Status CudaKvCopier::plan(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                          std::vector<Slab>& slabs, std::vector<kvstore::KvCacheView>& views,
                          std::vector<std::int32_t>& table) {
  const int bs = caches_[0].layout.block_size;
  if (Status s = check_range(shape_, bs, block_table, range, ""); !s) return s;
  const int b0 = range.token_begin / bs, b1 = (range.token_end - 1) / bs;  // logical blocks of the range
  const int nb = b1 - b0 + 1;
  slabs.clear();
  views.clear();
  std::vector<std::size_t> view_base;  // staging offset of each view
  std::size_t total = 0;
  for (std::size_t c = 0; c < caches_.size(); ++c) {
    const kvstore::KvRankLayout& lay = caches_[c].layout;
    const int lb = std::max(range.layer_begin, lay.layer_begin), le = std::min(range.layer_end, lay.layer_end);
    if (lb >= le) continue;  // holds no layer of the range
    const std::size_t slab = slab_bytes(shape_, lay);
    // Block i of the range, every (layer, K|V) row of it: one strided copy.
    // Device row r = (l - layer_begin) * 2 + kv is r * num_blocks slabs in;
    // staged row (l - lb) * 2 + kv is that many times nb slabs in.
    const auto first_row = static_cast<std::size_t>(lb - lay.layer_begin) * 2;
    for (int i = 0; i < nb; ++i) {
      const std::int32_t p = block_table[static_cast<std::size_t>(b0 + i)];
      if (p < 0 || p >= lay.num_blocks)
        return invalid("block " + std::to_string(p) + " outside cache " + std::to_string(c) + "'s " +
                       std::to_string(lay.num_blocks) + " blocks");
      Slab sl;
      sl.cache = c;
      sl.device_offset = (first_row * static_cast<std::size_t>(lay.num_blocks) + static_cast<std::size_t>(p)) * slab;
      sl.device_pitch = static_cast<std::size_t>(lay.num_blocks) * slab;
      sl.host_offset = total + static_cast<std::size_t>(i) * slab;
      sl.host_pitch = static_cast<std::size_t>(nb) * slab;
      sl.bytes = slab;
      sl.rows = static_cast<std::size_t>(le - lb) * 2;
      slabs.push_back(sl);
    }
    kvstore::KvCacheView v;
    v.layout = kvstore::KvRankLayout{lb, le, lay.kv_heads, nb, bs};
    views.push_back(std::move(v));
    view_base.push_back(total);
    total += static_cast<std::size_t>(le - lb) * 2 * static_cast<std::size_t>(nb) * slab;
  }
  if (total > staging_bytes_) {
    if (staging_ != nullptr) (void)cudaFreeHost(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    const std::size_t want = round_up(total, kMiB);
    if (Status s = cuda_status("pinned staging", cudaMallocHost(&staging_, want)); !s) return s;
    staging_bytes_ = want;
  }
  for (std::size_t v = 0; v < views.size(); ++v) views[v].data = static_cast<char*>(staging_) + view_base[v];
  // Logical block i of the sequence -> its staged copy (blocks before the range are never read).
  table.assign(static_cast<std::size_t>(b1) + 1, 0);
  for (int i = b0; i <= b1; ++i) table[static_cast<std::size_t>(i)] = i - b0;
  return Status::ok_status();
}

Status CudaKvCopier::move(const std::vector<Slab>& slabs, bool to_host) {
  Status work = Status::ok_status();
  for (const Slab& sl : slabs) {
    char* dev = static_cast<char*>(caches_[sl.cache].data) + sl.device_offset;
    char* host = static_cast<char*>(staging_) + sl.host_offset;
    cudaStream_t stream = streams_[stream_of_cache_[sl.cache]];
    work = cuda_status("set device", cudaSetDevice(caches_[sl.cache].device));
    if (!work) break;
    work = to_host ? cuda_status("device to host", cudaMemcpy2DAsync(host, sl.host_pitch, dev, sl.device_pitch, sl.bytes,
                                                                     sl.rows, cudaMemcpyDeviceToHost, stream))
                   : cuda_status("host to device", cudaMemcpy2DAsync(dev, sl.device_pitch, host, sl.host_pitch, sl.bytes,
                                                                     sl.rows, cudaMemcpyHostToDevice, stream));
    if (!work) break;
    ++num_copies_;
  }
  // Always waited for (every device's stream): the staging buffer is reused by the next call.
  Status synced = Status::ok_status();
  for (cudaStream_t stream : streams_)
    if (Status s = cuda_status("copy stream", cudaStreamSynchronize(stream)); !s && synced) synced = s;
  return work ? synced : work;
}

Status CudaKvCopier::copy_out(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                              std::span<std::byte> chunk) {
  const kvstore::KvCopyItem item{block_table, range};
  const std::span<std::byte> chunks[1] = {chunk};
  return copy_out_batch({&item, 1}, chunks);
}

Status CudaKvCopier::copy_out_batch(std::span<const kvstore::KvCopyItem> items,
                                    std::span<const std::span<std::byte>> chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  const DeviceRestorer restore;
  if (Status s = check_chunks(shape_, items, chunks); !s) return s;
  Result<Ticket> t = queue_gathers(items, false);
  Status merged = t ? finish(*t, chunks) : Status(std::move(t).error());
  if (open_.empty()) release_retired();
  return merged;
}

Result<std::uint64_t> CudaKvCopier::begin_copy_out(std::span<const kvstore::KvCopyItem> items) {
  std::lock_guard<std::mutex> lock(mu_);
  const DeviceRestorer restore;
  Result<Ticket> t = queue_gathers(items, true);
  if (!t) {
    if (open_.empty()) release_retired();
    return std::move(t).error();
  }
  t->id = next_ticket_++;
  open_.push_back(std::move(t).value());
  return open_.back().id;
}

Status CudaKvCopier::end_copy_out(std::uint64_t ticket, std::span<const std::span<std::byte>> chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  const DeviceRestorer restore;
  if (open_.empty() || open_.front().id != ticket)
    return invalid("ticket " + std::to_string(ticket) + " is not the oldest open one");
  Ticket t = std::move(open_.front());
  open_.pop_front();
  std::vector<kvstore::KvCopyItem> items;  // for the size checks only
  for (const kvstore::KvRange& r : t.ranges) items.push_back({{}, r});
  Status merged = check_chunks(shape_, items, chunks);
  // The copies are waited for either way: the ticket's memory is reused.
  Status landed = finish(t, merged ? chunks : std::span<const std::span<std::byte>>{});
  if (open_.empty()) release_retired();
  return merged ? landed : merged;
}

Result<std::byte*> CudaKvCopier::pinned(std::size_t bytes) {
  bytes = round_up(bytes, 256);
  if (arena_used_ + bytes > arena_bytes_) {
    // Outgrown: open tickets keep the old arena until the last one ends
    // (and the new one doubles, for the tickets still to come); with none
    // open it is freed now and the new one fits this call.
    if (arena_ != nullptr) {
      if (open_.empty()) (void)cudaFreeHost(arena_);
      else retired_pinned_.push_back(arena_);
    }
    arena_ = nullptr;
    arena_bytes_ = open_.empty() ? bytes : std::max(bytes, 2 * arena_bytes_);
    arena_bytes_ = round_up(arena_bytes_, kMiB);
    arena_used_ = 0;
    void* p = nullptr;
    if (Status s = cuda_status("pinned buffer", cudaMallocHost(&p, arena_bytes_)); !s) {
      arena_bytes_ = 0;
      return s.error();
    }
    arena_ = static_cast<std::byte*>(p);
  }
  std::byte* at = arena_ + arena_used_;
  arena_used_ += bytes;
  return at;
}

Result<std::byte*> CudaKvCopier::slot(std::size_t s, std::size_t bytes) {
  if (slot_bytes_[s] >= bytes) return slots_[s];
  // The old slot's queued passes end before this stream's next ones (stream
  // order); it is freed once no ticket is open.
  if (slots_[s] != nullptr) retired_device_.push_back(slots_[s]);
  slots_[s] = nullptr;
  slot_bytes_[s] = 0;
  const std::size_t want = round_up(bytes, kMiB);
  void* p = nullptr;
  if (Status st = cuda_status("set device", cudaSetDevice(stream_devices_[s])); !st) return st.error();
  if (Status st = cuda_status("gather slot", cudaMalloc(&p, want)); !st) return st.error();
  slots_[s] = static_cast<std::byte*>(p);
  slot_bytes_[s] = want;
  return slots_[s];
}

Result<cudaEvent_t> CudaKvCopier::take_event() {
  // The pools are per stream; the caller has set the stream's device.
  int device = 0;
  if (Status s = cuda_status("get device", cudaGetDevice(&device)); !s) return s.error();
  const auto it = std::find(stream_devices_.begin(), stream_devices_.end(), device);
  if (it != stream_devices_.end()) {
    auto& pool = free_events_[static_cast<std::size_t>(it - stream_devices_.begin())];
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  if (Status s = cuda_status("event", cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); !s) return s.error();
  return e;
}

void CudaKvCopier::release_retired() {
  for (void* p : retired_pinned_) (void)cudaFreeHost(p);
  for (void* p : retired_device_) (void)cudaFree(p);
  retired_pinned_.clear();
  retired_device_.clear();
  if (open_.empty()) arena_used_ = 0;
}

Result<CudaKvCopier::Ticket> CudaKvCopier::queue_gathers(std::span<const kvstore::KvCopyItem> items,
                                                         bool after_writers) {
  const std::byte* arena_at_entry = arena_;
  const std::size_t used_at_entry = arena_used_;
  const int bs = caches_[0].layout.block_size;
  const std::size_t es = dtype_size(shape_.dtype);
  const auto hd = static_cast<std::size_t>(shape_.head_dim);
  const int heads = shape_.num_kv_heads;
  // 1. Which caches supply each item: for every (layer, head) of its range
  // the first cache holding it; a cache that supplies anything gathers its
  // layers of the range (kvstore::copy_out's split at the source).
  struct Work {
    std::size_t item = 0, cache = 0;
    int layer_begin = 0, layer_end = 0;
  };
  std::vector<Work> work;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const kvstore::KvRange& r = items[i].range;
    if (Status s = check_range(shape_, bs, items[i].block_table, r, "items[" + std::to_string(i) + "]: "); !s)
      return s.error();
    const int b0 = r.token_begin / bs, b1 = (r.token_end - 1) / bs;
    std::vector<bool> claimed(static_cast<std::size_t>(r.num_layers()) * static_cast<std::size_t>(heads), false);
    for (std::size_t c = 0; c < caches_.size(); ++c) {
      const kvstore::KvRankLayout& lay = caches_[c].layout;
      const int lb = std::max(r.layer_begin, lay.layer_begin), le = std::min(r.layer_end, lay.layer_end);
      bool supplies = false;
      for (int l = lb; l < le; ++l)
        for (int h : lay.kv_heads) {
          const std::size_t k = static_cast<std::size_t>(l - r.layer_begin) * static_cast<std::size_t>(heads) +
                                static_cast<std::size_t>(h);
          if (!claimed[k]) supplies = claimed[k] = true;
        }
      if (!supplies) continue;
      for (int b = b0; b <= b1; ++b) {
        const std::int32_t p = items[i].block_table[static_cast<std::size_t>(b)];
        if (p < 0 || p >= lay.num_blocks)
          return invalid("items[" + std::to_string(i) + "]: block " + std::to_string(p) + " outside cache " +
                         std::to_string(c) + "'s " + std::to_string(lay.num_blocks) + " blocks");
      }
      work.push_back({i, c, lb, le});
    }
    for (std::size_t k = 0; k < claimed.size(); ++k)
      if (!claimed[k])
        return invalid("items[" + std::to_string(i) + "]: layer " +
                       std::to_string(r.layer_begin + static_cast<int>(k) / heads) + " KV head " +
                       std::to_string(static_cast<int>(k) % heads) + " is held by no cache");
  }

  // 2. Passes: per cache, pieces of whole layers packed up to the slot size
  // (a piece of one layer larger than it gets a pass of its own).
  struct PassPiece {
    std::size_t piece = 0;  // index into ticket.pieces
    kernels::cuda::KvGatherPiece gather;
    int num_blocks = 0;
    std::size_t bytes = 0;
  };
  struct Pass {
    std::size_t cache = 0;
    std::vector<PassPiece> pieces;
    std::size_t out_bytes = 0;
    int num_blocks = 0, max_layers = 0;
  };
  Ticket t;
  for (const kvstore::KvCopyItem& it : items) t.ranges.push_back(it.range);
  std::vector<Pass> passes;
  for (std::size_t c = 0; c < caches_.size(); ++c) {
    const kvstore::KvRankLayout& lay = caches_[c].layout;
    const std::size_t layer_row = 2 * lay.kv_heads.size() * hd * es;  // one layer of one token
    Pass cur;
    cur.cache = c;
    for (const Work& w : work) {
      if (w.cache != c) continue;
      const kvstore::KvRange& r = items[w.item].range;
      const std::size_t per_layer = layer_row * static_cast<std::size_t>(r.num_tokens());
      // Whole layers up to the slot, and up to gather_kv's 65535 rows of its grid.
      const auto grid_layers = static_cast<std::size_t>(65535) / (2 * lay.kv_heads.size());
      const int step = static_cast<int>(std::max<std::size_t>(1, std::min(gather_slot_bytes_ / per_layer, grid_layers)));
      for (int l = w.layer_begin; l < w.layer_end; l += step) {
        const int le = std::min(w.layer_end, l + step);
        PassPiece pp;
        pp.piece = t.pieces.size();
        pp.bytes = per_layer * static_cast<std::size_t>(le - l);
        pp.num_blocks = (r.token_end - 1) / bs - r.token_begin / bs + 1;
        pp.gather.layer = l - lay.layer_begin;
        pp.gather.num_layers = le - l;
        pp.gather.token_begin = r.token_begin;
        pp.gather.num_tokens = r.num_tokens();
        t.pieces.push_back({w.item, c, l, le, nullptr});
        if (!cur.pieces.empty() && cur.out_bytes + pp.bytes > gather_slot_bytes_) {
          passes.push_back(std::move(cur));
          cur = Pass{};
          cur.cache = c;
        }
        pp.gather.out_offset = static_cast<std::int64_t>(cur.out_bytes / es);
        pp.gather.blocks_offset = cur.num_blocks;
        cur.out_bytes += pp.bytes;
        cur.num_blocks += pp.num_blocks;
        cur.max_layers = std::max(cur.max_layers, le - l);
        cur.pieces.push_back(pp);
      }
    }
    if (!cur.pieces.empty()) passes.push_back(std::move(cur));
  }

  // 3. Each pass's arguments and output in pinned memory, laid out as in
  // its device slot: [pieces | blocks | gathered KV], 256-byte aligned parts.
  const auto up = [](std::size_t n) { return round_up(n, 256); };
  std::vector<std::size_t> pass_host(passes.size()), pass_slot(passes.size());
  std::size_t total = 0;
  std::vector<std::size_t> slot_need(streams_.size(), 0);
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const Pass& ps = passes[p];
    pass_slot[p] = up(ps.pieces.size() * sizeof(kernels::cuda::KvGatherPiece)) +
                   up(static_cast<std::size_t>(ps.num_blocks) * sizeof(std::int32_t)) + up(ps.out_bytes);
    pass_host[p] = total;
    total += pass_slot[p];
    std::size_t& need = slot_need[stream_of_cache_[ps.cache]];
    need = std::max(need, pass_slot[p]);
  }
  if (passes.empty()) return t;
  Result<std::byte*> host = pinned(total);
  if (!host) return std::move(host).error();
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const Pass& ps = passes[p];
    std::byte* base = *host + pass_host[p];
    auto* args = reinterpret_cast<kernels::cuda::KvGatherPiece*>(base);
    auto* blocks = reinterpret_cast<std::int32_t*>(base + up(ps.pieces.size() * sizeof(kernels::cuda::KvGatherPiece)));
    std::byte* out = reinterpret_cast<std::byte*>(blocks) + up(static_cast<std::size_t>(ps.num_blocks) * 4);
    for (std::size_t k = 0; k < ps.pieces.size(); ++k) {
      const PassPiece& pp = ps.pieces[k];
      args[k] = pp.gather;
      const Piece& piece = t.pieces[pp.piece];
      const std::span<const std::int32_t> table = items[piece.item].block_table;
      const int b0 = pp.gather.token_begin / bs;
      for (int b = 0; b < pp.num_blocks; ++b)
        blocks[pp.gather.blocks_offset + b] = table[static_cast<std::size_t>(b0 + b)];
      t.pieces[pp.piece].host = out + static_cast<std::size_t>(pp.gather.out_offset) * es;
    }
  }

  // 4. Queue them, stream by stream: wait for the writers, then per pass
  // arguments up, one gather, the KV down; a done event at the end.
  t.done.assign(streams_.size(), nullptr);
  Status queued = Status::ok_status();
  for (std::size_t s = 0; s < streams_.size() && queued; ++s) {
    if (slot_need[s] == 0) continue;
    cudaStream_t stream = streams_[s];
    queued = cuda_status("set device", cudaSetDevice(stream_devices_[s]));
    Result<std::byte*> dev = queued ? slot(s, slot_need[s]) : Result<std::byte*>(queued.error());
    if (!dev) queued = dev.error();
    for (std::size_t c = 0; c < caches_.size() && queued && after_writers; ++c) {
      if (stream_of_cache_[c] != s || caches_[c].writer == nullptr) continue;
      if (writer_events_[c] == nullptr)
        queued = cuda_status("event", cudaEventCreateWithFlags(&writer_events_[c], cudaEventDisableTiming));
      if (queued) queued = cuda_status("record writer", cudaEventRecord(writer_events_[c], caches_[c].writer));
      if (queued) queued = cuda_status("wait for writer", cudaStreamWaitEvent(stream, writer_events_[c], 0));
    }
    for (std::size_t p = 0; p < passes.size() && queued; ++p) {
      const Pass& ps = passes[p];
      if (stream_of_cache_[ps.cache] != s) continue;
      std::byte* h = *host + pass_host[p];
      std::byte* d = *dev;
      const std::size_t args_bytes = pass_slot[p] - up(ps.out_bytes);
      const DeviceKvCache& cache = caches_[ps.cache];
      kernels::cuda::KvGatherCache g;
      g.data = cache.data;
      g.dtype = shape_.dtype;
      g.num_layers = cache.layout.layer_end - cache.layout.layer_begin;
      g.num_blocks = cache.layout.num_blocks;
      g.num_kv_heads = static_cast<int>(cache.layout.kv_heads.size());
      g.block_size = cache.layout.block_size;
      g.head_dim = shape_.head_dim;
      const auto* dargs = reinterpret_cast<const kernels::cuda::KvGatherPiece*>(d);
      const auto* dblocks =
          reinterpret_cast<const std::int32_t*>(d + up(ps.pieces.size() * sizeof(kernels::cuda::KvGatherPiece)));
      queued = cuda_status("gather arguments", cudaMemcpyAsync(d, h, args_bytes, cudaMemcpyHostToDevice, stream));
      if (queued)
        queued = kernels::cuda::gather_kv(g, dargs, static_cast<int>(ps.pieces.size()), ps.max_layers, dblocks,
                                          d + args_bytes, stream);
      if (queued) ++num_gathers_;
      if (queued)
        queued = cuda_status("device to host", cudaMemcpyAsync(h + args_bytes, d + args_bytes, ps.out_bytes,
                                                               cudaMemcpyDeviceToHost, stream));
      if (queued) ++num_copies_;
    }
    if (!queued) break;
    Result<cudaEvent_t> done = take_event();
    if (!done) queued = done.error();
    if (queued) {
      t.done[s] = *done;
      queued = cuda_status("record done", cudaEventRecord(*done, stream));
    }
  }
  if (!queued) {
    // Nothing may still read the pinned or device memory of a refused
    // ticket; its part of the arena is given back.
    for (cudaStream_t stream : streams_) (void)cudaStreamSynchronize(stream);
    for (cudaEvent_t e : t.done)
      if (e != nullptr) (void)cudaEventDestroy(e);
    if (arena_ == arena_at_entry) arena_used_ = used_at_entry;
    return queued.error();
  }
  return t;
}

Status CudaKvCopier::finish(Ticket& t, std::span<const std::span<std::byte>> chunks) {
  Status landed = Status::ok_status();
  for (std::size_t s = 0; s < t.done.size(); ++s) {
    cudaEvent_t e = t.done[s];
    if (e == nullptr) continue;
    if (Status st = cuda_status("copy stream", cudaEventSynchronize(e)); !st && landed) landed = st;
    free_events_[s].push_back(e);
    t.done[s] = nullptr;
  }
  if (!landed)  // the memory is released next: nothing of the ticket may still run
    for (cudaStream_t stream : streams_) (void)cudaStreamSynchronize(stream);
  if (!landed || chunks.empty()) return landed;
  // Merge: each (layer, head) of an item from the first cache holding it.
  const std::size_t es = dtype_size(shape_.dtype);
  const auto hd = static_cast<std::size_t>(shape_.head_dim);
  const auto heads = static_cast<std::size_t>(shape_.num_kv_heads);
  // The pieces come cache by cache, so an item's claims live across them.
  std::vector<std::vector<bool>> claims(t.ranges.size());
  for (std::size_t i = 0; i < t.ranges.size(); ++i)
    claims[i].assign(static_cast<std::size_t>(t.ranges[i].num_layers()) * heads, false);
  for (const Piece& p : t.pieces) {
    const kvstore::KvRange& r = t.ranges[p.item];
    const auto ntok = static_cast<std::size_t>(r.num_tokens());
    const std::size_t run = ntok * hd * es;  // one (layer, K|V, head)
    const std::vector<int>& slots = caches_[p.cache].layout.kv_heads;
    std::vector<bool>& claimed = claims[p.item];
    std::byte* chunk = chunks[p.item].data();
    // A cache of every head, in model order, holding the item's every
    // layer: its gathered piece is the canonical chunk.
    bool identity = p.layer_begin == r.layer_begin && p.layer_end == r.layer_end && slots.size() == heads &&
                    std::find(claimed.begin(), claimed.end(), true) == claimed.end();
    for (std::size_t s = 0; identity && s < slots.size(); ++s) identity = slots[s] == static_cast<int>(s);
    if (identity) {
      std::memcpy(chunk, p.host, chunks[p.item].size());
      claimed.assign(claimed.size(), true);
      continue;
    }
    for (int l = p.layer_begin; l < p.layer_end; ++l)
      for (std::size_t s = 0; s < slots.size(); ++s) {
        const auto h = static_cast<std::size_t>(slots[s]);
        const std::size_t k = static_cast<std::size_t>(l - r.layer_begin) * heads + h;
        if (claimed[k]) continue;
        claimed[k] = true;
        for (std::size_t kv = 0; kv < 2; ++kv) {
          const std::size_t from = ((static_cast<std::size_t>(l - p.layer_begin) * 2 + kv) * slots.size() + s) * run;
          const std::size_t to = ((static_cast<std::size_t>(l - r.layer_begin) * 2 + kv) * heads + h) * run;
          std::memcpy(chunk + to, p.host + from, run);
        }
      }
  }
  return Status::ok_status();
}

Status CudaKvCopier::copy_in(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                             std::span<const std::byte> chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  const DeviceRestorer restore;
  // The blocks' other tokens are kept: staged first, the range written over them.
  std::vector<Slab> slabs;
  std::vector<kvstore::KvCacheView> views;
  std::vector<std::int32_t> table;
  if (Status s = plan(block_table, range, slabs, views, table); !s) return s;
  if (Status s = move(slabs, true); !s) return s;
  if (Status s = kvstore::copy_in(shape_, views, table, range, chunk); !s) return s;
  return move(slabs, false);
}

}  // namespace shardline::model
