#include "sim/simulated_executor.hpp"

#include <algorithm>

namespace shardline::sim {

SimulatedExecutor::SimulatedExecutor(const sim::CostModel& model, SimulatedExecutorOptions options,
                                     const sim::CostModel* large_model, long long large_step_tokens)
    : model_(model),
      large_model_(large_model),
      large_step_tokens_(large_step_tokens),
      options_(std::move(options)),
      active_(options_.config) {
  const int stages = std::max(options_.config.pp, options_.decode_config ? options_.decode_config->pp : 1);
  stage_free_ms_.assign(static_cast<std::size_t>(stages), 0.0);
  stage_busy_ms_.assign(static_cast<std::size_t>(stages), 0.0);
}

Result<std::unique_ptr<SimulatedExecutor>> SimulatedExecutor::create(const sim::CostModel& model,
                                                                     SimulatedExecutorOptions options,
                                                                     const sim::CostModel* large_model,
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
  if (options.decode_config) {
    engine::ParallelConfig& cd = *options.decode_config;
    cd.dp = 1;
    if (cd.tp < 1 || cd.pp < 1 || cd.sp < 1 || cd.pp > model.shape().num_layers)
      return make_error(ErrorCode::invalid_argument, "simulated executor: a bad Seesaw decode config " + cd.to_string());
    if (cd.group_size() != pc.group_size())
      return make_error(ErrorCode::invalid_argument, "simulated executor: Seesaw's cp " + pc.to_string() + " and cd " +
                                                         cd.to_string() + " must use the same number of devices");
    if (options.shift_config)
      return make_error(ErrorCode::invalid_argument, "simulated executor: Seesaw does not go with Shift");
    if (!(options.weight_bytes > 0) || !(options.kv_link_bw_bytes_per_s > 0))
      return make_error(ErrorCode::invalid_argument,
                        "simulated executor: Seesaw needs the weight bytes and a host link (bandwidth > 0)");
  }
  if (options.price && (pc.pp != 1 || options.decode_config || options.shift_config))
    return make_error(ErrorCode::invalid_argument, "simulated executor: a price override needs one config with pp = 1");
  if (options.kv_link_bw_bytes_per_s > 0 || options.replicate_kv) {
    const kvstore::KvModelShape& ks = options.kv_shape;
    if (ks.num_layers < 1 || ks.num_kv_heads < 1 || ks.head_dim < 1 || !(options.kv_link_bw_bytes_per_s > 0) ||
        !(options.kv_link_latency_ms >= 0))
      return make_error(ErrorCode::invalid_argument,
                        "simulated executor: KV copies need the KV shape and a KV link (bandwidth > 0, latency >= 0)");
  }
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
  sim::StepShape shape;
  for (const model::StepSeq& s : input.seqs) shape.add_sequence(s.num_computed_tokens, s.num_new_tokens);
  bool shifted = false;
  engine::ParallelConfig pc = active_;
  if (shift_ && shift_->decide(shape.num_tokens()) == engine::ShiftMode::shift) {
    pc = *options_.shift_config;
    shifted = true;
  }
  const bool large = large_model_ != nullptr && shape.num_tokens() >= large_step_tokens_;
  const sim::CostModel& m = large                                         ? *large_model_
                                     : shifted && options_.shift_model != nullptr ? *options_.shift_model
                                                                                  : model_;
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
  // A sequence whose KV is still on a link (Seesaw's onboard, a resumed
  // request's restore) is not stepped before it lands.
  double ready = now_ms_;
  for (const model::StepSeq& s : input.seqs) {
    if (s.block_table.empty()) continue;
    const auto it = onboard_ready_ms_.find(s.block_table.front());
    if (it == onboard_ready_ms_.end()) continue;
    ready = std::max(ready, it->second);
    onboard_ready_ms_.erase(it);
  }
  rec.kv_wait_ms = std::max(0.0, ready - std::max(now_ms_, stage_free_ms_[0]));
  link_.onboard_wait_ms += rec.kv_wait_ms;
  double t = ready;
  const std::size_t stages = static_cast<std::size_t>(pc.pp);
  for (std::size_t s = 0; s < stages; ++s) {
    // Shift runs pp = 1: one stage whichever config prices the step.
    double ts = s < cost->stages.size() ? cost->stages[s].micro_batch_ms : 0.0;
    if (options_.price && shape.num_tokens() > 0) ts = options_.price(shape, *cost);
    if (options_.replicate_kv && shape.num_tokens() > 0) {
      // Each rank streams its share of the stage's new KV while computing.
      const kvstore::KvModelShape& ks = options_.kv_shape;
      const double layers = s < cost->stages.size() ? cost->stages[s].num_layers : 0;
      const double bytes = 2.0 * layers * ks.num_kv_heads * ks.head_dim * dtype_size(ks.dtype) *
                           static_cast<double>(shape.num_tokens()) / static_cast<double>(pc.tp * pc.sp);
      ts = std::max(ts, options_.kv_link_latency_ms + bytes / options_.kv_link_bw_bytes_per_s * 1e3);
      link_.replicated_bytes += bytes * pc.tp * pc.sp;
    }
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


double SimulatedExecutor::link_copy(double bytes, bool to_host) {
  const double per_device = bytes / static_cast<double>(active_.group_size());
  const double start = std::max(link_free_ms_, now_ms_);
  link_free_ms_ = start + options_.kv_link_latency_ms + per_device / options_.kv_link_bw_bytes_per_s * 1e3;
  (to_host ? link_.bytes_to_host : link_.bytes_to_device) += bytes;
  return link_free_ms_;
}

Status SimulatedExecutor::LinkCopier::copy_out(std::span<const std::int32_t> /*block_table*/,
                                                   const kvstore::KvRange& range, std::span<std::byte> /*chunk*/) {
  owner_.link_copy(static_cast<double>(kvstore::chunk_bytes(owner_.options_.kv_shape, range)), /*to_host=*/true);
  return Status::ok_status();
}

Status SimulatedExecutor::LinkCopier::copy_in(std::span<const std::int32_t> block_table,
                                                  const kvstore::KvRange& range, std::span<const std::byte> /*chunk*/) {
  const double lands =
      owner_.link_copy(static_cast<double>(kvstore::chunk_bytes(owner_.options_.kv_shape, range)), /*to_host=*/false);
  if (!block_table.empty()) owner_.onboard_ready_ms_[block_table.front()] = lands;
  return Status::ok_status();
}

Status SimulatedExecutor::use_step_config(model::StepConfig config) {
  if (!options_.decode_config)
    return make_error(ErrorCode::unsupported, "simulated executor: one parallel config only");
  if (!pending_.empty())
    return make_error(ErrorCode::invalid_argument, "simulated executor: step config switched with steps in flight");
  const engine::ParallelConfig& to =
      config == model::StepConfig::decode ? *options_.decode_config : options_.config;
  if (to == active_) return Status::ok_status();
  // The KV copies and every stage finish first; then each device reloads
  // its shard of the new config from host memory, all in parallel.
  double start = std::max(now_ms_, link_free_ms_);
  for (const double f : stage_free_ms_) start = std::max(start, f);
  const double shard_bytes = options_.weight_bytes / static_cast<double>(to.tp * to.pp);
  const double reload_ms = options_.kv_link_latency_ms + shard_bytes / options_.kv_link_bw_bytes_per_s * 1e3;
  link_.transition_ms += start + reload_ms - now_ms_;
  link_.reload_ms += reload_ms;
  ++link_.transitions;
  now_ms_ = start + reload_ms;
  for (double& f : stage_free_ms_) f = now_ms_;
  active_ = to;
  return Status::ok_status();
}

}  // namespace shardline::sim
