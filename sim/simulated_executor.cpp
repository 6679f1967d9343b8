#include "sim/simulated_executor.hpp"

#include <algorithm>

namespace shardline::sim {

Result<std::unique_ptr<SimulatedExecutor>> SimulatedExecutor::create(const orchestrator::CostModel& model,
                                                                     SimulatedExecutorOptions options,
                                                                     const orchestrator::CostModel* large_model,
                                                                     long long large_step_tokens) {
  if (options.num_kv_blocks < 1 || options.block_size < 1)
    return make_error(ErrorCode::invalid_argument, "simulated executor: num_kv_blocks and block_size must be >= 1");
  const engine::ParallelConfig& pc = options.config;
  if (pc.tp < 1 || pc.pp < 1 || pc.sp < 1)
    return make_error(ErrorCode::invalid_argument, "simulated executor: degrees must be >= 1");
  if (pc.pp > model.shape().num_layers)
    return make_error(ErrorCode::invalid_argument, "simulated executor: pp=" + std::to_string(pc.pp) +
                                                       " exceeds the model's " +
                                                       std::to_string(model.shape().num_layers) + " layers");
  if (options.vocab_size < 1) return make_error(ErrorCode::invalid_argument, "simulated executor: vocab_size < 1");
  options.config.dp = 1;
  std::unique_ptr<SimulatedExecutor> e(
      new SimulatedExecutor(model, std::move(options), large_model, large_step_tokens));
  if (e->options_.shift_config) {
    if (pc.sp * pc.tp < 2 || pc.pp != 1)
      return make_error(ErrorCode::invalid_argument, "simulated executor: Shift needs sp*tp > 1 and pp = 1");
    auto policy = engine::ShiftPolicy::create(e->options_.shift);
    if (!policy) return policy.error();
    e->shift_.emplace(std::move(policy).value());
  }
  return e;
}

Result<model::StepOutput> SimulatedExecutor::execute(const model::StepInput& input) {
  if (Status st = submit(input); !st.ok()) return st.error();
  return collect();
}

Status SimulatedExecutor::submit(const model::StepInput& input) {
  if (static_cast<int>(pending_.size()) >= max_in_flight())
    return make_error(ErrorCode::invalid_argument, "simulated executor: max_in_flight steps already in flight");
  orchestrator::StepShape shape;
  for (const model::StepSeq& s : input.seqs) shape.add_sequence(s.num_computed_tokens, s.num_new_tokens);
  bool shifted = false;
  engine::ParallelConfig pc = options_.config;
  if (shift_ && shift_->decide(shape.num_tokens()) == engine::ShiftMode::shift) {
    pc = *options_.shift_config;
    shifted = true;
  }
  const orchestrator::CostModel& m =
      large_model_ != nullptr && shape.num_tokens() >= large_step_tokens_ ? *large_model_ : model_;
  auto cost = m.estimate(pc, shape);
  if (!cost) return cost.error();

  MicroBatchRecord rec;
  // The engine thread schedules, launches and (later) samples it.
  now_ms_ += options_.step_overhead_ms + options_.seq_overhead_ms * static_cast<double>(input.seqs.size());
  rec.submit_ms = now_ms_;
  rec.num_prefill_tokens = static_cast<int>(shape.num_prefill_tokens);
  rec.num_decode_tokens = static_cast<int>(shape.num_decode_tokens);
  rec.num_seqs = static_cast<int>(input.seqs.size());
  rec.shifted = shifted;
  double t = now_ms_;
  const std::size_t stages = stage_free_ms_.size();
  for (std::size_t s = 0; s < stages; ++s) {
    // Shift runs pp = 1: one stage whichever config prices the step.
    const double ts = s < cost->stages.size() ? cost->stages[s].micro_batch_ms : 0.0;
    const double start = std::max(t, stage_free_ms_[s]);
    t = start + ts;
    stage_free_ms_[s] = t;
    stage_busy_ms_[s] += ts;
    rec.busy_ms += ts;
  }
  rec.end_ms = t;
  Pending p;
  p.end_ms = t;
  p.record = records_.size();
  // Token rows are ordered by sequence and logits rows ascend: one pass.
  std::size_t seq = 0;
  int seq_end = input.seqs.empty() ? 0 : input.seqs[0].num_new_tokens;
  for (const std::int32_t row : input.logits_rows) {
    while (seq + 1 < input.seqs.size() && row >= seq_end) seq_end += input.seqs[++seq].num_new_tokens;
    if (seq < input.seqs.size()) p.logits_seqs.push_back(input.seqs[seq].seq_id);
  }
  records_.push_back(rec);
  pending_.push_back(std::move(p));
  return Status::ok_status();
}

Result<model::StepOutput> SimulatedExecutor::collect() {
  if (pending_.empty()) return make_error(ErrorCode::invalid_argument, "simulated executor: no step in flight");
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  now_ms_ = std::max(now_ms_, p.end_ms);
  model::StepOutput out;
  out.vocab_size = options_.vocab_size;
  out.sampled_token_ids.assign(p.logits_seqs.size(), options_.sampled_token_id);
  for (const std::uint64_t seq : p.logits_seqs) {
    TokenTimes& t = token_times_[seq];
    if (t.first_ms < 0) t.first_ms = p.end_ms;
    t.last_ms = p.end_ms;
    ++t.num_tokens;
  }
  return out;
}

}  // namespace shardline::sim
