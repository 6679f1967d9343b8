#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

namespace shardline::model {

namespace {

using nlohmann::json;

[[nodiscard]] Error file_error(ErrorCode code, const std::filesystem::path& path,
                               const std::string& what) {
  return make_error(code, path.string() + ": " + what);
}

[[nodiscard]] Error tensor_error(ErrorCode code, const std::filesystem::path& path,
                                 const std::string& tensor, const std::string& what) {
  return make_error(code, path.string() + ": tensor '" + tensor + "': " + what);
}

/// A non-negative integer that fits in u64 (safetensors stores offsets and dims so).
[[nodiscard]] bool as_u64(const json& j, std::uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<std::uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    const auto v = j.get<std::int64_t>();
    if (v < 0) return false;
    out = static_cast<std::uint64_t>(v);
    return true;
  }
  return false;
}

}  // namespace

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) out.push_back(name);
  return out;
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<TensorView> SafetensorsFile::tensor(const std::string& name) const {
  const TensorView* t = find(name);
  if (t == nullptr) return tensor_error(ErrorCode::not_found, path_, name, "not in file");
  return *t;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.path_ = path;

  // ---- map the file ----
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return file_error(ErrorCode::not_found, path, "file not found");
    return file_error(ErrorCode::io, path, std::string("cannot open: ") + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return file_error(ErrorCode::io, path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return file_error(ErrorCode::io, path, "not a regular file");
  }
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return file_error(ErrorCode::corrupt, path,
                      "truncated: " + std::to_string(file_size) +
                          " bytes, too short for the 8-byte header length");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    return file_error(ErrorCode::io, path, std::string("mmap failed: ") + std::strerror(map_err));
  }
  f.map_ = map;
  f.size_ = file_size;
  const auto* bytes = static_cast<const std::byte*>(map);

  // ---- header length ----
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<std::uint64_t>(bytes[i]);
  }
  if (header_len > kMaxHeaderBytes) {
    return file_error(ErrorCode::corrupt, path,
                      "header length " + std::to_string(header_len) +
                          " is absurd (limit " + std::to_string(kMaxHeaderBytes) + " bytes)");
  }
  if (header_len > file_size - 8) {
    return file_error(ErrorCode::corrupt, path,
                      "header length " + std::to_string(header_len) +
                          " runs past end of file (file size " + std::to_string(file_size) + ")");
  }
  if (header_len < 2) {
    return file_error(ErrorCode::corrupt, path,
                      "header length " + std::to_string(header_len) + " is too small");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  const std::uint64_t data_start = 8 + header_len;
  const std::uint64_t data_size = file_size - data_start;

  // ---- header JSON ----
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_len);
  } catch (const json::exception& e) {
    return file_error(ErrorCode::corrupt, path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) {
    return file_error(ErrorCode::corrupt, path,
                      std::string("header is not a JSON object (found ") + header.type_name() + ")");
  }

  struct Span {
    std::uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  spans.reserve(header.size());

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_null()) continue;
      if (!entry.is_object()) {
        return file_error(ErrorCode::corrupt, path, "'__metadata__' is not an object");
      }
      for (const auto& [k, v] : entry.items()) {
        if (v.is_string()) f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) {
      return tensor_error(ErrorCode::corrupt, path, name, "header entry is not an object");
    }
    // dtype
    const auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) {
      return tensor_error(ErrorCode::corrupt, path, name, "missing or non-string 'dtype'");
    }
    const std::string dtype = dt->get<std::string>();
    // shape
    const auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) {
      return tensor_error(ErrorCode::corrupt, path, name, "missing or non-array 'shape'");
    }
    std::vector<std::int64_t> shape;
    std::uint64_t numel = 1;
    bool numel_overflow = false;
    for (const json& d : *sh) {
      std::uint64_t v = 0;
      if (!as_u64(d, v) || v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return tensor_error(ErrorCode::corrupt, path, name,
                            "shape entry " + d.dump() + " is not a non-negative integer");
      }
      shape.push_back(static_cast<std::int64_t>(v));
      if (v != 0 && numel > std::numeric_limits<std::uint64_t>::max() / v) numel_overflow = true;
      numel *= v;
    }
    // data_offsets
    const auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2) {
      return tensor_error(ErrorCode::corrupt, path, name,
                          "missing 'data_offsets' or not a [begin, end] pair");
    }
    std::uint64_t b = 0, e = 0;
    if (!as_u64((*off)[0], b) || !as_u64((*off)[1], e)) {
      return tensor_error(ErrorCode::corrupt, path, name,
                          "data_offsets " + off->dump() + " are not non-negative integers");
    }
    if (b > e) {
      return tensor_error(ErrorCode::corrupt, path, name,
                          "data_offsets begin " + std::to_string(b) + " > end " + std::to_string(e));
    }
    if (e > data_size) {
      return tensor_error(ErrorCode::corrupt, path, name,
                          "data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                              ") outside the data area (" + std::to_string(data_size) +
                              " bytes; file truncated?)");
    }
    DType dtype_value;
    if (dtype == "F32") {
      dtype_value = DType::f32;
    } else if (dtype == "F16") {
      dtype_value = DType::f16;
    } else if (dtype == "BF16") {
      dtype_value = DType::bf16;
    } else {
      return tensor_error(ErrorCode::unsupported, path, name,
                          "dtype '" + dtype + "' is not supported (F32, F16, BF16)");
    }
    const std::uint64_t elem = dtype_size(dtype_value);
    if (numel_overflow || numel > std::numeric_limits<std::uint64_t>::max() / elem ||
        numel * elem != e - b) {
      return tensor_error(ErrorCode::corrupt, path, name,
                          "byte size " + std::to_string(e - b) + " disagrees with shape " +
                              shape_string(shape) + " x " + dtype + " (" +
                              (numel_overflow ? std::string("overflow")
                                              : std::to_string(numel) + " x " +
                                                    std::to_string(elem) + " bytes") +
                              ")");
    }
    TensorView view;
    view.name = name;
    view.dtype = dtype_value;
    view.shape = std::move(shape);
    view.data = bytes + data_start + b;
    view.bytes = static_cast<std::size_t>(e - b);
    auto [it, inserted] = f.tensors_.emplace(name, std::move(view));
    (void)inserted;  // JSON object keys are unique after parsing
    spans.push_back(Span{b, e, &it->first});
  }

  // ---- overlap ----
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  const Span* prev = nullptr;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;  // empty tensors occupy no bytes
    if (prev != nullptr && s.begin < prev->end) {
      return tensor_error(ErrorCode::corrupt, path, *s.name,
                          "data_offsets [" + std::to_string(s.begin) + ", " +
                              std::to_string(s.end) + ") overlap tensor '" + *prev->name + "' [" +
                              std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ")");
    }
    prev = &s;
  }
  return f;
}

}  // namespace shardline::model
