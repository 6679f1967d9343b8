#pragma once
/// \file
/// In-memory model weights. Matrices are row-major `[out_features, in_features]`
/// (the Hugging Face / PyTorch `nn.Linear` layout) stored as F32 or BF16
/// (`--dtype`), or, from a GGUF file loaded with `--dtype auto`
/// (LoadOptions::keep_quantized), as the file's Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K blocks
/// (kernels/cpu/quant_linear.hpp computes on them; issue 40). Activations are F32; with BF16 weights each linear layer's
/// input is rounded to BF16 and multiplied with F32 accumulation
/// (kernels/cpu/linear.hpp). The loader fuses q/k/v into one QKV matrix
/// and gate/up into one gate_up matrix so a layer runs two big GEMMs instead of
/// five.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "kernels/cpu/ggml_quants.hpp"
#include "model/config.hpp"

namespace shardline::model {

using shardline::DType;

/// A run of consecutive rows of a quantized Matrix stored in one GGML type.
struct QuantRows {
  int rows = 0;
  kernels::GgmlType type = kernels::GgmlType::q8_0;
};

/// Consecutive rows of a Matrix in one format: dense (`type` unset, the
/// matrix's dtype) or one GGML type (Matrix::runs).
struct RowRun {
  int begin = 0;  ///< first row in the matrix
  int rows = 0;
  std::optional<kernels::GgmlType> type;
  const std::byte* data = nullptr;  ///< row `begin`'s bytes
  std::size_t row_bytes = 0;        ///< bytes of one row of this run
};

/// A non-owning 2-D view over weight storage: `rows x cols`, row-major,
/// contiguous. Dense (not quantized()): `dtype` elements, F32 or BF16 (F16
/// files are converted at load), row stride = cols. Quantized: each row is
/// cols / block_size GGUF blocks, either of one type (`quant` set, row
/// stride = row_bytes()) or, for a fused matrix whose parts the file stores
/// in different types (`mixed` non-empty, `quant` unset: a Q4_K_M file's
/// attn_qkv with Q4_K q/k and Q6_K v), of each run's type, the runs'
/// blocks one after another in row order. `dtype` is then the model's
/// storage dtype for its dense matrices and does not describe these bytes.
struct Matrix {
  DType dtype = DType::f32;
  int rows = 0;
  int cols = 0;
  const void* data = nullptr;
  std::optional<kernels::GgmlType> quant;  ///< set: GGUF blocks of this type
  std::vector<QuantRows> mixed;            ///< non-empty: runs of rows in their own types (sum of rows = rows)

  [[nodiscard]] bool empty() const { return data == nullptr; }
  [[nodiscard]] bool quantized() const { return quant.has_value() || !mixed.empty(); }
  /// Bytes of one row. Precondition: not mixed (see row_data).
  [[nodiscard]] std::size_t row_bytes() const {
    if (quant) return kernels::ggml_row_bytes(static_cast<std::uint32_t>(*quant), cols).value_or(0);
    return static_cast<std::size_t>(cols) * dtype_size(dtype);
  }
  /// The GGML type of row `row` (0 <= row < rows), or nullopt when dense.
  [[nodiscard]] std::optional<kernels::GgmlType> row_type(int row) const {
    for (const QuantRows& r : mixed) {
      if (row < r.rows) return r.type;
      row -= r.rows;
    }
    return quant;
  }
  /// The bytes of row `row` (0 <= row < rows), on every layout.
  [[nodiscard]] const std::byte* row_data(int row) const {
    const auto* at = static_cast<const std::byte*>(data);
    if (mixed.empty()) return at + static_cast<std::size_t>(row) * row_bytes();
    for (const QuantRows& r : mixed) {
      const std::size_t rb = kernels::ggml_row_bytes(static_cast<std::uint32_t>(r.type), cols).value_or(0);
      if (row < r.rows) return at + static_cast<std::size_t>(row) * rb;
      at += static_cast<std::size_t>(r.rows) * rb;
      row -= r.rows;
    }
    return at;
  }
  [[nodiscard]] std::size_t bytes() const {
    if (mixed.empty()) return static_cast<std::size_t>(rows) * row_bytes();
    return static_cast<std::size_t>(row_data(rows) - static_cast<const std::byte*>(data));
  }
  /// The rows as runs of one format each, in row order: one run (the whole
  /// matrix) unless `mixed`, else one per QuantRows.
  [[nodiscard]] std::vector<RowRun> runs() const {
    if (mixed.empty()) return {RowRun{0, rows, quant, static_cast<const std::byte*>(data), row_bytes()}};
    std::vector<RowRun> out;
    int begin = 0;
    for (const QuantRows& r : mixed) {
      out.push_back(RowRun{begin, r.rows, r.type, row_data(begin),
                           kernels::ggml_row_bytes(static_cast<std::uint32_t>(r.type), cols).value_or(0)});
      begin += r.rows;
    }
    return out;
  }
  /// "F32", "BF16", the GGML type's name ("Q4_1"), or the runs' types
  /// joined by '+' ("Q4_K+Q6_K").
  [[nodiscard]] std::string format_name() const {
    if (mixed.empty())
      return quant ? kernels::ggml_type_name(static_cast<std::uint32_t>(*quant)) : dtype_name(dtype);
    std::string out;
    for (std::size_t i = 0; i < mixed.size(); ++i) {
      const std::string name = kernels::ggml_type_name(static_cast<std::uint32_t>(mixed[i].type));
      if (out.find(name) == std::string::npos) out += (out.empty() ? "" : "+") + name;
    }
    return out;
  }
};

/// A 1-D F32 vector (norm weights, biases). Empty when absent.
struct Vector {
  int size = 0;
  const float* data = nullptr;
  [[nodiscard]] bool empty() const { return data == nullptr; }
};

struct LayerWeights {
  Vector input_norm;       // [hidden]
  Matrix qkv;              // [(heads + 2 * kv_heads) * head_dim, hidden]; rows: q, then k, then v
  Vector qkv_bias;         // [(heads + 2 * kv_heads) * head_dim] (Qwen2 / attention_bias only)
  Vector q_norm;           // [head_dim] (Qwen3 only)
  Vector k_norm;           // [head_dim] (Qwen3 only)
  Matrix o_proj;           // [hidden, heads * head_dim]
  Vector post_attention_norm;  // [hidden]
  Matrix gate_up;          // [2 * intermediate, hidden]; rows: gate, then up
  Matrix down_proj;        // [hidden, intermediate]
};

/// All weights of a model plus the storage that backs them.
struct ModelWeights {
  ModelConfig config;
  DType dtype = DType::f32;      ///< storage dtype of matrices (f32 or bf16)
  Matrix embed_tokens;           // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Vector final_norm;             // [hidden]
  Matrix lm_head;                // [vocab, hidden]; aliases embed_tokens when tied

  /// Owned buffers the views above point into (64-byte aligned).
  std::vector<std::shared_ptr<void>> storage;

  /// Total bytes of all matrices and vectors (tied lm_head counted once).
  [[nodiscard]] std::size_t total_bytes() const;
};

/// How to obtain weights.
enum class LoadFormat {
  safetensors,  ///< model.safetensors or model.safetensors.index.json in the folder
  dummy,        ///< seeded random weights with config.json's shapes
};

struct LoadOptions {
  LoadFormat format = LoadFormat::safetensors;
  DType dtype = DType::f32;     ///< storage dtype in memory: f32 or bf16
  std::uint64_t seed = 0;       ///< for dummy weights
  int num_layers_override = 0;  ///< >0: keep only the first N layers (smoke tests)
  /// GGUF only (`--dtype auto`): a matrix whose tensors are all of one type
  /// the CPU computes on quantized (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K:
  /// matrix_stays_quantized) is kept as the file's blocks; the others are
  /// dequantized to `dtype` as without it. Safetensors and dummy weights
  /// ignore it.
  bool keep_quantized = false;
  /// Quantize on load (`--quantization`, llama-quantize's pure mode): every
  /// matrix (embeddings, QKV, o_proj, gate_up, down_proj, lm_head) becomes
  /// blocks of this type (Q8_0, Q4_0 or Q4_1), quantized from the source
  /// values in F32 (quantize_weights). Unset: as stored.
  std::optional<kernels::GgmlType> quantization;
};

/// True for the GGML types a matrix can stay quantized in (what
/// kernels::cpu::PackedQuantLinear packs): Q8_0, Q4_0, Q4_1, Q4_K and Q6_K.
[[nodiscard]] bool matrix_stays_quantized(kernels::GgmlType type);

/// Row `row` of `m` as F32 into `out` [m.cols]: a dense row widened, a
/// quantized one dequantized exactly as llama.cpp's dequantize_row_*
/// (embedding lookups of a quantized token table). Precondition: 0 <= row
/// < m.rows.
void matrix_row_f32(const Matrix& m, int row, float* out);

/// `weights` (dense, F32) with every matrix quantized to `type` by
/// kernels::cpu::quantize_row (llama.cpp's quantize_row_*_ref, row by row),
/// the F32 buffers freed; `dtype` becomes the storage dtype recorded for
/// dense matrices. A tied lm_head stays tied. Errors: unsupported (a type
/// other than Q8_0, Q4_0 and Q4_1), invalid_argument (a matrix whose
/// columns are not whole blocks of 32, named; weights not F32),
/// out_of_memory.
[[nodiscard]] Result<ModelWeights> quantize_weights(ModelWeights weights, kernels::GgmlType type, DType dtype);

/// `weights` with every quantized matrix dequantized (llama.cpp's
/// dequantize_row_*) and stored as `weights.dtype`: for the runners that
/// compute on dense weights only (CUDA, SiDP). Returns `weights` itself
/// when nothing is quantized. Errors: out_of_memory.
[[nodiscard]] Result<std::shared_ptr<const ModelWeights>> dequantized_weights(
    std::shared_ptr<const ModelWeights> weights);

/// Loads `dir` (config.json + weights). Safetensors files are memory-mapped,
/// validated, converted to `options.dtype` and fused. A GGUF model (`dir` a
/// .gguf file, or a folder holding one and no config.json) is mapped,
/// validated and dequantized at load (gguf/gguf_model.hpp), with its errors;
/// `options.keep_quantized` keeps its Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K matrices, and
/// `options.quantization` quantizes every matrix after loading
/// (quantize_weights, with its errors).
/// Errors (each names the file and, where relevant, the tensor):
///   not_found: config.json, model.safetensors / index, a shard, or a tensor missing;
///   corrupt: header length past EOF, bad header JSON, data offsets outside the
///            file or overlapping, size disagreeing with shape x dtype;
///   mismatch: a tensor's shape disagrees with config.json;
///   unsupported: architecture or a tensor dtype other than F32/F16/BF16.
[[nodiscard]] Result<ModelWeights> load_model(const std::filesystem::path& dir,
                                              const LoadOptions& options);

/// Dummy weights for an already-parsed config (shapes from `config`): values
/// drawn uniformly from [-a, a] with a = 1/sqrt(in_features) from a seeded
/// counter-based generator; norm weights are 1.
[[nodiscard]] Result<ModelWeights> make_dummy_weights(const ModelConfig& config,
                                                      const LoadOptions& options);

}  // namespace shardline::model
