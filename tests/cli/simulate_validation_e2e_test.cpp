// The simulator against this machine (issue 14, docs/simulator.md
// "Validation against this machine"): `shardline simulate --validate` runs
// ten cases for real on in-process CPU devices and simulated on the device
// it calibrated at the start: single, tp=2, pp=2 with a fixed budget and
// with gLLM's throttling, sp=2, dp=2, Shift (sp=2 <-> tp=2), Seesaw
// (pp=2 -> tp=2), SiDP in WaS and in CaS. The simulated total tok/s and
// decode step time must be within 15% of the measurement.
//
// This machine has slow episodes (another tenant takes part of a core for
// tens of seconds), and they only ever slow it. So the calibration keeps
// the fastest of 3 interleaved runs of each measurement, and the cases run
// in rounds (every case, then every case again), each keeping its fastest
// round: the machine's undisturbed speed (sim/calibration/validate.hpp). A case is
// steady when its two fastest rounds agree within 10%; one not steady
// after 5 rounds is printed, not asserted, and at least 8 of the 10 must be
// steady, or the test fails for the noise (it does not pass on less).
// The test runs alone (RUN_SERIAL, tests/CMakeLists.txt): other tests on
// the same cores would be measured too. It bounds the simulator's error,
// not this machine's speed.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/support/process.hpp"

namespace shardline {
namespace {

using json = nlohmann::json;
using testing_support::kShardline;
using testing_support::run_command;

constexpr double kBound = 0.15;  // the bound on the simulator's error
constexpr int kMinSteady = 8;

TEST(SimulateValidationE2e, TenCasesAreSimulatedWithinFifteenPercentOfTheMeasurement) {
  const std::string shape = std::string(SHARDLINE_SHARED_DIR) + "/models/shapes/stories110m";
  const auto r = run_command(kShardline + " simulate --validate --threads 2 --shape " + shape + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::size_t line = r.out.rfind("\n{");
  const json j = json::parse(r.out.substr(line == std::string::npos ? r.out.find('{') : line + 1), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  const json& rows = j["validation"];
  ASSERT_EQ(rows.size(), 10u) << r.out;
  std::set<std::string> names;
  int steady = 0;
  for (const json& row : rows) {
    const std::string name = row["case"];
    names.insert(name);
    SCOPED_TRACE(name + ": " + row.dump());
    EXPECT_GT(row["measured_total_tok_s"].get<double>(), 0);
    EXPECT_GT(row["measured_decode_step_ms"].get<double>(), 0);
    EXPECT_GE(row["rounds"].get<int>(), 3);
    std::cout << name << ": total tok/s error " << row["total_tok_s_error"].get<double>() << ", decode step error "
              << row["decode_step_ms_error"].get<double>() << (row["steady"].get<bool>() ? "" : " (not steady)")
              << "\n";
    if (!row["steady"].get<bool>()) continue;
    ++steady;
    EXPECT_LE(std::abs(row["total_tok_s_error"].get<double>()), kBound);
    EXPECT_LE(std::abs(row["decode_step_ms_error"].get<double>()), kBound);
  }
  EXPECT_GE(steady, kMinSteady) << "the machine was too noisy to validate: " << r.out;
  EXPECT_EQ(names, (std::set<std::string>{"single", "tp=2", "pp=2-fixed", "pp=2-throttle", "sp=2", "dp=2", "shift",
                                          "seesaw", "sidp-was", "sidp-cas"}));
}

}  // namespace
}  // namespace shardline
