#include "model/cpu_runner.hpp"

#include <utility>

namespace shardline::model {

Result<std::unique_ptr<CpuModelRunner>> CpuModelRunner::create(std::shared_ptr<const ModelWeights> weights,
                                                               const CpuRunnerOptions& options,
                                                               std::shared_ptr<FfnExecutor> ffn) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "cpu runner: no weights");
  Result<std::unique_ptr<ShardRunner>> shard = ShardRunner::create(std::move(weights), ShardSpec{}, options, {}, std::move(ffn));
  if (!shard.ok()) return std::move(shard).error();
  return std::unique_ptr<CpuModelRunner>(new CpuModelRunner(std::move(shard).value()));
}

Result<model::StepOutput> CpuModelRunner::execute(const model::StepInput& in) {
  if (Status st = shard_->validate(in); !st) return st.error();
  if (Status st = shard_->run_stage(in); !st) return st.error();
  return shard_->run_logits(in);
}

}  // namespace shardline::model
