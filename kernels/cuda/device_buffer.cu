#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "kernels/cuda/device_buffer.hpp"

namespace shardline::kernels::cuda {
namespace {

Status cuda_error(ErrorCode code, const char* what, cudaError_t err) {
  (void)cudaGetLastError();  // clear a non-sticky error so later launches report their own
  return make_error(code, std::string("cuda ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

Result<DeviceBuffer> DeviceBuffer::allocate(std::size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return Result<DeviceBuffer>(std::move(b));
  const cudaError_t err = cudaMalloc(&b.ptr_, bytes);
  if (err != cudaSuccess) {
    b.ptr_ = nullptr;
    const ErrorCode code =
        err == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::internal;
    return cuda_error(code, ("malloc of " + std::to_string(bytes) + " bytes").c_str(), err).error();
  }
  b.bytes_ = bytes;
  return Result<DeviceBuffer>(std::move(b));
}

Status DeviceBuffer::copy_from_host(const void* src, std::size_t bytes, std::size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset)
    return make_error(ErrorCode::invalid_argument,
                      "cuda copy_from_host: " + std::to_string(bytes) + " bytes at " +
                          std::to_string(offset) + " exceed a buffer of " + std::to_string(bytes_));
  if (bytes == 0) return Status::ok_status();
  const cudaError_t err =
      cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return cuda_error(ErrorCode::internal, "copy_from_host", err);
  return Status::ok_status();
}

Status DeviceBuffer::copy_to_host(void* dst, std::size_t bytes, std::size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    return make_error(ErrorCode::invalid_argument,
                      "cuda copy_to_host: " + std::to_string(bytes) + " bytes at " +
                          std::to_string(offset) + " exceed a buffer of " + std::to_string(bytes_));
  if (bytes == 0) return Status::ok_status();
  const cudaError_t err =
      cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return cuda_error(ErrorCode::internal, "copy_to_host", err);
  return Status::ok_status();
}

Status DeviceBuffer::fill_bytes(int value) {
  if (bytes_ == 0) return Status::ok_status();
  cudaError_t err = cudaMemset(ptr_, value, bytes_);
  if (err != cudaSuccess) return cuda_error(ErrorCode::internal, "memset", err);
  // cudaMemset may return before the device has finished; the documented
  // contract is synchronous (work on other streams may read the bytes next).
  err = cudaStreamSynchronize(nullptr);
  if (err != cudaSuccess) return cuda_error(ErrorCode::internal, "memset", err);
  return Status::ok_status();
}

}  // namespace shardline::kernels::cuda
