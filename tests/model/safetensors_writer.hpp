#pragma once
/// \file
/// Test-only helpers: a minimal safetensors writer (independent of the reader
/// under test) and unique temporary folders.

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardline::testing_util {

/// One tensor to write: raw little-endian bytes of `dtype` ("F32", "F16", "BF16", ...).
struct WTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

template <class T>
[[nodiscard]] inline std::string raw_bytes(const std::vector<T>& v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

/// Writes `[u64 header_len][header][data]` verbatim.
inline void write_raw(const std::filesystem::path& path, std::uint64_t header_len,
                      const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(header_len >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

/// The header JSON of `tensors` laid out back to back, in order.
[[nodiscard]] inline nlohmann::json make_header(const std::vector<WTensor>& tensors) {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  std::uint64_t off = 0;
  for (const WTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  return h;
}

/// Writes `header` (padded with spaces to a multiple of 8) and `data`.
inline void write_with_header(const std::filesystem::path& path, const nlohmann::json& header,
                              const std::string& data) {
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  write_raw(path, h.size(), h, data);
}

/// A valid safetensors file holding `tensors`.
inline void write_safetensors(const std::filesystem::path& path, const std::vector<WTensor>& tensors) {
  std::string data;
  for (const WTensor& t : tensors) data += t.bytes;
  write_with_header(path, make_header(tensors), data);
}

/// A fresh, empty, uniquely named folder under the system temp dir.
[[nodiscard]] inline std::filesystem::path make_temp_dir(const std::string& tag) {
  static int counter = 0;
  std::filesystem::path d = std::filesystem::temp_directory_path() /
                            ("shardline_" + tag + "_" + std::to_string(::getpid()) + "_" +
                             std::to_string(counter++));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace shardline::testing_util
