#include "model/gguf/gguf_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/dtype.hpp"
#include "kernels/cpu/ggml_quants.hpp"
#include "text/bpe_tokenizer.hpp"
#include "model/safetensors.hpp"
#include "model/weights_internal.hpp"

namespace shardline::model::gguf {

namespace {

using nlohmann::ordered_json;

[[nodiscard]] Error key_error(ErrorCode code, const GgufFile& f, const std::string& key, const std::string& what) {
  return make_error(code, f.path().string() + ": key '" + key + "' " + what);
}

/// The HF config.json fields model_config() writes, with the GGUF key each
/// comes from (to name the key in a validation error).
struct FieldKey {
  const char* field;
  std::string key;
};

}  // namespace

Result<ModelConfig> model_config(const GgufFile& f) {
  auto arch_r = f.get_string("general.architecture");
  if (!arch_r.ok()) return arch_r.error();
  if (!arch_r->has_value()) return key_error(ErrorCode::not_found, f, "general.architecture", "is missing");
  const std::string arch = **arch_r;
  std::string hf_class;
  if (arch == "llama") hf_class = "LlamaForCausalLM";
  else if (arch == "qwen2") hf_class = "Qwen2ForCausalLM";
  else if (arch == "qwen3") hf_class = "Qwen3ForCausalLM";
  else
    return key_error(ErrorCode::unsupported, f, "general.architecture",
                     "= '" + arch + "' is not supported (llama, qwen2, qwen3 are)");
  const std::string p = arch + ".";
  std::vector<FieldKey> fields;
  ordered_json c;
  c["architectures"] = {hf_class};
  c["model_type"] = arch;
  auto put_int = [&](const char* field, const std::string& key, bool required,
                     std::optional<std::int64_t> fallback = std::nullopt) -> Status {
    auto v = f.get_int(key);
    if (!v.ok()) return v.error();
    if (v->has_value()) {
      c[field] = **v;
    } else if (fallback) {
      c[field] = *fallback;
    } else if (required) {
      return key_error(ErrorCode::not_found, f, key, "is missing");
    } else {
      return {};
    }
    fields.push_back({field, key});
    return {};
  };
  Status s;
  if (s = put_int("hidden_size", p + "embedding_length", true); !s.ok()) return s.error();
  if (s = put_int("intermediate_size", p + "feed_forward_length", true); !s.ok()) return s.error();
  if (s = put_int("num_hidden_layers", p + "block_count", true); !s.ok()) return s.error();
  if (s = put_int("num_attention_heads", p + "attention.head_count", true); !s.ok()) return s.error();
  if (s = put_int("num_key_value_heads", p + "attention.head_count_kv", false, c["num_attention_heads"].get<std::int64_t>());
      !s.ok())
    return s.error();
  if (s = put_int("max_position_embeddings", p + "context_length", true); !s.ok()) return s.error();
  const std::int64_t heads = c["num_attention_heads"].get<std::int64_t>();
  const std::int64_t hidden = c["hidden_size"].get<std::int64_t>();
  if (s = put_int("head_dim", p + "attention.key_length", false, heads > 0 ? hidden / heads : 0); !s.ok())
    return s.error();
  const std::int64_t head_dim = c["head_dim"].get<std::int64_t>();
  if (auto v = f.get_int(p + "attention.value_length"); !v.ok()) {
    return v.error();
  } else if (v->has_value() && **v != head_dim) {
    return key_error(ErrorCode::unsupported, f, p + "attention.value_length",
                     "= " + std::to_string(**v) + " differs from the key length " + std::to_string(head_dim));
  }
  if (auto v = f.get_int(p + "rope.dimension_count"); !v.ok()) {
    return v.error();
  } else if (v->has_value() && **v != head_dim) {
    return key_error(ErrorCode::unsupported, f, p + "rope.dimension_count",
                     "= " + std::to_string(**v) + ": partial rotary embeddings are not supported (head_dim " +
                         std::to_string(head_dim) + ")");
  }
  // vocab: the key, else the token list's length.
  if (auto v = f.get_int(p + "vocab_size"); !v.ok()) {
    return v.error();
  } else if (v->has_value()) {
    c["vocab_size"] = **v;
    fields.push_back({"vocab_size", p + "vocab_size"});
  } else if (const Value* tokens = f.find("tokenizer.ggml.tokens"); tokens != nullptr) {
    c["vocab_size"] = static_cast<std::int64_t>(tokens->elements.size());
    fields.push_back({"vocab_size", "tokenizer.ggml.tokens"});
  } else if (const TensorInfo* e = f.find_tensor("token_embd.weight"); e != nullptr && e->dims.size() == 2) {
    c["vocab_size"] = e->dims[1];
  } else {
    return key_error(ErrorCode::not_found, f, p + "vocab_size", "is missing (and so are tokenizer.ggml.tokens)");
  }
  auto eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.error();
  if (!eps->has_value()) return key_error(ErrorCode::not_found, f, p + "attention.layer_norm_rms_epsilon", "is missing");
  c["rms_norm_eps"] = static_cast<float>(**eps);  // stored as float32 in GGUF
  fields.push_back({"rms_norm_eps", p + "attention.layer_norm_rms_epsilon"});
  auto theta = f.get_float(p + "rope.freq_base");
  if (!theta.ok()) return theta.error();
  c["rope_theta"] = theta->value_or(10000.0);
  fields.push_back({"rope_theta", p + "rope.freq_base"});
  // RoPE scaling, as llama.cpp reads it: `rope_freqs.weight` ([head_dim /
  // 2] divisors: its converter's form of llama3 scaling) and
  // `rope.scaling.type` linear (every frequency divided by
  // `rope.scaling.factor`); yarn and the rest are refused.
  std::vector<float> freq_factors;
  auto scaling_type = f.get_string(p + "rope.scaling.type");
  if (!scaling_type.ok()) return scaling_type.error();
  const std::string scaling = scaling_type->value_or("none");
  if (scaling == "linear") {
    auto factor = f.get_float(p + "rope.scaling.factor");
    if (!factor.ok()) return factor.error();
    if (!factor->has_value() || !(**factor > 0))
      return key_error(ErrorCode::invalid_argument, f, p + "rope.scaling.factor",
                       "must be a positive number for linear scaling");
    freq_factors.assign(static_cast<std::size_t>(head_dim / 2), static_cast<float>(**factor));
  } else if (scaling != "none") {
    return key_error(ErrorCode::unsupported, f, p + "rope.scaling.type",
                     "= '" + scaling + "' is not supported (none, linear, and llama3 as a rope_freqs tensor are)");
  }
  if (const TensorInfo* rf = f.find_tensor("rope_freqs.weight"); rf != nullptr) {
    auto tensor_error = [&](const std::string& what) {
      return make_error(ErrorCode::mismatch, f.path().string() + ": tensor 'rope_freqs.weight' " + what);
    };
    if (!freq_factors.empty()) return tensor_error("and rope.scaling.type linear both scale RoPE");
    if (rf->dims.size() != 1 || rf->dims[0] != head_dim / 2)
      return tensor_error("must have head_dim / 2 = " + std::to_string(head_dim / 2) + " elements");
    freq_factors.resize(static_cast<std::size_t>(head_dim / 2));
    if (Status st = kernels::dequantize_row(static_cast<kernels::GgmlType>(rf->ggml_type), rf->data,
                                            freq_factors.data(), head_dim / 2);
        !st.ok())
      return st.error();
    for (const float x : freq_factors)
      if (!(x > 0) || !std::isfinite(x)) return tensor_error("holds " + std::to_string(x) + ", not a positive factor");
  }
  c["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  if (arch == "llama") c["attention_bias"] = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  if (auto b = f.get_int("tokenizer.ggml.bos_token_id"); !b.ok()) {
    return b.error();
  } else if (b->has_value()) {
    c["bos_token_id"] = **b;
    fields.push_back({"bos_token_id", "tokenizer.ggml.bos_token_id"});
  }
  // Stop ids: EOS, and EOT where the file names a different one (llama.cpp
  // ends generation at either).
  ordered_json eos = ordered_json::array();
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    auto e = f.get_int(key);
    if (!e.ok()) return e.error();
    if (e->has_value() && std::find(eos.begin(), eos.end(), **e) == eos.end()) eos.push_back(**e);
  }
  if (!eos.empty()) c["eos_token_id"] = eos;
  const std::string source = f.path().string() + " metadata";
  auto cfg = parse_model_config(c.dump(), "", source);
  if (!cfg.ok()) {
    Error e = cfg.error();
    for (const FieldKey& fk : fields)
      if (e.message.find(fk.field) != std::string::npos) {
        e.message += " (GGUF key '" + fk.key + "')";
        break;
      }
    return e;
  }
  cfg->rope_freq_factors = std::move(freq_factors);
  return cfg;
}

// ---------------------------------------------------------------------------
// weights
// ---------------------------------------------------------------------------
namespace {

/// The GGUF row that holds Hugging Face row `r` of a q or k projection
/// (rows, or bias elements) that llama.cpp permuted over heads of `head_dim`
/// rows: HF row (h, j, i), j the half and i the pair, is GGUF row (h, i, j)
/// (the inverse of convert_hf_to_gguf.py's LlamaModel.permute).
[[nodiscard]] std::int64_t unpermuted_source_row(std::int64_t r, std::int64_t head_dim) {
  const std::int64_t h = r / head_dim, rem = r % head_dim, half = head_dim / 2;
  return h * head_dim + 2 * (rem % half) + rem / half;
}

/// One destination buffer: the rows of several tensors stacked.
struct Part {
  const TensorInfo* tensor = nullptr;
  int permute_heads = 0;  ///< >0: undo llama.cpp's q/k row permutation over this many heads
};

class WeightPlanner {
 public:
  WeightPlanner(const GgufFile& f, ModelWeights& w, bool keep_quantized)
      : f_(f), w_(w), keep_quantized_(keep_quantized) {}

  /// Looks up `name` and checks it is [rows, cols] (GGUF dims {cols, rows},
  /// or {rows} for a vector when cols == 0).
  Result<const TensorInfo*> need(const std::string& name, std::int64_t rows, std::int64_t cols) {
    const TensorInfo* t = f_.find_tensor(name);
    if (t == nullptr)
      return make_error(ErrorCode::not_found, f_.path().string() + ": tensor '" + name + "' not found");
    const std::vector<std::int64_t> want = cols == 0 ? std::vector<std::int64_t>{rows} : std::vector<std::int64_t>{cols, rows};
    if (t->dims != want) {
      std::vector<std::int64_t> got(t->dims.rbegin(), t->dims.rend()), expect(want.rbegin(), want.rend());
      return make_error(ErrorCode::mismatch, f_.path().string() + ": tensor '" + name + "': shape " +
                                                 shape_string(got) + " does not match the hyper-parameters (expected " +
                                                 shape_string(expect) + ")");
    }
    const auto traits = kernels::ggml_type_traits(t->ggml_type);
    if (!traits || !traits->can_dequantize)
      return make_error(ErrorCode::unsupported, f_.path().string() + ": tensor '" + name + "': GGML " +
                                                    kernels::ggml_type_name(t->ggml_type) + " cannot be dequantized");
    return t;
  }

  /// Dequantizes `parts` (each [rows_i, cols]) stacked by rows into a new
  /// buffer of `dtype`.
  Result<void*> fill(const std::vector<Part>& parts, std::int64_t cols, DType dtype, const std::string& what) {
    std::int64_t rows = 0;
    for (const Part& p : parts) rows += p.tensor->num_rows();
    auto buf = detail::allocate_storage(w_, static_cast<std::size_t>(rows * cols) * dtype_size(dtype), what);
    if (!buf.ok()) return buf.error();
    auto* dst = static_cast<std::byte*>(buf.value());
    for (const Part& p : parts) {
      const TensorInfo& t = *p.tensor;
      const std::int64_t n = t.num_rows();
      const std::size_t row_bytes = t.bytes / static_cast<std::size_t>(n);
      const std::int64_t head_dim = p.permute_heads > 0 ? n / p.permute_heads : 0;
      bool failed = false;
#pragma omp parallel
      {
        std::vector<float> row(static_cast<std::size_t>(cols));  // [cols] F32
#pragma omp for schedule(static)
        for (std::int64_t r = 0; r < n; ++r) {
          const std::int64_t src = head_dim > 0 ? unpermuted_source_row(r, head_dim) : r;
          if (!kernels::dequantize_row(static_cast<kernels::GgmlType>(t.ggml_type),
                                       t.data + static_cast<std::size_t>(src) * row_bytes, row.data(), cols)
                   .ok()) {
#pragma omp atomic write
            failed = true;
            continue;
          }
          std::byte* out = dst + static_cast<std::size_t>(r * cols) * dtype_size(dtype);
          if (dtype == DType::f32) {
            std::memcpy(out, row.data(), static_cast<std::size_t>(cols) * 4);
          } else {
            auto* o = reinterpret_cast<std::uint16_t*>(out);
            for (std::int64_t k = 0; k < cols; ++k) o[k] = f32_to_bf16(row[static_cast<std::size_t>(k)]);
          }
        }
      }
      if (failed)
        return make_error(ErrorCode::internal, f_.path().string() + ": tensor '" + t.name + "' failed to dequantize");
      dst += static_cast<std::size_t>(n * cols) * dtype_size(dtype);
    }
    return buf.value();
  }

  /// Copies `parts` (each [rows_i, cols], quantized, each in its own type)
  /// stacked by rows, block bytes as they are (rows unpermuted).
  Result<void*> copy_blocks(const std::vector<Part>& parts, std::int64_t cols, const std::string& what) {
    std::size_t total = 0;
    for (const Part& p : parts)
      total += static_cast<std::size_t>(p.tensor->num_rows()) * *kernels::ggml_row_bytes(p.tensor->ggml_type, cols);
    auto buf = detail::allocate_storage(w_, total, what);
    if (!buf.ok()) return buf.error();
    auto* dst = static_cast<std::byte*>(buf.value());
    for (const Part& p : parts) {
      const std::size_t row_bytes = *kernels::ggml_row_bytes(p.tensor->ggml_type, cols);
      const std::int64_t n = p.tensor->num_rows();
      const std::int64_t head_dim = p.permute_heads > 0 ? n / p.permute_heads : 0;
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t src = head_dim > 0 ? unpermuted_source_row(r, head_dim) : r;
        std::memcpy(dst + static_cast<std::size_t>(r) * row_bytes, p.tensor->data + static_cast<std::size_t>(src) * row_bytes,
                    row_bytes);
      }
      dst += static_cast<std::size_t>(n) * row_bytes;
    }
    return buf.value();
  }

  Status matrix(Matrix* out, const std::vector<std::string>& names, const std::vector<std::int64_t>& rows,
                std::int64_t cols, const std::vector<int>& permute_heads = {}) {
    std::vector<Part> parts;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < names.size(); ++i) {
      auto t = need(names[i], rows[i], cols);
      if (!t.ok()) return t.error();
      parts.push_back({t.value(), i < permute_heads.size() ? permute_heads[i] : 0});
      total += rows[i];
    }
    // --dtype auto: tensors of the types the CPU computes on quantized stay
    // as the file's blocks; a fused matrix whose parts differ in type (a
    // Q4_K_M file's Q6_K attn_v beside Q4_K q and k) keeps each part's
    // type as a run of rows.
    bool keep = keep_quantized_;
    std::vector<QuantRows> runs;
    for (const Part& p : parts) {
      const auto type = static_cast<kernels::GgmlType>(p.tensor->ggml_type);
      keep = keep && matrix_stays_quantized(type);
      if (!runs.empty() && runs.back().type == type)
        runs.back().rows += static_cast<int>(p.tensor->num_rows());
      else
        runs.push_back({static_cast<int>(p.tensor->num_rows()), type});
    }
    if (keep) {
      auto blocks = copy_blocks(parts, cols, names.front());
      if (!blocks.ok()) return blocks.error();
      *out = Matrix{w_.dtype, static_cast<int>(total), static_cast<int>(cols), blocks.value(), std::nullopt, {}};
      if (runs.size() == 1)
        out->quant = runs.front().type;
      else
        out->mixed = std::move(runs);
      return {};
    }
    auto buf = fill(parts, cols, w_.dtype, names.front());
    if (!buf.ok()) return buf.error();
    *out = Matrix{w_.dtype, static_cast<int>(total), static_cast<int>(cols), buf.value(), std::nullopt, {}};
    return {};
  }

  Status vector(Vector* out, const std::vector<std::string>& names, const std::vector<std::int64_t>& sizes,
                const std::vector<int>& permute_heads = {}) {
    std::vector<Part> parts;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < names.size(); ++i) {
      auto t = need(names[i], sizes[i], 0);
      if (!t.ok()) return t.error();
      parts.push_back({t.value(), i < permute_heads.size() ? permute_heads[i] : 0});
      total += sizes[i];
    }
    // A vector is one "row" per element for the permutation: dequantize it
    // whole, then reorder.
    std::vector<float> all;
    for (const Part& p : parts) {
      std::vector<float> v(static_cast<std::size_t>(p.tensor->num_elements()));
      if (Status s = kernels::dequantize_row(static_cast<kernels::GgmlType>(p.tensor->ggml_type), p.tensor->data,
                                             v.data(), p.tensor->num_elements());
          !s.ok())
        return make_error(s.error().code, f_.path().string() + ": tensor '" + p.tensor->name + "': " + s.error().message);
      if (p.permute_heads > 0) {
        const std::int64_t n = static_cast<std::int64_t>(v.size()), head_dim = n / p.permute_heads;
        std::vector<float> u(v.size());
        for (std::int64_t r = 0; r < n; ++r)
          u[static_cast<std::size_t>(r)] = v[static_cast<std::size_t>(unpermuted_source_row(r, head_dim))];
        v.swap(u);
      }
      all.insert(all.end(), v.begin(), v.end());
    }
    auto buf = detail::allocate_storage(w_, all.size() * sizeof(float), names.front());
    if (!buf.ok()) return buf.error();
    std::memcpy(buf.value(), all.data(), all.size() * sizeof(float));
    *out = Vector{static_cast<int>(total), static_cast<const float*>(buf.value())};
    return {};
  }

 private:
  const GgufFile& f_;
  ModelWeights& w_;
  bool keep_quantized_ = false;  ///< LoadOptions::keep_quantized
};

}  // namespace

Result<ModelWeights> load_weights(const GgufFile& f, const ModelConfig& cfg, const LoadOptions& options) {
  if (Status s = detail::check_storage_dtype(options.dtype); !s.ok()) return s.error();
  ModelWeights w = detail::empty_weights(cfg, options);
  const int layers = w.config.num_hidden_layers;
  const std::int64_t H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size, D = cfg.head_dim;
  const std::int64_t Q = static_cast<std::int64_t>(cfg.num_attention_heads) * D;
  const std::int64_t KV = static_cast<std::int64_t>(cfg.num_key_value_heads) * D;
  // llama.cpp permutes llama's q and k rows (not qwen2's or qwen3's).
  const bool permuted = cfg.arch == Architecture::llama;
  const std::vector<int> qk_heads =
      permuted ? std::vector<int>{cfg.num_attention_heads, cfg.num_key_value_heads, 0} : std::vector<int>{};

  WeightPlanner plan(f, w, options.keep_quantized);
  Status s;
  if (s = plan.matrix(&w.embed_tokens, {"token_embd.weight"}, {V}, H); !s.ok()) return s.error();
  for (int i = 0; i < layers; ++i) {
    LayerWeights& L = w.layers[static_cast<std::size_t>(i)];
    const std::string b = "blk." + std::to_string(i) + ".";
    if (s = plan.vector(&L.input_norm, {b + "attn_norm.weight"}, {H}); !s.ok()) return s.error();
    if (s = plan.matrix(&L.qkv, {b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"}, {Q, KV, KV}, H,
                        qk_heads);
        !s.ok())
      return s.error();
    if (cfg.qkv_bias) {
      if (s = plan.vector(&L.qkv_bias, {b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"}, {Q, KV, KV},
                          qk_heads);
          !s.ok())
        return s.error();
    }
    if (cfg.qk_norm) {
      if (s = plan.vector(&L.q_norm, {b + "attn_q_norm.weight"}, {D}); !s.ok()) return s.error();
      if (s = plan.vector(&L.k_norm, {b + "attn_k_norm.weight"}, {D}); !s.ok()) return s.error();
    }
    if (s = plan.matrix(&L.o_proj, {b + "attn_output.weight"}, {H}, Q); !s.ok()) return s.error();
    if (s = plan.vector(&L.post_attention_norm, {b + "ffn_norm.weight"}, {H}); !s.ok()) return s.error();
    if (s = plan.matrix(&L.gate_up, {b + "ffn_gate.weight", b + "ffn_up.weight"}, {I, I}, H); !s.ok())
      return s.error();
    if (s = plan.matrix(&L.down_proj, {b + "ffn_down.weight"}, {H}, I); !s.ok()) return s.error();
  }
  if (s = plan.vector(&w.final_norm, {"output_norm.weight"}, {H}); !s.ok()) return s.error();
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else if (s = plan.matrix(&w.lm_head, {"output.weight"}, {V}, H); !s.ok()) {
    return s.error();
  }
  return w;
}

// ---------------------------------------------------------------------------
// tokenizer and chat template
// ---------------------------------------------------------------------------
namespace {

// llama.cpp's regexes (llama-vocab.cpp, `llama_vocab::impl::load` -> the
// pre-tokenizer's regex_exprs), by `tokenizer.ggml.pre` name.
const std::string kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const std::string kLlama3Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::string kQwen2Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr int kTokenControl = 3;      // llama_token_type CONTROL
constexpr int kTokenUserDefined = 4;  // USER_DEFINED

}  // namespace

std::optional<std::vector<std::string>> pre_tokenizer_regexes(const std::string& name) {
  for (const char* n : {"gpt-2", "mpt", "olmo", "jais"})
    if (name == n) return std::vector<std::string>{kGpt2Regex};
  for (const char* n : {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"})
    if (name == n) return std::vector<std::string>{"\\p{N}", kGpt2Regex};
  for (const char* n : {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "smaug-bpe"})
    if (name == n) return std::vector<std::string>{kLlama3Regex};
  for (const char* n : {"qwen2", "stablelm2", "deepseek-r1-qwen"})
    if (name == n) return std::vector<std::string>{kQwen2Regex};
  return std::nullopt;
}

namespace {

constexpr int kTokenUnknown = 2;  // llama_token_type UNKNOWN

/// The vocabulary keys every tokenizer model has: tokens and token types.
struct GgufVocab {
  std::vector<std::string> tokens;
  std::vector<std::int64_t> types;  ///< empty, or one per token
};

Result<GgufVocab> read_vocab(const GgufFile& f) {
  GgufVocab v;
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.error();
  if (!tokens->has_value()) return key_error(ErrorCode::not_found, f, "tokenizer.ggml.tokens", "is missing");
  v.tokens = std::move(**tokens);
  if (const Value* tt = f.find("tokenizer.ggml.token_type"); tt != nullptr) {
    if (tt->type != ValueType::array || !(tt->elements.empty() || tt->elements.front().is_integer()))
      return key_error(ErrorCode::mismatch, f, "tokenizer.ggml.token_type", "is not an array of integers");
    if (tt->elements.size() != v.tokens.size())
      return key_error(ErrorCode::mismatch, f, "tokenizer.ggml.token_type",
                       "has " + std::to_string(tt->elements.size()) + " entries for " +
                           std::to_string(v.tokens.size()) + " tokens");
    for (const Value& e : tt->elements) v.types.push_back(e.int_value);
  }
  return v;
}

/// token -> id as a std::map-backed object (nlohmann::json's insertion-
/// ordered object made this quadratic in the vocab: 8 s for SmolLM2's
/// 49,152 tokens); the first id of a repeated token. And the added tokens:
/// the types in `special_types` special, USER_DEFINED ones plain.
void vocab_json(const GgufVocab& v, std::initializer_list<int> special_types, nlohmann::json& vocab,
                nlohmann::json& added) {
  vocab = nlohmann::json::object();
  added = nlohmann::json::array();
  for (std::size_t id = 0; id < v.tokens.size(); ++id) {
    const std::string& tok = v.tokens[id];
    if (!vocab.contains(tok)) vocab[tok] = id;
    const std::int64_t type = id < v.types.size() ? v.types[id] : 1;
    const bool special = std::find(special_types.begin(), special_types.end(), type) != special_types.end();
    if (special || type == kTokenUserDefined)
      added.push_back({{"id", id},
                       {"content", tok},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", special}});
  }
}

nlohmann::json bpe_model(nlohmann::json vocab, nlohmann::json merges, const nlohmann::json& unk_token,
                         bool byte_fallback) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", unk_token},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", byte_fallback},
          {"byte_fallback", byte_fallback},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

nlohmann::json tokenizer_doc(nlohmann::json added, nlohmann::json normalizer, nlohmann::json pre_tokenizer,
                             nlohmann::json decoder, nlohmann::json model) {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added)},
          {"normalizer", std::move(normalizer)},
          {"pre_tokenizer", std::move(pre_tokenizer)},
          {"post_processor", nullptr},
          {"decoder", std::move(decoder)},
          {"model", std::move(model)}};
}

Result<std::string> gpt2_tokenizer_json(const GgufFile& f) {
  auto pre = f.get_string("tokenizer.ggml.pre");
  if (!pre.ok()) return pre.error();
  const std::string pre_name = pre->value_or("default");
  const auto regexes = pre_tokenizer_regexes(pre_name);
  if (!regexes)
    return key_error(ErrorCode::unsupported, f, "tokenizer.ggml.pre",
                     "= '" + pre_name + "' is not a pre-tokenizer this build maps to llama.cpp's regexes");
  auto v = read_vocab(f);
  if (!v.ok()) return v.error();
  auto merges = f.get_string_array("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.error();
  if (!merges->has_value()) return key_error(ErrorCode::not_found, f, "tokenizer.ggml.merges", "is missing");
  nlohmann::json vocab, added;
  vocab_json(*v, {kTokenControl}, vocab, added);
  nlohmann::json splits = nlohmann::json::array();
  for (const std::string& re : *regexes)
    splits.push_back({{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}});
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  splits.push_back(byte_level);
  return tokenizer_doc(std::move(added), nullptr, {{"type", "Sequence"}, {"pretokenizers", splits}}, byte_level,
                       bpe_model(std::move(vocab), std::move(**merges), nullptr, /*byte_fallback=*/false))
      .dump();
}

/// Byte offsets of the code point boundaries inside `s` (1..size-1): a
/// Python string's split points, as generate_merges slices tokens.
std::vector<std::size_t> inner_boundaries(const std::string& s) {
  std::vector<std::size_t> out;
  for (std::size_t i = 1; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  return out;
}

std::size_t num_code_points(std::string_view s) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> merges_from_scores(const std::vector<std::string>& tokens,
                                                                    const std::vector<double>& scores) {
  // transformers' generate_merges(vocab, vocab_scores): vocab = {token: id}
  // (a repeated token keeps its last id), vocab_scores = dict(zip(tokens,
  // scores)) (first position, last score); each token's splits into two
  // vocab tokens sorted by (left id, right id), then all stably sorted by
  // (score, left length, right length), highest first.
  std::unordered_map<std::string, std::int64_t> vocab;
  std::unordered_map<std::string, double> score_of;
  std::vector<const std::string*> order;
  vocab.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    vocab[tokens[i]] = static_cast<std::int64_t>(i);
    if (score_of.insert_or_assign(tokens[i], scores[i]).second) order.push_back(&tokens[i]);
  }
  struct Candidate {
    std::string left, right;
    double score;
    std::size_t left_len, right_len;
  };
  std::vector<Candidate> all;
  std::vector<Candidate> local;
  for (const std::string* tok : order) {
    local.clear();
    for (const std::size_t cut : inner_boundaries(*tok)) {
      std::string left = tok->substr(0, cut), right = tok->substr(cut);
      if (vocab.contains(left) && vocab.contains(right))
        local.push_back({std::move(left), std::move(right), score_of[*tok], 0, 0});
    }
    std::stable_sort(local.begin(), local.end(), [&](const Candidate& a, const Candidate& b) {
      const auto ka = std::pair(vocab[a.left], vocab[a.right]), kb = std::pair(vocab[b.left], vocab[b.right]);
      return ka < kb;
    });
    for (Candidate& c : local) {
      c.left_len = num_code_points(c.left);
      c.right_len = num_code_points(c.right);
      all.push_back(std::move(c));
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return std::tuple(a.score, a.left_len, a.right_len) > std::tuple(b.score, b.left_len, b.right_len);
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(all.size());
  for (Candidate& c : all) out.emplace_back(std::move(c.left), std::move(c.right));
  return out;
}

namespace {

Result<std::string> llama_tokenizer_json(const GgufFile& f) {
  auto v = read_vocab(f);
  if (!v.ok()) return v.error();
  nlohmann::json merges = nlohmann::json::array();
  auto file_merges = f.get_string_array("tokenizer.ggml.merges");
  if (!file_merges.ok()) return file_merges.error();
  if (file_merges->has_value()) {
    for (const std::string& m : **file_merges) {
      const auto sp = m.find(' ');
      if (sp == std::string::npos)
        return key_error(ErrorCode::corrupt, f, "tokenizer.ggml.merges", "holds '" + m + "', not 'LEFT RIGHT'");
      merges.push_back({m.substr(0, sp), m.substr(sp + 1)});
    }
  } else {
    const Value* sc = f.find("tokenizer.ggml.scores");
    if (sc == nullptr)
      return key_error(ErrorCode::not_found, f, "tokenizer.ggml.scores",
                       "is missing (a llama vocabulary without merges needs its scores)");
    if (sc->type != ValueType::array || !(sc->elements.empty() || sc->elements.front().is_float()))
      return key_error(ErrorCode::mismatch, f, "tokenizer.ggml.scores", "is not an array of floats");
    if (sc->elements.size() != v->tokens.size())
      return key_error(ErrorCode::mismatch, f, "tokenizer.ggml.scores",
                       "has " + std::to_string(sc->elements.size()) + " entries for " +
                           std::to_string(v->tokens.size()) + " tokens");
    std::vector<double> scores;
    scores.reserve(sc->elements.size());
    for (const Value& e : sc->elements) scores.push_back(e.float_value);
    for (auto& [left, right] : merges_from_scores(v->tokens, scores))
      merges.push_back({std::move(left), std::move(right)});
  }
  nlohmann::json unk = nullptr;
  auto unk_id = f.get_int("tokenizer.ggml.unknown_token_id");
  if (!unk_id.ok()) return unk_id.error();
  if (unk_id->has_value()) {
    if (**unk_id < 0 || static_cast<std::size_t>(**unk_id) >= v->tokens.size())
      return key_error(ErrorCode::corrupt, f, "tokenizer.ggml.unknown_token_id",
                       "= " + std::to_string(**unk_id) + " is not a token id");
    unk = v->tokens[static_cast<std::size_t>(**unk_id)];
  }
  auto add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix");
  if (!add_space_prefix.ok()) return add_space_prefix.error();
  const bool prefix = add_space_prefix->value_or(true);
  nlohmann::json vocab, added;
  vocab_json(*v, {kTokenControl, kTokenUnknown}, vocab, added);
  // llama.cpp's SPM tokenizer (llm_tokenizer_spm): a space before each run
  // of text when add_space_prefix (at the start and after a special token,
  // whether or not the text starts with one, as SentencePiece's
  // add_dummy_prefix), spaces as U+2581; unknown characters as <0xNN>.
  nlohmann::json normalizers = nlohmann::json::array();
  if (prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
  nlohmann::json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                             {{"type", "ByteFallback"}},
                             {{"type", "Fuse"}}};
  if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  return tokenizer_doc(std::move(added), {{"type", "Sequence"}, {"normalizers", normalizers}}, nullptr,
                       {{"type", "Sequence"}, {"decoders", decoders}},
                       bpe_model(std::move(vocab), std::move(merges), unk, /*byte_fallback=*/true))
      .dump();
}

}  // namespace

Result<std::string> tokenizer_json(const GgufFile& f) {
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model.ok()) return model.error();
  if (!model->has_value()) return key_error(ErrorCode::not_found, f, "tokenizer.ggml.model", "is missing");
  if (**model == "gpt2") return gpt2_tokenizer_json(f);
  if (**model == "llama") return llama_tokenizer_json(f);
  return key_error(ErrorCode::unsupported, f, "tokenizer.ggml.model",
                   "= '" + **model + "' is not supported (gpt2, byte-level BPE, and llama, SentencePiece-style BPE, are)");
}

Result<std::vector<std::pair<std::string, std::string>>> special_token_texts(const GgufFile& f) {
  std::vector<std::pair<std::string, std::string>> out;
  const Value* tokens = f.find("tokenizer.ggml.tokens");
  for (const auto& [name, key] : std::vector<std::pair<std::string, std::string>>{
           {"bos_token", "tokenizer.ggml.bos_token_id"},
           {"eos_token", "tokenizer.ggml.eos_token_id"},
           {"unk_token", "tokenizer.ggml.unknown_token_id"},
           {"pad_token", "tokenizer.ggml.padding_token_id"}}) {
    auto id = f.get_int(key);
    if (!id.ok()) return id.error();
    if (!id->has_value()) continue;
    if (tokens == nullptr || **id < 0 || static_cast<std::size_t>(**id) >= tokens->elements.size())
      return key_error(ErrorCode::corrupt, f, key, "= " + std::to_string(**id) + " is not a token id");
    out.emplace_back(name, tokens->elements[static_cast<std::size_t>(**id)].string_value);
  }
  return out;
}

Result<std::unique_ptr<text::Tokenizer>> load_tokenizer(const GgufFile& f) {
  auto text = tokenizer_json(f);
  if (!text.ok()) return text.error();
  auto specials = special_token_texts(f);
  if (!specials.ok()) return specials.error();
  std::string bos, eos;
  for (const auto& [name, token] : *specials) {
    if (name == "bos_token") bos = token;
    if (name == "eos_token") eos = token;
  }
  auto add_bos = f.get_bool("tokenizer.ggml.add_bos_token");
  if (!add_bos.ok()) return add_bos.error();
  if (auto add_eos = f.get_bool("tokenizer.ggml.add_eos_token"); !add_eos.ok()) {
    return add_eos.error();
  } else if (add_eos->value_or(false)) {
    return key_error(ErrorCode::unsupported, f, "tokenizer.ggml.add_eos_token", "= true is not supported");
  }
  auto t = text::BpeTokenizer::load_json(*text, f.path().string() + " tokenizer metadata", add_bos->value_or(false), bos, eos);
  if (!t.ok()) return t.error();
  return std::unique_ptr<text::Tokenizer>(std::move(t).value());
}

Result<std::optional<std::string>> chat_template(const GgufFile& f) { return f.get_string("tokenizer.chat_template"); }

}  // namespace shardline::model::gguf
