#include "orchestrator/batch_format.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

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

bool is_body_key(const std::string& k) {
  static const char* const kKeys[] = {
      "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
      "return_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
      "ignore_eos", "stop_token_ids"};
  for (const char* key : kKeys)
    if (k == key) return true;
  return false;
}

/// Fills `req` from the body object. `prefix` is "body." or "" (for messages).
std::optional<LineError> parse_body(const json& body, const std::string& prefix, bool allow_custom_id,
                                    BatchRequest& req) {
  // Unknown keys first: a typo is the likeliest mistake.
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (is_body_key(it.key())) continue;
    if (allow_custom_id && it.key() == "custom_id") continue;
    return LineError{"unknown_parameter", prefix + it.key() + ": unknown parameter"};
  }
  auto field = [&](const char* name) -> const json* {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  };
  auto name = [&](const char* n) { return prefix + n; };

  // prompt
  const json* prompt = field("prompt");
  if (prompt == nullptr) return LineError{"missing_prompt", name("prompt") + ": missing"};
  if (prompt->is_string()) {
    req.prompt = prompt->get<std::string>();
    if (req.prompt.empty()) return LineError{"invalid_parameter", name("prompt") + ": must not be empty"};
  } else if (prompt->is_array()) {
    if (prompt->empty()) return LineError{"invalid_parameter", name("prompt") + ": must not be empty"};
    req.prompt_token_ids.reserve(prompt->size());
    for (const auto& t : *prompt) {
      if (t.is_string() || t.is_array())
        return LineError{"invalid_parameter",
                         name("prompt") + ": arrays of prompts are not supported (one prompt per line); "
                                          "an array must hold token ids"};
      int id = 0;
      if (auto e = get_int32(t, name("prompt") + " token id", id)) return e;
      if (id < 0)
        return LineError{"invalid_parameter",
                         name("prompt") + ": token ids must be >= 0, got " + std::to_string(id)};
      req.prompt_token_ids.push_back(id);
    }
  } else {
    return bad_type(name("prompt"), "a string or an array of token ids", *prompt);
  }

  if (const json* v = field("model"); v != nullptr && !v->is_string())
    return bad_type(name("model"), "a string", *v);

  auto& p = req.params;
  if (const json* v = field("max_tokens"))
    if (auto e = get_int32(*v, name("max_tokens"), p.max_tokens)) return e;
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

  json doc = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    std::string msg = is_blank_line(line) ? "line: empty" : "line: not valid JSON";
    return fail({"invalid_json", std::move(msg)});
  }
  if (!doc.is_object())
    return fail({"invalid_json", std::string("line: must be a JSON object, got ") + type_name(doc)});

  if (auto it = doc.find("custom_id"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) return fail(bad_type("custom_id", "a string", *it));
    req.custom_id = it->get<std::string>();
  }

  const bool wrapped = doc.contains("body") || doc.contains("method") || doc.contains("url");
  if (!wrapped) {
    if (auto e = parse_body(doc, "", /*allow_custom_id=*/true, req)) return fail(std::move(*e));
    return BatchLine{std::move(req)};
  }

  if (auto it = doc.find("method"); it != doc.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "POST")
      return fail({"invalid_method", "method: must be \"POST\", got " + short_dump(*it)});
  }
  if (auto it = doc.find("url"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) return fail(bad_type("url", "a string", *it));
    const auto url = it->get<std::string>();
    if (url == "/v1/chat/completions")
      return fail({"unsupported_url", "url: chat completions are not supported yet (" + url + ")"});
    if (url != "/v1/completions")
      return fail({"unsupported_url", "url: \"" + url + "\" is not supported; use \"/v1/completions\""});
  }
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const auto& k = it.key();
    if (k != "custom_id" && k != "method" && k != "url" && k != "body")
      return fail({"unknown_parameter", k + ": unknown parameter"});
  }
  auto body = doc.find("body");
  if (body == doc.end() || body->is_null()) return fail({"missing_prompt", "body: missing"});
  if (!body->is_object()) return fail(bad_type("body", "an object", *body));
  if (auto e = parse_body(*body, "body.", /*allow_custom_id=*/false, req)) return fail(std::move(*e));
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

std::string format_result_line(const BatchResult& r, std::string_view model,
                               std::string_view request_id_prefix) {
  const std::string suffix = std::to_string(r.job_id) + "_" + std::to_string(r.line_index);
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
      ch["text"] = c.text;
      ch["finish_reason"] = c.finish_reason;
      if (with_ids) ch["token_ids"] = c.token_ids;
      ch["logprobs"] = nullptr;
      choices.push_back(std::move(ch));
    }
    ojson body;
    body["object"] = "text_completion";
    body["model"] = std::string(model);
    body["choices"] = std::move(choices);
    ojson usage;
    usage["prompt_tokens"] = r.prompt_tokens;
    usage["completion_tokens"] = r.completion_tokens;
    usage["total_tokens"] = static_cast<std::int64_t>(r.prompt_tokens) + r.completion_tokens;
    body["usage"] = std::move(usage);
    ojson response;
    response["status_code"] = 200;
    response["request_id"] = std::string(request_id_prefix) + suffix;
    response["body"] = std::move(body);
    out["response"] = std::move(response);
    out["error"] = nullptr;
  } else {
    out["response"] = nullptr;
    ojson err;
    err["code"] = r.error_code;
    err["message"] = r.error_message;
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
