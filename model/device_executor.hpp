#pragma once
/// \file
/// The device factory: the ModelExecutor of one device (a CPU device's
/// CpuModelRunner or a GPU's CudaModelRunner) from loaded weights. Engine
/// groups of several ranks (engine/group/parallel_executor.hpp) are built by the
/// engine over CPU shards; every single-device executor comes from here.

#include <memory>

#include "common/result.hpp"
#include "model/cpu_runner.hpp"
#include "model/cuda/cuda_runner.hpp"
#include "model/executor.hpp"
#include "model/weights.hpp"

namespace shardline::model {

/// Where an executor runs (`--devices cpu:N` / `cuda:N`).
enum class DeviceKind { cpu, cuda };

struct DeviceExecutorOptions {
  DeviceKind device = DeviceKind::cpu;
  CpuRunnerOptions cpu;    ///< used when device == cpu
  CudaRunnerOptions cuda;  ///< used when device == cuda
};

/// Builds the executor of one device over `weights` (shared: a CPU runner
/// keeps a reference, the CUDA runner uploads the matrices). Errors: those
/// of CpuModelRunner::create / CudaModelRunner::create; unsupported for a
/// cuda device in a build without the CUDA backend.
[[nodiscard]] Result<std::unique_ptr<ModelExecutor>> make_device_executor(std::shared_ptr<const ModelWeights> weights,
                                                                          const DeviceExecutorOptions& options);

}  // namespace shardline::model
