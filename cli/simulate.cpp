// `shardline simulate`: Shardline's engine over a cost-model executor on a
// described cluster (sim/simulator.hpp, docs/simulator.md); `--calibrate`
// fits this machine's CPU device file (sim/calibration/calibrate.hpp).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/calibration/calibrate.hpp"
#include "model/tokenizer_loader.hpp"
#include "bench/seesaw.hpp"
#include "sim/calibration/validate.hpp"
#include "cli/commands.hpp"
#include "cli/parallel_auto.hpp"
#include "api/file_store.hpp"
#include "engine/group/parallel_config.hpp"
#include "model/config.hpp"
#include "sim/planner.hpp"
#include "sim/simulator.hpp"
#include "sim/workload.hpp"
#include "text/tokenizer.hpp"

namespace shardline::cli {
namespace {

struct SimulateArgs {
  std::string model_dir;
  std::string cluster = "cpu";
  std::string calibration;  ///< "" = ~/.shardline/cpu-calibration.json
  bool calibrate = false;
  bool validate = false;
  std::vector<std::string> validate_cases;  ///< --validate-case (repeatable; empty: all)
  double agreement = 0.10;                  ///< --agreement of --validate
  int validate_rounds = 3;                  ///< --validate-rounds (the fewest)
  int validate_max_rounds = 5;              ///< --validate-max-rounds
  int calibration_repeats = 3;              ///< --calibration-repeats of --calibrate and --validate
  std::vector<std::string> parallel;
  std::vector<std::string> seesaw;  ///< --seesaw CP:CD (repeatable)
  std::string seesaw_policy = "transition-minimizing";
  double host_buffer_gib = 80;      ///< Seesaw's host KV buffer per device
  std::vector<double> fail_at_s;    ///< --fail-at-s (repeatable)
  int fail_at_token = 0;
  double failure_mtbf_s = 0;        ///< --failure-mtbf-s: failures at a rate
  double failure_detect_s = 3.0;
  std::string kv_replication = "both";  ///< on, off or both (with failures)
  std::string weight_sharing = "none";  ///< none, sidp or both
  std::string sidp_modes = "auto";      ///< comma list of auto, was, cas
  long long sidp_switch_batch = 0;
  double sidp_min_dwell_s = 3.0;
  std::string token_budget = "both";
  long long shift_threshold = 0;  ///< > 0: also a Shift variant of each sp*tp > 1, pp = 1 config
  double shift_hysteresis = 0.25;
  int num_prompts = 64, input_len = 128, output_len = 128;
  std::string workload_file;           ///< --workload JSONL ("" = generated)
  std::string input_dist, output_dist;  ///< "" = --input-len / --output-len
  std::uint64_t seed = 1;
  int num_devices = 0;  ///< plan: devices to use (0: the cluster's)
  int top = 10;         ///< plan: rows printed
  int threads = 0;
  bool json = false;
  std::string dispatch = "orchestrator";
  sim::SimOptions options;
};

nlohmann::ordered_json to_json(const sim::SimResult& r) {
  auto pct = [](const sim::Percentiles& p) {
    return nlohmann::ordered_json{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}};
  };
  return {{"strategy", r.strategy},
          {"parallel", r.parallel},
          {"token_budget", r.token_budget},
          {"num_devices", r.num_devices},
          {"num_requests", r.num_requests},
          {"prompt_tokens", r.prompt_tokens},
          {"generated_tokens", r.generated_tokens},
          {"elapsed_s", r.elapsed_s},
          {"prefill_elapsed_s", r.prefill_elapsed_s},
          {"total_tok_s", r.total_tok_s},
          {"prefill_tok_s", r.prefill_tok_s},
          {"decode_tok_s", r.decode_tok_s},
          {"decode_step_ms", r.decode_step_ms},
          {"decode_batch", r.decode_batch},
          {"ttft_ms", pct(r.ttft_ms)},
          {"tpot_ms", pct(r.tpot_ms)},
          {"num_kv_blocks", r.num_kv_blocks},
          {"kv_peak_fraction", r.kv_peak_fraction},
          {"bubble_fraction", r.bubble_fraction},
          {"prefill_time_s", r.prefill_time_s},
          {"decode_time_s", r.decode_time_s},
          {"num_micro_batches", r.num_micro_batches},
          {"num_preemptions", r.num_preemptions},
          {"shift_switches", r.shift_switches},
          {"shift_step_fraction", r.shift_step_fraction},
          {"seesaw_transitions", r.seesaw_transitions},
          {"seesaw_transition_s", r.seesaw_transition_s},
          {"seesaw_reload_s", r.seesaw_reload_s},
          {"seesaw_offload_bytes", r.seesaw_offload_bytes},
          {"seesaw_onboard_bytes", r.seesaw_onboard_bytes},
          {"seesaw_onboard_wait_s", r.seesaw_onboard_wait_s},
          {"seesaw_host_peak_bytes", r.seesaw_host_peak_bytes},
          {"kv_capacity_tokens", r.kv_capacity_tokens},
          {"sidp_switches", r.sidp_switches},
          {"sidp_cas_step_fraction", r.sidp_cas_step_fraction},
          {"sidp_switch_batch", r.sidp_switch_batch},
          {"num_failures", r.num_failures},
          {"failure_downtime_s", r.failure_downtime_s},
          {"failure_recomputed_tokens", r.failure_recomputed_tokens},
          {"replicated_bytes", r.replicated_bytes},
          {"restored_bytes", r.restored_bytes},
          {"num_failure_hit_requests", r.num_failure_hit_requests},
          {"first_failure_s", r.first_failure_s},
          {"failure_latency_ratio", r.failure_latency_ratio},
          {"failure_free_elapsed_s", r.failure_free_elapsed_s},
          {"sim_wall_s", r.sim_wall_s}};
}

/// The workload of the flags: a JSONL file's lengths, or generated.
Result<std::vector<sim::SimRequest>> workload_of(const SimulateArgs& a) {
  if (!a.workload_file.empty()) {
    auto tokenizer = model::load_tokenizer(a.model_dir);
    auto w = sim::workload_from_jsonl(a.workload_file, tokenizer ? tokenizer->get() : nullptr, a.output_len);
    if (!w) return w.error();
    if (w->skipped_lines > 0)
      std::cerr << "note: " << w->skipped_lines << " line(s) of " << a.workload_file << " do not parse (skipped)\n";
    if (w->requests.empty()) return make_error(ErrorCode::invalid_argument, a.workload_file + ": no request lines");
    return w->requests;
  }
  auto in = sim::parse_length_dist(a.input_dist.empty() ? std::to_string(a.input_len) : a.input_dist);
  if (!in) return in.error();
  auto out = sim::parse_length_dist(a.output_dist.empty() ? std::to_string(a.output_len) : a.output_dist);
  if (!out) return out.error();
  return sim::generate_workload(a.num_prompts, *in, *out, a.seed);
}

int run_calibrate(const SimulateArgs& a) {
  if (a.model_dir.empty()) return fail(make_error(ErrorCode::invalid_argument, "--calibrate needs --shape or --model"));
  sim::calibration::CalibrateOptions o;
  o.shape_dir = a.model_dir;
  o.num_threads = a.threads;
  o.repeats = a.calibration_repeats;
  std::cerr << "calibrating this machine on " << a.model_dir << " (decode runs at 5 batches, each " << o.repeats
            << " times; a few minutes)\n";
  auto d = sim::calibration::calibrate_cpu_device(o);
  if (!d) return fail(d.error());
  const std::string path = a.calibration.empty() ? default_cpu_calibration() : a.calibration;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (Status st = api::write_file_atomically(path, sim::device_spec_json(*d)); !st.ok()) return fail(st.error());
  std::cout << sim::device_spec_json(*d);
  std::cerr << "wrote " << path << "\n";
  return 0;
}

/// The validation (sim/calibration/validate.hpp): runs calibration rounds on the shape
/// and each case for real in rounds (the fastest kept), simulates the cases
/// on the calibrated device, and prints
/// the simulator's error beside each measurement.
int run_validate(const SimulateArgs& a) {
  if (!a.parallel.empty())
    return fail(make_error(ErrorCode::invalid_argument,
                           "--validate runs named cases (--validate-case), not --parallel configs"),
                2);
  sim::calibration::ValidateOptions o;
  o.shape_dir = a.model_dir;
  o.num_threads = a.threads;
  o.cases = a.validate_cases;
  o.num_prompts = a.num_prompts;
  o.input_len = a.input_len;
  o.output_len = a.output_len;
  o.max_batch = a.options.max_batch;
  o.agreement = a.agreement;
  o.min_rounds = a.validate_rounds;
  o.max_rounds = std::max(a.validate_rounds, a.validate_max_rounds);
  o.calibration_repeats = a.calibration_repeats;
  if (a.shift_threshold > 0) o.shift_threshold = a.shift_threshold;
  auto rep = sim::calibration::run_validation(o, [&](const sim::calibration::ValidationRow& r) {
    std::fprintf(stderr, "validate: %-14s round %zu: %8.1f tok/s, decode step %7.2f ms (fastest %.1f, %.2f)\n",
                 r.name.c_str(), r.round_total_tok_s.size(), r.round_total_tok_s.back(), r.round_decode_step_ms.back(),
                 r.measured_total_tok_s, r.measured_decode_step_ms);
  });
  if (!rep) return fail(rep.error());
  if (!a.json) {
    std::printf("%-14s %10s %10s %7s %12s %10s %7s %7s %7s\n", "case", "tok/s real", "simulated", "error",
                "step_ms real", "simulated", "error", "steady", "spread");
    for (const sim::calibration::ValidationRow& r : rep->rows)
      std::printf("%-14s %10.1f %10.1f %+6.1f%% %12.2f %10.2f %+6.1f%% %7s %6.0f%%\n", r.name.c_str(),
                  r.measured_total_tok_s, r.simulated_total_tok_s, 100 * r.total_tok_s_error,
                  r.measured_decode_step_ms, r.simulated_decode_step_ms, 100 * r.decode_step_ms_error,
                  r.steady ? "yes" : "no", 100 * r.spread);
    std::printf("real: the fastest of %d+ rounds; calibration: each measurement %d times; SiDP link %.2f GB/s; "
                "%.0f s in all\n",
                o.min_rounds, rep->calibration_repeats, rep->sidp_link_gbps, rep->wall_s);
    return 0;
  }
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const sim::calibration::ValidationRow& r : rep->rows)
    rows.push_back({{"case", r.name},
                    {"strategy", r.strategy},
                    {"rounds", r.round_total_tok_s.size()},
                    {"steady", r.steady},
                    {"spread", r.spread},
                    {"round_total_tok_s", r.round_total_tok_s},
                    {"round_decode_step_ms", r.round_decode_step_ms},
                    {"measured_total_tok_s", r.measured_total_tok_s},
                    {"simulated_total_tok_s", r.simulated_total_tok_s},
                    {"total_tok_s_error", r.total_tok_s_error},
                    {"measured_decode_step_ms", r.measured_decode_step_ms},
                    {"simulated_decode_step_ms", r.simulated_decode_step_ms},
                    {"decode_step_ms_error", r.decode_step_ms_error}});
  nlohmann::ordered_json out;
  out["model"] = a.model_dir;
  out["num_prompts"] = o.num_prompts;
  out["input_len"] = o.input_len;
  out["output_len"] = o.output_len;
  out["max_batch"] = o.max_batch;
  out["agreement"] = o.agreement;
  out["rounds"] = rep->rounds;
  out["calibration_repeats"] = rep->calibration_repeats;
  out["sidp_link_gbps"] = rep->sidp_link_gbps;
  out["wall_s"] = rep->wall_s;
  out["device"] = nlohmann::ordered_json::parse(sim::device_spec_json(rep->device));
  out["validation"] = std::move(rows);
  std::cout << out.dump() << std::endl;
  return 0;
}

int run_simulate(const SimulateArgs& a) {
  if (a.calibrate) return run_calibrate(a);
  if (a.model_dir.empty()) return fail(make_error(ErrorCode::invalid_argument, "give --shape DIR or --model DIR"), 2);
  auto config = model::load_model_config(a.model_dir);
  if (!config) return fail(config.error(), 2);
  if (a.validate) {
    if (a.cluster != "cpu") return fail(make_error(ErrorCode::invalid_argument, "--validate runs on this machine: --cluster cpu"), 2);
    return run_validate(a);
  }
  const std::string calibration = a.calibration.empty() ? default_cpu_calibration() : a.calibration;
  Result<sim::ClusterSpec> cluster = load_cluster_or_measure(a.cluster, calibration, a.threads);
  const bool cpu = a.cluster == "cpu" || a.cluster.rfind("cpux", 0) == 0;
  if (!cluster) return fail(cluster.error(), 2);

  std::vector<std::string> configs =
      a.parallel.empty() && a.seesaw.empty() ? std::vector<std::string>{"single"} : a.parallel;
  std::vector<sim::Strategy> strategies;
  int most_devices = 1;
  for (const std::string& text : configs) {
    auto pc = engine::parse_parallel_config(text);
    if (!pc) return fail(pc.error(), 2);
    most_devices = std::max(most_devices, pc->world_size());
    std::vector<std::string> budgets{"fixed"};
    if (pc->pp > 1) {
      if (a.token_budget == "both") budgets = {"fixed", "throttle"};
      else budgets = {a.token_budget};
    } else if (a.token_budget != "both") {
      budgets = {a.token_budget};
    }
    for (const std::string& b : budgets) {
      sim::Strategy s;
      s.parallel = *pc;
      s.token_budget = b;
      const bool sidp_ok = pc->tp == 1 && pc->pp == 1 && pc->sp == 1 && pc->dp >= 2;
      if (a.weight_sharing != "sidp" || !sidp_ok) strategies.push_back(s);
      if (a.weight_sharing != "none" && sidp_ok) {
        for (std::size_t pos = 0; pos <= a.sidp_modes.size();) {
          const std::size_t comma = std::min(a.sidp_modes.find(',', pos), a.sidp_modes.size());
          auto mode = engine::parse_sidp_mode_setting(a.sidp_modes.substr(pos, comma - pos));
          if (!mode) return fail(mode.error(), 2);
          sim::Strategy v = s;
          v.sidp = sim::SidpStrategy{*mode, a.sidp_switch_batch, 0.25, a.sidp_min_dwell_s, 2};
          strategies.push_back(v);
          pos = comma + 1;
        }
      }
      if (a.shift_threshold > 0 && pc->tp * pc->sp > 1 && pc->sp > 1 && pc->pp == 1) {
        s.shift = engine::ShiftPolicyOptions{a.shift_threshold, a.shift_hysteresis};
        strategies.push_back(s);
      }
    }
  }
  for (const std::string& text : a.seesaw) {
    auto pair = bench::parse_seesaw_pair(text);
    if (!pair) return fail(pair.error(), 2);
    auto schedule = engine::parse_seesaw_schedule(a.seesaw_policy);
    if (!schedule) return fail(schedule.error(), 2);
    most_devices = std::max(most_devices, pair->first.world_size());
    sim::Strategy s;
    s.parallel = pair->first;
    s.token_budget = a.token_budget == "throttle" ? "throttle" : "fixed";
    s.seesaw = sim::SeesawStrategy{pair->second, {}, a.host_buffer_gib * double(1ull << 30)};
    s.seesaw->policy.schedule = *schedule;
    strategies.push_back(s);
  }
  // Failures: each static strategy with and / or without KV replication.
  if (!a.fail_at_s.empty() || a.fail_at_token > 0 || a.failure_mtbf_s > 0) {
    std::vector<sim::Strategy> with_failures;
    for (const sim::Strategy& base : strategies) {
      if (base.seesaw) continue;
      for (const bool replicate : {true, false}) {
        if ((replicate && a.kv_replication == "off") || (!replicate && a.kv_replication == "on")) continue;
        sim::Strategy s = base;
        s.failures = sim::FailureInjection{replicate,        a.fail_at_s,      a.fail_at_token, 0,
                                           a.failure_detect_s, a.failure_mtbf_s, a.seed};
        with_failures.push_back(s);
      }
    }
    strategies = std::move(with_failures);
  }
  // Without a size, a cpu cluster has as many devices as the largest config.
  if (cpu && a.cluster.find('x') == std::string::npos) cluster->num_devices = most_devices;

  auto workload_or = workload_of(a);
  if (!workload_or) return fail(workload_or.error(), 2);
  const std::vector<sim::SimRequest>& workload = *workload_or;
  sim::SimOptions options = a.options;
  if (a.dispatch == "round-robin") options.dispatch = sim::SimOptions::Dispatch::round_robin;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  if (!a.json) {
    std::printf("simulated: %s on %s (%d x %s), %zu requests, max batch %d\n", a.model_dir.c_str(),
                cluster->name.c_str(), cluster->num_devices, cluster->device.name.c_str(), workload.size(),
                a.options.max_batch);
    std::printf("%-36s %10s %10s %10s %9s %9s %9s %7s %7s %8s\n", "strategy", "total/s", "prefill/s", "decode/s",
                "step_ms", "ttft_p50", "tpot_p50", "kv_peak", "bubble", "sim_s");
  }
  int failures = 0;
  for (const sim::Strategy& s : strategies) {
    auto r = sim::simulate(*config, *cluster, s, workload, options);
    if (!r) {
      ++failures;
      if (a.json) results.push_back({{"strategy", s.label()}, {"error", r.error().to_string()}});
      else std::printf("%-36s error: %s\n", s.label().c_str(), r.error().to_string().c_str());
      continue;
    }
    if (a.json) {
      results.push_back(to_json(*r));
    } else {
      std::printf("%-36s %10.1f %10.1f %10.1f %9.3f %9.2f %9.3f %7.2f %7.3f %8.2f\n", r->strategy.c_str(),
                  r->total_tok_s, r->prefill_tok_s, r->decode_tok_s, r->decode_step_ms, r->ttft_ms.p50,
                  r->tpot_ms.p50, r->kv_peak_fraction, r->bubble_fraction, r->sim_wall_s);
      if (s.sidp)
        std::printf("%-36s   KV capacity %lld tokens; b* = %lld running sequences; %lld WaS/CaS switches, %.1f%% of "
                    "rank steps in CaS\n",
                    "", r->kv_capacity_tokens, r->sidp_switch_batch, r->sidp_switches,
                    100 * r->sidp_cas_step_fraction);
      if (s.failures)
        std::printf("%-36s   %d failure(s), %.2f s down; %d requests hit, finishing %.2fx later on average than "
                    "without failures; %lld positions recomputed; KV %.2f GB replicated, %.2f GB restored\n",
                    "", r->num_failures, r->failure_downtime_s, r->num_failure_hit_requests,
                    r->failure_latency_ratio, r->failure_recomputed_tokens, r->replicated_bytes / 1e9,
                    r->restored_bytes / 1e9);
      if (s.seesaw)
        std::printf("%-36s   %llu transitions, %.2f s in them (%.2f s reloading weights); KV over the host links: "
                    "%.2f GB out, %.2f GB in; host buffer peak %.2f GiB\n",
                    "", static_cast<unsigned long long>(r->seesaw_transitions), r->seesaw_transition_s,
                    r->seesaw_reload_s, r->seesaw_offload_bytes / 1e9, r->seesaw_onboard_bytes / 1e9,
                    r->seesaw_host_peak_bytes / double(1ull << 30));
    }
  }
  if (a.json) {
    nlohmann::ordered_json out;
    out["model"] = a.model_dir;
    out["cluster"] = cluster->name;
    out["device"] = cluster->device.name;
    out["num_devices"] = cluster->num_devices;
    out["num_requests"] = workload.size();
    out["max_batch"] = a.options.max_batch;
    out["results"] = std::move(results);
    std::cout << out.dump() << std::endl;
  }
  return failures == static_cast<int>(strategies.size()) ? 1 : 0;
}

/// The cluster of the flags for `plan` (a cpu cluster without a size gets
/// --devices or 1).
Result<sim::ClusterSpec> plan_cluster(const SimulateArgs& a) {
  const std::string calibration = a.calibration.empty() ? default_cpu_calibration() : a.calibration;
  std::string name = a.cluster;
  if ((name == "cpu") && a.num_devices > 0) name = "cpux" + std::to_string(a.num_devices);
  return load_cluster_or_measure(name, calibration, a.threads);
}

int run_plan(const SimulateArgs& a) {
  if (a.model_dir.empty()) return fail(make_error(ErrorCode::invalid_argument, "give --shape DIR or --model DIR"), 2);
  auto config = model::load_model_config(a.model_dir);
  if (!config) return fail(config.error(), 2);
  auto cluster = plan_cluster(a);
  if (!cluster) return fail(cluster.error(), 2);
  auto workload = workload_of(a);
  if (!workload) return fail(workload.error(), 2);
  sim::PlanOptions po;
  po.num_devices = a.num_devices;
  po.shift_threshold = a.shift_threshold > 0 ? a.shift_threshold : 256;
  po.shift_hysteresis = a.shift_hysteresis;
  po.seesaw_host_buffer_bytes_per_device = a.host_buffer_gib * double(1ull << 30);
  if (a.token_budget != "both") po.token_budgets = {a.token_budget};
  po.sim = a.options;
  if (a.dispatch == "round-robin") po.sim.dispatch = sim::SimOptions::Dispatch::round_robin;
  auto p = sim::plan(*config, *cluster, *workload, po);
  if (!p) return fail(p.error());
  if (a.json) {
    nlohmann::ordered_json out;
    out["model"] = a.model_dir;
    out["cluster"] = cluster->name;
    out["num_requests"] = workload->size();
    out["best"] = p->ranked.front().strategy.label();
    out["why"] = p->why;
    nlohmann::ordered_json ranked = nlohmann::ordered_json::array();
    for (const auto& e : p->ranked) ranked.push_back(to_json(e.result));
    out["ranked"] = std::move(ranked);
    nlohmann::ordered_json infeasible = nlohmann::ordered_json::array();
    for (const auto& e : p->infeasible) infeasible.push_back({{"strategy", e.strategy.label()}, {"error", e.error}});
    out["infeasible"] = std::move(infeasible);
    std::cout << out.dump() << std::endl;
    return 0;
  }
  std::printf("plan: %s on %s (%d x %s), %zu requests, max batch %d: %zu strategies fit, %zu do not\n",
              a.model_dir.c_str(), cluster->name.c_str(), cluster->num_devices, cluster->device.name.c_str(),
              workload->size(), a.options.max_batch, p->ranked.size(), p->infeasible.size());
  std::printf("%4s %-36s %10s %10s %10s %9s %9s %7s %7s\n", "rank", "strategy", "total/s", "prefill/s", "decode/s",
              "step_ms", "tpot_p50", "kv_peak", "bubble");
  for (std::size_t i = 0; i < p->ranked.size() && static_cast<int>(i) < a.top; ++i) {
    const sim::SimResult& r = p->ranked[i].result;
    std::printf("%4zu %-36s %10.1f %10.1f %10.1f %9.3f %9.3f %7.2f %7.3f\n", i + 1, r.strategy.c_str(), r.total_tok_s,
                r.prefill_tok_s, r.decode_tok_s, r.decode_step_ms, r.tpot_ms.p50, r.kv_peak_fraction,
                r.bubble_fraction);
  }
  std::printf("best: %s\n", p->why.c_str());
  return 0;
}

/// The workload flags `simulate` and `plan` share.
void add_workload_flags(CLI::App& cmd, SimulateArgs& a) {
  cmd.add_option("--num-prompts", a.num_prompts, "Requests (generated workloads)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--input-len", a.input_len, "Prompt tokens per request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--output-len", a.output_len,
                 "Generated tokens per request (and of --workload chat lines without max_tokens)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--input-dist", a.input_dist,
                 "Prompt lengths: N, uniform:A:B, loguniform:A:B or lognormal:MEDIAN:SIGMA[:MAX] (instead of "
                 "--input-len)");
  cmd.add_option("--output-dist", a.output_dist, "Output lengths, as --input-dist (instead of --output-len)");
  cmd.add_option("--seed", a.seed, "Seed of the generated lengths")->capture_default_str();
  cmd.add_option("--workload", a.workload_file,
                 "A JSONL job file: its lines' token lengths (text prompts counted with the model folder's "
                 "tokenizer) instead of a generated workload");
  cmd.add_option("--max-batch", a.options.max_batch, "Running sequences at most per engine group")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--max-num-batched-tokens", a.options.max_num_batched_tokens, "Tokens per step at most")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd.add_option("--dispatch", a.dispatch,
                 "How requests reach DP replicas: orchestrator (dealt over queues of 2 x max batch, as a cluster) or "
                 "round-robin (as in-process DP; --validate always uses it)")
      ->check(CLI::IsMember({"orchestrator", "round-robin"}))
      ->capture_default_str();
}

}  // namespace

void add_plan_command(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Rank every parallel config and policy for a cluster and workload by simulated throughput "
              "(docs/simulator.md)");
  cmd->add_option("--model,--shape", a->model_dir, "Model or shape folder (config.json)");
  cmd->add_option("--cluster", a->cluster, "DEVICE, DEVICExN or a cluster JSON file (as simulate)")
      ->capture_default_str();
  cmd->add_option("--devices", a->num_devices, "Devices to use (default: the whole cluster)")->capture_default_str();
  cmd->add_option("--calibration", a->calibration, "The CPU device file (default ~/.shardline/cpu-calibration.json)");
  cmd->add_option("--token-budget", a->token_budget, "Policies tried for pp > 1 configs: fixed, throttle or both")
      ->check(CLI::IsMember({"fixed", "throttle", "both"}))
      ->capture_default_str();
  cmd->add_option("--shift-threshold", a->shift_threshold, "Shift candidates' T (default 256)")->capture_default_str();
  cmd->add_option("--host-buffer-gib", a->host_buffer_gib,
                  "Seesaw candidates' host KV buffer per device, GiB (paper: 80)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--top", a->top, "Rows printed")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Threads of the uncalibrated CPU measurement (0: all)")->capture_default_str();
  add_workload_flags(*cmd, *a);
  cmd->add_flag("--json", a->json, "One JSON line: best, why, ranked results, infeasible strategies");
  cmd->callback([&run, a] { run = [a] { return run_plan(*a); }; });
}

void add_simulate_command(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Simulate the engine on a described cluster (cost model calibrated on this machine; "
                  "docs/simulator.md)");
  cmd->add_option("--model,--shape", a->model_dir, "Model or shape folder (config.json; no weights are read)");
  cmd->add_option("--cluster", a->cluster,
                  "DEVICE or DEVICExN (a10, l20, a100-80gb, h100, h200, cpu; e.g. h200x8, a10x8) or a cluster "
                  "JSON file")
      ->capture_default_str();
  cmd->add_option("--calibration", a->calibration,
                  "The CPU device file (default ~/.shardline/cpu-calibration.json)");
  cmd->add_flag("--calibrate", a->calibrate,
                "Measure this machine and fit the cost model's efficiency terms to real decode steps of --shape; "
                "writes --calibration");
  cmd->add_flag("--validate", a->validate,
                "Calibrate on --shape and run each validation case for real on this machine's CPU devices, in "
                "rounds (a calibration round, then every case), the fastest round kept (slow episodes only ever "
                "slow the machine); simulate the cases on the calibrated device and print the simulator's error "
                "beside the measurement "
                "(default workload: 32 x (64 in, 32 out), max batch 32)");
  cmd->add_option("--validate-case", a->validate_cases,
                  "A case of --validate (repeatable; default all): single, tp=2, pp=2-fixed, pp=2-throttle, sp=2, "
                  "dp=2, shift, seesaw, sidp-was, sidp-cas");
  cmd->add_option("--validate-rounds", a->validate_rounds, "--validate measures every case this many times")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--validate-max-rounds", a->validate_max_rounds,
                  "--validate measures a case not yet steady (its two fastest rounds differ by more than "
                  "--agreement) again, up to this many times")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--agreement", a->agreement,
                  "--validate: a case is steady when its two fastest rounds differ by at most this fraction")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--calibration-repeats", a->calibration_repeats,
                  "--calibrate and --validate make each calibration measurement this many times, interleaved, "
                  "and keep the fastest")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--parallel", a->parallel, "A config to simulate (repeatable): single, tp=2, pp=2,dp=4, ...");
  cmd->add_option("--token-budget", a->token_budget, "fixed, throttle or both (both: pp > 1 configs run each)")
      ->check(CLI::IsMember({"fixed", "throttle", "both"}))
      ->capture_default_str();
  cmd->add_option("--shift-threshold", a->shift_threshold,
                  "T > 0: also simulate Shift Parallelism for each sp > 1 config (steps of <= T tokens in tp=sp*tp)")
      ->capture_default_str();
  cmd->add_option("--shift-hysteresis", a->shift_hysteresis, "Shift's h")->capture_default_str();
  cmd->add_option("--seesaw", a->seesaw,
                  "Seesaw CP:CD (repeatable): prefill phases in CP, decode phases in CD, e.g. pp=8:tp=8 "
                  "(seed 000; the real engine's phases and policy)");
  cmd->add_option("--seesaw-policy", a->seesaw_policy,
                  "transition-minimizing, prefill-prioritizing or decode-prioritizing")
      ->capture_default_str();
  cmd->add_option("--host-buffer-gib", a->host_buffer_gib, "Seesaw's host KV buffer per device, GiB (paper: 80)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--weight-sharing", a->weight_sharing,
                  "sidp: run each --parallel dp=N config (single-device ranks) as a SiDP group; both: with and "
                  "without (seed 002)")
      ->check(CLI::IsMember({"none", "sidp", "both"}))
      ->capture_default_str();
  cmd->add_option("--sidp-mode", a->sidp_modes, "SiDP modes to simulate, a comma list of auto, was and cas")
      ->capture_default_str();
  cmd->add_option("--sidp-switch-batch", a->sidp_switch_batch,
                  "SiDP's b* on the group's running sequences (0: dp x the cost model's, as the orchestrator)")
      ->capture_default_str();
  cmd->add_option("--sidp-min-dwell", a->sidp_min_dwell_s, "SiDP's dwell before a switch, seconds")
      ->capture_default_str();
  cmd->add_option("--fail-at-s", a->fail_at_s,
                  "Inject a failure of DP group 0 at this virtual time, seconds (repeatable; DéjàVu, seed 003)");
  cmd->add_option("--fail-at-token", a->fail_at_token,
                  "Inject one failure when a request of DP group 0 first has this many generated tokens")
      ->capture_default_str();
  cmd->add_option("--failure-mtbf-s", a->failure_mtbf_s,
                  "Inject failures of DP group 0 at a rate: exponential gaps of this mean, virtual seconds "
                  "(a Poisson process drawn from --seed)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--failure-detect-s", a->failure_detect_s,
                  "Seconds until a failure is noticed (the orchestrator's heartbeat timeout)")
      ->capture_default_str();
  cmd->add_option("--kv-replication", a->kv_replication,
                  "With failures: on (DéjàVu: resume from the last token), off (restart from scratch) or both")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  add_workload_flags(*cmd, *a);
  cmd->add_option("--threads", a->threads, "Threads for --calibrate and the uncalibrated CPU measurement (0: all)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON line with bench's field names");
  cmd->callback([&run, a, cmd] {
    if (a->validate) {  // the validation's own workload unless given
      if (cmd->count("--num-prompts") == 0) a->num_prompts = 32;
      if (cmd->count("--input-len") == 0) a->input_len = 64;
      if (cmd->count("--output-len") == 0) a->output_len = 32;
      if (cmd->count("--max-batch") == 0) a->options.max_batch = 32;
    }
    run = [a] { return run_simulate(*a); };
  });
}

}  // namespace shardline::cli
