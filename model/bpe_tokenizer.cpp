#include "model/bpe_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

namespace shardline::model {
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

BpeTokenizer::~BpeTokenizer() {
  if (regex_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(regex_));
}

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::load(const std::filesystem::path& file,
                                                         std::optional<bool> add_bos_token,
                                                         std::string_view bos_token,
                                                         std::string_view eos_token) {
  const std::string name = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, name + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  json doc = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return make_error(ErrorCode::corrupt, name + ": not valid JSON");
  }
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  const auto unsupported = [&](const std::string& what) {
    return make_error(ErrorCode::unsupported, name + ": " + what);
  };
  try {
    // ---- model: vocab and merges ----
    const json& model = doc.at("model");
    if (model.value("type", std::string("BPE")) != "BPE") return unsupported("model type is not BPE");
    if (!model.value("continuing_subword_prefix", json("")).get<std::string>().empty() ||
        !model.value("end_of_word_suffix", json("")).get<std::string>().empty()) {
      return unsupported("BPE subword prefix/suffix");
    }
    t->ignore_merges_ = model.value("ignore_merges", false);
    const json& vocab = model.at("vocab");
    t->tokens_.reserve(vocab.size() + 64);
    t->vocab_.reserve(vocab.size() + 64);
    std::int32_t max_id = -1;
    for (const auto& [token, id] : vocab.items()) {
      const auto i = id.get<std::int32_t>();
      if (i < 0) return make_error(ErrorCode::corrupt, name + ": negative token id");
      t->tokens_.emplace(token, i);
      max_id = std::max(max_id, i);
    }
    const json& added = doc.value("added_tokens", json::array());
    for (const json& a : added) max_id = std::max(max_id, a.at("id").get<std::int32_t>());
    t->id_bytes_.resize(static_cast<std::size_t>(max_id + 1));
    t->special_.assign(static_cast<std::size_t>(max_id + 1), false);
    for (const auto& [token, id] : t->tokens_) {
      auto raw = byte_level_decode(token);
      t->id_bytes_[id] = raw ? std::move(*raw) : token;
      t->vocab_.emplace(t->id_bytes_[id], id);
    }
    for (int b = 0; b < 256; ++b) {
      std::string s(1, static_cast<char>(b));
      const auto it = t->vocab_.find(s);
      if (it == t->vocab_.end()) return unsupported("vocab lacks byte-level token for a byte");
      t->byte_ids_[b] = it->second;
    }
    const json& merges = model.at("merges");
    t->merges_.reserve(merges.size() * 2);
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
      const auto a = t->tokens_.find(left), b = t->tokens_.find(right),
                 c = t->tokens_.find(left + right);
      if (a == t->tokens_.end() || b == t->tokens_.end() || c == t->tokens_.end()) {
        return make_error(ErrorCode::corrupt, name + ": merge of unknown tokens '" + left + "' '" + right + "'");
      }
      t->merges_.try_emplace(pair_key(a->second, b->second), Merge{rank++, c->second});
    }
    // ---- added tokens ----
    for (const json& a : added) {
      const auto id = a.at("id").get<std::int32_t>();
      auto content = a.at("content").get<std::string>();
      t->id_bytes_[id] = content;
      t->special_[id] = a.value("special", false);
      t->tokens_[content] = id;
      t->added_.push_back({std::move(content), id});
    }
    std::stable_sort(t->added_.begin(), t->added_.end(), [](const AddedToken& x, const AddedToken& y) {
      return x.content.size() > y.content.size();
    });
    // ---- normalizer ----
    std::vector<const json*> todo{&doc.at("normalizer")};
    while (!todo.empty()) {
      const json* n = todo.back();
      todo.pop_back();
      if (n->is_null()) continue;
      const auto type = n->at("type").get<std::string>();
      if (type == "Sequence") {
        const json& list = n->at("normalizers");
        for (auto it = list.rbegin(); it != list.rend(); ++it) todo.push_back(&*it);
      } else if (type == "NFC") {
        t->normalizers_.push_back(Normalization::nfc);
      } else if (type == "NFD") {
        t->normalizers_.push_back(Normalization::nfd);
      } else if (type == "NFKC") {
        t->normalizers_.push_back(Normalization::nfkc);
      } else if (type == "NFKD") {
        t->normalizers_.push_back(Normalization::nfkd);
      } else {
        return unsupported("normalizer " + type);
      }
    }
    // ---- pre-tokenizer ----
    std::string pattern;
    bool literal = false, byte_level_seen = false;
    todo = {&doc.at("pre_tokenizer")};
    while (!todo.empty()) {
      const json* p = todo.back();
      todo.pop_back();
      if (p->is_null()) continue;
      const auto type = p->at("type").get<std::string>();
      if (type == "Sequence") {
        const json& list = p->at("pretokenizers");
        for (auto it = list.rbegin(); it != list.rend(); ++it) todo.push_back(&*it);
      } else if (type == "ByteLevel") {
        byte_level_seen = true;
        t->add_prefix_space_ = p->value("add_prefix_space", false);
        if (p->value("use_regex", true)) {
          if (!pattern.empty()) return unsupported("more than one pre-tokenizer regex");
          pattern = kGpt2Pattern;
        }
      } else if (type == "Split") {
        if (!pattern.empty()) return unsupported("more than one pre-tokenizer regex");
        if (p->value("behavior", std::string()) != "Isolated" || p->value("invert", false)) {
          return unsupported("Split pre-tokenizer behavior other than Isolated");
        }
        const json& pat = p->at("pattern");
        literal = pat.contains("String");
        pattern = literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>();
      } else {
        return unsupported("pre-tokenizer " + type);
      }
    }
    if (!byte_level_seen) return unsupported("not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer)");
    if (!pattern.empty()) {
      int err = 0;
      PCRE2_SIZE offset = 0;
      const std::uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                       flags, &err, &offset, nullptr);
      if (code == nullptr) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return make_error(ErrorCode::corrupt, name + ": pre-tokenizer regex: " +
                                                  reinterpret_cast<const char*>(msg));
      }
      pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if no JIT
      t->regex_ = code;
    }
    // ---- post-processor (specials added with add_special_tokens) ----
    todo = {&doc.at("post_processor")};
    while (!todo.empty()) {
      const json* p = todo.back();
      todo.pop_back();
      if (p->is_null()) continue;
      const auto type = p->at("type").get<std::string>();
      if (type == "Sequence") {
        for (const json& q : p->at("processors")) todo.push_back(&q);
      } else if (type == "TemplateProcessing") {
        bool before = true;
        for (const json& piece : p->at("single")) {
          if (piece.contains("Sequence")) {
            before = false;
            continue;
          }
          const auto& sid = piece.at("SpecialToken").at("id").get_ref<const std::string&>();
          for (const json& id : p->at("special_tokens").at(sid).at("ids")) {
            (before ? t->prepend_ : t->append_).push_back(id.get<std::int32_t>());
          }
        }
      } else if (type != "ByteLevel") {
        return unsupported("post-processor " + type);
      }
    }
  } catch (const json::exception& e) {
    return make_error(ErrorCode::corrupt, name + ": " + e.what());
  }
  t->bos_id_ = bos_token.empty() ? -1 : t->token_to_id(bos_token);
  t->eos_id_ = eos_token.empty() ? -1 : t->token_to_id(eos_token);
  if (t->prepend_.empty() && t->append_.empty() && add_bos_token.value_or(false) && t->bos_id_ >= 0) {
    t->prepend_.push_back(t->bos_id_);
  }
  return t;
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), prepend_.begin(), prepend_.end());
  // Split out added tokens (longest match at the earliest position).
  std::vector<std::size_t> next(added_.size());
  for (std::size_t k = 0; k < added_.size(); ++k) next[k] = text.find(added_[k].content);
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t best = std::string_view::npos, best_k = 0;
    for (std::size_t k = 0; k < added_.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos) next[k] = text.find(added_[k].content, pos);
      if (next[k] < best) {
        best = next[k];
        best_k = k;
      }
    }
    if (best == std::string_view::npos) {
      encode_text(text.substr(pos), out);
      break;
    }
    encode_text(text.substr(pos, best - pos), out);
    out.push_back(added_[best_k].id);
    pos = best + added_[best_k].content.size();
  }
  if (add_special_tokens) out.insert(out.end(), append_.begin(), append_.end());
  return out;
}

void BpeTokenizer::encode_text(std::string_view raw, std::vector<std::int32_t>& out) const {
  if (raw.empty()) return;
  std::string text = utf8_lossy(raw);
  if (!is_ascii(text)) {
    for (const Normalization n : normalizers_) {
      int options = UTF8PROC_STABLE;
      if (n == Normalization::nfc || n == Normalization::nfkc) options |= UTF8PROC_COMPOSE;
      if (n == Normalization::nfd || n == Normalization::nfkd) options |= UTF8PROC_DECOMPOSE;
      if (n == Normalization::nfkc || n == Normalization::nfkd) options |= UTF8PROC_COMPAT;
      utf8proc_uint8_t* mapped = nullptr;
      const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                    static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                    static_cast<utf8proc_option_t>(options));
      if (len >= 0) text.assign(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(len));
      std::free(mapped);
    }
  }
  if (add_prefix_space_ && text.front() != ' ') text.insert(text.begin(), ' ');
  if (regex_ == nullptr) {
    encode_word(text, out);
    return;
  }
  auto* code = static_cast<pcre2_code*>(regex_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;
  while (pos < text.size()) {
    // PCRE2_NOTEMPTY: empty matches would only give empty (dropped) pieces.
    constexpr std::uint32_t kOptions = PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY;
    int rc = pcre2_match(code, subject, text.size(), pos, kOptions, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // pathological input: use the interpreter
      rc = pcre2_match(code, subject, text.size(), pos, kOptions | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc < 0) break;  // no further match: the rest is one gap
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t start = ov[0], end = ov[1];
    if (start > pos) encode_word(std::string_view(text).substr(pos, start - pos), out);  // gap
    encode_word(std::string_view(text).substr(start, end - start), out);
    pos = end;
  }
  if (pos < text.size()) encode_word(std::string_view(text).substr(pos), out);
  pcre2_match_data_free(md);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    if (const auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
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
  const auto n = static_cast<std::int32_t>(word.size());
  std::vector<Symbol> sym(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) {
    sym[i] = {byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
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

}  // namespace shardline::model
