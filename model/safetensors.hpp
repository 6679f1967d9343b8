#pragma once
/// \file
/// Read-only, memory-mapped reader of the safetensors format:
///   [u64 little-endian N][N bytes of JSON header][data area]
/// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
/// (byte offsets relative to the start of the data area) plus an optional
/// "__metadata__" object of string -> string.
///
/// `SafetensorsFile::open` validates the whole header up front (header length,
/// JSON, every entry's fields, offsets inside the data area, begin <= end,
/// byte size == product(shape) * dtype size, no two tensors overlapping, dtype
/// F32/F16/BF16) and returns an `Error` naming the file and tensor otherwise,
/// so nothing downstream can read out of bounds.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/result.hpp"

namespace shardline::model {

/// A view of one tensor inside a mapped file. `data` points into the mapping
/// (valid while the `SafetensorsFile` lives) and may be unaligned: read it with
/// memcpy.
struct TensorView {
  std::string name;
  DType dtype = DType::f32;            ///< F32, F16 or BF16
  std::vector<std::int64_t> shape;     ///< e.g. [rows, cols]; [] for a scalar
  const std::byte* data = nullptr;     ///< first byte of the tensor
  std::size_t bytes = 0;               ///< numel() * dtype_size(dtype)

  /// Number of elements (product of shape; 1 for a scalar).
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
};

/// Formats a shape as "[a, b, c]" (for error messages).
[[nodiscard]] std::string shape_string(const std::vector<std::int64_t>& shape);

/// An open, validated, memory-mapped safetensors file. Move-only; unmaps on
/// destruction.
class SafetensorsFile {
 public:
  /// Largest header accepted (bytes).
  static constexpr std::uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;

  /// Maps and validates `path`. Errors: not_found (no such file), io (open /
  /// stat / mmap failure), corrupt (header length, JSON, fields, offsets,
  /// sizes, overlap), unsupported (dtype other than F32/F16/BF16). Messages
  /// name the file and, where relevant, the tensor.
  [[nodiscard]] static Result<SafetensorsFile> open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// Size of the whole file in bytes.
  [[nodiscard]] std::size_t file_size() const { return size_; }
  /// Tensor names, sorted.
  [[nodiscard]] std::vector<std::string> names() const;
  [[nodiscard]] std::size_t size() const { return tensors_.size(); }
  [[nodiscard]] bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  /// The tensor, or nullptr when absent.
  [[nodiscard]] const TensorView* find(const std::string& name) const;
  /// The tensor, or not_found naming the file and tensor.
  [[nodiscard]] Result<TensorView> tensor(const std::string& name) const;
  /// The "__metadata__" entries (string values only).
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void release() noexcept;

  std::filesystem::path path_;
  void* map_ = nullptr;    // whole file, PROT_READ
  std::size_t size_ = 0;   // bytes mapped
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace shardline::model
