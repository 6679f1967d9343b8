// End to end through the `shardline` binary: generate on the shipped demo
// model prints the reference story; tokenize --json; bad model folders and
// bad flags give a clear error and a non-zero exit, never a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quant_linear.hpp"
#include "tests/support/process.hpp"
#if SHARDLINE_HAVE_CUDA
#include "kernels/cuda/device.hpp"
#endif

namespace shardline {
namespace cli_cli_e2e_test {

const std::string& kBin = testing_support::kShardline;
const std::string kModel = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K";

using CliRun = testing_support::CommandResult;

CliRun run(const std::string& args) { return testing_support::run_command(kBin + " " + args); }

// Issue 46, items 14 and 15: usage errors exit 2 (CLI11's own codes were
// 106 and 109), and `run`'s progress bar is not buried in info lines:
// warn by default, errors only with --quiet, --log-level (before or after
// the subcommand) to see more.
TEST(CliE2e, UsageErrorsExitTwoAndRunLogsAtWarnUnlessAsked) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardline_cli_log_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "in.jsonl") << R"({"prompt": "Once upon a time", "max_tokens": 4})" "\n";
  const std::string job = " --model " + kModel + " --input " + (dir / "in.jsonl").string() + " --output ";
  CliRun r = run("run" + job + (dir / "a.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("[info]"), std::string::npos) << r.out;
  r = run("run --log-level info" + job + (dir / "b.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("[info]"), std::string::npos) << r.out;
  r = run("--log-level debug run --quiet" + job + (dir / "c.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("[info]"), std::string::npos) << r.out;
  r = run("run --quiet" + job + (dir / "d.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "") << "--quiet prints nothing on success";

  r = run("run --log-level loud" + job + (dir / "e.jsonl").string());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--log-level: loud not in"), std::string::npos) << r.out;
  r = run("run --no-such-flag" + job + (dir / "f.jsonl").string());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  r = run("generate --model " + kModel + " --max-tokens abc --prompt x");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(run("--help").exit_code, 0);
  fs::remove_all(dir);
}

// `run --metrics-file`: the run's final metrics in Prometheus text at exit
// (a scrape of --metrics misses what the run counted in its last moments);
// a file it cannot write fails the run after the job, whose output stays.
TEST(CliE2e, RunWritesItsFinalMetricsToAFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardline_cli_metrics_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "in.jsonl") << R"({"prompt": "Once upon a time", "max_tokens": 4})" "\n"
                                  << R"({"prompt": "One day", "max_tokens": 3})" "\n";
  const std::string job = " --quiet --model " + kModel + " --input " + (dir / "in.jsonl").string() + " --output ";
  CliRun r = run("run" + job + (dir / "a.jsonl").string() + " --metrics-file " + (dir / "a.prom").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(dir / "a.prom");
  const std::string prom((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(prom.find("# TYPE shardline_requests_total counter"), std::string::npos) << prom;
  EXPECT_NE(prom.find("shardline_requests_total{state=\"done\"} 2\n"), std::string::npos) << prom;
  // The generated tokens it counted are those of the output's usage.
  std::ifstream a_out(dir / "a.jsonl");
  long long completion_tokens = 0;
  for (std::string line; std::getline(a_out, line);)
    completion_tokens += nlohmann::json::parse(line)["response"]["body"]["usage"]["completion_tokens"].get<long long>();
  EXPECT_GT(completion_tokens, 0);
  EXPECT_NE(prom.find("shardline_generation_tokens_total " + std::to_string(completion_tokens) + "\n"),
            std::string::npos)
      << prom;

  r = run("run" + job + (dir / "b.jsonl").string() + " --metrics-file " + (dir / "no" / "b.prom").string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("error: --metrics-file " + (dir / "no" / "b.prom").string() + ": cannot write it"),
            std::string::npos)
      << r.out;
  std::ifstream out(dir / "b.jsonl");
  const std::string lines((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 2) << "the job's output is complete: " << lines;
  fs::remove_all(dir);
}

// Structured outputs end to end: a `run` job whose lines carry
// response_format, guided_regex and guided_choice gets outputs that match
// them, a line with a schema the grammar engine cannot compile gets its
// invalid_response_format error and the rest of the job completes; and
// `generate` takes the same constraints as flags.
TEST(CliE2e, StructuredOutputsInAJobAndInGenerate) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardline_cli_structured_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "in.jsonl")
      << R"({"custom_id": "json", "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, )"
         R"("response_format": {"type": "json_schema", "json_schema": {"name": "m", "schema": {"type": "object", )"
         R"("properties": {"mood": {"enum": ["happy", "sad"]}}, "required": ["mood"], "additionalProperties": false}}}})"
      << "\n"
      << R"({"custom_id": "regex", "prompt": "One day", "max_tokens": 16, "guided_regex": "[a-c]{2}-[0-9]{2}"})" "\n"
      << R"({"custom_id": "choice", "prompt": "Lily", "max_tokens": 16, "guided_choice": ["yes", "no"]})" "\n"
      << R"({"custom_id": "bad", "prompt": "Tom", "guided_json": "{\"type\": \"object\", \"properties\": "})" "\n";
  CliRun r = run("run --quiet --model " + kModel + " --input " + (dir / "in.jsonl").string() + " --output " +
                 (dir / "out.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::map<std::string, nlohmann::json> out;
  std::ifstream in(dir / "out.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out[j["custom_id"].get<std::string>()] = j;
  }
  ASSERT_EQ(out.size(), 4u);
  const auto text = [&](const std::string& id) {
    return out[id]["response"]["body"]["choices"][0]["text"].get<std::string>();
  };
  const auto mood = nlohmann::json::parse(text("json"), nullptr, false);
  ASSERT_TRUE(mood.is_object()) << text("json");
  EXPECT_TRUE((mood == nlohmann::json{{"mood", "happy"}} || mood == nlohmann::json{{"mood", "sad"}})) << text("json");
  EXPECT_TRUE(std::regex_match(text("regex"), std::regex("[a-c]{2}-[0-9]{2}"))) << text("regex");
  EXPECT_TRUE(text("choice") == "yes" || text("choice") == "no") << text("choice");
  EXPECT_TRUE(out["bad"]["response"].is_null());
  EXPECT_EQ(out["bad"]["error"]["code"], "invalid_response_format") << out["bad"].dump();

  r = run("generate --model " + kModel + " --prompt 'Once upon a time' --max-tokens 16 --guided-regex '[0-9]{3}' --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto g = nlohmann::json::parse(r.out);
  EXPECT_TRUE(std::regex_match(g["text"].get<std::string>(), std::regex("[0-9]{3}"))) << r.out;
  EXPECT_EQ(g["finish_reason"], "stop");
  r = run("generate --model " + kModel + " --prompt x --guided-regex a --guided-choice b");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("give one of --guided-json"), std::string::npos) << r.out;
  r = run("generate --model " + kModel + " --prompt x --guided-regex '(ab'");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("invalid_response_format"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

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

// bench reports every decode phase with its own limit, and the GEMM peak of
// the run's weight dtype: BF16 runs are measured against Shardline's BF16
// linear (no library BF16 GEMM here), F32 against the better of it and
// OpenBLAS sgemm; the register-only instruction peak is reported beside them.
// Values are machine-dependent: only their presence and relations are checked.
TEST(CliE2e, BenchReportsEachDecodePhaseAgainstItsLimit) {
  for (const std::string dtype : {"bf16", "f32"}) {
    SCOPED_TRACE(dtype);
    const CliRun r = run("bench --model " + kModel + " --num-prompts 8 --input-len 16 --output-len 8 " +
                         "--max-batch 8 --threads 2 --dtype " + dtype + " --kv-cache-dtype " + dtype);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const std::string last = r.out.substr(r.out.rfind("\n{") == std::string::npos ? 0 : r.out.rfind("\n{") + 1);
    const auto j = nlohmann::json::parse(last.substr(0, last.find('\n')));
    EXPECT_EQ(j.at("dtype"), dtype == "bf16" ? "BF16" : "F32");
    for (const char* key : {"decode_step_ms", "decode_gemm_ms", "decode_gemm_limit_ms", "decode_attention_ms",
                            "decode_attention_limit_ms", "decode_attention_gbs", "decode_logits_ms",
                            "decode_logits_limit_ms", "fma_peak_gflops", "linear_gflops", "gemm_gflops",
                            "membw_gbs", "prefill_gflops", "prefill_peak_ratio", "prefill_gemm_phase_gflops",
                            "prefill_gemm_s", "prefill_attention_s", "roofline_total_tok_s"})
      EXPECT_GT(j.at(key).get<double>(), 0.0) << key;
    for (const char* key : {"decode_other_ms", "decode_sample_ms", "decode_schedule_ms", "decode_engine_other_ms"})
      EXPECT_GE(j.at(key).get<double>(), 0.0) << key;
    const double linear = j.at("linear_gflops"), openblas = j.at("openblas_gflops");
    EXPECT_DOUBLE_EQ(j.at("gemm_gflops").get<double>(), dtype == "bf16" ? linear : std::max(linear, openblas));
    // A phase's limit is below the whole step's roofline (it is one term of it).
    EXPECT_LE(j.at("decode_gemm_limit_ms").get<double>(), j.at("roofline_step_ms").get<double>() * (1 + 1e-9));
    EXPECT_EQ(j.at("quant_kernels"), "");
    EXPECT_EQ(j.at("linear_kernel"), kernels::cpu::linear_kernel_name(kernels::cpu::LinearKernel::automatic))
        << "the dense path that ran";
    EXPECT_EQ(j.at("attention_kernel"),
              kernels::cpu::attention_kernel_name(kernels::cpu::AttentionKernel::automatic))
        << "the attention path that ran";
    EXPECT_EQ(j.at("ops_kernel"), kernels::cpu::ops_kernel_name(kernels::cpu::OpsKernel::automatic))
        << "the RMSNorm / SiLU path that ran";
    EXPECT_EQ(j.at("gemm_format"), dtype == "bf16" ? "BF16" : "F32");
  }
}

// A quantized GGUF file under --dtype auto: the report names its formats
// and the kernel each runs, and its GEMM limit is the quantized linear
// layer's, measured on the format holding most weights (SmolLM2's Q4_1
// layers; its token table is Q8_0).
TEST(CliE2e, BenchOfAQuantizedFileReportsItsFormatsAndKernels) {
  const std::string smol = std::string(SHARDLINE_SOURCE_DIR) + "/models/smollm2-135m-instruct";
  const CliRun r = run("bench --model " + smol + " --num-prompts 4 --input-len 16 --output-len 4 --max-batch 4 " +
                       "--threads 2 --dtype auto --kv-cache-dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string last = r.out.substr(r.out.rfind("\n{") == std::string::npos ? 0 : r.out.rfind("\n{") + 1);
  const auto j = nlohmann::json::parse(last.substr(0, last.find('\n')));
  EXPECT_EQ(j.at("dtype"), "Q8_0+Q4_1");
  const std::string kernel = kernels::cpu::quant_kernel_name(kernels::GgmlType::q4_1);
  EXPECT_EQ(j.at("quant_kernels"), "Q8_0:" + kernel + "+Q4_1:" + kernel);
  EXPECT_EQ(j.at("gemm_format"), "Q4_1");
  EXPECT_GT(j.at("quant_linear_gflops").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j.at("gemm_gflops").get<double>(), j.at("quant_linear_gflops").get<double>());
}

// bench --shared-prefix-len (issue 42's workload): with
// --enable-prefix-caching the shared head's full blocks (16 tokens each) are
// computed once: every later request hits them and the model computes that
// many fewer positions; without it (bench's default) nothing is a hit.
TEST(CliE2e, BenchWithASharedPrefixCountsItsHitsWithCachingOnly) {
  std::map<bool, nlohmann::json> by_caching;
  for (const bool caching : {false, true}) {
    const CliRun r = run("bench --model " + kModel + " --num-prompts 8 --input-len 40 --shared-prefix-len 32 " +
                         "--output-len 4 --max-batch 2 --threads 2" + (caching ? " --enable-prefix-caching" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const std::string last = r.out.substr(r.out.rfind("\n{") == std::string::npos ? 0 : r.out.rfind("\n{") + 1);
    by_caching[caching] = nlohmann::json::parse(last.substr(0, last.find('\n')));
  }
  EXPECT_EQ(by_caching[false].at("prefix_caching"), false);
  EXPECT_EQ(by_caching[false].at("prefix_hit_tokens"), 0);
  const nlohmann::json& on = by_caching[true];
  EXPECT_EQ(on.at("prefix_caching"), true);
  EXPECT_EQ(on.at("shared_prefix_len"), 32);
  EXPECT_EQ(on.at("prefix_hit_tokens").get<long long>(), 7 * 32) << on.dump();
  EXPECT_EQ(by_caching[false].at("computed_tokens").get<long long>() - on.at("computed_tokens").get<long long>(),
            7 * 32);
  const CliRun bad = run("bench --model " + kModel + " --num-prompts 2 --input-len 8 --shared-prefix-len 8");
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find("--shared-prefix-len must be in [0, --input-len)"), std::string::npos) << bad.out;
}

// bench's other prefix workloads (issue 42): few-shot prompts from a small
// pool, and n samples of each prompt. The report carries the prompts' prefix
// tree (the ideal: each distinct prefix once) and what the steps computed;
// with caching the n copies of a prompt compute its full blocks once, and
// sorting the prompts by prefix never computes more than running them in
// input order. Bad workload flags are clear errors.
TEST(CliE2e, BenchFewShotAndNReportTheirPrefixTreeAndWhatTheyComputed) {
  const auto bench = [&](const std::string& flags) {
    const CliRun r = run("bench --model " + kModel + " --output-len 2 --max-batch 4 --threads 2 " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    const std::string last = r.out.substr(r.out.rfind("\n{") == std::string::npos ? 0 : r.out.rfind("\n{") + 1);
    return nlohmann::json::parse(last.substr(0, last.find('\n')));
  };
  // n = 4 copies of 3 prompts of 40 tokens: the tree holds each prompt once.
  const nlohmann::json n_off = bench("--num-prompts 3 --input-len 40 --n 4");
  const nlohmann::json n_on = bench("--num-prompts 3 --input-len 40 --n 4 --enable-prefix-caching");
  for (const nlohmann::json* j : {&n_off, &n_on}) {
    EXPECT_EQ(j->at("n"), 4);
    EXPECT_EQ(j->at("prefix_tree_tokens"), 3 * 40);
  }
  EXPECT_EQ(n_off.at("prefill_computed_tokens"), 12 * 40);
  // With caching each copy hits its prompt's 2 full blocks (32 tokens).
  EXPECT_EQ(n_on.at("prefix_hit_tokens"), 9 * 32) << n_on.dump();
  EXPECT_EQ(n_on.at("prefill_computed_tokens"), 12 * 40 - 9 * 32);
  EXPECT_NEAR(n_on.at("prefill_over_ideal").get<double>(), (12.0 * 40 - 9 * 32) / (3 * 40) - 1, 1e-9);
  // 3-shot prompts from a pool of 4 examples of 16 tokens + an 8-token question.
  std::map<std::string, nlohmann::json> few;
  for (const std::string order : {"input", "sorted"})
    few[order] = bench("--num-prompts 12 --input-len 56 --few-shot 3 --few-shot-pool 4 --few-shot-len 16 "
                       "--enable-prefix-caching --prefix-order " + order);
  EXPECT_EQ(few["input"].at("prefix_tree_tokens"), few["sorted"].at("prefix_tree_tokens"));
  EXPECT_LT(few["input"].at("prefix_tree_tokens").get<long long>(), 12 * 56) << "the pool makes prefixes repeat";
  EXPECT_EQ(few["sorted"].at("prefix_order"), "sorted");
  EXPECT_GE(few["sorted"].at("prefill_computed_tokens").get<long long>(),
            few["sorted"].at("prefix_tree_tokens").get<long long>());
  EXPECT_LE(few["sorted"].at("prefill_computed_tokens").get<long long>(),
            few["input"].at("prefill_computed_tokens").get<long long>());
  for (const std::string& flags : {std::string("--few-shot 3 --few-shot-pool 2"), std::string("--n 0"),
                                   std::string("--prefix-order random")}) {
    const CliRun bad = run("bench --model " + kModel + " --num-prompts 2 --input-len 56 " + flags);
    EXPECT_EQ(bad.exit_code, 1) << flags << ": " << bad.out;
    EXPECT_NE(bad.out.find("bench: --"), std::string::npos) << bad.out;
  }
}

TEST(CliE2e, TokenizeJson) {
  const CliRun r = run("tokenize --tokenizer " + std::string(SHARDLINE_SHARED_DIR) +
                    "/tokenizers/qwen3 --text 'Hello, my dog is cute' --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "{\"token_ids\":[9707,11,847,5562,374,18838]}\n");
}

// tokenize --messages renders the model's chat template (each golden case of
// Qwen3 and Llama 3.1 exactly) and encodes the prompt without added
// specials; a folder without a template, a bad messages file and a
// template's raise_exception are clear errors.
TEST(CliE2e, TokenizeMessagesRendersTheChatTemplate) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardline_cli_messages_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string shared = SHARDLINE_SHARED_DIR;
  for (const char* name : {"qwen3", "llama3_1"}) {
    std::ifstream in(shared + "/tokenizers/" + name + "/chat_template_golden.json");
    const auto golden = nlohmann::ordered_json::parse(in);
    int k = 0;
    for (const auto& c : golden["cases"]) {
      const fs::path file = dir / (std::string(name) + std::to_string(k++) + ".json");
      nlohmann::ordered_json doc = {{"messages", c["messages"]}};
      if (c.contains("enable_thinking")) doc["chat_template_kwargs"] = {{"enable_thinking", c["enable_thinking"]}};
      std::ofstream(file) << doc.dump();
      const CliRun r = run("tokenize --tokenizer " + shared + "/tokenizers/" + name + " --messages " + file.string() +
                           (c["add_generation_prompt"].get<bool>() ? " --add-generation-prompt" : "") + " --json");
      ASSERT_EQ(r.exit_code, 0) << r.out;
      const auto out = nlohmann::json::parse(r.out);
      EXPECT_EQ(out["prompt"], c["text"]) << name << " case " << k;
      EXPECT_FALSE(out["token_ids"].empty());
    }
  }
  // The Qwen3 prompt's ids: the chat markers are its special tokens.
  std::ofstream(dir / "hi.json") << R"([{"role": "user", "content": "Hi"}])";
  CliRun r = run("tokenize --tokenizer " + shared + "/tokenizers/qwen3 --messages " + (dir / "hi.json").string() +
                 " --add-generation-prompt --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out,
            "{\"prompt\":\"<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n\",\"token_ids\":[151644,872,198,"
            "13048,151645,198,151644,77091,198]}\n");
  // Llama 2's folder has no template: chat_template_missing, unless --chat-template.
  r = run("tokenize --tokenizer " + shared + "/tokenizers/llama2 --messages " + (dir / "hi.json").string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("chat_template_missing"), std::string::npos) << r.out;
  std::ofstream(dir / "t.jinja") << "{% for m in messages %}{% if m.role != 'user' %}"
                                    "{{ raise_exception('only user turns here') }}{% endif %}[{{ m.content }}]{% endfor %}";
  r = run("tokenize --tokenizer " + shared + "/tokenizers/llama2 --messages " + (dir / "hi.json").string() +
          " --chat-template " + (dir / "t.jinja").string() + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"prompt\":\"[Hi]\""), std::string::npos) << r.out;
  std::ofstream(dir / "sys.json") << R"({"messages": [{"role": "system", "content": "S"}]})";
  r = run("tokenize --tokenizer " + shared + "/tokenizers/llama2 --messages " + (dir / "sys.json").string() +
          " --chat-template " + (dir / "t.jinja").string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("only user turns here"), std::string::npos) << r.out;
  std::ofstream(dir / "bad.json") << R"({"msgs": []})";
  r = run("tokenize --tokenizer " + shared + "/tokenizers/qwen3 --messages " + (dir / "bad.json").string());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("expected {\"messages\": [...]}"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// generate --messages: the conversation rendered with --chat-template, the
// same prompt ids `tokenize --messages` gives, run with the --prompt ones.
TEST(CliE2e, GenerateMessagesRendersTheChatTemplate) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardline_cli_gen_messages_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "t.jinja") << "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                                    "{% if add_generation_prompt %}assistant:{% endif %}";
  std::ofstream(dir / "m.json") << R"({"messages": [{"role": "user", "content": "Tell me about Lily."}]})";
  const std::string tpl = " --chat-template " + (dir / "t.jinja").string();
  CliRun tok = run("tokenize --tokenizer " + kModel + " --messages " + (dir / "m.json").string() +
                   " --add-generation-prompt --json" + tpl);
  ASSERT_EQ(tok.exit_code, 0) << tok.out;
  const auto want = nlohmann::json::parse(tok.out);
  CliRun gen = run("generate --model " + kModel + " --prompt Hello --messages " + (dir / "m.json").string() + tpl +
                   " --max-tokens 4 --temperature 0 --json");
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  std::istringstream lines(gen.out);
  std::string first, second;
  std::getline(lines, first);
  std::getline(lines, second);
  const auto chat = nlohmann::json::parse(second);
  EXPECT_EQ(nlohmann::json::parse(first)["prompt"], "Hello");
  EXPECT_EQ(chat["prompt"], want["prompt"]);
  EXPECT_EQ(chat["prompt_token_ids"], want["token_ids"]);
  EXPECT_EQ(chat["token_ids"].size(), 4u);
  // No template in the folder and none given; no prompt at all.
  CliRun missing = run("generate --model " + kModel + " --messages " + (dir / "m.json").string());
  EXPECT_EQ(missing.exit_code, 1) << missing.out;
  EXPECT_NE(missing.out.find("chat_template_missing"), std::string::npos) << missing.out;
  CliRun none = run("generate --model " + kModel);
  EXPECT_EQ(none.exit_code, 2) << none.out;
  EXPECT_NE(none.out.find("--prompt or --messages"), std::string::npos) << none.out;
  fs::remove_all(dir);
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

// generate --weight-sharing sidp: the JSON lines of a SiDP group (WaS, CaS,
// auto) are those of one device, in one process and with rank 1 a
// `shard serve --weight-sharing sidp` process.
TEST(CliE2e, GenerateOverASidpGroupMatchesOneDevice) {
  const std::string args = "generate --model " + kModel +
                           " --prompt 'Once upon a time' --prompt 'Lily wanted to' --prompt 'The dog' "
                           "--max-tokens 24 --temperature 0 --json --threads 1";
  const CliRun single = run(args);
  ASSERT_EQ(single.exit_code, 0) << single.out;
  for (const std::string mode : {"was", "cas"}) {
    const CliRun r = run(args + " --weight-sharing sidp --parallel dp=2 --sidp-mode " + mode);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(r.out, single.out) << mode;
  }
  const std::string master = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  const std::string log = (std::filesystem::temp_directory_path() / ("sidp_rank1_" + std::to_string(getpid()))).string();
  testing_support::Child rank1({kBin, "shard", "serve", "--weight-sharing", "sidp", "--parallel", "dp=2", "--rank", "1",
                                "--group-master", master, "--model", kModel, "--threads", "1"},
                               log);
  const CliRun r = run(args + " --weight-sharing sidp --parallel dp=2 --sidp-mode auto --sidp-switch-batch 4 "
                             "--sidp-min-dwell 0 --group-master " + master);
  ASSERT_EQ(r.exit_code, 0) << r.out << "\nrank 1:\n" << rank1.log();
  // stderr says where rank 0 waits and when the group switched; stdout is one device's.
  std::string json_lines;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') json_lines += line + "\n";
  EXPECT_EQ(json_lines, single.out);
  EXPECT_NE(r.out.find("SiDP switched to cas"), std::string::npos) << r.out;
  EXPECT_EQ(rank1.wait_or_kill(std::chrono::seconds(30)), 0) << rank1.log();
  std::filesystem::remove(log);
}

TEST(CliE2e, SidpFlagErrorsAreUsageErrors) {
  CliRun r = run("generate --model " + kModel + " --prompt hi --parallel dp=2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("need --weight-sharing sidp"), std::string::npos) << r.out;
  r = run("generate --model " + kModel + " --prompt hi --weight-sharing sidp --parallel tp=2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--parallel dp=N"), std::string::npos) << r.out;
  r = run("generate --model " + kModel + " --prompt hi --weight-sharing sidp --parallel dp=2 --sidp-ownership 0,1,2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("invalid_argument"), std::string::npos) << r.out;
  r = run("shard serve --model " + kModel + " --weight-sharing sidp --parallel tp=2 --rank 1 --group-master 127.0.0.1:9");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("dp=N"), std::string::npos) << r.out;
  r = run("shard serve --model " + kModel + " --weight-sharing sidp --parallel dp=2 --rank 2 --group-master 127.0.0.1:9");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--rank must be in [1, 2)"), std::string::npos) << r.out;
}

TEST(CliE2e, BadFlagsAreUsageErrors) {
  CliRun r = run("generate --model " + kModel + " --prompt hi --dtype f8");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--dtype"), std::string::npos) << r.out;
  r = run("generate --model " + kModel + " --prompt hi --top-p 1.5");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("top_p"), std::string::npos) << r.out;
  r = run("generate --model " + kModel + " --prompt hi --preemption-mode spill");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--preemption-mode"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recompute or swap"), std::string::npos) << r.out;
  r = run("generate --model " + kModel + " --prompt hi --swap-space -1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--swap-space"), std::string::npos) << r.out;
}

// bench --seesaw: a malformed pair, ratio or size, or --parallel beside it, is
// a usage error naming the flag; options the bench refuses exit 1 with its
// reason. All fail before anything is measured.
TEST(CliE2e, BenchSeesawFlagErrorsAreUsageErrors) {
  struct Case {
    std::string flags;
    int exit_code;
    std::vector<std::string> words;
  };
  const Case cases[] = {
      {"--seesaw pp=2", 2, {"CP:CD"}},
      {"--seesaw pp=2:tp=2 --seesaw-ratios 1024", 2, {"--seesaw-ratios: a ratio is INPUT/OUTPUT", "got '1024'"}},
      {"--seesaw pp=2:tp=2 --host-kv-bytes 12Q", 2, {"--host-kv-bytes"}},
      {"--seesaw pp=2:tp=2 --reshard-weights lazy", 2, {"--reshard-weights must be resident or reload"}},
      {"--seesaw pp=2:tp=2 --parallel tp=2", 2, {"not --parallel"}},
      {"--seesaw tp=2:tp=2", 1, {"bench --seesaw: cp and cd must differ"}},
  };
  for (const Case& c : cases) {
    const CliRun r = run("bench --model " + kModel + " " + c.flags);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.flags << "\n" << r.out;
    for (const std::string& w : c.words) EXPECT_NE(r.out.find(w), std::string::npos) << c.flags << "\n" << r.out;
  }
}

// --device-memory on the CPU device: too small is refused with the sizes; a
// budget that fits generates the reference story; a malformed size is a
// usage error.
TEST(CliE2e, DeviceMemoryIsPlannedOrRefusedWithTheSizes) {
  CliRun r = run("generate --model " + kModel + " --prompt hi --device-memory 1M");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("model weights need 1015.75 KiB (plus activations 7.03 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--device-memory is 1.00 MiB (1048576 bytes)"), std::string::npos) << r.out;
  r = run("generate --model " + kModel +
          " --prompt 'Once upon a time' --max-tokens 48 --temperature 0 --device-memory 16MiB");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out,
            "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
            "park. One day, she saw a big, red ball. She wanted to play with it,\n");
  r = run("generate --model " + kModel + " --prompt hi --device-memory 12X");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--device-memory: size '12X': unknown unit"), std::string::npos) << r.out;
}

bool have_cuda_device() {
#if SHARDLINE_HAVE_CUDA
  return !kernels::cuda::query_devices().devices.empty();
#else
  return false;
#endif
}

// Without a GPU (or without the CUDA backend), a cuda device is refused with
// the reason before anything is created (issue 46, item 14: it used to
// leave an empty output and a data dir behind a buried "no worker could
// start its engine"), and bad device lists are usage errors.
TEST(CliE2e, CudaDeviceWithoutAGpuIsAClearError) {
  if (have_cuda_device()) GTEST_SKIP() << "a CUDA device is present: tests/cli/cuda_run_gpu_test.cpp runs it";
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("shardline_cli_cuda_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream in(dir / "in.jsonl");
    in << R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"Once","max_tokens":4}})" << "\n";
  }
  const std::string io = " --input " + (dir / "in.jsonl").string() + " --output " + (dir / "out.jsonl").string();
  CliRun r = run("run --model " + kModel + io + " --devices cuda:0 --quiet");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("cuda:0"), std::string::npos) << r.out;
  EXPECT_TRUE(r.out.find("no CUDA device") != std::string::npos ||
              r.out.find("no CUDA backend") != std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("cannot start its engine"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out.jsonl")) << "an output file without a worker";
  EXPECT_FALSE(fs::exists(dir / "out.jsonl.shardline")) << "a data dir without a worker";

  r = run("generate --model " + kModel + " --prompt hi --device cuda:0");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("cuda:0"), std::string::npos) << r.out;

  r = run("run --model " + kModel + io + " --devices cuda:x --quiet");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("cuda:LIST"), std::string::npos) << r.out;
  // One GPU for two ranks that each need their own: the count, and how to share one.
  r = run("run --model " + kModel + io + " --devices cuda:0 --parallel tp=2 --quiet");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("needs tp*pp*sp*dp = 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cuda:0x2"), std::string::npos) << r.out;
  // Two ranks sharing GPU 0, or on GPUs 0 and 1, are accepted, and fail where a GPU is needed.
  for (const char* devices : {"cuda:0x2", "cuda:0,1"}) {
    r = run("run --model " + kModel + io + " --devices " + devices + " --parallel tp=2 --quiet");
    EXPECT_EQ(r.exit_code, 1) << devices << ": " << r.out;
    EXPECT_NE(r.out.find("cannot start its engine"), std::string::npos) << r.out;
    EXPECT_TRUE(r.out.find("no CUDA device") != std::string::npos ||
                r.out.find("no CUDA backend") != std::string::npos)
        << r.out;
  }
  r = run("generate --model " + kModel + " --prompt hi --dtype f16");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--dtype f16 is for CUDA devices"), std::string::npos) << r.out;
  r = run("generate --model " + kModel + " --prompt hi --device gpu0");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--device must be cpu or cuda:N"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardline
