// `shardline simulate` as a user runs it: JSON with bench's field names for
// each strategy, the orderings the cost model implies on a GPU cluster
// (data parallelism wins a prefill-heavy batch job; Shift's decode steps
// run at full TP's speed; a config that does not fit is a per-strategy
// error), --calibrate writing a device file whose fitted numbers say how
// they were fitted, and --validate printing the real and simulated numbers
// side by side. Not timed: no bound here depends on this machine's speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>

#include <nlohmann/json.hpp>

#include "sim/calibration/validate.hpp"
#include "engine/group/parallel_config.hpp"
#include "sim/hardware_spec.hpp"
#include "tests/actors/node_harness.hpp"
#include <filesystem>
#include <fstream>
#include <thread>
#include "tests/support/demo_prompts.hpp"
#include "tests/support/process.hpp"

namespace shardline {
namespace cli_simulate_e2e_test {

using json = nlohmann::json;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

using SimulateE2e = testing_support::TempDirTest;

const std::string kShapes = std::string(SHARDLINE_SHARED_DIR) + "/models/shapes/";

json results_by_strategy(const std::string& out) {
  const json j = json::parse(out.substr(out.find('{')), nullptr, false);
  json by = json::object();
  if (j.is_discarded()) return by;
  for (const auto& r : j["results"]) by[r["strategy"].get<std::string>()] = r;
  return by;
}

TEST_F(SimulateE2e, StrategiesOnAGpuClusterInJson) {
  const auto r = run_command(kShardline + " simulate --cluster h200x8 --shape " + kShapes + "llama-3.1-8b" +
                             " --parallel tp=8 --parallel dp=8 --parallel tp=2,sp=4 --parallel sp=8 --shift-threshold 256"
                             " --num-prompts 512 --input-len 2048 --output-len 64 --max-batch 128 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json by = results_by_strategy(r.out);
  ASSERT_TRUE(by.contains("tp=8,pp=1,sp=1,dp=1 fixed")) << r.out;
  const json& tp = by["tp=8,pp=1,sp=1,dp=1 fixed"];
  const json& dp = by["tp=1,pp=1,sp=1,dp=8 fixed"];
  const json& sp = by["tp=2,pp=1,sp=4,dp=1 fixed"];
  const json& shift = by["tp=2,pp=1,sp=4,dp=1 fixed shift(T=256)"];
  for (const char* k : {"total_tok_s", "prefill_tok_s", "decode_tok_s", "decode_step_ms", "ttft_ms", "tpot_ms",
                        "kv_peak_fraction", "bubble_fraction", "sim_wall_s"})
    EXPECT_TRUE(tp.contains(k)) << k;
  EXPECT_EQ(tp["num_devices"], 8);
  EXPECT_EQ(tp["generated_tokens"], 512 * 64);
  // A prefill-heavy batch job: 8 replicas without collectives beat one TP=8 group.
  EXPECT_GT(dp["total_tok_s"].get<double>(), tp["total_tok_s"].get<double>());
  // Shift runs its decode steps (<= T tokens) in tp=8: the same step as TP.
  EXPECT_NEAR(shift["decode_step_ms"].get<double>(), tp["decode_step_ms"].get<double>(),
              1e-6 * tp["decode_step_ms"].get<double>());
  EXPECT_LT(shift["decode_step_ms"].get<double>(), sp["decode_step_ms"].get<double>());
  EXPECT_GT(shift["shift_switches"].get<int>(), 0);
  EXPECT_GE(shift["total_tok_s"].get<double>(), sp["total_tok_s"].get<double>());
  // sp=8 replicates the weights over 8 ranks: fits an 8B model (16 GB) fine.
  EXPECT_FALSE(by["tp=1,pp=1,sp=8,dp=1 fixed"].contains("error")) << by.dump();

  // A 70B model does not fit one H200 per replica: a per-strategy error.
  const auto big = run_command(kShardline + " simulate --cluster h200x8 --shape " + kShapes + "llama-3.1-70b" +
                               " --parallel dp=8 --parallel tp=8 --num-prompts 8 --input-len 64 --output-len 8 --json");
  ASSERT_EQ(big.exit_code, 0) << big.out;
  const json big_by = results_by_strategy(big.out);
  EXPECT_NE(big_by["tp=1,pp=1,sp=1,dp=8 fixed"].value("error", "").find("do not fit"), std::string::npos)
      << big.out;
  EXPECT_GT(big_by["tp=8,pp=1,sp=1,dp=1 fixed"].value("total_tok_s", 0.0), 0.0) << big.out;
}

// The paper strategies from the command line: Seesaw pairs beside static
// configs, and a failure with and without replicated KV (DéjàVu).
TEST_F(SimulateE2e, SeesawPairsAndInjectedFailuresFromTheFlags) {
  const std::string src = SHARDLINE_SOURCE_DIR;
  auto r = run_command(kShardline + " simulate --cluster a10x4 --shape " + src + "/bench/shapes/codellama-34b" +
                       " --parallel tp=4 --seesaw pp=4:tp=4 --seesaw pp=2,tp=2:tp=4 --token-budget fixed"
                       " --num-prompts 64 --input-len 2048 --output-len 64 --host-buffer-gib 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  json by = results_by_strategy(r.out);
  ASSERT_TRUE(by.contains("seesaw pp=4:tp=4 fixed")) << r.out;
  ASSERT_TRUE(by.contains("seesaw tp=2,pp=2:tp=4 fixed")) << r.out;
  EXPECT_GE(by["seesaw pp=4:tp=4 fixed"]["seesaw_transitions"].get<int>(), 2);
  EXPECT_LE(by["seesaw pp=4:tp=4 fixed"]["seesaw_host_peak_bytes"].get<double>(), 16.0 * (1ull << 30));
  EXPECT_EQ(by["tp=4,pp=1,sp=1,dp=1 fixed"]["seesaw_transitions"].get<int>(), 0);
  // cd on other devices than cp: a usage error naming the pair.
  r = run_command(kShardline + " simulate --cluster a10x4 --shape " + src + "/bench/shapes/codellama-34b" +
                  " --seesaw pp=4:tp=2 --num-prompts 4 --json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("same devices"), std::string::npos) << r.out;

  r = run_command(kShardline + " simulate --cluster h100x2 --shape " + kShapes + "llama-3.1-8b" +
                  " --parallel pp=2 --token-budget throttle --num-prompts 16 --input-len 256 --output-len 200"
                  " --max-batch 16 --fail-at-token 100 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  by = results_by_strategy(r.out);
  const json& with = by["tp=1,pp=2,sp=1,dp=1 throttle failures+replicated-kv"];
  const json& without = by["tp=1,pp=2,sp=1,dp=1 throttle failures"];
  ASSERT_TRUE(with.is_object() && without.is_object()) << r.out;
  EXPECT_EQ(with["num_failures"], 1);
  EXPECT_EQ(with["failure_recomputed_tokens"], 0);
  EXPECT_GT(with["restored_bytes"].get<double>(), 0);
  EXPECT_GT(without["failure_recomputed_tokens"].get<long long>(), 16 * 256);
  EXPECT_GT(without["failure_latency_ratio"].get<double>(), with["failure_latency_ratio"].get<double>());
}

// job submit --parallel auto: the planner picks a config for the job's lines
// on the cluster's devices (every registered worker's group); the job runs
// on it when the cluster's workers run it, and is refused naming it when
// they run another. The CPU device file is fixed (an H100's numbers under
// HOME/.shardline), so the choice does not depend on this machine's speed.
TEST_F(SimulateE2e, JobSubmitParallelAutoPlansForTheClustersDevices) {
  auto h100 = sim::load_cluster("h100");
  ASSERT_TRUE(h100.ok());
  std::filesystem::create_directories(path("home/.shardline"));
  {
    std::ofstream f(path("home/.shardline/cpu-calibration.json"));
    f << sim::device_spec_json(h100->device);
  }
  const std::string home = "HOME=" + path("home") + " ";
  const std::string model = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K";
  testing_support::write_demo_prompts(path("in.jsonl"), 12);
  std::string chosen;
  for (const std::string cluster_parallel : {"dp=2", "tp=2"}) {
    const std::string dir = path("node-" + cluster_parallel.substr(0, 2));
    ASSERT_EQ(run_command(kShardline + " cluster init --key-file " + dir + ".key").exit_code, 0);
    testing_support::Child node({kShardline, "node", "start", "--listen", "127.0.0.1:0", "--data-dir", dir + "/data",
                                 "--model", model, "--key-file", dir + ".key", "--parallel", cluster_parallel,
                                 "--threads", "1"},
                                dir + ".log");
    const auto addr = testing_support::wait_for_node(node, false);
    ASSERT_FALSE(addr.addr.empty()) << node.log();
    const std::string client = testing_support::client_flags(addr.addr, dir + ".key");
    for (int i = 0; i < 100; ++i) {  // until every worker has registered
      const std::string list = run_command(kShardline + " actor list" + client).out;
      if (std::count(list.begin(), list.end(), '\n') > 0 &&
          (cluster_parallel == "tp=2" ? list.find("tp=2") != std::string::npos
                                      : list.find("node0/cpu:1 ") != std::string::npos))
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const auto r = run_command(home + kShardline + " job submit" + client + " --model " + model + " --input " +
                               path("in.jsonl") + " --output " + dir + "/out.jsonl --parallel auto");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m,
                                  std::regex("--parallel auto: (tp=\\d+,pp=\\d+,sp=\\d+,dp=\\d+) on the cluster's cpu:2")))
        << r.out;
    if (chosen.empty()) chosen = m[1].str();
    EXPECT_EQ(m[1].str(), chosen) << "the same lines on the same devices: the same choice";
    const auto running = engine::parse_parallel_config(cluster_parallel);
    if (chosen == running->to_string()) {
      ASSERT_EQ(r.exit_code, 0) << r.out;
      const auto status = testing_support::wait_job_done(client, 1, std::chrono::seconds(120));
      EXPECT_EQ(status["jobs"][0]["state"], "done") << status.dump();
      const std::string out = read_file(dir + "/out.jsonl");
      EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 12);
    } else {
      EXPECT_NE(r.exit_code, 0) << r.out;
      EXPECT_NE(r.out.find("start the nodes with --parallel " + chosen), std::string::npos) << r.out;
    }
  }
  // Either node ran the chosen config or refused it; a 2-device choice of
  // dp=2 or tp=2 means one of the two nodes ran the job.
  EXPECT_TRUE(chosen == "tp=1,pp=1,sp=1,dp=2" || chosen == "tp=2,pp=1,sp=1,dp=1") << chosen;
}

TEST_F(SimulateE2e, BadClustersAndConfigsAreClearErrors) {
  auto r = run_command(kShardline + " simulate --cluster tpu-v5x8 --shape " + kShapes + "llama-3.1-8b");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("no device 'tpu-v5'"), std::string::npos) << r.out;
  r = run_command(kShardline + " simulate --cluster h100x2 --shape " + kShapes + "llama-3.1-8b --parallel tp=4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("needs 4 devices"), std::string::npos) << r.out;
  r = run_command(kShardline + " simulate --cluster h100 --shape " + path("nothing"));
  EXPECT_EQ(r.exit_code, 2);
}

TEST_F(SimulateE2e, CalibrateWritesAFittedCpuDeviceAndValidatePrintsBoth) {
  const std::string shape = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K";
  const auto cal = run_command(kShardline + " simulate --calibrate --threads 1 --shape " + shape +
                               " --calibration " + path("cpu.json"));
  ASSERT_EQ(cal.exit_code, 0) << cal.out;
  auto device = sim::parse_device_spec(read_file(path("cpu.json")), "cpu.json");
  ASSERT_TRUE(device.ok()) << device.error().to_string();
  EXPECT_TRUE(device->shared_memory_bus);
  EXPECT_EQ(device->weight_dtype, DType::f32);
  for (const sim::Sourced* s : {&device->gemm_efficiency, &device->prefill_gemm_efficiency,
                                &device->memory_bw_efficiency, &device->step_overhead_ms})
    EXPECT_NE(s->source.find("fitted"), std::string::npos) << s->source;
  EXPECT_NE(device->memory_bw_bytes_per_s.source.find("triad"), std::string::npos);
  // The GEMM efficiency by rows: one point per decode batch run (4, the
  // curve's 8, 16, 32, and 64), each run 3 times (the default) and the
  // fastest kept.
  ASSERT_EQ(device->gemm_efficiency_by_rows.size(), 5u) << read_file(path("cpu.json"));
  const double rows[] = {4, 8, 16, 32, 64};
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(device->gemm_efficiency_by_rows[i].first, rows[i]);
    EXPECT_GT(device->gemm_efficiency_by_rows[i].second, 0);
    EXPECT_LE(device->gemm_efficiency_by_rows[i].second, 1);
  }
  EXPECT_NE(device->gemm_efficiency_by_rows_source.find("fitted"), std::string::npos);
  EXPECT_NE(device->gemm_efficiency_by_rows_source.find("the fastest of 3 interleaved runs"), std::string::npos)
      << device->gemm_efficiency_by_rows_source;
  EXPECT_EQ(device->split, nullptr) << "one thread: nothing to split";

  // On 2 threads the machine is also fitted split over 2 devices running at
  // once, and a 2-device run is priced on that fit.
  const auto cal2 = run_command(kShardline + " simulate --calibrate --threads 2 --calibration-repeats 1 --shape " +
                                shape + " --calibration " + path("cpu2.json"));
  ASSERT_EQ(cal2.exit_code, 0) << cal2.out;
  auto device2 = sim::parse_device_spec(read_file(path("cpu2.json")), "cpu2.json");
  ASSERT_TRUE(device2.ok()) << device2.error().to_string();
  ASSERT_NE(device2->split, nullptr) << read_file(path("cpu2.json"));
  EXPECT_EQ(device2->split_devices, 2);
  for (const sim::Sourced* s : {&device2->split->gemm_efficiency, &device2->split->memory_bw_efficiency,
                                &device2->split->step_overhead_ms})
    EXPECT_NE(s->source.find("each of 2 devices running at once"), std::string::npos) << s->source;
  EXPECT_NE(device2->split->peak_flops.source.find("1 thread(s)"), std::string::npos)
      << device2->split->peak_flops.source;
  EXPECT_EQ(device2->split->gemm_efficiency_by_rows.size(), 5u);
  EXPECT_NE(device2->split->gemm_efficiency_by_rows_source.find("each of 2 devices running at once"),
            std::string::npos);
  // ... and the split device's TP curve on decode runs of one tp=2 group
  // at the same batches.
  ASSERT_EQ(device2->split->tp_gemm_efficiency_by_rows.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(device2->split->tp_gemm_efficiency_by_rows[i].first, rows[i]);
    EXPECT_GT(device2->split->tp_gemm_efficiency_by_rows[i].second, 0);
    EXPECT_LE(device2->split->tp_gemm_efficiency_by_rows[i].second, 1);
  }
  EXPECT_NE(device2->split->tp_gemm_efficiency_by_rows_source.find("one tp=2 group"), std::string::npos)
      << device2->split->tp_gemm_efficiency_by_rows_source;
  EXPECT_TRUE(device2->tp_gemm_efficiency_by_rows.empty()) << "TP runs 2 devices: the split device holds it";
  // ... and the Shift curve on decode runs of one Shift group (base sp=2,
  // decode in tp=2) at the same batches.
  ASSERT_EQ(device2->split->shift_gemm_efficiency_by_rows.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(device2->split->shift_gemm_efficiency_by_rows[i].first, rows[i]);
    EXPECT_GT(device2->split->shift_gemm_efficiency_by_rows[i].second, 0);
    EXPECT_LE(device2->split->shift_gemm_efficiency_by_rows[i].second, 1);
  }
  EXPECT_NE(device2->split->shift_gemm_efficiency_by_rows_source.find("one Shift group, base sp=2, its decode steps "
                                                                       "in tp=2"),
            std::string::npos)
      << device2->split->shift_gemm_efficiency_by_rows_source;
  // ... and the part of SiDP WaS's fetch copy that its steps show, on
  // decode runs of one SiDP group in WaS at the same batches.
  ASSERT_EQ(device2->split->was_copy_exposed_by_rows.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(device2->split->was_copy_exposed_by_rows[i].first, rows[i]);
    EXPECT_GE(device2->split->was_copy_exposed_by_rows[i].second, 0);
    EXPECT_LE(device2->split->was_copy_exposed_by_rows[i].second, 1);
  }
  EXPECT_NE(device2->split->was_copy_exposed_by_rows_source.find("a real SiDP WaS rank's decode step (rank 0 of a "
                                                                  "dp=2 group, its link paced to"),
            std::string::npos)
      << device2->split->was_copy_exposed_by_rows_source;
  EXPECT_EQ(device2->gemm_efficiency.source.find("fastest of"), std::string::npos) << "one run each";

  // The calibrated device simulates this machine.
  const auto sim = run_command(kShardline + " simulate --cluster cpux2 --calibration " + path("cpu.json") +
                               " --shape " + shape + " --parallel single --parallel tp=2 --num-prompts 8 --json");
  ASSERT_EQ(sim.exit_code, 0) << sim.out;
  EXPECT_GT(results_by_strategy(sim.out)["tp=2,pp=1,sp=1,dp=1 fixed"].value("total_tok_s", 0.0), 0.0) << sim.out;

  const auto v = run_command(kShardline + " simulate --validate --threads 1 --shape " + shape +
                             " --validate-case single --num-prompts 8 --input-len 16 --output-len 8 --max-batch 8"
                             " --validate-rounds 2 --validate-max-rounds 3 --calibration-repeats 2 --json");
  ASSERT_EQ(v.exit_code, 0) << v.out;
  // A calibration round begins each of the first 2 rounds: a slow period
  // falls on the calibration as on the cases.
  const auto at = [&](const std::string& what) { return v.out.find(what); };
  ASSERT_NE(at("validate: calibration round 1 of 2"), std::string::npos) << v.out;
  ASSERT_NE(at("validate: calibration round 2 of 2"), std::string::npos) << v.out;
  ASSERT_NE(at("validate: single         round 2:"), std::string::npos) << v.out;
  EXPECT_LT(at("validate: calibration round 1 of 2"), at("validate: single         round 1:"));
  EXPECT_LT(at("validate: single         round 1:"), at("validate: calibration round 2 of 2"));
  EXPECT_LT(at("validate: calibration round 2 of 2"), at("validate: single         round 2:"));
  EXPECT_EQ(v.out.find("calibration round 3"), std::string::npos) << v.out;
  const json j = json::parse(v.out.substr(v.out.rfind("\n{") + 1), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << v.out;
  ASSERT_EQ(j["validation"].size(), 1u) << v.out;
  EXPECT_EQ(j["calibration_repeats"].get<int>(), 2);
  const json& row = j["validation"][0];
  EXPECT_EQ(row["case"], "single");
  EXPECT_GT(row["simulated_total_tok_s"].get<double>(), 0);
  // The measurement is the fastest round's; a case runs at least 2 rounds
  // here and a third only when its two fastest disagree by more than 10%.
  const std::vector<double> tok_s = row["round_total_tok_s"].get<std::vector<double>>();
  const std::vector<double> step_ms = row["round_decode_step_ms"].get<std::vector<double>>();
  ASSERT_GE(tok_s.size(), 2u) << v.out;
  ASSERT_LE(tok_s.size(), 3u) << v.out;
  ASSERT_EQ(step_ms.size(), tok_s.size()) << v.out;
  EXPECT_EQ(row["rounds"].get<std::size_t>(), tok_s.size());
  EXPECT_EQ(row["measured_total_tok_s"].get<double>(), *std::max_element(tok_s.begin(), tok_s.end()));
  EXPECT_EQ(row["measured_decode_step_ms"].get<double>(), *std::min_element(step_ms.begin(), step_ms.end()));
  EXPECT_GT(row["measured_total_tok_s"].get<double>(), 0);
  sim::calibration::ValidationRow parsed;
  parsed.round_total_tok_s = tok_s;
  parsed.round_decode_step_ms = step_ms;
  EXPECT_EQ(row["steady"].get<bool>(), sim::calibration::rounds_agree(parsed, 0.1));
  EXPECT_TRUE(row["steady"].get<bool>() || tok_s.size() == 3u) << "a case not steady runs to the last round";
  // A third round ran exactly when the first two did not agree (a case may
  // become steady in it).
  sim::calibration::ValidationRow first_two;
  first_two.round_total_tok_s = {tok_s[0], tok_s[1]};
  first_two.round_decode_step_ms = {step_ms[0], step_ms[1]};
  EXPECT_EQ(tok_s.size() == 3u, !sim::calibration::rounds_agree(first_two, 0.1)) << "a case steady after 2 rounds stops there";
  // The error is the simulation's against the measurement.
  EXPECT_NEAR(row["total_tok_s_error"].get<double>(),
              row["simulated_total_tok_s"].get<double>() / row["measured_total_tok_s"].get<double>() - 1, 1e-9);
  EXPECT_NEAR(row["decode_step_ms_error"].get<double>(),
              row["simulated_decode_step_ms"].get<double>() / row["measured_decode_step_ms"].get<double>() - 1, 1e-9);

  // Bad requests say what is wrong before anything runs.
  const auto bad = run_command(kShardline + " simulate --validate --shape " + shape + " --validate-case tp=3");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("unknown validation case 'tp=3'"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("sidp-cas"), std::string::npos) << bad.out;
  const auto par = run_command(kShardline + " simulate --validate --shape " + shape + " --parallel tp=2");
  EXPECT_EQ(par.exit_code, 2);
  EXPECT_NE(par.out.find("--validate-case"), std::string::npos) << par.out;
}

TEST_F(SimulateE2e, PlanRanksStrategiesAndRunParallelAutoUsesItsChoice) {
  const auto p = run_command(kShardline + " plan --cluster h200x8 --shape " + kShapes + "llama-3.1-8b" +
                             " --input-dist uniform:512:2048 --output-dist loguniform:8:64 --num-prompts 256"
                             " --max-batch 64 --json");
  ASSERT_EQ(p.exit_code, 0) << p.out;
  const json j = json::parse(p.out.substr(p.out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << p.out;
  EXPECT_EQ(j["num_requests"], 256);
  ASSERT_GT(j["ranked"].size(), 5u);
  EXPECT_EQ(j["best"], j["ranked"][0]["strategy"]);
  for (std::size_t i = 1; i < j["ranked"].size(); ++i)
    EXPECT_GE(j["ranked"][i - 1]["total_tok_s"].get<double>(), j["ranked"][i]["total_tok_s"].get<double>());
  EXPECT_NE(j["why"].get<std::string>().find("runner-up"), std::string::npos);
  const auto table = run_command(kShardline + " plan --cluster h200x8 --shape " + kShapes + "llama-3.1-8b --top 3");
  ASSERT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(table.out.find("best: "), std::string::npos) << table.out;

  // run --parallel auto: the planner picks a config for two CPU devices and
  // the job's own lines, and the job runs on it.
  testing_support::write_demo_prompts(path("in.jsonl"), 12);
  const auto run = run_command(kShardline + " run --parallel auto --devices cpu:2 --threads 1 --model " +
                               std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K --input " +
                               path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.out, m, std::regex("--parallel auto: (tp=\\d+,pp=\\d+,sp=\\d+,dp=\\d+) on cpu:2")))
      << run.out;
  const std::string out = read_file(path("out.jsonl"));
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 12);
  const auto bad = run_command(kShardline + " run --parallel auto --devices cuda:0 --model " +
                               std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K --input " +
                               path("in.jsonl") + " --output " + path("out2.jsonl"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.out.find("plans CPU devices"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace shardline
