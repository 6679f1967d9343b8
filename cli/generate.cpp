// `shardline generate`: continuations of prompts on a CPU device.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/engine_flags.hpp"
#include "engine/engine_builder.hpp"

namespace shardline::cli {

namespace {

struct GenerateArgs {
  std::string model_dir;
  std::vector<std::string> prompts;
  EngineFlags engine;
  sampling::SamplingParams sampling;
  long long request_seed = -1;
  bool json = false;
};

int run_generate(GenerateArgs& a) {
  auto options = to_engine_options(a.engine, a.model_dir);
  if (!options) {
    std::cerr << "error: " << options.error().to_string() << "\n";
    return 2;
  }
  if (a.request_seed >= 0) {
    a.sampling.seed = static_cast<std::uint64_t>(a.request_seed);
    a.sampling.has_seed = true;
  }
  if (Status st = a.sampling.validate(); !st) {
    std::cerr << "error: " << st.error().to_string() << "\n";
    return 2;
  }
  auto built = engine::build_engine(*options);
  if (!built) {
    std::cerr << "error: " << built.error().to_string() << "\n";
    return 1;
  }
  engine::EngineInstance& e = *built;
  std::vector<std::vector<std::int32_t>> prompt_ids;
  prompt_ids.reserve(a.prompts.size());
  for (const std::string& p : a.prompts) prompt_ids.push_back(e.tokenizer->encode(p, true));
  auto outputs = e.engine->generate(prompt_ids, a.sampling);
  if (!outputs) {
    std::cerr << "error: " << outputs.error().to_string() << "\n";
    return 1;
  }
  for (std::size_t i = 0; i < outputs->size(); ++i) {
    const engine::RequestOutput& o = (*outputs)[i];
    if (a.json) {
      nlohmann::json j{{"prompt", a.prompts[i]},
                       {"prompt_token_ids", o.prompt_token_ids},
                       {"token_ids", o.token_ids},
                       {"text", o.text},
                       {"finish_reason", engine::finish_reason_name(o.finish_reason)}};
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      std::cout << a.prompts[i] << o.text << "\n";
      if (i + 1 < outputs->size()) std::cout << "\n";
    }
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate continuations of prompts (CPU)");
  cmd->add_option("--model", a->model_dir, "Hugging Face model folder")->required();
  cmd->add_option("--prompt", a->prompts, "A prompt (repeat for several; they run as one batch)")
      ->required();
  add_engine_flags(*cmd, a->engine);
  add_device_flag(*cmd, a->engine);
  sampling::SamplingParams& s = a->sampling;
  cmd->add_option("--max-tokens", s.max_tokens, "Generated tokens at most")->capture_default_str();
  cmd->add_option("--min-tokens", s.min_tokens, "Stop ids / EOS are ignored before this many");
  cmd->add_option("--temperature", s.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Keep the k most likely tokens (0 or -1: off)");
  cmd->add_option("--top-p", s.top_p, "Nucleus sampling mass (1: off)");
  cmd->add_option("--min-p", s.min_p, "Drop tokens below min_p * max prob (0: off)");
  cmd->add_option("--repetition-penalty", s.repetition_penalty, "Over prompt + output (1: off)");
  cmd->add_option("--presence-penalty", s.presence_penalty, "Over output tokens (0: off)");
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "Over output tokens (0: off)");
  cmd->add_option("--request-seed", a->request_seed,
                  "Sampling seed of every prompt (default: derived from --seed and the prompt index)");
  cmd->add_flag("--ignore-eos", s.ignore_eos, "Do not stop at the model's EOS ids");
  cmd->add_option("--stop", s.stop, "Stop string (repeatable); cut from the text");
  cmd->add_option("--stop-token-id", s.stop_token_ids, "Extra stop token id (repeatable)");
  cmd->add_flag("--json", a->json,
                "One JSON object per prompt: prompt, prompt_token_ids, token_ids, text, finish_reason");
  cmd->callback([&run, a] { run = [a] { return run_generate(*a); }; });
}

}  // namespace shardline::cli
