#pragma once
/// \file
/// DéjàVu's KV movement on CUDA devices (seed 003 §4.1: stream_out /
/// stream_in; issue 41 item 7): the paged KV caches of one CUDA runner, or
/// of every rank of a CudaShardGroup, as a kvstore::KvCopier, so that a CUDA
/// worker streams its KV to the KV stores, restores a resumed request's KV
/// from them instead of recomputing it, and swaps preempted sequences to
/// host memory.
///
/// copy_out stages the blocks a range touches: for each cache and each block
/// of the range, one strided device-to-host copy (cudaMemcpy2DAsync) of
/// that block's slab in every layer of the range the cache holds, K and V,
/// into a pinned buffer, on the copier's own copy stream (one per GPU, for
/// the caches of a group whose ranks are on several); once they have
/// landed, kvstore::copy_out over host views of the staged blocks writes
/// the canonical chunk (the same bytes the CPU caches give). copy_in stages
/// the same blocks, writes the chunk into them with kvstore::copy_in (only
/// the range's tokens change) and copies them back. The cost is one copy
/// per cache and block per call, so a step's increments take one per
/// sequence, each waited for: a gather kernel (one launch per step for
/// every sequence) and per-layer copies overlapping the forward (§4.1.1)
/// are not built.
///
/// Contract: no step that writes the blocks of a call may run while it runs
/// (the engine copies between steps, after execute() has returned, which
/// synchronises the runner's stream). Thread-safe: calls are serialised.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/result.hpp"
#include "kvstore/kv_stream.hpp"

struct CUstream_st;

namespace shardline::model {

/// One device KV cache: `data` is [layers, 2, num_blocks, kv_heads, block_size,
/// head_dim] elements of the shape's dtype on CUDA device `device`, laid out as
/// `layout` says (kvstore::KvRankLayout).
struct DeviceKvCache {
  void* data = nullptr;
  kvstore::KvRankLayout layout;
  int device = 0;
};

class CudaKvCopier final : public kvstore::KvCopier {
 public:
  /// Copies to and from `caches` (at least one; every layout checked against
  /// `shape`). Errors: invalid_argument (no cache, a null one, a layout
  /// kvstore::check_layout refuses), internal (the copy stream cannot be made).
  [[nodiscard]] static Result<std::unique_ptr<CudaKvCopier>> create(kvstore::KvModelShape shape,
                                                                    std::vector<DeviceKvCache> caches);
  ~CudaKvCopier() override;
  CudaKvCopier(const CudaKvCopier&) = delete;
  CudaKvCopier& operator=(const CudaKvCopier&) = delete;

  [[nodiscard]] int num_devices() const override { return static_cast<int>(caches_.size()); }
  /// Per-step copies on the stepping thread are cheap enough here for
  /// DéjàVu's streaming and resumed-KV restores.
  [[nodiscard]] bool supports_streaming() const override { return true; }
  /// `range` of the sequence with `block_table` into `chunk` (the canonical
  /// chunk, kvstore::chunk_bytes). Errors: invalid_argument (a bad range or
  /// table, a chunk of the wrong size: kvstore::copy_out's), internal (a
  /// CUDA copy failed).
  [[nodiscard]] Status copy_out(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                                std::span<std::byte> chunk) override;
  /// `chunk` into every cache holding part of `range`; other tokens of the
  /// blocks are kept. Errors: as copy_out.
  [[nodiscard]] Status copy_in(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                               std::span<const std::byte> chunk) override;
  /// Device-to-host and host-to-device copies made so far (one per cache and block).
  [[nodiscard]] std::uint64_t num_copies() const;

 private:
  CudaKvCopier(kvstore::KvModelShape shape, std::vector<DeviceKvCache> caches, std::vector<CUstream_st*> streams,
               std::vector<std::size_t> stream_of_cache);
  /// One block of a cache, every (layer, K|V) row of it that a range needs:
  /// `rows` slabs of `bytes`, `device_pitch` apart in the cache and
  /// `host_pitch` apart in the staging buffer (one cudaMemcpy2DAsync).
  struct Slab {
    std::size_t cache = 0;
    std::size_t device_offset = 0;  ///< bytes into the cache's data
    std::size_t device_pitch = 0;
    std::size_t host_offset = 0;    ///< bytes into the staging buffer
    std::size_t host_pitch = 0;
    std::size_t bytes = 0;          ///< one slab: kv_heads * block_size * head_dim elements
    std::size_t rows = 0;           ///< 2 x the layers of the range the cache holds
  };
  /// Plans the slabs of `range`, sizes the staging buffer and fills `views`
  /// (host views of the staged blocks, caches holding none of the range left
  /// out) and `table` (the sequence's logical blocks -> staged blocks).
  /// Errors: invalid_argument (a short table, a block out of a cache's range,
  /// an empty range), internal (pinned memory).
  [[nodiscard]] Status plan(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                            std::vector<Slab>& slabs, std::vector<kvstore::KvCacheView>& views,
                            std::vector<std::int32_t>& table);
  /// Copies every slab device -> staging (to_host) or back, then waits.
  [[nodiscard]] Status move(const std::vector<Slab>& slabs, bool to_host);
  /// A range's blocks, staged in host memory, and host views of them.
  struct Staged {
    std::vector<Slab> slabs;
    std::vector<kvstore::KvCacheView> views;
    std::vector<std::int32_t> table;
  };
  /// plan() then move(to_host). Errors: theirs.
  [[nodiscard]] Status stage(std::span<const std::int32_t> block_table, const kvstore::KvRange& range, Staged& staged);

  kvstore::KvModelShape shape_;
  std::vector<DeviceKvCache> caches_;
  std::vector<CUstream_st*> streams_;       ///< [devices] a copy stream per device the caches are on
  std::vector<std::size_t> stream_of_cache_;  ///< [caches] the index of the cache's device's stream
  mutable std::mutex mu_;
  void* staging_ = nullptr;  ///< pinned, staging_bytes_
  std::size_t staging_bytes_ = 0;
  std::uint64_t num_copies_ = 0;
};

}  // namespace shardline::model
