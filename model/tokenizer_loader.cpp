#include "model/tokenizer_loader.hpp"

#include <exception>
#include <utility>

#include "model/gguf/gguf_model.hpp"

namespace shardline::model {

Result<std::unique_ptr<text::Tokenizer>> load_tokenizer(const std::filesystem::path& dir) {
  try {
    auto gguf_path = gguf::find_gguf(dir);
    if (!gguf_path.ok()) return gguf_path.error();
    if (!gguf_path->has_value()) return text::load_tokenizer_files(dir);
    auto file = gguf::GgufFile::open(**gguf_path);
    if (!file.ok()) return file.error();
    return gguf::load_tokenizer(*file);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, dir.string() + ": loading tokenizer: " + e.what());
  }
}

bool has_tokenizer(const std::filesystem::path& dir) {
  if (text::has_tokenizer_files(dir)) return true;
  auto gguf_path = gguf::find_gguf(dir);
  return !gguf_path.ok() || gguf_path->has_value();  // a GGUF error is the tokenizer's to report
}

Result<text::TokenizerConfig> read_tokenizer_config(const std::filesystem::path& model_dir) {
  auto gguf_path = gguf::find_gguf(model_dir);
  if (!gguf_path.ok()) return gguf_path.error();
  if (!gguf_path->has_value()) return text::read_tokenizer_config(model_dir);
  auto file = gguf::GgufFile::open(**gguf_path);
  if (!file.ok()) return file.error();
  auto specials = gguf::special_token_texts(*file);
  if (!specials.ok()) return specials.error();
  text::TokenizerConfig out;
  out.source = (*gguf_path)->string() + " metadata";
  out.reads_template_files = false;
  for (const auto& [name, token_text] : *specials) out.config[name] = token_text;
  auto source = gguf::chat_template(*file);
  if (!source.ok()) return source.error();
  if (source->has_value()) out.config["chat_template"] = **source;
  return out;
}

Result<text::ChatTemplate> load_chat_template(const std::filesystem::path& model_dir,
                                              const std::filesystem::path& override_file) {
  auto config = read_tokenizer_config(model_dir);
  if (!config.ok()) return config.error();
  return text::ChatTemplate::load(*config, model_dir, override_file);
}

Result<text::ChatTemplate> chat_template_from_source(const std::filesystem::path& model_dir, std::string source,
                                                     std::string source_name) {
  auto config = read_tokenizer_config(model_dir);
  if (!config.ok()) return config.error();
  return text::ChatTemplate::from_source(*config, std::move(source), std::move(source_name));
}

}  // namespace shardline::model
