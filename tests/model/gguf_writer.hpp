#pragma once
// Writes GGUF files for tests (the layout of model/gguf/gguf_file.hpp):
// typed key-values, tensors with raw data, and hooks to break any part.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace shardline::testing_support {

class GgufWriter {
 public:
  std::uint32_t version = 3;
  std::uint64_t alignment = 32;

  void put_u32(const std::string& key, std::uint32_t v) { kv(key, 4, bytes_of(v)); }
  void put_i32(const std::string& key, std::int32_t v) { kv(key, 5, bytes_of(v)); }
  void put_f32(const std::string& key, float v) { kv(key, 6, bytes_of(v)); }
  void put_bool(const std::string& key, bool v) { kv(key, 7, std::string(1, static_cast<char>(v ? 1 : 0))); }
  void put_u64(const std::string& key, std::uint64_t v) { kv(key, 10, bytes_of(v)); }
  void put_str(const std::string& key, const std::string& v) { kv(key, 8, str(v)); }
  void put_str_array(const std::string& key, const std::vector<std::string>& v) {
    std::string body = bytes_of(std::uint32_t{8}) + bytes_of(static_cast<std::uint64_t>(v.size()));
    for (const auto& s : v) body += str(s);
    kv(key, 9, body);
  }
  void put_i32_array(const std::string& key, const std::vector<std::int32_t>& v) {
    std::string body = bytes_of(std::uint32_t{5}) + bytes_of(static_cast<std::uint64_t>(v.size()));
    for (const auto x : v) body += bytes_of(x);
    kv(key, 9, body);
  }
  void put_f32_array(const std::string& key, const std::vector<float>& v) {
    std::string body = bytes_of(std::uint32_t{6}) + bytes_of(static_cast<std::uint64_t>(v.size()));
    for (const auto x : v) body += bytes_of(x);
    kv(key, 9, body);
  }
  /// Drops every value of `key` (before putting another: a key written twice
  /// is a duplicate the reader refuses).
  void remove(const std::string& key) {
    const std::string prefix = str(key);
    std::erase_if(kvs_, [&](const std::string& kv) { return kv.compare(0, prefix.size(), prefix) == 0; });
  }
  /// A raw key-value (type id and encoded value as given).
  void put_raw(const std::string& key, std::uint32_t type, const std::string& value) { kv(key, type, value); }

  /// A tensor of GGML type `type`, dims in GGML order, `data` its bytes.
  void add_tensor(const std::string& name, std::vector<std::uint64_t> dims, std::uint32_t type, std::string data) {
    tensors_.push_back({name, std::move(dims), type, std::move(data)});
  }
  /// An F32 tensor.
  void add_f32(const std::string& name, std::vector<std::uint64_t> dims, const std::vector<float>& values) {
    std::string data(values.size() * 4, '\0');
    std::memcpy(data.data(), values.data(), data.size());
    add_tensor(name, std::move(dims), 0, std::move(data));
  }

  /// The whole file. `offset_shift` moves one tensor's recorded offset
  /// (index `shift_tensor`) by that many bytes, to break alignment or bounds.
  [[nodiscard]] std::string bytes(int shift_tensor = -1, std::int64_t offset_shift = 0) const {
    std::string out = "GGUF" + bytes_of(version) + bytes_of(static_cast<std::uint64_t>(tensors_.size())) +
                      bytes_of(static_cast<std::uint64_t>(kvs_.size()));
    for (const auto& k : kvs_) out += k;
    std::uint64_t offset = 0;
    std::vector<std::uint64_t> offsets;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      offsets.push_back(offset);
      std::uint64_t recorded = offset;
      if (static_cast<int>(i) == shift_tensor) recorded = static_cast<std::uint64_t>(static_cast<std::int64_t>(offset) + offset_shift);
      out += str(t.name) + bytes_of(static_cast<std::uint32_t>(t.dims.size()));
      for (const auto d : t.dims) out += bytes_of(d);
      out += bytes_of(t.type) + bytes_of(recorded);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      out += tensors_[i].data;
      out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    }
    return out;
  }

  void write(const std::string& path, int shift_tensor = -1, std::int64_t offset_shift = 0) const {
    const std::string b = bytes(shift_tensor, offset_shift);
    std::ofstream(path, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
  }

  template <class T>
  [[nodiscard]] static std::string bytes_of(T v) {
    std::string s(sizeof(T), '\0');
    std::memcpy(s.data(), &v, sizeof(T));
    return s;
  }
  [[nodiscard]] static std::string str(const std::string& s) { return bytes_of(static_cast<std::uint64_t>(s.size())) + s; }

 private:
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    std::uint32_t type;
    std::string data;
  };
  void kv(const std::string& key, std::uint32_t type, const std::string& value) {
    kvs_.push_back(str(key) + bytes_of(type) + value);
  }
  std::vector<std::string> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace shardline::testing_support
