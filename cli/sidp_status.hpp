#pragma once
/// \file
/// How `shardline job status` shows the cluster's SiDP groups (seed 002
/// §4.3): each group's mode, setting, b*, effective batch and last switch.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "messages/types.hpp"

namespace shardline::cli {

/// "2026-11-24T08:01:02.345Z" (UTC) for a wall-clock time in ms since 1970.
[[nodiscard]] std::string format_unix_ms(std::uint64_t unix_ms);

/// One line per group, e.g. "sidp node0/sidp: cas (auto, b*=8, group batch
/// 3, 2 ranks), 1 switch, last: cas at 2026-11-24T08:01:02.345Z (batch 5,
/// epoch 1)"; "" when there is none.
[[nodiscard]] std::string format_sidp_groups(const std::vector<messages::SidpGroupStatus>& groups);

/// The groups for `job status --json` (every listed switch, oldest first).
[[nodiscard]] nlohmann::json sidp_groups_json(const std::vector<messages::SidpGroupStatus>& groups);

}  // namespace shardline::cli
