// Micro-benchmarks (Google Benchmark) of the costs that unit tests check
// only for correctness: decoding hostile messages, loading a small model,
// generating seeded dummy weights, streaming KV increments (DéjàVuLib's
// buffered copies, docs/kv-streaming.md). Timings belong here, not in ctest, where
// a loaded machine would turn them into flaky failures.
//
//   ./build/bench/shardline_micro_bench [--benchmark_filter=REGEX]
//
// The models come from the shared/ folder (SHARDLINE_SHARED_DIR at build
// time, or the environment variable of the same name at run time).
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <omp.h>
#include <vector>

#include "sim/calibration/hardware.hpp"
#include "model/tokenizer_loader.hpp"
#include "comm/inproc.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/quant_linear.hpp"
#include "kvstore/kv_stream.hpp"
#include "kvstore/kv_targets.hpp"
#include "messages/codec.hpp"
#include "model/config.hpp"
#include "text/tokenizer.hpp"
#include "model/weights.hpp"

namespace {

namespace fs = std::filesystem;
using namespace shardline;  // NOLINT

fs::path shared_dir() {
  if (const char* dir = std::getenv("SHARDLINE_SHARED_DIR"); dir && *dir) return dir;
  return SHARDLINE_SHARED_DIR;
}

// ---- messages -------------------------------------------------------------------

worker::BatchRequest request(int i) {
  worker::BatchRequest r;
  r.job_id = 7;
  r.line_index = static_cast<std::uint64_t>(i);
  r.custom_id = "req-" + std::to_string(i);
  r.prompt = "Once upon a time, line " + std::to_string(i);
  r.prompt_token_ids = {1, 15043, 29892, 3186, i};
  r.params.temperature = 0.7f;
  r.params.top_k = 40;
  r.params.stop_token_ids = {2, 13};
  r.params.stop = {"\n\n", "</s>"};
  r.n = 1 + i % 3;
  return r;
}

worker::BatchResult result(int i) {
  worker::BatchResult r;
  r.job_id = 7;
  r.line_index = static_cast<std::uint64_t>(i);
  r.custom_id = "req-" + std::to_string(i);
  r.ok = true;
  r.choices.push_back({0, " there was a little robot", "stop", {727, 471, 263, 2}});
  r.prompt_tokens = 12 + i;
  r.completion_tokens = 4;
  return r;
}

/// One encoded message of each inbox that carries lists and nested structs.
std::vector<std::string> encoded_samples() {
  std::vector<worker::BatchRequest> requests;
  std::vector<worker::BatchResult> results;
  for (int i = 0; i < 5; ++i) {
    requests.push_back(request(i));
    results.push_back(result(i));
  }
  messages::WorkerStatus status;
  status.worker_name = "node0/cpu:0";
  status.state = "busy";
  return {
      messages::encode(messages::WorkerMsg{messages::AssignWork{requests}}),
      messages::encode(messages::OrchestratorMsg{messages::WorkerResults{"node0/cpu:0", results}}),
      messages::encode(messages::OrchestratorMsg{messages::WorkerHeartbeat{"node0/cpu:0", status}}),
      messages::encode(messages::KvStoreMsg{messages::PutBlocks{"job7/seq3", std::string(4099, 'x')}}),
  };
}

void put_le32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

/// The seeded mutations of tests/messages/codec_robustness_test.cpp
/// (SeededRandomMutations): bit flips, random bytes, boundary u32s, copied
/// pointer words, truncation with an honest segment table.
std::vector<std::string> mutated_messages(int n) {
  const auto samples = encoded_samples();
  std::mt19937_64 rng(20240611);
  std::vector<std::string> out;
  out.reserve(static_cast<std::size_t>(n));
  for (int round = 0; round < n; ++round) {
    std::string b = samples[rng() % samples.size()];
    const std::size_t lo = (rng() % 8 == 0) ? 0 : 8;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = lo + rng() % (b.size() - lo);
      switch (rng() % 5) {
        case 0: b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8))); break;
        case 1: b[at] = static_cast<char>(rng()); break;
        case 2:
          if (at + 4 <= b.size()) {
            static const std::uint32_t kInteresting[] = {0u, 1u, 0x7FFFFFFFu, 0x80000000u,
                                                         0xFFFFFFFFu, 0x1FFFFFFFu, 0xFFFFFFFCu};
            put_le32(b, at, kInteresting[rng() % std::size(kInteresting)]);
          }
          break;
        case 3: {
          const std::size_t words = b.size() / 8;
          const std::size_t from = rng() % words, to = 1 + rng() % (words - 1);
          b.replace(to * 8, 8, b.substr(from * 8, 8));
          break;
        }
        case 4:
          if (const std::size_t seg = b.size() / 8 - 1; seg >= 2 && b[0] == 0) {
            b.resize(b.size() - 8 * (1 + rng() % std::min<std::size_t>(3, seg - 1)));
            put_le32(b, 4, static_cast<std::uint32_t>(b.size() / 8 - 1));
          }
          break;
      }
    }
    out.push_back(std::move(b));
  }
  return out;
}

/// One mutated message through all six decoders per item; the counter
/// `accepted` is the share of decodes that returned a value.
void BM_DecodeMutatedMessages(benchmark::State& state) {
  const auto inputs = mutated_messages(12000);
  std::size_t i = 0, accepted = 0, decodes = 0;
  for (auto _ : state) {
    const std::string_view b = inputs[i++ % inputs.size()];
    accepted += messages::decode_orchestrator(b).ok() + messages::decode_orchestrator_reply(b).ok() +
                messages::decode_worker(b).ok() + messages::decode_worker_reply(b).ok() +
                messages::decode_kvstore(b).ok() + messages::decode_kvstore_reply(b).ok();
    decodes += 6;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.counters["accepted"] = decodes ? static_cast<double>(accepted) / static_cast<double>(decodes) : 0.0;
}
BENCHMARK(BM_DecodeMutatedMessages);

// ---- model loading --------------------------------------------------------------

/// Reads stories260K (f32 safetensors) from shared/models.
void BM_LoadStories260K(benchmark::State& state) {
  const fs::path dir = shared_dir() / "models" / "stories260K";
  for (auto _ : state) {
    auto w = model::load_model(dir, {});
    if (!w.ok()) {
      state.SkipWithError(w.error().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(w.value().total_bytes());
  }
}
BENCHMARK(BM_LoadStories260K)->Unit(benchmark::kMillisecond);

/// Loads a real model into F32 (weights, then tokenizer), state.range(0)
/// indexing load_models(): SmolLM2-135M-Instruct's GGUF (Q4_1, dequantized
/// at load) and, where bench/export_safetensors.py wrote them, the same
/// weights as F32 and BF16 safetensors folders. Counters: `weights_mb` in
/// memory.
std::vector<fs::path> load_models() {
  const fs::path source = SHARDLINE_SOURCE_DIR;
  std::vector<fs::path> out = {source / "models/smollm2-135m-instruct"};
  for (const char* name : {"smollm2-135m-instruct-f32-safetensors", "smollm2-135m-instruct-bf16-safetensors"})
    if (fs::exists(source / "models" / name)) out.push_back(source / "models" / name);
  return out;
}
void BM_LoadModel(benchmark::State& state) {
  const auto models = load_models();
  if (static_cast<std::size_t>(state.range(0)) >= models.size()) {
    state.SkipWithError("not exported: python bench/export_safetensors.py (see its header)");
    return;
  }
  const fs::path dir = models[static_cast<std::size_t>(state.range(0))];
  state.SetLabel(dir.filename().string());
  double weights_mb = 0;
  for (auto _ : state) {
    auto w = model::load_model(dir, {});
    auto tok = model::load_tokenizer(dir);
    if (!w.ok() || !tok.ok()) {
      state.SkipWithError((w.ok() ? tok.error() : w.error()).to_string().c_str());
      return;
    }
    weights_mb = static_cast<double>(w.value().total_bytes()) / 1e6;
    benchmark::DoNotOptimize(tok.value()->vocab_size());
  }
  state.counters["weights_mb"] = weights_mb;
}
BENCHMARK(BM_LoadModel)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->Iterations(3)->Repetitions(3)
    ->ReportAggregatesOnly(false);

// ---- tokenizers (issue 15: loading Qwen3's 11 MB tokenizer.json under 1 s) --------

/// Loads a shipped tokenizer.json (vocab, merges, regexes, decoders).
void BM_TokenizerLoad(benchmark::State& state, const char* name) {
  const fs::path dir = shared_dir() / "tokenizers" / name;
  for (auto _ : state) {
    auto tok = model::load_tokenizer(dir);
    if (!tok.ok()) {
      state.SkipWithError(tok.error().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(tok.value()->vocab_size());
  }
}
BENCHMARK_CAPTURE(BM_TokenizerLoad, qwen3, "qwen3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TokenizerLoad, llama3_1, "llama3_1")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TokenizerLoad, llama2, "llama2")->Unit(benchmark::kMillisecond);

/// Encodes the golden texts, cold cache each pass (a fresh tokenizer's
/// word cache is empty): bytes per second of text.
void BM_TokenizerEncode(benchmark::State& state, const char* name) {
  const fs::path dir = shared_dir() / "tokenizers" / name;
  std::ifstream in(dir / "encode_golden.json");
  const auto golden = nlohmann::json::parse(in, nullptr, false);
  const auto& cases = golden.is_object() ? golden["cases"] : golden;
  std::string text;
  for (int k = 0; k < 20; ++k)
    for (const auto& c : cases) text += c["text"].get<std::string>() + "\n";
  auto tok = model::load_tokenizer(dir);
  if (!tok.ok()) {
    state.SkipWithError(tok.error().to_string().c_str());
    return;
  }
  std::size_t ids = 0;
  for (auto _ : state) ids += tok.value()->encode(text, false).size();
  state.SetBytesProcessed(static_cast<std::int64_t>(text.size() * state.iterations()));
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(ids), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_TokenizerEncode, qwen3, "qwen3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TokenizerEncode, llama3_1, "llama3_1")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TokenizerEncode, llama2, "llama2")->Unit(benchmark::kMillisecond);

/// Seeded dummy weights of the stories110m shape (f32, ~440 MB): the
/// generator that `--load-format dummy` benchmarks start with.
void BM_DummyWeightsStories110m(benchmark::State& state) {
  auto cfg = model::load_model_config(shared_dir() / "models" / "shapes" / "stories110m");
  if (!cfg.ok()) {
    state.SkipWithError(cfg.error().to_string().c_str());
    return;
  }
  model::LoadOptions opt;
  opt.format = model::LoadFormat::dummy;
  opt.seed = 42;
  for (auto _ : state) {
    auto w = model::make_dummy_weights(cfg.value(), opt);
    if (!w.ok()) {
      state.SkipWithError(w.error().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(w.value().total_bytes());
  }
  state.counters["params"] = static_cast<double>(cfg->num_parameters());
}
BENCHMARK(BM_DummyWeightsStories110m)->Unit(benchmark::kMillisecond);

// ---- KV streaming: buffered copies (DéjàVu Fig. 7) --------------------------------------

/// One decode step's KV increment of a batch (1 token x 12 layers x 12 KV
/// heads x head_dim 64, f32, block 16: the stories110m shape) of 64
/// sequences on one rank, each sequence's new token in the middle of a
/// block, streamed to a target three ways:
///   PerPiece:    one flush per contiguous piece (layer, K|V, head): 288 per
///                sequence, 18432 per step (the paper's baseline);
///   PerSequence: stream_out, one buffered flush per sequence: 64 per step;
///   Batch:       stream_out_batch, one buffer and one flush for the step.
/// Memory* flush to a MemoryKvTarget on this thread, Comm* to a CommKvTarget
/// whose serve_kv_request loop runs on another thread (in-process comm).
struct KvBench {
  static constexpr int kBatch = 64, kContext = 128, kPosition = 100;
  kvstore::KvModelShape shape{12, 12, 64, DType::f32};
  kvstore::KvCacheView view;
  std::vector<std::byte> memory;
  std::vector<std::vector<std::int32_t>> tables;

  KvBench() {
    const int per_seq = kContext / 16;
    view.layout = {0, 12, {}, kBatch * per_seq, 16};
    for (int h = 0; h < 12; ++h) view.layout.kv_heads.push_back(h);
    memory.resize(kvstore::cache_bytes(shape, view.layout));
    std::mt19937 rng(7);
    for (std::size_t i = 0; i < memory.size(); i += 4) {
      const std::uint32_t v = rng();
      std::memcpy(memory.data() + i, &v, 4);
    }
    view.data = memory.data();
    std::vector<std::int32_t> blocks(static_cast<std::size_t>(kBatch * per_seq));
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::int32_t>(i);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (int s = 0; s < kBatch; ++s)
      tables.emplace_back(blocks.begin() + s * per_seq, blocks.begin() + (s + 1) * per_seq);
  }
  [[nodiscard]] kvstore::KvRange range() const { return {0, 12, kPosition, kPosition + 1}; }
  [[nodiscard]] std::size_t step_bytes() const { return kBatch * kvstore::chunk_bytes(shape, range()); }

  /// The baseline: each contiguous piece of each sequence on its own (K's
  /// strided column copied to a small buffer first, V sent in place).
  Status per_piece(kvstore::KvTarget& target) {
    const int d = shape.head_dim, bs = view.layout.block_size, heads = 12;
    const auto* cache = static_cast<const float*>(view.data);
    float k[64];
    for (int s = 0; s < kBatch; ++s) {
      const long block = tables[static_cast<std::size_t>(s)][kPosition / bs], off = kPosition % bs;
      std::uint64_t piece = 0;
      for (int l = 0; l < 12; ++l)
        for (int kv = 0; kv < 2; ++kv)
          for (int h = 0; h < heads; ++h, ++piece) {
            const float* slab = cache + (((static_cast<long>(l) * 2 + kv) * view.layout.num_blocks + block) * heads + h) *
                                            static_cast<long>(bs) * d;
            std::span<const std::byte> bytes;
            if (kv == 0) {
              for (int i = 0; i < d; ++i) k[i] = slab[static_cast<long>(i) * bs + off];
              bytes = std::as_bytes(std::span<const float>(k, static_cast<std::size_t>(d)));
            } else {
              bytes = std::as_bytes(std::span<const float>(slab + off * d, static_cast<std::size_t>(d)));
            }
            const kvstore::KvChunkKey key{1, static_cast<std::uint64_t>(s) * 1000 + piece, {l, l + 1, kPosition, kPosition + 1}};
            if (Status st = target.flush(key, bytes); !st) return st;
          }
    }
    return {};
  }
  Status per_sequence(kvstore::KvTarget& target) {
    for (int s = 0; s < kBatch; ++s) {
      const kvstore::KvChunkKey key{1, static_cast<std::uint64_t>(s), range()};
      if (Status st = kvstore::stream_out(shape, std::span(&view, 1), tables[static_cast<std::size_t>(s)], range(),
                                          target, key);
          !st)
        return st;
    }
    return {};
  }
  Status batch(kvstore::KvTarget& target) {
    std::vector<kvstore::KvStreamItem> items;
    for (int s = 0; s < kBatch; ++s)
      items.push_back({tables[static_cast<std::size_t>(s)], range(), {1, static_cast<std::uint64_t>(s), range()}});
    return kvstore::stream_out_batch(shape, std::span(&view, 1), items, target);
  }
};

enum class KvMode { per_piece, per_sequence, batch };

Status kv_step(KvBench& b, KvMode mode, kvstore::KvTarget& target) {
  switch (mode) {
    case KvMode::per_piece: return b.per_piece(target);
    case KvMode::per_sequence: return b.per_sequence(target);
    case KvMode::batch: return b.batch(target);
  }
  return {};
}

double transfers_per_step(KvMode mode) {
  return mode == KvMode::per_piece ? KvBench::kBatch * 288.0 : mode == KvMode::per_sequence ? KvBench::kBatch : 1.0;
}

void BM_KvStreamMemory(benchmark::State& state, KvMode mode) {
  KvBench b;
  kvstore::MemoryKvTarget target;
  for (auto _ : state) {
    if (Status st = kv_step(b, mode, target); !st) {
      state.SkipWithError(st.error().to_string().c_str());
      return;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * b.step_bytes()));
  state.counters["transfers"] = transfers_per_step(mode);
}
BENCHMARK_CAPTURE(BM_KvStreamMemory, PerPiece, KvMode::per_piece)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_KvStreamMemory, PerSequence, KvMode::per_sequence)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_KvStreamMemory, Batch, KvMode::batch)->Unit(benchmark::kMicrosecond);

void BM_KvStreamComm(benchmark::State& state, KvMode mode) {
  KvBench b;
  auto group = comm::InProcGroup::create(2).value();
  auto client = group->communicator(0).value();
  auto server = group->communicator(1).value();
  kvstore::MemoryKvTarget store;
  std::thread serve([&] {
    while (kvstore::serve_kv_request(*server, 0, store).ok()) {
    }
  });
  kvstore::CommKvTarget target(*client, 1);
  Status st;
  for (auto _ : state) {
    if (st = kv_step(b, mode, target); !st) break;
  }
  (void)group->mark_dead(0);  // the server's next recv fails: its loop ends
  serve.join();
  if (!st) {
    state.SkipWithError(st.error().to_string().c_str());
    return;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * b.step_bytes()));
  state.counters["transfers"] = transfers_per_step(mode);
}
BENCHMARK_CAPTURE(BM_KvStreamComm, PerPiece, KvMode::per_piece)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_KvStreamComm, PerSequence, KvMode::per_sequence)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_KvStreamComm, Batch, KvMode::batch)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

// ---- decode attention --------------------------------------------------------------

/// One layer's decode attention (kernels/cpu/attention.hpp) at the shape of
/// issue 17's target: num_seqs sequences of context_len positions, one query
/// token each, block size 16, shuffled block tables (a long-running cache's
/// blocks are not in order). Args: num_heads, num_kv_heads, head_dim,
/// context_len, KV dtype (0 = F32, 1 = BF16), threads. Counters: `kv_gbs`,
/// the K and V bytes read per second, and `triad_gbs`, the STREAM triad of
/// the same threads measured just before (sim/calibration/hardware.hpp), and their
/// ratio `of_triad`.
void BM_DecodeAttention(benchmark::State& state) {
  const int num_heads = static_cast<int>(state.range(0)), num_kv_heads = static_cast<int>(state.range(1));
  const int head_dim = static_cast<int>(state.range(2)), context_len = static_cast<int>(state.range(3));
  const DType dtype = state.range(4) ? DType::bf16 : DType::f32;
  const int threads = static_cast<int>(state.range(5));
  constexpr int kNumSeqs = 64, kBlockSize = 16;
  omp_set_num_threads(threads);
  const int blocks_per_seq = (context_len + kBlockSize - 1) / kBlockSize;
  const int num_blocks = kNumSeqs * blocks_per_seq;
  const std::size_t elem = dtype_size(dtype);
  const std::size_t slab_elems = static_cast<std::size_t>(num_blocks) * num_kv_heads * kBlockSize * head_dim;
  std::vector<std::byte> k_cache(slab_elems * elem), v_cache(slab_elems * elem);  // [num_blocks, kv_heads, ...]
  kernels::cpu::KvCacheLayer cache{k_cache.data(), v_cache.data(), dtype, num_blocks, kBlockSize, num_kv_heads, head_dim};
  std::vector<std::int32_t> blocks(static_cast<std::size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::mt19937 rng(17);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  // fill the cache through write_kv, one position at a time for all sequences
  const int row = num_kv_heads * head_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> kv_rows(static_cast<std::size_t>(kNumSeqs) * row);  // [num_seqs, kv_heads * head_dim]
  std::vector<std::int32_t> slots(kNumSeqs);
  for (int p = 0; p < context_len; ++p) {
    for (float& x : kv_rows) x = normal(rng);
    for (int s = 0; s < kNumSeqs; ++s)
      slots[s] = blocks[static_cast<std::size_t>(s) * blocks_per_seq + p / kBlockSize] * kBlockSize + p % kBlockSize;
    kernels::cpu::write_kv(kv_rows.data(), kv_rows.data(), row, kNumSeqs, slots.data(), cache);
  }
  std::vector<float> q(static_cast<std::size_t>(kNumSeqs) * num_heads * head_dim);  // [num_seqs, heads * head_dim]
  for (float& x : q) x = normal(rng);
  std::vector<float> out(q.size());
  std::vector<kernels::cpu::AttentionSeq> seqs(kNumSeqs);
  for (int s = 0; s < kNumSeqs; ++s)
    seqs[s] = {s, 1, context_len, blocks.data() + static_cast<std::size_t>(s) * blocks_per_seq};
  const double kv_bytes = 2.0 * kNumSeqs * context_len * num_kv_heads * head_dim * static_cast<double>(elem);
  const double triad = sim::calibration::measure_triad_bandwidth_gbs(threads, 256L << 20, 3);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::cpu::paged_attention(q.data(), num_heads * head_dim, seqs, cache, num_heads, scale, out.data(),
                                  num_heads * head_dim);
    benchmark::DoNotOptimize(out.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double kv_gbs = seconds > 0 ? kv_bytes * static_cast<double>(state.iterations()) / seconds / 1e9 : 0.0;
  state.counters["kv_gbs"] = kv_gbs;
  state.counters["triad_gbs"] = triad;
  state.counters["of_triad"] = triad > 0 ? kv_gbs / triad : 0.0;
  state.SetLabel(std::string(dtype_name(dtype)) + " KV");
}
// stories110m (12 / 12 heads) and llama-1B (32 / 8), 256 positions, F32 and BF16, 1 and 2 threads
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"heads", "kv_heads", "head_dim", "ctx", "bf16", "threads"})
    ->Args({12, 12, 64, 256, 1, 2})->Args({12, 12, 64, 256, 0, 2})
    ->Args({32, 8, 64, 256, 1, 2})->Args({32, 8, 64, 256, 0, 2})->Args({12, 12, 64, 256, 1, 1})
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

/// The in-process all-reduce between 2 threads (comm/inproc.hpp) at the
/// sizes a TP step sends: one F32 (the latency), a batch of 32 and 64 rows
/// of dim 768 (stories110m), 8 MB (the calibration's bandwidth size).
/// Counters: `allreduce_us` per call (the best of 30), and the
/// ring-equivalent bytes a rank sends per second (`send_gbs`).
void BM_InprocAllReduce(benchmark::State& state) {
  const long bytes = state.range(0);
  double bytes_per_s = 0;
  for (auto _ : state) bytes_per_s = sim::calibration::measure_inproc_allreduce_bytes_per_s(2, bytes, 30);
  state.counters["send_gbs"] = bytes_per_s / 1e9;
  state.counters["allreduce_us"] = bytes_per_s > 0 ? static_cast<double>(bytes) / bytes_per_s * 1e6 : 0.0;
}
BENCHMARK(BM_InprocAllReduce)->Arg(4)->Arg(32 * 768 * 4)->Arg(64 * 768 * 4)->Arg(8L << 20)->Iterations(3)
    ->Unit(benchmark::kMillisecond);

// ---- linear layers on quantized weights (issue 40) --------------------------------
//
// y = x W^T for stories110m's FFN down projection ([768, 2048]) at batch m
// (state.range(0)), with W as Q8_0, Q4_0 or Q4_1 blocks (kernels/cpu/
// quant_linear.hpp, the kernel `automatic` picks: its name is the label)
// and, beside them, as F32 and BF16 (kernels/cpu/linear.hpp). Counters:
// weight bytes read per second (the decode roofline's term) and GFLOP/s.

constexpr int kLinN = 768, kLinK = 2048;

void linear_counters(benchmark::State& state, int m, std::size_t weight_bytes) {
  state.counters["weight_GBps"] = benchmark::Counter(static_cast<double>(weight_bytes) * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * m * kLinN * kLinK * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

std::vector<float> random_floats(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& f : v) f = d(rng);
  return v;
}

/// [kLinN, kLinK] weights as GGUF blocks of `type` (any valid blocks do:
/// the speed does not depend on the values).
std::vector<std::uint8_t> bench_blocks(kernels::GgmlType type) {
  std::vector<std::uint8_t> blocks;
  if (type == kernels::GgmlType::q4_k || type == kernels::GgmlType::q6_k) {
    // K-quants: any bytes are valid values and packed scales; a small F16
    // d (and Q4_K's dmin) over them.
    const std::size_t block_bytes = type == kernels::GgmlType::q4_k ? 144 : 210;
    std::mt19937 rng(13);
    blocks.resize(static_cast<std::size_t>(kLinN) * kLinK / 256 * block_bytes);
    for (auto& v : blocks) v = static_cast<std::uint8_t>(rng());
    const std::uint16_t d = f32_to_f16(1e-3f);
    for (std::size_t at = 0; at < blocks.size(); at += block_bytes) {
      std::memcpy(blocks.data() + at + (type == kernels::GgmlType::q6_k ? 208 : 0), &d, 2);
      if (type == kernels::GgmlType::q4_k) std::memcpy(blocks.data() + at + 2, &d, 2);
    }
    return blocks;
  }
  // Quantize random F32 weights row by row to Q8_0, then (for Q4_0, Q4_1)
  // write each block's 4-bit values from the Q8_0 ones.
  const std::vector<float> wf = random_floats(static_cast<std::size_t>(kLinN) * kLinK, 11);
  std::vector<kernels::cpu::BlockQ8_0> q8(wf.size() / kernels::cpu::kQuantBlock);
  for (int j = 0; j < kLinN; ++j)
    kernels::cpu::quantize_row_q8_0(wf.data() + static_cast<std::size_t>(j) * kLinK, kLinK,
                                    q8.data() + static_cast<std::size_t>(j) * kLinK / kernels::cpu::kQuantBlock);
  for (const auto& b : q8) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&b);
    if (type == kernels::GgmlType::q8_0) {
      blocks.insert(blocks.end(), p, p + 34);
      continue;
    }
    blocks.insert(blocks.end(), p, p + 2);
    if (type == kernels::GgmlType::q4_1) blocks.insert(blocks.end(), p, p + 2);  // m: any half does
    for (int i = 0; i < 16; ++i)
      blocks.push_back(static_cast<std::uint8_t>(((b.qs[i] / 16 + 8) & 0x0F) | (((b.qs[i + 16] / 16 + 8) & 0x0F) << 4)));
  }
  return blocks;
}

void BM_QuantLinear(benchmark::State& state, kernels::GgmlType type,
                    kernels::cpu::QuantKernel kernel = kernels::cpu::QuantKernel::automatic) {
  const int m = static_cast<int>(state.range(0));
  if (!kernels::cpu::quant_kernel_supported(kernel)) {
    state.SkipWithError("this CPU lacks the kernel");
    return;
  }
  const std::vector<std::uint8_t> blocks = bench_blocks(type);
  auto w = kernels::cpu::PackedQuantLinear::pack(type, blocks, kLinN, kLinK);
  if (!w.ok()) {
    state.SkipWithError(w.error().to_string().c_str());
    return;
  }
  const std::vector<float> x = random_floats(static_cast<std::size_t>(m) * kLinK, 12);
  std::vector<float> y(static_cast<std::size_t>(m) * kLinN);
  for (auto _ : state) {
    if (!kernels::cpu::quant_linear(x.data(), m, kLinK, *w, y.data(), kLinN, kernel).ok())
      state.SkipWithError("failed");
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(kernel == kernels::cpu::QuantKernel::automatic ? kernels::cpu::quant_kernel_name(type)
                 : kernel == kernels::cpu::QuantKernel::avx2   ? "avx2"
                                                               : "avx512_vnni");
  linear_counters(state, m, blocks.size());
}
BENCHMARK_CAPTURE(BM_QuantLinear, Q8_0, kernels::GgmlType::q8_0)->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinear, Q4_0, kernels::GgmlType::q4_0)->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinear, Q4_1, kernels::GgmlType::q4_1)->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinear, Q4_K, kernels::GgmlType::q4_k)->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinear, Q6_K, kernels::GgmlType::q6_k)->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
// The kernels side by side where the CPU has both (the label says which).
BENCHMARK_CAPTURE(BM_QuantLinear, Q4_0_avx2, kernels::GgmlType::q4_0, kernels::cpu::QuantKernel::avx2)
    ->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinear, Q4_0_avx512_vnni, kernels::GgmlType::q4_0, kernels::cpu::QuantKernel::avx512_vnni)
    ->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinear, Q4_K_avx2, kernels::GgmlType::q4_k, kernels::cpu::QuantKernel::avx2)
    ->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinear, Q4_K_avx512_vnni, kernels::GgmlType::q4_k, kernels::cpu::QuantKernel::avx512_vnni)
    ->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();

/// One decode row (m = 1) against weights that come from DRAM, as in a
/// model's decode step: `kStreamedCopies` packed [kLinN, kLinK] matrices
/// (about 40 MB for Q4_K, more than these machines' L3 share), each call
/// the next one. `weight_GBps` beside `triad_GBps`, the STREAM triad of
/// the same threads measured in this run, is the kernel's share of the
/// bandwidth; the in-cache BM_QuantLinear/.../1 says nothing about it.
constexpr int kStreamedCopies = 48;
void BM_QuantLinearStreamed(benchmark::State& state, kernels::GgmlType type) {
  const std::vector<std::uint8_t> blocks = bench_blocks(type);
  std::vector<kernels::cpu::PackedQuantLinear> copies;
  for (int c = 0; c < kStreamedCopies; ++c) {
    auto w = kernels::cpu::PackedQuantLinear::pack(type, blocks, kLinN, kLinK);
    if (!w.ok()) {
      state.SkipWithError(w.error().to_string().c_str());
      return;
    }
    copies.push_back(std::move(w).value());
  }
  const std::vector<float> x = random_floats(kLinK, 12);  // [1, kLinK]
  std::vector<float> y(kLinN);                            // [1, kLinN]
  const double triad_gbs = sim::calibration::measure_triad_bandwidth_gbs(omp_get_max_threads(), 64L << 20, 3);
  std::size_t next = 0;
  for (auto _ : state) {
    if (!kernels::cpu::quant_linear(x.data(), 1, kLinK, copies[next], y.data(), kLinN).ok())
      state.SkipWithError("failed");
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % copies.size();
  }
  state.SetLabel(kernels::cpu::quant_kernel_name(type));
  linear_counters(state, 1, blocks.size());
  state.counters["triad_GBps"] = triad_gbs;
}
BENCHMARK_CAPTURE(BM_QuantLinearStreamed, Q8_0, kernels::GgmlType::q8_0)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinearStreamed, Q4_1, kernels::GgmlType::q4_1)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinearStreamed, Q4_K, kernels::GgmlType::q4_k)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantLinearStreamed, Q6_K, kernels::GgmlType::q6_k)->UseRealTime();

void BM_DenseLinear(benchmark::State& state, DType dtype,
                    kernels::cpu::LinearKernel kernel = kernels::cpu::LinearKernel::automatic) {
  const int m = static_cast<int>(state.range(0));
  if (!kernels::cpu::linear_kernel_supported(kernel)) {
    state.SkipWithError("this CPU lacks the path");
    return;
  }
  const std::vector<float> wf = random_floats(static_cast<std::size_t>(kLinN) * kLinK, 11);
  std::vector<std::uint16_t> wb;
  const void* src = wf.data();
  if (dtype == DType::bf16) {
    wb.reserve(wf.size());
    for (const float f : wf) wb.push_back(f32_to_bf16(f));
    src = wb.data();
  }
  const auto w = kernels::cpu::PackedLinear::pack(src, dtype, kLinN, kLinK);
  const std::vector<float> x = random_floats(static_cast<std::size_t>(m) * kLinK, 12);
  std::vector<float> y(static_cast<std::size_t>(m) * kLinN);
  for (auto _ : state) {
    kernels::cpu::linear(x.data(), m, kLinK, w, nullptr, y.data(), kLinN, nullptr, kernel);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(kernels::cpu::linear_kernel_name(kernel));
  linear_counters(state, m, static_cast<std::size_t>(kLinN) * kLinK * dtype_size(dtype));
}
BENCHMARK_CAPTURE(BM_DenseLinear, F32, DType::f32)->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_DenseLinear, BF16, DType::bf16)->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
// Each instruction path where the CPU has it (the label says which): the
// AVX2 one is what an AVX2-only CPU runs (kernels/cpu/linear_avx2.cpp).
BENCHMARK_CAPTURE(BM_DenseLinear, F32_avx2, DType::f32, kernels::cpu::LinearKernel::avx2)
    ->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_DenseLinear, BF16_avx2, DType::bf16, kernels::cpu::LinearKernel::avx2)
    ->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_DenseLinear, F32_avx512, DType::f32, kernels::cpu::LinearKernel::avx512)
    ->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();
BENCHMARK_CAPTURE(BM_DenseLinear, BF16_avx512, DType::bf16, kernels::cpu::LinearKernel::avx512)
    ->Arg(1)->Arg(32)->Arg(64)->Arg(256)->UseRealTime();

// The F32 FMA peak with OpenMP's thread count (a register-only FMA loop,
// sim/calibration/hardware.hpp; what `bench` reports as fma_peak_gflops):
// the limit BM_DenseLinear's GFLOP/s are read against in the same run.
void BM_FmaPeak(benchmark::State& state) {
  double gflops = 0;
  for (auto _ : state)
    gflops = std::max(gflops, sim::calibration::measure_fma_peak_gflops(omp_get_max_threads(), DType::f32, 1));
  state.counters["GFLOPs"] = gflops;  // GFLOP/s, best of the iterations
}
BENCHMARK(BM_FmaPeak)->Iterations(5)->UseRealTime();

BENCHMARK_MAIN();
