#include "model/chat_template.hpp"

#include "model/gguf/gguf_model.hpp"

#include <fstream>
#include <sstream>

namespace shardline::model {

namespace {

using ojson = nlohmann::ordered_json;

Result<std::string> read_text(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, "cannot read " + file.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// "<s>" or {"content": "<s>", ...} -> "<s>"; anything else: nullopt.
std::optional<std::string> token_text(const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

/// `model_dir`'s tokenizer_config.json, parsed (an empty object when the
/// folder has none).
Result<ojson> read_tokenizer_config(const std::filesystem::path& model_dir) {
  const auto config_file = model_dir / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_file, ec)) return ojson::object();
  auto text = read_text(config_file);
  if (!text.ok()) return text.error();
  ojson config = ojson::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object())
    return make_error(ErrorCode::corrupt, config_file.string() + ": not a valid JSON object");
  return config;
}

/// The tokenizer config a template is made from, and where it came from.
struct TokenizerConfig {
  ojson config;                  ///< special tokens' texts, maybe "chat_template"
  std::filesystem::path source;  ///< tokenizer_config.json, or "FILE.gguf metadata"
  bool from_gguf = false;        ///< a GGUF model (no chat_template.jinja beside it)
};

/// A GGUF model's from its metadata (bos/eos/unk/pad ids' texts and
/// tokenizer.chat_template), else tokenizer_config.json.
Result<TokenizerConfig> read_config(const std::filesystem::path& model_dir) {
  auto gguf_path = gguf::find_gguf(model_dir);
  if (!gguf_path.ok()) return gguf_path.error();
  if (!gguf_path->has_value()) {
    auto config = read_tokenizer_config(model_dir);
    if (!config.ok()) return config.error();
    return TokenizerConfig{std::move(config).value(), model_dir / "tokenizer_config.json", false};
  }
  auto file = gguf::GgufFile::open(**gguf_path);
  if (!file.ok()) return file.error();
  auto specials = gguf::special_token_texts(*file);
  if (!specials.ok()) return specials.error();
  TokenizerConfig out{ojson::object(), (*gguf_path)->string() + " metadata", true};
  for (const auto& [name, text] : *specials) out.config[name] = text;
  auto source = gguf::chat_template(*file);
  if (!source.ok()) return source.error();
  if (source->has_value()) out.config["chat_template"] = **source;
  return out;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_config(const ojson& config, std::string source, std::string source_name) {
  ChatTemplate t;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"})
    if (config.contains(key))
      if (auto v = token_text(config[key])) t.special_tokens_[key] = *v;
  t.source_ = std::move(source_name);
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) return make_error(parsed.error().code, t.source_ + ": " + parsed.error().message);
  t.template_ = std::move(parsed).value();
  return t;
}

Result<ChatTemplate> ChatTemplate::from_source(const std::filesystem::path& model_dir, std::string source,
                                               std::string source_name) {
  auto config = read_config(model_dir);
  if (!config.ok()) return config.error();
  return from_config(config->config, std::move(source), std::move(source_name));
}

Result<ChatTemplate> ChatTemplate::load(const std::filesystem::path& model_dir,
                                        const std::filesystem::path& override_file) {
  auto config_read = read_config(model_dir);
  if (!config_read.ok()) return config_read.error();
  const ojson& config = config_read->config;
  const std::filesystem::path& config_file = config_read->source;
  std::error_code ec;
  if (!override_file.empty()) {
    auto text = read_text(override_file);
    if (!text.ok()) return make_error(ErrorCode::io, "--chat-template: " + text.error().message);
    return from_config(config, std::move(text).value(), override_file.string());
  }
  if (!config_read->from_gguf && std::filesystem::is_regular_file(model_dir / "chat_template.jinja", ec)) {
    auto text = read_text(model_dir / "chat_template.jinja");
    if (!text.ok()) return text.error();
    return from_config(config, std::move(text).value(), (model_dir / "chat_template.jinja").string());
  }
  if (!config.contains("chat_template"))
    return make_error(ErrorCode::not_found,
                      "chat_template_missing: " + model_dir.string() +
                          " has no chat template (tokenizer_config.json chat_template, chat_template.jinja or a "
                          "GGUF's tokenizer.chat_template); "
                          "pass --chat-template FILE");
  const ojson& ct = config["chat_template"];
  std::string source;
  if (ct.is_string()) {
    source = ct.get<std::string>();
  } else if (ct.is_array()) {  // [{"name": ..., "template": ...}]: transformers uses "default"
    for (const ojson& named : ct)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        source = named["template"].get<std::string>();
    if (source.empty())
      return make_error(ErrorCode::not_found, "chat_template_missing: " + config_file.string() +
                                                  " lists named chat templates but none named 'default'");
  } else {
    return make_error(ErrorCode::corrupt, config_file.string() + ": chat_template is neither a string nor a list");
  }
  return from_config(config, std::move(source), config_file.string());
}

Result<std::string> ChatTemplate::render(const ojson& messages, bool add_generation_prompt,
                                         const ojson& kwargs) const {
  if (!messages.is_array()) return make_error(ErrorCode::invalid_argument, "messages must be a JSON array");
  ojson context = special_tokens_;
  if (kwargs.is_object())
    for (const auto& [k, v] : kwargs.items()) context[k] = v;
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  const std::map<std::string, jinja::Template::Function> functions = {
      {"raise_exception", [](const std::vector<ojson>& args) -> Result<ojson> {
         return make_error(ErrorCode::invalid_argument,
                           args.empty() || !args[0].is_string() ? std::string("raise_exception")
                                                                : args[0].get<std::string>());
       }}};
  return template_.render(context, functions);
}

}  // namespace shardline::model
