// End to end through the `shardline` binary: generate on the shipped demo
// model prints the reference story; tokenize --json; bad model folders and
// bad flags give a clear error and a non-zero exit, never a crash.
#include <gtest/gtest.h>


#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tests/support/process.hpp"

namespace shardline {
namespace {

const std::string& kBin = testing_support::kShardline;
const std::string kModel = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K";

using CliRun = testing_support::CommandResult;

CliRun run(const std::string& args) { return testing_support::run_command(kBin + " " + args); }

TEST(CliE2e, GeneratePrintsTheReferenceStory) {
  const CliRun r = run("generate --model " + kModel +
                    " --prompt 'Once upon a time' --max-tokens 48 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out,
            "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
            "park. One day, she saw a big, red ball. She wanted to play with it,\n");
}

TEST(CliE2e, GenerateJsonHasIdsTextAndFinishReason) {
  const CliRun r = run("generate --model " + kModel +
                    " --prompt 'Once upon a time' --prompt 'Lily wanted to' --max-tokens 5 "
                    "--temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::istringstream lines(r.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("token_ids").size(), 5u);
    EXPECT_EQ(j.at("finish_reason"), "length");
    EXPECT_EQ(j.at("prompt_token_ids").at(0), 1);  // BOS
    ++n;
  }
  EXPECT_EQ(n, 2);
  EXPECT_NE(r.out.find("[432,383,286,261,376]"), std::string::npos) << r.out;
}

TEST(CliE2e, TokenizeJson) {
  const CliRun r = run("tokenize --tokenizer " + std::string(SHARDLINE_SHARED_DIR) +
                    "/tokenizers/qwen3 --text 'Hello, my dog is cute' --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "{\"token_ids\":[9707,11,847,5562,374,18838]}\n");
}

TEST(CliE2e, MissingModelFolderIsAClearError) {
  const CliRun r = run("generate --model /nonexistent/model --prompt hi");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("not_found"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/model"), std::string::npos) << r.out;
}

TEST(CliE2e, CorruptSafetensorsIsAClearError) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardline_cli_corrupt_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json"})
    fs::copy_file(fs::path(kModel) / f, dir / f, fs::copy_options::overwrite_existing);
  {
    std::ofstream o(dir / "model.safetensors", std::ios::binary);
    const std::uint64_t header_len = 1u << 20;  // claims 1 MiB of header, file has 20 bytes
    o.write(reinterpret_cast<const char*>(&header_len), 8);
    o << "{\"a\": 1}    ";
  }
  const CliRun r = run("generate --model " + dir.string() + " --prompt hi");
  fs::remove_all(dir);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("corrupt"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
}

TEST(CliE2e, BadFlagsAreUsageErrors) {
  CliRun r = run("generate --model " + kModel + " --prompt hi --dtype f8");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--dtype"), std::string::npos) << r.out;
  r = run("generate --model " + kModel + " --prompt hi --top-p 1.5");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("top_p"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardline
