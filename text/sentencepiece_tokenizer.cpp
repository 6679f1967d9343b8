#include "text/sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <cstdlib>

#include "text/bpe_tokenizer.hpp"  // utf8_lossy

namespace shardline::text {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 "▁"

std::string piece_to_bytes(const sentencepiece::SentencePieceProcessor& sp, int id) {
  const std::string& piece = sp.IdToPiece(id);
  if (sp.IsByte(id) && piece.size() == 6 && piece.starts_with("<0x")) {
    return std::string(1, static_cast<char>(std::strtol(piece.substr(3, 2).c_str(), nullptr, 16)));
  }
  if (sp.IsControl(id) || sp.IsUnknown(id)) return piece;
  std::string out;
  out.reserve(piece.size());
  for (std::size_t i = 0; i < piece.size();) {
    if (std::string_view(piece).substr(i, 3) == kSpaceMarker) {
      out += ' ';
      i += 3;
    } else {
      out += piece[i++];
    }
  }
  return out;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer()
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

Result<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::load(
    const std::filesystem::path& file, std::optional<bool> add_bos_token,
    std::string_view bos_token, std::string_view eos_token) {
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  const auto status = t->sp_->Load(file.string());
  if (!status.ok()) {
    return make_error(ErrorCode::corrupt,
                      file.string() + ": cannot load sentencepiece model: " + status.ToString());
  }
  const int n = t->sp_->GetPieceSize();
  t->bytes_.reserve(n);
  t->special_.reserve(n);
  for (int id = 0; id < n; ++id) {
    t->bytes_.push_back(piece_to_bytes(*t->sp_, id));
    t->special_.push_back(t->sp_->IsControl(id) || t->sp_->IsUnknown(id));
  }
  t->add_bos_ = add_bos_token.value_or(true);
  t->bos_id_ = bos_token.empty() ? t->sp_->bos_id() : t->token_to_id(bos_token);
  t->eos_id_ = eos_token.empty() ? t->sp_->eos_id() : t->token_to_id(eos_token);
  // min_num_tokens: pieces as they stand in the normalized text ("▁the");
  // with byte fallback no character is unknown.
  TokenChars max_chars;
  bool byte_fallback = false;
  for (int id = 0; id < n; ++id) {
    max_chars = max_chars.max_with(TokenCountBound::count_token_chars(t->sp_->IdToPiece(id)));
    byte_fallback = byte_fallback || t->sp_->IsByte(id);
  }
  const sentencepiece::SentencePieceProcessor* sp = t->sp_.get();
  t->count_bound_ = byte_fallback ? TokenCountBound::of(max_chars, nullptr)
                                  : TokenCountBound::of(max_chars, [sp](std::string_view ch) {
                                      const int id = sp->PieceToId(ch);
                                      return id >= 0 && !sp->IsUnknown(id);
                                    });
  // add_dummy_prefix shows as a "▁" on the first piece of any word.
  std::vector<std::string> pieces;
  t->strips_space_ = t->sp_->Encode("a", &pieces).ok() && !pieces.empty() &&
                     pieces.front().starts_with(kSpaceMarker);
  return t;
}

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text,
                                                         bool add_special_tokens) const {
  std::vector<int> ids;
  if (!sp_->Encode(text, &ids).ok()) ids.clear();
  std::vector<std::int32_t> out;
  out.reserve(ids.size() + 1);
  if (add_special_tokens && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

std::string SentencePieceTokenizer::decode(std::span<const std::int32_t> ids,
                                           bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || (skip_special_tokens && special_[id])) continue;
    std::string_view b = bytes_[id];
    if (first && strips_space_ && b.starts_with(' ')) b.remove_prefix(1);
    first = false;
    bytes += b;
  }
  return utf8_lossy(bytes);
}

std::string SentencePieceTokenizer::token_bytes(std::int32_t id) const {
  return id >= 0 && id < vocab_size() ? bytes_[id] : std::string();
}

bool SentencePieceTokenizer::is_special(std::int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[id];
}

std::int32_t SentencePieceTokenizer::token_to_id(std::string_view token) const {
  const int id = sp_->PieceToId(token);
  if (id < 0 || id >= vocab_size()) return -1;
  if (sp_->IsUnknown(id) && sp_->IdToPiece(id) != token) return -1;
  return id;
}

}  // namespace shardline::text
