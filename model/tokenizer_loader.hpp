#pragma once
/// \file
/// A model folder's tokenizer and chat template, whichever way the model is
/// stored: a GGUF model (`dir` a .gguf file, or a folder holding one and no
/// config.json; model/gguf/gguf_model.hpp) gives them from its metadata,
/// any other folder from its tokenizer files (text/tokenizer.hpp,
/// text/chat_template.hpp).

#include <filesystem>
#include <memory>
#include <string>

#include "common/result.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

namespace shardline::model {

/// The tokenizer of `dir`: a GGUF model's metadata, else tokenizer.json
/// (when supported) or tokenizer.model (text::load_tokenizer_files).
/// Errors: not_found (no tokenizer), corrupt (an unparsable file; names it),
/// and the GGUF reader's errors.
[[nodiscard]] Result<std::unique_ptr<text::Tokenizer>> load_tokenizer(const std::filesystem::path& dir);

/// True when `dir` has a tokenizer load_tokenizer would read (tokenizer.json,
/// tokenizer.model, or a GGUF file; a GGUF lookup error counts, so that
/// load_tokenizer reports it); a random-weights shape folder has none.
[[nodiscard]] bool has_tokenizer(const std::filesystem::path& dir);

/// The special tokens and chat template a template of `model_dir` is made
/// from: a GGUF model's metadata (bos/eos/unk/pad texts and
/// tokenizer.chat_template), else tokenizer_config.json.
[[nodiscard]] Result<text::TokenizerConfig> read_tokenizer_config(const std::filesystem::path& model_dir);

/// The chat template of `model_dir` (or `override_file` when not empty);
/// text::ChatTemplate::load over read_tokenizer_config(model_dir).
[[nodiscard]] Result<text::ChatTemplate> load_chat_template(const std::filesystem::path& model_dir,
                                                            const std::filesystem::path& override_file = {});

/// A template given as text (a job's --chat-template, sent to a worker),
/// with `model_dir`'s special tokens; `source_name` names it in errors.
[[nodiscard]] Result<text::ChatTemplate> chat_template_from_source(const std::filesystem::path& model_dir,
                                                                   std::string source, std::string source_name);

}  // namespace shardline::model
