#include "text/chat_template.hpp"

namespace shardline::text {

using ojson = nlohmann::ordered_json;

Result<ChatTemplate> ChatTemplate::from_config(const ojson& config, std::string source, std::string source_name) {
  ChatTemplate t;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"})
    if (config.contains(key))
      if (auto v = special_token_text(config[key])) t.special_tokens_[key] = *v;
  t.source_ = std::move(source_name);
  auto parsed = jinja::Template::parse(source);
  if (!parsed.ok()) return make_error(parsed.error().code, t.source_ + ": " + parsed.error().message);
  t.template_ = std::move(parsed).value();
  return t;
}

Result<ChatTemplate> ChatTemplate::from_source(const TokenizerConfig& config, std::string source,
                                               std::string source_name) {
  return from_config(config.config, std::move(source), std::move(source_name));
}

Result<ChatTemplate> ChatTemplate::load(const TokenizerConfig& tokenizer_config,
                                        const std::filesystem::path& model_dir,
                                        const std::filesystem::path& override_file) {
  const ojson& config = tokenizer_config.config;
  const std::string& config_file = tokenizer_config.source;
  std::error_code ec;
  if (!override_file.empty()) {
    auto text = read_text_file(override_file);
    if (!text.ok()) return make_error(ErrorCode::io, "--chat-template: " + text.error().message);
    return from_config(config, std::move(text).value(), override_file.string());
  }
  if (tokenizer_config.reads_template_files && std::filesystem::is_regular_file(model_dir / "chat_template.jinja", ec)) {
    auto text = read_text_file(model_dir / "chat_template.jinja");
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
      return make_error(ErrorCode::not_found, "chat_template_missing: " + config_file +
                                                  " lists named chat templates but none named 'default'");
  } else {
    return make_error(ErrorCode::corrupt, config_file + ": chat_template is neither a string nor a list");
  }
  return from_config(config, std::move(source), config_file);
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

}  // namespace shardline::text
