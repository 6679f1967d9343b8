// `shardline generate`: continuations of prompts on a CPU device.
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "model/tokenizer_loader.hpp"
#include "cli/conversation.hpp"
#include "cli/engine_flags.hpp"
#include "cli/group_flags.hpp"
#include "cli/sidp_flags.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/group/parallel_config.hpp"
#include "engine/sidp/sidp_group.hpp"
#include "sampling/structured_output/grammar.hpp"
#include "text/chat_template.hpp"

namespace shardline::cli {

namespace {

struct GenerateArgs {
  std::string model_dir;
  std::vector<std::string> prompts;
  std::vector<std::string> messages_files;  ///< --messages: conversations, rendered with the chat template
  std::string chat_template;                ///< --chat-template FILE
  EngineFlags engine;
  sampling::SamplingParams sampling;
  long long request_seed = -1;
  bool json = false;
  std::string parallel;  ///< dp=N with --weight-sharing sidp
  SidpFlags sidp;
  GroupFlags group;
  // Structured outputs (at most one): every prompt's output constrained.
  std::string guided_json_file;             ///< --guided-json FILE: a JSON schema
  std::string guided_regex;                 ///< --guided-regex RE
  std::vector<std::string> guided_choice;   ///< --guided-choice TEXT (repeatable)
  std::string guided_grammar_file;          ///< --guided-grammar FILE: EBNF
  bool json_object = false;                 ///< --json-object: any JSON
};

/// The structured-output spec of the flags (nullopt: none). Errors:
/// invalid_argument (two constraints), io (a file that cannot be read).
Result<std::optional<sampling::GrammarSpec>> grammar_spec(const GenerateArgs& a) {
  std::optional<sampling::GrammarSpec> spec;
  int given = 0;
  const auto read = [](const std::string& path) -> Result<std::string> {
    std::ifstream in(path);
    if (!in) return make_error(ErrorCode::io, "cannot read " + path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  if (!a.guided_json_file.empty()) {
    auto text = read(a.guided_json_file);
    if (!text) return std::move(text).error();
    spec = sampling::GrammarSpec{sampling::GrammarKind::json_schema, *text, {}, true};
    ++given;
  }
  if (!a.guided_regex.empty()) {
    spec = sampling::GrammarSpec{sampling::GrammarKind::regex, a.guided_regex, {}, true};
    ++given;
  }
  if (!a.guided_choice.empty()) {
    spec = sampling::GrammarSpec{sampling::GrammarKind::choice, "", a.guided_choice, true};
    ++given;
  }
  if (!a.guided_grammar_file.empty()) {
    auto text = read(a.guided_grammar_file);
    if (!text) return std::move(text).error();
    spec = sampling::GrammarSpec{sampling::GrammarKind::ebnf, *text, {}, true};
    ++given;
  }
  if (a.json_object) {
    spec = sampling::GrammarSpec{sampling::GrammarKind::json_object, "", {}, true};
    ++given;
  }
  if (given > 1)
    return make_error(ErrorCode::invalid_argument,
                      "give one of --guided-json, --guided-regex, --guided-choice, --guided-grammar, --json-object");
  return spec;
}

/// The prompts over a SiDP group (in this process, or over processes with
/// --group-master). Errors: bad flags (invalid_argument), what the group returns.
Result<std::vector<engine::RequestOutput>> generate_sidp(const GenerateArgs& a, const engine::EngineOptions& options,
                                                         const std::vector<std::vector<std::int32_t>>& prompt_ids) {
  auto pc = engine::parse_parallel_config(a.parallel.empty() ? "dp=2" : a.parallel);
  if (!pc) return std::move(pc).error();
  auto so = to_sidp_options(a.sidp, *pc);
  if (!so) return std::move(so).error();
  if (!a.group.master.empty()) {
    auto tcp = to_tcp_group_options(a.group);
    if (!tcp) return std::move(tcp).error();
    so->processes = *tcp;
  }
  auto po = to_sidp_policy(a.sidp, options, *so);
  if (!po) return std::move(po).error();
  if (po->setting == engine::SidpModeSetting::cas) so->initial_mode = model::sidp::SidpMode::cas;
  auto policy = engine::SidpModePolicy::create(*po);
  if (!policy) return std::move(policy).error();
  if (so->processes)
    std::cerr << "generate: SiDP rank 0 of dp=" << so->dp << ", waiting for ranks 1.." << so->dp - 1 << " at "
              << so->processes->master << "\n";
  auto group = engine::SidpGroup::create(options, *so);
  if (!group) return std::move(group).error();
  engine::SidpAutoSwitcher switcher(**group, std::move(policy).value());
  auto out = engine::generate_sidp(**group, prompt_ids, std::vector<sampling::SamplingParams>(prompt_ids.size(), a.sampling),
                                   options.num_threads, switcher.observer());
  for (const auto& sw : switcher.switches())
    std::cerr << "generate: SiDP switched to " << model::sidp::mode_name(sw.to) << " at " << sw.at_s << " s (group batch "
              << sw.group_batch << ", epoch " << sw.epoch << ")\n";
  return out;
}

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
  if (a.prompts.empty() && a.messages_files.empty()) {
    std::cerr << "error: give --prompt or --messages (at least one)\n";
    return 2;
  }
  auto spec = grammar_spec(a);
  if (!spec) {
    std::cerr << "error: " << spec.error().to_string() << "\n";
    return 2;
  }
  const bool sidp = a.sidp.weight_sharing == "sidp";
  if (sidp && spec->has_value()) {
    std::cerr << "error: structured outputs run on one device in generate (not with --weight-sharing sidp)\n";
    return 2;
  }
  if (!sidp && (!a.parallel.empty() || !a.group.master.empty())) {
    std::cerr << "error: generate runs one device; --parallel and --group-master need --weight-sharing sidp\n";
    return 2;
  }
  auto tokenizer = model::load_tokenizer(options->model_dir);
  if (!tokenizer) {
    std::cerr << "error: " << tokenizer.error().to_string() << "\n";
    return 1;
  }
  std::vector<std::vector<std::int32_t>> prompt_ids;
  prompt_ids.reserve(a.prompts.size() + a.messages_files.size());
  for (const std::string& p : a.prompts) prompt_ids.push_back((*tokenizer)->encode(p, true));
  if (!a.messages_files.empty()) {
    auto tpl = model::load_chat_template(options->model_dir, a.chat_template);
    if (!tpl) {
      std::cerr << "error: " << tpl.error().message << "\n";
      return tpl.error().code == ErrorCode::io ? 2 : 1;  // as `tokenize --messages`
    }
    for (const std::string& file : a.messages_files) {
      auto conversation = read_conversation(file);
      if (!conversation) {
        std::cerr << "error: " << conversation.error().message << "\n";
        return conversation.error().code == ErrorCode::io ? 1 : 2;  // as `tokenize --messages`
      }
      auto rendered = tpl->render(conversation->messages, /*add_generation_prompt=*/true, conversation->kwargs);
      if (!rendered) {
        std::cerr << "error: " << file << ": chat template: " << rendered.error().message << "\n";
        return 1;
      }
      // The template wrote the special tokens itself.
      prompt_ids.push_back((*tokenizer)->encode(*rendered, /*add_special_tokens=*/false));
      a.prompts.push_back(std::move(rendered).value());
    }
  }
  Result<std::vector<engine::RequestOutput>> outputs = make_error(ErrorCode::internal, "not run");
  engine::EngineInstance e;
  if (sidp) {
    outputs = generate_sidp(a, *options, prompt_ids);
  } else {
    auto built = engine::build_engine(*options);
    if (!built) {
      std::cerr << "error: " << built.error().to_string() << "\n";
      return 1;
    }
    e = std::move(built).value();
    std::shared_ptr<const sampling::CompiledGrammar> grammar;
    if (spec->has_value()) {
      auto compiler = engine::make_grammar_compiler(e);
      if (!compiler) {
        std::cerr << "error: " << compiler.error().to_string() << "\n";
        return 1;
      }
      auto g = (*compiler)->compile(**spec);
      if (!g) {
        std::cerr << "error: invalid_response_format: " << g.error().message << "\n";
        return 2;
      }
      grammar = std::move(g).value();
    }
    outputs = e.engine->generate(prompt_ids, a.sampling, grammar);
  }
  if (!outputs) {
    std::cerr << "error: " << outputs.error().to_string() << "\n";
    // A SiDP flag the group refuses (dp, ownership plan, ...) is a usage error.
    return sidp && outputs.error().code == ErrorCode::invalid_argument ? 2 : 1;
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
  cmd->add_option("--prompt", a->prompts, "A prompt (repeat for several; they run as one batch)");
  cmd->add_option("--messages", a->messages_files,
                  "A conversation FILE ({\"messages\": [...]} or a list of messages), rendered with the chat "
                  "template and a generation prompt (repeatable; runs with the prompts)");
  cmd->add_option("--chat-template", a->chat_template,
                  "Jinja chat template FILE for --messages (default: the model folder's)");
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
  cmd->add_option("--guided-json", a->guided_json_file,
                  "Structured output: every output is JSON valid against the schema in this file");
  cmd->add_option("--guided-regex", a->guided_regex, "Structured output: every output matches this regex");
  cmd->add_option("--guided-choice", a->guided_choice,
                  "Structured output: every output is one of these (repeatable)");
  cmd->add_option("--guided-grammar", a->guided_grammar_file,
                  "Structured output: every output matches the EBNF grammar (a root rule) in this file");
  cmd->add_flag("--json-object", a->json_object, "Structured output: every output is JSON");
  cmd->add_option("--stop", s.stop, "Stop string (repeatable); cut from the text");
  cmd->add_option("--stop-token-id", s.stop_token_ids, "Extra stop token id (repeatable)");
  cmd->add_option("--parallel", a->parallel, "dp=N: a SiDP group of N CPU devices (with --weight-sharing sidp)");
  add_sidp_flags(*cmd, a->sidp);
  add_group_flags(*cmd, a->group,
                  "HOST:PORT this process (SiDP rank 0) binds; ranks 1..N-1 are `shardline shard serve "
                  "--weight-sharing sidp` processes joining there");
  cmd->add_flag("--json", a->json,
                "One JSON object per prompt: prompt, prompt_token_ids, token_ids, text, finish_reason");
  cmd->callback([&run, a] { run = [a] { return run_generate(*a); }; });
}

}  // namespace shardline::cli
