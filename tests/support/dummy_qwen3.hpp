#pragma once
// The dummy Qwen3 shape the golden tests run beside stories260K: the
// qwen3-0.6b config (16 heads / 8 KV heads, q/k norm, tied 151936 x 1024
// embeddings) with seeded random weights, cut to 5 layers.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/group/engine_builder.hpp"

namespace shardline::testing_support {

inline const std::string kQwen3ShapeDir = std::string(SHARDLINE_SHARED_DIR) + "/models/shapes/qwen3-0.6b";

/// Engine options of the dummy shape: 5 layers, 16 MiB of KV in 16-token
/// blocks, 8 sequences of at most 256 tokens, a 7-token step budget
/// (chunked prefill, uneven SP chunks), logits captured, integrity checked,
/// one thread per rank.
inline engine::EngineOptions dummy_qwen3_options() {
  engine::EngineOptions o;
  o.model_dir = kQwen3ShapeDir;
  o.load_format = model::LoadFormat::dummy;
  o.num_layers_override = 5;
  o.block_size = 16;
  o.kv_cache_bytes = 16u << 20;
  o.max_model_len = 256;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 7;
  o.capture_logits = true;
  o.check_integrity = true;
  o.num_threads = 1;
  return o;
}

/// Four prompts of 5, 8, 11 and 14 ids spread over the 151936-id
/// vocabulary (the dummy weights have no tokenizer worth using).
inline std::vector<std::vector<std::int32_t>> dummy_qwen3_prompts() {
  std::vector<std::vector<std::int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::int32_t> p;
    for (int t = 0; t < 5 + 3 * i; ++t) p.push_back((1000 + 7919 * (i * 31 + t)) % 151936);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

}  // namespace shardline::testing_support
