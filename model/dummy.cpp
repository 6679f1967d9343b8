// Seeded random ("dummy") weights with a config's shapes, for benchmarking
// model shapes whose real weights are not available.
//
// Element j of tensor t is a pure function of (seed, t, j): a splitmix64
// stream keyed by (seed, t) gives one 64-bit word per pair of elements, whose
// two 24-bit halves become two uniforms in [-a, a). The result is therefore
// independent of thread count and of num_layers_override (layer i always has
// the same values).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "model/weights.hpp"
#include "model/weights_internal.hpp"

namespace shardline::model {

namespace {

constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ull;

[[nodiscard]] inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Tensor ids (stable across layer overrides).
constexpr std::uint64_t kEmbedId = 0;
constexpr std::uint64_t kLmHeadId = 1;
[[nodiscard]] constexpr std::uint64_t layer_id(int layer, int slot) {
  return 16 + static_cast<std::uint64_t>(layer) * 8 + static_cast<std::uint64_t>(slot);
}
enum Slot { kQkv = 0, kQkvBias = 1, kOProj = 2, kGateUp = 3, kDown = 4 };

constexpr float kBiasRange = 0.02f;

/// Fills `n` elements of `dst` (f32 or bf16) with uniforms in [-a, a).
void fill_uniform(void* dst, DType dtype, std::size_t n, std::uint64_t seed, std::uint64_t tensor,
                  float a) {
  const std::uint64_t key = mix64(mix64(seed + kGamma) ^ (tensor * 0xD1B54A32D192ED03ull + 1));
  const float scale = 2.0f * a / 16777216.0f;  // 2a / 2^24
  const std::size_t pairs = (n + 1) / 2;
  constexpr std::size_t kChunkPairs = 1 << 13;
  const auto chunks = static_cast<std::int64_t>((pairs + kChunkPairs - 1) / kChunkPairs);
  float* f32 = dtype == DType::f32 ? static_cast<float*>(dst) : nullptr;
  auto* b16 = dtype == DType::bf16 ? static_cast<std::uint16_t*>(dst) : nullptr;
#pragma omp parallel for schedule(static) if (chunks > 4)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::size_t pb = static_cast<std::size_t>(c) * kChunkPairs;
    const std::size_t pe = std::min(pairs, pb + kChunkPairs);
    for (std::size_t p = pb; p < pe; ++p) {
      const std::uint64_t r = mix64(key + (p + 1) * kGamma);
      const float v0 = static_cast<float>(r >> 40) * scale - a;
      const float v1 = static_cast<float>((r >> 8) & 0xFFFFFFull) * scale - a;
      const std::size_t j = 2 * p;
      if (f32 != nullptr) {
        f32[j] = v0;
        if (j + 1 < n) f32[j + 1] = v1;
      } else {
        b16[j] = f32_to_bf16(v0);
        if (j + 1 < n) b16[j + 1] = f32_to_bf16(v1);
      }
    }
  }
}

struct Maker {
  ModelWeights& w;
  std::uint64_t seed;

  [[nodiscard]] Result<Matrix> matrix(int rows, int cols, std::uint64_t id, const std::string& what) {
    const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    auto buf = detail::allocate_storage(w, n * dtype_size(w.dtype), what);
    if (!buf.ok()) return std::move(buf).error();
    fill_uniform(buf.value(), w.dtype, n, seed, id, 1.0f / std::sqrt(static_cast<float>(cols)));
    return Matrix{w.dtype, rows, cols, buf.value(), std::nullopt, {}};
  }

  [[nodiscard]] Result<Vector> ones(int size, const std::string& what) {
    auto buf = detail::allocate_storage(w, static_cast<std::size_t>(size) * sizeof(float), what);
    if (!buf.ok()) return std::move(buf).error();
    auto* p = static_cast<float*>(buf.value());
    for (int i = 0; i < size; ++i) p[i] = 1.0f;
    return Vector{size, p};
  }

  [[nodiscard]] Result<Vector> bias(int size, std::uint64_t id, const std::string& what) {
    auto buf = detail::allocate_storage(w, static_cast<std::size_t>(size) * sizeof(float), what);
    if (!buf.ok()) return std::move(buf).error();
    fill_uniform(buf.value(), DType::f32, static_cast<std::size_t>(size), seed, id, kBiasRange);
    return Vector{size, static_cast<const float*>(buf.value())};
  }
};

}  // namespace

Result<ModelWeights> make_dummy_weights(const ModelConfig& config, const LoadOptions& options) {
  if (Status s = detail::check_storage_dtype(options.dtype); !s.ok()) return s.error();
  if (config.hidden_size <= 0 || config.intermediate_size <= 0 || config.vocab_size <= 0 ||
      config.num_attention_heads <= 0 || config.num_key_value_heads <= 0 ||
      config.head_dim <= 0 || config.num_hidden_layers <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "make_dummy_weights: config has non-positive sizes (not parsed?)");
  }
  ModelWeights w = detail::empty_weights(config, options);
  const int layers = w.config.num_hidden_layers;

  const int H = config.hidden_size;
  const int I = config.intermediate_size;
  const int Q = config.num_attention_heads * config.head_dim;
  Maker mk{w, options.seed};

#define SL_TRY_ASSIGN(dst, expr)               \
  do {                                         \
    auto r_ = (expr);                          \
    if (!r_.ok()) return std::move(r_).error(); \
    (dst) = r_.value();                        \
  } while (0)

  SL_TRY_ASSIGN(w.embed_tokens, mk.matrix(config.vocab_size, H, kEmbedId, "embed_tokens"));
  for (int i = 0; i < layers; ++i) {
    LayerWeights& L = w.layers[static_cast<std::size_t>(i)];
    const std::string p = "layer " + std::to_string(i) + " ";
    SL_TRY_ASSIGN(L.input_norm, mk.ones(H, p + "input_norm"));
    SL_TRY_ASSIGN(L.qkv, mk.matrix(config.qkv_rows(), H, layer_id(i, kQkv), p + "qkv"));
    if (config.qkv_bias) {
      SL_TRY_ASSIGN(L.qkv_bias, mk.bias(config.qkv_rows(), layer_id(i, kQkvBias), p + "qkv_bias"));
    }
    if (config.qk_norm) {
      SL_TRY_ASSIGN(L.q_norm, mk.ones(config.head_dim, p + "q_norm"));
      SL_TRY_ASSIGN(L.k_norm, mk.ones(config.head_dim, p + "k_norm"));
    }
    SL_TRY_ASSIGN(L.o_proj, mk.matrix(H, Q, layer_id(i, kOProj), p + "o_proj"));
    SL_TRY_ASSIGN(L.post_attention_norm, mk.ones(H, p + "post_attention_norm"));
    SL_TRY_ASSIGN(L.gate_up, mk.matrix(2 * I, H, layer_id(i, kGateUp), p + "gate_up"));
    SL_TRY_ASSIGN(L.down_proj, mk.matrix(H, I, layer_id(i, kDown), p + "down_proj"));
  }
  SL_TRY_ASSIGN(w.final_norm, mk.ones(H, "final_norm"));
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    SL_TRY_ASSIGN(w.lm_head, mk.matrix(config.vocab_size, H, kLmHeadId, "lm_head"));
  }
#undef SL_TRY_ASSIGN
  return w;
}

}  // namespace shardline::model
