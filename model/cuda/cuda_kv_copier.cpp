#include "model/cuda/cuda_kv_copier.hpp"

#include <cuda_runtime.h>

#include <algorithm>
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

/// Bytes of one (layer, K|V, block) slab of a cache.
std::size_t slab_bytes(const kvstore::KvModelShape& shape, const kvstore::KvRankLayout& layout) {
  return layout.kv_heads.size() * static_cast<std::size_t>(layout.block_size) * static_cast<std::size_t>(shape.head_dim) *
         dtype_size(shape.dtype);
}

}  // namespace

CudaKvCopier::CudaKvCopier(kvstore::KvModelShape shape, std::vector<DeviceKvCache> caches,
                           std::vector<CUstream_st*> streams, std::vector<std::size_t> stream_of_cache)
    : shape_(shape),
      caches_(std::move(caches)),
      streams_(std::move(streams)),
      stream_of_cache_(std::move(stream_of_cache)) {}

Result<std::unique_ptr<CudaKvCopier>> CudaKvCopier::create(kvstore::KvModelShape shape,
                                                           std::vector<DeviceKvCache> caches) {
  if (caches.empty()) return invalid("no caches");
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
  auto copier = std::unique_ptr<CudaKvCopier>(
      new CudaKvCopier(shape, std::move(caches), std::move(streams), std::move(stream_of_cache)));
  if (!made) return made.error();  // the destructor frees the streams made
  return copier;
}

CudaKvCopier::~CudaKvCopier() {
  if (staging_ != nullptr) (void)cudaFreeHost(staging_);
  for (cudaStream_t stream : streams_) (void)cudaStreamDestroy(stream);
}

std::uint64_t CudaKvCopier::num_copies() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_copies_;
}

Status CudaKvCopier::plan(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                          std::vector<Slab>& slabs, std::vector<kvstore::KvCacheView>& views,
                          std::vector<std::int32_t>& table) {
  if (range.token_begin < 0 || range.token_end <= range.token_begin || range.layer_begin < 0 ||
      range.layer_end <= range.layer_begin || range.layer_end > shape_.num_layers)
    return invalid("empty or bad range: layers [" + std::to_string(range.layer_begin) + ", " +
                   std::to_string(range.layer_end) + "), tokens [" + std::to_string(range.token_begin) + ", " +
                   std::to_string(range.token_end) + ")");
  const int bs = caches_[0].layout.block_size;
  const int b0 = range.token_begin / bs, b1 = (range.token_end - 1) / bs;  // logical blocks of the range
  const int nb = b1 - b0 + 1;
  if (static_cast<int>(block_table.size()) <= b1)
    return invalid("block table of " + std::to_string(block_table.size()) + " blocks does not reach token " +
                   std::to_string(range.token_end));
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
    const std::size_t want = (total + (1u << 20) - 1) / (1u << 20) * (1u << 20);
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

Status CudaKvCopier::stage(std::span<const std::int32_t> block_table, const kvstore::KvRange& range, Staged& staged) {
  if (Status s = plan(block_table, range, staged.slabs, staged.views, staged.table); !s) return s;
  return move(staged.slabs, true);
}

Status CudaKvCopier::copy_out(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                              std::span<std::byte> chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  Staged st;
  if (Status s = stage(block_table, range, st); !s) return s;
  return kvstore::copy_out(shape_, st.views, st.table, range, chunk);
}

Status CudaKvCopier::copy_in(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                             std::span<const std::byte> chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  // The blocks' other tokens are kept: staged first, the range written over them.
  Staged st;
  if (Status s = stage(block_table, range, st); !s) return s;
  if (Status s = kvstore::copy_in(shape_, st.views, st.table, range, chunk); !s) return s;
  return move(st.slabs, false);
}

}  // namespace shardline::model
