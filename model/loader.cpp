#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "model/gguf/gguf_model.hpp"
#include "model/safetensors.hpp"
#include "model/weights.hpp"
#include "model/weights_internal.hpp"

namespace shardline::model {

// ---------------------------------------------------------------------------
// shared helpers (weights_internal.hpp)
// ---------------------------------------------------------------------------
namespace detail {

Result<void*> allocate_storage(ModelWeights& w, std::size_t bytes, const std::string& what) {
  std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kWeightAlignment - 1) /
                        kWeightAlignment * kWeightAlignment;
  void* p = std::aligned_alloc(kWeightAlignment, rounded);
  if (p == nullptr) {
    return make_error(ErrorCode::out_of_memory,
                      "cannot allocate " + std::to_string(bytes) + " bytes for " + what);
  }
  w.storage.emplace_back(p, [](void* q) { std::free(q); });
  return p;
}

Status check_storage_dtype(DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16) {
    return make_error(ErrorCode::invalid_argument,
                      std::string("weight storage dtype must be f32 or bf16, got ") +
                          dtype_name(dtype));
  }
  return {};
}

ModelWeights empty_weights(const ModelConfig& config, const LoadOptions& options) {
  int layers = config.num_hidden_layers;
  if (options.num_layers_override > 0 && options.num_layers_override < layers) layers = options.num_layers_override;
  ModelWeights w;
  w.config = config;
  w.config.num_hidden_layers = layers;
  w.dtype = options.dtype;
  w.layers.resize(static_cast<std::size_t>(layers));
  return w;
}

namespace {

constexpr std::size_t kParallelThreshold = 1 << 16;  // elements
constexpr std::size_t kChunk = 1 << 14;               // elements per OpenMP work item

template <class Fn>
void for_chunks(std::size_t n, Fn&& fn) {
  if (n < kParallelThreshold) {
    fn(std::size_t{0}, n);
    return;
  }
  const auto chunks = static_cast<std::int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::size_t b = static_cast<std::size_t>(c) * kChunk;
    fn(b, std::min(n, b + kChunk));
  }
}

[[nodiscard]] inline float load_f32(const std::byte* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
[[nodiscard]] inline std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

void convert_elements(const void* src_v, DType src_dtype, void* dst_v, DType dst_dtype,
                      std::size_t n) {
  const auto* src = static_cast<const std::byte*>(src_v);
  auto* dst = static_cast<std::byte*>(dst_v);
  if (src_dtype == dst_dtype) {
    const std::size_t es = dtype_size(src_dtype);
    for_chunks(n, [&](std::size_t b, std::size_t e) {
      std::memcpy(dst + b * es, src + b * es, (e - b) * es);
    });
    return;
  }
  const std::size_t ss = dtype_size(src_dtype);
  auto read = [src_dtype, src, ss](std::size_t i) -> float {
    const std::byte* p = src + i * ss;
    switch (src_dtype) {
      case DType::f32: return load_f32(p);
      case DType::f16: return f16_to_f32(load_u16(p));
      case DType::bf16: return bf16_to_f32(load_u16(p));
    }
    return 0.0f;
  };
  if (dst_dtype == DType::f32) {
    auto* out = reinterpret_cast<float*>(dst);
    for_chunks(n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) out[i] = read(i);
    });
  } else {  // bf16
    auto* out = reinterpret_cast<std::uint16_t*>(dst);
    for_chunks(n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) out[i] = f32_to_bf16(read(i));
    });
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------
// ModelWeights
// ---------------------------------------------------------------------------
std::size_t ModelWeights::total_bytes() const {
  auto vec_bytes = [](const Vector& v) -> std::size_t {
    return v.empty() ? 0 : static_cast<std::size_t>(v.size) * sizeof(float);
  };
  auto mat_bytes = [](const Matrix& m) -> std::size_t { return m.empty() ? 0 : m.bytes(); };
  std::size_t total = mat_bytes(embed_tokens) + vec_bytes(final_norm);
  if (lm_head.data != embed_tokens.data) total += mat_bytes(lm_head);
  for (const LayerWeights& l : layers) {
    total += vec_bytes(l.input_norm) + mat_bytes(l.qkv) + vec_bytes(l.qkv_bias) +
             vec_bytes(l.q_norm) + vec_bytes(l.k_norm) + mat_bytes(l.o_proj) +
             vec_bytes(l.post_attention_norm) + mat_bytes(l.gate_up) + mat_bytes(l.down_proj);
  }
  return total;
}

// ---------------------------------------------------------------------------
// safetensors loading
// ---------------------------------------------------------------------------
namespace {

using nlohmann::json;

/// All tensors of a model folder, over one file or several shards.
class TensorSource {
 public:
  [[nodiscard]] static Result<TensorSource> open(const std::filesystem::path& dir) {
    TensorSource src;
    const auto single = dir / "model.safetensors";
    const auto index = dir / "model.safetensors.index.json";
    std::error_code ec;
    if (std::filesystem::exists(single, ec)) {
      auto f = SafetensorsFile::open(single);
      if (!f.ok()) return std::move(f).error();
      src.files_.push_back(std::move(f).value());
      src.single_ = true;
      return src;
    }
    if (!std::filesystem::exists(index, ec)) {
      return make_error(ErrorCode::not_found, single.string() + ": file not found (nor " +
                                                  index.filename().string() + ")");
    }
    src.index_path_ = index;
    std::ifstream in(index, std::ios::binary);
    if (!in) return make_error(ErrorCode::io, index.string() + ": cannot open for reading");
    std::ostringstream ss;
    ss << in.rdbuf();
    json j;
    try {
      j = json::parse(ss.str());
    } catch (const json::exception& e) {
      return make_error(ErrorCode::corrupt, index.string() + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) {
      return make_error(ErrorCode::corrupt, index.string() + ": expected a JSON object");
    }
    const auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) {
      return make_error(ErrorCode::corrupt,
                        index.string() + ": field 'weight_map' missing or not an object");
    }
    std::map<std::string, std::size_t> shard_index;
    std::vector<std::string> shard_first_tensor;
    for (const auto& [name, file] : wm->items()) {
      if (!file.is_string() || file.get<std::string>().empty()) {
        return make_error(ErrorCode::corrupt, index.string() + ": weight_map entry for tensor '" +
                                                  name + "' is not a file name");
      }
      const std::string shard = file.get<std::string>();
      if (std::filesystem::path(shard).is_absolute()) {
        return make_error(ErrorCode::corrupt, index.string() + ": weight_map entry for tensor '" +
                                                  name + "' is an absolute path '" + shard + "'");
      }
      auto [it, inserted] = shard_index.emplace(shard, shard_index.size());
      if (inserted) shard_first_tensor.push_back(name);
      src.where_[name] = it->second;
    }
    src.files_.reserve(shard_index.size());
    std::vector<std::pair<std::size_t, std::string>> ordered;
    for (const auto& [shard, idx] : shard_index) ordered.emplace_back(idx, shard);
    std::sort(ordered.begin(), ordered.end());
    for (const auto& [idx, shard] : ordered) {
      auto f = SafetensorsFile::open(dir / shard);
      if (!f.ok()) {
        Error e = std::move(f).error();
        if (e.code == ErrorCode::not_found) {
          e.message += " (shard listed in " + index.filename().string() + " for tensor '" +
                       shard_first_tensor[idx] + "')";
        }
        return e;
      }
      src.files_.push_back(std::move(f).value());
    }
    return src;
  }

  /// The tensor `name` and the file holding it; not_found naming both otherwise.
  [[nodiscard]] Result<const TensorView*> get(const std::string& name,
                                              const SafetensorsFile** file) const {
    const SafetensorsFile* f = nullptr;
    if (single_) {
      f = &files_.front();
    } else {
      const auto it = where_.find(name);
      if (it == where_.end()) {
        return make_error(ErrorCode::not_found,
                          index_path_.string() + ": tensor '" + name + "' not in weight_map");
      }
      f = &files_[it->second];
    }
    const TensorView* t = f->find(name);
    if (t == nullptr) {
      return make_error(ErrorCode::not_found,
                        f->path().string() + ": tensor '" + name + "' not found");
    }
    *file = f;
    return t;
  }

 private:
  bool single_ = false;
  std::filesystem::path index_path_;
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, std::size_t> where_;
};

/// One output buffer: the row-wise concatenation of `parts`.
struct Piece {
  std::vector<const TensorView*> parts;
  bool is_matrix = false;  // matrix: storage dtype; vector: F32
  int rows = 0;            // vector: size
  int cols = 0;            // vector: 1
  std::string what;        // for allocation errors
  Matrix* matrix = nullptr;
  Vector* vector = nullptr;
};

class Planner {
 public:
  Planner(const TensorSource& src, const ModelConfig& cfg, const std::filesystem::path& dir)
      : src_(src), config_file_((dir / "config.json").string()) {}

  /// Looks up `name` and checks its shape.
  [[nodiscard]] Result<const TensorView*> need(const std::string& name,
                                               const std::vector<std::int64_t>& expected) {
    const SafetensorsFile* file = nullptr;
    auto t = src_.get(name, &file);
    if (!t.ok()) return std::move(t).error();
    const TensorView* v = t.value();
    if (v->shape != expected) {
      return make_error(ErrorCode::mismatch,
                        file->path().string() + ": tensor '" + name + "': shape " +
                            shape_string(v->shape) + " does not match " + config_file_ +
                            " (expected " + shape_string(expected) + ")");
    }
    return v;
  }

  [[nodiscard]] Status matrix(Matrix* out, const std::vector<std::string>& names,
                              const std::vector<std::vector<std::int64_t>>& shapes) {
    Piece p;
    p.is_matrix = true;
    p.matrix = out;
    p.cols = static_cast<int>(shapes.front()[1]);
    for (std::size_t i = 0; i < names.size(); ++i) {
      auto t = need(names[i], shapes[i]);
      if (!t.ok()) return std::move(t).error();
      p.parts.push_back(t.value());
      p.rows += static_cast<int>(shapes[i][0]);
    }
    p.what = names.front();
    pieces_.push_back(std::move(p));
    return {};
  }

  [[nodiscard]] Status vector(Vector* out, const std::vector<std::string>& names,
                              const std::vector<std::int64_t>& sizes) {
    Piece p;
    p.vector = out;
    p.cols = 1;
    for (std::size_t i = 0; i < names.size(); ++i) {
      auto t = need(names[i], {sizes[i]});
      if (!t.ok()) return std::move(t).error();
      p.parts.push_back(t.value());
      p.rows += static_cast<int>(sizes[i]);
    }
    p.what = names.front();
    pieces_.push_back(std::move(p));
    return {};
  }

  /// Allocates and converts every planned piece into `w`.
  [[nodiscard]] Status execute(ModelWeights& w) {
    for (Piece& p : pieces_) {
      const DType dt = p.is_matrix ? w.dtype : DType::f32;
      const std::size_t n = static_cast<std::size_t>(p.rows) * p.cols;
      auto buf = detail::allocate_storage(w, n * dtype_size(dt), p.what);
      if (!buf.ok()) return std::move(buf).error();
      auto* dst = static_cast<std::byte*>(buf.value());
      for (const TensorView* t : p.parts) {
        const auto count = static_cast<std::size_t>(t->numel());
        detail::convert_elements(t->data, t->dtype, dst, dt, count);
        dst += count * dtype_size(dt);
      }
      if (p.is_matrix) {
        *p.matrix = Matrix{dt, p.rows, p.cols, buf.value(), std::nullopt, {}};
      } else {
        *p.vector = Vector{p.rows, static_cast<const float*>(buf.value())};
      }
    }
    return {};
  }

 private:
  const TensorSource& src_;
  std::string config_file_;
  std::vector<Piece> pieces_;
};

}  // namespace

namespace {

/// load_model without LoadOptions::quantization: the matrices as stored
/// (converted to options.dtype, or a GGUF file's blocks kept).
Result<ModelWeights> load_model_as_stored(const std::filesystem::path& dir, const LoadOptions& options) {
  auto gguf_path = gguf::find_gguf(dir);
  if (!gguf_path.ok()) return gguf_path.error();
  if (gguf_path->has_value()) {
    auto file = gguf::GgufFile::open(**gguf_path);
    if (!file.ok()) return file.error();
    auto config = gguf::model_config(*file);
    if (!config.ok()) return config.error();
    if (options.format == LoadFormat::dummy) return make_dummy_weights(*config, options);
    return gguf::load_weights(*file, *config, options);
  }
  auto cfg_r = load_model_config(dir);
  if (!cfg_r.ok()) return std::move(cfg_r).error();
  ModelConfig cfg = std::move(cfg_r).value();
  if (options.format == LoadFormat::dummy) return make_dummy_weights(cfg, options);

  auto src_r = TensorSource::open(dir);
  if (!src_r.ok()) return std::move(src_r).error();
  const TensorSource& src = src_r.value();

  ModelWeights w = detail::empty_weights(cfg, options);
  const int layers = w.config.num_hidden_layers;

  const std::int64_t H = cfg.hidden_size;
  const std::int64_t I = cfg.intermediate_size;
  const std::int64_t V = cfg.vocab_size;
  const std::int64_t D = cfg.head_dim;
  const std::int64_t Q = static_cast<std::int64_t>(cfg.num_attention_heads) * D;
  const std::int64_t KV = static_cast<std::int64_t>(cfg.num_key_value_heads) * D;

  Planner plan(src, cfg, dir);
  Status s;
  if (s = plan.matrix(&w.embed_tokens, {"model.embed_tokens.weight"}, {{V, H}}); !s.ok())
    return s.error();
  for (int i = 0; i < layers; ++i) {
    LayerWeights& L = w.layers[static_cast<std::size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    if (s = plan.vector(&L.input_norm, {p + "input_layernorm.weight"}, {H}); !s.ok())
      return s.error();
    if (s = plan.matrix(&L.qkv, {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"},
                        {{Q, H}, {KV, H}, {KV, H}});
        !s.ok())
      return s.error();
    if (cfg.qkv_bias) {
      if (s = plan.vector(&L.qkv_bias, {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"},
                          {Q, KV, KV});
          !s.ok())
        return s.error();
    }
    if (cfg.qk_norm) {
      if (s = plan.vector(&L.q_norm, {a + "q_norm.weight"}, {D}); !s.ok()) return s.error();
      if (s = plan.vector(&L.k_norm, {a + "k_norm.weight"}, {D}); !s.ok()) return s.error();
    }
    if (s = plan.matrix(&L.o_proj, {a + "o_proj.weight"}, {{H, Q}}); !s.ok()) return s.error();
    if (s = plan.vector(&L.post_attention_norm, {p + "post_attention_layernorm.weight"}, {H});
        !s.ok())
      return s.error();
    if (s = plan.matrix(&L.gate_up, {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
                        {{I, H}, {I, H}});
        !s.ok())
      return s.error();
    if (s = plan.matrix(&L.down_proj, {p + "mlp.down_proj.weight"}, {{H, I}}); !s.ok())
      return s.error();
  }
  if (s = plan.vector(&w.final_norm, {"model.norm.weight"}, {H}); !s.ok()) return s.error();
  if (!cfg.tie_word_embeddings) {
    if (s = plan.matrix(&w.lm_head, {"lm_head.weight"}, {{V, H}}); !s.ok()) return s.error();
  }
  if (s = plan.execute(w); !s.ok()) return s.error();
  if (cfg.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

}  // namespace

Result<ModelWeights> load_model(const std::filesystem::path& dir, const LoadOptions& options) {
  if (Status s = detail::check_storage_dtype(options.dtype); !s.ok()) return s.error();
  if (!options.quantization) return load_model_as_stored(dir, options);
  // Quantize on load: from the source values widened to F32 exactly (F32,
  // BF16 and F16 all are), as llama-quantize quantizes a converted file.
  LoadOptions f32 = options;
  f32.dtype = DType::f32;
  f32.keep_quantized = false;
  f32.quantization.reset();
  auto dense = load_model_as_stored(dir, f32);
  if (!dense.ok()) return dense.error();
  return quantize_weights(std::move(dense).value(), *options.quantization, options.dtype);
}

}  // namespace shardline::model
