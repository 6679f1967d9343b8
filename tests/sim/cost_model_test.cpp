#include "sim/cost_model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/shard_runner.hpp"

namespace shardline::sim {
namespace sim_cost_model_test {

// Tiny model: W = 8*(2+2)*4 + 2*4*8 + 3*8*16 = 128 + 64 + 384 = 576 parameters
// per layer (1152 bytes at 2 bytes each); lm_head 32*8 = 256 parameters.
ModelShape tiny() {
  ModelShape s;
  s.num_layers = 2;
  s.hidden_size = 8;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.head_dim = 4;
  s.intermediate_size = 16;
  s.vocab_size = 32;
  return s;
}

// Round numbers so the hand computations below stay readable.
HardwareSpec slow_hw() {
  HardwareSpec hw;
  hw.memory_bw_bytes_per_s = 1000;
  hw.flops_per_s = 10000;
  hw.comm_bw_bytes_per_s = 100;
  hw.comm_latency_s = 0.01;
  return hw;
}

CostModel make(const ModelShape& shape, const HardwareSpec& hw, ElementSizes sizes = {}) {
  Result<CostModel> m = CostModel::create(shape, sizes, hw);
  EXPECT_TRUE(m.ok()) << m.error().to_string();
  return std::move(m).value();
}

StepCost estimate(const CostModel& m, const engine::ParallelConfig& pc, const StepShape& step) {
  Result<StepCost> c = m.estimate(pc, step);
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return c.ok() ? c.value() : StepCost{};
}

// 4 decoding sequences with 10 cached tokens each.
StepShape decode4() {
  StepShape s;
  for (int i = 0; i < 4; ++i) s.add_sequence(10, 1);
  return s;
}

TEST(CostModel, StepShapeAddSequence) {
  StepShape s;
  s.add_sequence(10, 1);  // decode: 11 keys
  s.add_sequence(0, 8);   // prefill from scratch: 1 + ... + 8 = 36 pairs
  s.add_sequence(16, 4);  // prefill chunk after 16 cached: 4*16 + 10 = 74 pairs
  s.add_sequence(5, 0);   // nothing
  EXPECT_EQ(s.num_decode_tokens, 1);
  EXPECT_EQ(s.num_prefill_tokens, 12);
  EXPECT_EQ(s.num_tokens(), 13);
  EXPECT_EQ(s.num_sequences, 3);
  EXPECT_EQ(s.num_context_tokens, 26);
  EXPECT_EQ(s.num_attention_pairs, 11 + 36 + 74);
}

TEST(CostModel, ShapeFromConfigAndLayerParams) {
  model::ModelConfig c;
  c.num_hidden_layers = 2;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 16;
  c.vocab_size = 32;
  const ModelShape s = ModelShape::from_config(c);
  EXPECT_EQ(s.num_layers, 2);
  EXPECT_EQ(s.num_kv_heads, 1);
  EXPECT_EQ(s.vocab_size, 32);
  EXPECT_DOUBLE_EQ(s.layer_params(), 576.0);
  EXPECT_TRUE(s.validate().ok());
}

TEST(CostModel, SingleDeviceDecodeByHand) {
  const CostModel m = make(tiny(), slow_hw());
  const StepCost c = estimate(m, {}, decode4());
  // Per layer: weights 1152 B / 1000 = 1.152 s vs 2*576*4 / 1e4 = 0.4608 s.
  // Attention: KV 2 B * 2 * 1 head * 4 * 40 ctx = 640 B + QKV 2 B * (2+2) * 4 * 4 tokens
  // = 128 B -> 0.768 s vs 4 * 2 * 4 * 44 pairs / 1e4 = 0.1408 s.
  // Layer 1.92 s, 2 layers 3.84 s; lm_head 512 B -> 0.512 s vs 2*256*4 / 1e4 = 0.2048 s.
  EXPECT_NEAR(c.total_ms, 4352.0, 1e-6);
  EXPECT_NEAR(c.weight_read_ms, 2 * 1152.0 + 512.0, 1e-6);
  EXPECT_NEAR(c.kv_read_ms, 2 * 768.0, 1e-6);
  EXPECT_NEAR(c.linear_compute_ms, 2 * 460.8 + 204.8, 1e-6);
  EXPECT_NEAR(c.attention_compute_ms, 2 * 140.8, 1e-6);
  EXPECT_DOUBLE_EQ(c.comm_ms, 0.0);
  EXPECT_DOUBLE_EQ(c.bubble_ms, 0.0);
  EXPECT_DOUBLE_EQ(c.tp_bytes_per_rank + c.sp_bytes_per_rank + c.pp_bytes_per_rank, 0.0);
  EXPECT_NEAR(c.memory_bytes, 2 * (1152.0 + 768.0) + 512.0, 1e-9);
  EXPECT_NEAR(c.flops, 2 * (4608.0 + 1408.0) + 2048.0, 1e-9);
  EXPECT_NEAR(c.tokens_per_s, 4 / 4.352, 1e-9);
  ASSERT_EQ(c.stages.size(), 1u);
  EXPECT_EQ(c.stages[0].num_layers, 2);
}

TEST(CostModel, TensorParallelByHand) {
  const CostModel m = make(tiny(), slow_hw());
  const StepCost c = estimate(m, {.tp = 2}, decode4());
  // W_rank = 8*4*(1 + 2*max(0.5, 1)) + 1*4*8 + 3*8*16/2 = 96 + 32 + 192 = 320 -> 640 B, 0.64 s
  // (vs 2*320*4 / 1e4 = 0.256 s). Attention: 1 query head, 1 (replicated) KV head:
  // 640 + 2*(1+2)*4*4 = 736 B -> 0.736 s (vs 704 FLOPs). All-reduce of 4*8*2 = 64 B: ring
  // sends 2*(1/2)*64 = 64 B, 0.01 + 0.64 = 0.65 s, twice per layer = 1.3 s.
  // Layer 2.676 s, 2 layers 5.352 s; lm_head 256 B -> 0.256 s, then the
  // vocab-parallel logits all-gather sends (2-1) * 4 rows * 16 * 2 B = 128 B:
  // 0.01 + 1.28 = 1.29 s.
  EXPECT_NEAR(c.total_ms, 5608.0 + 1290.0, 1e-6);
  EXPECT_NEAR(c.tp_comm_ms, 2600.0 + 1290.0, 1e-6);
  EXPECT_NEAR(c.weight_read_ms, 2 * 640.0 + 256.0, 1e-6);
  EXPECT_NEAR(c.tp_bytes_per_rank, 2 * 2 * 64.0 + 128.0, 1e-9);
  EXPECT_DOUBLE_EQ(c.sp_bytes_per_rank, 0.0);
}

TEST(CostModel, PipelineParallelByHand) {
  const CostModel m = make(tiny(), slow_hw());
  StepShape step = decode4();
  step.num_micro_batches = 2;
  const StepCost c = estimate(m, {.pp = 2}, step);
  // Micro-batch: 2 tokens, 20 context, 22 pairs, 2 sequences. Layer: max(1.152, 0.2304)
  // + max((320 + 64) / 1000, 704 / 1e4) = 1.536 s.
  // Stage 0: 1 layer + send 2*8*2 = 32 B (0.01 + 0.32 s) = 1.866 s.
  // Stage 1: 1 layer + lm_head max(0.512, 0.1024) = 2.048 s (the bottleneck).
  ASSERT_EQ(c.stages.size(), 2u);
  EXPECT_EQ(c.stages[0].num_layers, 1);
  EXPECT_EQ(c.stages[1].num_layers, 1);
  EXPECT_NEAR(c.stages[0].micro_batch_ms, 1866.0, 1e-6);
  EXPECT_NEAR(c.stages[1].micro_batch_ms, 2048.0, 1e-6);
  EXPECT_EQ(c.bottleneck_stage, 1);
  // total = t0 + t1 + (M - 1) * max = 1.866 + 2.048 + 2.048.
  EXPECT_NEAR(c.total_ms, 5962.0, 1e-6);
  EXPECT_NEAR(c.bubble_ms, 1866.0, 1e-6);
  EXPECT_NEAR(c.pp_bytes_per_rank, 2 * 32.0, 1e-9);
  EXPECT_DOUBLE_EQ(c.stages[1].pp_bytes, 0.0);
  EXPECT_DOUBLE_EQ(c.pp_comm_ms, 0.0);  // the bottleneck (last) stage sends nothing
  EXPECT_NEAR(c.stages[0].pp_comm_ms, 330.0, 1e-6);
}

TEST(CostModel, SequenceParallelByHand) {
  const CostModel m = make(tiny(), slow_hw());
  StepShape step;
  step.add_sequence(0, 8);  // 8 tokens, 36 pairs, no cached context
  const StepCost c = estimate(m, {.sp = 2}, step);
  // 4 rows per rank; weights replicated over SP: max(1.152, 2*576*4 / 1e4) = 1.152 s.
  // Attention: 1 query head, 1 KV head per rank over all 8 tokens: 2*(1+2)*4*8 = 192 B
  // -> 0.192 s (vs 4*1*4*36 = 576 FLOPs). All-to-alls send half of 4*(2+2)*4*2 = 128 B
  // and half of 4*2*4*2 = 64 B: 96 B, 2*0.01 + 0.96 = 0.98 s.
  // Layer 2.324 s, 2 layers 4.648 s; before lm_head the residual all-gather
  // sends (2-1) * 4 rows * 8 * 2 B = 64 B: 0.01 + 0.64 = 0.65 s; then every
  // SP rank computes the one logits row: max(0.512, 2*256*1 / 1e4) = 0.512 s.
  EXPECT_NEAR(c.total_ms, 5160.0 + 650.0, 1e-6);
  EXPECT_NEAR(c.sp_comm_ms, 1960.0 + 650.0, 1e-6);
  EXPECT_NEAR(c.sp_bytes_per_rank, 2 * 96.0 + 64.0, 1e-9);
  EXPECT_DOUBLE_EQ(c.tp_bytes_per_rank, 0.0);
}

TEST(CostModel, SequenceParallelPadsTheLastChunk) {
  // The runner splits n rows into sp chunks of ceil(n / sp) (the last
  // padded): 7 tokens under sp = 2 cost every rank 4 rows, as 8 do.
  const CostModel m = make(tiny(), slow_hw());
  StepShape seven, eight, six;
  seven.add_sequence(0, 7);
  eight.add_sequence(0, 8);
  six.add_sequence(0, 6);
  const StepCost c7 = estimate(m, {.sp = 2}, seven), c8 = estimate(m, {.sp = 2}, eight),
                 c6 = estimate(m, {.sp = 2}, six);
  // Linear FLOPs: 2 layers * 2*576*4 + lm_head 2*256*1 (one sequence) = 9728.
  EXPECT_NEAR(c7.linear_compute_ms, 9728.0 / 10000 * 1e3, 1e-6);
  EXPECT_DOUBLE_EQ(c7.linear_compute_ms, c8.linear_compute_ms);
  EXPECT_LT(c6.linear_compute_ms, c7.linear_compute_ms);
  EXPECT_DOUBLE_EQ(c7.sp_bytes_per_rank, c8.sp_bytes_per_rank);  // the padded rows are sent too
}

// A fast link with no latency, so the by-hand sums below stay short.
HardwareSpec shift_hw() {
  HardwareSpec hw = slow_hw();
  hw.comm_bw_bytes_per_s = 1000;
  hw.comm_latency_s = 0;
  return hw;
}

TEST(CostModel, ShiftThresholdByHand) {
  // Base sp=2 vs shift tp=2 on the tiny model, n decoding sequences with 1
  // cached token each (c = ceil(n / 2) rows per SP rank), seconds:
  //  base  = 2 layers * (max(1.152, 2*576*c / 1e4)      linear (W replicated)
  //                      + 0.04 n                        attention: 16n KV + 24n QKV bytes
  //                      + 24 c / 1000)                  two all-to-alls
  //          + max(0.512, 2*256*n / 1e4) + 16 c / 1000   lm_head (full vocab per rank), residual gather
  //  shift = 2 * (max(0.64, 2*320*n / 1e4)               linear: W_rank = 96 + 32 + 192
  //               + 0.04 n + 32 n / 1000)                two ring all-reduces of 8n bytes each... x2 sends
  //          + max(0.256, 2*128*n / 1e4) + 32 n / 1000   lm_head half the vocab, logits gather
  // n = 13 (c = 7): base 4.4576 > shift 4.2848; n = 14 (c = 7): base 4.5888 < shift 4.6144.
  const CostModel m = make(tiny(), shift_hw());
  Result<ShiftThresholdPoint> t = m.shift_threshold({.sp = 2}, 1, 64);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_EQ(t->threshold, 13);
  EXPECT_FALSE(t->capped);
  EXPECT_NEAR(t->base_ms, 4457.6, 1e-6);
  EXPECT_NEAR(t->shift_ms, 4284.8, 1e-6);
  EXPECT_NEAR(t->base_next_ms, 4588.8, 1e-6);
  EXPECT_NEAR(t->shift_next_ms, 4614.4, 1e-6);

  // Below the crossover the cap is the answer.
  Result<ShiftThresholdPoint> capped = m.shift_threshold({.sp = 2}, 1, 10);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->threshold, 10);
  EXPECT_TRUE(capped->capped);

  // A slow link makes TP's all-reduces lose at once: T = 0 (never shift).
  HardwareSpec slow_link = shift_hw();
  slow_link.comm_bw_bytes_per_s = 1;
  Result<ShiftThresholdPoint> never = make(tiny(), slow_link).shift_threshold({.sp = 2}, 1, 64);
  ASSERT_TRUE(never.ok());
  EXPECT_EQ(never->threshold, 0);
  EXPECT_FALSE(never->capped);
}

TEST(CostModel, ShiftThresholdRejectsBadArguments) {
  const CostModel m = make(tiny(), shift_hw());
  for (const engine::ParallelConfig& pc :
       {engine::ParallelConfig{}, engine::ParallelConfig{.pp = 2, .sp = 2}})
    EXPECT_EQ(m.shift_threshold(pc, 1, 64).error().code, ErrorCode::invalid_argument) << pc.to_string();
  EXPECT_EQ(m.shift_threshold({.sp = 2}, -1, 64).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(m.shift_threshold({.sp = 2}, 1, 0).error().code, ErrorCode::invalid_argument);
}

ModelShape llama8b() {
  ModelShape s;
  s.num_layers = 32;
  s.hidden_size = 4096;
  s.num_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.intermediate_size = 14336;
  s.vocab_size = 128256;
  return s;
}

HardwareSpec h100ish() {
  HardwareSpec hw;
  hw.memory_bw_bytes_per_s = 3.35e12;
  hw.flops_per_s = 800e12;
  hw.comm_bw_bytes_per_s = 150e9;
  hw.comm_latency_s = 10e-6;
  return hw;
}

StepShape decode_batch(int seqs, int ctx) {
  StepShape s;
  for (int i = 0; i < seqs; ++i) s.add_sequence(ctx, 1);
  return s;
}

TEST(CostModel, MoreTensorParallelismLessWeightTimeMoreComm) {
  const CostModel m = make(llama8b(), h100ish());
  const StepShape step = decode_batch(64, 1024);
  double prev_weight = 1e300, prev_comm = -1, prev_bytes = -1;
  for (int tp : {1, 2, 4, 8}) {
    const StepCost c = estimate(m, {.tp = tp}, step);
    EXPECT_LT(c.weight_read_ms, prev_weight) << "tp=" << tp;
    EXPECT_GT(c.comm_ms, prev_comm) << "tp=" << tp;
    EXPECT_GT(c.tp_bytes_per_rank, prev_bytes) << "tp=" << tp;
    if (tp == 1) {
      EXPECT_DOUBLE_EQ(c.comm_ms, 0.0);
    }
    prev_weight = c.weight_read_ms;
    prev_comm = c.comm_ms;
    prev_bytes = c.tp_bytes_per_rank;
  }
  // Ring volume 2 (tp-1)/tp of the all-reduces: tp=2 -> 1x, tp=4 -> 1.5x the
  // payload; plus the logits all-gather, (tp-1) * 64 rows * vocab/tp bf16.
  const double b2 = estimate(m, {.tp = 2}, step).tp_bytes_per_rank;
  const double b4 = estimate(m, {.tp = 4}, step).tp_bytes_per_rank;
  const double all_reduces = 32 * 2 * 64.0 * 4096 * 2;  // layers * 2 all-reduces * [64, 4096] bf16
  EXPECT_NEAR(b2, all_reduces + 1 * 64.0 * 64128 * 2, 1e-3);
  EXPECT_NEAR(b4, 1.5 * all_reduces + 3 * 64.0 * 32064 * 2, 1e-3);
  // With free communication, decode gets faster with TP (weights are the bottleneck).
  HardwareSpec fast = h100ish();
  fast.comm_bw_bytes_per_s = 1e18;
  fast.comm_latency_s = 0;
  const CostModel mf = make(llama8b(), fast);
  EXPECT_LT(estimate(mf, {.tp = 8}, step).total_ms, estimate(mf, {.tp = 1}, step).total_ms);
}

TEST(CostModel, SingleDeviceIsTheRooflineWhenMemoryBound) {
  // Decode of a few sequences: every part is memory-bound on an H100-like device.
  const CostModel m = make(llama8b(), h100ish());
  const StepCost c = estimate(m, {}, decode_batch(8, 2048));
  const double roofline_ms =
      std::max(c.flops / h100ish().flops_per_s, c.memory_bytes / h100ish().memory_bw_bytes_per_s) * 1e3;
  EXPECT_NEAR(c.total_ms, roofline_ms, 1e-9 * roofline_ms);
  EXPECT_NEAR(c.total_ms, c.weight_read_ms + c.kv_read_ms, 1e-9 * c.total_ms);
  // Bytes: 32 layers of W bf16 + lm_head + 8 * 2048 cached tokens of K and V
  // (8 heads * 128 * 2 B * 2) + Q,K,V of the 8 new tokens.
  const double w = llama8b().layer_params();
  const double expect_bytes = 32 * (w * 2 + 8 * 2048 * 2 * 8 * 128 * 2.0 + 8 * (32 + 16) * 128 * 2.0) +
                              128256.0 * 4096 * 2;
  EXPECT_NEAR(c.memory_bytes, expect_bytes, 1e-6 * expect_bytes);
}

TEST(CostModel, SingleDeviceIsTheRooflineWhenComputeBound) {
  // Peak / bandwidth = 1 FLOP per byte: a 256-token prefill is compute-bound everywhere.
  HardwareSpec hw = h100ish();
  hw.flops_per_s = hw.memory_bw_bytes_per_s;
  const CostModel m = make(llama8b(), hw);
  StepShape step;
  for (int i = 0; i < 4; ++i) step.add_sequence(0, 256);
  const StepCost c = estimate(m, {}, step);
  const double roofline_ms = std::max(c.flops / hw.flops_per_s, c.memory_bytes / hw.memory_bw_bytes_per_s) * 1e3;
  EXPECT_NEAR(c.total_ms, roofline_ms, 1e-9 * roofline_ms);
  EXPECT_NEAR(c.total_ms, c.compute_ms, 1e-9 * c.total_ms);
  const double w = llama8b().layer_params();
  const double expect_flops = 32 * (2 * w * 1024 + 4.0 * 32 * 128 * (4 * 256 * 257 / 2)) + 2 * 128256.0 * 4096 * 4;
  EXPECT_NEAR(c.flops, expect_flops, 1e-9 * expect_flops);
}

// flops_by_rows: the GEMM rate by the rank's rows, linear between points and
// flat beyond; a step's compute is priced at its own rows' rate, and an SP
// rank's rows are its chunk.
TEST(CostModel, GemmRateByRowsIsInterpolatedAtTheRanksRows) {
  HardwareSpec hw = slow_hw();
  hw.flops_by_rows = {{4, 2000}, {8, 6000}, {32, 9000}};
  EXPECT_DOUBLE_EQ(hw.flops_at(1), 2000);
  EXPECT_DOUBLE_EQ(hw.flops_at(4), 2000);
  EXPECT_DOUBLE_EQ(hw.flops_at(6), 4000);
  EXPECT_DOUBLE_EQ(hw.flops_at(16), 7000);
  EXPECT_DOUBLE_EQ(hw.flops_at(64), 9000);
  EXPECT_DOUBLE_EQ(HardwareSpec{}.flops_at(16), 0) << "no curve: flops_per_s";

  // A compute-bound prefill of 16 tokens (no KV): its compute is priced at
  // 7000 FLOP/s, as a device of that flat rate prices it.
  StepShape step;
  step.add_sequence(0, 16);
  HardwareSpec flat = hw;
  flat.flops_by_rows.clear();
  flat.flops_per_s = 7000;
  const StepCost curve = estimate(make(tiny(), hw), {}, step);
  const StepCost same = estimate(make(tiny(), flat), {}, step);
  EXPECT_NEAR(curve.total_ms, same.total_ms, 1e-9 * same.total_ms);
  EXPECT_GT(curve.compute_ms, curve.weight_read_ms) << "the example must be compute-bound";
  // With sp=2 each rank has 8 rows: 6000 FLOP/s.
  engine::ParallelConfig sp2;
  sp2.sp = 2;
  flat.flops_per_s = 6000;
  EXPECT_NEAR(estimate(make(tiny(), hw), sp2, step).total_ms, estimate(make(tiny(), flat), sp2, step).total_ms,
              1e-9 * estimate(make(tiny(), flat), sp2, step).total_ms);

  // Points must ascend in rows and be positive.
  hw.flops_by_rows = {{8, 6000}, {4, 2000}};
  EXPECT_FALSE(CostModel::create(tiny(), {}, hw).ok());
  hw.flops_by_rows = {{4, 0}};
  EXPECT_FALSE(CostModel::create(tiny(), {}, hw).ok());
}

// tp_flops_by_rows: a TP rank's GEMM rate by its rows (ranks in lockstep);
// it prices steps of tp > 1 only, and tp = 1 or sp-only groups keep
// flops_by_rows.
TEST(CostModel, TensorParallelRanksArePricedOnTheirOwnCurve) {
  HardwareSpec hw = slow_hw();
  hw.flops_by_rows = {{4, 2000}, {32, 9000}};
  hw.tp_flops_by_rows = {{4, 1000}, {32, 5000}};
  EXPECT_DOUBLE_EQ(hw.flops_at(18, 1), hw.flops_at(18));
  EXPECT_DOUBLE_EQ(hw.flops_at(18, 2), 3000);
  EXPECT_DOUBLE_EQ(hw.flops_at(64, 4), 5000);
  HardwareSpec no_tp = hw;
  no_tp.tp_flops_by_rows.clear();
  EXPECT_DOUBLE_EQ(no_tp.flops_at(18, 2), no_tp.flops_at(18)) << "no TP curve: flops_by_rows";

  // A compute-bound prefill of 16 tokens under tp=2: priced as a flat
  // device of the TP curve's rate at 16 rows (3000 + 2000 * 12 / 28).
  StepShape step;
  step.add_sequence(0, 16);
  engine::ParallelConfig tp2;
  tp2.tp = 2;
  HardwareSpec flat = hw;
  flat.flops_by_rows.clear();
  flat.tp_flops_by_rows.clear();
  flat.flops_per_s = 1000 + 4000.0 * 12 / 28;
  const StepCost curve = estimate(make(tiny(), hw), tp2, step);
  const StepCost same = estimate(make(tiny(), flat), tp2, step);
  EXPECT_NEAR(curve.total_ms, same.total_ms, 1e-9 * same.total_ms);
  EXPECT_GT(curve.compute_ms, curve.weight_read_ms) << "the example must be compute-bound";
  // sp=2 (tp = 1) stays on flops_by_rows: 8 rows per rank.
  engine::ParallelConfig sp2;
  sp2.sp = 2;
  EXPECT_NEAR(estimate(make(tiny(), hw), sp2, step).total_ms, estimate(make(tiny(), no_tp), sp2, step).total_ms,
              1e-12);
  EXPECT_GT(curve.total_ms, estimate(make(tiny(), no_tp), tp2, step).total_ms) << "the slower TP curve is used";

  hw.tp_flops_by_rows = {{8, 6000}, {4, 2000}};
  auto bad = CostModel::create(tiny(), {}, hw);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("tp_flops_by_rows"), std::string::npos) << bad.error().message;
}

TEST(CostModel, PipelineBubbleAndStageSplit) {
  const CostModel m = make(llama8b(), h100ish());
  StepShape step = decode_batch(64, 1024);
  step.num_micro_batches = 4;
  const StepCost c = estimate(m, {.pp = 4}, step);
  ASSERT_EQ(c.stages.size(), 4u);
  double sum = 0, mx = 0;
  for (const StageCost& s : c.stages) {
    EXPECT_EQ(s.num_layers, 8);
    sum += s.micro_batch_ms;
    mx = std::max(mx, s.micro_batch_ms);
  }
  EXPECT_EQ(c.bottleneck_stage, 3);  // lm_head
  EXPECT_NEAR(c.bubble_ms, sum - mx, 1e-9);
  EXPECT_NEAR(c.total_ms, sum + 3 * mx, 1e-9);
  EXPECT_GT(c.pp_bytes_per_rank, 0.0);
  // Uneven split: the first L % pp stages get one layer more, as in model/shard_runner.
  ModelShape odd = tiny();
  odd.num_layers = 7;
  const CostModel mo = make(odd, slow_hw());
  const StepCost co = estimate(mo, {.pp = 3}, decode4());
  ASSERT_EQ(co.stages.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    const auto [first, last] = model::stage_layer_range(7, 3, s);
    EXPECT_EQ(co.stages[s].num_layers, last - first) << s;
  }
}

TEST(CostModel, DataParallelScalesThroughputOnly) {
  const CostModel m = make(llama8b(), h100ish());
  const StepShape step = decode_batch(32, 512);
  const StepCost one = estimate(m, {}, step);
  const StepCost four = estimate(m, {.dp = 4}, step);
  EXPECT_DOUBLE_EQ(one.total_ms, four.total_ms);
  EXPECT_NEAR(four.tokens_per_s, 4 * one.tokens_per_s, 1e-9 * four.tokens_per_s);
}

TEST(CostModel, EmptyStepCostsNothing) {
  const CostModel m = make(tiny(), slow_hw());
  const StepCost c = estimate(m, {.tp = 2, .pp = 2}, StepShape{});
  EXPECT_DOUBLE_EQ(c.total_ms, 0.0);
  EXPECT_DOUBLE_EQ(c.tokens_per_s, 0.0);
  ASSERT_EQ(c.stages.size(), 2u);
  EXPECT_EQ(c.stages[0].num_layers, 1);
}

TEST(CostModel, Errors) {
  const auto expect_bad = [](const Error& e, const std::string& what) {
    EXPECT_EQ(e.code, ErrorCode::invalid_argument);
    EXPECT_NE(e.message.find(what), std::string::npos) << e.message;
  };
  ModelShape s = tiny();
  s.head_dim = 0;
  Result<CostModel> r = CostModel::create(s, {}, slow_hw());
  ASSERT_FALSE(r.ok());
  expect_bad(r.error(), "head_dim");
  s = tiny();
  s.num_heads = 3;
  s.num_kv_heads = 2;
  r = CostModel::create(s, {}, slow_hw());
  ASSERT_FALSE(r.ok());
  expect_bad(r.error(), "num_kv_heads");
  HardwareSpec hw = slow_hw();
  hw.memory_bw_bytes_per_s = 0;
  r = CostModel::create(tiny(), {}, hw);
  ASSERT_FALSE(r.ok());
  expect_bad(r.error(), "memory_bw_bytes_per_s");
  hw = slow_hw();
  hw.comm_latency_s = -1;
  r = CostModel::create(tiny(), {}, hw);
  ASSERT_FALSE(r.ok());
  expect_bad(r.error(), "comm_latency_s");
  r = CostModel::create(tiny(), {.weight_bytes = 0}, slow_hw());
  ASSERT_FALSE(r.ok());
  expect_bad(r.error(), "weight_bytes");

  const CostModel m = make(tiny(), slow_hw());
  Result<StepCost> c = m.estimate({.tp = 0}, decode4());
  ASSERT_FALSE(c.ok());
  expect_bad(c.error(), "tp=0");
  c = m.estimate({.pp = 3}, decode4());
  ASSERT_FALSE(c.ok());
  expect_bad(c.error(), "pp = 3");
  StepShape step = decode4();
  step.num_micro_batches = 0;
  c = m.estimate({}, step);
  ASSERT_FALSE(c.ok());
  expect_bad(c.error(), "num_micro_batches");
  step = decode4();
  step.num_context_tokens = -1;
  c = m.estimate({}, step);
  ASSERT_FALSE(c.ok());
  expect_bad(c.error(), ">= 0");
}

// SiDP weight fetch (tiny(), slow_hw()): F = 3*8*16 = 384 FFN parameters,
// 768 bytes; T_dm = 768 / 1000 B/s = 768 ms; T_comp(b) = 2*384*b / 10000 =
// 76.8 b ms.
SidpSwitchPoint switch_point(const CostModel& m, LinkSpec link, long long max_batch = 4096) {
  Result<SidpSwitchPoint> r = m.sidp_switch_batch(link, max_batch);
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.ok() ? r.value() : SidpSwitchPoint{};
}

TEST(CostModel, SidpWeightFetchAndFfnGemmByHand) {
  const CostModel m = make(tiny(), slow_hw());
  EXPECT_DOUBLE_EQ(m.ffn_layer_bytes(), 768.0);
  // 10 ms + 768 B / 100 B/s.
  EXPECT_DOUBLE_EQ(m.sidp_weight_fetch_ms({.bandwidth_bytes_per_s = 100, .latency_s = 0.01}), 7690.0);
  EXPECT_DOUBLE_EQ(m.sidp_ffn_gemm_ms(1), 768.0);    // memory-bound: weight streaming
  EXPECT_DOUBLE_EQ(m.sidp_ffn_gemm_ms(10), 768.0);   // 768 = 768: the knee
  EXPECT_DOUBLE_EQ(m.sidp_ffn_gemm_ms(20), 1536.0);  // compute-bound
  EXPECT_DOUBLE_EQ(m.sidp_ffn_gemm_ms(-3), 768.0);
  // F32 weights double the bytes, not the FLOPs.
  const CostModel f32 = make(tiny(), slow_hw(), {.weight_bytes = 4});
  EXPECT_DOUBLE_EQ(f32.ffn_layer_bytes(), 1536.0);
  EXPECT_DOUBLE_EQ(f32.sidp_ffn_gemm_ms(20), 1536.0);
  EXPECT_DOUBLE_EQ(f32.sidp_ffn_gemm_ms(1), 1536.0);
  const LinkSpec l = LinkSpec::from_gbps(900, 2);
  EXPECT_DOUBLE_EQ(l.bandwidth_bytes_per_s, 900e9);
  EXPECT_DOUBLE_EQ(l.latency_s, 2e-6);
}

TEST(CostModel, SidpSwitchBatchByHand) {
  const CostModel m = make(tiny(), slow_hw());
  // T_fetch = 7690 ms: b* = ceil(7690 / 76.8) = ceil(100.13) = 101.
  SidpSwitchPoint p = switch_point(m, {.bandwidth_bytes_per_s = 100, .latency_s = 0.01});
  EXPECT_EQ(p.switch_batch, 101);
  EXPECT_FALSE(p.capped);
  EXPECT_DOUBLE_EQ(p.fetch_ms, 7690.0);
  EXPECT_DOUBLE_EQ(p.ffn_weight_read_ms, 768.0);
  EXPECT_NEAR(p.ffn_gemm_ms, 7756.8, 1e-9);
  EXPECT_LT(m.sidp_ffn_gemm_ms(100), p.fetch_ms);  // b* - 1 does not hide the fetch
  // No latency: T_fetch = 7680 ms = T_ffn(100) exactly;
  // b* = FLOPS * weight_bytes / (2 B_link) = 10000 * 2 / 200 = 100.
  p = switch_point(m, {.bandwidth_bytes_per_s = 100, .latency_s = 0});
  EXPECT_EQ(p.switch_batch, 100);
  EXPECT_DOUBLE_EQ(p.ffn_gemm_ms, 7680.0);
  // Link twice as fast as memory: streaming the weights from memory alone
  // hides the fetch (384 ms < 768 ms), b* = 1.
  p = switch_point(m, {.bandwidth_bytes_per_s = 2000, .latency_s = 0});
  EXPECT_EQ(p.switch_batch, 1);
  EXPECT_DOUBLE_EQ(p.fetch_ms, 384.0);
  EXPECT_DOUBLE_EQ(p.ffn_gemm_ms, 768.0);
  // Link as fast as memory: T_fetch = T_dm, still 1.
  EXPECT_EQ(switch_point(m, {.bandwidth_bytes_per_s = 1000, .latency_s = 0}).switch_batch, 1);
  // A hair slower: T_fetch = 768.77 ms, and batches up to 10 are all 768 ms
  // (memory-bound), so b* jumps to ceil(768.77 / 76.8) = 11.
  EXPECT_EQ(switch_point(m, {.bandwidth_bytes_per_s = 999, .latency_s = 0}).switch_batch, 11);
}

TEST(CostModel, SidpSwitchBatchFallsAsTheLinkGetsFaster) {
  const CostModel m = make(tiny(), slow_hw());
  long long prev = -1;
  std::vector<long long> seen;
  for (double bw : {10.0, 25.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1000.0, 4000.0}) {
    const long long b = switch_point(m, {.bandwidth_bytes_per_s = bw, .latency_s = 0.01}).switch_batch;
    if (prev >= 0) {
      EXPECT_LE(b, prev) << bw;
    }
    prev = b;
    seen.push_back(b);
  }
  // T_fetch = 10 ms + 768 B / B_link; b* = ceil(T_fetch / 76.8 ms) while the
  // fetch is slower than T_dm = 768 ms:
  //   10 B/s: 76810 ms -> ceil(1000.13) = 1001    25: 30730 -> 401
  //   50: 15370 -> 201    100: 7690 -> 101    200: 3850 -> 51
  //   400: 1930 -> ceil(25.13) = 26    800: 970 -> ceil(12.63) = 13
  //   1000: 778 -> ceil(10.13) = 11    4000: 202 < 768 -> 1
  EXPECT_EQ(seen, (std::vector<long long>{1001, 401, 201, 101, 51, 26, 13, 11, 1}));
  // More latency, larger b*; more FLOPS, larger b* (the GEMM is done sooner).
  EXPECT_GT(switch_point(m, {.bandwidth_bytes_per_s = 100, .latency_s = 1}).switch_batch, 101);
  HardwareSpec fast = slow_hw();
  fast.flops_per_s *= 2;
  EXPECT_EQ(switch_point(make(tiny(), fast), {.bandwidth_bytes_per_s = 100, .latency_s = 0}).switch_batch, 200);
}

TEST(CostModel, SidpSwitchBatchIsShapeFreeWithoutLatency) {
  // b* = ceil(FLOPS * weight_bytes / (2 B_link)) whatever the FFN size, as
  // long as the fetch is slower than streaming from memory. H200-like:
  // 989 TFLOP/s BF16, 4.8 TB/s HBM, 900 GB/s NVLink: ceil(1098.9) = 1099.
  HardwareSpec h200;
  h200.memory_bw_bytes_per_s = 4.8e12;
  h200.flops_per_s = 989e12;
  h200.comm_bw_bytes_per_s = 900e9;
  h200.comm_latency_s = 0;
  ModelShape qwen = tiny();
  qwen.hidden_size = 1024;
  qwen.num_heads = 16;
  qwen.num_kv_heads = 8;
  qwen.head_dim = 128;
  qwen.intermediate_size = 3072;
  const LinkSpec nvlink = LinkSpec::from_gbps(900, 0);
  EXPECT_EQ(switch_point(make(tiny(), h200), nvlink).switch_batch, 1099);
  EXPECT_EQ(switch_point(make(qwen, h200), nvlink).switch_batch, 1099);
  // A latency weighs more on a small FFN: 2 us on qwen's 18.9 MB layer is
  // ceil(989e12 * (2e-6 / (2 * 9437184) + 2 / 1.8e12)) = ceil(1098.9 + 104.8).
  EXPECT_EQ(switch_point(make(qwen, h200), LinkSpec::from_gbps(900, 2)).switch_batch, 1204);
}

TEST(CostModel, SidpSwitchBatchKeepsAnExactBalance) {
  // Without latency and at B_link = FLOPS * weight_bytes / (2 k) = 10000 / k,
  // T_ffn(k) = T_fetch exactly: b* = k, although the closed form rounds to
  // k + 1e-15 (and its ceil to k + 1) for many k (14, 15, 28, 30, ...).
  const CostModel m = make(tiny(), slow_hw());
  for (long long k = 11; k <= 300; ++k)
    EXPECT_EQ(switch_point(m, {.bandwidth_bytes_per_s = 10000.0 / static_cast<double>(k), .latency_s = 0}).switch_batch,
              k);
}

TEST(CostModel, SidpSwitchBatchCap) {
  const CostModel m = make(tiny(), slow_hw());
  // 0.1 B/s: T_fetch = 7680 s, b* = 100000 > 4096.
  SidpSwitchPoint p = switch_point(m, {.bandwidth_bytes_per_s = 0.1, .latency_s = 0});
  EXPECT_EQ(p.switch_batch, 4096);
  EXPECT_TRUE(p.capped);
  EXPECT_LT(p.ffn_gemm_ms, p.fetch_ms);
  p = switch_point(m, {.bandwidth_bytes_per_s = 0.1, .latency_s = 0}, 1'000'000);
  EXPECT_EQ(p.switch_batch, 100000);
  EXPECT_FALSE(p.capped);
  p = switch_point(m, {.bandwidth_bytes_per_s = 100, .latency_s = 0.01}, 50);
  EXPECT_EQ(p.switch_batch, 50);
  EXPECT_TRUE(p.capped);
  // Exactly at the cap is not capped.
  p = switch_point(m, {.bandwidth_bytes_per_s = 100, .latency_s = 0.01}, 101);
  EXPECT_EQ(p.switch_batch, 101);
  EXPECT_FALSE(p.capped);
}

// The overlapped b* (tiny(), slow_hw()): W = 8*(2+2)*4 + 2*4*8 + 3*8*16 =
// 576 parameters, 1152 bytes: T_layer(b) = max(1152 ms, 115.2 b ms).
TEST(CostModel, SidpOverlappedSwitchBatchByHand) {
  const CostModel m = make(tiny(), slow_hw());
  EXPECT_DOUBLE_EQ(tiny().layer_params(), 576.0);
  EXPECT_DOUBLE_EQ(m.sidp_layer_ms(1), 1152.0);
  EXPECT_DOUBLE_EQ(m.sidp_layer_ms(20), 2304.0);
  EXPECT_DOUBLE_EQ(m.sidp_layer_ms(-1), 1152.0);
  const LinkSpec link{.bandwidth_bytes_per_s = 100, .latency_s = 0.01};  // T_fetch = 7690 ms
  auto at = [&](int dp, LinkSpec l) {
    auto r = m.sidp_switch_batch_overlapped(l, dp);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? *r : SidpSwitchPoint{};
  };
  // dp = 2: T_layer >= 7690 / 2 = 3845 ms -> b >= 33.38 -> 34.
  SidpSwitchPoint p = at(2, link);
  EXPECT_EQ(p.switch_batch, 34);
  EXPECT_EQ(p.dp, 2);
  EXPECT_FALSE(p.capped);
  EXPECT_DOUBLE_EQ(p.fetch_ms, 7690.0);
  EXPECT_NEAR(p.layer_ms, 3916.8, 1e-9);
  EXPECT_LT(m.sidp_layer_ms(33), 3845.0);
  // dp = 4: 3/4 of 7690 = 5767.5 ms -> b >= 50.07 -> 51.
  EXPECT_EQ(at(4, link).switch_batch, 51);
  // The FFN-only b* of the same link is 101: the overlapped one is below it.
  EXPECT_EQ(switch_point(m, link).switch_batch, 101);
  // A fast link: T_fetch = 384 ms, half of it is under the 1152 ms floor.
  EXPECT_EQ(at(2, {.bandwidth_bytes_per_s = 2000, .latency_s = 0}).switch_batch, 1);
  // Capped like the FFN-only one.
  p = m.sidp_switch_batch_overlapped(link, 2, 20).value();
  EXPECT_EQ(p.switch_batch, 20);
  EXPECT_TRUE(p.capped);
  // Never above the FFN-only b*, for any link.
  for (double bw : {1.0, 10.0, 99.0, 100.0, 333.0, 1000.0, 5000.0})
    for (int dp : {2, 3, 8})
      EXPECT_LE(at(dp, {.bandwidth_bytes_per_s = bw, .latency_s = 0.002}).switch_batch,
                switch_point(m, {.bandwidth_bytes_per_s = bw, .latency_s = 0.002}).switch_batch)
          << bw << " " << dp;
  auto bad = m.sidp_switch_batch_overlapped(link, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("dp must be >= 2, got 1"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(m.sidp_switch_batch_overlapped({.bandwidth_bytes_per_s = 0, .latency_s = 0}, 2).ok());
}

/// The 2-layer shape of the SiDP rank tests, and their link (100 B/s, 10 ms).
model::ModelConfig sidp_rank_config() {
  model::ModelConfig c;
  c.num_hidden_layers = 2;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 16;
  c.vocab_size = 32;
  return c;
}
constexpr LinkSpec kSidpRankLink{.bandwidth_bytes_per_s = 100, .latency_s = 0.01};

TEST(CostModel, ForSidpRankTakesItsShareOfTheMachine) {
  const model::ModelConfig c = sidp_rank_config();
  const LinkSpec link = kSidpRankLink;
  auto m = CostModel::for_sidp_rank(c, DType::bf16, DType::f32, 4000, 40000, 4, link);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_DOUBLE_EQ(m->hardware().memory_bw_bytes_per_s, 1000);
  EXPECT_DOUBLE_EQ(m->hardware().flops_per_s, 10000);
  EXPECT_DOUBLE_EQ(m->hardware().comm_bw_bytes_per_s, 100);
  EXPECT_DOUBLE_EQ(m->hardware().comm_latency_s, 0.01);
  EXPECT_DOUBLE_EQ(m->sizes().weight_bytes, 2);
  EXPECT_DOUBLE_EQ(m->sizes().kv_bytes, 4);
  EXPECT_DOUBLE_EQ(m->sizes().activation_bytes, 4);
  // tiny() on slow_hw(): the by-hand b* of that test.
  EXPECT_EQ(m->sidp_switch_batch_overlapped(link, 2).value().switch_batch, 34);
  EXPECT_FALSE(CostModel::for_sidp_rank(c, DType::bf16, DType::f32, 4000, 40000, 0, link).ok());
}

// A SiDP rank whose FFN is held in its own format (a quantized file's
// regions, engine::sidp_ffn_format): the fetch and the GEMM floor move with
// the bytes per weight, by hand on the shape above (F = 3 x 8 x 16 = 384
// FFN weights a layer; per rank 1000 B/s, 10000 FLOP/s; link 100 B/s +
// 10 ms):
//   Q4_1's 0.75 B: T_fetch = 0.01 + 384 x 0.75 / 100 = 2.89 s;
//     b* = ceil(10000 (0.01 / 768 + 0.75 / 200)) = ceil(37.63) = 38
//   BF16's 2 B:    T_fetch = 0.01 + 768 / 100 = 7.69 s;  b* = ceil(100.13) = 101
TEST(CostModel, ForSidpRankPricesWeightsAtTheirOwnBytes) {
  const model::ModelConfig c = sidp_rank_config();
  const LinkSpec link = kSidpRankLink;
  auto q = CostModel::for_sidp_rank(c, 0.75, DType::f32, 4000, 40000, 4, link);
  ASSERT_TRUE(q.ok()) << q.error().to_string();
  EXPECT_DOUBLE_EQ(q->sizes().weight_bytes, 0.75);
  EXPECT_DOUBLE_EQ(q->hardware().flops_per_s, 10000);
  EXPECT_DOUBLE_EQ(q->ffn_layer_bytes(), 288);
  EXPECT_NEAR(q->sidp_weight_fetch_ms(link), 2890, 1e-9);
  EXPECT_EQ(q->sidp_switch_batch(link).value().switch_batch, 38);
  auto d = CostModel::for_sidp_rank(c, DType::bf16, DType::f32, 4000, 40000, 4, link);
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_NEAR(d->sidp_weight_fetch_ms(link), 7690, 1e-9);
  EXPECT_EQ(d->sidp_switch_batch(link).value().switch_batch, 101);
  // The DType form is the bytes form at the dtype's size.
  auto b = CostModel::for_sidp_rank(c, 2.0, DType::f32, 4000, 40000, 4, link);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->sidp_switch_batch_overlapped(link, 2).value().switch_batch,
            d->sidp_switch_batch_overlapped(link, 2).value().switch_batch);
  for (const double bad : {0.0, -1.0, std::nan("")}) {
    auto r = CostModel::for_sidp_rank(c, bad, DType::f32, 4000, 40000, 4, link);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  }
}

TEST(CostModel, SidpSwitchBatchErrors) {
  const CostModel m = make(tiny(), slow_hw());
  const auto expect_bad = [&](LinkSpec link, long long max_batch, const std::string& what) {
    Result<SidpSwitchPoint> r = m.sidp_switch_batch(link, max_batch);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  };
  expect_bad({.bandwidth_bytes_per_s = 0, .latency_s = 0}, 4096, "bandwidth_bytes_per_s");
  expect_bad({.bandwidth_bytes_per_s = -5, .latency_s = 0}, 4096, "bandwidth_bytes_per_s");
  expect_bad({.bandwidth_bytes_per_s = 100, .latency_s = -1}, 4096, "latency_s");
  expect_bad({.bandwidth_bytes_per_s = 100, .latency_s = std::nan("")}, 4096, "latency_s");
  expect_bad({.bandwidth_bytes_per_s = 100, .latency_s = 0}, 0, "max_batch");
}

}  // namespace
}  // namespace shardline::sim
