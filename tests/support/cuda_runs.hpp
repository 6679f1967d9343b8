#pragma once
// `shardline run` on CUDA devices against the CPU, shared by the real-GPU
// test (tests/cli/cuda_run_gpu_test.cpp: the real binary) and the fake-device
// one (tests/cli/cuda_run_fake_device_e2e_test.cpp: shardline_fake_cuda).
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/demo_prompts.hpp"
#include "tests/support/process.hpp"

namespace shardline::testing_support {

class CudaRunTest : public TempDirTest {
 protected:
  /// custom_id -> output line, checking each id appears once.
  std::map<std::string, nlohmann::json> read_output(const std::string& file) {
    std::map<std::string, nlohmann::json> out;
    std::istringstream lines(read_file(file));
    std::string line;
    while (std::getline(lines, line)) {
      nlohmann::json j = nlohmann::json::parse(line);
      const std::string id = j.at("custom_id").get<std::string>();
      EXPECT_EQ(out.count(id), 0u) << "duplicate " << id;
      out[id] = std::move(j);
    }
    return out;
  }

  /// The shipped demo model (stories260K).
  static std::string demo_model() { return std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K"; }

  /// `run` of two demo prompts through `command` (a `shardline` binary,
  /// with any environment before it) with `flags`: for the flags' errors.
  CommandResult run_two_lines(const std::string& command, const std::string& flags) {
    write_demo_prompts(path("in.jsonl"), 2, [](int, nlohmann::json&) {});
    return run_command(command + " run --model " + demo_model() + " --input " + path("in.jsonl") + " --output " +
                       path("out.jsonl") + " " + flags + " --quiet");
  }

  /// The first `lines` demo prompts (40 tokens each, even lines greedy)
  /// through `run` on the CPU with `cpu_flags` and through `gpu_command`
  /// (a `shardline` binary, with any environment before it) with
  /// `gpu_flags` (FP32 weights and KV on both): every line once on both,
  /// and each greedy line's choices byte-identical.
  void expect_greedy_lines_match(int lines, const std::string& cpu_flags, const std::string& gpu_flags,
                                 const std::string& gpu_command = kShardline) {
    std::map<int, bool> greedy;
    write_demo_prompts(path("in.jsonl"), lines, [&](int i, nlohmann::json& body) {
      body["max_tokens"] = 40;
      greedy[i] = i % 2 == 0;
      if (greedy[i]) {
        body["temperature"] = 0.0;
        body.erase("seed");
      }
    });
    const std::string args = " run --model " + demo_model() + " --input " + path("in.jsonl") +
                             " --dtype f32 --kv-cache-dtype f32 --quiet ";
    auto cpu = run_command(kShardline + args + cpu_flags + " --output " + path("cpu.jsonl"));
    ASSERT_EQ(cpu.exit_code, 0) << cpu.out;
    auto gpu = run_command(gpu_command + args + gpu_flags + " --gpu-memory-utilization 0.3 --output " +
                           path("gpu.jsonl"));
    ASSERT_EQ(gpu.exit_code, 0) << gpu_flags << ": " << gpu.out;
    const auto c = read_output(path("cpu.jsonl"));
    const auto g = read_output(path("gpu.jsonl"));
    ASSERT_EQ(c.size(), static_cast<std::size_t>(lines));
    ASSERT_EQ(g.size(), c.size());
    int compared = 0;
    for (const auto& [id, line] : c) {
      ASSERT_EQ(g.count(id), 1u) << id;
      EXPECT_EQ(g.at(id).at("error"), nullptr) << g.at(id).dump();
      const int index = std::stoi(id.substr(id.find_last_not_of("0123456789") + 1)) - 1;  // demo-0001 is line 0
      if (!greedy[index]) continue;
      EXPECT_EQ(g.at(id).at("response").at("body").at("choices"), line.at("response").at("body").at("choices"))
          << gpu_flags << ": " << id;
      ++compared;
    }
    EXPECT_EQ(compared, lines / 2);
  }
};

}  // namespace shardline::testing_support
