#include "model/device_executor.hpp"

#include <string>
#include <utility>

namespace shardline::model {

Result<std::unique_ptr<ModelExecutor>> make_device_executor(std::shared_ptr<const ModelWeights> weights,
                                                            const DeviceExecutorOptions& options) {
  if (options.device == DeviceKind::cuda) {
#if SHARDLINE_HAVE_CUDA
    auto runner = CudaModelRunner::create(std::move(weights), options.cuda);
    if (!runner) return std::move(runner).error();
    return std::unique_ptr<ModelExecutor>(std::move(runner).value());
#else
    return make_error(ErrorCode::unsupported, "cuda:" + std::to_string(options.cuda.device_index) +
                                                  ": this build has no CUDA backend (configure with SHARDLINE_CUDA=ON "
                                                  "where nvcc is installed)");
#endif
  }
  auto runner = CpuModelRunner::create(std::move(weights), options.cpu);
  if (!runner) return std::move(runner).error();
  return std::unique_ptr<ModelExecutor>(std::move(runner).value());
}

}  // namespace shardline::model
