#include "orchestrator/batch_format.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "comm/crypto.hpp"

#include "common/json_bounded.hpp"

#include "sampling/logprobs.hpp"

namespace shardline::orchestrator {

using worker::BatchRequest;
using worker::BatchResult;

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr int kMaxN = 128;

/// A parse failure: error code + message.
struct LineError {
  std::string code;
  std::string message;
};

const char* type_name(const json& v) { return v.type_name(); }

/// The value as JSON text, cut to a readable length for messages.
std::string short_dump(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

LineError bad_type(const std::string& field, const char* want, const json& v) {
  return {"invalid_parameter", field + ": must be " + want + ", got " + type_name(v) + " " + short_dump(v)};
}

/// An integer value (also an integral float) in [lo, hi].
std::optional<LineError> get_int(const json& v, const std::string& field, std::int64_t lo,
                                 std::int64_t hi, std::int64_t& out) {
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return LineError{"invalid_parameter", field + ": " + std::to_string(u) + " is out of range"};
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < -9.2e18 || d > 9.2e18)
      return bad_type(field, "an integer", v);
    x = static_cast<std::int64_t>(d);
  } else {
    return bad_type(field, "an integer", v);
  }
  if (x < lo || x > hi)
    return LineError{"invalid_parameter", field + ": must be in [" + std::to_string(lo) + ", " +
                                              std::to_string(hi) + "], got " + std::to_string(x)};
  out = x;
  return std::nullopt;
}

std::optional<LineError> get_int32(const json& v, const std::string& field, int& out) {
  std::int64_t x = 0;
  if (auto e = get_int(v, field, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(), x))
    return e;
  out = static_cast<int>(x);
  return std::nullopt;
}

std::optional<LineError> get_float(const json& v, const std::string& field, float& out) {
  if (!v.is_number()) return bad_type(field, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > 3.0e38)
    return LineError{"invalid_parameter", field + ": must be a finite number"};
  out = static_cast<float>(d);
  return std::nullopt;
}

std::optional<LineError> get_bool(const json& v, const std::string& field, bool& out) {
  if (!v.is_boolean()) return bad_type(field, "a boolean", v);
  out = v.get<bool>();
  return std::nullopt;
}

/// The completions prompt: a non-empty string or array of token ids.
std::optional<LineError> parse_prompt(const json* prompt, const std::string& field, BatchRequest& req) {
  if (prompt == nullptr) return LineError{"missing_prompt", field + ": missing"};
  if (prompt->is_string()) {
    req.prompt = prompt->get<std::string>();
    if (req.prompt.empty()) return LineError{"invalid_parameter", field + ": must not be empty"};
  } else if (prompt->is_array()) {
    if (prompt->empty()) return LineError{"invalid_parameter", field + ": must not be empty"};
    req.prompt_token_ids.reserve(prompt->size());
    for (const auto& t : *prompt) {
      if (t.is_string() || t.is_array())
        return LineError{"invalid_parameter",
                         field + ": arrays of prompts are not supported (one prompt per line); "
                                 "an array must hold token ids"};
      int id = 0;
      if (auto e = get_int32(t, field + " token id", id)) return e;
      if (id < 0)
        return LineError{"invalid_parameter", field + ": token ids must be >= 0, got " + std::to_string(id)};
      req.prompt_token_ids.push_back(id);
    }
  } else {
    return bad_type(field, "a string or an array of token ids", *prompt);
  }
  return std::nullopt;
}

/// Body keys both endpoints accept (vLLM's extensions included).
constexpr const char* kCommonKeys[] = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "logprobs",
    "return_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
    "ignore_eos", "stop_token_ids",
    // structured outputs (parse_structured_output): OpenAI's response_format,
    // vLLM's guided_* and its newer structured_outputs object
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
    // accepted and ignored: they do not change the output of an offline job
    "user", "store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier"};
/// Known to both endpoints and refused unless "off" (check_refused).
constexpr const char* kCommonRefusedKeys[] = {"logit_bias", "stream", "stream_options"};
constexpr const char* kCompletionKeys[] = {"prompt", "echo", "best_of", "suffix"};
constexpr const char* kChatKeys[] = {
    "messages", "max_completion_tokens", "top_logprobs", "chat_template_kwargs", "add_generation_prompt",
    "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "audio",
    "modalities", "prediction", "reasoning_effort", "web_search_options", "verbosity"};

template <std::size_t N>
bool one_of(const std::string& k, const char* const (&keys)[N]) {
  for (const char* key : keys)
    if (k == key) return true;
  return false;
}

/// obj[key], or null when it is missing or null (a null counts as not given).
const json* given(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

LineError unsupported(const std::string& field, const std::string& why) {
  return {"unsupported_parameter", field + ": " + why};
}

/// The refusals: known fields Shardline does not implement, allowed only
/// with the value that means "off". `chat` picks the endpoint's fields.
std::optional<LineError> check_refused(const json& body, const std::string& prefix, bool chat) {
  auto field = [&](const char* k) { return given(body, k); };
  auto name = [&](const char* k) { return prefix + k; };
  if (const json* v = field("stream"); v != nullptr && !(v->is_boolean() && !v->get<bool>()))
    return unsupported(name("stream"), "batch jobs do not stream; leave it out or set it to false");
  if (field("stream_options") != nullptr)
    return unsupported(name("stream_options"), "batch jobs do not stream");
  if (const json* v = field("logit_bias"); v != nullptr && !(v->is_object() && v->empty()))
    return unsupported(name("logit_bias"), "logit bias is not supported");
  if (!chat) {
    if (const json* v = field("suffix"); v != nullptr && !(v->is_string() && v->get<std::string>().empty()))
      return unsupported(name("suffix"), "insertion (suffix) is not supported");
    return std::nullopt;
  }
  if (const json* v = field("tools"); v != nullptr && !(v->is_array() && v->empty()))
    return unsupported(name("tools"), "tool calling is not supported");
  if (const json* v = field("tool_choice"); v != nullptr && !(v->is_string() && v->get<std::string>() == "none"))
    return unsupported(name("tool_choice"), "tool calling is not supported (only \"none\")");
  for (const char* k : {"functions", "function_call"})
    if (field(k) != nullptr) return unsupported(name(k), "function calling is not supported");
  if (const json* v = field("modalities"); v != nullptr && *v != json::array({"text"}))
    return unsupported(name("modalities"), "only [\"text\"] output is supported");
  for (const char* k : {"audio", "prediction", "reasoning_effort", "web_search_options", "verbosity"})
    if (field(k) != nullptr) return unsupported(name(k), "not supported by this server");
  return std::nullopt;
}

/// A message's content as the chat template sees it: a string (also from an
/// array of text parts, joined with "\n" as vLLM does) or null.
std::optional<LineError> normalize_content(json& message, const std::string& field) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null() || it->is_string()) return std::nullopt;
  if (!it->is_array()) return bad_type(field, "a string, null or an array of content parts", *it);
  std::string joined;
  for (std::size_t j = 0; j < it->size(); ++j) {
    const json& part = (*it)[j];
    const std::string pf = field + "[" + std::to_string(j) + "]";
    if (!part.is_object()) return bad_type(pf, "a content part object", part);
    const json type = part.value("type", json());
    if (type != "text")
      return unsupported(pf + ".type", "only text content parts are supported, got " + short_dump(type));
    auto text = part.find("text");
    if (text == part.end() || !text->is_string())
      return bad_type(pf + ".text", "a string", text == part.end() ? json() : *text);
    if (j > 0) joined += '\n';
    joined += text->get<std::string>();
  }
  *it = joined;
  return std::nullopt;
}

std::optional<LineError> parse_messages(const json& v, const std::string& field, BatchRequest& req) {
  if (!v.is_array()) return bad_type(field, "an array of messages", v);
  if (v.empty()) return LineError{"invalid_parameter", field + ": must not be empty"};
  json messages = v;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    json& m = messages[i];
    const std::string mf = field + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad_type(mf, "a message object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return LineError{"invalid_parameter", mf + ".role: must be a string"};
    if (auto e = normalize_content(m, mf + ".content")) return e;
  }
  req.messages_json = messages.dump(-1, ' ', false, json::error_handler_t::replace);
  return std::nullopt;
}

/// Completions: `logprobs` is the number of top logprobs (0..20). Chat:
/// `logprobs` is a boolean and `top_logprobs` (0..20) the number, which
/// needs logprobs = true.
template <class Field, class Name>
std::optional<LineError> parse_logprobs(const Field& field, const Name& name, bool chat, BatchRequest& req) {
  int& k = req.params.logprobs;
  if (!chat) {
    if (const json* v = field("logprobs")) {
      std::int64_t x = 0;
      if (auto e = get_int(*v, name("logprobs"), 0, sampling::kMaxLogprobs, x)) return e;
      k = static_cast<int>(x);
    }
    return std::nullopt;
  }
  bool on = false;
  if (const json* v = field("logprobs"))
    if (auto e = get_bool(*v, name("logprobs"), on)) return e;
  std::int64_t top = 0;
  if (const json* v = field("top_logprobs")) {
    if (auto e = get_int(*v, name("top_logprobs"), 0, sampling::kMaxLogprobs, top)) return e;
    if (!on) return LineError{"invalid_parameter", name("top_logprobs") + ": needs logprobs set to true"};
  }
  if (on) k = static_cast<int>(top);
  return std::nullopt;
}

/// One structured-output constraint into `req` (grammar_*), refusing a
/// second one: whoever set it is named in `set_by`.
std::optional<LineError> set_grammar(BatchRequest& req, std::string& set_by, const std::string& field,
                                     const char* kind, std::string text, std::vector<std::string> choices = {}) {
  if (!set_by.empty())
    return LineError{"invalid_parameter", field + ": only one structured-output constraint per line, and " + set_by +
                                              " gives one already"};
  set_by = field;
  req.grammar_kind = kind;
  req.grammar_text = std::move(text);
  req.grammar_choices = std::move(choices);
  return std::nullopt;
}

/// A JSON schema given as an object or as a string holding one.
std::optional<LineError> schema_text(const json& v, const std::string& field, std::string& out) {
  if (v.is_object() || v.is_boolean()) {
    out = v.dump(-1, ' ', false, json::error_handler_t::replace);
    return std::nullopt;
  }
  if (v.is_string()) {
    out = v.get<std::string>();
    return std::nullopt;
  }
  return bad_type(field, "a JSON schema (an object, or a string holding one)", v);
}

std::optional<LineError> choice_list(const json& v, const std::string& field, std::vector<std::string>& out) {
  if (!v.is_array() || v.empty()) return bad_type(field, "a non-empty array of strings", v);
  for (const auto& c : v) {
    if (!c.is_string()) return bad_type(field + " element", "a string", c);
    out.push_back(c.get<std::string>());
  }
  return std::nullopt;
}

/// Structured outputs: at most one of
///   response_format {"type": "json_schema", "json_schema": {"name",
///     "schema", "strict", "description"}} (no schema: any JSON), {"type":
///     "json_object"}, {"type": "text"} (none);
///   guided_json (a schema object or string), guided_regex (a string),
///   guided_choice (a non-empty array of strings), guided_grammar (an EBNF
///   string), as vLLM's extra parameters;
///   structured_outputs {"json" | "regex" | "choice" | "grammar" |
///     "json_object": true, and "disable_any_whitespace"}, vLLM's newer form.
/// What the grammar engine then refuses is the worker's per-line
/// invalid_response_format.
std::optional<LineError> parse_structured_output(const json& body, const std::string& prefix, BatchRequest& req) {
  auto field = [&](const char* k) { return given(body, k); };
  auto name = [&](const std::string& n) { return prefix + n; };
  std::string set_by;
  if (const json* rf = field("response_format")) {
    const std::string f = name("response_format");
    if (!rf->is_object()) return bad_type(f, "an object", *rf);
    for (auto it = rf->begin(); it != rf->end(); ++it)
      if (it.key() != "type" && it.key() != "json_schema")
        return LineError{"unknown_parameter", f + "." + it.key() + ": unknown parameter"};
    const json type = rf->value("type", json());
    if (!type.is_string()) return bad_type(f + ".type", "a string", type);
    const std::string t = type.get<std::string>();
    if (t == "json_object") {
      if (auto e = set_grammar(req, set_by, f, "json_object", "")) return e;
    } else if (t == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        return bad_type(f + ".json_schema", "an object", js == rf->end() ? json() : *js);
      for (auto it = js->begin(); it != js->end(); ++it)
        if (it.key() != "name" && it.key() != "schema" && it.key() != "strict" && it.key() != "description")
          return LineError{"unknown_parameter", f + ".json_schema." + it.key() + ": unknown parameter"};
      if (const json* n = given(*js, "name"); n != nullptr && !n->is_string())
        return bad_type(f + ".json_schema.name", "a string", *n);
      if (const json* st = given(*js, "strict"); st != nullptr && !st->is_boolean())
        return bad_type(f + ".json_schema.strict", "a boolean", *st);
      if (const json* schema = given(*js, "schema")) {
        if (!schema->is_object()) return bad_type(f + ".json_schema.schema", "an object", *schema);
        if (auto e = set_grammar(req, set_by, f, "json_schema", schema->dump(-1, ' ', false, json::error_handler_t::replace)))
          return e;
      } else if (auto e = set_grammar(req, set_by, f, "json_object", "")) {
        return e;
      }
    } else if (t != "text") {
      return LineError{"invalid_parameter",
                       f + ".type: must be \"text\", \"json_object\" or \"json_schema\", got " + short_dump(type)};
    }
  }
  if (const json* v = field("guided_json")) {
    std::string text;
    if (auto e = schema_text(*v, name("guided_json"), text)) return e;
    if (auto e = set_grammar(req, set_by, name("guided_json"), "json_schema", std::move(text))) return e;
  }
  if (const json* v = field("guided_regex")) {
    if (!v->is_string()) return bad_type(name("guided_regex"), "a string", *v);
    if (auto e = set_grammar(req, set_by, name("guided_regex"), "regex", v->get<std::string>())) return e;
  }
  if (const json* v = field("guided_choice")) {
    std::vector<std::string> choices;
    if (auto e = choice_list(*v, name("guided_choice"), choices)) return e;
    if (auto e = set_grammar(req, set_by, name("guided_choice"), "choice", "", std::move(choices))) return e;
  }
  if (const json* v = field("guided_grammar")) {
    if (!v->is_string()) return bad_type(name("guided_grammar"), "a string", *v);
    if (auto e = set_grammar(req, set_by, name("guided_grammar"), "ebnf", v->get<std::string>())) return e;
  }
  if (const json* so = field("structured_outputs")) {
    const std::string f = name("structured_outputs");
    if (!so->is_object()) return bad_type(f, "an object", *so);
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string k = it.key();
      if (k != "json" && k != "regex" && k != "choice" && k != "grammar" && k != "json_object" &&
          k != "disable_any_whitespace")
        return unsupported(f + "." + k, "not supported (json, regex, choice, grammar, json_object and "
                                        "disable_any_whitespace are)");
    }
    if (const json* v = given(*so, "json")) {
      std::string text;
      if (auto e = schema_text(*v, f + ".json", text)) return e;
      if (auto e = set_grammar(req, set_by, f + ".json", "json_schema", std::move(text))) return e;
    }
    if (const json* v = given(*so, "regex")) {
      if (!v->is_string()) return bad_type(f + ".regex", "a string", *v);
      if (auto e = set_grammar(req, set_by, f + ".regex", "regex", v->get<std::string>())) return e;
    }
    if (const json* v = given(*so, "choice")) {
      std::vector<std::string> choices;
      if (auto e = choice_list(*v, f + ".choice", choices)) return e;
      if (auto e = set_grammar(req, set_by, f + ".choice", "choice", "", std::move(choices))) return e;
    }
    if (const json* v = given(*so, "grammar")) {
      if (!v->is_string()) return bad_type(f + ".grammar", "a string", *v);
      if (auto e = set_grammar(req, set_by, f + ".grammar", "ebnf", v->get<std::string>())) return e;
    }
    if (const json* v = given(*so, "json_object")) {
      bool on = false;
      if (auto e = get_bool(*v, f + ".json_object", on)) return e;
      if (on)
        if (auto e = set_grammar(req, set_by, f + ".json_object", "json_object", "")) return e;
    }
    if (const json* v = given(*so, "disable_any_whitespace")) {
      bool off = false;
      if (auto e = get_bool(*v, f + ".disable_any_whitespace", off)) return e;
      req.grammar_any_whitespace = !off;
    }
  }
  return std::nullopt;
}

/// Fills `req` from the body object. `prefix` is "body." or "" (plain form).
/// `chat`: a /v1/chat/completions body (messages), else /v1/completions.
std::optional<LineError> parse_body(const json& body, const std::string& prefix, bool allow_custom_id,
                                    bool chat, BatchRequest& req) {
  // Unknown keys first: a typo is the likeliest mistake.
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (one_of(it.key(), kCommonKeys) || one_of(it.key(), kCommonRefusedKeys) ||
        (chat ? one_of(it.key(), kChatKeys) : one_of(it.key(), kCompletionKeys)))
      continue;
    if (allow_custom_id && it.key() == "custom_id") continue;
    std::string hint;
    if (chat && it.key() == "prompt") hint = " (chat lines give \"messages\")";
    if (!chat && it.key() == "messages") hint = " (a chat line needs \"url\": \"/v1/chat/completions\")";
    return LineError{"unknown_parameter", prefix + it.key() + ": unknown parameter" + hint};
  }
  if (auto e = check_refused(body, prefix, chat)) return e;
  auto field = [&](const char* k) { return given(body, k); };
  auto name = [&](const char* n) { return prefix + n; };
  req.chat = chat;

  if (chat) {
    const json* messages = field("messages");
    if (messages == nullptr) return LineError{"missing_prompt", name("messages") + ": missing"};
    if (auto e = parse_messages(*messages, name("messages"), req)) return e;
    if (const json* v = field("chat_template_kwargs")) {
      if (!v->is_object()) return bad_type(name("chat_template_kwargs"), "an object", *v);
      req.chat_template_kwargs_json = v->dump(-1, ' ', false, json::error_handler_t::replace);
    }
    if (const json* v = field("add_generation_prompt"))
      if (auto e = get_bool(*v, name("add_generation_prompt"), req.add_generation_prompt)) return e;
  } else if (auto e = parse_prompt(field("prompt"), name("prompt"), req)) {
    return e;
  }

  if (const json* v = field("model"); v != nullptr && !v->is_string())
    return bad_type(name("model"), "a string", *v);

  auto& p = req.params;
  if (const json* v = field("max_tokens"))
    if (auto e = get_int32(*v, name("max_tokens"), p.max_tokens)) return e;
  if (chat) {
    // vLLM: max_completion_tokens wins over the older max_tokens; with
    // neither, a chat line may generate to the end of the context.
    if (const json* v = field("max_completion_tokens")) {
      if (auto e = get_int32(*v, name("max_completion_tokens"), p.max_tokens)) return e;
    } else if (field("max_tokens") == nullptr) {
      p.max_tokens = std::numeric_limits<int>::max();
      req.max_tokens_from_context = true;
    }
  }
  if (const json* v = field("min_tokens"))
    if (auto e = get_int32(*v, name("min_tokens"), p.min_tokens)) return e;
  if (const json* v = field("top_k"))
    if (auto e = get_int32(*v, name("top_k"), p.top_k)) return e;
  if (const json* v = field("temperature"))
    if (auto e = get_float(*v, name("temperature"), p.temperature)) return e;
  if (const json* v = field("top_p"))
    if (auto e = get_float(*v, name("top_p"), p.top_p)) return e;
  if (const json* v = field("min_p"))
    if (auto e = get_float(*v, name("min_p"), p.min_p)) return e;
  if (const json* v = field("presence_penalty"))
    if (auto e = get_float(*v, name("presence_penalty"), p.presence_penalty)) return e;
  if (const json* v = field("frequency_penalty"))
    if (auto e = get_float(*v, name("frequency_penalty"), p.frequency_penalty)) return e;
  if (const json* v = field("repetition_penalty"))
    if (auto e = get_float(*v, name("repetition_penalty"), p.repetition_penalty)) return e;
  if (const json* v = field("ignore_eos"))
    if (auto e = get_bool(*v, name("ignore_eos"), p.ignore_eos)) return e;
  if (const json* v = field("return_token_ids"))
    if (auto e = get_bool(*v, name("return_token_ids"), req.return_token_ids)) return e;
  if (const json* v = field("seed")) {
    if (v->is_number_unsigned()) {
      p.seed = v->get<std::uint64_t>();
    } else {
      std::int64_t s = 0;
      if (auto e = get_int(*v, name("seed"), std::numeric_limits<std::int64_t>::min(),
                           std::numeric_limits<std::int64_t>::max(), s))
        return e;
      p.seed = static_cast<std::uint64_t>(s);
    }
    p.has_seed = true;
  }
  if (const json* v = field("n")) {
    if (auto e = get_int32(*v, name("n"), req.n)) return e;
    if (req.n < 1 || req.n > kMaxN)
      return LineError{"invalid_parameter", name("n") + ": must be in [1, " + std::to_string(kMaxN) +
                                                "], got " + std::to_string(req.n)};
  }
  if (const json* v = field("stop")) {
    if (v->is_string()) {
      p.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const auto& s : *v) {
        if (!s.is_string()) return bad_type(name("stop"), "a string or an array of strings", *v);
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return bad_type(name("stop"), "a string or an array of strings", *v);
    }
  }
  if (const json* v = field("stop_token_ids")) {
    if (!v->is_array()) return bad_type(name("stop_token_ids"), "an array of integers", *v);
    for (const auto& t : *v) {
      int id = 0;
      if (auto e = get_int32(t, name("stop_token_ids") + " element", id)) return e;
      p.stop_token_ids.push_back(id);
    }
  }
  if (auto e = parse_logprobs(field, name, chat, req)) return e;
  if (auto e = parse_structured_output(body, prefix, req)) return e;
  if (!chat) {
    if (const json* v = field("echo"))
      if (auto e = get_bool(*v, name("echo"), req.echo)) return e;
    if (req.echo && p.logprobs >= 0)
      return unsupported(name("echo"), "echo together with logprobs (prompt logprobs) is not supported");
    if (const json* v = field("best_of")) {
      int best_of = 0;
      if (auto e = get_int32(*v, name("best_of"), best_of)) return e;
      if (best_of != req.n)
        return unsupported(name("best_of"), "only best_of equal to n (" + std::to_string(req.n) +
                                                ") is supported, got " + std::to_string(best_of));
    }
  }
  if (Status st = p.validate(); !st.ok()) return LineError{"invalid_parameter", st.error().message};
  return std::nullopt;
}

BatchLine parse_impl(std::string_view line, std::uint64_t job_id, std::uint64_t line_index) {
  BatchRequest req;
  req.job_id = job_id;
  req.line_index = line_index;
  req.custom_id = default_custom_id(line_index);
  auto fail = [&](LineError e) {
    return BatchLine{make_error_result(job_id, line_index, req.custom_id, std::move(e.code),
                                       std::move(e.message))};
  };

  auto parsed = parse_json_bounded(line);
  if (!parsed.ok()) {
    std::string msg = is_blank_line(line)                                     ? "line: empty"
                      : parsed.error().code == ErrorCode::invalid_argument ? "line: " + parsed.error().message
                                                                            : "line: not valid JSON";
    return fail({"invalid_json", std::move(msg)});
  }
  json doc = std::move(parsed).value();
  if (!doc.is_object())
    return fail({"invalid_json", std::string("line: must be a JSON object, got ") + type_name(doc)});

  if (auto it = doc.find("custom_id"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) return fail(bad_type("custom_id", "a string", *it));
    req.custom_id = it->get<std::string>();
  }

  const bool wrapped = doc.contains("body") || doc.contains("method") || doc.contains("url");
  if (!wrapped) {
    // The plain form is a completions body, or a chat body when it has "messages".
    const bool chat = doc.contains("messages") && !doc.contains("prompt");
    if (auto e = parse_body(doc, "", /*allow_custom_id=*/true, chat, req)) return fail(std::move(*e));
    return BatchLine{std::move(req)};
  }

  if (auto it = doc.find("method"); it != doc.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "POST")
      return fail({"invalid_method", "method: must be \"POST\", got " + short_dump(*it)});
  }
  bool chat = false;
  if (auto it = doc.find("url"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) return fail(bad_type("url", "a string", *it));
    const auto url = it->get<std::string>();
    if (url == "/v1/chat/completions") {
      chat = true;
    } else if (url != "/v1/completions") {
      return fail({"unsupported_url", "url: \"" + url +
                                          "\" is not supported; use \"/v1/completions\" or \"/v1/chat/completions\""});
    }
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const auto& k = it.key();
    if (k != "custom_id" && k != "method" && k != "url" && k != "body")
      return fail({"unknown_parameter", k + ": unknown parameter"});
  }
  auto body = doc.find("body");
  if (body == doc.end() || body->is_null()) return fail({"missing_prompt", "body: missing"});
  if (!body->is_object()) return fail(bad_type("body", "an object", *body));
  if (auto e = parse_body(*body, "body.", /*allow_custom_id=*/false, chat, req)) return fail(std::move(*e));
  return BatchLine{std::move(req)};
}

}  // namespace

bool is_blank_line(std::string_view line) noexcept {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n' && c != '\f' && c != '\v') return false;
  return true;
}

std::string default_custom_id(std::uint64_t line_index) { return std::to_string(line_index + 1); }

BatchResult make_error_result(std::uint64_t job_id, std::uint64_t line_index, std::string custom_id,
                              std::string code, std::string message) {
  BatchResult r;
  r.job_id = job_id;
  r.line_index = line_index;
  r.custom_id = std::move(custom_id);
  r.ok = false;
  r.error_code = std::move(code);
  r.error_message = std::move(message);
  return r;
}

BatchLine parse_batch_line(std::string_view line, std::uint64_t job_id, std::uint64_t line_index) {
  try {
    return parse_impl(line, job_id, line_index);
  } catch (const std::exception& e) {  // nlohmann type errors etc.; should not happen
    return BatchLine{make_error_result(job_id, line_index, default_custom_id(line_index),
                                       "invalid_json", std::string("line: ") + e.what())};
  }
}

namespace {

ojson bytes_array(const std::string& bytes) {
  ojson a = ojson::array();
  for (unsigned char b : bytes) a.push_back(static_cast<int>(b));
  return a;
}

/// {"token", "logprob", "bytes"} of the chat format.
ojson chat_entry(const worker::TokenLogprobText& t) {
  ojson e;
  e["token"] = t.token;
  e["logprob"] = t.logprob;
  e["bytes"] = bytes_array(t.bytes);
  return e;
}

/// Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}.
ojson chat_logprobs(const worker::BatchChoice& c) {
  ojson content = ojson::array();
  for (const worker::ChoiceTokenLogprobs& t : c.logprobs) {
    ojson e = chat_entry(t.sampled);
    ojson top = ojson::array();
    for (const worker::TokenLogprobText& alt : t.top) top.push_back(chat_entry(alt));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  ojson lp;
  lp["content"] = std::move(content);
  lp["refusal"] = nullptr;
  return lp;
}

/// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
/// Each top_logprobs entry maps token text -> logprob for the top tokens and
/// the sampled one (as vLLM writes it); tokens with the same text keep the
/// first (most likely) value.
ojson completion_logprobs(const worker::BatchChoice& c) {
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top_logprobs = ojson::array(),
        text_offset = ojson::array();
  for (const worker::ChoiceTokenLogprobs& t : c.logprobs) {
    tokens.push_back(t.sampled.token);
    token_logprobs.push_back(t.sampled.logprob);
    ojson top = ojson::object();
    for (const worker::TokenLogprobText& alt : t.top)
      if (!top.contains(alt.token)) top[alt.token] = alt.logprob;
    if (!top.contains(t.sampled.token)) top[t.sampled.token] = t.sampled.logprob;
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(t.text_offset);
  }
  ojson lp;
  lp["tokens"] = std::move(tokens);
  lp["token_logprobs"] = std::move(token_logprobs);
  lp["top_logprobs"] = std::move(top_logprobs);
  lp["text_offset"] = std::move(text_offset);
  return lp;
}

}  // namespace

Result<std::string> new_output_id_key() {
  auto bytes = comm::random_bytes(16);
  if (!bytes.ok()) return bytes.error();
  return comm::to_hex(*bytes);
}

std::string output_line_id(std::string_view key, std::uint64_t line_index) {
  const auto word = [&](std::size_t at) {
    std::uint64_t v = 0;
    for (std::size_t i = at; i < at + 16 && i < key.size(); ++i) {
      const char c = key[i];
      v = v << 4 | static_cast<std::uint64_t>(c >= 'a' ? c - 'a' + 10 : c >= 'A' ? c - 'A' + 10 : c - '0');
    }
    return v;
  };
  const auto mix = [](std::uint64_t z) {  // SplitMix64's finalizer: a bijection of z
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  char out[33];
  std::snprintf(out, sizeof(out), "%016llx%016llx", static_cast<unsigned long long>(mix(word(0) + line_index)),
                static_cast<unsigned long long>(mix(word(16) ^ (line_index * 0x9E3779B97F4A7C15ull))));
  return std::string(out, 32);
}

std::string format_result_line(const BatchResult& r, std::string_view model, std::string_view request_id_prefix,
                               std::string_view output_id_key, std::uint64_t input_line) {
  const std::string suffix = output_id_key.empty() ? std::to_string(r.job_id) + "_" + std::to_string(r.line_index)
                                                   : output_line_id(output_id_key, r.line_index);
  ojson out;
  out["id"] = "batch_req_" + suffix;
  out["custom_id"] = r.custom_id;
  if (r.ok) {
    bool with_ids = false;
    for (const auto& c : r.choices) with_ids = with_ids || !c.token_ids.empty();
    ojson choices = ojson::array();
    for (const auto& c : r.choices) {
      ojson ch;
      ch["index"] = c.index;
      if (r.chat) {
        ojson message;
        message["role"] = "assistant";
        message["content"] = c.text;
        ch["message"] = std::move(message);
      } else {
        ch["text"] = c.text;
      }
      ch["finish_reason"] = c.finish_reason;
      if (with_ids) ch["token_ids"] = c.token_ids;
      if (r.logprobs < 0) ch["logprobs"] = nullptr;
      else ch["logprobs"] = r.chat ? chat_logprobs(c) : completion_logprobs(c);
      choices.push_back(std::move(ch));
    }
    ojson body;
    body["object"] = r.chat ? "chat.completion" : "text_completion";
    body["model"] = std::string(model);
    body["choices"] = std::move(choices);
    ojson usage;
    usage["prompt_tokens"] = r.prompt_tokens;
    usage["completion_tokens"] = r.completion_tokens;
    usage["total_tokens"] = static_cast<std::int64_t>(r.prompt_tokens) + r.completion_tokens;
    body["usage"] = std::move(usage);
    ojson response;
    response["status_code"] = 200;
    response["request_id"] = (r.chat ? "chat" : "") + std::string(request_id_prefix) + suffix;
    response["body"] = std::move(body);
    out["response"] = std::move(response);
    out["error"] = nullptr;
  } else {
    out["response"] = nullptr;
    ojson err;
    err["code"] = r.error_code;
    err["message"] = r.error_message;
    if (input_line > 0) err["line"] = input_line;
    out["error"] = std::move(err);
  }
  try {
    return out.dump(-1, ' ', false, ojson::error_handler_t::replace);
  } catch (const std::exception&) {  // cannot happen with the replace handler
    return "{\"id\":\"batch_req_" + suffix + "\",\"custom_id\":null,\"response\":null,"
           "\"error\":{\"code\":\"internal\",\"message\":\"output encoding failed\"}}";
  }
}

}  // namespace shardline::orchestrator
