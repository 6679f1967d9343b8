// A chat job end to end through `shardline run --chat-template`: chat lines
// rendered with the job's template answer as chat.completion objects, equal
// to the completions line of the same tokens (`shardline tokenize
// --messages` gives them); a template error is one line's error; the
// completions fields echo, logprobs, n and stop lists in the same job; and
// the whole output is byte-identical on a second run and at another batch
// size.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_chat_job_e2e_test {

using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;
using json = nlohmann::json;

using ChatJobE2e = testing_support::TempDirTest;

std::vector<json> read_jsonl(const std::string& file) {
  std::vector<json> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

constexpr const char* kTemplate =
    "{%- for m in messages -%}\n"
    "  {%- if m['role'] not in ['system', 'user', 'assistant'] -%}\n"
    "    {{ raise_exception('Conversation roles must be system, user or assistant') }}\n"
    "  {%- endif -%}\n"
    "  {{ m['role'] | upper }}: {{ m['content'] | trim }}\n"
    "{% endfor -%}\n"
    "{%- if add_generation_prompt %}ASSISTANT:{% endif -%}\n";

TEST_F(ChatJobE2e, ChatAndCompletionsFieldsInOneJob) {
  std::ofstream(path("chat.jinja")) << kTemplate;
  const json messages = json::array({{{"role", "system"}, {"content", "You tell stories."}},
                                     {{"role", "user"}, {"content", "Tell me about Lily."}}});
  std::ofstream(path("messages.json")) << json{{"messages", messages}}.dump();
  const auto tok = run_command(kShardline + " tokenize --tokenizer " + testing_support::kStoriesDir + " --messages " +
                               path("messages.json") + " --add-generation-prompt --chat-template " +
                               path("chat.jinja") + " --json");
  ASSERT_EQ(tok.exit_code, 0) << tok.out;
  const json rendered = json::parse(tok.out);
  EXPECT_EQ(rendered["prompt"], "SYSTEM: You tell stories.\nUSER: Tell me about Lily.\nASSISTANT:");
  const auto ids = rendered["token_ids"].get<std::vector<int>>();

  {
    std::ofstream in(path("in.jsonl"));
    auto line = [&](const std::string& id, const std::string& url, json body) {
      in << json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", std::move(body)}}.dump() << "\n";
    };
    line("chat", "/v1/chat/completions",
         {{"model", "stories260K"}, {"messages", messages}, {"max_completion_tokens", 12}, {"temperature", 0},
          {"logprobs", true}, {"top_logprobs", 2}});
    line("same-ids", "/v1/completions", {{"prompt", ids}, {"max_tokens", 12}, {"temperature", 0}});
    line("bad-role", "/v1/chat/completions",
         {{"messages", json::array({{{"role", "tool"}, {"content", "x"}}})}, {"max_tokens", 4}});
    line("echo", "/v1/completions", {{"prompt", "Lily wanted to"}, {"max_tokens", 8}, {"temperature", 0}, {"echo", true}});
    line("n3", "/v1/completions",
         {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"n", 3}, {"seed", 5}, {"logprobs", 1},
          {"stop", json::array({".", "!"})}});
    line("chat-n2", "/v1/chat/completions",
         {{"messages", messages}, {"max_tokens", 6}, {"n", 2}, {"seed", 11}, {"temperature", 1.0}});
  }
  const std::string base = kShardline + " run --quiet --model " + testing_support::kStoriesDir +
                           " --chat-template " + path("chat.jinja") + " --input " + path("in.jsonl");
  const auto r = run_command(base + " --output " + path("out.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto lines = read_jsonl(path("out.jsonl"));
  ASSERT_EQ(lines.size(), 6u);

  // The chat line: a chat.completion with the same text and prompt tokens as
  // the completions line of the template's tokens.
  const json& chat = lines[0]["response"]["body"];
  ASSERT_TRUE(lines[0]["error"].is_null()) << lines[0].dump();
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(lines[0]["response"]["request_id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  const json& msg = chat["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  const json& same = lines[1]["response"]["body"];
  EXPECT_EQ(msg["content"], same["choices"][0]["text"]);
  EXPECT_EQ(chat["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(same["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(chat["usage"]["completion_tokens"], same["usage"]["completion_tokens"]);
  // Its logprobs: one entry per generated token, with bytes and 2 alternatives.
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), chat["usage"]["completion_tokens"].get<std::size_t>());
  for (const json& t : content) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]);  // greedy
    EXPECT_EQ(t["bytes"].size(), t["token"].get<std::string>().size());
  }
  EXPECT_TRUE(lines[1]["response"]["body"]["choices"][0]["logprobs"].is_null());

  EXPECT_EQ(lines[2]["error"]["code"], "chat_template_error");
  EXPECT_NE(lines[2]["error"]["message"].get<std::string>().find("Conversation roles must be"), std::string::npos);

  EXPECT_EQ(lines[3]["response"]["body"]["choices"][0]["text"], "Lily wanted to go on a walk.");

  const json& n3 = lines[4]["response"]["body"];
  ASSERT_EQ(n3["choices"].size(), 3u);
  std::size_t tokens = 0;
  for (int i = 0; i < 3; ++i) {
    const json& c = n3["choices"][i];
    EXPECT_EQ(c["index"], i);
    const json& lp = c["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
    ASSERT_EQ(lp["tokens"].size(), lp["text_offset"].size());
    ASSERT_EQ(lp["tokens"].size(), lp["top_logprobs"].size());
    tokens += lp["tokens"].size();
    const std::string text = c["text"];
    EXPECT_EQ(text.find_first_of(".!"), std::string::npos) << text;  // the stop strings are cut
    if (c["finish_reason"] == "stop") {
      const std::string last = lp["tokens"].back();
      EXPECT_NE(last.find_first_of(".!"), std::string::npos) << last;
    }
  }
  EXPECT_EQ(n3["usage"]["completion_tokens"], tokens);
  EXPECT_EQ(lines[5]["response"]["body"]["choices"].size(), 2u);

  // Batch-invariant and reproducible: another run, one running sequence at a
  // time, writes the same bytes.
  const auto again = run_command(base + " --max-batch 1 --output " + path("again.jsonl"));
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_EQ(testing_support::normalize_output_ids(read_file(path("again.jsonl"))),
            testing_support::normalize_output_ids(read_file(path("out.jsonl"))));
}

TEST_F(ChatJobE2e, ABrokenChatTemplateIsRefusedBeforeTheJobStarts) {
  std::ofstream(path("bad.jinja")) << "{% for m in messages %}{{ m.content }";
  std::ofstream(path("in.jsonl")) << R"({"prompt": "hi", "max_tokens": 2})" "\n";
  const auto r = run_command(kShardline + " run --quiet --model " + testing_support::kStoriesDir +
                             " --chat-template " + path("bad.jinja") + " --input " + path("in.jsonl") +
                             " --output " + path("out.jsonl"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--chat-template"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("line 1"), std::string::npos) << r.out;
  const auto missing = run_command(kShardline + " run --quiet --model " + testing_support::kStoriesDir +
                                   " --chat-template " + path("nope.jinja") + " --input " + path("in.jsonl") +
                                   " --output " + path("out.jsonl"));
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("nope.jinja"), std::string::npos) << missing.out;
}

}  // namespace
}  // namespace shardline
