// model::model_fingerprint (issue 46, item 10): the same model anywhere has
// one fingerprint; a changed config, tokenizer or weights (header or a
// sampled block) gives another; files that are not the model do not count.

#include "model/model_fingerprint.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/process.hpp"

namespace shardline::model {
namespace model_model_fingerprint_test {

namespace fs = std::filesystem;

class ModelFingerprint : public testing_support::TempDirTest {
 protected:
  /// A model folder: config, tokenizer and a 3 MiB weight file.
  void make_model(const std::string& name) {
    fs::create_directories(path(name));
    std::ofstream(path(name + "/config.json")) << R"({"model_type": "llama", "hidden_size": 64})";
    std::ofstream(path(name + "/tokenizer.json")) << R"({"model": {"type": "BPE"}})";
    std::string weights(3 << 20, '\0');
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<char>(i * 131 % 251);
    std::ofstream(path(name + "/model.safetensors"), std::ios::binary) << weights;
  }
  std::string fingerprint(const std::string& name) {
    auto f = model_fingerprint(path(name));
    EXPECT_TRUE(f.ok()) << f.error().to_string();
    return f.ok() ? *f : std::string();
  }
  void poke(const std::string& file, std::size_t offset) {
    std::fstream f(path(file), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put('\x7f');
  }
};

TEST_F(ModelFingerprint, SameModelAnywhereSameFingerprint) {
  make_model("a");
  make_model("b");
  const std::string a = fingerprint("a");
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(fingerprint("b"), a);
  std::ofstream(path("b/README.md")) << "not the model";
  EXPECT_EQ(fingerprint("b"), a);
}

TEST_F(ModelFingerprint, ChangedConfigTokenizerOrWeightsChangeIt) {
  make_model("ref");
  const std::string ref = fingerprint("ref");
  const std::vector<std::pair<std::string, std::size_t>> edits = {
      {"config.json", 3}, {"tokenizer.json", 5}, {"model.safetensors", 100},  // header region
      {"model.safetensors", (3u << 20) - 1},                                   // the last sampled block
      {"model.safetensors", (1u << 20) + 10}};                                 // the first sampled block
  for (std::size_t i = 0; i < edits.size(); ++i) {
    const std::string name = "m" + std::to_string(i);
    make_model(name);
    poke(name + "/" + edits[i].first, edits[i].second);
    EXPECT_NE(fingerprint(name), ref) << edits[i].first << " @ " << edits[i].second;
  }
  make_model("renamed");
  fs::rename(path("renamed/model.safetensors"), path("renamed/model-00001.safetensors"));
  EXPECT_NE(fingerprint("renamed"), ref);
}

TEST_F(ModelFingerprint, AGgufFileAndAMissingModel) {
  std::ofstream(path("m.gguf"), std::ios::binary) << "GGUF" << std::string(100, 'x');
  const auto f = model_fingerprint(path("m.gguf"));
  ASSERT_TRUE(f.ok()) << f.error().to_string();
  EXPECT_EQ(f->size(), 64u);
  const auto missing = model_fingerprint(path("nowhere"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
}

}  // namespace
}  // namespace shardline::model
