// Tests for model/safetensors.cpp: valid files read back exactly; every
// corruption gives the right ErrorCode and a message naming file and tensor.

#include "model/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/model/safetensors_writer.hpp"

namespace fs = std::filesystem;
using shardline::DType;
using shardline::ErrorCode;
using shardline::model::SafetensorsFile;
using shardline::model::TensorView;
using shardline::testing_util::make_header;
using shardline::testing_util::make_temp_dir;
using shardline::testing_util::raw_bytes;
using shardline::testing_util::write_raw;
using shardline::testing_util::write_safetensors;
using shardline::testing_util::write_with_header;
using shardline::testing_util::WTensor;

namespace model_safetensors_test {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("safetensors_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  [[nodiscard]] fs::path file(const std::string& name) const { return dir_ / name; }

  /// Opens `path` and checks the error's code and that its message mentions
  /// the file and every needle.
  ::testing::AssertionResult open_fails(const fs::path& path, ErrorCode code,
                                        std::initializer_list<std::string> needles) {
    auto r = SafetensorsFile::open(path);
    if (r.ok()) return ::testing::AssertionFailure() << "expected an error, opened fine";
    const auto& e = r.error();
    if (e.code != code) {
      return ::testing::AssertionFailure() << "expected " << shardline::error_code_name(code)
                                           << ", got " << e.to_string();
    }
    if (e.message.find(path.string()) == std::string::npos) {
      return ::testing::AssertionFailure() << "message does not name the file: " << e.message;
    }
    for (const std::string& n : needles) {
      if (e.message.find(n) == std::string::npos) {
        return ::testing::AssertionFailure() << "message does not mention '" << n << "': "
                                             << e.message;
      }
    }
    return ::testing::AssertionSuccess();
  }

  fs::path dir_;
};

std::vector<float> read_floats(const TensorView& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == DType::f32) {
      std::memcpy(&out[i], t.data + 4 * i, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[i] = t.dtype == DType::f16 ? shardline::f16_to_f32(h) : shardline::bf16_to_f32(h);
    }
  }
  return out;
}

WTensor f32_tensor(const std::string& name, std::vector<std::int64_t> shape, std::vector<float> v) {
  return WTensor{name, "F32", std::move(shape), raw_bytes(v)};
}


TEST_F(SafetensorsTest, ValidFileReadsBackExactValues) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0e-7f, 65536.0f, -0.0f, 42.0f};
  // F16: 1.0, -2.0, 0.5, 65504 (max), smallest subnormal 2^-24, -inf
  const std::vector<std::uint16_t> f16 = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0xFC00};
  // BF16: 1.0, -3.0, 3.140625, 1e-38-ish, 2^100
  const std::vector<std::uint16_t> bf16 = {0x3F80, 0xC040, 0x4049, 0x006D, 0x7180};
  const fs::path p = file("valid.safetensors");
  write_safetensors(p, {
                           f32_tensor("a.f32", {2, 3}, f32),
                           WTensor{"b.f16", "F16", {6}, raw_bytes(f16)},
                           WTensor{"c.bf16", "BF16", {5, 1}, raw_bytes(bf16)},
                           WTensor{"d.empty", "F32", {0, 4}, ""},
                           WTensor{"e.scalar", "F32", {}, raw_bytes(std::vector<float>{7.0f})},
                       });
  auto r = SafetensorsFile::open(p);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  // Moving keeps the mapping valid.
  SafetensorsFile f = std::move(r).value();
  SafetensorsFile g = std::move(f);
  EXPECT_EQ(g.size(), 5u);
  EXPECT_EQ(g.names(), (std::vector<std::string>{"a.f32", "b.f16", "c.bf16", "d.empty", "e.scalar"}));
  EXPECT_EQ(g.metadata().at("format"), "pt");
  EXPECT_EQ(g.path(), p);
  EXPECT_EQ(g.file_size(), fs::file_size(p));

  auto a = g.tensor("a.f32");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->dtype, DType::f32);
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a->bytes, 24u);
  EXPECT_EQ(0, std::memcmp(a->data, f32.data(), 24));
  EXPECT_EQ(read_floats(*a), f32);

  const TensorView* b = g.find("b.f16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::f16);
  EXPECT_EQ(b->bytes, 12u);
  const std::vector<float> b_expect = {1.0f, -2.0f, 0.5f, 65504.0f, 5.9604644775390625e-8f,
                                       -std::numeric_limits<float>::infinity()};
  EXPECT_EQ(read_floats(*b), b_expect);

  const TensorView* c = g.find("c.bf16");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::bf16);
  EXPECT_EQ(c->shape, (std::vector<std::int64_t>{5, 1}));
  const std::vector<float> c_vals = read_floats(*c);
  EXPECT_EQ(c_vals[0], 1.0f);
  EXPECT_EQ(c_vals[1], -3.0f);
  EXPECT_EQ(c_vals[2], 3.140625f);
  EXPECT_EQ(c_vals[4], 1267650600228229401496703205376.0f);  // 2^100
  EXPECT_EQ(0, std::memcmp(c->data, bf16.data(), 10));

  const TensorView* d = g.find("d.empty");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->numel(), 0);
  EXPECT_EQ(d->bytes, 0u);
  const TensorView* e = g.find("e.scalar");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel(), 1);
  EXPECT_EQ(read_floats(*e), std::vector<float>{7.0f});

  auto missing = g.tensor("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
  EXPECT_NE(missing.error().message.find(p.string()), std::string::npos);
  EXPECT_NE(missing.error().message.find("'nope'"), std::string::npos);
}

TEST_F(SafetensorsTest, MissingFile) {
  EXPECT_TRUE(open_fails(file("absent.safetensors"), ErrorCode::not_found, {"not found"}));
}

TEST_F(SafetensorsTest, TruncatedHeaderLength) {
  const fs::path p = file("short.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"header length"}));
  const fs::path empty = file("empty.safetensors");
  std::ofstream(empty, std::ios::binary).close();
  EXPECT_TRUE(open_fails(empty, ErrorCode::corrupt, {"header length"}));
}

TEST_F(SafetensorsTest, HeaderPastEndOfFile) {
  const fs::path p = file("past_eof.safetensors");
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  write_raw(p, header.size() + 100, header, std::string(4, '\0'));
  EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"header length", "past end of file"}));
}

TEST_F(SafetensorsTest, AbsurdHeaderLength) {
  const fs::path p = file("absurd.safetensors");
  write_raw(p, 1ull << 40, "{}", "");
  EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"header length", "absurd"}));
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  const fs::path p = file("not_json.safetensors");
  const std::string header = "this is {not json";
  write_raw(p, header.size(), header, "");
  EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"JSON"}));
  const fs::path q = file("array.safetensors");
  write_with_header(q, nlohmann::json::array({1, 2}), "");
  EXPECT_TRUE(open_fails(q, ErrorCode::corrupt, {"not a JSON object"}));
}

TEST_F(SafetensorsTest, EntryMissingFields) {
  struct Case {
    const char* what;
    nlohmann::json entry;
  };
  const std::vector<Case> cases = {
      {"dtype", {{"shape", {1}}, {"data_offsets", {0, 4}}}},
      {"shape", {{"dtype", "F32"}, {"data_offsets", {0, 4}}}},
      {"data_offsets", {{"dtype", "F32"}, {"shape", {1}}}},
      {"data_offsets", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0}}}},
      {"data_offsets", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 4}}}},
      {"shape", {{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}},
      {"not an object", "hello"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry.dump());
    const fs::path p = file("fields.safetensors");
    write_with_header(p, nlohmann::json{{"layer.w", c.entry}}, std::string(4, '\0'));
    EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"'layer.w'", c.what}));
  }
}

TEST_F(SafetensorsTest, OffsetsOutsideFile) {
  const fs::path p = file("outside.safetensors");
  nlohmann::json h = make_header({f32_tensor("ok", {2}, {1, 2}), f32_tensor("big", {100}, {})});
  h["big"]["data_offsets"] = {8, 408};
  write_with_header(p, h, std::string(16, '\0'));
  EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"'big'", "outside the data area"}));

  // A valid file cut short also puts the last tensor outside the file.
  const fs::path q = file("truncated.safetensors");
  write_safetensors(q, {f32_tensor("first", {4}, {1, 2, 3, 4}), f32_tensor("last", {4}, {5, 6, 7, 8})});
  fs::resize_file(q, fs::file_size(q) - 3);
  EXPECT_TRUE(open_fails(q, ErrorCode::corrupt, {"'last'", "outside the data area"}));
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
  const fs::path p = file("reversed.safetensors");
  nlohmann::json h = nlohmann::json::object();
  h["rev"] = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 4}}};
  write_with_header(p, h, std::string(8, '\0'));
  EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"'rev'", "begin 8 > end 4"}));
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  const fs::path p = file("overlap.safetensors");
  nlohmann::json h = nlohmann::json::object();
  h["a"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}};
  h["b"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {8, 24}}};
  write_with_header(p, h, std::string(24, '\0'));
  EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"'b'", "overlap", "'a'"}));
}

TEST_F(SafetensorsTest, SizeMismatch) {
  const fs::path p = file("size.safetensors");
  nlohmann::json h = nlohmann::json::object();
  h["model.norm.weight"] = {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 16}}};
  write_with_header(p, h, std::string(16, '\0'));
  EXPECT_TRUE(open_fails(p, ErrorCode::corrupt, {"'model.norm.weight'", "[3]", "16"}));

  const fs::path q = file("size16.safetensors");
  h["model.norm.weight"] = {{"dtype", "BF16"}, {"shape", {2, 4}}, {"data_offsets", {0, 8}}};
  write_with_header(q, h, std::string(16, '\0'));
  EXPECT_TRUE(open_fails(q, ErrorCode::corrupt, {"'model.norm.weight'", "[2, 4]", "BF16"}));
}

TEST_F(SafetensorsTest, UnsupportedDtype) {
  const fs::path p = file("i64.safetensors");
  write_safetensors(p, {f32_tensor("fine", {1}, {1.0f}),
                        WTensor{"position_ids", "I64", {2}, std::string(16, '\0')}});
  EXPECT_TRUE(open_fails(p, ErrorCode::unsupported, {"'position_ids'", "I64"}));
}

}  // namespace model_safetensors_test
