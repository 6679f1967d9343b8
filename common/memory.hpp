#pragma once
/// \file
/// Large, long-lived buffers (packed weights, the KV cache): 64-byte aligned,
/// and backed by transparent huge pages where the kernel allows
/// (`madvise(MADV_HUGEPAGE)`). Weights and KV are streamed every step; with
/// 4 KiB pages that is one TLB miss per 4 KiB, which costs measurably in a VM.

#include <cstddef>
#include <memory>

namespace shardline {

struct AlignedFree {
  void operator()(void* p) const noexcept;
};
using AlignedBuffer = std::unique_ptr<void, AlignedFree>;

/// Allocates `bytes` (rounded up), aligned to 64 bytes, or to 2 MiB with a
/// huge-page hint when `bytes` >= 2 MiB. Contents are uninitialised.
/// Returns nullptr when the allocation fails.
[[nodiscard]] AlignedBuffer allocate_aligned(std::size_t bytes);

}  // namespace shardline
