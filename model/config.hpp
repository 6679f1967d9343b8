#pragma once
/// \file
/// Model architecture description parsed from a Hugging Face `config.json`
/// (plus `generation_config.json` for stop ids).

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/result.hpp"

namespace shardline::model {

enum class Architecture {
  llama,  ///< LlamaForCausalLM (Llama 2/3; GQA; optional llama3 rope_scaling)
  qwen2,  ///< Qwen2ForCausalLM (bias on q/k/v projections)
  qwen3,  ///< Qwen3ForCausalLM (per-head RMSNorm on q and k, no qkv bias)
};

[[nodiscard]] const char* architecture_name(Architecture a) noexcept;

/// Llama 3 `rope_scaling` ({"rope_type": "llama3", ...}). Frequencies are
/// rescaled as in Meta's reference / HF `_compute_llama3_parameters`.
struct RopeScaling {
  std::string rope_type;  ///< only "llama3" (and "default") are supported
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::llama;
  std::string architecture_string;  ///< as written in config.json
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;  ///< config "head_dim" or hidden_size / num_attention_heads
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  std::optional<RopeScaling> rope_scaling;
  /// Per-frequency RoPE divisors, [head_dim / 2]: inv_freq[i] /=
  /// rope_freq_factors[i] (llama.cpp's `rope_freqs` tensor, the form its
  /// GGUF converter gives llama3 scaling; or a GGUF linear scaling factor,
  /// the same for every frequency). Empty: none.
  std::vector<float> rope_freq_factors;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  ///< Qwen2 (always) or Llama `attention_bias`
  bool qk_norm = false;   ///< Qwen3
  int bos_token_id = -1;  ///< -1 when absent
  /// Every end-of-sequence id from config.json and generation_config.json
  /// (union, in order of first appearance).
  std::vector<int> eos_token_ids;
  std::string torch_dtype;  ///< "float32", "bfloat16", ... ("" if absent)

  /// Query heads per KV head (GQA group size).
  [[nodiscard]] int num_queries_per_kv() const { return num_attention_heads / num_key_value_heads; }
  /// Output rows of the fused QKV projection: (heads + 2 * kv_heads) * head_dim.
  [[nodiscard]] int qkv_rows() const {
    return (num_attention_heads + 2 * num_key_value_heads) * head_dim;
  }
  /// Parameter count of the model (tied lm_head counted once).
  [[nodiscard]] long long num_parameters() const;
};

/// Parses `dir/config.json` and, if present, `dir/generation_config.json`;
/// for a GGUF model (`dir` a .gguf file, or a folder holding one and no
/// config.json) the file's metadata instead (gguf/gguf_model.hpp).
/// Errors: not_found (no config.json), corrupt (bad JSON; names the file),
/// unsupported (architecture other than the three above, or rope_scaling type
/// other than llama3), invalid_argument (missing/non-positive sizes, heads not
/// divisible by kv heads, ...). Each message names the file and the field.
[[nodiscard]] Result<ModelConfig> load_model_config(const std::filesystem::path& dir);

/// Same, from JSON text (for tests); `source` is used in error messages.
[[nodiscard]] Result<ModelConfig> parse_model_config(const std::string& config_json,
                                                     const std::string& generation_config_json,
                                                     const std::string& source);

}  // namespace shardline::model
