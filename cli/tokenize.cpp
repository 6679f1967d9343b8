// `shardline tokenize`: prints the token ids of a text.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "model/tokenizer.hpp"

namespace shardline::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer_dir;
  std::string text;
  std::string file;
  bool json = false;
  bool add_special_tokens = false;
};

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
  text->excludes(file);
  cmd->add_flag("--json", args->json, R"(Print {"token_ids": [...]})");
  cmd->add_flag("--add-special-tokens", args->add_special_tokens,
                "Add the model's BOS token as the model's tokenizer config asks");
  cmd->callback([&run, args, text, file] {
    if (text->count() == 0 && file->count() == 0) throw CLI::RequiredError("--text or --file");
    run = [args] { return run_tokenize(*args); };
  });
}

}  // namespace shardline::cli
