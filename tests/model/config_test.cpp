// Tests for model/config.cpp: parsing real configs (stories260K, the shapes/
// folder) and every class of error, checking code and message.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/config.hpp"

namespace sm = shardline::model;
using shardline::ErrorCode;
namespace fs = std::filesystem;

namespace model_config_test {

const fs::path kModels = fs::path(SHARDLINE_SHARED_DIR) / "models";

nlohmann::json stories_config_json() {
  std::ifstream in(kModels / "stories260K" / "config.json");
  return nlohmann::json::parse(in);
}

::testing::AssertionResult has_error(const shardline::Result<sm::ModelConfig>& r, ErrorCode code,
                                     std::initializer_list<std::string> needles) {
  if (r.ok()) return ::testing::AssertionFailure() << "expected an error, got success";
  if (r.error().code != code) {
    return ::testing::AssertionFailure()
           << "expected code " << shardline::error_code_name(code) << ", got "
           << r.error().to_string();
  }
  for (const std::string& n : needles) {
    if (r.error().message.find(n) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message '" << r.error().message << "' does not mention '" << n << "'";
    }
  }
  return ::testing::AssertionSuccess();
}

shardline::Result<sm::ModelConfig> parse(const nlohmann::json& j) {
  return sm::parse_model_config(j.dump(), "", "/m/config.json");
}

fs::path make_temp_dir(const std::string& tag) {
  static int counter = 0;
  fs::path d = fs::temp_directory_path() /
               ("shardline_config_test_" + tag + "_" + std::to_string(::getpid()) + "_" +
                std::to_string(counter++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}


TEST(ModelConfig, Stories260K) {
  auto r = sm::load_model_config(kModels / "stories260K");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const sm::ModelConfig& c = r.value();
  EXPECT_EQ(c.arch, sm::Architecture::llama);
  EXPECT_EQ(c.architecture_string, "LlamaForCausalLM");
  EXPECT_STREQ(sm::architecture_name(c.arch), "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{2, 1}));
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_EQ(c.num_queries_per_kv(), 2);
  EXPECT_EQ(c.qkv_rows(), (8 + 2 * 4) * 8);
  EXPECT_EQ(c.num_parameters(), 260032);  // SOURCE.md
}

TEST(ModelConfig, AllShapes) {
  struct Expect {
    const char* dir;
    sm::Architecture arch;
    int hidden, inter, layers, heads, kv, head_dim, vocab;
    bool tied, llama3;
    std::vector<int> eos;
    double params_billion;  // README "params (approx.)"
  };
  const std::vector<Expect> cases = {
      {"stories110m", sm::Architecture::llama, 768, 2048, 12, 12, 12, 64, 32000, true, false, {2}, 0.110},
      {"qwen3-0.6b", sm::Architecture::qwen3, 1024, 3072, 28, 16, 8, 128, 151936, true, false, {151645}, 0.6},
      {"qwen3-8b", sm::Architecture::qwen3, 4096, 12288, 36, 32, 8, 128, 151936, false, false, {151645}, 8.2},
      {"qwen3-32b", sm::Architecture::qwen3, 5120, 25600, 64, 64, 8, 128, 151936, false, false, {151645}, 32.8},
      {"llama-3.1-8b", sm::Architecture::llama, 4096, 14336, 32, 32, 8, 128, 128256, false, true, {128001, 128008, 128009}, 8.0},
      {"llama-3.1-70b", sm::Architecture::llama, 8192, 28672, 80, 64, 8, 128, 128256, false, true, {128001, 128008, 128009}, 70.6},
  };
  for (const Expect& e : cases) {
    SCOPED_TRACE(e.dir);
    auto r = sm::load_model_config(kModels / "shapes" / e.dir);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    const sm::ModelConfig& c = r.value();
    EXPECT_EQ(c.arch, e.arch);
    EXPECT_EQ(c.hidden_size, e.hidden);
    EXPECT_EQ(c.intermediate_size, e.inter);
    EXPECT_EQ(c.num_hidden_layers, e.layers);
    EXPECT_EQ(c.num_attention_heads, e.heads);
    EXPECT_EQ(c.num_key_value_heads, e.kv);
    EXPECT_EQ(c.head_dim, e.head_dim);
    EXPECT_EQ(c.vocab_size, e.vocab);
    EXPECT_EQ(c.tie_word_embeddings, e.tied);
    EXPECT_EQ(c.qk_norm, e.arch == sm::Architecture::qwen3);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(c.eos_token_ids, e.eos);
    EXPECT_EQ(c.rope_scaling.has_value(), e.llama3);
    if (e.llama3) {
      EXPECT_EQ(c.rope_scaling->rope_type, "llama3");
      EXPECT_FLOAT_EQ(c.rope_scaling->factor, 8.0f);
      EXPECT_FLOAT_EQ(c.rope_scaling->low_freq_factor, 1.0f);
      EXPECT_FLOAT_EQ(c.rope_scaling->high_freq_factor, 4.0f);
      EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
      EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
    }
    const double billions = static_cast<double>(c.num_parameters()) / 1e9;
    EXPECT_NEAR(billions, e.params_billion, e.params_billion * 0.03);
  }
}

TEST(ModelConfig, Qwen3HeadDimIndependentOfHidden) {
  // qwen3-0.6b: 16 heads x 128 = 2048 != hidden 1024; head_dim must come from config.
  auto r = sm::load_model_config(kModels / "shapes" / "qwen3-0.6b");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->head_dim, 128);
  EXPECT_EQ(r->qkv_rows(), (16 + 16) * 128);
}

TEST(ModelConfig, Defaults) {
  nlohmann::json j = stories_config_json();
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  j.erase("eos_token_id");
  j.erase("rope_scaling");
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->head_dim, 64 / 8);
  EXPECT_EQ(r->num_key_value_heads, 8);
  EXPECT_TRUE(r->eos_token_ids.empty());
  EXPECT_FALSE(r->rope_scaling.has_value());
}

TEST(ModelConfig, ArchitectureFlags) {
  nlohmann::json j = stories_config_json();
  j["architectures"] = {"Qwen2ForCausalLM"};
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->arch, sm::Architecture::qwen2);
  EXPECT_TRUE(r->qkv_bias);
  EXPECT_FALSE(r->qk_norm);

  j["architectures"] = {"Qwen3ForCausalLM"};
  j.erase("attention_bias");
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->qk_norm);
  EXPECT_FALSE(r->qkv_bias);

  j["architectures"] = {"LlamaForCausalLM"};
  j["attention_bias"] = true;
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->qkv_bias);
}

TEST(ModelConfig, EosUnionAndForms) {
  nlohmann::json j = stories_config_json();
  j["eos_token_id"] = {7, 3};
  auto r = sm::parse_model_config(j.dump(), R"({"eos_token_id": 3})", "/m/config.json");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->eos_token_ids, (std::vector<int>{7, 3}));
  r = sm::parse_model_config(j.dump(), R"({"eos_token_id": [9, 7]})", "/m/config.json");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->eos_token_ids, (std::vector<int>{7, 3, 9}));

  r = sm::parse_model_config(j.dump(), R"({"eos_token_id": "x"})", "/m/config.json");
  EXPECT_TRUE(has_error(r, ErrorCode::invalid_argument, {"generation_config.json", "eos_token_id"}));
  r = sm::parse_model_config(j.dump(), "{oops", "/m/config.json");
  EXPECT_TRUE(has_error(r, ErrorCode::corrupt, {"/m/generation_config.json"}));
}

TEST(ModelConfig, RopeScaling) {
  nlohmann::json j = stories_config_json();
  j["rope_scaling"] = {{"type", "llama3"}, {"factor", 4.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 2.0}, {"original_max_position_embeddings", 1024}};
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(r->rope_scaling.has_value());
  EXPECT_FLOAT_EQ(r->rope_scaling->factor, 4.0f);
  EXPECT_FLOAT_EQ(r->rope_scaling->high_freq_factor, 2.0f);
  EXPECT_EQ(r->rope_scaling->original_max_position_embeddings, 1024);

  j["rope_scaling"] = {{"rope_type", "default"}};
  r = parse(j);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_FALSE(r->rope_scaling.has_value());

  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_TRUE(has_error(parse(j), ErrorCode::unsupported, {"/m/config.json", "rope_scaling", "yarn"}));
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_TRUE(has_error(parse(j), ErrorCode::unsupported, {"/m/config.json", "rope_scaling.type", "linear"}));
  j["rope_scaling"] = {{"rope_type", "llama3"}};
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "rope_scaling.factor"}));
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", -2.0}};
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"rope_scaling.factor"}));
  j["rope_scaling"] = "llama3";
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "rope_scaling"}));
}

TEST(ModelConfig, UnsupportedArchitecture) {
  nlohmann::json j = stories_config_json();
  j["architectures"] = {"MistralForCausalLM"};
  EXPECT_TRUE(has_error(parse(j), ErrorCode::unsupported,
                        {"/m/config.json", "architectures", "MistralForCausalLM"}));
  j["architectures"] = nlohmann::json::array();
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "architectures"}));
  j.erase("architectures");
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "architectures"}));
}

TEST(ModelConfig, BadJson) {
  EXPECT_TRUE(has_error(sm::parse_model_config("{\"hidden_size\": ", "", "/m/config.json"),
                        ErrorCode::corrupt, {"/m/config.json", "JSON"}));
  EXPECT_TRUE(has_error(sm::parse_model_config("[1, 2]", "", "/m/config.json"), ErrorCode::corrupt,
                        {"/m/config.json", "object"}));
  EXPECT_TRUE(has_error(sm::parse_model_config("", "", "/m/config.json"), ErrorCode::corrupt,
                        {"/m/config.json"}));
}

TEST(ModelConfig, MissingAndInvalidFields) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size"}) {
    SCOPED_TRACE(field);
    nlohmann::json j = stories_config_json();
    j.erase(field);
    EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", field, "missing"}));
    j[field] = 0;
    EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", field, "positive"}));
    j[field] = -3;
    EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", field}));
    j[field] = "64";
    EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", field, "integer"}));
    j[field] = 1.5;
    EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", field}));
  }
  nlohmann::json j = stories_config_json();
  j["num_key_value_heads"] = 3;  // 8 % 3 != 0
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "num_key_value_heads"}));

  j = stories_config_json();
  j.erase("head_dim");
  j["num_attention_heads"] = 6;  // 64 % 6 != 0
  j["num_key_value_heads"] = 3;
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "head_dim"}));

  j = stories_config_json();
  j["rms_norm_eps"] = -1.0;
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "rms_norm_eps"}));
  j = stories_config_json();
  j["rope_theta"] = "big";
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "rope_theta"}));
  j = stories_config_json();
  j["tie_word_embeddings"] = 1;
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "tie_word_embeddings"}));
  j = stories_config_json();
  j["eos_token_id"] = {2, "x"};
  EXPECT_TRUE(has_error(parse(j), ErrorCode::invalid_argument, {"/m/config.json", "eos_token_id"}));
}

TEST(ModelConfig, LoadFromDirectoryErrors) {
  const fs::path dir = make_temp_dir("dir");
  EXPECT_TRUE(has_error(sm::load_model_config(dir), ErrorCode::not_found,
                        {(dir / "config.json").string()}));
  {
    std::ofstream(dir / "config.json") << "{ not json";
  }
  EXPECT_TRUE(has_error(sm::load_model_config(dir), ErrorCode::corrupt,
                        {(dir / "config.json").string()}));
  {
    std::ofstream(dir / "config.json") << stories_config_json().dump();
    std::ofstream(dir / "generation_config.json") << "[";
  }
  EXPECT_TRUE(has_error(sm::load_model_config(dir), ErrorCode::corrupt,
                        {(dir / "generation_config.json").string()}));
  {
    std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [5]})";
  }
  auto r = sm::load_model_config(dir);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->eos_token_ids, (std::vector<int>{2, 5}));
  fs::remove_all(dir);
}

}  // namespace model_config_test
