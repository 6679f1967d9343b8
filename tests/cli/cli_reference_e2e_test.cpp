// docs/cli.md lists every flag of every command as the command's --help
// prints it (issue 44, item 8): deploy/cli_reference.py --check regenerates
// the reference from the binary and compares. A flag added, renamed or
// removed without the doc fails here; so does a doc edited by hand.

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/support/process.hpp"

namespace shardline {
namespace cli_cli_reference_e2e_test {

using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;

const std::string kScript = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/cli_reference.py";
const std::string kDoc = std::string(SHARDLINE_SOURCE_DIR) + "/docs/cli.md";

class CliReferenceE2e : public testing_support::TempDirTest {};

TEST_F(CliReferenceE2e, CliMdListsEveryFlagOfEveryCommand) {
  const auto r = run_command("python3 " + kScript + " --check " + kShardline + " " + kDoc);
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// The check fails, naming the line, when the doc misses a flag.
TEST_F(CliReferenceE2e, ADocMissingAFlagFailsTheCheck) {
  std::string doc = read_file(kDoc);
  const std::string flag = "* `--kv-disk-reserve-mib UINT=256`";
  const auto at = doc.find(flag);
  ASSERT_NE(at, std::string::npos) << "the reference lists no " << flag;
  doc.erase(at, doc.find('\n', at) + 1 - at);
  std::ofstream(path("cli.md")) << doc;
  const auto r = run_command("python3 " + kScript + " --check " + kShardline + " " + path("cli.md"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--kv-disk-reserve-mib"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardline
