// `shardline tokenize`: prints the token ids of a text, or of a conversation
// rendered with the model's chat template (--messages).
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "model/tokenizer_loader.hpp"
#include "cli/conversation.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

namespace shardline::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer_dir;
  std::string text;
  std::string file;
  bool json = false;
  bool add_special_tokens = false;
  std::string messages_file;  ///< --messages: {"messages": [...]} or a bare list
  std::string chat_template;  ///< --chat-template FILE
  bool add_generation_prompt = false;
};

/// --messages: renders the conversation and prints {"prompt", "token_ids"}
/// (or the prompt, then the ids). The ids are the prompt's without added
/// specials, as transformers' apply_chat_template(tokenize=True) gives them.
int run_messages(const TokenizeArgs& a, const text::Tokenizer& tok) {
  auto conversation = read_conversation(a.messages_file);
  if (!conversation) {
    std::cerr << "error: " << conversation.error().message << "\n";
    return conversation.error().code == ErrorCode::io ? 1 : 2;
  }
  auto tpl = model::load_chat_template(a.tokenizer_dir, a.chat_template);
  if (!tpl) {
    std::cerr << "error: " << tpl.error().to_string() << "\n";
    return 1;
  }
  auto prompt = tpl->render(conversation->messages, a.add_generation_prompt, conversation->kwargs);
  if (!prompt) {
    std::cerr << "error: " << prompt.error().to_string() << "\n";
    return 1;
  }
  const std::vector<std::int32_t> ids = tok.encode(*prompt, /*add_special_tokens=*/false);
  if (a.json) {
    std::cout << nlohmann::ordered_json{{"prompt", *prompt}, {"token_ids", ids}}.dump() << "\n";
  } else {
    std::cout << *prompt << "\n";
    for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

int run_tokenize(const TokenizeArgs& a) {
  std::string text = a.text;
  if (!a.file.empty()) {
    std::ifstream in(a.file, std::ios::binary);
    if (!in) {
      std::cerr << "error: cannot read --file " << a.file << "\n";
      return 1;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  auto tok = model::load_tokenizer(a.tokenizer_dir);
  if (!tok) {
    std::cerr << "error: " << tok.error().to_string() << "\n";
    return 1;
  }
  if (!a.messages_file.empty()) return run_messages(a, **tok);
  const std::vector<std::int32_t> ids = (*tok)->encode(text, a.add_special_tokens);
  if (a.json) {
    std::cout << nlohmann::json{{"token_ids", ids}}.dump() << "\n";
  } else {
    for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, std::function<int()>& run) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  cmd->add_option("--tokenizer", args->tokenizer_dir,
                  "Model folder, or a folder with only tokenizer files "
                  "(tokenizer.json or tokenizer.model)")
      ->required();
  auto* text = cmd->add_option("--text", args->text, "Text to encode");
  auto* file = cmd->add_option("--file", args->file, "File whose contents to encode");
  auto* messages = cmd->add_option("--messages", args->messages_file,
                                   "A conversation ({\"messages\": [...]} or a list of messages) to render with the "
                                   "model's chat template, then encode");
  text->excludes(file);
  text->excludes(messages);
  file->excludes(messages);
  cmd->add_option("--chat-template", args->chat_template,
                  "A Jinja chat template file to use instead of the model folder's");
  cmd->add_flag("--add-generation-prompt", args->add_generation_prompt,
                "With --messages: end with the assistant turn's opening (add_generation_prompt)");
  cmd->add_flag("--json", args->json, R"(Print {"token_ids": [...]})");
  cmd->add_flag("--add-special-tokens", args->add_special_tokens,
                "Add the model's BOS token as the model's tokenizer config asks");
  cmd->callback([&run, args, text, file, messages] {
    if (text->count() == 0 && file->count() == 0 && messages->count() == 0)
      throw CLI::RequiredError("--text, --file or --messages");
    run = [args] { return run_tokenize(*args); };
  });
}

}  // namespace shardline::cli
