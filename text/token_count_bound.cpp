#include "text/token_count_bound.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <utility>

namespace shardline::text {
namespace {

/// The code point starting at text[i] and its length; malformed bytes are
/// one-byte U+FFFD (never stable).
std::pair<char32_t, std::size_t> next_cp(std::string_view text, std::size_t i) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                  static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
  if (n <= 0) return {0xFFFD, 1};
  return {static_cast<char32_t>(cp), static_cast<std::size_t>(n)};
}

bool is_combining_mark(char32_t cp) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

bool is_ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

bool is_letter_or_number(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool TokenCountBound::is_stable_char(char32_t cp) {
  // Hangul: jamo compose with each other, syllables decompose (algorithmically).
  if ((cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0x3130 && cp <= 0x318F) || (cp >= 0xA960 && cp <= 0xA97F) ||
      (cp >= 0xAC00 && cp <= 0xD7FF))
    return false;
  if (cp > 0x10FFFF || cp == 0x2581) return false;  // "▁" is a space to sentencepiece and Metaspace
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  switch (p->category) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
      break;
    default:
      return false;  // whitespace, control, format, unassigned, private use, surrogates, marks
  }
  return p->decomp_seqindex == UINT16_MAX;  // no canonical or compatibility decomposition
}

TokenChars TokenCountBound::count_token_chars(std::string_view token) {
  TokenChars n;
  for (std::size_t i = 0; i < token.size();) {
    const auto c = static_cast<unsigned char>(token[i]);
    if ((c & 0xC0) == 0x80) {  // a continuation byte: its character started in another token
      ++i;
      continue;
    }
    if (c < 0x80) {
      if (!is_ascii_space(c)) {
        ++n.stable;
        if (std::isalnum(c) != 0) ++n.letters;
      }
      ++i;
      continue;
    }
    utf8proc_int32_t cp = 0;
    const auto len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(token.data() + i),
                                      static_cast<utf8proc_ssize_t>(token.size() - i), &cp);
    if (len <= 0) {  // incomplete here (a byte-level token's tail): it may be anything
      ++n.stable;
      ++n.letters;
      ++i;
      continue;
    }
    if (cp != 0x2581) {
      ++n.stable;
      if (is_letter_or_number(static_cast<char32_t>(cp))) ++n.letters;
    }
    i += static_cast<std::size_t>(len);
  }
  return n;
}

TokenCountBound TokenCountBound::of(TokenChars max_per_token, std::function<bool(std::string_view)> covered) {
  TokenCountBound b;
  if (max_per_token.stable == 0) return b;
  b.max_per_token_ = max_per_token;
  b.covered_ = std::move(covered);
  for (unsigned c = 0; c < 128; ++c) {
    const char ch = static_cast<char>(c);
    if (!is_stable_char(c) || (b.covered_ && !b.covered_(std::string_view(&ch, 1)))) continue;
    b.ascii_[c] = std::isalnum(static_cast<int>(c)) != 0 ? CharClass::letter : CharClass::stable;
  }
  return b;
}

std::size_t TokenCountBound::min_num_tokens(std::string_view text) const {
  if (max_per_token_.stable == 0) return 0;
  std::size_t stable = 0, letters = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    CharClass cls = CharClass::none;
    std::size_t n = 1;
    if (c < 0x80) {
      cls = ascii_[c];
    } else {
      const auto [cp, len] = next_cp(text, i);
      n = len;
      if (is_stable_char(cp) && (!covered_ || covered_(text.substr(i, len))))
        cls = is_letter_or_number(cp) ? CharClass::letter : CharClass::stable;
    }
    // A combining mark next composes with this character (NFC / NFKC).
    if (cls != CharClass::none && i + n < text.size() && static_cast<unsigned char>(text[i + n]) >= 0x80 &&
        is_combining_mark(next_cp(text, i + n).first))
      cls = CharClass::none;
    if (cls != CharClass::none) ++stable;
    if (cls == CharClass::letter) ++letters;
    i += n;
  }
  const auto ceil_div = [](std::size_t a, std::size_t b) { return b == 0 ? 0 : (a + b - 1) / b; };
  return std::max(ceil_div(stable, max_per_token_.stable), ceil_div(letters, max_per_token_.letters));
}

}  // namespace shardline::text
