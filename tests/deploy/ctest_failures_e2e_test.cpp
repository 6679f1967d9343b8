// deploy/ctest_failures.py, which deploy/test.sh runs after a failed ctest so
// that the last lines of a CI log say why each test failed: one line per
// failed test with gtest's first failure (location and values), the
// duration for a test without one (a timeout, a crash), nothing for passed
// tests, and a clear error for a missing file.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/support/process.hpp"

namespace shardline {
namespace deploy_ctest_failures_e2e_test {

using testing_support::run_command;

using CtestFailures = testing_support::TempDirTest;

const std::string kScript = "python3 " + std::string(SHARDLINE_SOURCE_DIR) + "/deploy/ctest_failures.py ";

// The shape of ctest 3.25's --output-junit file.
constexpr const char* kJunit = R"xml(<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="3" failures="2" disabled="0" skipped="0" hostname="" time="9">
	<testcase name="Kv.Resumes" classname="Kv.Resumes" time="7.25" status="fail">
		<failure message=""/>
		<system-out>[ RUN      ] Kv.Resumes
/work/main/tests/actors/kv_test.cpp:150: Failure
Expected equality of these values:
  recomputed
    Which is: 613
  0
[  FAILED  ] Kv.Resumes (7250 ms)
</system-out>
	</testcase>
	<testcase name="Kv.Passes" classname="Kv.Passes" time="1.0" status="run">
		<system-out>[       OK ] Kv.Passes</system-out>
	</testcase>
	<testcase name="Kv.Hangs" classname="Kv.Hangs" time="600.02" status="fail">
		<failure message=""/>
		<system-out></system-out>
	</testcase>
</testsuite>
)xml";

TEST_F(CtestFailures, SaysWhereAndWhyEachFailedTestFailed) {
  std::ofstream(path("junit.xml")) << kJunit;
  const auto r = run_command(kScript + path("junit.xml"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("FAILED Kv.Resumes after 7.2 s: kv_test.cpp:150: Expected equality of these values: | "
                       "recomputed | Which is: 613 | 0"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("FAILED Kv.Hangs after 600.0 s: (no output)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Kv.Passes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 test(s) failed"), std::string::npos) << r.out;
}

TEST_F(CtestFailures, AMissingFileIsAClearError) {
  const auto r = run_command(kScript + path("none.xml") + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("cannot read " + path("none.xml")), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardline
