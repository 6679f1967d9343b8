#pragma once
// Drives a model runner directly (no scheduler) for numerics tests: each
// sequence owns a fixed, disjoint range of KV blocks; a step runs chunks of
// tokens and returns the logits rows asked for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/executor.hpp"

namespace shardline::testing_support {

class RunnerDriver {
 public:
  RunnerDriver(model::ModelExecutor& runner, int block_size) : runner_(runner), block_size_(block_size) {}

  struct Chunk {
    int seq = 0;                       ///< from add_seq
    std::vector<std::int32_t> tokens;  ///< appended at the sequence's next positions
    bool needs_logits = true;          ///< false: no logits row for this chunk
    bool all_logits = false;           ///< with needs_logits: every token's row, not only the last
  };

  /// A new sequence over blocks [first_block, first_block + num_blocks).
  int add_seq(int first_block, int num_blocks) {
    Seq s;
    for (int b = 0; b < num_blocks; ++b) s.blocks.push_back(first_block + b);
    seqs_.push_back(s);
    return static_cast<int>(seqs_.size()) - 1;
  }

  /// Runs one step; returns the logits rows ([vocab] each) in chunk order.
  std::vector<std::vector<float>> step(const std::vector<Chunk>& chunks) {
    model::StepInput in;
    in.block_size = block_size_;
    for (const Chunk& c : chunks) {
      Seq& s = seqs_[static_cast<std::size_t>(c.seq)];
      model::StepSeq ss;
      ss.seq_id = static_cast<std::uint64_t>(c.seq);
      ss.num_computed_tokens = s.num_computed;
      ss.num_new_tokens = static_cast<int>(c.tokens.size());
      ss.needs_logits = c.needs_logits;
      ss.block_table = s.blocks;
      for (std::size_t i = 0; i < c.tokens.size(); ++i) {
        const int pos = s.num_computed + static_cast<int>(i);
        in.token_ids.push_back(c.tokens[i]);
        in.positions.push_back(pos);
        in.slot_mapping.push_back(s.blocks[static_cast<std::size_t>(pos / block_size_)] * block_size_ +
                                  pos % block_size_);
        if (c.needs_logits && (c.all_logits || i + 1 == c.tokens.size()))
          in.logits_rows.push_back(static_cast<int>(in.token_ids.size()) - 1);
      }
      s.num_computed += ss.num_new_tokens;
      in.seqs.push_back(std::move(ss));
    }
    auto out = runner_.execute(in);
    EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.error().to_string());
    std::vector<std::vector<float>> rows;
    if (!out.ok()) return rows;
    const int v = out->vocab_size;
    for (int i = 0; i < in.num_logits(); ++i)
      rows.emplace_back(out->logits.begin() + static_cast<long>(i) * v,
                        out->logits.begin() + static_cast<long>(i + 1) * v);
    return rows;
  }

 private:
  struct Seq {
    std::vector<std::int32_t> blocks;
    int num_computed = 0;
  };
  model::ModelExecutor& runner_;
  int block_size_;
  std::vector<Seq> seqs_;
};

/// Index of the largest value (the lowest index on ties, as torch.argmax).
inline int argmax_of(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace shardline::testing_support
