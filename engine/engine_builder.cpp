#include "engine/cpu_engine.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "engine/kv_budget.hpp"
#include "model/id_tokenizer.hpp"

namespace shardline::engine {

Result<CpuEngine> build_cpu_engine(const CpuEngineOptions& o) {
  if (o.parallel.dp != 1)
    return make_error(ErrorCode::invalid_argument, "a CpuEngine is one replica: dp must be 1 (build dp engines)");
  if (o.block_size <= 0)
    return make_error(ErrorCode::invalid_argument, "--block-size must be > 0");
  if (o.kv_cache_bytes == 0 && !(o.kv_cache_memory_fraction > 0.0 && o.kv_cache_memory_fraction <= 1.0))
    return make_error(ErrorCode::invalid_argument, "--kv-cache-memory-fraction must be in (0, 1]");

  model::LoadOptions lo;
  lo.format = o.load_format;
  lo.dtype = o.dtype;
  lo.seed = o.seed;
  lo.num_layers_override = o.num_layers_override;
  auto weights = model::load_model(o.model_dir, lo);
  if (!weights) return std::move(weights).error();
  CpuEngine e;
  e.weights = std::make_shared<const model::ModelWeights>(std::move(weights).value());
  const model::ModelConfig& c = e.weights->config;

  namespace fs = std::filesystem;
  const fs::path dir(o.model_dir);
  if (fs::exists(dir / "tokenizer.json") || fs::exists(dir / "tokenizer.model")) {
    auto tok = model::load_tokenizer(dir);
    if (!tok) return std::move(tok).error();
    e.tokenizer = std::move(tok).value();
  } else {
    e.tokenizer = std::make_unique<model::IdTokenizer>(
        c.vocab_size, c.bos_token_id, c.eos_token_ids.empty() ? -1 : c.eos_token_ids.front());
  }

  const int max_model_len = o.max_model_len > 0 ? o.max_model_len : c.max_position_embeddings;
  if (max_model_len <= 0)
    return make_error(ErrorCode::invalid_argument,
                      "max_model_len unknown: config.json has no max_position_embeddings; pass --max-model-len");
  const int kv_elem_bytes = static_cast<int>(dtype_size(o.kv_cache_dtype));
  const std::uint64_t block_bytes = kv_bytes_per_block(c.num_hidden_layers, c.num_key_value_heads,
                                                       c.head_dim, o.block_size, kv_elem_bytes);
  std::uint64_t budget = o.kv_cache_bytes;
  if (budget == 0) {
    auto avail = available_memory_bytes();
    if (!avail) return std::move(avail).error();
    budget = static_cast<std::uint64_t>(static_cast<double>(*avail) * o.kv_cache_memory_fraction);
  }
  const std::int64_t budget_blocks = num_kv_blocks_for_budget(
      budget, c.num_hidden_layers, c.num_key_value_heads, c.head_dim, o.block_size, kv_elem_bytes);
  const std::int64_t blocks_per_seq = (max_model_len + o.block_size - 1) / o.block_size;
  const std::int64_t useful_blocks = blocks_per_seq * std::max(1, o.max_num_seqs);
  const std::int64_t num_blocks = std::min(budget_blocks, useful_blocks);
  if (num_blocks < blocks_per_seq)
    return make_error(ErrorCode::out_of_memory,
                      "KV cache budget of " + std::to_string(budget) + " bytes holds " +
                          std::to_string(budget_blocks) + " blocks of " + std::to_string(block_bytes) +
                          " bytes; one sequence of max_model_len " + std::to_string(max_model_len) +
                          " tokens needs " + std::to_string(blocks_per_seq) +
                          " (raise --kv-cache-bytes or lower --max-model-len)");
  e.num_kv_blocks = static_cast<int>(num_blocks);
  e.kv_cache_bytes = static_cast<std::uint64_t>(num_blocks) * block_bytes;

  const model::CpuRunnerOptions ro{e.num_kv_blocks, o.block_size, o.num_threads, o.kv_cache_dtype};
  if (o.parallel.group_size() == 1) {
    auto runner = model::CpuModelRunner::create(e.weights, ro);
    if (!runner) return std::move(runner).error();
    e.runner = std::move(runner).value();
    e.executor = e.runner.get();
  } else if (!o.group_master.empty()) {
    TcpGroupOptions tcp;
    tcp.master = o.group_master;
    tcp.key = o.group_key;
    tcp.timeout = std::chrono::milliseconds(o.group_timeout_ms);
    auto exec = create_tcp_group_executor(e.weights, o.parallel, ro, tcp);
    if (!exec) return std::move(exec).error();
    e.tcp_executor = std::move(exec).value();
    e.executor = e.tcp_executor.get();
  } else {
    auto group = InProcEngineGroup::create(e.weights, o.parallel, ro);
    if (!group) return std::move(group).error();
    e.group = std::move(group).value();
    e.executor = &e.group->executor();
  }

  EngineConfig ec;
  ec.max_num_seqs = o.max_num_seqs;
  ec.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.max_model_len = max_model_len;
  ec.eos_token_ids = c.eos_token_ids;
  ec.seed = o.seed;
  ec.capture_logits = o.capture_logits;
  ec.check_integrity = o.check_integrity;
  ec.token_budget = o.token_budget;
  auto engine = LlmEngine::create(*e.executor, *e.tokenizer, ec);
  if (!engine) return std::move(engine).error();
  e.engine = std::move(engine).value();
  return e;
}

}  // namespace shardline::engine
