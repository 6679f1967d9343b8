#include "model/executor.hpp"

#include <string>
#include <utility>

namespace shardline::model {

Status validate_step(const StepInput& in, int vocab_size, int num_kv_blocks, int block_size) {
  const int n = in.num_tokens();
  const auto bad = [](std::string m) { return Status(make_error(ErrorCode::invalid_argument, "step: " + std::move(m))); };
  if (static_cast<int>(in.positions.size()) != n || static_cast<int>(in.slot_mapping.size()) != n)
    return bad("token_ids, positions and slot_mapping differ in length");
  if (in.block_size != block_size)
    return bad("block_size " + std::to_string(in.block_size) + " != runner's " + std::to_string(block_size));
  const int vocab = vocab_size;
  const long num_slots = static_cast<long>(num_kv_blocks) * block_size;
  for (int t = 0; t < n; ++t) {
    if (in.token_ids[t] < 0 || in.token_ids[t] >= vocab)
      return bad("token id " + std::to_string(in.token_ids[t]) + " at row " + std::to_string(t) +
                 " outside the vocabulary [0, " + std::to_string(vocab) + ")");
    if (in.positions[t] < 0) return bad("negative position at row " + std::to_string(t));
    if (in.slot_mapping[t] >= num_slots)
      return bad("KV slot " + std::to_string(in.slot_mapping[t]) + " outside the cache");
  }
  int rows = 0;
  for (const model::StepSeq& s : in.seqs) {
    const int ctx = s.num_computed_tokens + s.num_new_tokens;
    if (s.num_new_tokens <= 0 || s.num_computed_tokens < 0)
      return bad("sequence " + std::to_string(s.seq_id) + " has no new tokens");
    const long blocks_needed = (ctx + block_size - 1) / block_size;
    if (static_cast<long>(s.block_table.size()) < blocks_needed)
      return bad("sequence " + std::to_string(s.seq_id) + ": block table too short for " + std::to_string(ctx) + " tokens");
    for (std::int32_t b : s.block_table)
      if (b < 0 || b >= num_kv_blocks)
        return bad("sequence " + std::to_string(s.seq_id) + ": block id " + std::to_string(b) + " outside the cache");
    rows += s.num_new_tokens;
  }
  if (rows != n) return bad("sequences cover " + std::to_string(rows) + " rows, batch has " + std::to_string(n));
  for (std::int32_t r : in.logits_rows)
    if (r < 0 || r >= n) return bad("logits row " + std::to_string(r) + " outside the batch");
  return Status::ok_status();
}

}  // namespace shardline::model
