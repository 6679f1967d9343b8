#include "text/tokenizer.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "text/bpe_tokenizer.hpp"
#include "text/sentencepiece_tokenizer.hpp"

namespace shardline::text {
namespace {

struct SpecialConfig {
  std::optional<bool> add_bos_token;
  std::string bos_token;
  std::string eos_token;
};

/// "<s>" or {"content": "<s>", ...} -> "<s>"; null / absent -> "".
std::string token_field(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return it->value("content", std::string());
  return {};
}

Result<SpecialConfig> read_config(const std::filesystem::path& file) {
  SpecialConfig cfg;
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return cfg;
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, file.string() + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const auto doc = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return make_error(ErrorCode::corrupt, file.string() + ": not a valid JSON object");
  }
  if (const auto it = doc.find("add_bos_token"); it != doc.end() && it->is_boolean()) {
    cfg.add_bos_token = it->get<bool>();
  }
  cfg.bos_token = token_field(doc, "bos_token");
  cfg.eos_token = token_field(doc, "eos_token");
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
    auto cfg = read_config(dir / "tokenizer_config.json");
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
