#include "sim/calibration/parallel.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "sim/calibration/hardware.hpp"
#include "sim/calibration/workload.hpp"
#include "engine/data_parallel.hpp"
#include "engine/sidp/sidp_group.hpp"
#include "sim/cost_model.hpp"
#include "engine/policies/token_budget_policies.hpp"

namespace shardline::sim::calibration {

namespace {

/// One (config, policy) measurement.
Result<ParallelConfigResult> run_one(const ParallelBenchOptions& o, const engine::ParallelConfig& pc,
                                     const std::string& policy_name, const sim::CostModel* model,
                                     int cores) {
  ParallelConfigResult r;
  r.parallel = pc.to_string();
  r.token_budget = policy_name;
  r.num_devices = pc.world_size();
  r.threads_per_rank = o.engine.num_threads > 0 ? o.engine.num_threads : std::max(1, cores / pc.world_size());

  engine::EngineOptions eo = o.engine;
  eo.parallel = pc;
  eo.parallel.dp = 1;
  eo.num_threads = r.threads_per_rank;
  eo.max_num_seqs = o.max_batch;
  eo.max_model_len = o.input_len + o.output_len;
  Result<std::unique_ptr<engine::TokenBudgetPolicy>> policy =
      engine::make_token_budget_policy(policy_name, eo.max_num_batched_tokens);
  if (!policy.ok()) return std::move(policy).error();
  eo.token_budget = std::shared_ptr<const engine::TokenBudgetPolicy>(std::move(policy).value());

  std::vector<engine::EngineInstance> replicas;
  std::unique_ptr<engine::SidpGroup> sidp;  // o.sidp: the dp ranks as one SiDP group
  if (o.sidp) {
    if (pc.dp < 2 || pc.tp * pc.pp * pc.sp != 1)
      return make_error(ErrorCode::invalid_argument, "bench: SiDP runs dp >= 2 single-device ranks, not " + pc.to_string());
    engine::SidpOptions so = *o.sidp;
    so.dp = pc.dp;
    omp_set_num_threads(r.threads_per_rank);
    auto g = engine::SidpGroup::create(eo, so);
    if (!g.ok()) return std::move(g).error();
    sidp = std::move(g).value();
  } else {
    for (int d = 0; d < pc.dp; ++d) {
      omp_set_num_threads(r.threads_per_rank);
      Result<engine::EngineInstance> e = engine::build_engine(eo);
      if (!e.ok()) return std::move(e).error();
      replicas.push_back(std::move(e).value());
    }
  }
  std::vector<engine::LlmEngine*> engines;
  for (engine::EngineInstance& e : replicas) engines.push_back(e.engine.get());
  if (sidp)
    for (int d = 0; d < sidp->dp(); ++d) engines.push_back(&sidp->engine(d));
  engine::EngineInstance& first = sidp ? sidp->instance(0) : replicas.front();
  const auto prompts = random_prompts(o.num_prompts, o.input_len, first.weights->config.vocab_size, o.prompt_seed);
  const auto generate = [&](const sampling::SamplingParams& params) {
    return sidp ? engine::generate_sidp(*sidp, prompts, params, r.threads_per_rank)
                : engine::generate_data_parallel(engines, prompts, params, r.threads_per_rank);
  };

  sampling::SamplingParams params;
  params.temperature = 0.0f;
  params.ignore_eos = true;

  // 1. Prefill only.
  params.max_tokens = 1;
  auto t0 = Clock::now();
  if (o.prefill_run) {
    if (auto out = generate(params); !out.ok()) return std::move(out).error();
    r.prefill_elapsed_s = seconds_since(t0);
    for (engine::LlmEngine* e : engines) e->clear_step_stats();
  }

  // 2. The full run; rank 0 of replica 0 records its per-step communication.
  std::vector<double> step_comm_bytes;
  engine::InProcEngineGroup* group0 = first.executor_as<engine::InProcEngineGroup>();
  engine::ParallelExecutor* exec0 = group0 ? &group0->executor() : nullptr;
  first.engine->set_step_callback([&](const engine::StepStats& s) {
    if (s.num_prefill_tokens == 0 && exec0 != nullptr)
      step_comm_bytes.push_back(static_cast<double>(exec0->last_step_comm_bytes()));
  });
  const std::vector<double> busy_before = group0 ? group0->stage_busy_ms() : std::vector<double>{};
  params.max_tokens = o.output_len;
  t0 = Clock::now();
  auto out = generate(params);
  r.elapsed_s = seconds_since(t0);
  first.engine->set_step_callback(nullptr);
  if (!out.ok()) return std::move(out).error();
  long generated = 0;
  for (const auto& x : out.value()) generated += static_cast<long>(x.token_ids.size());
  const double prompt_tokens = static_cast<double>(o.num_prompts) * o.input_len;
  r.total_tok_s = (prompt_tokens + static_cast<double>(generated)) / r.elapsed_s;
  if (o.prefill_run) r.prefill_tok_s = prompt_tokens / r.prefill_elapsed_s;
  if (o.prefill_run && r.elapsed_s > r.prefill_elapsed_s)
    r.decode_tok_s = static_cast<double>(generated - o.num_prompts) / (r.elapsed_s - r.prefill_elapsed_s);
  if (group0 && pc.pp > 1) {
    const std::vector<double> busy = group0->stage_busy_ms();
    double sum = 0;
    for (std::size_t s = 0; s < busy.size(); ++s) sum += busy[s] - busy_before[s];
    r.bubble_fraction = std::max(0.0, 1.0 - sum / (pc.pp * r.elapsed_s * 1e3));
  }

  // Decode micro-batches at the largest decode batch.
  const auto& stats = first.engine->step_stats();
  for (const auto& s : stats)
    if (s.num_prefill_tokens == 0) r.decode_batch = std::max(r.decode_batch, s.num_decode_tokens);
  r.decode_step_ms = decode_median_ms(*first.engine, r.decode_batch);
  {
    std::vector<double> own;
    for (const auto& s : stats)
      if (s.num_prefill_tokens == 0 && s.num_decode_tokens == r.decode_batch)
        own.push_back(std::max(0.0, s.step_ms - s.execute_ms));
    r.decode_own_ms = median(std::move(own));
  }
  r.decode_round_ms = r.decode_step_ms * pc.pp;
  r.comm_bytes_per_step = median(step_comm_bytes);

  // Cost model: all running sequences (decode_batch per micro-batch, pp
  // micro-batches) at the mean context of the decode phase.
  sim::StepShape decode;
  const long long context = o.input_len + o.output_len / 2;
  for (int i = 0; i < r.decode_batch * pc.pp; ++i) decode.add_sequence(context, 1);
  decode.num_micro_batches = pc.pp;
  engine::ParallelConfig group = pc;
  group.dp = 1;
  if (model == nullptr) return r;  // no measured limits: no predictions
  if (auto c = model->estimate(group, decode); c.ok() && r.decode_batch > 0) {
    r.predicted_decode_round_ms = c.value().total_ms - c.value().bubble_ms;  // steady state: pipeline stays full
    r.predicted_decode_step_ms = r.predicted_decode_round_ms / pc.pp;
    const auto& st = c.value().stages;
    double sum = 0, tmax = 0;
    for (const auto& s : st) {
      sum += s.micro_batch_ms;
      tmax = std::max(tmax, s.micro_batch_ms);
    }
    if (tmax > 0) r.predicted_bubble_fraction = pc.pp > 1 ? 1.0 - sum / (pc.pp * tmax) : 0.0;
    r.predicted_comm_bytes_per_step =
        (c.value().tp_bytes_per_rank + c.value().sp_bytes_per_rank + c.value().pp_bytes_per_rank) / pc.pp;
  }
  sim::StepShape prefill;
  const int per_micro_batch = std::max(1, eo.max_num_batched_tokens / o.input_len);
  for (int i = 0; i < per_micro_batch * pc.pp; ++i) prefill.add_sequence(0, o.input_len);
  prefill.num_micro_batches = pc.pp;
  if (auto c = model->estimate(group, prefill); c.ok()) {
    const double ms = c.value().total_ms - c.value().bubble_ms;
    if (ms > 0) r.predicted_prefill_tok_s = static_cast<double>(prefill.num_tokens()) / (ms / 1e3) * pc.dp;
  }
  return r;
}

}  // namespace

Result<ParallelBenchReport> run_parallel_bench(const ParallelBenchOptions& o) {
  if (o.configs.empty()) return make_error(ErrorCode::invalid_argument, "bench: no --parallel configs");
  if (o.num_prompts <= 0 || o.input_len <= 0 || o.output_len <= 0 || o.max_batch <= 0)
    return make_error(ErrorCode::invalid_argument,
                      "bench: --num-prompts, --input-len, --output-len and --max-batch must be > 0");
  for (const std::string& p : o.token_budgets)
    if (Status st = engine::check_token_budget_policy_name(p); !st) return st.error();
  ParallelBenchReport rep;
  rep.model = o.engine.model_dir;
  rep.num_prompts = o.num_prompts;
  rep.input_len = o.input_len;
  rep.output_len = o.output_len;
  rep.max_batch = o.max_batch;
  const int cores = std::max(1, omp_get_num_procs());
  rep.cores = cores;
  omp_set_num_threads(cores);
  if (o.measure_hardware) {
    rep.membw_gbs = measure_triad_bandwidth_gbs(cores);
    rep.gemm_gflops = measure_linear_gflops(2048, 3, o.engine.dtype);  // the weights' compute
    rep.comm_gbs = measure_inproc_allreduce_bytes_per_s(2) / 1e9;
    rep.comm_latency_us = measure_inproc_allreduce_latency_s(2) * 1e6;
  }

  // The cost model needs the model's shape numbers.
  Result<model::ModelConfig> cfg = model::load_model_config(o.engine.model_dir);
  if (!cfg.ok()) return std::move(cfg).error();
  model::ModelConfig config = cfg.value();
  if (o.engine.num_layers_override > 0)
    config.num_hidden_layers = std::min(config.num_hidden_layers, o.engine.num_layers_override);
  sim::ElementSizes sizes;
  sizes.weight_bytes = static_cast<double>(dtype_size(o.engine.dtype));
  sizes.kv_bytes = static_cast<double>(dtype_size(o.engine.kv_cache_dtype));
  sizes.activation_bytes = 4;  // F32 activations on CPU
  sim::HardwareSpec hw;
  // Limits per device: the cores are shared by the ranks of a config, so a
  // rank gets its share of bandwidth and FLOPs (the model is per rank).
  hw.memory_bw_bytes_per_s = rep.membw_gbs * 1e9;
  hw.flops_per_s = rep.gemm_gflops * 1e9;
  hw.comm_bw_bytes_per_s = rep.comm_gbs * 1e9;
  hw.comm_latency_s = rep.comm_latency_us * 1e-6;
  for (const engine::ParallelConfig& pc : o.configs) {
    // Each of the world_size ranks gets 1 / world_size of the machine.
    sim::HardwareSpec per_rank = hw;
    const double share = 1.0 / pc.world_size();
    per_rank.memory_bw_bytes_per_s *= share;
    per_rank.flops_per_s *= share;
    std::optional<sim::CostModel> model;
    if (o.measure_hardware) {
      Result<sim::CostModel> m =
          sim::CostModel::create(sim::ModelShape::from_config(config), sizes, per_rank);
      if (!m.ok()) return std::move(m).error();
      model = std::move(m).value();
    }
    std::vector<std::string> policies = {"fixed"};
    if (pc.pp > 1) policies = o.token_budgets;
    for (const std::string& p : policies) {
      Result<ParallelConfigResult> r = run_one(o, pc, p, model ? &*model : nullptr, cores);
      if (!r.ok()) return std::move(r).error();
      rep.results.push_back(std::move(r).value());
    }
  }
  return rep;
}

std::string ParallelBenchReport::to_json() const {
  nlohmann::json configs = nlohmann::json::array();
  for (const ParallelConfigResult& r : results)
    configs.push_back({{"parallel", r.parallel},
                       {"token_budget", r.token_budget},
                       {"num_devices", r.num_devices},
                       {"threads_per_rank", r.threads_per_rank},
                       {"elapsed_s", r.elapsed_s},
                       {"prefill_elapsed_s", r.prefill_elapsed_s},
                       {"total_tok_s", r.total_tok_s},
                       {"prefill_tok_s", r.prefill_tok_s},
                       {"decode_tok_s", r.decode_tok_s},
                       {"decode_batch", r.decode_batch},
                       {"decode_step_ms", r.decode_step_ms},
                       {"decode_own_ms", r.decode_own_ms},
                       {"decode_round_ms", r.decode_round_ms},
                       {"bubble_fraction", r.bubble_fraction},
                       {"comm_bytes_per_step", r.comm_bytes_per_step},
                       {"predicted_decode_step_ms", r.predicted_decode_step_ms},
                       {"predicted_decode_round_ms", r.predicted_decode_round_ms},
                       {"predicted_prefill_tok_s", r.predicted_prefill_tok_s},
                       {"predicted_comm_bytes_per_step", r.predicted_comm_bytes_per_step},
                       {"predicted_bubble_fraction", r.predicted_bubble_fraction}});
  nlohmann::json j{{"model", model},         {"num_prompts", num_prompts}, {"input_len", input_len},
                   {"output_len", output_len}, {"max_batch", max_batch},     {"cores", cores},
                   {"membw_gbs", membw_gbs},   {"gemm_gflops", gemm_gflops}, {"comm_gbs", comm_gbs},
                   {"comm_latency_us", comm_latency_us}, {"configs", configs}};
  return j.dump();
}

std::string ParallelBenchReport::to_table() const {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "# %s, %d prompts x (%d in, %d out), max batch %d, %d cores: triad %.1f GB/s, GEMM %.0f GFLOP/s, "
                "in-process all-reduce %.1f GB/s + %.1f us\n",
                model.c_str(), num_prompts, input_len, output_len, max_batch, cores, membw_gbs, gemm_gflops,
                comm_gbs, comm_latency_us);
  out += line;
  std::snprintf(line, sizeof line, "%-22s %-8s %8s %9s %9s %6s %9s %9s %7s %7s %11s %11s\n", "parallel", "budget",
                "total/s", "prefill/s", "(pred)", "batch", "step ms", "(pred)", "bubble", "(pred)", "comm B/step",
                "(pred)");
  out += line;
  for (const ParallelConfigResult& r : results) {
    std::snprintf(line, sizeof line, "%-22s %-8s %8.0f %9.0f %9.0f %6d %9.2f %9.2f %7.3f %7.3f %11.0f %11.0f\n",
                  r.parallel.c_str(), r.token_budget.c_str(), r.total_tok_s, r.prefill_tok_s,
                  r.predicted_prefill_tok_s, r.decode_batch, r.decode_step_ms, r.predicted_decode_step_ms,
                  r.bubble_fraction, r.predicted_bubble_fraction, r.comm_bytes_per_step,
                  r.predicted_comm_bytes_per_step);
    out += line;
  }
  return out;
}

}  // namespace shardline::sim::calibration
