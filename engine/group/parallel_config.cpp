#include "engine/group/parallel_config.hpp"

#include <charconv>

namespace shardline::engine {

std::string ParallelConfig::to_string() const {
  return "tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + ",sp=" + std::to_string(sp) +
         ",dp=" + std::to_string(dp);
}

Result<ParallelConfig> parse_parallel_config(std::string_view text) {
  ParallelConfig pc;
  if (text.empty() || text == "single") return pc;
  bool seen[4] = {false, false, false, false};
  const auto bad = [&](const std::string& m) {
    return make_error(ErrorCode::invalid_argument, "--parallel '" + std::string(text) + "': " + m);
  };
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = text.find(',', pos);
    const std::string_view part = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    const std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) return bad("expected key=value, got '" + std::string(part) + "'");
    const std::string_view key = part.substr(0, eq);
    const std::string_view val = part.substr(eq + 1);
    int idx = -1;
    if (key == "tp") idx = 0;
    else if (key == "pp") idx = 1;
    else if (key == "sp") idx = 2;
    else if (key == "dp") idx = 3;
    if (idx < 0) return bad("unknown key '" + std::string(key) + "' (expected tp, pp, sp or dp)");
    if (seen[idx]) return bad("'" + std::string(key) + "' given twice");
    seen[idx] = true;
    int v = 0;
    const auto [end, ec] = std::from_chars(val.data(), val.data() + val.size(), v);
    if (ec != std::errc() || end != val.data() + val.size() || v < 1 || v > 64)
      return bad("'" + std::string(key) + "' must be an integer in [1, 64], got '" + std::string(val) + "'");
    (idx == 0 ? pc.tp : idx == 1 ? pc.pp : idx == 2 ? pc.sp : pc.dp) = v;
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return pc;
}

RankCoord rank_coord(const ParallelConfig& pc, int group_rank) {
  RankCoord c;
  c.tp_rank = group_rank % pc.tp;
  c.sp_rank = (group_rank / pc.tp) % pc.sp;
  c.stage = group_rank / (pc.tp * pc.sp);
  return c;
}

int group_rank_of(const ParallelConfig& pc, RankCoord c) {
  return c.stage * pc.sp * pc.tp + c.sp_rank * pc.tp + c.tp_rank;
}

std::vector<int> tp_group_ranks(const ParallelConfig& pc, RankCoord c) {
  std::vector<int> out;
  for (int t = 0; t < pc.tp; ++t) out.push_back(group_rank_of(pc, {c.stage, c.sp_rank, t}));
  return out;
}

std::vector<int> sp_group_ranks(const ParallelConfig& pc, RankCoord c) {
  std::vector<int> out;
  for (int s = 0; s < pc.sp; ++s) out.push_back(group_rank_of(pc, {c.stage, s, c.tp_rank}));
  return out;
}

}  // namespace shardline::engine
