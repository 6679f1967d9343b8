// The Jinja interpreter (text/jinja.hpp) against Python's jinja2 as the
// oracle (tests/text/jinja_oracle.py: transformers' environment for chat
// templates). Every shipped chat template and a set of templates written to
// use each construct of the subset are rendered over a generated corpus of
// conversations (system or not, multi-turn, empty content, unicode,
// whitespace at the edges, an assistant turn last with and without a
// generation prompt, broken alternation), with the real model's template
// from its GGUF too; each rendering must equal jinja2's
// byte for byte, or both must fail. The chat_template_golden.json files
// are checked without Python too.
#include "text/jinja.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "model/gguf/gguf_file.hpp"
#include "model/gguf/gguf_model.hpp"
#include "tests/support/python.hpp"

namespace shardline::text::jinja {
namespace text_jinja_test {

using ojson = nlohmann::ordered_json;
const std::filesystem::path kShared = SHARDLINE_SHARED_DIR;
const std::filesystem::path kSource = SHARDLINE_SOURCE_DIR;

ojson read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  EXPECT_TRUE(in.good()) << file;
  return ojson::parse(in);
}

std::map<std::string, Template::Function> functions() {
  return {{"raise_exception", [](const std::vector<ojson>& args) -> Result<ojson> {
             return make_error(ErrorCode::invalid_argument,
                               "raise_exception: " + (args.empty() ? std::string() : args[0].get<std::string>()));
           }}};
}

/// The chat templates shipped in ../shared/tokenizers/*.
std::vector<std::pair<std::string, std::string>> shipped_templates() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& entry : std::filesystem::directory_iterator(kShared / "tokenizers")) {
    const auto cfg = entry.path() / "tokenizer_config.json";
    if (!std::filesystem::exists(cfg)) continue;
    const ojson c = read_json(cfg);
    if (c.contains("chat_template") && c["chat_template"].is_string())
      out.emplace_back(entry.path().filename().string(), c["chat_template"].get<std::string>());
  }
  return out;
}

/// The real model's own template, from its GGUF (`tokenizer.chat_template`).
std::string smollm2_gguf_template() {
  const auto file = kSource / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
  auto f = model::gguf::GgufFile::open(file);
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().to_string()) << " (run `bash deploy/fetch-models.sh`)";
  if (!f.ok()) return "";
  auto t = model::gguf::chat_template(*f);
  EXPECT_TRUE(t.ok() && t->has_value()) << file << " has no tokenizer.chat_template";
  return t.ok() && t->has_value() ? **t : "";
}

/// Templates written to use the subset's constructs (namespace,
/// raise_exception, macros, loop variables, filters, tests, slices,
/// whitespace control) beyond what the shipped ones use.
const std::vector<std::pair<std::string, std::string>> kWritten = {
    {"alternation",
     "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{{ '[' ~ m.role|upper ~ '] ' ~ m.content|trim }}{% if not loop.last %}\n{% endif %}{% endfor %}"
     "{% if add_generation_prompt %} [ASSISTANT]{% endif %}"},
    {"namespace_and_slices",
     "{%- set ns = namespace(found=false, n=0, last='') -%}\n"
     "{%- for m in messages[::-1] -%}\n"
     "  {%- if m.role == 'user' and not ns.found -%}{%- set ns.found = true -%}{%- set ns.last = m.content -%}{%- endif -%}\n"
     "  {%- set ns.n = ns.n + 1 -%}\n"
     "{%- endfor -%}\n"
     "last user: {{ ns.last[:20] }}|{{ ns.n }}|{{ messages[-1].role }}|{{ (messages|length) // 2 }}|{{ messages[1:]|length }}\n"
     "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% else %}none{% endfor %}\n"},
    {"macro_filters_tests",
     "{% macro turn(role, text, end='<|end|>') -%}\n"
     "<|{{ role }}|>\n{{ text }}{{ end }}\n"
     "{%- endmacro %}\n"
     "{% for m in messages %}\n"
     "    {{ turn(m.role, m.content | default('(none)', true)) }}\n"
     "    {% if m.content is string and m.content.startswith(' ') %}[lead]{% endif %}\n"
     "    {% if m.content is defined and m.content is not none and 'é' in m.content %}[é]{% endif %}\n"
     "{% endfor %}\n"
     "{{ messages | map(attribute='role') | join(', ') }}\n"
     "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} user turns, "
     "{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | unique | list | tojson }}\n"
     "{{ messages[0] | tojson }}|{{ {'a': [1, 2.5, none, true], 'b': 'x\"y'} | tojson(indent=2) }}\n"
     "{{ 'a,b,,c'.split(',') }} {{ '  x  '.strip() ~ '|' ~ 'xxhixx'.strip('x') }} {{ 'Hello World'.lower().replace('o', '0') }}\n"
     "{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 1.5 + 1 }} {{ 'ab' * 3 }}\n"
     "{{ range(3) | list }} {{ range(1, 10, 4) | list }} {{ [3, 1, 2] | sort | first }} {{ [3, 1, 2] | reverse | list }}\n"
     "{% set block %}inner {{ messages | length }}{% endset %}{{ block | upper }} {{ undefined_name | default('dflt') }}\n"
     "{{ none }} {{ true }} {{ 1.0 }} {{ [1, 'a'] }} {{ {'k': 'v'} }} {{ 'title case words' | title }} {{ 'x' | capitalize }}\n"
     "{{ 'line1\nline2\n\nline4' | indent(2) }}|{{ 'a\nb' | indent(3, true) }}\n"
     "{% for k, v in {'x': 1, 'y': 2} | items %}{{ k }}={{ v }};{% endfor %} {{ {'x': 1}.get('y', 'none') }}\n"
     "{%- for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}\n"
     "{{ messages[0].missing is defined }} {{ messages[0].missing is undefined }} {{ 3 is odd }} {{ 1 is number }} {{ [1] is iterable }}\n"},
    {"whitespace_control",
     "  {% if true %}\n    indented text\n  {% endif %}\n"
     "{{- ' a ' -}}   {{ ' b ' }}\n"
     "  {#- a comment -#}  \n"
     "{%+ if true %}kept{% endif %}\n"
     "{% for m in messages %}\n{{ m.role }}\n{% endfor %}\n"
     "end"},
};

/// A generated corpus of conversations.
std::vector<ojson> conversations() {
  const auto msg = [](const char* role, const std::string& content) { return ojson{{"role", role}, {"content", content}}; };
  std::vector<ojson> out;
  out.push_back(ojson::array({msg("user", "Hi")}));
  out.push_back(ojson::array({msg("system", "You are terse."), msg("user", "What is 2+2?")}));
  out.push_back(ojson::array({msg("user", "Hello"), msg("assistant", "Hi! How can I help?"), msg("user", "Tell me a joke.")}));
  out.push_back(ojson::array({msg("system", "S"), msg("user", "one"), msg("assistant", "two"), msg("user", "three"),
                              msg("assistant", "four")}));  // assistant last
  out.push_back(ojson::array({msg("user", "")}));  // empty content
  out.push_back(ojson::array({msg("user", "  leading and trailing  \n"), msg("assistant", "\nok\n")}));
  out.push_back(ojson::array({msg("user", "Unicode: café, naïve, 日本語, emoji 🚀, \"quotes\" and 'single'")}));
  out.push_back(ojson::array({msg("user", "a"), msg("user", "b")}));  // broken alternation
  out.push_back(ojson::array(
      {msg("user", "think about it"), msg("assistant", "<think>\nreasoning here\n</think>\n\nThe answer."),
       msg("user", "and now?")}));
  out.push_back(ojson::array({msg("system", "tabs\tand\\backslashes"), msg("user", "{{ not a template }}")}));
  return out;
}

ojson context_of(const ojson& messages, bool add_generation_prompt, int variant) {
  ojson c = {{"messages", messages},
             {"tools", nullptr},
             {"documents", nullptr},
             {"add_generation_prompt", add_generation_prompt},
             {"bos_token", "<s>"},
             {"eos_token", "</s>"}};
  if (variant == 1) c["enable_thinking"] = false;  // a chat_template_kwargs value (Qwen3)
  return c;
}

TEST(Jinja, EveryTemplateMatchesPythonJinja2OnTheCorpus) {
  const std::string problem = testing_support::python_env_problem("jinja2");
  ASSERT_TRUE(problem.empty()) << problem;
  auto templates = shipped_templates();
  ASSERT_GE(templates.size(), 2u) << "qwen3 and llama3_1 ship chat templates";
  templates.emplace_back("smollm2 gguf", smollm2_gguf_template());
  ASSERT_FALSE(templates.back().second.empty());
  templates.insert(templates.end(), kWritten.begin(), kWritten.end());
  ojson cases = ojson::array();
  std::vector<std::string> names;
  std::vector<Result<std::string>> ours;
  for (const auto& [name, source] : templates) {
    auto tpl = Template::parse(source);
    ASSERT_TRUE(tpl.ok()) << name << ": " << tpl.error().to_string();
    const auto convs = conversations();
    for (std::size_t c = 0; c < convs.size(); ++c)
      for (const bool gen : {false, true})
        for (int variant = 0; variant < 2; ++variant) {
          const ojson ctx = context_of(convs[c], gen, variant);
          cases.push_back({{"template", source}, {"context", ctx}});
          names.push_back(name + " conversation " + std::to_string(c) + (gen ? " +gen" : "") +
                          (variant ? " kwargs" : ""));
          ours.push_back(tpl->render(ctx, functions()));
        }
  }
  const auto dir = std::filesystem::temp_directory_path() / ("shardline_jinja_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "cases.json") << cases.dump();
  const std::string cmd = testing_support::kPython + " " + (kSource / "tests/text/jinja_oracle.py").string() + " " +
                          (dir / "cases.json").string() + " " + (dir / "out.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const ojson want = read_json(dir / "out.json");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(want.size(), ours.size());
  int errors_both = 0, texts = 0;
  for (std::size_t k = 0; k < ours.size(); ++k) {
    if (want[k].contains("error")) {
      EXPECT_FALSE(ours[k].ok()) << names[k] << ": jinja2 failed (" << want[k]["error"] << ") but we rendered:\n"
                                 << (ours[k].ok() ? *ours[k] : "");
      ++errors_both;
      continue;
    }
    ASSERT_TRUE(ours[k].ok()) << names[k] << ": " << ours[k].error().to_string();
    EXPECT_EQ(*ours[k], want[k]["text"].get<std::string>()) << names[k];
    ++texts;
  }
  std::printf("  %d renderings compared with jinja2, %d failing in both\n", texts, errors_both);
  EXPECT_GT(errors_both, 0) << "the corpus has a broken alternation that raise_exception refuses";
}

TEST(Jinja, ShippedGoldenRenderings) {
  for (const char* dir : {"qwen3", "llama3_1"}) {
    SCOPED_TRACE(dir);
    const ojson cfg = read_json(kShared / "tokenizers" / dir / "tokenizer_config.json");
    auto tpl = Template::parse(cfg["chat_template"].get<std::string>());
    ASSERT_TRUE(tpl.ok()) << tpl.error().to_string();
    const ojson golden = read_json(kShared / "tokenizers" / dir / "chat_template_golden.json");
    for (const auto& c : golden["cases"]) {
      ojson ctx = {{"messages", c["messages"]}, {"tools", nullptr}, {"documents", nullptr},
                   {"add_generation_prompt", c["add_generation_prompt"]}};
      for (const char* key : {"bos_token", "eos_token"})
        if (cfg.contains(key) && cfg[key].is_string()) ctx[key] = cfg[key];
      for (const auto& [k, v] : c.items())
        if (k != "messages" && k != "add_generation_prompt" && k != "text") ctx[k] = v;
      auto got = tpl->render(ctx, functions());
      ASSERT_TRUE(got.ok()) << got.error().to_string();
      EXPECT_EQ(*got, c["text"].get<std::string>());
    }
  }
}

TEST(Jinja, ErrorsNameTheTemplateLine) {
  const struct {
    const char* source;
    const char* words;
  } cases[] = {
      {"line one\n{% if x %}\nunclosed", "template line 2: 'if' without 'endif'"},
      {"a\nb\n{{ x | no_such_filter }}", "template line 3: unsupported filter 'no_such_filter'"},
      {"{% include 'other.j2' %}", "template line 1: unsupported tag 'include'"},
      {"{{ 'a' + }}", "template line 1: unexpected end of expression"},
      {"{{ messages.nope.deeper }}", "template line 1: 'deeper' of an undefined value"},
      {"\n{{ raise_exception('roles must alternate') }}", "raise_exception: roles must alternate"},
  };
  for (const auto& c : cases) {
    auto tpl = Template::parse(c.source);
    Result<std::string> r = tpl.ok() ? tpl->render(ojson{{"messages", ojson::object()}}, functions())
                                     : Result<std::string>(tpl.error());
    ASSERT_FALSE(r.ok()) << c.source;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find(c.words), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace shardline::text::jinja
