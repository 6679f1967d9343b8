#include "text/bpe_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <utility>

namespace shardline::text {
namespace {

using json = nlohmann::json;

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
// GPT-2's pattern, used by a ByteLevel pre-tokenizer with use_regex = true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::size_t kMaxCachedWord = 64;
constexpr std::size_t kMaxCacheEntries = 1 << 17;

/// GPT-2 bytes_to_unicode: byte -> code point, and its inverse (-1: none).
struct ByteLevelTable {
  char32_t to_cp[256];
  std::int16_t to_byte[324];
  ByteLevelTable() {
    std::fill(std::begin(to_byte), std::end(to_byte), std::int16_t{-1});
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      to_byte[to_cp[b]] = static_cast<std::int16_t>(b);
    }
  }
};
const ByteLevelTable& byte_level() {
  static const ByteLevelTable table;
  return table;
}

/// Byte-level token string ("Ġthe") -> raw bytes (" the"); nullopt when a
/// character is outside the byte-level alphabet.
std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  const auto& table = byte_level();
  for (std::size_t i = 0; i < token.size();) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(token.data() + i),
                                    static_cast<utf8proc_ssize_t>(token.size() - i), &cp);
    if (n <= 0 || cp < 0 || cp >= 324 || table.to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(table.to_byte[cp]);
    i += static_cast<std::size_t>(n);
  }
  return out;
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
         static_cast<std::uint32_t>(b);
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

/// A compiled PCRE2 pattern (UTF + UCP, JIT when available).
struct Regex {
  pcre2_code* code = nullptr;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Result<std::shared_ptr<Regex>> compile_regex(const std::string& pattern, bool literal, const std::string& where) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  // (PCRE2_LITERAL allows UTF but not UCP.)
  const std::uint32_t flags = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
  auto re = std::make_shared<Regex>();
  re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags, &err, &offset, nullptr);
  if (re->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return make_error(ErrorCode::corrupt, where + " regex: " + reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if no JIT
  return re;
}

/// A part of a text: [begin, end) and whether the pattern matched it.
struct Span {
  std::size_t begin, end;
  bool is_match;
};

/// The matches of `re` in `text` and the gaps between them, in order,
/// covering the whole text (tokenizers' `Pattern::find_matches`; empty
/// matches are skipped, PCRE2_NOTEMPTY).
std::vector<Span> find_matches(const Regex& re, std::string_view text) {
  std::vector<Span> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re.code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;
  while (pos < text.size()) {
    constexpr std::uint32_t kOptions = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY;
    int rc = pcre2_match(re.code, subject, text.size(), pos, kOptions, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // pathological input: use the interpreter
      rc = pcre2_match(re.code, subject, text.size(), pos, kOptions | PCRE2_NO_JIT, md, nullptr);
    if (rc < 0) break;  // no further match: the rest is one gap
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > pos) out.push_back({pos, ov[0], false});
    out.push_back({ov[0], ov[1], true});
    pos = ov[1];
  }
  if (pos < text.size()) out.push_back({pos, text.size(), false});
  pcre2_match_data_free(md);
  return out;
}

/// tokenizers' SplitDelimiterBehavior.
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Result<SplitBehavior> parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  return make_error(ErrorCode::unsupported, "Split behavior " + name);
}

/// The pieces of `text` split at the matches of `re` as `behavior` says
/// (tokenizers' NormalizedString::split), each piece non-empty.
std::vector<Span> split_spans(const Regex& re, std::string_view text, SplitBehavior behavior, bool invert) {
  std::vector<Span> m = find_matches(re, text);
  if (invert)
    for (Span& x : m) x.is_match = !x.is_match;
  std::vector<Span> out;
  switch (behavior) {
    case SplitBehavior::isolated:
      out = std::move(m);
      break;
    case SplitBehavior::removed:
      for (const Span& x : m)
        if (!x.is_match) out.push_back(x);
      break;
    case SplitBehavior::merged_with_previous: {
      bool previous_match = false;
      for (const Span& x : m) {
        if (x.is_match && !previous_match && !out.empty())
          out.back().end = x.end;
        else
          out.push_back(x);
        previous_match = x.is_match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool previous_match = false;
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty())
          out.back().begin = it->begin;
        else
          out.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::contiguous: {
      bool previous_match = false;
      for (const Span& x : m) {
        if (x.is_match == previous_match && !out.empty())
          out.back().end = x.end;
        else
          out.push_back(x);
        previous_match = x.is_match;
      }
      break;
    }
  }
  std::erase_if(out, [](const Span& x) { return x.end <= x.begin; });
  return out;
}

/// `text` with every match of `re` replaced by `content` (literally).
std::string replace_all(const Regex& re, std::string_view text, std::string_view content) {
  std::string out;
  out.reserve(text.size());
  for (const Span& x : find_matches(re, text)) {
    if (x.is_match)
      out += content;
    else
      out.append(text.substr(x.begin, x.end - x.begin));
  }
  return out;
}

/// Rust's char::is_whitespace.
bool is_whitespace_cp(utf8proc_int32_t cp) {
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cp == 0x2028 || cp == 0x2029) return true;
  return cp > 0x7F && utf8proc_category(cp) == UTF8PROC_CATEGORY_ZS;
}

/// Code points of `text` with their byte offsets: (offset, length, cp).
template <typename Fn>
void for_each_cp(std::string_view text, Fn&& fn) {
  for (std::size_t i = 0; i < text.size();) {
    utf8proc_int32_t cp = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                              static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (n <= 0) n = 1;  // invalid byte (utf8_lossy ran before: cannot happen)
    if (!fn(i, static_cast<std::size_t>(n), cp)) return;
    i += static_cast<std::size_t>(n);
  }
}

bool is_word_char(utf8proc_int32_t cp) {
  if (cp < 0x80) return std::isalnum(cp) != 0 || cp == '_';
  const auto c = utf8proc_category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || c == UTF8PROC_CATEGORY_ND ||
         c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

/// "<0x0A>" -> 10; -1 when `token` is not a byte-fallback token.
int byte_fallback_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  const auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(token[3]), lo = hex(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string replace_literal(std::string text, std::string_view from, std::string_view to) {
  if (from.empty()) return text;
  std::string out;
  std::size_t pos = 0;
  for (std::size_t at; (at = text.find(from, pos)) != std::string::npos; pos = at + from.size()) {
    out.append(text, pos, at - pos);
    out += to;
  }
  out.append(text, pos);
  return out;
}

/// The steps of a tokenizer.json component, in order: a "Sequence" node's
/// `list_key` entries, flattened (nested Sequences too); null: none.
/// Errors: what json::at throws for a node without "type" or list.
std::vector<const json*> sequence_steps(const json& node, const char* list_key) {
  std::vector<const json*> steps;
  std::vector<const json*> todo{&node};
  while (!todo.empty()) {
    const json* n = todo.back();
    todo.pop_back();
    if (n->is_null()) continue;
    if (n->at("type").get_ref<const std::string&>() != "Sequence") {
      steps.push_back(n);
      continue;
    }
    const json& list = n->at(list_key);
    for (auto it = list.rbegin(); it != list.rend(); ++it) todo.push_back(&*it);
  }
  return steps;
}

}  // namespace

std::string utf8_lossy(std::string_view s, std::string* tail) {
  std::string out;
  out.reserve(s.size());
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char b0 = byte(i);
    if (b0 < 0x80) {
      out += static_cast<char>(b0);
      ++i;
      continue;
    }
    // Unicode Table 3-7: sequence length and the allowed range of byte 2.
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    }
    std::size_t k = 1;  // bytes that form a valid (partial) sequence
    bool bad = need == 0;
    for (; !bad && k <= static_cast<std::size_t>(need); ++k) {
      if (i + k >= s.size()) break;  // truncated at the end of input
      const unsigned char b = byte(i + k);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) bad = true;
      if (bad) break;
    }
    if (!bad && k > static_cast<std::size_t>(need)) {
      out.append(s.substr(i, k));
    } else if (!bad && tail != nullptr) {  // incomplete at the end: hold back
      *tail = std::string(s.substr(i));
      return out;
    } else {
      out += kReplacement;
    }
    i += k;
  }
  if (tail != nullptr) tail->clear();
  return out;
}

struct BpeTokenizer::NormStep {
  enum class Kind { nfc, nfd, nfkc, nfkd, prepend, replace, strip, lowercase } kind = Kind::nfc;
  std::string content;           ///< prepend: the prefix; replace: the replacement
  std::shared_ptr<Regex> regex;  ///< replace: the pattern
  std::optional<std::string> literal;  ///< replace: the pattern when it is a String
  bool left = false, right = false;  ///< strip
};

struct BpeTokenizer::PreStep {
  enum class Kind { split, byte_level, metaspace } kind = Kind::split;
  std::shared_ptr<Regex> regex;  ///< split; byte_level with use_regex
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;    ///< byte_level
  std::string replacement;          ///< metaspace ("▁")
  enum class Prepend { always, first, never } prepend = Prepend::always;  ///< metaspace
  bool metaspace_split = true;      ///< metaspace: split at each replacement (MergedWithNext)
};

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::load(const std::filesystem::path& file,
                                                         std::optional<bool> add_bos_token,
                                                         std::string_view bos_token,
                                                         std::string_view eos_token) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, file.string() + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return load_json(buffer.str(), file.string(), add_bos_token, bos_token, eos_token);
}

/// The parts of a tokenizer.json, each read into a BpeTokenizer; load_json
/// calls them in the order below. Each returns unsupported naming what it
/// cannot read, or corrupt; a json::exception (a missing or mistyped
/// field) is load_json's to report.
struct BpeTokenizer::Loader {
  BpeTokenizer& t;
  const std::string& name;  ///< prefixes every error

  [[nodiscard]] Error unsupported(const std::string& what) const {
    return make_error(ErrorCode::unsupported, name + ": " + what);
  }
  /// A string field that may be null or absent ("" then).
  [[nodiscard]] static std::string str_or_empty(const json& obj, const char* key) {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? std::string() : it->get<std::string>();
  }
  /// A Split-style pattern {"String": s} or {"Regex": r}.
  [[nodiscard]] Result<std::shared_ptr<Regex>> pattern_of(const json& pat, const std::string& where) const {
    const bool literal = pat.contains("String");
    const std::string text = literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>();
    auto re = compile_regex(text, literal, where);
    if (!re.ok()) return make_error(re.error().code, name + ": " + re.error().message);
    return re;
  }

  [[nodiscard]] Status pre_tokenizer(const json& node);
  [[nodiscard]] Status model(const json& model, const json& added);
  [[nodiscard]] Status decoder(const json& node);
  void added_tokens(const json& added);
  [[nodiscard]] Status normalizer(const json& node);
  [[nodiscard]] Status post_processor(const json& node);
};

/// "pre_tokenizer": the split steps. Read first: a ByteLevel one makes the
/// model byte-level.
Status BpeTokenizer::Loader::pre_tokenizer(const json& node) {
  for (const json* p : sequence_steps(node, "pretokenizers")) {
    const auto type = p->at("type").get<std::string>();
    auto step = std::make_shared<PreStep>();
    if (type == "ByteLevel") {
      t.byte_level_ = true;
      step->kind = PreStep::Kind::byte_level;
      step->add_prefix_space = p->value("add_prefix_space", false);
      if (p->value("use_regex", true)) {
        auto re = compile_regex(kGpt2Pattern, false, "ByteLevel");
        if (!re.ok()) return std::move(re).error();
        step->regex = std::move(re).value();
      }
    } else if (type == "Split") {
      auto behavior = parse_behavior(p->value("behavior", std::string("Isolated")));
      if (!behavior.ok()) return unsupported("pre-tokenizer " + behavior.error().message);
      auto re = pattern_of(p->at("pattern"), "pre-tokenizer Split");
      if (!re.ok()) return std::move(re).error();
      step->regex = std::move(re).value();
      step->behavior = *behavior;
      step->invert = p->value("invert", false);
      if (*behavior == SplitBehavior::removed) t.drops_non_whitespace_ = true;
    } else if (type == "Metaspace") {
      step->kind = PreStep::Kind::metaspace;
      step->replacement = p->value("replacement", std::string("\xE2\x96\x81"));
      std::string scheme = str_or_empty(*p, "prepend_scheme");
      if (scheme.empty()) scheme = p->value("add_prefix_space", true) ? "always" : "never";
      if (scheme == "always") step->prepend = PreStep::Prepend::always;
      else if (scheme == "first") step->prepend = PreStep::Prepend::first;
      else if (scheme == "never") step->prepend = PreStep::Prepend::never;
      else return unsupported("Metaspace prepend_scheme " + scheme);
      step->metaspace_split = p->value("split", true);
    } else if (type == "Digits") {
      auto re = compile_regex(R"(\p{N})", false, "Digits");
      if (!re.ok()) return std::move(re).error();
      step->regex = std::move(re).value();
      step->behavior = p->value("individual_digits", false) ? SplitBehavior::isolated : SplitBehavior::contiguous;
    } else if (type == "Punctuation") {
      auto behavior = parse_behavior(p->value("behavior", std::string("Isolated")));
      if (!behavior.ok()) return unsupported("pre-tokenizer Punctuation " + behavior.error().message);
      // Rust's is_ascii_punctuation || is_punctuation (category P*).
      auto re = compile_regex(R"([\p{P}\x21-\x2F\x3A-\x40\x5B-\x60\x7B-\x7E])", false, "Punctuation");
      if (!re.ok()) return std::move(re).error();
      step->regex = std::move(re).value();
      step->behavior = *behavior;
    } else if (type == "Whitespace") {
      auto re = compile_regex(R"(\w+|[^\w\s]+)", false, "Whitespace");
      if (!re.ok()) return std::move(re).error();
      step->regex = std::move(re).value();
      step->behavior = SplitBehavior::removed;
      step->invert = true;
    } else if (type == "WhitespaceSplit") {
      auto re = compile_regex(R"(\s+)", false, "WhitespaceSplit");
      if (!re.ok()) return std::move(re).error();
      step->regex = std::move(re).value();
      step->behavior = SplitBehavior::removed;
    } else {
      return unsupported("pre-tokenizer " + type);
    }
    t.pre_tokenizers_.push_back(std::move(step));
  }
  return Status::ok_status();
}

/// "model": vocab, unk, byte tokens and merges; `added` ("added_tokens")
/// sizes the id tables.
Status BpeTokenizer::Loader::model(const json& model, const json& added) {
  if (model.value("type", std::string("BPE")) != "BPE")
    return unsupported("model " + model.value("type", std::string("?")) + " (only BPE is supported)");
  if (!str_or_empty(model, "continuing_subword_prefix").empty() || !str_or_empty(model, "end_of_word_suffix").empty())
    return unsupported("BPE continuing_subword_prefix / end_of_word_suffix");
  if (const auto it = model.find("dropout"); it != model.end() && !it->is_null() && it->get<double>() > 0)
    return unsupported("BPE dropout (it makes encoding random)");
  t.ignore_merges_ = model.value("ignore_merges", false);
  t.byte_fallback_ = model.value("byte_fallback", false);
  t.fuse_unk_ = model.value("fuse_unk", false);
  const json& vocab = model.at("vocab");
  t.tokens_.reserve(vocab.size() + 64);
  std::int32_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    const auto i = id.get<std::int32_t>();
    if (i < 0) return make_error(ErrorCode::corrupt, name + ": negative token id");
    t.tokens_.emplace(token, i);
    max_id = std::max(max_id, i);
  }
  for (const json& a : added) max_id = std::max(max_id, a.at("id").get<std::int32_t>());
  t.id_bytes_.resize(static_cast<std::size_t>(max_id + 1));
  t.special_.assign(static_cast<std::size_t>(max_id + 1), false);
  if (const std::string unk = str_or_empty(model, "unk_token"); !unk.empty()) {
    const auto it = t.tokens_.find(unk);
    if (it == t.tokens_.end()) return make_error(ErrorCode::corrupt, name + ": unk_token '" + unk + "' is not in the vocab");
    t.unk_id_ = it->second;
  }
  std::fill(std::begin(t.byte_ids_), std::end(t.byte_ids_), -1);
  if (t.byte_level_) {
    t.vocab_.reserve(vocab.size() + 64);
    for (const auto& [token, id] : t.tokens_) {
      auto raw = byte_level_decode(token);
      if (raw) t.vocab_.emplace(std::move(*raw), id);
    }
    // A byte without a token (SmolLM2's vocab has none for the bytes no
    // UTF-8 text holds, 0xC0, 0xC1, 0xF5-0xFF, and a few control
    // characters) stays -1: its character is unknown to the BPE model and
    // dropped, or becomes unk, as tokenizers' BPE::merge_word does.
    for (int b = 0; b < 256; ++b) {
      const auto it = t.vocab_.find(std::string(1, static_cast<char>(b)));
      if (it != t.vocab_.end()) t.byte_ids_[b] = it->second;
    }
  } else if (t.byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      if (const auto it = t.tokens_.find(buf); it != t.tokens_.end()) t.byte_ids_[b] = it->second;
    }
  }
  const json& merges = model.at("merges");
  t.merges_.reserve(merges.size() * 2);
  std::int32_t rank = 0;
  std::string left, right;
  for (const json& m : merges) {
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos) return make_error(ErrorCode::corrupt, name + ": bad merge '" + s + "'");
      left.assign(s, 0, sp);
      right.assign(s, sp + 1);
    } else {
      left = m.at(0).get<std::string>();
      right = m.at(1).get<std::string>();
    }
    const auto a = t.tokens_.find(left), b = t.tokens_.find(right),
               c = t.tokens_.find(left + right);
    if (a == t.tokens_.end() || b == t.tokens_.end() || c == t.tokens_.end()) {
      return make_error(ErrorCode::corrupt, name + ": merge of unknown tokens '" + left + "' '" + right + "'");
    }
    t.merges_.try_emplace(pair_key(a->second, b->second), Merge{rank++, c->second});
  }
  return Status::ok_status();
}

/// "decoder": each token's bytes.
Status BpeTokenizer::Loader::decoder(const json& node) {
  // Steps applied to one token's string; Strip after Fuse acts on the
  // whole decoded text (strips_leading_space).
  std::vector<std::function<std::string(std::string)>> decode_steps;
  bool fused = false, has_decoder = false, byte_level_decoder = false;
  for (const json* d : sequence_steps(node, "decoders")) {
    has_decoder = true;
    const auto type = d->at("type").get<std::string>();
    if (type == "ByteLevel") {
      byte_level_decoder = true;
      decode_steps.emplace_back([](std::string tok) {
        auto raw = byte_level_decode(tok);
        return raw ? std::move(*raw) : tok;
      });
    } else if (type == "Replace") {
      const json& pat = d->at("pattern");
      if (!pat.contains("String")) return unsupported("decoder Replace with a Regex pattern");
      decode_steps.emplace_back([from = pat.at("String").get<std::string>(),
                                 to = d->at("content").get<std::string>()](std::string tok) {
        return replace_literal(std::move(tok), from, to);
      });
    } else if (type == "ByteFallback") {
      decode_steps.emplace_back([](std::string tok) {
        const int b = byte_fallback_value(tok);
        return b < 0 ? tok : std::string(1, static_cast<char>(b));
      });
    } else if (type == "Fuse") {
      fused = true;
    } else if (type == "Strip") {
      const int start = d->value("start", 0), stop = d->value("stop", 0);
      if (start == 0 && stop == 0) continue;
      if (!fused || stop != 0 || start != 1 || d->value("content", std::string(" ")) != " ")
        return unsupported("decoder Strip other than one leading space after Fuse");
      t.strips_leading_space_ = true;
    } else if (type == "Metaspace") {
      std::string scheme = str_or_empty(*d, "prepend_scheme");
      if (scheme.empty()) scheme = d->value("add_prefix_space", true) ? "always" : "never";
      decode_steps.emplace_back([rep = d->value("replacement", std::string("\xE2\x96\x81"))](std::string tok) {
        return replace_literal(std::move(tok), rep, " ");
      });
      if (scheme != "never") t.strips_leading_space_ = true;
    } else {
      return unsupported("decoder " + type);
    }
  }
  if (!has_decoder && t.byte_level_) {
    decode_steps.emplace_back([](std::string tok) {
      auto raw = byte_level_decode(tok);
      return raw ? std::move(*raw) : tok;
    });
  }
  if (t.byte_level_ && (!has_decoder || (byte_level_decoder && decode_steps.size() == 1))) {
    // The usual byte-level case: each token's bytes are its byte-level
    // decoding, already computed for vocab_ (half the load time of an
    // 11 MB tokenizer.json is in these 150k decodings).
    for (const auto& [bytes, id] : t.vocab_) t.id_bytes_[static_cast<std::size_t>(id)] = bytes;
    for (const auto& [token, id] : t.tokens_)
      if (t.id_bytes_[static_cast<std::size_t>(id)].empty()) t.id_bytes_[static_cast<std::size_t>(id)] = token;
  } else {
    for (const auto& [token, id] : t.tokens_) {
      std::string bytes = token;
      for (const auto& step : decode_steps) bytes = step(std::move(bytes));
      t.id_bytes_[static_cast<std::size_t>(id)] = std::move(bytes);
    }
  }
  return Status::ok_status();
}

/// "added_tokens": their texts, specials, and the longest-first match list.
void BpeTokenizer::Loader::added_tokens(const json& added) {
  for (const json& a : added) {
    const auto id = a.at("id").get<std::int32_t>();
    auto content = a.at("content").get<std::string>();
    t.id_bytes_[id] = content;
    t.special_[id] = a.value("special", false);
    t.tokens_[content] = id;
    t.added_.push_back(
        {std::move(content), id, a.value("lstrip", false), a.value("rstrip", false), a.value("single_word", false)});
  }
  std::stable_sort(t.added_.begin(), t.added_.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
}

/// "normalizer": the text steps before the pre-tokenizer.
Status BpeTokenizer::Loader::normalizer(const json& node) {
  for (const json* n : sequence_steps(node, "normalizers")) {
    const auto type = n->at("type").get<std::string>();
    auto step = std::make_shared<NormStep>();
    if (type == "NFC") {
      step->kind = NormStep::Kind::nfc;
    } else if (type == "NFD") {
      step->kind = NormStep::Kind::nfd;
    } else if (type == "NFKC") {
      step->kind = NormStep::Kind::nfkc;
    } else if (type == "NFKD") {
      step->kind = NormStep::Kind::nfkd;
    } else if (type == "Prepend") {
      step->kind = NormStep::Kind::prepend;
      step->content = n->at("prepend").get<std::string>();
    } else if (type == "Replace") {
      step->kind = NormStep::Kind::replace;
      auto re = pattern_of(n->at("pattern"), "normalizer Replace");
      if (!re.ok()) return std::move(re).error();
      step->regex = std::move(re).value();
      if (n->at("pattern").contains("String")) step->literal = n->at("pattern").at("String").get<std::string>();
      step->content = n->at("content").get<std::string>();
    } else if (type == "Strip") {
      step->kind = NormStep::Kind::strip;
      step->left = n->value("strip_left", true);
      step->right = n->value("strip_right", true);
    } else if (type == "Lowercase") {
      step->kind = NormStep::Kind::lowercase;
    } else {
      return unsupported("normalizer " + type);
    }
    t.normalizers_.push_back(std::move(step));
  }
  return Status::ok_status();
}

/// "post_processor": the specials added with add_special_tokens.
Status BpeTokenizer::Loader::post_processor(const json& node) {
  for (const json* p : sequence_steps(node, "processors")) {
    const auto type = p->at("type").get<std::string>();
    if (type == "TemplateProcessing") {
      bool before = true;
      for (const json& piece : p->at("single")) {
        if (piece.contains("Sequence")) {
          before = false;
          continue;
        }
        const auto& sid = piece.at("SpecialToken").at("id").get_ref<const std::string&>();
        for (const json& id : p->at("special_tokens").at(sid).at("ids")) {
          (before ? t.prepend_ : t.append_).push_back(id.get<std::int32_t>());
        }
      }
    } else if (type != "ByteLevel") {
      return unsupported("post-processor " + type);
    }
  }
  return Status::ok_status();
}

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::load_json(std::string_view json_text, const std::string& name,
                                                              std::optional<bool> add_bos_token,
                                                              std::string_view bos_token,
                                                              std::string_view eos_token) {
  json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return make_error(ErrorCode::corrupt, name + ": not valid JSON");
  }
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  Loader load{*t, name};
  try {
    const json added = doc.value("added_tokens", json::array());
    if (Status s = load.pre_tokenizer(doc.at("pre_tokenizer")); !s.ok()) return s.error();
    if (Status s = load.model(doc.at("model"), added); !s.ok()) return s.error();
    if (Status s = load.decoder(doc.at("decoder")); !s.ok()) return s.error();
    load.added_tokens(added);
    if (Status s = load.normalizer(doc.at("normalizer")); !s.ok()) return s.error();
    if (Status s = load.post_processor(doc.at("post_processor")); !s.ok()) return s.error();
  } catch (const json::exception& e) {
    return make_error(ErrorCode::corrupt, name + ": " + e.what());
  }
  t->bos_id_ = bos_token.empty() ? -1 : t->token_to_id(bos_token);
  t->eos_id_ = eos_token.empty() ? -1 : t->token_to_id(eos_token);
  if (t->prepend_.empty() && t->append_.empty() && add_bos_token.value_or(false) && t->bos_id_ >= 0) {
    t->prepend_.push_back(t->bos_id_);
  }
  t->count_bound_ = t->make_count_bound();
  return t;
}

bool BpeTokenizer::covers(std::string_view ch) const {
  const auto all_bytes = [&] {
    for (const char c : ch)
      if (byte_ids_[static_cast<unsigned char>(c)] < 0) return false;
    return true;
  };
  if (byte_level_) return all_bytes();
  return tokens_.count(std::string(ch)) != 0 || (byte_fallback_ && all_bytes());
}

TokenCountBound BpeTokenizer::make_count_bound() const {
  if (drops_non_whitespace_) return {};
  bool every_byte = byte_level_ || byte_fallback_;
  for (const std::int32_t id : byte_ids_) every_byte = every_byte && id >= 0;
  for (const auto& step : normalizers_) {
    using Kind = NormStep::Kind;
    // Lowercase changes characters: only harmless when every one is covered.
    if (step->kind == Kind::lowercase && !every_byte) return {};
    if (step->kind == Kind::replace) {
      if (!step->literal) return {};  // a regex may match anything
      bool stable = false;
      for_each_cp(*step->literal, [&](std::size_t, std::size_t, utf8proc_int32_t cp) {
        stable = stable || TokenCountBound::is_stable_char(static_cast<char32_t>(cp));
        return !stable;
      });
      if (stable) return {};
    }
  }
  // Tokens as they stand in the normalized text: bytes for a byte-level
  // model, else the token strings ("▁the"); added tokens are in both.
  TokenChars max_chars;
  if (byte_level_) {
    for (const std::string& bytes : id_bytes_) max_chars = max_chars.max_with(TokenCountBound::count_token_chars(bytes));
  } else {
    for (const auto& [token, id] : tokens_) max_chars = max_chars.max_with(TokenCountBound::count_token_chars(token));
  }
  if (every_byte) return TokenCountBound::of(max_chars, nullptr);
  return TokenCountBound::of(max_chars, [this](std::string_view ch) { return covers(ch); });
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), prepend_.begin(), prepend_.end());
  // Split out added tokens (longest match at the earliest position).
  // single_word: only where no word character touches it; lstrip / rstrip:
  // the whitespace beside it goes with it.
  // The code point that ends at `at` and where it starts, looking back no
  // further than `floor`; -1 when `at` is at the floor.
  const auto char_before = [&](std::size_t at, std::size_t floor) -> std::pair<utf8proc_int32_t, std::size_t> {
    if (at <= floor) return {-1, at};
    std::size_t b = at - 1;
    while (b > floor && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
    utf8proc_int32_t cp = -1;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + b),
                     static_cast<utf8proc_ssize_t>(at - b), &cp);
    return {cp, b};
  };
  const auto char_at = [&](std::size_t at) -> utf8proc_int32_t {
    if (at >= text.size()) return -1;
    utf8proc_int32_t cp = -1;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                     static_cast<utf8proc_ssize_t>(text.size() - at), &cp);
    return cp;
  };
  const auto find_from = [&](const AddedToken& a, std::size_t from) {
    for (std::size_t at = text.find(a.content, from); at != std::string_view::npos;
         at = text.find(a.content, at + 1)) {
      if (!a.single_word) return at;
      const auto before = char_before(at, 0).first, after = char_at(at + a.content.size());
      if ((before < 0 || !is_word_char(before)) && (after < 0 || !is_word_char(after))) return at;
    }
    return std::string_view::npos;
  };
  std::vector<std::size_t> next(added_.size());
  for (std::size_t k = 0; k < added_.size(); ++k) next[k] = find_from(added_[k], 0);
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t best = std::string_view::npos, best_k = 0;
    for (std::size_t k = 0; k < added_.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos) next[k] = find_from(added_[k], pos);
      if (next[k] < best) {
        best = next[k];
        best_k = k;
      }
    }
    if (best == std::string_view::npos) {
      encode_text(text.substr(pos), pos == 0, out);
      break;
    }
    const AddedToken& a = added_[best_k];
    std::size_t seg_end = best, after = best + a.content.size();
    while (a.lstrip) {
      const auto [cp, b] = char_before(seg_end, pos);
      if (cp < 0 || !is_whitespace_cp(cp)) break;
      seg_end = b;
    }
    if (a.rstrip)
      for (utf8proc_int32_t cp; (cp = char_at(after)) >= 0 && is_whitespace_cp(cp);) {
        std::size_t n = 1;
        while (after + n < text.size() && (static_cast<unsigned char>(text[after + n]) & 0xC0) == 0x80) ++n;
        after += n;
      }
    encode_text(text.substr(pos, seg_end - pos), pos == 0, out);
    out.push_back(a.id);
    pos = after;
  }
  if (add_special_tokens) out.insert(out.end(), append_.begin(), append_.end());
  return out;
}

std::string BpeTokenizer::normalize(std::string text) const {
  for (const auto& step : normalizers_) {
    using Kind = NormStep::Kind;
    switch (step->kind) {
      case Kind::nfc:
      case Kind::nfd:
      case Kind::nfkc:
      case Kind::nfkd: {
        if (is_ascii(text)) break;  // ASCII is in every normal form
        int options = UTF8PROC_STABLE;
        if (step->kind == Kind::nfc || step->kind == Kind::nfkc) options |= UTF8PROC_COMPOSE;
        if (step->kind == Kind::nfd || step->kind == Kind::nfkd) options |= UTF8PROC_DECOMPOSE;
        if (step->kind == Kind::nfkc || step->kind == Kind::nfkd) options |= UTF8PROC_COMPAT;
        utf8proc_uint8_t* mapped = nullptr;
        const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                      static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                      static_cast<utf8proc_option_t>(options));
        if (len >= 0) text.assign(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(len));
        std::free(mapped);
        break;
      }
      case Kind::prepend:
        if (!text.empty()) text.insert(0, step->content);
        break;
      case Kind::replace:
        text = replace_all(*step->regex, text, step->content);
        break;
      case Kind::strip: {
        std::size_t begin = 0, end = text.size();
        if (step->left)
          for_each_cp(text, [&](std::size_t at, std::size_t, utf8proc_int32_t cp) {
            if (!is_whitespace_cp(cp)) return false;
            begin = at + 1;
            while (begin < text.size() && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) ++begin;
            return true;
          });
        if (step->right) {
          std::size_t last_non_ws = begin;
          for_each_cp(std::string_view(text).substr(begin), [&](std::size_t at, std::size_t n, utf8proc_int32_t cp) {
            if (!is_whitespace_cp(cp)) last_non_ws = begin + at + n;
            return true;
          });
          end = last_non_ws;
        }
        text = text.substr(begin, end > begin ? end - begin : 0);
        break;
      }
      case Kind::lowercase: {
        std::string out;
        out.reserve(text.size());
        for_each_cp(text, [&](std::size_t, std::size_t, utf8proc_int32_t cp) {
          utf8proc_uint8_t buf[4];
          const auto n = utf8proc_encode_char(utf8proc_tolower(cp), buf);
          out.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
          return true;
        });
        text = std::move(out);
        break;
      }
    }
  }
  return text;
}

void BpeTokenizer::encode_text(std::string_view raw, bool first_segment, std::vector<std::int32_t>& out) const {
  if (raw.empty()) return;
  struct Piece {
    std::string text;
    bool at_start;  ///< begins at offset 0 of the input (Metaspace's "first")
  };
  std::vector<Piece> pieces;
  pieces.push_back({normalize(utf8_lossy(raw)), first_segment});
  std::vector<Piece> next;
  for (const auto& step : pre_tokenizers_) {
    next.clear();
    for (Piece& piece : pieces) {
      std::string& text = piece.text;
      const Regex* re = step->regex.get();
      SplitBehavior behavior = step->behavior;
      bool invert = step->invert;
      if (step->kind == PreStep::Kind::byte_level) {
        if (step->add_prefix_space && (text.empty() || text.front() != ' ')) text.insert(text.begin(), ' ');
        behavior = SplitBehavior::isolated;
        invert = false;
      } else if (step->kind == PreStep::Kind::metaspace) {
        text = replace_literal(std::move(text), " ", step->replacement);
        const bool prepend = step->prepend == PreStep::Prepend::always ||
                             (step->prepend == PreStep::Prepend::first && piece.at_start);
        if (prepend && text.compare(0, step->replacement.size(), step->replacement) != 0)
          text.insert(0, step->replacement);
        if (step->metaspace_split) {  // split at each replacement, merged with what follows
          bool first = true;
          std::size_t begin = 0;
          for (std::size_t at = text.find(step->replacement, 1); begin < text.size();
               at = text.find(step->replacement, at + 1)) {
            const std::size_t end = at == std::string::npos ? text.size() : at;
            if (end > begin) {
              next.push_back({text.substr(begin, end - begin), piece.at_start && first});
              first = false;
            }
            begin = end;
            if (at == std::string::npos) break;
          }
        } else {
          next.push_back(std::move(piece));
        }
        continue;
      }
      if (re == nullptr) {
        next.push_back(std::move(piece));
        continue;
      }
      bool first = true;
      for (const Span& x : split_spans(*re, text, behavior, invert)) {
        next.push_back({text.substr(x.begin, x.end - x.begin), piece.at_start && first && x.begin == 0});
        first = false;
      }
    }
    pieces.swap(next);
  }
  for (const Piece& piece : pieces) encode_word(piece.text, out);
}

void BpeTokenizer::initial_symbols(std::string_view word, std::vector<std::int32_t>& ids) const {
  ids.clear();
  if (byte_level_) {
    for (const char c : word) {
      const std::int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) ids.push_back(id);
      else if (unk_id_ >= 0) ids.push_back(unk_id_);
    }
    return;
  }
  // Characters (tokenizers' BPE::merge_word): a character in the vocab is
  // its token; else its bytes' <0xNN> tokens (byte_fallback); else unk,
  // consecutive unks fused into one with fuse_unk.
  bool last_unk = false;
  for_each_cp(word, [&](std::size_t at, std::size_t n, utf8proc_int32_t) {
    const std::string ch(word.substr(at, n));
    if (const auto it = tokens_.find(ch); it != tokens_.end()) {
      ids.push_back(it->second);
      last_unk = false;
      return true;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (const char c : ch) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        last_unk = false;
        return true;
      }
    }
    if (unk_id_ >= 0 && !(fuse_unk_ && last_unk)) ids.push_back(unk_id_);
    last_unk = unk_id_ >= 0;  // without an unk token the character is dropped (the tokenizers library errors)
    return true;
  });
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (byte_level_ && word.size() == 1 && byte_ids_[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {  // a word that is a token is that token
    const auto& table = byte_level_ ? vocab_ : tokens_;
    if (const auto it = table.find(std::string(word)); it != table.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() > kMaxCachedWord) {
    bpe(word, out);
    return;
  }
  std::string key(word);
  {
    std::lock_guard lock(cache_mu_);
    if (const auto it = cache_.find(key); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = out.size();
  bpe(word, out);
  std::lock_guard lock(cache_mu_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::move(key), std::vector<std::int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
}

void BpeTokenizer::bpe(std::string_view word, std::vector<std::int32_t>& out) const {
  struct Symbol {
    std::int32_t id, prev, next;
  };
  struct Candidate {
    std::int32_t rank, pos, right, left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<std::int32_t> ids;
  initial_symbols(word, ids);
  const auto n = static_cast<std::int32_t>(ids.size());
  if (n == 0) return;
  std::vector<Symbol> sym(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) sym[i] = {ids[static_cast<std::size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](std::int32_t left) {
    if (left < 0 || sym[left].next < 0) return;
    const std::int32_t right = sym[left].next;
    const auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it != merges_.end()) {
      heap.push({it->second.rank, left, right, sym[left].id, sym[right].id, it->second.id});
    }
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[c.pos];
    if (l.id != c.left_id || l.next != c.right || sym[c.right].id != c.right_id) continue;  // stale
    l.id = c.merged;
    l.next = sym[c.right].next;
    if (l.next >= 0) sym[l.next].prev = c.pos;
    sym[c.right].id = -1;
    consider(l.prev);
    consider(c.pos);
  }
  for (std::int32_t i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

std::string BpeTokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || (skip_special_tokens && special_[id])) continue;
    bytes += id_bytes_[id];
  }
  // A Strip-after-Fuse (or Metaspace) decoder drops the text's first space.
  if (strips_leading_space_ && !bytes.empty() && bytes.front() == ' ') bytes.erase(0, 1);
  return utf8_lossy(bytes);
}

std::string BpeTokenizer::token_bytes(std::int32_t id) const {
  return id >= 0 && id < vocab_size() ? id_bytes_[id] : std::string();
}

bool BpeTokenizer::is_special(std::int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

std::int32_t BpeTokenizer::token_to_id(std::string_view token) const {
  const auto it = tokens_.find(std::string(token));
  return it == tokens_.end() ? -1 : it->second;
}

}  // namespace shardline::text
