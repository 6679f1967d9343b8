// Tests for model/loader.cpp and model/dummy.cpp: stories260K in f32/bf16,
// fused layouts equal to the source tensors, sharded folders, clear errors,
// synthetic Qwen2/Qwen3 folders (bias, q/k norm) and seeded dummy weights.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/weights.hpp"
#include "tests/model/safetensors_writer.hpp"

namespace fs = std::filesystem;
namespace sm = shardline::model;
using shardline::DType;
using shardline::ErrorCode;
using shardline::testing_util::make_temp_dir;
using shardline::testing_util::raw_bytes;
using shardline::testing_util::write_safetensors;
using shardline::testing_util::WTensor;

namespace model_loader_test {

const fs::path kStories = fs::path(SHARDLINE_SHARED_DIR) / "models" / "stories260K";
const fs::path kShapes = fs::path(SHARDLINE_SHARED_DIR) / "models" / "shapes";

/// An F32 tensor read by the test's own minimal parser (not the reader under test).
struct RefTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

std::map<std::string, RefTensor> read_reference(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::map<std::string, RefTensor> out;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(e["dtype"], "F32");
    RefTensor t;
    t.shape = e["shape"].get<std::vector<std::int64_t>>();
    const std::uint64_t b = e["data_offsets"][0], end = e["data_offsets"][1];
    t.values.resize((end - b) / 4);
    std::memcpy(t.values.data(), bytes.data() + 8 + n + b, end - b);
    out[name] = std::move(t);
  }
  return out;
}

const std::map<std::string, RefTensor>& stories_reference() {
  static const auto ref = read_reference(kStories / "model.safetensors");
  return ref;
}

float matrix_at(const sm::Matrix& m, std::size_t row, std::size_t col) {
  const std::size_t i = row * static_cast<std::size_t>(m.cols) + col;
  if (m.dtype == DType::f32) return static_cast<const float*>(m.data)[i];
  return shardline::bf16_to_f32(static_cast<const std::uint16_t*>(m.data)[i]);
}

/// Expected stored value of a source F32 value in storage dtype `dt`.
float stored(float x, DType dt) {
  return dt == DType::f32 ? x : shardline::bf16_to_f32(shardline::f32_to_bf16(x));
}

/// Checks rows [row0, row0 + src rows) of `m` equal the source tensor `name`.
void expect_rows_equal(const sm::Matrix& m, std::size_t row0, const std::string& name,
                       const std::map<std::string, RefTensor>& ref) {
  SCOPED_TRACE(name);
  const RefTensor& t = ref.at(name);
  ASSERT_EQ(t.shape.size(), 2u);
  ASSERT_EQ(t.shape[1], m.cols);
  ASSERT_LE(row0 + static_cast<std::size_t>(t.shape[0]), static_cast<std::size_t>(m.rows));
  std::size_t bad = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(t.shape[0]); ++r) {
    for (std::size_t c = 0; c < static_cast<std::size_t>(t.shape[1]); ++c) {
      const float want = stored(t.values[r * t.shape[1] + c], m.dtype);
      if (matrix_at(m, row0 + r, c) != want && bad++ < 3) {
        ADD_FAILURE() << "row " << r << " col " << c << ": got " << matrix_at(m, row0 + r, c)
                      << ", want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

void expect_vector_equal(const sm::Vector& v, std::size_t off, const std::string& name,
                         const std::map<std::string, RefTensor>& ref) {
  SCOPED_TRACE(name);
  const RefTensor& t = ref.at(name);
  ASSERT_LE(off + t.values.size(), static_cast<std::size_t>(v.size));
  for (std::size_t i = 0; i < t.values.size(); ++i) ASSERT_EQ(v.data[off + i], t.values[i]) << i;
}

bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

/// Checks every weight of a loaded stories260K-like model against `ref`.
void expect_matches_reference(const sm::ModelWeights& w, const std::map<std::string, RefTensor>& ref) {
  const sm::ModelConfig& c = w.config;
  const std::size_t q_rows = static_cast<std::size_t>(c.num_attention_heads) * c.head_dim;
  const std::size_t kv_rows = static_cast<std::size_t>(c.num_key_value_heads) * c.head_dim;
  expect_rows_equal(w.embed_tokens, 0, "model.embed_tokens.weight", ref);
  expect_vector_equal(w.final_norm, 0, "model.norm.weight", ref);
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    const sm::LayerWeights& L = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    expect_vector_equal(L.input_norm, 0, p + "input_layernorm.weight", ref);
    expect_rows_equal(L.qkv, 0, p + "self_attn.q_proj.weight", ref);
    expect_rows_equal(L.qkv, q_rows, p + "self_attn.k_proj.weight", ref);
    expect_rows_equal(L.qkv, q_rows + kv_rows, p + "self_attn.v_proj.weight", ref);
    expect_rows_equal(L.o_proj, 0, p + "self_attn.o_proj.weight", ref);
    expect_vector_equal(L.post_attention_norm, 0, p + "post_attention_layernorm.weight", ref);
    expect_rows_equal(L.gate_up, 0, p + "mlp.gate_proj.weight", ref);
    expect_rows_equal(L.gate_up, static_cast<std::size_t>(c.intermediate_size), p + "mlp.up_proj.weight", ref);
    expect_rows_equal(L.down_proj, 0, p + "mlp.down_proj.weight", ref);
  }
}

void expect_matrix(const sm::Matrix& m, DType dt, int rows, int cols) {
  EXPECT_EQ(m.dtype, dt);
  EXPECT_EQ(m.rows, rows);
  EXPECT_EQ(m.cols, cols);
  ASSERT_FALSE(m.empty());
  EXPECT_TRUE(aligned64(m.data));
}

/// Copies stories260K's json files into `dir`, optionally editing config.json.
void copy_configs(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit = {}) {
  std::ifstream in(kStories / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  if (edit) edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  fs::copy_file(kStories / "generation_config.json", dir / "generation_config.json");
}

/// Writes `names` of the reference (F32, or re-encoded as BF16) into `file`.
void write_subset(const fs::path& file, const std::vector<std::string>& names,
                  const std::map<std::string, RefTensor>& ref, bool as_bf16 = false) {
  std::vector<WTensor> ts;
  for (const std::string& n : names) {
    const RefTensor& t = ref.at(n);
    if (as_bf16) {
      std::vector<std::uint16_t> h(t.values.size());
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = shardline::f32_to_bf16(t.values[i]);
      ts.push_back(WTensor{n, "BF16", t.shape, raw_bytes(h)});
    } else {
      ts.push_back(WTensor{n, "F32", t.shape, raw_bytes(t.values)});
    }
  }
  write_safetensors(file, ts);
}

::testing::AssertionResult fails_with(const shardline::Result<sm::ModelWeights>& r, ErrorCode code,
                                      std::initializer_list<std::string> needles) {
  if (r.ok()) return ::testing::AssertionFailure() << "expected an error, loaded fine";
  if (r.error().code != code) {
    return ::testing::AssertionFailure() << "expected " << shardline::error_code_name(code)
                                         << ", got " << r.error().to_string();
  }
  for (const std::string& n : needles) {
    if (r.error().message.find(n) == std::string::npos) {
      return ::testing::AssertionFailure() << "message does not mention '" << n
                                           << "': " << r.error().message;
    }
  }
  return ::testing::AssertionSuccess();
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("loader_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};


// How long these loads take is measured in bench/micro_bench.cpp.
TEST(Loader, Stories260KF32) {
  auto r = sm::load_model(kStories, {});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const sm::ModelWeights& w = r.value();
  EXPECT_EQ(w.dtype, DType::f32);
  EXPECT_EQ(w.config.num_hidden_layers, 5);
  ASSERT_EQ(w.layers.size(), 5u);
  expect_matrix(w.embed_tokens, DType::f32, 512, 64);
  for (const sm::LayerWeights& L : w.layers) {
    expect_matrix(L.qkv, DType::f32, (8 + 2 * 4) * 8, 64);
    expect_matrix(L.o_proj, DType::f32, 64, 64);
    expect_matrix(L.gate_up, DType::f32, 2 * 172, 64);
    expect_matrix(L.down_proj, DType::f32, 64, 172);
    EXPECT_EQ(L.input_norm.size, 64);
    EXPECT_EQ(L.post_attention_norm.size, 64);
    EXPECT_TRUE(aligned64(L.input_norm.data));
    EXPECT_TRUE(L.qkv_bias.empty());
    EXPECT_TRUE(L.q_norm.empty());
    EXPECT_TRUE(L.k_norm.empty());
  }
  EXPECT_EQ(w.final_norm.size, 64);
  // Tied: lm_head aliases embed_tokens and is counted once.
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
  EXPECT_EQ(w.lm_head.rows, 512);
  EXPECT_EQ(w.lm_head.cols, 64);
  EXPECT_EQ(w.total_bytes(), static_cast<std::size_t>(260032) * 4);
  expect_matches_reference(w, stories_reference());
  // Spot check against hand-picked source positions (q row 0 / k row 0 / up row 0).
  const auto& ref = stories_reference();
  EXPECT_EQ(matrix_at(w.layers[2].qkv, 64, 5), ref.at("model.layers.2.self_attn.k_proj.weight").values[5]);
  EXPECT_EQ(matrix_at(w.layers[2].qkv, 96 + 31, 63),
            ref.at("model.layers.2.self_attn.v_proj.weight").values[31 * 64 + 63]);
  EXPECT_EQ(matrix_at(w.layers[4].gate_up, 172 + 3, 7), ref.at("model.layers.4.mlp.up_proj.weight").values[3 * 64 + 7]);
}

TEST(Loader, Stories260KBF16) {
  sm::LoadOptions opt;
  opt.dtype = DType::bf16;
  auto r = sm::load_model(kStories, opt);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const sm::ModelWeights& w = r.value();
  EXPECT_EQ(w.dtype, DType::bf16);
  expect_matrix(w.embed_tokens, DType::bf16, 512, 64);
  expect_matrix(w.layers[0].qkv, DType::bf16, 128, 64);
  expect_matrix(w.layers[0].gate_up, DType::bf16, 344, 64);
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
  // matrices 2 bytes, vectors 4 bytes: 64 * (2 * 5 + 1) norm floats.
  const std::size_t vec = 64 * 11;
  EXPECT_EQ(w.total_bytes(), (260032 - vec) * 2 + vec * 4);
  expect_matches_reference(w, stories_reference());
  // Rounding is to nearest-even, not truncation: some value must differ from truncation.
  const float src = stories_reference().at("model.layers.0.self_attn.q_proj.weight").values[0];
  EXPECT_EQ(matrix_at(w.layers[0].qkv, 0, 0), stored(src, DType::bf16));
}

TEST(Loader, LayerOverride) {
  sm::LoadOptions opt;
  opt.num_layers_override = 2;
  auto r = sm::load_model(kStories, opt);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->layers.size(), 2u);
  EXPECT_EQ(r->config.num_hidden_layers, 2);
  expect_matches_reference(r.value(), stories_reference());
  opt.num_layers_override = 50;  // more than the model has: keep all
  r = sm::load_model(kStories, opt);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->layers.size(), 5u);
}

TEST_F(LoaderTest, ShardedCopyLoadsIdentically) {
  copy_configs(dir_);
  const auto& ref = stories_reference();
  std::vector<std::string> first, second;
  for (const auto& [name, t] : ref) {
    const bool late = name.rfind("model.layers.3.", 0) == 0 || name.rfind("model.layers.4.", 0) == 0 ||
                      name == "model.norm.weight";
    (late ? second : first).push_back(name);
  }
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  write_subset(dir_ / "model-00001-of-00002.safetensors", first, ref);
  write_subset(dir_ / "model-00002-of-00002.safetensors", second, ref);
  nlohmann::json index;
  index["metadata"] = {{"total_size", 260032 * 4}};
  for (const auto& n : first) index["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (const auto& n : second) index["weight_map"][n] = "model-00002-of-00002.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump(2);

  auto sharded = sm::load_model(dir_, {});
  ASSERT_TRUE(sharded.ok()) << sharded.error().to_string();
  auto single = sm::load_model(kStories, {});
  ASSERT_TRUE(single.ok()) << single.error().to_string();
  expect_matches_reference(sharded.value(), ref);
  EXPECT_EQ(sharded->total_bytes(), single->total_bytes());
  const auto same = [](const sm::Matrix& a, const sm::Matrix& b) {
    return a.rows == b.rows && a.cols == b.cols && std::memcmp(a.data, b.data, a.bytes()) == 0;
  };
  EXPECT_TRUE(same(sharded->embed_tokens, single->embed_tokens));
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(same(sharded->layers[i].qkv, single->layers[i].qkv)) << i;
    EXPECT_TRUE(same(sharded->layers[i].gate_up, single->layers[i].gate_up)) << i;
    EXPECT_TRUE(same(sharded->layers[i].down_proj, single->layers[i].down_proj)) << i;
    EXPECT_TRUE(same(sharded->layers[i].o_proj, single->layers[i].o_proj)) << i;
  }

  // A tensor dropped from weight_map: not_found naming the tensor and the index.
  nlohmann::json broken = index;
  broken["weight_map"].erase("model.layers.1.mlp.up_proj.weight");
  std::ofstream(dir_ / "model.safetensors.index.json") << broken.dump(2);
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::not_found,
                         {"model.safetensors.index.json", "'model.layers.1.mlp.up_proj.weight'"}));

  // Corrupt index JSON.
  std::ofstream(dir_ / "model.safetensors.index.json") << "{\"weight_map\": ";
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::corrupt, {"model.safetensors.index.json"}));

  // Missing shard: not_found naming the shard file.
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump(2);
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::not_found,
                         {(dir_ / "model-00002-of-00002.safetensors").string()}));
}

TEST_F(LoaderTest, Bf16SourceFile) {
  copy_configs(dir_);
  const auto& ref = stories_reference();
  std::vector<std::string> names;
  for (const auto& [name, t] : ref) names.push_back(name);
  write_subset(dir_ / "model.safetensors", names, ref, /*as_bf16=*/true);
  auto r = sm::load_model(dir_, {});  // BF16 file -> F32 storage
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const auto& q = ref.at("model.layers.1.self_attn.q_proj.weight").values;
  for (std::size_t i = 0; i < q.size(); ++i) {
    ASSERT_EQ(matrix_at(r->layers[1].qkv, i / 64, i % 64), stored(q[i], DType::bf16)) << i;
  }
  const auto& norm = ref.at("model.layers.1.input_layernorm.weight").values;
  for (std::size_t i = 0; i < norm.size(); ++i) {
    ASSERT_EQ(r->layers[1].input_norm.data[i], stored(norm[i], DType::bf16)) << i;
  }
  sm::LoadOptions opt;
  opt.dtype = DType::bf16;  // BF16 file -> BF16 storage: bit copy
  auto b = sm::load_model(dir_, opt);
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  EXPECT_EQ(matrix_at(b->layers[1].qkv, 3, 9), stored(q[3 * 64 + 9], DType::bf16));
}

TEST_F(LoaderTest, ShapeMismatch) {
  copy_configs(dir_, [](nlohmann::json& c) {
    c["hidden_size"] = 32;
    c["head_dim"] = 4;
  });
  fs::copy_file(kStories / "model.safetensors", dir_ / "model.safetensors");
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::mismatch,
                         {(dir_ / "model.safetensors").string(), "'model.embed_tokens.weight'",
                          "[512, 64]", "expected [512, 32]", "config.json"}));
}

TEST_F(LoaderTest, IntermediateSizeMismatchNamesTensor) {
  copy_configs(dir_, [](nlohmann::json& c) { c["intermediate_size"] = 128; });
  fs::copy_file(kStories / "model.safetensors", dir_ / "model.safetensors");
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::mismatch,
                         {"'model.layers.0.mlp.gate_proj.weight'", "[172, 64]", "expected [128, 64]"}));
}

TEST_F(LoaderTest, MissingTensor) {
  copy_configs(dir_);
  const auto& ref = stories_reference();
  std::vector<std::string> names;
  for (const auto& [name, t] : ref) {
    if (name != "model.layers.3.mlp.up_proj.weight") names.push_back(name);
  }
  write_subset(dir_ / "model.safetensors", names, ref);
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::not_found,
                         {(dir_ / "model.safetensors").string(), "'model.layers.3.mlp.up_proj.weight'"}));
}

TEST_F(LoaderTest, UntiedNeedsLmHead) {
  copy_configs(dir_, [](nlohmann::json& c) { c["tie_word_embeddings"] = false; });
  fs::copy_file(kStories / "model.safetensors", dir_ / "model.safetensors");
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::not_found, {"'lm_head.weight'"}));
}

TEST_F(LoaderTest, MissingFiles) {
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::not_found,
                         {(dir_ / "config.json").string()}));
  copy_configs(dir_);
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::not_found,
                         {(dir_ / "model.safetensors").string()}));
  // Corrupt weights surface the reader's error.
  std::ofstream(dir_ / "model.safetensors", std::ios::binary) << "garbage!garbage!";
  EXPECT_TRUE(fails_with(sm::load_model(dir_, {}), ErrorCode::corrupt, {"model.safetensors"}));
  // f16 is not a storage dtype.
  sm::LoadOptions opt;
  opt.dtype = DType::f16;
  EXPECT_TRUE(fails_with(sm::load_model(kStories, opt), ErrorCode::invalid_argument, {"f32 or bf16"}));
}

// A tiny synthetic Qwen2 / Qwen3 folder exercises bias fusion and q/k norms.
TEST_F(LoaderTest, SyntheticQwenBiasAndQkNorm) {
  for (const char* arch : {"Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    SCOPED_TRACE(arch);
    const bool qwen3 = std::string(arch) == "Qwen3ForCausalLM";
    const fs::path d = dir_ / arch;
    fs::create_directories(d);
    const int H = 16, I = 24, L = 2, NH = 4, KV = 2, HD = 6, V = 32;  // head_dim != H / NH
    nlohmann::json cfg = {{"architectures", {arch}}, {"hidden_size", H}, {"intermediate_size", I},
                          {"num_hidden_layers", L}, {"num_attention_heads", NH},
                          {"num_key_value_heads", KV}, {"head_dim", HD}, {"vocab_size", V},
                          {"tie_word_embeddings", false}, {"eos_token_id", 3}};
    std::ofstream(d / "config.json") << cfg.dump();
    std::map<std::string, RefTensor> ref;
    float counter = 0.0f;
    auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
      RefTensor t;
      t.shape = shape;
      std::int64_t n = 1;
      for (auto s : shape) n *= s;
      for (std::int64_t i = 0; i < n; ++i) t.values.push_back((counter += 0.25f));
      ref[name] = t;
    };
    add("model.embed_tokens.weight", {V, H});
    for (int i = 0; i < L; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      add(p + "input_layernorm.weight", {H});
      add(p + "self_attn.q_proj.weight", {NH * HD, H});
      add(p + "self_attn.k_proj.weight", {KV * HD, H});
      add(p + "self_attn.v_proj.weight", {KV * HD, H});
      if (!qwen3) {
        add(p + "self_attn.q_proj.bias", {NH * HD});
        add(p + "self_attn.k_proj.bias", {KV * HD});
        add(p + "self_attn.v_proj.bias", {KV * HD});
      } else {
        add(p + "self_attn.q_norm.weight", {HD});
        add(p + "self_attn.k_norm.weight", {HD});
      }
      add(p + "self_attn.o_proj.weight", {H, NH * HD});
      add(p + "post_attention_layernorm.weight", {H});
      add(p + "mlp.gate_proj.weight", {I, H});
      add(p + "mlp.up_proj.weight", {I, H});
      add(p + "mlp.down_proj.weight", {H, I});
    }
    add("model.norm.weight", {H});
    add("lm_head.weight", {V, H});
    std::vector<std::string> names;
    for (const auto& [n, t] : ref) names.push_back(n);
    write_subset(d / "model.safetensors", names, ref);

    auto r = sm::load_model(d, {});
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    const sm::ModelWeights& w = r.value();
    expect_matches_reference(w, ref);
    expect_rows_equal(w.lm_head, 0, "lm_head.weight", ref);
    EXPECT_NE(w.lm_head.data, w.embed_tokens.data);
    for (int i = 0; i < L; ++i) {
      const sm::LayerWeights& lw = w.layers[static_cast<std::size_t>(i)];
      const std::string p = "model.layers." + std::to_string(i) + ".self_attn.";
      expect_matrix(lw.qkv, DType::f32, (NH + 2 * KV) * HD, H);
      expect_matrix(lw.o_proj, DType::f32, H, NH * HD);
      if (!qwen3) {
        ASSERT_EQ(lw.qkv_bias.size, (NH + 2 * KV) * HD);
        expect_vector_equal(lw.qkv_bias, 0, p + "q_proj.bias", ref);
        expect_vector_equal(lw.qkv_bias, NH * HD, p + "k_proj.bias", ref);
        expect_vector_equal(lw.qkv_bias, (NH + KV) * HD, p + "v_proj.bias", ref);
        EXPECT_TRUE(lw.q_norm.empty());
      } else {
        EXPECT_TRUE(lw.qkv_bias.empty());
        ASSERT_EQ(lw.q_norm.size, HD);
        ASSERT_EQ(lw.k_norm.size, HD);
        expect_vector_equal(lw.q_norm, 0, p + "q_norm.weight", ref);
        expect_vector_equal(lw.k_norm, 0, p + "k_norm.weight", ref);
      }
    }
    // Dropping a bias / norm tensor is reported by name.
    const std::string dropped = qwen3 ? "model.layers.1.self_attn.k_norm.weight"
                                      : "model.layers.1.self_attn.v_proj.bias";
    names.erase(std::find(names.begin(), names.end(), dropped));
    write_subset(d / "model.safetensors", names, ref);
    EXPECT_TRUE(fails_with(sm::load_model(d, {}), ErrorCode::not_found, {"'" + dropped + "'"}));
  }
}

// ---- dummy weights ----------------------------------------------------------


/// FNV-1a over a strided sample of the bytes plus the first and last 4 KiB.
std::uint64_t fingerprint(const sm::Matrix& m) {
  const auto* p = static_cast<const unsigned char*>(m.data);
  const std::size_t n = m.bytes();
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::size_t i) { h = (h ^ p[i]) * 1099511628211ull; };
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 4096); ++i) mix(i);
  for (std::size_t i = n > 4096 ? n - 4096 : 0; i < n; ++i) mix(i);
  for (std::size_t i = 0; i < n; i += 997) mix(i);
  return h;
}

std::vector<std::uint64_t> fingerprints(const sm::ModelWeights& w) {
  std::vector<std::uint64_t> out = {fingerprint(w.embed_tokens), fingerprint(w.lm_head)};
  for (const auto& L : w.layers) {
    for (const sm::Matrix* m : {&L.qkv, &L.o_proj, &L.gate_up, &L.down_proj}) out.push_back(fingerprint(*m));
  }
  return out;
}

/// Every sampled element within [-a, a], a = 1/sqrt(cols), and not all equal.
void expect_uniform_range(const sm::Matrix& m) {
  const float a = 1.0f / std::sqrt(static_cast<float>(m.cols));
  const std::size_t n = static_cast<std::size_t>(m.rows) * m.cols;
  double sum = 0.0, sumsq = 0.0;
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; i += 101) {
    const float v = matrix_at(m, i / m.cols, i % m.cols);
    ASSERT_LE(std::fabs(v), a * 1.004f) << i;  // bf16 rounding slack
    sum += v;
    sumsq += static_cast<double>(v) * v;
    ++count;
  }
  const double mean = sum / count, var = sumsq / count - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.05 * a);
  EXPECT_NEAR(var, a * a / 3.0, 0.05 * a * a / 3.0);  // uniform variance a^2/3
}


TEST(DummyWeights, Qwen3_0_6bOneLayer) {
  sm::LoadOptions opt;
  opt.format = sm::LoadFormat::dummy;
  opt.dtype = DType::bf16;
  opt.seed = 7;
  opt.num_layers_override = 1;
  auto r = sm::load_model(kShapes / "qwen3-0.6b", opt);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const sm::ModelWeights& w = r.value();
  EXPECT_EQ(w.config.num_hidden_layers, 1);
  ASSERT_EQ(w.layers.size(), 1u);
  expect_matrix(w.embed_tokens, DType::bf16, 151936, 1024);
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);  // tied
  const sm::LayerWeights& L = w.layers[0];
  expect_matrix(L.qkv, DType::bf16, (16 + 2 * 8) * 128, 1024);
  expect_matrix(L.o_proj, DType::bf16, 1024, 16 * 128);
  expect_matrix(L.gate_up, DType::bf16, 2 * 3072, 1024);
  expect_matrix(L.down_proj, DType::bf16, 1024, 3072);
  ASSERT_EQ(L.q_norm.size, 128);
  ASSERT_EQ(L.k_norm.size, 128);
  EXPECT_TRUE(L.qkv_bias.empty());
  for (int i = 0; i < 128; ++i) ASSERT_EQ(L.q_norm.data[i], 1.0f);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(L.input_norm.data[i], 1.0f);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(w.final_norm.data[i], 1.0f);
  expect_uniform_range(L.qkv);
  expect_uniform_range(L.down_proj);
  expect_uniform_range(w.embed_tokens);

  auto again = sm::load_model(kShapes / "qwen3-0.6b", opt);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::memcmp(L.qkv.data, again->layers[0].qkv.data, L.qkv.bytes()), 0);
  EXPECT_EQ(std::memcmp(L.gate_up.data, again->layers[0].gate_up.data, L.gate_up.bytes()), 0);
  EXPECT_EQ(std::memcmp(w.embed_tokens.data, again->embed_tokens.data, w.embed_tokens.bytes()), 0);
  opt.seed = 8;
  auto other = sm::load_model(kShapes / "qwen3-0.6b", opt);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(std::memcmp(L.qkv.data, other->layers[0].qkv.data, L.qkv.bytes()), 0);
  EXPECT_NE(fingerprints(w), fingerprints(other.value()));
}

TEST(DummyWeights, Llama31_8bOneLayerDeterministic) {
  sm::LoadOptions opt;
  opt.format = sm::LoadFormat::dummy;
  opt.dtype = DType::bf16;
  opt.seed = 1234;
  opt.num_layers_override = 1;
  std::vector<std::uint64_t> first;
  {
    auto r = sm::load_model(kShapes / "llama-3.1-8b", opt);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    const sm::ModelWeights& w = r.value();
    ASSERT_EQ(w.layers.size(), 1u);
    expect_matrix(w.embed_tokens, DType::bf16, 128256, 4096);
    expect_matrix(w.lm_head, DType::bf16, 128256, 4096);
    EXPECT_NE(w.lm_head.data, w.embed_tokens.data);  // untied
    expect_matrix(w.layers[0].qkv, DType::bf16, (32 + 2 * 8) * 128, 4096);
    expect_matrix(w.layers[0].o_proj, DType::bf16, 4096, 4096);
    expect_matrix(w.layers[0].gate_up, DType::bf16, 2 * 14336, 4096);
    expect_matrix(w.layers[0].down_proj, DType::bf16, 4096, 14336);
    EXPECT_TRUE(w.layers[0].q_norm.empty());
    EXPECT_TRUE(w.layers[0].qkv_bias.empty());
    ASSERT_TRUE(w.config.rope_scaling.has_value());
    expect_uniform_range(w.layers[0].down_proj);
    // lm_head and embed_tokens have the same shape but different streams.
    EXPECT_NE(fingerprint(w.lm_head), fingerprint(w.embed_tokens));
    const std::size_t expect_bytes =
        2ull * (2ull * 128256 * 4096 + 6144ull * 4096 + 4096ull * 4096 + 3ull * 14336 * 4096) +
        4ull * (3 * 4096);
    EXPECT_EQ(w.total_bytes(), expect_bytes);
    first = fingerprints(w);
  }
  auto r = sm::load_model(kShapes / "llama-3.1-8b", opt);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(fingerprints(r.value()), first);
}

TEST(DummyWeights, Stories110mLayerStability) {
  auto cfg = sm::load_model_config(kShapes / "stories110m");
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  sm::LoadOptions opt;
  opt.format = sm::LoadFormat::dummy;
  opt.seed = 42;
  auto full = sm::make_dummy_weights(cfg.value(), opt);
  ASSERT_TRUE(full.ok()) << full.error().to_string();
  EXPECT_EQ(full->total_bytes(), static_cast<std::size_t>(cfg->num_parameters()) * 4);
  ASSERT_EQ(full->layers.size(), 12u);
  expect_uniform_range(full->layers[11].gate_up);

  // num_layers_override keeps exactly the first layers' values.
  opt.num_layers_override = 2;
  auto two = sm::make_dummy_weights(cfg.value(), opt);
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->layers.size(), 2u);
  EXPECT_EQ(std::memcmp(two->layers[1].qkv.data, full->layers[1].qkv.data, two->layers[1].qkv.bytes()), 0);
  // Different layers differ.
  EXPECT_NE(std::memcmp(full->layers[0].qkv.data, full->layers[1].qkv.data, full->layers[0].qkv.bytes()), 0);

  // bf16 storage is the rounded f32 stream.
  opt.dtype = DType::bf16;
  auto b = sm::make_dummy_weights(cfg.value(), opt);
  ASSERT_TRUE(b.ok());
  for (std::size_t i = 0; i < 5000; ++i) {
    ASSERT_EQ(matrix_at(b->layers[0].gate_up, i / 768, i % 768),
              stored(matrix_at(full->layers[0].gate_up, i / 768, i % 768), DType::bf16));
  }
}

TEST(DummyWeights, QwenBiasAndInvalidDtype) {
  auto cfg = sm::load_model_config(kShapes / "qwen3-0.6b");
  ASSERT_TRUE(cfg.ok());
  sm::ModelConfig c = cfg.value();
  c.vocab_size = 1000;  // keep it small
  c.qkv_bias = true;
  sm::LoadOptions opt;
  opt.num_layers_override = 1;
  auto w = sm::make_dummy_weights(c, opt);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  ASSERT_EQ(w->layers[0].qkv_bias.size, c.qkv_rows());
  for (int i = 0; i < c.qkv_rows(); ++i) ASSERT_LE(std::fabs(w->layers[0].qkv_bias.data[i]), 0.05f);
  opt.dtype = DType::f16;
  EXPECT_FALSE(sm::make_dummy_weights(c, opt).ok());
}

}  // namespace model_loader_test
