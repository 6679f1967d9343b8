#include "sampling/structured_output/grammar.hpp"

#include <nlohmann/json.hpp>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "sampling/structured_output/xgrammar_log.hpp"

namespace shardline::sampling {
namespace {

[[nodiscard]] Error bad(std::string message) { return make_error(ErrorCode::invalid_argument, std::move(message)); }

/// xgrammar's message without its "[HH:MM:SS] file:line: " prefix and
/// trailing newline: what the line's error shows.
[[nodiscard]] std::string xgrammar_message(const std::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m.front() == '[') {
    // "[12:00:00] /path/file.cc:123: message" -> "message"
    const std::size_t close = m.find("] ");
    const std::size_t colon = close == std::string::npos ? std::string::npos : m.find(": ", close + 2);
    if (colon != std::string::npos) m = m.substr(colon + 2);
  }
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

/// A choice as an EBNF string literal: the bytes with \\, \", and control
/// bytes escaped (\n, \r, \t, \xHH), as xgrammar's EBNF parser reads them.
[[nodiscard]] std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\' || c == '"') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// JSON Schema string formats whose xgrammar regex is wider than the format
// (json_schema_converter.cc: a date's day up to 31 in every month, an
// IPv4 byte with leading zeros, a date-time's second 60), replaced by exact
// patterns before compiling, so that every output validates:
//  - date: RFC 3339 full-date, years 0001-9999, each month's days, Feb 29
//    in leap years only (divisible by 4, centuries by 400);
//  - date-time: that date, "T", hh:mm:ss (seconds 00-59) with an optional
//    fraction, "Z" or a +hh:mm / -hh:mm offset;
//  - ipv4: four decimal bytes 0-255 without leading zeros (RFC 2673's
//    dotted-quad, as Python's ipaddress reads it).
constexpr const char* kDatePattern =
    "((000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-"
    "((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)|"
    "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)";
constexpr const char* kTimePattern =
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]+){0,1}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
constexpr const char* kIpv4Byte = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";

[[nodiscard]] std::optional<std::string> exact_format_pattern(const std::string& format) {
  if (format == "date") return std::string("^") + kDatePattern + "$";
  if (format == "date-time") return std::string("^") + kDatePattern + "T" + kTimePattern + "$";
  if (format == "ipv4")
    return std::string("^(") + kIpv4Byte + "[.]){3}" + kIpv4Byte + "$";
  return std::nullopt;
}

/// A `pattern` as xgrammar 0.2.9 enforces it inside a JSON string: there
/// an optional group whose body repeats, `(x[0-9]+)?`, loses its first
/// element (its outputs include "a8932b" for ^a(x[0-9]+)?b$; the same regex
/// compiled alone is right), while `(x[0-9]+){0,1}` is right. So, outside
/// character classes and escapes, `)?` (and the lazy `)??`) becomes
/// `){0,1}` and a non-capturing `(?:` a plain `(`: the same language.
[[nodiscard]] std::string workaround_optional_groups(const std::string& re) {
  std::string out;
  out.reserve(re.size() + 8);
  bool in_class = false;
  for (std::size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {  // an escape: copied as it is
      out += c;
      out += re[++i];
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
      if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];  // a leading ] is a member
      continue;
    }
    if (c == '(' && re.compare(i + 1, 2, "?:") == 0) {
      out += '(';
      i += 2;
      continue;
    }
    if (c == ')' && i + 1 < re.size() && re[i + 1] == '?') {
      out += "){0,1}";
      ++i;
      if (i + 1 < re.size() && re[i + 1] == '?') ++i;  // lazy: the same language
      continue;
    }
    out += c;
  }
  return out;
}

/// Keywords xgrammar 0.2.9 accepts and ignores without a word
/// (json_schema_converter.cc calls WarnUnsupportedKeywords with verbose
/// off): a schema using one is refused, since outputs could break it.
constexpr const char* kIgnoredKeywords[] = {"not",         "if",         "then",       "else",
                                            "dependentRequired", "dependentSchemas", "uniqueItems",
                                            "contains",    "minContains", "maxContains"};

/// Walks a schema and its subschemas by JSON Schema's structure (keywords
/// holding a schema, an array of schemas or a map of names to schemas;
/// nothing inside enum, const, default or examples values): refuses the
/// ignored keywords and replaces the formats above by their exact patterns.
/// Errors: invalid_argument naming the keyword, or a format given together
/// with a pattern (xgrammar would keep one of them).
[[nodiscard]] Status check_schema(nlohmann::json& schema) {
  if (!schema.is_object()) return {};  // true / false
  for (const char* keyword : kIgnoredKeywords)
    if (schema.contains(keyword))
      return bad(std::string("keyword \"") + keyword + "\" is not supported (the grammar engine would ignore it)");
  if (auto f = schema.find("format"); f != schema.end() && f->is_string()) {
    if (auto pattern = exact_format_pattern(f->get<std::string>())) {
      if (schema.contains("pattern"))
        return bad("format \"" + f->get<std::string>() + "\" together with a pattern is not supported");
      schema.erase(f);
      schema["pattern"] = *pattern;
    }
  }
  if (auto p = schema.find("pattern"); p != schema.end() && p->is_string())
    *p = workaround_optional_groups(p->get<std::string>());
  for (const char* key : {"items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems",
                          "propertyNames", "additionalItems"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    if (it->is_array()) {  // draft-04 tuple items
      for (auto& sub : *it)
        if (Status st = check_schema(sub); !st.ok()) return st;
    } else if (Status st = check_schema(*it); !st.ok()) {
      return st;
    }
  }
  for (const char* key : {"allOf", "anyOf", "oneOf", "prefixItems"})
    if (auto it = schema.find(key); it != schema.end() && it->is_array())
      for (auto& sub : *it)
        if (Status st = check_schema(sub); !st.ok()) return st;
  for (const char* key : {"properties", "patternProperties", "$defs", "definitions"})
    if (auto it = schema.find(key); it != schema.end() && it->is_object())
      for (auto& [name, sub] : it->items())
        if (Status st = check_schema(sub); !st.ok()) return st;
  return {};
}

/// With any_whitespace, at most this many whitespace characters in a row
/// between JSON tokens (xgrammar's max_whitespace_cnt): unbounded, a greedy
/// small model can emit spaces or newlines until max_tokens (found with
/// stories260K on `{"type": "object", ...}`: "{ " then whitespace).
constexpr int kMaxWhitespaceRun = 4;

/// DLTensor over one row of a bitmask (xgrammar reads int32 words).
struct BitmaskTensor {
  std::int64_t shape[1];
  DLTensor tensor;
  explicit BitmaskTensor(std::span<std::uint32_t> words) : shape{static_cast<std::int64_t>(words.size())} {
    tensor.data = words.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = xgrammar::GetBitmaskDLType();
    tensor.shape = shape;
    tensor.strides = nullptr;
    tensor.byte_offset = 0;
  }
};

}  // namespace

const char* grammar_kind_name(GrammarKind kind) noexcept {
  switch (kind) {
    case GrammarKind::json_schema: return "json_schema";
    case GrammarKind::json_object: return "json_object";
    case GrammarKind::regex: return "regex";
    case GrammarKind::choice: return "choice";
    case GrammarKind::ebnf: return "ebnf";
  }
  return "unknown";
}

std::optional<GrammarKind> parse_grammar_kind(std::string_view name) noexcept {
  for (const GrammarKind k : {GrammarKind::json_schema, GrammarKind::json_object, GrammarKind::regex,
                              GrammarKind::choice, GrammarKind::ebnf})
    if (name == grammar_kind_name(k)) return k;
  return std::nullopt;
}

int bitmask_words(int vocab_size) noexcept { return vocab_size <= 0 ? 0 : (vocab_size + 31) / 32; }

void apply_token_bitmask(std::span<float> logits, std::span<const std::uint32_t> bitmask) noexcept {
  // A grammar allows few tokens at most steps, so most words are 0: those
  // fill 32 logits at once, and a mixed word's loop has no branch (both
  // vectorize); a word of all ones leaves its logits as they are.
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const std::size_t n = logits.size();
  float* l = logits.data();
  for (std::size_t w = 0; w * 32 < n; ++w) {
    const std::uint32_t word = bitmask[w];
    if (word == 0xFFFFFFFFu) continue;
    const std::size_t begin = w * 32, end = std::min(n, begin + 32);
    if (word == 0) {
      std::fill(l + begin, l + end, neg_inf);
      continue;
    }
    for (std::size_t i = begin; i < end; ++i) l[i] = ((word >> (i - begin)) & 1u) != 0 ? l[i] : neg_inf;
  }
}

// ---- CompiledGrammar ---------------------------------------------------------------

struct CompiledGrammar::Impl {
  xgrammar::CompiledGrammar grammar;
};

CompiledGrammar::CompiledGrammar(std::unique_ptr<Impl> impl, int vocab_size)
    : impl_(std::move(impl)), vocab_size_(vocab_size) {}
CompiledGrammar::~CompiledGrammar() = default;

// ---- GrammarCompiler ---------------------------------------------------------------

struct GrammarCompiler::Impl {
  xgrammar::GrammarCompiler compiler;
  std::mutex mu;
  /// (kind, text, choices, any_whitespace) -> the compiled grammar.
  std::map<std::tuple<int, std::string, std::vector<std::string>, bool>, std::shared_ptr<const CompiledGrammar>> cache;
  std::atomic<long long> compiled{0};
};

GrammarCompiler::GrammarCompiler(std::unique_ptr<Impl> impl, int vocab_size)
    : impl_(std::move(impl)), vocab_size_(vocab_size) {}
GrammarCompiler::~GrammarCompiler() = default;

Result<std::shared_ptr<GrammarCompiler>> GrammarCompiler::create(const text::Tokenizer& tokenizer, int vocab_size,
                                                                 std::vector<std::int32_t> stop_token_ids,
                                                                 int max_threads) {
  const int tokenizer_vocab = tokenizer.vocab_size();
  if (vocab_size < tokenizer_vocab)
    return bad("grammar compiler: vocab_size " + std::to_string(vocab_size) + " is below the tokenizer's " +
               std::to_string(tokenizer_vocab));
  if (stop_token_ids.empty()) return bad("grammar compiler: no stop token");
  for (const std::int32_t id : stop_token_ids)
    if (id < 0 || id >= vocab_size)
      return bad("grammar compiler: stop token " + std::to_string(id) + " is outside the vocabulary of " +
                 std::to_string(vocab_size));
  if (max_threads < 1) return bad("grammar compiler: max_threads must be >= 1");
  // Each token as the bytes it adds to text (RAW: used as they are);
  // special tokens empty, which xgrammar never allows (but as stop tokens).
  std::vector<std::string> vocab(static_cast<std::size_t>(tokenizer_vocab));
  for (int id = 0; id < tokenizer_vocab; ++id)
    if (!tokenizer.is_special(id)) vocab[static_cast<std::size_t>(id)] = tokenizer.token_bytes(id);
  try {
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, vocab_size, stop_token_ids, false);
    auto impl = std::unique_ptr<Impl>(new Impl{xgrammar::GrammarCompiler(info, max_threads, false), {}, {}, {}});
    return std::shared_ptr<GrammarCompiler>(new GrammarCompiler(std::move(impl), vocab_size));
  } catch (const std::exception& e) {
    return bad("grammar compiler: " + xgrammar_message(e));
  }
}

long long GrammarCompiler::num_compiled() const noexcept { return impl_->compiled.load(); }

Result<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::compile(const GrammarSpec& spec) {
  auto key = std::make_tuple(static_cast<int>(spec.kind), spec.kind == GrammarKind::json_object ? "" : spec.text,
                             spec.kind == GrammarKind::choice ? spec.choices : std::vector<std::string>{},
                             spec.any_whitespace);
  {
    std::lock_guard lock(impl_->mu);
    if (auto it = impl_->cache.find(key); it != impl_->cache.end()) return it->second;
  }
  if (spec.kind == GrammarKind::choice && spec.choices.empty()) return bad("choice: no choices given");
  std::optional<xgrammar::CompiledGrammar> compiled;
  detail::WarningCapture warnings;
  try {
    switch (spec.kind) {
      case GrammarKind::json_schema: {
        std::string schema = spec.text;
        nlohmann::json parsed = nlohmann::json::parse(spec.text, nullptr, false);
        if (!parsed.is_discarded()) {  // (else xgrammar reports the parse error)
          if (Status s = check_schema(parsed); !s.ok())
            return bad(std::string("json_schema: ") + s.error().message);
          schema = parsed.dump();
        }
        compiled = impl_->compiler.CompileJSONSchema(schema, spec.any_whitespace, std::nullopt, std::nullopt,
                                                     /*strict_mode=*/true, kMaxWhitespaceRun);
        break;
      }
      case GrammarKind::json_object:
        // Any JSON object (OpenAI's json_object), as the schema
        // {"type": "object"} with its properties open (not strict), so the
        // whitespace between tokens is bounded as for a schema (xgrammar's
        // builtin JSON grammar has no bound, and allows any JSON value).
        compiled = impl_->compiler.CompileJSONSchema(R"({"type": "object"})", spec.any_whitespace, std::nullopt,
                                                     std::nullopt, /*strict_mode=*/false, kMaxWhitespaceRun);
        break;
      case GrammarKind::regex:
        compiled = impl_->compiler.CompileRegex(spec.text);
        break;
      case GrammarKind::choice: {
        std::string ebnf = "root ::= ";
        for (std::size_t i = 0; i < spec.choices.size(); ++i)
          ebnf += (i == 0 ? "" : " | ") + ebnf_literal(spec.choices[i]);
        compiled = impl_->compiler.CompileGrammar(ebnf, "root");
        break;
      }
      case GrammarKind::ebnf:
        compiled = impl_->compiler.CompileGrammar(spec.text, "root");
        break;
    }
  } catch (const std::exception& e) {
    return bad(std::string(grammar_kind_name(spec.kind)) + ": " + xgrammar_message(e));
  }
  // xgrammar compiled it but said it ignores part of it: its outputs would
  // not be guaranteed to match, so it is refused.
  if (!warnings.warnings().empty()) {
    std::string why;
    for (const std::string& w : warnings.warnings()) why += (why.empty() ? "" : "; ") + w;
    return bad(std::string(grammar_kind_name(spec.kind)) + ": not supported by the grammar engine: " + why);
  }
  auto out = std::shared_ptr<const CompiledGrammar>(
      new CompiledGrammar(std::unique_ptr<CompiledGrammar::Impl>(new CompiledGrammar::Impl{std::move(*compiled)}),
                          vocab_size_));
  impl_->compiled.fetch_add(1);
  std::lock_guard lock(impl_->mu);
  return impl_->cache.emplace(std::move(key), std::move(out)).first->second;
}

// ---- GrammarMatcher ----------------------------------------------------------------

struct GrammarMatcher::Impl {
  std::shared_ptr<const CompiledGrammar> grammar;
  xgrammar::GrammarMatcher matcher;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : vocab_size_(grammar->vocab_size()) {
  xgrammar::GrammarMatcher m(grammar->impl_->grammar);
  impl_ = std::unique_ptr<Impl>(new Impl{std::move(grammar), std::move(m)});
}
GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

Status GrammarMatcher::fill_next_token_bitmask(std::span<std::uint32_t> bitmask) {
  if (static_cast<int>(bitmask.size()) != bitmask_words(vocab_size_))
    return bad("token bitmask of " + std::to_string(bitmask.size()) + " words, " +
               std::to_string(bitmask_words(vocab_size_)) + " expected");
  if (impl_->matcher.IsTerminated())
    return make_error(ErrorCode::internal, "token bitmask asked after the grammar's stop token");
  try {
    BitmaskTensor t(bitmask);
    impl_->matcher.FillNextTokenBitmask(&t.tensor, 0);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "token bitmask: " + xgrammar_message(e));
  }
  return {};
}

Status GrammarMatcher::accept_token(std::int32_t token_id) {
  if (token_id < 0 || token_id >= vocab_size_)
    return bad("token " + std::to_string(token_id) + " is outside the vocabulary of " + std::to_string(vocab_size_));
  if (impl_->matcher.IsTerminated()) return bad("token " + std::to_string(token_id) + " after the stop token");
  if (!impl_->matcher.AcceptToken(token_id))
    return bad("token " + std::to_string(token_id) + " is not allowed by the grammar here");
  ++num_accepted_;
  return {};
}

Status GrammarMatcher::rollback(int num_tokens) {
  if (num_tokens < 0 || num_tokens > num_accepted_)
    return bad("rollback of " + std::to_string(num_tokens) + " tokens, " + std::to_string(num_accepted_) +
               " accepted");
  try {
    impl_->matcher.Rollback(num_tokens);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "rollback: " + xgrammar_message(e));
  }
  num_accepted_ -= num_tokens;
  return {};
}

bool GrammarMatcher::is_terminated() const { return impl_->matcher.IsTerminated(); }

}  // namespace shardline::sampling
