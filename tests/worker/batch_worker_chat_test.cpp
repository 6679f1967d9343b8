// BatchWorker with the OpenAI fields beyond plain completions, over the
// shipped stories260K model: chat lines rendered with a template, the
// per-line template errors, max_tokens up to the context's end, logprobs
// with token texts, echo, and a logprobs line that never resumes from
// tokens whose logprobs were lost.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "text/bpe_tokenizer.hpp"
#include "model/tokenizer_loader.hpp"
#include "text/chat_template.hpp"
#include "tests/support/stories_reference.hpp"
#include "worker/batch_worker.hpp"

namespace shardline::worker {
namespace worker_batch_worker_chat_test {

using testing_support::kStoriesDir;
using Key = std::pair<std::uint64_t, std::uint64_t>;

/// A template in the Llama 2 style that stories260K's tokenizer can encode
/// (its sentencepiece model reads no special tokens from text).
constexpr const char* kTemplate =
    "{% for m in messages %}{% if m['role'] == 'system' %}[SYS] {{ m['content'] | trim }}\n"
    "{% elif m['role'] == 'user' %}Q: {{ m['content'] | trim }}\n{% else %}A: {{ m['content'] | trim }}\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}";

BatchWorker make_worker() {
  engine::EngineOptions o;
  o.model_dir = kStoriesDir;
  o.block_size = 16;
  o.kv_cache_bytes = 4u << 20;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 256;
  o.num_threads = 1;
  o.check_integrity = true;
  auto e = engine::build_engine(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  auto w = BatchWorker::create(std::move(e).value(), "cpu0");
  EXPECT_TRUE(w.ok());
  return std::move(w).value();
}

BatchRequest chat_line(std::uint64_t index, std::string messages_json, int max_tokens = 24) {
  BatchRequest r;
  r.job_id = 1;
  r.line_index = index;
  r.custom_id = "c" + std::to_string(index);
  r.chat = true;
  r.messages_json = std::move(messages_json);
  r.chat_template = kTemplate;
  r.params.temperature = 0.0f;
  r.params.max_tokens = max_tokens;
  r.return_token_ids = true;
  return r;
}

BatchRequest text_line(std::uint64_t index, std::string prompt, int max_tokens = 24) {
  BatchRequest r;
  r.job_id = 1;
  r.line_index = index;
  r.custom_id = "t" + std::to_string(index);
  r.prompt = std::move(prompt);
  r.params.temperature = 0.0f;
  r.params.max_tokens = max_tokens;
  r.return_token_ids = true;
  return r;
}

std::map<Key, BatchResult> run_all(BatchWorker& w) {
  std::map<Key, BatchResult> out;
  while (w.has_work()) {
    auto r = w.step();
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    if (!r.ok()) break;
    for (BatchResult& res : r.value()) {
      EXPECT_EQ(out.count({res.job_id, res.line_index}), 0u);
      out[{res.job_id, res.line_index}] = std::move(res);
    }
  }
  return out;
}

const std::string kConversation =
    R"([{"role":"system","content":"  Tell a story. "},{"role":"user","content":"Once upon a time"}])";

TEST(BatchWorkerChat, ChatLineIsItsRenderedPromptTokenizedWithoutSpecials) {
  BatchWorker w = make_worker();
  // The rendering, as the template gives it.
  auto tpl = model::chat_template_from_source(kStoriesDir, kTemplate, "test");
  ASSERT_TRUE(tpl.ok()) << tpl.error().to_string();
  auto rendered = tpl->render(nlohmann::ordered_json::parse(kConversation), true);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(*rendered, "[SYS] Tell a story.\nQ: Once upon a time\nA:");
  const std::vector<std::int32_t> ids = w.tokenizer().encode(*rendered, /*add_special_tokens=*/false);
  ASSERT_NE(ids.front(), w.tokenizer().bos_token_id());

  w.submit(chat_line(0, kConversation));
  BatchRequest same = text_line(1, "");
  same.prompt_token_ids = ids;  // the same tokens as a completions line
  w.submit(same);
  auto out = run_all(w);
  ASSERT_EQ(out.size(), 2u);
  const BatchResult& chat = out.at({1, 0});
  ASSERT_TRUE(chat.ok) << chat.error_code << ": " << chat.error_message;
  EXPECT_TRUE(chat.chat);
  EXPECT_FALSE(out.at({1, 1}).chat);
  EXPECT_EQ(chat.prompt_tokens, static_cast<int>(ids.size()));
  EXPECT_EQ(chat.choices.at(0).token_ids, out.at({1, 1}).choices.at(0).token_ids);
  EXPECT_EQ(chat.choices.at(0).text, out.at({1, 1}).choices.at(0).text);
  EXPECT_FALSE(chat.choices.at(0).text.empty());

  // Without a generation prompt the rendering (and so the prompt) differs.
  BatchRequest no_gen = chat_line(2, kConversation);
  no_gen.add_generation_prompt = false;
  w.submit(no_gen);
  auto out2 = run_all(w);
  EXPECT_EQ(out2.at({1, 2}).prompt_tokens,
            static_cast<int>(w.tokenizer().encode("[SYS] Tell a story.\nQ: Once upon a time\n", false).size()));
}

TEST(BatchWorkerChat, TemplateProblemsArePerLineErrorsAndTheRestCompletes) {
  BatchWorker w = make_worker();
  BatchRequest missing = chat_line(0, kConversation);
  missing.chat_template.clear();  // stories260K's folder has no chat template
  w.submit(missing);
  BatchRequest raising = chat_line(1, R"([{"role":"tool","content":"x"}])");
  raising.chat_template =
      "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
      "{{ raise_exception('Conversation roles must be user or assistant') }}{% endif %}{% endfor %}";
  w.submit(raising);
  BatchRequest broken = chat_line(2, kConversation);
  broken.chat_template = "{% for m in messages %}{{ m.content }";
  w.submit(broken);
  w.submit(chat_line(3, kConversation));
  w.submit(text_line(4, "Once upon a time"));
  auto out = run_all(w);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out.at({1, 0}).error_code, "chat_template_missing");
  EXPECT_NE(out.at({1, 0}).error_message.find("--chat-template"), std::string::npos) << out.at({1, 0}).error_message;
  EXPECT_EQ(out.at({1, 1}).error_code, "chat_template_error");
  EXPECT_NE(out.at({1, 1}).error_message.find("Conversation roles must be user or assistant"), std::string::npos)
      << out.at({1, 1}).error_message;
  EXPECT_EQ(out.at({1, 2}).error_code, "chat_template_error");
  EXPECT_NE(out.at({1, 2}).error_message.find("line 1"), std::string::npos) << out.at({1, 2}).error_message;
  EXPECT_TRUE(out.at({1, 3}).ok);
  EXPECT_TRUE(out.at({1, 4}).ok);
  EXPECT_EQ(out.at({1, 3}).custom_id, "c3");
}

TEST(BatchWorkerChat, WithoutMaxTokensAChatLineMayRunToTheContextEnd) {
  BatchWorker w = make_worker();
  BatchRequest r = chat_line(0, kConversation);
  r.max_tokens_from_context = true;
  r.params.max_tokens = std::numeric_limits<int>::max();
  r.params.ignore_eos = true;
  w.submit(r);
  auto out = run_all(w);
  const BatchResult& res = out.at({1, 0});
  ASSERT_TRUE(res.ok) << res.error_message;
  const int max_model_len = w.engine().config().max_model_len;
  EXPECT_EQ(res.prompt_tokens + res.completion_tokens, max_model_len);
  EXPECT_EQ(res.choices.at(0).finish_reason, "length");
}

TEST(BatchWorkerChat, LogprobsCarryTokenTextsAndOffsets) {
  BatchWorker w = make_worker();
  BatchRequest r = text_line(0, "Once upon a time");
  r.params.logprobs = 3;
  w.submit(r);
  BatchRequest plain = text_line(1, "Once upon a time");
  w.submit(plain);
  auto out = run_all(w);
  const BatchChoice& c = out.at({1, 0}).choices.at(0);
  EXPECT_EQ(out.at({1, 0}).logprobs, 3);
  EXPECT_EQ(out.at({1, 1}).logprobs, -1);
  EXPECT_TRUE(out.at({1, 1}).choices.at(0).logprobs.empty());
  EXPECT_EQ(c.token_ids, out.at({1, 1}).choices.at(0).token_ids);  // asking changes no token
  ASSERT_EQ(c.logprobs.size(), c.token_ids.size());
  int offset = 0;
  std::string joined;
  for (std::size_t i = 0; i < c.logprobs.size(); ++i) {
    const ChoiceTokenLogprobs& t = c.logprobs[i];
    EXPECT_EQ(t.sampled.bytes, w.tokenizer().token_bytes(c.token_ids[i]));
    EXPECT_EQ(t.sampled.token, text::utf8_lossy(t.sampled.bytes));
    EXPECT_LE(t.sampled.logprob, 0.0f);
    ASSERT_EQ(t.top.size(), 3u);
    // Greedy: the drawn token is the most likely one.
    EXPECT_EQ(t.top[0].token, t.sampled.token);
    EXPECT_EQ(t.top[0].logprob, t.sampled.logprob);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_GE(t.top[1].logprob, t.top[2].logprob);
    EXPECT_EQ(t.text_offset, offset);
    offset += static_cast<int>(t.sampled.token.size());  // stories' tokens are ASCII
    joined += t.sampled.token;
  }
  // The tokens' texts make the text (the sentencepiece decoder drops the
  // first token's leading space; a final EOS adds its "</s>").
  EXPECT_NE(joined.find(c.text.substr(0, 10)), std::string::npos) << joined << " vs " << c.text;
}

TEST(BatchWorkerChat, EchoPutsThePromptTextFirst) {
  BatchWorker w = make_worker();
  BatchRequest r = text_line(0, "Once upon a time");
  r.echo = true;
  w.submit(r);
  w.submit(text_line(1, "Once upon a time"));
  BatchRequest ids = text_line(2, "");
  ids.prompt_token_ids = w.tokenizer().encode("Once upon a time", true);
  ids.echo = true;
  w.submit(ids);
  auto out = run_all(w);
  EXPECT_EQ(out.at({1, 0}).choices.at(0).text, "Once upon a time" + out.at({1, 1}).choices.at(0).text);
  EXPECT_EQ(out.at({1, 2}).choices.at(0).text, "Once upon a time" + out.at({1, 1}).choices.at(0).text);
  EXPECT_EQ(out.at({1, 0}).completion_tokens, out.at({1, 1}).completion_tokens);
}

TEST(BatchWorkerChat, ALogprobsLineGivenAResumeStartsFromItsPrompt) {
  BatchWorker fresh = make_worker();
  BatchRequest r = text_line(0, "Once upon a time");
  r.params.logprobs = 1;
  r.params.temperature = 0.8f;
  r.params.seed = 9;
  r.params.has_seed = true;
  fresh.submit(r);
  const BatchResult want = run_all(fresh).at({1, 0});
  ASSERT_TRUE(want.ok);

  BatchWorker resumed = make_worker();
  BatchRequest again = r;
  // Tokens from before a failure (without their logprobs) and no KV.
  const auto& ids = want.choices.at(0).token_ids;
  again.resume = {ChoiceResume{{ids.begin(), ids.begin() + 5}, 0, {}}};
  resumed.submit(again);
  const BatchResult got = run_all(resumed).at({1, 0});
  ASSERT_TRUE(got.ok);
  EXPECT_EQ(got.choices.at(0).token_ids, want.choices.at(0).token_ids);
  EXPECT_EQ(got.choices.at(0).logprobs, want.choices.at(0).logprobs);
  EXPECT_EQ(resumed.status().kv_restored_tokens, 0u);
}

}  // namespace
}  // namespace shardline::worker
