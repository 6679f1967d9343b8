#include "model/gguf/gguf_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/cpu/ggml_quants.hpp"

namespace shardline::model::gguf {

namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;                   // GGML_MAX_DIMS

/// Bytes of a scalar value type; 0 for string / array.
[[nodiscard]] std::size_t scalar_bytes(ValueType t) {
  switch (t) {
    case ValueType::uint8: case ValueType::int8: case ValueType::boolean: return 1;
    case ValueType::uint16: case ValueType::int16: return 2;
    case ValueType::uint32: case ValueType::int32: case ValueType::float32: return 4;
    case ValueType::uint64: case ValueType::int64: case ValueType::float64: return 8;
    case ValueType::string: case ValueType::array: return 0;
  }
  return 0;
}

/// A bounds-checked cursor over the mapped bytes. Every read checks the bytes
/// left; a failed read records the error (naming what was being read and the
/// offset) and every later read fails too.
class Cursor {
 public:
  Cursor(const std::byte* data, std::size_t size, const std::filesystem::path& path)
      : data_(data), size_(size), path_(path) {}

  [[nodiscard]] std::size_t offset() const { return pos_; }
  [[nodiscard]] std::size_t left() const { return size_ - pos_; }
  [[nodiscard]] bool failed() const { return error_.has_value(); }
  [[nodiscard]] Error error() const { return *error_; }

  void fail(ErrorCode code, const std::string& what, std::size_t at) {
    if (!error_) error_ = make_error(code, path_.string() + ": " + what + " (at byte " + std::to_string(at) + ")");
  }

  template <class T>
  [[nodiscard]] T read(const char* what) {
    T v{};
    if (failed()) return v;
    if (left() < sizeof(T)) {
      fail(ErrorCode::corrupt, std::string("truncated reading ") + what + ": " + std::to_string(left()) +
                                   " bytes left of the " + std::to_string(sizeof(T)) + " needed",
           pos_);
      return v;
    }
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  [[nodiscard]] std::string read_string(const std::string& what) {
    const std::size_t at = pos_;
    const auto n = read<std::uint64_t>(what.c_str());
    if (failed()) return {};
    if (n > left() || n > GgufFile::kMaxStringBytes) {
      fail(ErrorCode::corrupt, what + ": string length " + std::to_string(n) + " runs past the end of the file (" +
                                   std::to_string(left()) + " bytes left)",
           at);
      return {};
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }

 private:
  const std::byte* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  const std::filesystem::path& path_;
  std::optional<Error> error_;
};

[[nodiscard]] bool valid_value_type(std::uint32_t t) { return t <= static_cast<std::uint32_t>(ValueType::float64); }

/// Reads one value of type `type` (already read) for key `key`.
void read_value(Cursor& c, ValueType type, const std::string& key, int depth, Value& out) {
  out.type = type;
  switch (type) {
    case ValueType::uint8: out.int_value = c.read<std::uint8_t>(key.c_str()); return;
    case ValueType::int8: out.int_value = c.read<std::int8_t>(key.c_str()); return;
    case ValueType::uint16: out.int_value = c.read<std::uint16_t>(key.c_str()); return;
    case ValueType::int16: out.int_value = c.read<std::int16_t>(key.c_str()); return;
    case ValueType::uint32: out.int_value = c.read<std::uint32_t>(key.c_str()); return;
    case ValueType::int32: out.int_value = c.read<std::int32_t>(key.c_str()); return;
    case ValueType::int64: out.int_value = c.read<std::int64_t>(key.c_str()); return;
    case ValueType::uint64: {
      const std::size_t at = c.offset();
      const auto v = c.read<std::uint64_t>(key.c_str());
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        c.fail(ErrorCode::corrupt, "key '" + key + "': uint64 value " + std::to_string(v) + " is out of range", at);
      out.int_value = static_cast<std::int64_t>(v);
      return;
    }
    case ValueType::float32: out.float_value = c.read<float>(key.c_str()); return;
    case ValueType::float64: out.float_value = c.read<double>(key.c_str()); return;
    case ValueType::boolean: {
      const std::size_t at = c.offset();
      const auto b = c.read<std::uint8_t>(key.c_str());
      if (b > 1) c.fail(ErrorCode::corrupt, "key '" + key + "': bool value " + std::to_string(b) + " is not 0 or 1", at);
      out.int_value = b;
      return;
    }
    case ValueType::string: out.string_value = c.read_string("key '" + key + "'"); return;
    case ValueType::array: {
      const std::size_t at = c.offset();
      if (depth >= GgufFile::kMaxArrayDepth) {
        c.fail(ErrorCode::corrupt, "key '" + key + "': arrays nested deeper than " +
                                       std::to_string(GgufFile::kMaxArrayDepth),
               at);
        return;
      }
      const auto elem = c.read<std::uint32_t>(key.c_str());
      const auto count = c.read<std::uint64_t>(key.c_str());
      if (c.failed()) return;
      if (!valid_value_type(elem)) {
        c.fail(ErrorCode::corrupt, "key '" + key + "': unknown array element type " + std::to_string(elem), at);
        return;
      }
      out.element_type = static_cast<ValueType>(elem);
      // Each element takes at least one byte (a string at least its 8-byte
      // length): a count beyond what is left is a lie, refused before allocating.
      const std::size_t min_bytes = out.element_type == ValueType::string  ? 8
                                    : out.element_type == ValueType::array ? 12
                                                                           : scalar_bytes(out.element_type);
      if (count > c.left() / min_bytes) {
        c.fail(ErrorCode::corrupt, "key '" + key + "': array of " + std::to_string(count) + " " +
                                       value_type_name(out.element_type) + " runs past the end of the file",
               at);
        return;
      }
      out.elements.resize(static_cast<std::size_t>(count));
      for (Value& e : out.elements) {
        read_value(c, out.element_type, key, depth + 1, e);
        if (c.failed()) return;
      }
      return;
    }
  }
}

}  // namespace

const char* value_type_name(ValueType t) noexcept {
  switch (t) {
    case ValueType::uint8: return "uint8";
    case ValueType::int8: return "int8";
    case ValueType::uint16: return "uint16";
    case ValueType::int16: return "int16";
    case ValueType::uint32: return "uint32";
    case ValueType::int32: return "int32";
    case ValueType::float32: return "float32";
    case ValueType::boolean: return "bool";
    case ValueType::string: return "string";
    case ValueType::array: return "array";
    case ValueType::uint64: return "uint64";
    case ValueType::int64: return "int64";
    case ValueType::float64: return "float64";
  }
  return "?";
}

bool Value::is_integer() const noexcept {
  switch (type) {
    case ValueType::uint8: case ValueType::int8: case ValueType::uint16: case ValueType::int16:
    case ValueType::uint32: case ValueType::int32: case ValueType::uint64: case ValueType::int64:
      return true;
    default: return false;
  }
}

std::int64_t TensorInfo::num_elements() const {
  std::int64_t n = 1;
  for (const std::int64_t d : dims) n *= d;
  return n;
}

std::int64_t TensorInfo::num_rows() const {
  std::int64_t n = 1;
  for (std::size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

GgufFile::GgufFile(GgufFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      version_(other.version_),
      alignment_(other.alignment_),
      metadata_(std::move(other.metadata_)),
      tensors_(std::move(other.tensors_)),
      tensor_index_(std::move(other.tensor_index_)) {}

GgufFile& GgufFile::operator=(GgufFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    version_ = other.version_;
    alignment_ = other.alignment_;
    metadata_ = std::move(other.metadata_);
    tensors_ = std::move(other.tensors_);
    tensor_index_ = std::move(other.tensor_index_);
  }
  return *this;
}

GgufFile::~GgufFile() { release(); }

void GgufFile::release() noexcept {
  if (map_ != nullptr && map_ != MAP_FAILED) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

const Value* GgufFile::find(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const TensorInfo* GgufFile::find_tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Error type_error(const std::filesystem::path& path, const std::string& key, const Value& v, const char* wanted) {
  std::string got = value_type_name(v.type);
  if (v.type == ValueType::array) got += std::string(" of ") + value_type_name(v.element_type);
  return make_error(ErrorCode::mismatch, path.string() + ": key '" + key + "' is " + got + ", expected " + wanted);
}
}  // namespace

Result<std::optional<std::int64_t>> GgufFile::get_int(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<std::int64_t>();
  if (!v->is_integer()) return type_error(path_, key, *v, "an integer");
  return std::optional<std::int64_t>(v->int_value);
}

Result<std::optional<double>> GgufFile::get_float(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<double>();
  if (v->is_float()) return std::optional<double>(v->float_value);
  if (v->is_integer()) return std::optional<double>(static_cast<double>(v->int_value));
  return type_error(path_, key, *v, "a number");
}

Result<std::optional<bool>> GgufFile::get_bool(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<bool>();
  if (v->type != ValueType::boolean) return type_error(path_, key, *v, "a bool");
  return std::optional<bool>(v->int_value != 0);
}

Result<std::optional<std::string>> GgufFile::get_string(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->type != ValueType::string) return type_error(path_, key, *v, "a string");
  return std::optional<std::string>(v->string_value);
}

Result<std::optional<std::vector<std::string>>> GgufFile::get_string_array(const std::string& key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::optional<std::vector<std::string>>();
  if (v->type != ValueType::array || v->element_type != ValueType::string)
    return type_error(path_, key, *v, "an array of string");
  std::vector<std::string> out;
  out.reserve(v->elements.size());
  for (const Value& e : v->elements) out.push_back(e.string_value);
  return std::optional<std::vector<std::string>>(std::move(out));
}

Result<GgufFile> GgufFile::open(const std::filesystem::path& path) {
  GgufFile f;
  f.path_ = path;
  auto file_error = [&](ErrorCode code, const std::string& what) { return make_error(code, path.string() + ": " + what); };

  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return file_error(ErrorCode::not_found, "file not found");
    return file_error(ErrorCode::io, std::string("cannot open: ") + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return file_error(ErrorCode::io, "not a readable regular file");
  }
  const auto file_size = static_cast<std::size_t>(st.st_size);
  if (file_size < 24) {
    ::close(fd);
    return file_error(ErrorCode::corrupt, "truncated: " + std::to_string(file_size) +
                                              " bytes, too short for the 24-byte GGUF header");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) return file_error(ErrorCode::io, std::string("cannot mmap: ") + std::strerror(map_errno));
  f.map_ = map;
  f.size_ = file_size;
  const auto* bytes = static_cast<const std::byte*>(map);

  Cursor c(bytes, file_size, f.path_);
  const auto magic = c.read<std::uint32_t>("magic");
  if (magic != kMagic) {
    char shown[5] = {};
    std::memcpy(shown, bytes, 4);
    for (char& ch : shown)
      if (ch != 0 && (ch < 32 || ch > 126)) ch = '?';
    return file_error(ErrorCode::corrupt, std::string("bad magic '") + shown + "': not a GGUF file");
  }
  f.version_ = c.read<std::uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3)
    return file_error(ErrorCode::unsupported,
                      "GGUF version " + std::to_string(f.version_) + " is not supported (2 and 3 are)");
  const auto tensor_count = c.read<std::uint64_t>("tensor_count");
  const auto kv_count = c.read<std::uint64_t>("kv_count");
  // A key-value takes at least 13 bytes, a tensor info at least 28.
  if (kv_count > c.left() / 13)
    return file_error(ErrorCode::corrupt, "kv_count " + std::to_string(kv_count) + " is more than the file can hold");
  if (tensor_count > c.left() / 28)
    return file_error(ErrorCode::corrupt,
                      "tensor_count " + std::to_string(tensor_count) + " is more than the file can hold");

  for (std::uint64_t i = 0; i < kv_count; ++i) {
    const std::size_t at = c.offset();
    std::string key = c.read_string("key " + std::to_string(i));
    const auto type = c.read<std::uint32_t>("value type");
    if (c.failed()) return c.error();
    if (!valid_value_type(type)) {
      c.fail(ErrorCode::corrupt, "key '" + key + "': unknown value type " + std::to_string(type), at);
      return c.error();
    }
    Value v;
    read_value(c, static_cast<ValueType>(type), key, 0, v);
    if (c.failed()) return c.error();
    if (!f.metadata_.emplace(key, std::move(v)).second) {
      c.fail(ErrorCode::corrupt, "key '" + key + "' appears twice", at);
      return c.error();
    }
  }
  if (auto a = f.get_int("general.alignment"); !a.ok()) {
    return a.error();
  } else if (a->has_value()) {
    const std::int64_t al = **a;
    if (al <= 0 || (al & (al - 1)) != 0 || al > (1 << 20))
      return file_error(ErrorCode::corrupt, "key 'general.alignment' = " + std::to_string(al) +
                                                " is not a power of two up to 1 MiB");
    f.alignment_ = static_cast<std::uint64_t>(al);
  }

  f.tensors_.reserve(static_cast<std::size_t>(tensor_count));
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    const std::size_t at = c.offset();
    TensorInfo t;
    t.name = c.read_string("tensor name " + std::to_string(i));
    const auto n_dims = c.read<std::uint32_t>("n_dims");
    if (c.failed()) return c.error();
    if (n_dims == 0 || n_dims > kMaxDims) {
      c.fail(ErrorCode::corrupt, "tensor '" + t.name + "': " + std::to_string(n_dims) + " dims (1 to 4 allowed)", at);
      return c.error();
    }
    std::int64_t elements = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = c.read<std::uint64_t>("dim");
      if (c.failed()) return c.error();
      if (ne == 0 || ne > (1ull << 40) ||
          elements > std::numeric_limits<std::int64_t>::max() / static_cast<std::int64_t>(ne)) {
        c.fail(ErrorCode::corrupt, "tensor '" + t.name + "': dim " + std::to_string(d) + " = " + std::to_string(ne) +
                                       " is zero or too large",
               at);
        return c.error();
      }
      t.dims.push_back(static_cast<std::int64_t>(ne));
      elements *= static_cast<std::int64_t>(ne);
    }
    t.ggml_type = c.read<std::uint32_t>("tensor type");
    t.offset = c.read<std::uint64_t>("tensor offset");
    if (c.failed()) return c.error();
    if (!kernels::ggml_type_traits(t.ggml_type)) {
      c.fail(ErrorCode::unsupported, "tensor '" + t.name + "': GGML " + kernels::ggml_type_name(t.ggml_type) +
                                         " is not a supported tensor type",
             at);
      return c.error();
    }
    const auto row = kernels::ggml_row_bytes(t.ggml_type, t.dims[0]);
    if (!row) {
      c.fail(ErrorCode::corrupt, "tensor '" + t.name + "': dim 0 = " + std::to_string(t.dims[0]) +
                                     " is not a multiple of " + kernels::ggml_type_name(t.ggml_type) + "'s block size",
             at);
      return c.error();
    }
    const std::int64_t rows = t.num_rows();
    if (*row != 0 && static_cast<std::uint64_t>(rows) > std::numeric_limits<std::size_t>::max() / *row) {
      c.fail(ErrorCode::corrupt, "tensor '" + t.name + "': size overflows", at);
      return c.error();
    }
    t.bytes = *row * static_cast<std::size_t>(rows);
    if (t.offset % f.alignment_ != 0) {
      c.fail(ErrorCode::corrupt, "tensor '" + t.name + "': offset " + std::to_string(t.offset) +
                                     " is not a multiple of the alignment " + std::to_string(f.alignment_),
             at);
      return c.error();
    }
    if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second) {
      c.fail(ErrorCode::corrupt, "tensor '" + t.name + "' appears twice", at);
      return c.error();
    }
    f.tensors_.push_back(std::move(t));
  }

  const std::size_t data_start = (c.offset() + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (data_start > file_size && !f.tensors_.empty())
    return file_error(ErrorCode::corrupt, "truncated: the tensor data section would start at byte " +
                                              std::to_string(data_start) + ", past the end (" +
                                              std::to_string(file_size) + " bytes)");
  std::vector<std::size_t> order(f.tensors_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
  std::uint64_t prev_end = 0;
  std::string prev_name;
  for (const std::size_t i : order) {
    TensorInfo& t = f.tensors_[i];
    const std::uint64_t begin = data_start + t.offset;
    if (t.offset > file_size || begin > file_size || t.bytes > file_size - begin)
      return file_error(ErrorCode::corrupt, "tensor '" + t.name + "': data [" + std::to_string(begin) + ", " +
                                                std::to_string(begin + t.bytes) + ") runs past the end of the file (" +
                                                std::to_string(file_size) + " bytes)");
    if (!prev_name.empty() && t.offset < prev_end)
      return file_error(ErrorCode::corrupt, "tensor '" + t.name + "' overlaps tensor '" + prev_name + "'");
    t.data = bytes + begin;
    prev_end = t.offset + t.bytes;
    prev_name = t.name;
  }
  return f;
}

Result<std::optional<std::filesystem::path>> find_gguf(const std::filesystem::path& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(model, ec)) {
    if (model.extension() == ".gguf") return std::optional<fs::path>(model);
    return std::optional<fs::path>();
  }
  if (!fs::is_directory(model, ec) || fs::exists(model / "config.json", ec)) return std::optional<fs::path>();
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(model, ec))
    if (entry.is_regular_file(ec) && entry.path().extension() == ".gguf") found.push_back(entry.path());
  if (found.empty()) return std::optional<fs::path>();
  if (found.size() > 1) {
    std::sort(found.begin(), found.end());
    std::string names;
    for (const auto& p : found) names += (names.empty() ? "" : ", ") + p.filename().string();
    return make_error(ErrorCode::invalid_argument, model.string() + " holds several GGUF files (" + names +
                                                       "): pass --model with the file to load");
  }
  return std::optional<fs::path>(found.front());
}

}  // namespace shardline::model::gguf
