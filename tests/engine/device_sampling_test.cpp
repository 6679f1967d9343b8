// The engine's device-sampling path (ModelExecutor::samples_on_device): the
// engine hands the executor one RowSampling per logits row and takes the ids
// it returns. Driven here by a CPU executor that "samples on its device" with
// sampling::sample, so the outputs must be byte-identical to the engine
// sampling the same logits itself; capture_logits keeps host sampling.
#include <gtest/gtest.h>

#include <map>

#include "engine/group/engine_builder.hpp"
#include "tests/support/engine_runs.hpp"
#include "tests/support/sampling_executor.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::engine {
namespace engine_device_sampling_test {

using testing_support::SamplingExecutor;

EngineInstance make_engine() {
  EngineOptions o;
  o.model_dir = testing_support::kStoriesDir;
  o.kv_cache_bytes = 8u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 64;
  auto e = build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  return std::move(e).value();
}

std::map<std::uint64_t, RequestOutput> run(LlmEngine& engine, const text::Tokenizer& tok) {
  const auto params = testing_support::mixed_sampling_params(12, 24);
  const char* prompts[] = {"Once upon a time", "The dog", "Lily and Ben", "One day a bird"};
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(engine.add_request(i, tok.encode(prompts[i % 4], true), params[i]).ok());
  return testing_support::run_all(engine);
}

TEST(DeviceSampling, EngineUsesTheExecutorsIdsAndGetsTheSameOutputs) {
  EngineInstance host = make_engine();
  const auto expected = run(*host.engine, *host.tokenizer);
  ASSERT_EQ(expected.size(), 12u);

  EngineInstance dev = make_engine();
  SamplingExecutor exec(*dev.executor);
  EngineConfig cfg = dev.engine->config();
  auto engine = LlmEngine::create(exec, *dev.tokenizer, cfg);
  ASSERT_TRUE(engine.ok());
  const auto got = run(**engine, *dev.tokenizer);
  EXPECT_GT(exec.sampled_steps_, 0);
  EXPECT_EQ(exec.logits_steps_, 0) << "every step with logits rows should be sampled by the executor";
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [id, out] : expected) {
    EXPECT_EQ(got.at(id).token_ids, out.token_ids) << "request " << id;
    EXPECT_EQ(got.at(id).text, out.text) << "request " << id;
    EXPECT_EQ(got.at(id).finish_reason, out.finish_reason) << "request " << id;
  }
}

TEST(DeviceSampling, CaptureLogitsKeepsSamplingOnTheHost) {
  EngineInstance dev = make_engine();
  SamplingExecutor exec(*dev.executor);
  EngineConfig cfg = dev.engine->config();
  cfg.capture_logits = true;
  auto engine = LlmEngine::create(exec, *dev.tokenizer, cfg);
  ASSERT_TRUE(engine.ok());
  const auto got = run(**engine, *dev.tokenizer);
  EXPECT_EQ(exec.sampled_steps_, 0);
  EXPECT_GT(exec.logits_steps_, 0);
  for (const auto& [id, out] : got) EXPECT_EQ(out.logits.size(), out.token_ids.size()) << id;
}

// A micro-batch with a row that asks for logprobs needs the logits on the
// host: it samples there; the others still sample on the device.
TEST(DeviceSampling, ALogprobsRowSamplesItsMicroBatchOnTheHost) {
  EngineInstance dev = make_engine();
  SamplingExecutor exec(*dev.executor);
  auto engine = LlmEngine::create(exec, *dev.tokenizer, dev.engine->config());
  ASSERT_TRUE(engine.ok());
  sampling::SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = 6;
  p.ignore_eos = true;
  ASSERT_TRUE((*engine)->add_request(1, dev.tokenizer->encode("Once upon a time", true), p).ok());
  auto first = testing_support::run_all(**engine);
  EXPECT_GT(exec.sampled_steps_, 0);
  EXPECT_EQ(exec.logits_steps_, 0);
  EXPECT_TRUE(first.at(1).logprobs.empty());
  p.logprobs = 2;
  ASSERT_TRUE((*engine)->add_request(2, dev.tokenizer->encode("Once upon a time", true), p).ok());
  auto second = testing_support::run_all(**engine);
  EXPECT_EQ(exec.logits_steps_, 6);
  EXPECT_EQ(second.at(2).token_ids, first.at(1).token_ids);
  ASSERT_EQ(second.at(2).logprobs.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(second.at(2).logprobs[i].sampled.token_id, second.at(2).token_ids[i]);
}

/// An executor that returns the wrong number of ids is an internal error, not a crash.
TEST(DeviceSampling, WrongNumberOfIdsIsAnError) {
  class Broken final : public model::ModelExecutor {
   public:
    explicit Broken(model::ModelExecutor& inner) : inner_(inner) {}
    Result<model::StepOutput> execute(const model::StepInput& in) override {
      auto r = inner_.execute(in);
      if (!r.ok()) return r;
      model::StepOutput out;
      out.vocab_size = r->vocab_size;
      out.sampled_token_ids.assign(static_cast<std::size_t>(in.num_logits()) + 1, 0);
      return out;
    }
    int vocab_size() const override { return inner_.vocab_size(); }
    int num_kv_blocks() const override { return inner_.num_kv_blocks(); }
    int block_size() const override { return inner_.block_size(); }
    bool samples_on_device() const override { return true; }
    model::ModelExecutor& inner_;
  };
  EngineInstance dev = make_engine();
  Broken exec(*dev.executor);
  auto engine = LlmEngine::create(exec, *dev.tokenizer, dev.engine->config());
  ASSERT_TRUE(engine.ok());
  sampling::SamplingParams p;
  ASSERT_TRUE((*engine)->add_request(1, dev.tokenizer->encode("Once", true), p).ok());
  auto step = (*engine)->step();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.error().code, ErrorCode::internal);
  EXPECT_NE(step.error().message.find("sampled ids"), std::string::npos) << step.error().message;
}

}  // namespace
}  // namespace shardline::engine
