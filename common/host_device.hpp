#pragma once
/// \file
/// SHARDLINE_HOST_DEVICE marks a function that the CPU build and the CUDA
/// kernels share (one definition of a conversion or of Philox for both):
/// `__host__ __device__` under nvcc, nothing in plain C++.

#if defined(__CUDACC__)
#define SHARDLINE_HOST_DEVICE __host__ __device__
#else
#define SHARDLINE_HOST_DEVICE
#endif
