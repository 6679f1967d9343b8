#include "common/memory.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace shardline {

void AlignedFree::operator()(void* p) const noexcept { std::free(p); }

AlignedBuffer allocate_aligned(std::size_t bytes) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t align = bytes >= kHuge ? kHuge : 64;
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (p != nullptr && align == kHuge) (void)madvise(p, size, MADV_HUGEPAGE);  // a hint; may be ignored
  return AlignedBuffer(p);
}

}  // namespace shardline
