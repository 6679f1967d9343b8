#include "text/tokenizer_config.hpp"

#include <fstream>
#include <sstream>

namespace shardline::text {

Result<std::string> read_text_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, "cannot read " + file.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<std::string> special_token_text(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

Result<TokenizerConfig> read_tokenizer_config(const std::filesystem::path& model_dir) {
  const auto config_file = model_dir / "tokenizer_config.json";
  TokenizerConfig out{nlohmann::ordered_json::object(), config_file.string(), true};
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_file, ec)) return out;
  auto text = read_text_file(config_file);
  if (!text.ok()) return text.error();
  out.config = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (out.config.is_discarded() || !out.config.is_object())
    return make_error(ErrorCode::corrupt, config_file.string() + ": not a valid JSON object");
  return out;
}

}  // namespace shardline::text
