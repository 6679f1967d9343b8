#pragma once
/// \file
/// Private to the CPU kernels' instruction-path files (attention_avx2.cpp,
/// attention_avx512.cpp, ...), each compiled for its own instructions
/// whatever the build machine and called only on a CPU that has them.
///
/// Why not std::vector there: a std::vector<float> member the compiler does
/// not inline (resize, say) is emitted as a weak symbol compiled with that
/// file's flags, and the linker keeps one copy of it for the whole program,
/// possibly the AVX-512 one, which any other code then runs, also on a CPU
/// without AVX-512. LocalBuffer is declared in an unnamed namespace, so each
/// file that includes this header has its own copy with internal linkage and
/// shares nothing. The kernel_path_objects test checks that no path object
/// defines a weak symbol.

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace shardline::kernels::cpu {
namespace {

/// A growable array of trivially copyable T with std::vector::resize's
/// semantics (elements past the old size are value-initialized, zero).
template <typename T>
class LocalBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  LocalBuffer() = default;
  LocalBuffer(const LocalBuffer&) = delete;
  LocalBuffer& operator=(const LocalBuffer&) = delete;
  ~LocalBuffer() { std::free(data_); }

  /// Makes the size `n`: kept elements keep their values, new ones are zero.
  /// Throws std::bad_alloc when memory runs out.
  void resize(std::size_t n) {
    if (n > capacity_) {
      auto* grown = static_cast<T*>(std::malloc(n * sizeof(T)));
      if (grown == nullptr) throw std::bad_alloc();
      if (size_ > 0) std::memcpy(grown, data_, size_ * sizeof(T));
      std::free(data_);
      data_ = grown;
      capacity_ = n;
    }
    for (std::size_t i = size_; i < n; ++i) data_[i] = T{};
    size_ = n;
  }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] T* data() { return data_; }
  [[nodiscard]] const T* data() const { return data_; }
  [[nodiscard]] T* begin() { return data_; }
  [[nodiscard]] T* end() { return data_ + size_; }
  /// The last element. Precondition: size() > 0.
  [[nodiscard]] T& back() { return data_[size_ - 1]; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace
}  // namespace shardline::kernels::cpu
