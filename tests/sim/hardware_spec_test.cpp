// sim/hardware_spec: the built-in device files parse and source every
// number; clusters by name (DEVICExN, nodes from devices_per_node) and by
// file; bad files are clear errors; per-rank hardware picks the right link
// and splits a shared memory bus.
#include "sim/hardware_spec.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "tests/support/process.hpp"

namespace shardline::sim {
namespace sim_hardware_spec_test {

using SimHardware = testing_support::TempDirTest;

TEST_F(SimHardware, EveryPresetParsesWithASourcePerNumber) {
  const auto names = device_preset_names();
  EXPECT_EQ(names, (std::vector<std::string>{"a10", "a100-80gb", "h100", "h200", "l20"}));
  for (const std::string& n : names) {
    auto d = device_preset(n);
    ASSERT_TRUE(d.ok()) << n << ": " << d.error().to_string();
    EXPECT_EQ(d->name, n);
    EXPECT_EQ(d->weight_dtype, DType::bf16);
    EXPECT_FALSE(d->shared_memory_bus);
    for (const Sourced* s : {&d->peak_flops, &d->memory_bw_bytes_per_s, &d->memory_bytes, &d->intra_node_bw_bytes_per_s,
                             &d->host_link_bw_bytes_per_s, &d->gemm_efficiency, &d->step_overhead_ms})
      EXPECT_FALSE(s->source.empty()) << n;
    // Round trip through the file format.
    auto again = parse_device_spec(device_spec_json(*d), "round trip");
    ASSERT_TRUE(again.ok()) << again.error().to_string();
    EXPECT_EQ(again->peak_flops.value, d->peak_flops.value);
    EXPECT_EQ(again->memory_bytes.source, d->memory_bytes.source);
  }
  // Datasheet figures the projections depend on.
  EXPECT_DOUBLE_EQ(device_preset("h200")->memory_bw_bytes_per_s.value, 4.8e12);
  EXPECT_DOUBLE_EQ(device_preset("h200")->memory_bytes.value, 141e9);
  EXPECT_DOUBLE_EQ(device_preset("a10")->memory_bytes.value, 24e9);
  EXPECT_NE(device_preset("a10")->intra_node_bw_bytes_per_s.source.find("PCIe 4.0 x8"), std::string::npos);
}

TEST_F(SimHardware, ClustersByNameAndByFile) {
  auto c = load_cluster("h200x8");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->num_devices, 8);
  EXPECT_EQ(c->num_nodes(), 1);
  c = load_cluster("h200x64");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_nodes(), 8);
  c = load_cluster("l20");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_devices, 1);

  auto missing = load_cluster("tpu-v5x8");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
  EXPECT_NE(missing.error().message.find("h200"), std::string::npos) << missing.error().message;
  auto no_cpu = load_cluster("cpux2", path("none.json"));
  ASSERT_FALSE(no_cpu.ok());
  EXPECT_NE(no_cpu.error().message.find("--calibrate"), std::string::npos) << no_cpu.error().message;

  // A file naming a preset, and one with an inline device.
  std::ofstream(path("four.json")) << R"({"name": "four-a100", "device": "a100-80gb", "num_devices": 4})";
  c = load_cluster(path("four.json"));
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->name, "four-a100");
  EXPECT_EQ(c->num_devices, 4);
  nlohmann::json inline_device = nlohmann::json::parse(device_spec_json(*device_preset("l20")));
  inline_device["name"] = "my-l20";
  std::ofstream(path("mine.json")) << nlohmann::json{{"device", inline_device}, {"num_devices", 2}}.dump();
  c = load_cluster(path("mine.json"));
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->device.name, "my-l20");
  EXPECT_EQ(c->name, "mine");
}

TEST_F(SimHardware, BadDeviceFilesAreClearErrors) {
  nlohmann::json good = nlohmann::json::parse(device_spec_json(*device_preset("h100")));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return parse_device_spec(j.dump(), "test.json");
  };
  EXPECT_TRUE(with([](nlohmann::json&) {}).ok());
  auto r = with([](nlohmann::json& j) { j.erase("memory_bytes"); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  EXPECT_NE(r.error().message.find("missing 'memory_bytes'"), std::string::npos);
  r = with([](nlohmann::json& j) { j["peak_flops"]["source"] = ""; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'peak_flops' has no source"), std::string::npos);
  r = with([](nlohmann::json& j) { j["gemm_efficiency"]["value"] = 1.5; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  r = with([](nlohmann::json& j) { j["weight_dtype"] = "int4"; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("weight_dtype"), std::string::npos);
  EXPECT_FALSE(parse_device_spec("{oops", "x").ok());
}

TEST_F(SimHardware, GroupHardwarePicksTheLinkAndSplitsASharedBus) {
  auto c = load_cluster("h100x16");
  ASSERT_TRUE(c.ok());
  const auto in_node = group_hardware(*c, 8);
  EXPECT_DOUBLE_EQ(in_node.comm_bw_bytes_per_s, 450e9);
  EXPECT_DOUBLE_EQ(in_node.flops_per_s, 989e12 * 0.7);
  EXPECT_DOUBLE_EQ(in_node.memory_bw_bytes_per_s, 3350e9 * 0.85);
  const auto across = group_hardware(*c, 16);
  EXPECT_DOUBLE_EQ(across.comm_bw_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(group_hardware(*c, 8, 8).flops_per_s, in_node.flops_per_s) << "GPUs do not share a bus";
  DeviceSpec cpu = *device_preset("h100");
  cpu.shared_memory_bus = true;
  ClusterSpec shared{"cpu", cpu, 4};
  EXPECT_DOUBLE_EQ(group_hardware(shared, 2, 4).memory_bw_bytes_per_s, 3350e9 * 0.85 / 4);
  EXPECT_DOUBLE_EQ(element_sizes(*device_preset("h200")).weight_bytes, 2.0);
}

// A CPU device with a split fit: runs with 2 or more busy devices are priced
// on the split, a single device on the whole; the split round-trips through
// the file, and a malformed one is a clear error.
TEST_F(SimHardware, ACpuSplitFitPricesMultiDeviceRuns) {
  DeviceSpec cpu = *device_preset("h100");
  cpu.name = "cpu";
  cpu.shared_memory_bus = true;
  DeviceSpec split = cpu;
  split.gemm_efficiency = {0.9, "fitted on 2 devices"};
  split.memory_bw_efficiency = {0.5, "fitted on 2 devices"};
  split.step_overhead_ms = {1.25, "fitted on 2 devices"};
  cpu.split = std::make_shared<const DeviceSpec>(split);
  cpu.split_devices = 2;
  ClusterSpec c{"cpux2", cpu, 2};
  EXPECT_EQ(&device_for(c, 1), &c.device);
  EXPECT_EQ(&device_for(c, 2), c.device.split.get());
  EXPECT_DOUBLE_EQ(group_hardware(c, 1, 1).memory_bw_bytes_per_s, 3350e9 * 0.85);
  EXPECT_DOUBLE_EQ(group_hardware(c, 1, 2).memory_bw_bytes_per_s, 3350e9 * 0.5 / 2);
  EXPECT_DOUBLE_EQ(group_hardware(c, 2, 2).flops_per_s, 989e12 * 0.9 / 2);

  auto back = parse_device_spec(device_spec_json(cpu), "cpu.json");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  ASSERT_NE(back->split, nullptr);
  EXPECT_EQ(back->split_devices, 2);
  EXPECT_DOUBLE_EQ(back->split->step_overhead_ms.value, 1.25);
  EXPECT_EQ(back->split->gemm_efficiency.source, "fitted on 2 devices");

  nlohmann::json j = nlohmann::json::parse(device_spec_json(cpu));
  j["split_devices"] = 1;
  auto bad = parse_device_spec(j.dump(), "cpu.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("split_devices"), std::string::npos) << bad.error().message;
  j["split_devices"] = 2;
  j["split"].erase("gemm_efficiency");
  bad = parse_device_spec(j.dump(), "cpu.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("(split): missing 'gemm_efficiency'"), std::string::npos) << bad.error().message;
}

TEST_F(SimHardware, WasCopyExposedByRowsIsACurveFromZeroToOne) {
  DeviceSpec cpu = *device_preset("h100");
  EXPECT_TRUE(cpu.was_copy_exposed_by_rows.empty());
  EXPECT_DOUBLE_EQ(was_copy_exposed_at(cpu, 32), 1.0) << "no fit: the whole copy adds";
  cpu.shared_memory_bus = true;
  cpu.was_copy_exposed_by_rows = {{4, 0.0}, {32, 0.6}};
  cpu.was_copy_exposed_by_rows_source = "fitted on WaS at batches 4 and 32";
  EXPECT_DOUBLE_EQ(was_copy_exposed_at(cpu, 2), 0.0) << "flat below the first point";
  EXPECT_DOUBLE_EQ(was_copy_exposed_at(cpu, 18), 0.3);
  EXPECT_DOUBLE_EQ(was_copy_exposed_at(cpu, 64), 0.6) << "flat beyond the last point";

  auto back = parse_device_spec(device_spec_json(cpu), "cpu.json");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->was_copy_exposed_by_rows, cpu.was_copy_exposed_by_rows) << "a fraction of 0 is allowed";
  EXPECT_EQ(back->was_copy_exposed_by_rows_source, "fitted on WaS at batches 4 and 32");

  nlohmann::json j = nlohmann::json::parse(device_spec_json(cpu));
  for (const char* bad_points : {"[[4, -0.1]]", "[[4, 1.5]]", "[[32, 0.5], [4, 0.25]]"}) {
    nlohmann::json k = j;
    k["was_copy_exposed_by_rows"]["value"] = nlohmann::json::parse(bad_points);
    auto bad = parse_device_spec(k.dump(), "cpu.json");
    ASSERT_FALSE(bad.ok()) << bad_points;
    EXPECT_NE(bad.error().message.find("'was_copy_exposed_by_rows' needs rows >= 1 ascending and fractions in [0, 1]"),
              std::string::npos)
        << bad.error().message;
  }
  // The other curves still refuse 0.
  nlohmann::json k = j;
  k["gemm_efficiency_by_rows"] = {{"value", nlohmann::json::parse("[[4, 0]]")}, {"source", "x"}};
  auto bad = parse_device_spec(k.dump(), "cpu.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("fractions in (0, 1]"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace shardline::sim

namespace shardline::sim {
namespace sim_hardware_spec_test {

// gemm_efficiency_by_rows (a calibrated CPU device's GEMM efficiency by the
// rows of a step): optional, round-trips through the file, replaces
// gemm_efficiency in steps below kLargeStepTokens only, and a malformed one
// is a clear error.
TEST_F(SimHardware, GemmEfficiencyByRowsPricesSmallStepsOnly) {
  DeviceSpec cpu = *device_preset("h100");
  EXPECT_TRUE(cpu.gemm_efficiency_by_rows.empty()) << "the GPU files leave it out";
  EXPECT_TRUE(group_hardware(ClusterSpec{"h100", cpu, 1}, 1).flops_by_rows.empty());
  cpu.shared_memory_bus = true;
  cpu.gemm_efficiency_by_rows = {{4, 0.25}, {32, 0.75}};
  cpu.gemm_efficiency_by_rows_source = "fitted at batches 4 and 32";
  ClusterSpec c{"cpux2", cpu, 2};
  const auto hw = group_hardware(c, 1, 2);
  ASSERT_EQ(hw.flops_by_rows.size(), 2u);
  EXPECT_DOUBLE_EQ(hw.flops_by_rows[0].first, 4);
  EXPECT_DOUBLE_EQ(hw.flops_by_rows[0].second, 989e12 * 0.25 / 2) << "the device's share of the bus";
  EXPECT_DOUBLE_EQ(hw.flops_at(18), 989e12 * 0.5 / 2);
  EXPECT_TRUE(group_hardware(c, 1, 2, /*large_steps=*/true).flops_by_rows.empty())
      << "prefill steps keep prefill_gemm_efficiency";

  auto back = parse_device_spec(device_spec_json(cpu), "cpu.json");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->gemm_efficiency_by_rows, cpu.gemm_efficiency_by_rows);
  EXPECT_EQ(back->gemm_efficiency_by_rows_source, "fitted at batches 4 and 32");

  nlohmann::json j = nlohmann::json::parse(device_spec_json(cpu));
  for (const char* bad_points : {"[[32, 0.5], [4, 0.25]]", "[[4, 1.5]]", "[[0, 0.5]]", "[[4]]", "[]"}) {
    nlohmann::json k = j;
    k["gemm_efficiency_by_rows"]["value"] = nlohmann::json::parse(bad_points);
    auto bad = parse_device_spec(k.dump(), "cpu.json");
    ASSERT_FALSE(bad.ok()) << bad_points;
    EXPECT_NE(bad.error().message.find("gemm_efficiency_by_rows"), std::string::npos) << bad.error().message;
  }
  j["gemm_efficiency_by_rows"]["source"] = "";
  auto bad = parse_device_spec(j.dump(), "cpu.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'gemm_efficiency_by_rows' has no source"), std::string::npos);
}

// tp_gemm_efficiency_by_rows (a TP rank's curve, fitted on tp=2 runs): the
// same form, round-trips, fills HardwareSpec::tp_flops_by_rows for small
// steps only, and a malformed one is a clear error naming it.
TEST_F(SimHardware, TpGemmEfficiencyByRowsFillsTheTpCurve) {
  DeviceSpec cpu = *device_preset("h100");
  EXPECT_TRUE(cpu.tp_gemm_efficiency_by_rows.empty());
  cpu.shared_memory_bus = true;
  cpu.gemm_efficiency_by_rows = {{4, 0.25}, {32, 0.75}};
  cpu.gemm_efficiency_by_rows_source = "fitted at batches 4 and 32";
  cpu.tp_gemm_efficiency_by_rows = {{4, 0.2}, {32, 0.5}};
  cpu.tp_gemm_efficiency_by_rows_source = "fitted on tp=2 at batches 4 and 32";
  ClusterSpec c{"cpux2", cpu, 2};
  const auto hw = group_hardware(c, 2, 2);
  ASSERT_EQ(hw.tp_flops_by_rows.size(), 2u);
  EXPECT_DOUBLE_EQ(hw.tp_flops_by_rows[1].second, 989e12 * 0.5 / 2) << "the device's share of the bus";
  EXPECT_DOUBLE_EQ(hw.flops_at(18, 2), 989e12 * 0.35 / 2);
  EXPECT_DOUBLE_EQ(hw.flops_at(18, 1), 989e12 * 0.5 / 2);
  EXPECT_TRUE(group_hardware(c, 2, 2, /*large_steps=*/true).tp_flops_by_rows.empty());

  EXPECT_EQ(group_hardware(c, 2, 2, false, /*shift_steps=*/true).tp_flops_by_rows, hw.tp_flops_by_rows)
      << "no Shift curve: Shift's steps on the TP curve";
  cpu.shift_gemm_efficiency_by_rows = {{4, 0.3}, {32, 0.6}};
  cpu.shift_gemm_efficiency_by_rows_source = "fitted on a Shift group";
  c.device = cpu;
  EXPECT_DOUBLE_EQ(group_hardware(c, 2, 2, false, true).flops_at(32, 2), 989e12 * 0.6 / 2);
  EXPECT_DOUBLE_EQ(group_hardware(c, 2, 2).flops_at(32, 2), 989e12 * 0.5 / 2) << "plain TP keeps its curve";

  auto back = parse_device_spec(device_spec_json(cpu), "cpu.json");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->shift_gemm_efficiency_by_rows, cpu.shift_gemm_efficiency_by_rows);
  EXPECT_EQ(back->shift_gemm_efficiency_by_rows_source, "fitted on a Shift group");
  EXPECT_EQ(back->tp_gemm_efficiency_by_rows, cpu.tp_gemm_efficiency_by_rows);
  EXPECT_EQ(back->tp_gemm_efficiency_by_rows_source, "fitted on tp=2 at batches 4 and 32");
  EXPECT_EQ(back->gemm_efficiency_by_rows, cpu.gemm_efficiency_by_rows);

  nlohmann::json j = nlohmann::json::parse(device_spec_json(cpu));
  for (const char* bad_points : {"[[32, 0.5], [4, 0.25]]", "[[4, 0]]", "[[4, 0.5, 1]]"}) {
    nlohmann::json k = j;
    k["tp_gemm_efficiency_by_rows"]["value"] = nlohmann::json::parse(bad_points);
    auto bad = parse_device_spec(k.dump(), "cpu.json");
    ASSERT_FALSE(bad.ok()) << bad_points;
    EXPECT_NE(bad.error().message.find("'tp_gemm_efficiency_by_rows'"), std::string::npos) << bad.error().message;
  }
  j["tp_gemm_efficiency_by_rows"].erase("source");
  auto bad = parse_device_spec(j.dump(), "cpu.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'tp_gemm_efficiency_by_rows' has no source"), std::string::npos);
}

}  // namespace
}  // namespace shardline::sim
