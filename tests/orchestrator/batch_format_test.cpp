#include "orchestrator/batch_format.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace shardline::orchestrator {

using worker::BatchChoice;
using worker::BatchRequest;
using worker::BatchResult;

namespace orchestrator_batch_format_test {

BatchRequest ok_line(const std::string& line, std::uint64_t index = 0) {
  BatchLine b = parse_batch_line(line, 7, index);
  EXPECT_TRUE(b.is_request()) << line << " -> " << (b.is_request() ? "" : b.error().error_message);
  return b.is_request() ? b.request() : BatchRequest{};
}

BatchResult err_line(const std::string& line, std::uint64_t index = 0) {
  BatchLine b = parse_batch_line(line, 7, index);
  EXPECT_FALSE(b.is_request()) << line;
  return b.is_request() ? BatchResult{} : b.error();
}

void expect_error(const std::string& line, const std::string& code, const std::string& field) {
  BatchResult r = err_line(line);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error_code, code) << line << " -> " << r.error_message;
  EXPECT_NE(r.error_message.find(field), std::string::npos)
      << line << ": message '" << r.error_message << "' does not name " << field;
}

TEST(BatchFormat, OpenAiLineWithEveryField) {
  const BatchRequest r = ok_line(
      R"({"custom_id":"req-1","method":"POST","url":"/v1/completions","body":{)"
      R"("model":"m","prompt":"Hello","max_tokens":32,"temperature":0.5,"top_p":0.9,"top_k":40,)"
      R"("min_p":0.05,"seed":1234,"stop":["\n","END"],"n":3,"return_token_ids":true,)"
      R"("presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,"min_tokens":4,)"
      R"("ignore_eos":true,"stop_token_ids":[2,7]}})",
      5);
  EXPECT_EQ(r.job_id, 7u);
  EXPECT_EQ(r.line_index, 5u);
  EXPECT_EQ(r.custom_id, "req-1");
  EXPECT_EQ(r.prompt, "Hello");
  EXPECT_TRUE(r.prompt_token_ids.empty());
  EXPECT_EQ(r.params.max_tokens, 32);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.9f);
  EXPECT_EQ(r.params.top_k, 40);
  EXPECT_FLOAT_EQ(r.params.min_p, 0.05f);
  EXPECT_TRUE(r.params.has_seed);
  EXPECT_EQ(r.params.seed, 1234u);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.return_token_ids);
  EXPECT_FLOAT_EQ(r.params.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.1f);
  EXPECT_EQ(r.params.min_tokens, 4);
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.params.stop_token_ids, (std::vector<int>{2, 7}));
}

TEST(BatchFormat, Defaults) {
  const BatchRequest r = ok_line(R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"x"}})");
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_FLOAT_EQ(r.params.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.params.top_p, 1.0f);
  EXPECT_EQ(r.params.top_k, 0);
  EXPECT_FALSE(r.params.has_seed);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.return_token_ids);
  EXPECT_TRUE(r.params.stop.empty());
}

TEST(BatchFormat, PlainLinesAndDefaultCustomId) {
  const BatchRequest r = ok_line(R"({"prompt":"Once upon a time","max_tokens":8,"stop":"."})", 41);
  EXPECT_EQ(r.custom_id, "42");
  EXPECT_EQ(r.prompt, "Once upon a time");
  EXPECT_EQ(r.params.max_tokens, 8);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"."}));
  EXPECT_EQ(ok_line(R"({"prompt":"x","custom_id":"mine"})").custom_id, "mine");
  // OpenAI form without custom_id, method or url.
  EXPECT_EQ(ok_line(R"({"body":{"prompt":"x"}})", 2).custom_id, "3");
}

TEST(BatchFormat, TokenIdPrompt) {
  const BatchRequest r = ok_line(R"({"prompt":[1, 15043, 29892]})");
  EXPECT_TRUE(r.prompt.empty());
  EXPECT_EQ(r.prompt_token_ids, (std::vector<std::int32_t>{1, 15043, 29892}));
}

TEST(BatchFormat, NullMeansDefaultAndIntegralFloatsAreIntegers) {
  const BatchRequest r = ok_line(R"({"prompt":"x","max_tokens":24.0,"temperature":null,"seed":-1})");
  EXPECT_EQ(r.params.max_tokens, 24);
  EXPECT_FLOAT_EQ(r.params.temperature, 1.0f);
  EXPECT_TRUE(r.params.has_seed);
  EXPECT_EQ(r.params.seed, ~std::uint64_t{0});
}

TEST(BatchFormat, InvalidJson) {
  expect_error("{\"prompt\": ", "invalid_json", "line");
  expect_error("[1,2]", "invalid_json", "line");
  expect_error("\"text\"", "invalid_json", "line");
  EXPECT_EQ(err_line("not json", 9).custom_id, "10");
}

// Issue 46, item 5: 100,000 nested arrays crashed the node (SIGSEGV in a
// recursive dump) and again on every restart. Now a per-line error.
TEST(BatchFormat, DeeplyNestedLinesAreAPerLineError) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_error(R"({"prompt": "Hi", "max_tokens": )" + deep + "}", "invalid_json", "nested deeper than 64 levels");
  expect_error(R"({"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": )" + deep + "}}",
               "invalid_json", "nested deeper than 64 levels");
  expect_error(std::string(1000000, '['), "invalid_json", "nested deeper");
  // A line nested within the bound is parsed and its field refused as usual.
  expect_error(R"({"prompt": "Hi", "max_tokens": [[[1]]]})", "invalid_parameter", "max_tokens");
}

TEST(BatchFormat, MissingPrompt) {
  expect_error(R"({"max_tokens":4})", "missing_prompt", "prompt");
  expect_error(R"({"prompt":null})", "missing_prompt", "prompt");
  expect_error(R"({"custom_id":"a","url":"/v1/completions","body":{"max_tokens":4}})", "missing_prompt",
               "body.prompt");
  expect_error(R"({"custom_id":"a","method":"POST","url":"/v1/completions"})", "missing_prompt", "body");
}

TEST(BatchFormat, InvalidParameterTypes) {
  expect_error(R"({"prompt":5})", "invalid_parameter", "prompt");
  expect_error(R"({"prompt":""})", "invalid_parameter", "prompt");
  expect_error(R"({"prompt":[]})", "invalid_parameter", "prompt");
  expect_error(R"({"prompt":["a","b"]})", "invalid_parameter", "prompt");
  expect_error(R"({"prompt":[1,-2]})", "invalid_parameter", "prompt");
  expect_error(R"({"prompt":[1,2.5]})", "invalid_parameter", "prompt");
  expect_error(R"({"prompt":"x","max_tokens":"16"})", "invalid_parameter", "max_tokens");
  expect_error(R"({"prompt":"x","max_tokens":1.5})", "invalid_parameter", "max_tokens");
  expect_error(R"({"prompt":"x","max_tokens":99999999999})", "invalid_parameter", "max_tokens");
  expect_error(R"({"prompt":"x","temperature":"hot"})", "invalid_parameter", "temperature");
  expect_error(R"({"prompt":"x","top_p":true})", "invalid_parameter", "top_p");
  expect_error(R"({"prompt":"x","top_k":0.5})", "invalid_parameter", "top_k");
  expect_error(R"({"prompt":"x","min_p":[0]})", "invalid_parameter", "min_p");
  expect_error(R"({"prompt":"x","seed":"1"})", "invalid_parameter", "seed");
  expect_error(R"({"prompt":"x","stop":5})", "invalid_parameter", "stop");
  expect_error(R"({"prompt":"x","stop":["a",1]})", "invalid_parameter", "stop");
  expect_error(R"({"prompt":"x","n":"2"})", "invalid_parameter", "n");
  expect_error(R"({"prompt":"x","return_token_ids":1})", "invalid_parameter", "return_token_ids");
  expect_error(R"({"prompt":"x","presence_penalty":"a"})", "invalid_parameter", "presence_penalty");
  expect_error(R"({"prompt":"x","frequency_penalty":{}})", "invalid_parameter", "frequency_penalty");
  expect_error(R"({"prompt":"x","repetition_penalty":"a"})", "invalid_parameter", "repetition_penalty");
  expect_error(R"({"prompt":"x","min_tokens":"a"})", "invalid_parameter", "min_tokens");
  expect_error(R"({"prompt":"x","ignore_eos":"yes"})", "invalid_parameter", "ignore_eos");
  expect_error(R"({"prompt":"x","stop_token_ids":3})", "invalid_parameter", "stop_token_ids");
  expect_error(R"({"prompt":"x","stop_token_ids":["a"]})", "invalid_parameter", "stop_token_ids");
  expect_error(R"({"prompt":"x","model":3})", "invalid_parameter", "model");
  expect_error(R"({"prompt":"x","custom_id":3})", "invalid_parameter", "custom_id");
  expect_error(R"({"custom_id":"a","body":[1]})", "invalid_parameter", "body");
}

TEST(BatchFormat, InvalidParameterRanges) {
  expect_error(R"({"prompt":"x","max_tokens":0})", "invalid_parameter", "max_tokens");
  expect_error(R"({"prompt":"x","temperature":-1})", "invalid_parameter", "temperature");
  expect_error(R"({"prompt":"x","top_p":0})", "invalid_parameter", "top_p");
  expect_error(R"({"prompt":"x","top_p":1.5})", "invalid_parameter", "top_p");
  expect_error(R"({"prompt":"x","top_k":-2})", "invalid_parameter", "top_k");
  expect_error(R"({"prompt":"x","min_p":2})", "invalid_parameter", "min_p");
  expect_error(R"({"prompt":"x","presence_penalty":3})", "invalid_parameter", "presence_penalty");
  expect_error(R"({"prompt":"x","frequency_penalty":-3})", "invalid_parameter", "frequency_penalty");
  expect_error(R"({"prompt":"x","repetition_penalty":0})", "invalid_parameter", "repetition_penalty");
  expect_error(R"({"prompt":"x","min_tokens":20})", "invalid_parameter", "min_tokens");
  expect_error(R"({"prompt":"x","n":0})", "invalid_parameter", "n");
  expect_error(R"({"prompt":"x","n":1000})", "invalid_parameter", "n");
  expect_error(R"({"prompt":"x","stop":[""]})", "invalid_parameter", "stop");
  expect_error(R"({"prompt":"x","stop_token_ids":[-1]})", "invalid_parameter", "stop_token_ids");
  expect_error(R"({"prompt":"x","temperature":1e300})", "invalid_parameter", "temperature");
}

TEST(BatchFormat, UnknownParameter) {
  expect_error(R"({"prompt":"x","max_token":4})", "unknown_parameter", "max_token");
  expect_error(R"({"custom_id":"a","body":{"prompt":"x","max_completion_tokens":2}})", "unknown_parameter",
               "body.max_completion_tokens");
  expect_error(R"({"custom_id":"a","body":{"prompt":"x"},"extra":1})", "unknown_parameter", "extra");
  // custom_id belongs at the top level of the OpenAI form, not in the body.
  expect_error(R"({"body":{"prompt":"x","custom_id":"a"}})", "unknown_parameter", "body.custom_id");
}

TEST(BatchFormat, UnsupportedUrl) {
  BatchResult r = err_line(R"({"custom_id":"c","url":"/v1/embeddings","body":{"prompt":"x"}})");
  EXPECT_EQ(r.error_code, "unsupported_url");
  EXPECT_NE(r.error_message.find("/v1/chat/completions"), std::string::npos) << r.error_message;
  EXPECT_EQ(r.custom_id, "c");
  expect_error(R"({"custom_id":"c","url":7,"body":{"prompt":"x"}})", "invalid_parameter", "url");
}

TEST(BatchFormat, ChatLineWithEveryField) {
  const BatchRequest r = ok_line(
      R"({"custom_id":"c1","method":"POST","url":"/v1/chat/completions","body":{"model":"m",)"
      R"("messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[)"
      R"({"type":"text","text":"Hello"},{"type":"text","text":"there ✓"}],"name":"ann"},)"
      R"({"role":"assistant","content":null}],)"
      R"("max_completion_tokens":20,"max_tokens":99,"temperature":0.7,"top_p":0.9,"top_k":5,"min_p":0.1,)"
      R"("seed":3,"stop":["\n","END"],"n":2,"logprobs":true,"top_logprobs":4,"presence_penalty":0.5,)"
      R"("frequency_penalty":0.25,"repetition_penalty":1.1,"min_tokens":1,"ignore_eos":true,)"
      R"("stop_token_ids":[7],"return_token_ids":true,"chat_template_kwargs":{"enable_thinking":false},)"
      R"("add_generation_prompt":false,"parallel_tool_calls":true,"user":"u","store":false,)"
      R"("metadata":{"k":"v"},"stream":false,"tools":[],"tool_choice":"none","logit_bias":{},)"
      R"("response_format":{"type":"text"},"modalities":["text"]}})");
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.messages_json,
            R"([{"content":"Be brief.","role":"system"},{"content":"Hello\nthere ✓","name":"ann","role":"user"},)"
            R"({"content":null,"role":"assistant"}])");
  EXPECT_EQ(r.chat_template_kwargs_json, R"({"enable_thinking":false})");
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_FALSE(r.max_tokens_from_context);
  EXPECT_EQ(r.params.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_EQ(r.params.logprobs, 4);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.params.top_k, 5);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.return_token_ids);
  EXPECT_TRUE(r.prompt.empty());
  EXPECT_TRUE(r.chat_template.empty());  // the job sets it
}

TEST(BatchFormat, ChatDefaultsAndPlainForm) {
  const BatchRequest r = ok_line(R"({"url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}]}})");
  EXPECT_TRUE(r.chat);
  EXPECT_TRUE(r.max_tokens_from_context);  // no max_tokens: up to the context's end
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_EQ(r.params.logprobs, -1);
  const BatchRequest logprobs_only =
      ok_line(R"({"url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}],"logprobs":true}})");
  EXPECT_EQ(logprobs_only.params.logprobs, 0);
  const BatchRequest with_max =
      ok_line(R"({"url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}})");
  EXPECT_FALSE(with_max.max_tokens_from_context);
  EXPECT_EQ(with_max.params.max_tokens, 5);
  // The plain form is a chat body when it has messages.
  const BatchRequest plain = ok_line(R"({"custom_id":"p","messages":[{"role":"user","content":"hi"}]})");
  EXPECT_TRUE(plain.chat);
  EXPECT_EQ(plain.custom_id, "p");
}

TEST(BatchFormat, ChatErrorsNameTheField) {
  const std::string url = R"({"url":"/v1/chat/completions","body":)";
  expect_error(url + R"({}})", "missing_prompt", "body.messages");
  expect_error(url + R"({"messages":[]}})", "invalid_parameter", "body.messages");
  expect_error(url + R"({"messages":"hi"}})", "invalid_parameter", "body.messages");
  expect_error(url + R"({"messages":[{"content":"x"}]}})", "invalid_parameter", "body.messages[0].role");
  expect_error(url + R"({"messages":[{"role":"user","content":7}]}})", "invalid_parameter", "body.messages[0].content");
  expect_error(url + R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}})",
               "unsupported_parameter", "body.messages[0].content[0].type");
  expect_error(url + R"({"messages":[{"role":"user","content":[{"type":"text"}]}]}})", "invalid_parameter",
               "body.messages[0].content[0].text");
  expect_error(url + R"({"messages":[{"role":"user","content":"x"}],"prompt":"x"}})", "unknown_parameter",
               "body.prompt");
  expect_error(url + R"({"messages":[{"role":"user","content":"x"}],"echo":true}})", "unknown_parameter", "body.echo");
  expect_error(url + R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2}})", "invalid_parameter",
               "body.top_logprobs");
  expect_error(url + R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}})",
               "invalid_parameter", "body.top_logprobs");
  expect_error(url + R"({"messages":[{"role":"user","content":"x"}],"logprobs":2}})", "invalid_parameter",
               "body.logprobs");
  expect_error(url + R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]}})",
               "invalid_parameter", "body.chat_template_kwargs");
  // A completions line with messages is told where they belong.
  BatchResult r = err_line(R"({"body":{"messages":[{"role":"user","content":"x"}]}})");
  EXPECT_EQ(r.error_code, "unknown_parameter");
  EXPECT_NE(r.error_message.find("/v1/chat/completions"), std::string::npos) << r.error_message;
}

TEST(BatchFormat, RefusedFieldsGiveUnsupportedParameter) {
  const std::string chat = R"({"url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"x"}],)";
  for (const char* f : {R"("stream":true)", R"("stream_options":{"include_usage":true})", R"("logit_bias":{"5":10})",
                        R"("tools":[{"type":"function"}])", R"("tool_choice":"auto")", R"("functions":[])",
                        R"("function_call":"auto")", R"("modalities":["text","audio"])", R"("audio":{})", R"("prediction":{})",
                        R"("reasoning_effort":"low")", R"("web_search_options":{})", R"("verbosity":"low")"}) {
    const std::string field = std::string(f).substr(1, std::string(f).find('"', 1) - 1);
    expect_error(chat + f + "}}", "unsupported_parameter", "body." + field);
  }
  const std::string cmpl = R"({"body":{"prompt":"x",)";
  for (const char* f : {R"("stream":true)", R"("logit_bias":{"5":10})", R"("suffix":"end")", R"("best_of":3)",
                        R"("echo":true,"logprobs":1)"}) {
    BatchResult r = err_line(cmpl + f + "}}");
    EXPECT_EQ(r.error_code, "unsupported_parameter") << f << " -> " << r.error_message;
  }
  // The "off" values are accepted.
  const BatchRequest ok = ok_line(cmpl + R"("stream":false,"logit_bias":{},"suffix":"","best_of":1,"user":"u"}})");
  EXPECT_FALSE(ok.chat);
}

// Structured outputs: OpenAI's response_format, vLLM's guided_* and its
// structured_outputs object, on both endpoints, into the request's grammar.
TEST(BatchFormat, StructuredOutputFieldsBecomeTheLinesGrammar) {
  const std::string chat = R"({"url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"x"}],)";
  const std::string cmpl = R"({"body":{"prompt":"x",)";
  BatchRequest r = ok_line(chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"p",)"
                                  R"("strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}}}}}}})");
  EXPECT_EQ(r.grammar_kind, "json_schema");
  EXPECT_EQ(r.grammar_text, R"({"properties":{"a":{"type":"integer"}},"type":"object"})");
  EXPECT_TRUE(r.grammar_any_whitespace);
  EXPECT_EQ(ok_line(chat + R"("response_format":{"type":"json_object"}}})").grammar_kind, "json_object");
  // A json_schema without a schema: any JSON, as json_object.
  EXPECT_EQ(ok_line(chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"any"}}}})").grammar_kind,
            "json_object");
  EXPECT_EQ(ok_line(chat + R"("response_format":{"type":"text"}}})").grammar_kind, "");
  EXPECT_EQ(ok_line(cmpl + R"("response_format":{"type":"json_object"}}})").grammar_kind, "json_object");

  r = ok_line(cmpl + R"("guided_json":"{\"type\": \"integer\"}"}})");
  EXPECT_EQ(r.grammar_kind, "json_schema");
  EXPECT_EQ(r.grammar_text, R"({"type": "integer"})");
  EXPECT_EQ(ok_line(cmpl + R"("guided_json":{"type":"integer"}}})").grammar_text, R"({"type":"integer"})");
  r = ok_line(cmpl + R"("guided_regex":"[a-z]+"}})");
  EXPECT_EQ(r.grammar_kind, "regex");
  EXPECT_EQ(r.grammar_text, "[a-z]+");
  r = ok_line(chat + R"("guided_choice":["yes","no"]}})");
  EXPECT_EQ(r.grammar_kind, "choice");
  EXPECT_EQ(r.grammar_choices, (std::vector<std::string>{"yes", "no"}));
  r = ok_line(cmpl + R"("guided_grammar":"root ::= \"a\""}})");
  EXPECT_EQ(r.grammar_kind, "ebnf");
  EXPECT_EQ(r.grammar_text, R"(root ::= "a")");

  r = ok_line(cmpl + R"("structured_outputs":{"regex":"[0-9]","disable_any_whitespace":true}}})");
  EXPECT_EQ(r.grammar_kind, "regex");
  EXPECT_FALSE(r.grammar_any_whitespace);
  EXPECT_EQ(ok_line(chat + R"("structured_outputs":{"json":{"type":"null"}}}})").grammar_kind, "json_schema");
  EXPECT_EQ(ok_line(chat + R"("structured_outputs":{"choice":["a"]}}})").grammar_choices.size(), 1u);
  EXPECT_EQ(ok_line(chat + R"("structured_outputs":{"grammar":"root ::= \"b\""}}})").grammar_kind, "ebnf");
  EXPECT_EQ(ok_line(chat + R"("structured_outputs":{"json_object":true}}})").grammar_kind, "json_object");
  EXPECT_EQ(ok_line(chat + R"("structured_outputs":{"json_object":false}}})").grammar_kind, "");
  // Unconstrained by default.
  EXPECT_EQ(ok_line(cmpl + R"("max_tokens":3}})").grammar_kind, "");
}

TEST(BatchFormat, StructuredOutputErrorsNameTheField) {
  const std::string chat = R"({"url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"x"}],)";
  const std::string cmpl = R"({"body":{"prompt":"x",)";
  // Two constraints at once.
  expect_error(cmpl + R"("guided_regex":"a","guided_choice":["b"]}})", "invalid_parameter", "body.guided_choice");
  expect_error(chat + R"("response_format":{"type":"json_object"},"structured_outputs":{"regex":"a"}}})",
               "invalid_parameter", "only one structured-output constraint");
  expect_error(cmpl + R"("structured_outputs":{"regex":"a","choice":["b"]}}})", "invalid_parameter",
               "body.structured_outputs.choice");
  // Shapes and values.
  expect_error(chat + R"("response_format":"json"}})", "invalid_parameter", "body.response_format");
  expect_error(chat + R"("response_format":{"type":"xml"}}})", "invalid_parameter", "body.response_format.type");
  expect_error(chat + R"("response_format":{"type":"json_schema"}}})", "invalid_parameter",
               "body.response_format.json_schema");
  expect_error(chat + R"("response_format":{"type":"json_schema","json_schema":{"schema":[1]}}}})",
               "invalid_parameter", "body.response_format.json_schema.schema");
  expect_error(chat + R"("response_format":{"type":"json_schema","json_schema":{"nam":"x"}}}})", "unknown_parameter",
               "body.response_format.json_schema.nam");
  expect_error(chat + R"("response_format":{"type":"json_object","extra":1}}})", "unknown_parameter",
               "body.response_format.extra");
  expect_error(cmpl + R"("guided_json":5}})", "invalid_parameter", "body.guided_json");
  expect_error(cmpl + R"("guided_regex":["a"]}})", "invalid_parameter", "body.guided_regex");
  expect_error(cmpl + R"("guided_choice":[]}})", "invalid_parameter", "body.guided_choice");
  expect_error(cmpl + R"("guided_choice":["a",2]}})", "invalid_parameter", "body.guided_choice element");
  expect_error(cmpl + R"("guided_grammar":{}}})", "invalid_parameter", "body.guided_grammar");
  expect_error(cmpl + R"("structured_outputs":{"structural_tag":"x"}}})", "unsupported_parameter",
               "body.structured_outputs.structural_tag");
  expect_error(cmpl + R"("structured_outputs":[1]}})", "invalid_parameter", "body.structured_outputs");
  // The plain form names the fields without a prefix.
  expect_error(R"({"prompt":"x","guided_regex":1})", "invalid_parameter", "guided_regex");
}

TEST(BatchFormat, CompletionsLogprobsAndEcho) {
  const BatchRequest r = ok_line(R"({"body":{"prompt":"x","logprobs":5,"n":2,"best_of":2}})");
  EXPECT_EQ(r.params.logprobs, 5);
  EXPECT_FALSE(r.echo);
  EXPECT_TRUE(ok_line(R"({"body":{"prompt":"x","echo":true}})").echo);
  EXPECT_EQ(ok_line(R"({"body":{"prompt":"x","logprobs":0}})").params.logprobs, 0);
  expect_error(R"({"body":{"prompt":"x","logprobs":21}})", "invalid_parameter", "body.logprobs");
  expect_error(R"({"body":{"prompt":"x","logprobs":true}})", "invalid_parameter", "body.logprobs");
  expect_error(R"({"body":{"prompt":"x","echo":1}})", "invalid_parameter", "body.echo");
  expect_error(R"({"body":{"prompt":"x","top_logprobs":1}})", "unknown_parameter", "body.top_logprobs");
}

TEST(BatchFormat, InvalidMethod) {
  expect_error(R"({"custom_id":"c","method":"GET","url":"/v1/completions","body":{"prompt":"x"}})",
               "invalid_method", "method");
  expect_error(R"({"custom_id":"c","method":1,"body":{"prompt":"x"}})", "invalid_method", "method");
}

TEST(BatchFormat, BlankLines) {
  EXPECT_TRUE(is_blank_line(""));
  EXPECT_TRUE(is_blank_line(" \t\r"));
  EXPECT_FALSE(is_blank_line(" {}"));
  expect_error("", "invalid_json", "line");
}

BatchResult sample_result() {
  BatchResult r;
  r.job_id = 3;
  r.line_index = 17;
  r.custom_id = "req-18";
  r.ok = true;
  BatchChoice c;
  c.index = 0;
  c.text = " there was a \"cat\"\n";
  c.finish_reason = "length";
  r.choices.push_back(c);
  r.prompt_tokens = 5;
  r.completion_tokens = 8;
  return r;
}

TEST(BatchFormat, FormatOkLineExactly) {
  EXPECT_EQ(format_result_line(sample_result(), "stories260K", "cmpl-"),
            R"({"id":"batch_req_3_17","custom_id":"req-18","response":{"status_code":200,)"
            R"("request_id":"cmpl-3_17","body":{"object":"text_completion","model":"stories260K",)"
            R"("choices":[{"index":0,"text":" there was a \"cat\"\n","finish_reason":"length","logprobs":null}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}}},"error":null})");
}

TEST(BatchFormat, OutputIdsDeriveFromTheJobsKeyAndTheLine) {
  const std::string key = "0123456789abcdef0123456789abcdef";
  const std::string line = format_result_line(sample_result(), "stories260K", "cmpl-", key);
  const std::string suffix = output_line_id(key, 17);
  ASSERT_EQ(suffix.size(), 32u);
  EXPECT_EQ(suffix.find_first_not_of("0123456789abcdef"), std::string::npos) << suffix;
  EXPECT_EQ(line.substr(0, 51), R"({"id":"batch_req_)" + suffix + R"(",)");
  EXPECT_NE(line.find(R"("request_id":"cmpl-)" + suffix + R"(")"), std::string::npos) << line;
  // Deterministic (a resumed job writes the same bytes), unique per line.
  EXPECT_EQ(output_line_id(key, 17), suffix);
  std::set<std::string> seen;
  for (std::uint64_t i = 0; i < 100000; ++i) seen.insert(output_line_id(key, i).substr(0, 16));
  EXPECT_EQ(seen.size(), 100000u);  // even the first half alone never repeats
  // Keys are fresh random draws; another key gives other ids.
  const std::string k1 = new_output_id_key().value(), k2 = new_output_id_key().value();
  EXPECT_EQ(k1.size(), 32u);
  EXPECT_EQ(k1.find_first_not_of("0123456789abcdef"), std::string::npos) << k1;
  EXPECT_NE(k1, k2);
  EXPECT_NE(output_line_id(k1, 0), output_line_id(k2, 0));
  EXPECT_NE(output_line_id(key, 0), output_line_id("fedcba9876543210fedcba9876543210", 0));
}

TEST(BatchFormat, FormatTokenIdsAndSeveralChoices) {
  BatchResult r = sample_result();
  r.choices[0].token_ids = {4, 5};
  BatchChoice c2;
  c2.index = 1;
  c2.text = "b";
  c2.finish_reason = "stop";
  c2.token_ids = {9};
  r.choices.push_back(c2);
  EXPECT_EQ(format_result_line(r, "m", "p-"),
            R"({"id":"batch_req_3_17","custom_id":"req-18","response":{"status_code":200,)"
            R"("request_id":"p-3_17","body":{"object":"text_completion","model":"m","choices":[)"
            R"({"index":0,"text":" there was a \"cat\"\n","finish_reason":"length","token_ids":[4,5],"logprobs":null},)"
            R"({"index":1,"text":"b","finish_reason":"stop","token_ids":[9],"logprobs":null}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}}},"error":null})");
}

TEST(BatchFormat, FormatErrorLineExactly) {
  const BatchResult r = make_error_result(1, 0, "1", "missing_prompt", "prompt: missing");
  EXPECT_EQ(format_result_line(r, "m", "cmpl-"),
            R"({"id":"batch_req_1_0","custom_id":"1","response":null,)"
            R"("error":{"code":"missing_prompt","message":"prompt: missing"}})");
  EXPECT_EQ(format_result_line(r, "m", "cmpl-", {}, 7),
            R"({"id":"batch_req_1_0","custom_id":"1","response":null,)"
            R"("error":{"code":"missing_prompt","message":"prompt: missing","line":7}})");
}

TEST(BatchFormat, FormatChatLineExactly) {
  BatchResult r = sample_result();
  r.chat = true;
  r.choices[0].text = "Hi!";
  EXPECT_EQ(format_result_line(r, "m", "cmpl-"),
            R"({"id":"batch_req_3_17","custom_id":"req-18","response":{"status_code":200,)"
            R"("request_id":"chatcmpl-3_17","body":{"object":"chat.completion","model":"m","choices":[)"
            R"({"index":0,"message":{"role":"assistant","content":"Hi!"},"finish_reason":"length","logprobs":null}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}}},"error":null})");
}

worker::ChoiceTokenLogprobs token_lp(std::string tok, float lp, std::vector<worker::TokenLogprobText> top,
                                      int offset) {
  return {{tok, tok, lp}, std::move(top), offset};
}

TEST(BatchFormat, FormatLogprobsOfBothEndpointsExactly) {
  BatchResult r = sample_result();
  r.logprobs = 1;
  r.choices[0].text = " a\xE2\x9C\x93";
  r.choices[0].logprobs = {token_lp(" a", -0.5f, {{" b", " b", -0.25f}}, 0),
                           {{"\xEF\xBF\xBD", std::string("\xE2\x9C", 2), -1.5f}, {{"\xEF\xBF\xBD", std::string("\xE2\x9C", 2), -1.5f}}, 2}};
  EXPECT_EQ(format_result_line(r, "m", "cmpl-"),
            R"({"id":"batch_req_3_17","custom_id":"req-18","response":{"status_code":200,)"
            R"("request_id":"cmpl-3_17","body":{"object":"text_completion","model":"m","choices":[)"
            R"({"index":0,"text":" a✓","finish_reason":"length","logprobs":{"tokens":[" a","�"],)"
            R"("token_logprobs":[-0.5,-1.5],"top_logprobs":[{" b":-0.25," a":-0.5},{"�":-1.5}],)"
            R"("text_offset":[0,2]}}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}}},"error":null})");
  r.chat = true;
  EXPECT_EQ(format_result_line(r, "m", "cmpl-"),
            R"({"id":"batch_req_3_17","custom_id":"req-18","response":{"status_code":200,)"
            R"("request_id":"chatcmpl-3_17","body":{"object":"chat.completion","model":"m","choices":[)"
            R"({"index":0,"message":{"role":"assistant","content":" a✓"},"finish_reason":"length","logprobs":{"content":[)"
            R"({"token":" a","logprob":-0.5,"bytes":[32,97],"top_logprobs":[{"token":" b","logprob":-0.25,"bytes":[32,98]}]},)"
            R"({"token":"�","logprob":-1.5,"bytes":[226,156],"top_logprobs":[{"token":"�","logprob":-1.5,"bytes":[226,156]}]}],)"
            R"("refusal":null}}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":8,"total_tokens":13}}},"error":null})");
}

TEST(BatchFormat, FormatInvalidUtf8IsReplacedNotThrown) {
  BatchResult r = sample_result();
  r.choices[0].text = std::string("a\xff") + "b";
  const std::string line = format_result_line(r, "m", "cmpl-");
  EXPECT_NE(line.find("a\xEF\xBF\xBD" "b"), std::string::npos);
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace shardline::orchestrator
