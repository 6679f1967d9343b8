#pragma once
/// \file
/// `DeviceBuffer`: RAII owner of one cudaMalloc'd allocation (freed with
/// cudaFree on destruction), move-only, with synchronous host <-> device
/// copies. Every CUDA failure is returned as a value (ErrorCode::out_of_memory
/// for a failed allocation, ErrorCode::internal otherwise, with the CUDA
/// runtime's message); nothing throws. Plain C++ header (no cuda_runtime.h).
///
/// Copies use cudaMemcpy on the legacy default stream, so they wait for the
/// work queued on it (and on blocking streams) before returning.

#include <cstddef>
#include <span>
#include <vector>

#include "common/result.hpp"

namespace shardline::kernels::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// `bytes` of uninitialised device memory on the current device; 0 bytes
  /// gives an empty buffer (data() == nullptr) without calling CUDA.
  [[nodiscard]] static Result<DeviceBuffer> allocate(std::size_t bytes);

  /// A buffer holding a copy of `host` (size_bytes() == host.size_bytes()).
  template <class T>
  [[nodiscard]] static Result<DeviceBuffer> from_host(std::span<const T> host) {
    Result<DeviceBuffer> b = allocate(host.size_bytes());
    if (!b.ok()) return b;
    if (Status s = b->copy_from_host(host.data(), host.size_bytes()); !s.ok()) return s.error();
    return b;
  }
  template <class T>
  [[nodiscard]] static Result<DeviceBuffer> from_host(const std::vector<T>& host) {
    return from_host(std::span<const T>(host));
  }

  /// Copies `bytes` from host memory `src` to this buffer at byte `offset`
  /// (invalid_argument if the range exceeds the buffer).
  [[nodiscard]] Status copy_from_host(const void* src, std::size_t bytes, std::size_t offset = 0);
  /// Copies `bytes` at byte `offset` of this buffer to host memory `dst`.
  [[nodiscard]] Status copy_to_host(void* dst, std::size_t bytes, std::size_t offset = 0) const;
  /// The whole buffer as a host vector of T (size_bytes() / sizeof(T) elements).
  template <class T>
  [[nodiscard]] Result<std::vector<T>> to_host() const {
    std::vector<T> out(bytes_ / sizeof(T));
    if (Status s = copy_to_host(out.data(), out.size() * sizeof(T)); !s.ok()) return s.error();
    return out;
  }
  /// Sets every byte to `value` (cudaMemset, synchronous w.r.t. the host).
  [[nodiscard]] Status fill_bytes(int value);

  [[nodiscard]] void* data() noexcept { return ptr_; }
  [[nodiscard]] const void* data() const noexcept { return ptr_; }
  /// The device pointer as T* (no check of alignment or size).
  template <class T>
  [[nodiscard]] T* as() noexcept { return static_cast<T*>(ptr_); }
  template <class T>
  [[nodiscard]] const T* as() const noexcept { return static_cast<const T*>(ptr_); }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return bytes_; }

  /// Frees the allocation now (idempotent).
  void reset() noexcept;

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace shardline::kernels::cuda
