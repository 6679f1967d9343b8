// model/gguf: the GGUF reader on files written here (tests/model/gguf_writer.hpp)
// and every way of breaking them: bad magic or version, truncation at every
// byte, lengths and counts past the end, a tensor past the end, misaligned or
// overlapping data, unknown value or tensor types, duplicate keys; a fuzz run
// of random byte flips (every open returns a value or an error, never
// crashes). Then a llama GGUF of F32 weights: the hyper-parameters from the
// {arch}.* keys, the q/k row permutation undone, and clear errors for a
// missing key, an unknown architecture and a tensor whose shape disagrees.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include "model/config.hpp"
#include "model/tokenizer_loader.hpp"
#include "model/gguf/gguf_file.hpp"
#include "model/gguf/gguf_model.hpp"
#include "text/tokenizer.hpp"
#include "model/weights.hpp"
#include "model/shard_runner.hpp"
#include "kernels/cpu/ops.hpp"
#include "tests/model/gguf_writer.hpp"
#include "tests/support/process.hpp"

namespace shardline::model::gguf {
namespace model_gguf_test {

using testing_support::GgufWriter;

class GgufTest : public testing_support::TempDirTest {
 protected:
  /// A small valid file: one of each value type, nested arrays, two tensors.
  static GgufWriter sample() {
    GgufWriter w;
    w.put_str("general.architecture", "llama");
    w.put_u32("general.alignment", 32);
    w.put_i32("an.i32", -7);
    w.put_f32("a.float", 0.5f);
    w.put_bool("a.bool", true);
    w.put_u64("a.u64", 1ull << 40);
    w.put_str_array("some.strings", {"a", "", "\xE2\x96\x81hi"});
    w.put_i32_array("some.ints", {3, 1, 4});
    // An array of two arrays of u8.
    std::string nested = GgufWriter::bytes_of(std::uint32_t{9}) + GgufWriter::bytes_of(std::uint64_t{2});
    for (int a = 0; a < 2; ++a)
      nested += GgufWriter::bytes_of(std::uint32_t{0}) + GgufWriter::bytes_of(std::uint64_t{2}) + std::string(1, char(a)) +
                std::string(1, char(a + 1));
    w.put_raw("nested", 9, nested);
    w.add_f32("first", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
    std::string q8(34, '\0');  // one Q8_0 block: d = 1.0 (0x3C00), qs = 0..31
    q8[0] = 0x00;
    q8[1] = 0x3C;
    for (int i = 0; i < 32; ++i) q8[2 + i] = static_cast<char>(i);
    w.add_tensor("second", {32}, 8, q8);
    return w;
  }
  Result<GgufFile> open_bytes(const std::string& bytes, const std::string& name = "f.gguf") {
    std::ofstream(path(name), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return GgufFile::open(path(name));
  }
  void expect_error(const std::string& bytes, ErrorCode code, const std::string& needle) {
    auto f = open_bytes(bytes);
    ASSERT_FALSE(f.ok()) << "opened a broken file; expected: " << needle;
    EXPECT_EQ(f.error().code, code) << f.error().to_string();
    EXPECT_NE(f.error().message.find(needle), std::string::npos) << f.error().to_string();
    EXPECT_NE(f.error().message.find("f.gguf"), std::string::npos) << "the file is named: " << f.error().to_string();
  }
};

TEST_F(GgufTest, ReadsEveryValueTypeAndTheTensors) {
  auto f = open_bytes(sample().bytes());
  ASSERT_TRUE(f.ok()) << f.error().to_string();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(**f->get_string("general.architecture"), "llama");
  EXPECT_EQ(**f->get_int("an.i32"), -7);
  EXPECT_EQ(**f->get_float("a.float"), 0.5);
  EXPECT_EQ(**f->get_bool("a.bool"), true);
  EXPECT_EQ(**f->get_int("a.u64"), 1ll << 40);
  EXPECT_EQ(**f->get_string_array("some.strings"), (std::vector<std::string>{"a", "", "\xE2\x96\x81hi"}));
  const Value* nested = f->find("nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->elements.size(), 2u);
  EXPECT_EQ(nested->elements[1].elements[1].int_value, 2);
  EXPECT_FALSE(f->get_int("missing").value().has_value());
  auto wrong = f->get_string("an.i32");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::mismatch);
  EXPECT_NE(wrong.error().message.find("an.i32"), std::string::npos);
  const TensorInfo* first = f->find_tensor("first");
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->dims, (std::vector<std::int64_t>{4, 2}));
  EXPECT_EQ(first->bytes, 32u);
  float v[8];
  std::memcpy(v, first->data, 32);
  EXPECT_EQ(v[5], 6.0f);
  const TensorInfo* second = f->find_tensor("second");
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->bytes, 34u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(second->data) % 32, 0u);
  GgufWriter v2 = sample();
  v2.version = 2;
  EXPECT_TRUE(open_bytes(v2.bytes()).ok()) << "version 2 is read too";
}

TEST_F(GgufTest, BadHeadersAreRefusedByName) {
  std::string b = sample().bytes();
  b[0] = 'X';
  expect_error(b, ErrorCode::corrupt, "bad magic");
  for (const std::uint32_t version : {1u, 4u}) {
    GgufWriter w = sample();
    w.version = version;
    expect_error(w.bytes(), ErrorCode::unsupported, "GGUF version " + std::to_string(version));
  }
  expect_error("GGUF", ErrorCode::corrupt, "truncated");
  auto missing = GgufFile::open(path("nope.gguf"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
}

TEST_F(GgufTest, TruncationAtEveryByteIsACleanError) {
  const std::string whole = sample().bytes();
  for (std::size_t n = 0; n < whole.size(); ++n) {
    auto f = open_bytes(whole.substr(0, n));
    // The last tensor's padding is not data: a file cut inside it still has
    // every byte the tensors need.
    if (f.ok()) {
      EXPECT_GE(n, whole.size() - 32 + 2) << "a file cut at byte " << n << " opened";
      continue;
    }
    EXPECT_TRUE(f.error().code == ErrorCode::corrupt) << n << ": " << f.error().to_string();
  }
}

TEST_F(GgufTest, LengthsCountsAndOffsetsAreChecked) {
  {  // a string length past the end
    GgufWriter w;
    w.put_raw("k", 8, GgufWriter::bytes_of(std::uint64_t{1} << 50) + "abc");
    expect_error(w.bytes(), ErrorCode::corrupt, "key 'k': string length");
  }
  {  // an array count past the end
    GgufWriter w;
    w.put_raw("arr", 9, GgufWriter::bytes_of(std::uint32_t{4}) + GgufWriter::bytes_of(std::uint64_t{1} << 40));
    expect_error(w.bytes(), ErrorCode::corrupt, "key 'arr': array of 1099511627776");
  }
  {  // an unknown value type
    GgufWriter w;
    w.put_raw("odd", 13, "");
    expect_error(w.bytes(), ErrorCode::corrupt, "key 'odd': unknown value type 13");
  }
  {  // arrays nested too deep
    std::string v;
    for (int d = 0; d < 8; ++d) v += GgufWriter::bytes_of(std::uint32_t{9}) + GgufWriter::bytes_of(std::uint64_t{1});
    GgufWriter w;
    w.put_raw("deep", 9, v + GgufWriter::bytes_of(std::uint32_t{0}) + GgufWriter::bytes_of(std::uint64_t{0}));
    expect_error(w.bytes(), ErrorCode::corrupt, "key 'deep': arrays nested deeper");
  }
  {  // a bool that is not 0 or 1
    GgufWriter w;
    w.put_raw("b", 7, std::string(1, '\x02'));
    expect_error(w.bytes(), ErrorCode::corrupt, "key 'b': bool value 2");
  }
  {  // a duplicate key
    GgufWriter w = sample();
    w.put_i32("an.i32", 1);
    expect_error(w.bytes(), ErrorCode::corrupt, "key 'an.i32' appears twice");
  }
  {  // a tensor count larger than the file
    std::string b = sample().bytes();
    const std::uint64_t lie = 1ull << 40;
    std::memcpy(b.data() + 8, &lie, 8);
    expect_error(b, ErrorCode::corrupt, "tensor_count");
  }
  // A misaligned tensor, a tensor past the end, overlapping tensors.
  expect_error(sample().bytes(1, 4), ErrorCode::corrupt, "tensor 'second': offset 36 is not a multiple of the alignment 32");
  expect_error(sample().bytes(1, 1 << 20), ErrorCode::corrupt, "tensor 'second': data");
  expect_error(sample().bytes(1, -32), ErrorCode::corrupt, "overlaps");
  {  // an unknown tensor type (17 = IQ2_XS, not supported), dims 0 and 5
    GgufWriter w;
    w.add_tensor("iq", {256}, 17, std::string(74, '\0'));
    expect_error(w.bytes(), ErrorCode::unsupported, "tensor 'iq': GGML type 17");
    GgufWriter z;
    z.add_f32("zero", {0}, {});
    expect_error(z.bytes(), ErrorCode::corrupt, "tensor 'zero': dim 0 = 0");
    GgufWriter five;
    five.add_f32("five", {1, 1, 1, 1, 1}, {1});
    expect_error(five.bytes(), ErrorCode::corrupt, "tensor 'five': 5 dims");
    GgufWriter partial;
    partial.add_tensor("part", {33}, 8, std::string(68, '\0'));
    expect_error(partial.bytes(), ErrorCode::corrupt, "tensor 'part': dim 0 = 33 is not a multiple of Q8_0");
  }
  {  // an alignment that is not a power of two
    GgufWriter bad;
    bad.put_u32("general.alignment", 24);
    expect_error(bad.bytes(), ErrorCode::corrupt, "general.alignment");
  }
}

TEST_F(GgufTest, FuzzedFilesNeverCrash) {
  const std::string whole = sample().bytes();
  std::mt19937 rng(7);
  int opened = 0, refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string b = whole;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    if (iter % 5 == 0) b.resize(rng() % b.size());
    auto f = open_bytes(b);
    if (!f.ok()) {
      ++refused;
      EXPECT_FALSE(f.error().message.empty());
      continue;
    }
    ++opened;
    for (const TensorInfo& t : f->tensors()) {  // every tensor's bytes are readable
      volatile std::byte sink{};
      for (std::size_t i = 0; i < t.bytes; ++i) sink = t.data[i];
      (void)sink;
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(opened, 10) << "flips in data bytes leave a valid file";
}

/// A 2-layer llama GGUF with F32 weights whose values encode their position.
GgufWriter tiny_llama(int hidden = 64, int heads = 4, int kv_heads = 2, int ffn = 96, int vocab = 40) {
  GgufWriter w;
  w.put_str("general.architecture", "llama");
  w.put_u32("llama.block_count", 2);
  w.put_u32("llama.embedding_length", static_cast<std::uint32_t>(hidden));
  w.put_u32("llama.feed_forward_length", static_cast<std::uint32_t>(ffn));
  w.put_u32("llama.attention.head_count", static_cast<std::uint32_t>(heads));
  w.put_u32("llama.attention.head_count_kv", static_cast<std::uint32_t>(kv_heads));
  w.put_u32("llama.context_length", 256);
  w.put_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.put_f32("llama.rope.freq_base", 50000.0f);
  w.put_u32("llama.vocab_size", static_cast<std::uint32_t>(vocab));
  w.put_u32("tokenizer.ggml.bos_token_id", 1);
  w.put_u32("tokenizer.ggml.eos_token_id", 2);
  const int d = hidden / heads;
  auto matrix = [&](const std::string& name, int rows, int cols) {
    std::vector<float> v(static_cast<std::size_t>(rows) * cols);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) v[static_cast<std::size_t>(r) * cols + c] = static_cast<float>(r) + c * 1e-3f;
    w.add_f32(name, {static_cast<std::uint64_t>(cols), static_cast<std::uint64_t>(rows)}, v);
  };
  auto vec = [&](const std::string& name, int n) { w.add_f32(name, {static_cast<std::uint64_t>(n)}, std::vector<float>(n, 1.0f)); };
  matrix("token_embd.weight", vocab, hidden);
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    vec(b + "attn_norm.weight", hidden);
    matrix(b + "attn_q.weight", heads * d, hidden);
    matrix(b + "attn_k.weight", kv_heads * d, hidden);
    matrix(b + "attn_v.weight", kv_heads * d, hidden);
    matrix(b + "attn_output.weight", hidden, heads * d);
    vec(b + "ffn_norm.weight", hidden);
    matrix(b + "ffn_gate.weight", ffn, hidden);
    matrix(b + "ffn_up.weight", ffn, hidden);
    matrix(b + "ffn_down.weight", hidden, ffn);
  }
  vec("output_norm.weight", hidden);
  return w;
}

TEST_F(GgufTest, LlamaHyperParametersAndWeights) {
  tiny_llama().write(path("tiny.gguf"));
  auto cfg = load_model_config(path("tiny.gguf"));
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  EXPECT_EQ(cfg->arch, Architecture::llama);
  EXPECT_EQ(cfg->hidden_size, 64);
  EXPECT_EQ(cfg->num_key_value_heads, 2);
  EXPECT_EQ(cfg->head_dim, 16);
  EXPECT_EQ(cfg->rope_theta, 50000.0f);
  EXPECT_TRUE(cfg->tie_word_embeddings) << "no output.weight: tied";
  EXPECT_EQ(cfg->eos_token_ids, (std::vector<int>{2}));
  // The folder holding only the GGUF is the same model.
  auto by_dir = load_model_config(dir_);
  ASSERT_TRUE(by_dir.ok()) << by_dir.error().to_string();
  LoadOptions lo;
  auto w = load_model(path("tiny.gguf"), lo);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  // q rows come back un-permuted: HF row (h, j, i) is GGUF row (h, 2i + j).
  const auto* qkv = static_cast<const float*>(w->layers[0].qkv.data);
  const int cols = 64, d = 16;
  for (int h = 0; h < 4; ++h)
    for (int r = 0; r < d; ++r) {
      const int j = r / (d / 2), i = r % (d / 2);
      EXPECT_EQ(qkv[static_cast<std::size_t>(h * d + r) * cols], static_cast<float>(h * d + 2 * i + j)) << h << " " << r;
    }
  // k (2 heads) likewise, after q's 64 rows; v is not permuted.
  EXPECT_EQ(qkv[static_cast<std::size_t>(64 + 1) * cols], 2.0f);
  EXPECT_EQ(qkv[static_cast<std::size_t>(64 + 32 + 1) * cols], 1.0f);
  EXPECT_EQ(w->lm_head.data, w->embed_tokens.data);
  LoadOptions bf;
  bf.dtype = DType::bf16;
  auto wb = load_model(path("tiny.gguf"), bf);
  ASSERT_TRUE(wb.ok()) << wb.error().to_string();
  EXPECT_EQ(wb->layers[1].gate_up.dtype, DType::bf16);
}

TEST_F(GgufTest, ModelErrorsNameTheKeyOrTensor) {
  {
    GgufWriter w = tiny_llama();
    w.put_str("general.architecture", "mamba");  // a second key: refused as a duplicate first
    w.write(path("dup.gguf"));
    auto c = load_model_config(path("dup.gguf"));
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.error().message.find("appears twice"), std::string::npos) << c.error().to_string();
  }
  {
    GgufWriter w;
    w.put_str("general.architecture", "mamba");
    w.write(path("mamba.gguf"));
    auto c = load_model_config(path("mamba.gguf"));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code, ErrorCode::unsupported);
    EXPECT_NE(c.error().message.find("general.architecture"), std::string::npos) << c.error().to_string();
    EXPECT_NE(c.error().message.find("mamba"), std::string::npos) << c.error().to_string();
  }
  {
    GgufWriter w;
    w.put_str("general.architecture", "qwen2");
    w.put_u32("qwen2.block_count", 2);
    w.write(path("short.gguf"));
    auto c = load_model_config(path("short.gguf"));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code, ErrorCode::not_found);
    EXPECT_NE(c.error().message.find("qwen2.embedding_length"), std::string::npos) << c.error().to_string();
  }
  {  // heads not dividing into KV heads: the GGUF key is named
    tiny_llama(64, 4, 3).write(path("heads.gguf"));
    auto c = load_model_config(path("heads.gguf"));
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.error().message.find("llama.attention.head_count"), std::string::npos) << c.error().to_string();
  }
  {  // a tensor shape that disagrees with the hyper-parameters (ffn 96 in the keys, 80 in the tensors)
    std::string b = tiny_llama(64, 4, 2, 80).bytes();
    const std::string key = GgufWriter::str("llama.feed_forward_length") + GgufWriter::bytes_of(std::uint32_t{4});
    const auto at = b.find(key);
    ASSERT_NE(at, std::string::npos);
    const std::uint32_t ffn = 96;
    std::memcpy(b.data() + at + key.size(), &ffn, 4);
    std::ofstream(path("shape.gguf"), std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
    auto m = load_model(path("shape.gguf"), LoadOptions{});
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.error().code, ErrorCode::mismatch);
    EXPECT_NE(m.error().message.find("tensor 'blk.0.ffn_gate.weight': shape [80, 64]"), std::string::npos)
        << m.error().to_string();
  }
  {  // two GGUF files in one folder
    std::filesystem::create_directories(path("two"));
    tiny_llama().write(path("two/a.gguf"));
    tiny_llama().write(path("two/b.gguf"));
    auto c = load_model_config(path("two"));
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.error().message.find("a.gguf, b.gguf"), std::string::npos) << c.error().to_string();
  }
}

TEST_F(GgufTest, TokenizerMetadataErrors) {
  GgufWriter w = tiny_llama();
  w.put_str("tokenizer.ggml.model", "gpt2");
  w.put_str("tokenizer.ggml.pre", "no-such-pre");
  w.put_str_array("tokenizer.ggml.tokens", {"a", "b"});
  w.put_str_array("tokenizer.ggml.merges", {"a b"});
  w.write(path("pre.gguf"));
  auto t = model::load_tokenizer(path("pre.gguf"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, ErrorCode::unsupported);
  EXPECT_NE(t.error().message.find("tokenizer.ggml.pre"), std::string::npos) << t.error().to_string();
  EXPECT_NE(t.error().message.find("no-such-pre"), std::string::npos) << t.error().to_string();
  EXPECT_TRUE(pre_tokenizer_regexes("smollm").has_value());
  EXPECT_EQ(pre_tokenizer_regexes("smollm")->size(), 2u);
  EXPECT_FALSE(pre_tokenizer_regexes("no-such-pre").has_value());
}

// RoPE scaling as llama.cpp stores it: rope_freqs.weight, or linear.
TEST_F(GgufTest, RopeScalingFromRopeFreqsOrLinear) {
  {
    GgufWriter w = tiny_llama();  // head_dim 16: 8 frequencies
    w.add_f32("rope_freqs.weight", {8}, {1, 1, 1, 1.5f, 2.5f, 8, 8, 8});
    w.write(path("freqs.gguf"));
    auto c = load_model_config(path("freqs.gguf"));
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    EXPECT_EQ(c->rope_freq_factors, (std::vector<float>{1, 1, 1, 1.5f, 2.5f, 8, 8, 8}));
    EXPECT_FALSE(c->rope_scaling.has_value());
    kernels::cpu::RopeParams plain;
    plain.head_dim = 16;
    plain.theta = c->rope_theta;
    const auto base = kernels::cpu::rope_inv_freq(plain);
    const auto scaled = kernels::cpu::rope_inv_freq(rope_params_for(*c));
    ASSERT_EQ(scaled.size(), 8u);
    for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(scaled[i], base[i] / c->rope_freq_factors[i]) << i;
  }
  {
    GgufWriter w = tiny_llama();
    w.put_str("llama.rope.scaling.type", "linear");
    w.put_f32("llama.rope.scaling.factor", 4.0f);
    w.write(path("linear.gguf"));
    auto c = load_model_config(path("linear.gguf"));
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    EXPECT_EQ(c->rope_freq_factors, std::vector<float>(8, 4.0f));
  }
  struct Bad {
    const char* name;
    std::function<void(GgufWriter&)> edit;
    ErrorCode code;
    const char* needle;
  };
  const std::vector<Bad> bad = {
      {"yarn", [](GgufWriter& w) { w.put_str("llama.rope.scaling.type", "yarn"); }, ErrorCode::unsupported,
       "'yarn'"},
      {"linear without factor", [](GgufWriter& w) { w.put_str("llama.rope.scaling.type", "linear"); },
       ErrorCode::invalid_argument, "llama.rope.scaling.factor"},
      {"short rope_freqs", [](GgufWriter& w) { w.add_f32("rope_freqs.weight", {4}, {1, 1, 1, 1}); },
       ErrorCode::mismatch, "head_dim / 2 = 8"},
      {"zero factor", [](GgufWriter& w) { w.add_f32("rope_freqs.weight", {8}, {1, 1, 1, 0, 1, 1, 1, 1}); },
       ErrorCode::mismatch, "not a positive factor"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    GgufWriter w = tiny_llama();
    b.edit(w);
    w.write(path("bad-rope.gguf"));
    auto c = load_model_config(path("bad-rope.gguf"));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code, b.code) << c.error().to_string();
    EXPECT_NE(c.error().message.find(b.needle), std::string::npos) << c.error().to_string();
  }
}

// A `llama` (SentencePiece-style) vocabulary: no merges, scores rank them.
// Hand-worked: "ab" (-1) > "▁a" (-2) > "▁ab" (-3: "▁a"+"b" before
// "▁"+"ab", the longer left first) > "ba" (-4).
GgufWriter tiny_spm() {
  GgufWriter w = tiny_llama(64, 4, 2, 96, 11);
  w.put_str("tokenizer.ggml.model", "llama");
  w.put_str_array("tokenizer.ggml.tokens",
                  {"<unk>", "<s>", "</s>", "<0x21>", "▁", "a", "b", "ab", "▁a", "▁ab", "ba"});
  w.put_f32_array("tokenizer.ggml.scores", {0, 0, 0, 0, -100, -101, -102, -1, -2, -3, -4});
  w.put_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1});
  w.put_u32("tokenizer.ggml.unknown_token_id", 0);  // BOS 1, EOS 2 from tiny_llama
  w.put_bool("tokenizer.ggml.add_bos_token", true);
  return w;
}

TEST_F(GgufTest, LlamaVocabularyMergesFromScores) {
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<0x21>", "▁", "a",
                                           "b",     "ab",  "▁a", "▁ab", "ba"};
  const auto merges = merges_from_scores(tokens, {0, 0, 0, 0, -100, -101, -102, -1, -2, -3, -4});
  const std::vector<std::pair<std::string, std::string>> want = {
      {"a", "b"}, {"▁", "a"}, {"▁a", "b"}, {"▁", "ab"}, {"b", "a"}};
  EXPECT_EQ(merges, want);

  tiny_spm().write(path("spm.gguf"));
  auto t = model::load_tokenizer(path("spm.gguf"));
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  const auto& tok = **t;
  EXPECT_EQ(tok.encode("ab", false), (std::vector<std::int32_t>{9}));
  EXPECT_EQ(tok.encode("ab", true), (std::vector<std::int32_t>{1, 9}));
  // "▁bab!": a+b first, then no merge joins b and ab; '!' by its byte token.
  EXPECT_EQ(tok.encode("bab!", false), (std::vector<std::int32_t>{4, 6, 7, 3}));
  // The space prefix goes before text that starts with a space too (llama.cpp).
  EXPECT_EQ(tok.encode(" ab", false), (std::vector<std::int32_t>{4, 9}));
  // ... and after a special token; 'c' has no byte token: unk.
  EXPECT_EQ(tok.encode("<s>ab", false), (std::vector<std::int32_t>{1, 9}));
  EXPECT_EQ(tok.encode("c", false), (std::vector<std::int32_t>{4, 0}));
  EXPECT_EQ(tok.decode(std::vector<std::int32_t>{4, 9}, false), " ab");
  EXPECT_EQ(tok.decode(std::vector<std::int32_t>{1, 9, 3, 2}, true), "ab!");
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(9));
  EXPECT_EQ(tok.bos_token_id(), 1);
  EXPECT_EQ(tok.eos_token_id(), 2);

  // add_space_prefix = false: no U+2581 before the text, none stripped.
  GgufWriter np = tiny_spm();
  np.put_bool("tokenizer.ggml.add_space_prefix", false);
  np.write(path("spm-np.gguf"));
  auto t2 = model::load_tokenizer(path("spm-np.gguf"));
  ASSERT_TRUE(t2.ok()) << t2.error().to_string();
  EXPECT_EQ((*t2)->encode("ab", false), (std::vector<std::int32_t>{7}));
  EXPECT_EQ((*t2)->decode(std::vector<std::int32_t>{4, 7}, false), " ab");
}

TEST_F(GgufTest, LlamaVocabularyErrorsNameTheKey) {
  struct Case {
    const char* name;
    std::function<void(GgufWriter&)> edit;
    ErrorCode code;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"no scores", [](GgufWriter& w) { w.remove("tokenizer.ggml.scores"); }, ErrorCode::not_found,
       "tokenizer.ggml.scores"},
      {"short scores", [](GgufWriter& w) {
         w.remove("tokenizer.ggml.scores");
         w.put_f32_array("tokenizer.ggml.scores", {0, 0});
       }, ErrorCode::mismatch,
       "has 2 entries for 11 tokens"},
      {"scores of strings", [](GgufWriter& w) {
         w.remove("tokenizer.ggml.scores");
         w.put_str_array("tokenizer.ggml.scores", {"x"});
       },
       ErrorCode::mismatch, "not an array of floats"},
      {"bad unk", [](GgufWriter& w) {
         w.remove("tokenizer.ggml.unknown_token_id");
         w.put_u32("tokenizer.ggml.unknown_token_id", 99);
       }, ErrorCode::corrupt,
       "tokenizer.ggml.unknown_token_id"},
      {"bad merge", [](GgufWriter& w) { w.put_str_array("tokenizer.ggml.merges", {"ab"}); }, ErrorCode::corrupt,
       "tokenizer.ggml.merges"},
      {"unknown model", [](GgufWriter& w) {
         w.remove("tokenizer.ggml.model");
         w.put_str("tokenizer.ggml.model", "bert");
       }, ErrorCode::unsupported,
       "'bert'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    GgufWriter w = tiny_spm();
    c.edit(w);
    w.write(path("bad-spm.gguf"));
    auto t = model::load_tokenizer(path("bad-spm.gguf"));
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, c.code) << t.error().to_string();
    EXPECT_NE(t.error().message.find(c.needle), std::string::npos) << t.error().to_string();
  }
}

}  // namespace
}  // namespace shardline::model::gguf
