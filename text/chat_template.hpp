#pragma once
/// \file
/// A model's chat template, rendered as transformers' `apply_chat_template`
/// renders it (text/jinja.hpp): the template comes from `--chat-template
/// FILE`, else `chat_template.jinja` in the model folder, else
/// `tokenizer_config.json`'s `chat_template` (a string, or a list of named
/// templates: the one named "default"). Reading a GGUF model's metadata
/// instead of tokenizer_config.json is the model layer's
/// (model/tokenizer_loader.hpp: `load_chat_template`). The context is `messages`,
/// `tools` = none, `documents` = none, `add_generation_prompt`, the
/// tokenizer config's special tokens (`bos_token`, `eos_token`, ...) and the
/// request's `chat_template_kwargs`; `raise_exception(msg)` stops rendering
/// with the template's message.

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.hpp"
#include "text/jinja.hpp"
#include "text/tokenizer_config.hpp"

namespace shardline::text {

class ChatTemplate {
 public:
  /// The template of `model_dir` with `config`'s special tokens:
  /// `override_file` when not empty, else `model_dir`/chat_template.jinja
  /// (when config.reads_template_files), else config's "chat_template".
  /// Errors: not_found "chat_template_missing: ..." (none of them), corrupt
  /// (a chat_template that is neither a string nor a list), io (the
  /// override file), invalid_argument (a template that does not parse: the
  /// line named).
  [[nodiscard]] static Result<ChatTemplate> load(const TokenizerConfig& config, const std::filesystem::path& model_dir,
                                                 const std::filesystem::path& override_file = {});

  /// A template given as text (e.g. a job's --chat-template, sent to a
  /// worker), with `config`'s special tokens; `source_name` names it in
  /// errors. Errors: invalid_argument (the template does not parse: the
  /// line named).
  [[nodiscard]] static Result<ChatTemplate> from_source(const TokenizerConfig& config, std::string source,
                                                        std::string source_name);

  /// Renders `messages` (a JSON array of {role, content, ...}). `kwargs`
  /// (an object, e.g. {"enable_thinking": false}) are extra globals.
  /// Errors: invalid_argument (messages not an array; the template's
  /// raise_exception message; a template error naming its line).
  [[nodiscard]] Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                           const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;

  /// Where the template came from (a path, or "tokenizer_config.json").
  [[nodiscard]] const std::string& source() const { return source_; }

 private:
  static Result<ChatTemplate> from_config(const nlohmann::ordered_json& config, std::string source,
                                          std::string source_name);

  jinja::Template template_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();  ///< bos_token, eos_token, ...
  std::string source_;
};

}  // namespace shardline::text
