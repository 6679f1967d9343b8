#pragma once
/// \file
/// Read-only, memory-mapped reader of llama.cpp's GGUF format, versions 2 and
/// 3 (ggml/docs/gguf.md; gguf-py's GGUFReader):
///
///   u32 magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
///   kv_count x { string key, u32 value_type, value },
///   tensor_count x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset },
///   padding to `general.alignment` (default 32), the tensor data.
///
/// A string is { u64 length, bytes }; an array value is { u32 element_type,
/// u64 count, elements } and may nest. All integers are little-endian.
///
/// `GgufFile::open` validates the whole file before anything reads it: magic,
/// version, every length and count against the bytes left, value types,
/// nesting depth, unique keys and tensor names, dims (1 to 4, positive, the
/// first a multiple of the type's block size), known tensor types, offsets
/// aligned and inside the file, no two tensors overlapping. Errors name the
/// file and the key, tensor or byte offset; nothing downstream can read out of
/// bounds.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/result.hpp"

namespace shardline::model::gguf {

/// GGUF metadata value types (gguf.md `gguf_metadata_value_type`).
enum class ValueType : std::uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

[[nodiscard]] const char* value_type_name(ValueType t) noexcept;

/// One metadata value. Integers are kept as int64 (uint64 values above
/// INT64_MAX are refused at open), floats as double; `type` is the type as
/// written. An array holds its `element_type` and `elements`.
struct Value {
  ValueType type = ValueType::uint8;
  std::int64_t int_value = 0;    ///< integer types and bool (0/1)
  double float_value = 0.0;      ///< float32 / float64
  std::string string_value;      ///< string
  ValueType element_type = ValueType::uint8;  ///< array
  std::vector<Value> elements;                ///< array

  [[nodiscard]] bool is_integer() const noexcept;
  [[nodiscard]] bool is_float() const noexcept { return type == ValueType::float32 || type == ValueType::float64; }
};

/// One tensor of the file. `dims` is in GGML order: dims[0] is the contiguous
/// (innermost) dimension, so a matrix [rows, cols] in PyTorch terms has
/// dims {cols, rows}. `data` points into the mapping (valid while the file
/// lives) at an offset that is a multiple of the file's alignment.
struct TensorInfo {
  std::string name;
  std::vector<std::int64_t> dims;  ///< GGML order, 1 to 4 entries
  std::uint32_t ggml_type = 0;     ///< kernels::GgmlType id
  std::uint64_t offset = 0;        ///< bytes from the start of the data section
  const std::byte* data = nullptr;
  std::size_t bytes = 0;           ///< rows x row bytes of the type

  [[nodiscard]] std::int64_t num_elements() const;
  /// Rows of the tensor seen as a matrix: the product of dims[1..].
  [[nodiscard]] std::int64_t num_rows() const;
};

/// An open, validated, memory-mapped GGUF file. Move-only; unmaps on
/// destruction.
class GgufFile {
 public:
  /// Bounds that keep a hostile file from asking for unbounded memory.
  static constexpr int kMaxArrayDepth = 4;
  static constexpr std::uint64_t kMaxStringBytes = 256ull << 20;

  /// Maps and validates `path`. Errors: not_found (no such file), io (open,
  /// stat, mmap), corrupt (magic, truncation, lengths, counts, offsets,
  /// alignment, overlap, duplicate keys or names, bad dims or value types),
  /// unsupported (version other than 2 and 3, a tensor type this build does
  /// not know). Messages name the file and the key, tensor or byte offset.
  [[nodiscard]] static Result<GgufFile> open(const std::filesystem::path& path);

  GgufFile(GgufFile&& other) noexcept;
  GgufFile& operator=(GgufFile&& other) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::uint32_t version() const { return version_; }
  [[nodiscard]] std::size_t file_size() const { return size_; }
  [[nodiscard]] std::uint64_t alignment() const { return alignment_; }

  [[nodiscard]] const std::map<std::string, Value>& metadata() const { return metadata_; }
  /// The value of `key`, or nullptr when absent.
  [[nodiscard]] const Value* find(const std::string& key) const;

  /// Typed look-ups. Each returns nullopt when the key is absent and a
  /// `mismatch` error naming the key when it holds another type.
  [[nodiscard]] Result<std::optional<std::int64_t>> get_int(const std::string& key) const;
  [[nodiscard]] Result<std::optional<double>> get_float(const std::string& key) const;
  [[nodiscard]] Result<std::optional<bool>> get_bool(const std::string& key) const;
  [[nodiscard]] Result<std::optional<std::string>> get_string(const std::string& key) const;
  /// An array of strings (tokens, merges).
  [[nodiscard]] Result<std::optional<std::vector<std::string>>> get_string_array(const std::string& key) const;

  /// Tensors in file order.
  [[nodiscard]] const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// The tensor `name`, or nullptr when absent.
  [[nodiscard]] const TensorInfo* find_tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  void release() noexcept;

  std::filesystem::path path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::map<std::string, Value> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> tensor_index_;
};

/// The GGUF file a `--model` path names: the path itself when it is a
/// regular file ending in ".gguf", or the one *.gguf file of a folder that
/// has no config.json. nullopt for anything else (a Hugging Face folder).
/// Errors: invalid_argument for a folder without config.json that holds
/// several *.gguf files (naming them; pass the file itself).
[[nodiscard]] Result<std::optional<std::filesystem::path>> find_gguf(const std::filesystem::path& model);

}  // namespace shardline::model::gguf
