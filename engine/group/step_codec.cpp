#include "engine/group/step_codec.hpp"

#include <string>

namespace shardline::engine {

namespace {
constexpr std::int32_t kVersion = 1;
}

std::vector<std::int32_t> encode_step(const model::StepInput& in) {
  std::vector<std::int32_t> w;
  std::size_t size = 5 + 4 * in.token_ids.size() + in.logits_rows.size();
  for (const model::StepSeq& s : in.seqs) size += 6 + s.block_table.size();
  w.reserve(size);
  w.push_back(kVersion);
  w.push_back(static_cast<std::int32_t>(in.seqs.size()));
  w.push_back(in.num_tokens());
  w.push_back(in.num_logits());
  w.push_back(in.block_size);
  for (const model::StepSeq& s : in.seqs) {
    w.push_back(static_cast<std::int32_t>(static_cast<std::uint32_t>(s.seq_id & 0xffffffffu)));
    w.push_back(static_cast<std::int32_t>(static_cast<std::uint32_t>(s.seq_id >> 32)));
    w.push_back(s.num_computed_tokens);
    w.push_back(s.num_new_tokens);
    w.push_back(s.needs_logits ? 1 : 0);
    w.push_back(static_cast<std::int32_t>(s.block_table.size()));
    w.insert(w.end(), s.block_table.begin(), s.block_table.end());
  }
  w.insert(w.end(), in.token_ids.begin(), in.token_ids.end());
  w.insert(w.end(), in.positions.begin(), in.positions.end());
  w.insert(w.end(), in.slot_mapping.begin(), in.slot_mapping.end());
  w.insert(w.end(), in.logits_rows.begin(), in.logits_rows.end());
  return w;
}

Result<model::StepInput> decode_step(std::span<const std::int32_t> w) {
  std::size_t at = 0;
  const auto corrupt = [](const std::string& m) { return make_error(ErrorCode::corrupt, "step metadata: " + m); };
  const auto take = [&](std::size_t n) { return at + n <= w.size(); };
  if (!take(5)) return corrupt("shorter than its header");
  if (w[0] != kVersion) return corrupt("version " + std::to_string(w[0]) + ", expected 1");
  const std::int32_t num_seqs = w[1], num_tokens = w[2], num_logits = w[3];
  if (num_seqs < 0 || num_tokens < 0 || num_logits < 0) return corrupt("negative count");
  model::StepInput in;
  in.block_size = w[4];
  at = 5;
  in.seqs.resize(static_cast<std::size_t>(num_seqs));
  for (model::StepSeq& s : in.seqs) {
    if (!take(6)) return corrupt("truncated sequence header");
    s.seq_id = static_cast<std::uint64_t>(static_cast<std::uint32_t>(w[at])) |
               (static_cast<std::uint64_t>(static_cast<std::uint32_t>(w[at + 1])) << 32);
    s.num_computed_tokens = w[at + 2];
    s.num_new_tokens = w[at + 3];
    s.needs_logits = w[at + 4] != 0;
    const std::int32_t len = w[at + 5];
    at += 6;
    if (len < 0 || !take(static_cast<std::size_t>(len))) return corrupt("bad block table length");
    s.block_table.assign(w.begin() + static_cast<std::ptrdiff_t>(at), w.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += static_cast<std::size_t>(len);
  }
  const auto read = [&](std::vector<std::int32_t>& v, std::int32_t n) {
    if (!take(static_cast<std::size_t>(n))) return false;
    v.assign(w.begin() + static_cast<std::ptrdiff_t>(at), w.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += static_cast<std::size_t>(n);
    return true;
  };
  if (!read(in.token_ids, num_tokens) || !read(in.positions, num_tokens) || !read(in.slot_mapping, num_tokens) ||
      !read(in.logits_rows, num_logits))
    return corrupt("truncated token arrays");
  if (at != w.size()) return corrupt(std::to_string(w.size() - at) + " trailing words");
  return in;
}

}  // namespace shardline::engine
