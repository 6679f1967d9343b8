#pragma once
// Internal to the .cu files of kernels/cuda: launch status and argument
// errors as Status values, in one wording for every op.
#include <cuda_runtime.h>

#include <string>

#include "common/result.hpp"

namespace shardline::kernels::cuda::detail {

/// The status of the last launch: internal with the CUDA message, or ok.
inline Status launch_status(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok_status();
  return make_error(ErrorCode::internal, std::string("cuda ") + what + ": " + cudaGetErrorString(err));
}

/// invalid_argument "cuda <what>: <why>".
inline Status bad_arg(const char* what, const std::string& why) {
  return make_error(ErrorCode::invalid_argument, std::string("cuda ") + what + ": " + why);
}

}  // namespace shardline::kernels::cuda::detail
