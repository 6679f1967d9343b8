#pragma once
/// \file
/// A model folder's `tokenizer_config.json`, read once for both of its
/// readers: the tokenizer loader (text/tokenizer.hpp: `add_bos_token`,
/// `bos_token`, `eos_token`) and the chat template (text/chat_template.hpp:
/// `chat_template` and every special token's text).

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.hpp"

namespace shardline::text {

/// A tokenizer config's JSON object, and where it came from.
struct TokenizerConfig {
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  std::string source;           ///< names it in errors: the file, or "FILE.gguf metadata"
  bool reads_template_files = true;  ///< chat_template.jinja beside it counts (not for a GGUF's metadata)
};

/// `model_dir`'s tokenizer_config.json, parsed (an empty config when the
/// folder has none). Errors: io (unreadable), corrupt (not a JSON object).
[[nodiscard]] Result<TokenizerConfig> read_tokenizer_config(const std::filesystem::path& model_dir);

/// A special token's text as transformers writes it: "<s>" or
/// {"content": "<s>", ...} -> "<s>"; anything else (null, absent): nullopt.
[[nodiscard]] std::optional<std::string> special_token_text(const nlohmann::ordered_json& value);

/// The whole of a text file. Errors: io ("cannot read FILE").
[[nodiscard]] Result<std::string> read_text_file(const std::filesystem::path& file);

}  // namespace shardline::text
