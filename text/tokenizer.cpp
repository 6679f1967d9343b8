#include "text/tokenizer.hpp"

#include <optional>
#include <utility>

#include "text/bpe_tokenizer.hpp"
#include "text/sentencepiece_tokenizer.hpp"
#include "text/tokenizer_config.hpp"

namespace shardline::text {
namespace {

struct SpecialConfig {
  std::optional<bool> add_bos_token;
  std::string bos_token;
  std::string eos_token;
};

/// The special tokens' settings of `dir`'s tokenizer_config.json (none
/// when it has none). Errors: read_tokenizer_config's.
Result<SpecialConfig> read_special_config(const std::filesystem::path& dir) {
  auto file = read_tokenizer_config(dir);
  if (!file) return std::move(file).error();
  const nlohmann::ordered_json& doc = file->config;
  SpecialConfig cfg;
  if (const auto it = doc.find("add_bos_token"); it != doc.end() && it->is_boolean())
    cfg.add_bos_token = it->get<bool>();
  for (auto [key, field] : {std::pair{"bos_token", &cfg.bos_token}, std::pair{"eos_token", &cfg.eos_token}})
    if (const auto it = doc.find(key); it != doc.end()) *field = special_token_text(*it).value_or("");
  return cfg;
}

template <class T>
Result<std::unique_ptr<Tokenizer>> upcast(Result<std::unique_ptr<T>> r) {
  if (!r) return std::move(r).error();
  return std::unique_ptr<Tokenizer>(std::move(r).value());
}

}  // namespace

bool has_tokenizer_files(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir / "tokenizer.json", ec) ||
         std::filesystem::is_regular_file(dir / "tokenizer.model", ec);
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer_files(const std::filesystem::path& dir) {
  try {
    std::error_code ec;
    const auto json_file = dir / "tokenizer.json";
    const auto model_file = dir / "tokenizer.model";
    const bool has_json = std::filesystem::is_regular_file(json_file, ec);
    const bool has_model = std::filesystem::is_regular_file(model_file, ec);
    if (!has_json && !has_model) {
      return make_error(ErrorCode::not_found,
                        dir.string() + ": no tokenizer.json or tokenizer.model in this folder");
    }
    auto cfg = read_special_config(dir);
    if (!cfg) return std::move(cfg).error();
    if (has_json) {
      auto bpe = upcast(BpeTokenizer::load(json_file, cfg->add_bos_token, cfg->bos_token, cfg->eos_token));
      // A tokenizer.json we do not support (e.g. Llama-2's sentencepiece-style
      // BPE) falls back to tokenizer.model when there is one.
      if (bpe || !has_model || bpe.error().code != ErrorCode::unsupported) return bpe;
    }
    return upcast(SentencePieceTokenizer::load(model_file, cfg->add_bos_token, cfg->bos_token,
                                               cfg->eos_token));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, dir.string() + ": loading tokenizer: " + e.what());
  }
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               std::span<const std::int32_t> prefix_ids,
                                               bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens), at_start_(true) {
  // Text only starts once a token contributes to it; a prompt of specials
  // (just BOS) still leaves the first generated token at the start.
  std::string bytes;
  for (const std::int32_t id : prefix_ids) {
    if (skip_special_ && tokenizer_->is_special(id)) continue;
    bytes += tokenizer_->token_bytes(id);
    at_start_ = false;
  }
  // An incomplete character at the end of the prefix completes in the output.
  (void)utf8_lossy(bytes, &pending_);
}

std::string IncrementalDetokenizer::push(std::int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  std::string bytes = tokenizer_->token_bytes(id);
  if (at_start_ && tokenizer_->strips_leading_space() && !bytes.empty() && bytes.front() == ' ') {
    bytes.erase(0, 1);
  }
  at_start_ = false;
  pending_ += bytes;
  std::string tail;
  std::string out = utf8_lossy(pending_, &tail);
  pending_ = std::move(tail);
  text_ += out;
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  text_ += out;
  return out;
}

}  // namespace shardline::text
