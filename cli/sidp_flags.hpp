#pragma once
/// \file
/// `--weight-sharing sidp` and its options on `run`, `node start` and `generate` (SiDP,
/// seed 002; docs/sidp.md): the node's dp CPU workers share the FFN weights
/// through layer owners, and the orchestrator switches the group between
/// Weight-as-a-Service and Compute-as-a-Service by its effective batch.

#include <CLI/CLI.hpp>

#include <string>

#include "actors/node.hpp"
#include "common/result.hpp"

namespace shardline::cli {

struct SidpFlags {
  std::string weight_sharing = "none";  ///< "none" or "sidp"
  std::string ownership = "balanced";   ///< "balanced" or a plan "0,1,0,1"
  int cache_slots = 2;
  std::string peak_shifting = "on";     ///< "on" / "off"
  std::string mode = "auto";            ///< `--sidp-mode` auto | was | cas
  long long switch_batch = 0;           ///< b* on the group's effective batch; 0 = from the cost model
  double hysteresis = 0.25;
  double min_dwell_s = 3.0;
  double link_gbps = 0;                 ///< link emulation (comm/paced.hpp); 0 = off
  double link_latency_us = 0;
};

void add_sidp_flags(CLI::App& cmd, SidpFlags& f);

/// The group's settings from the flags, for `--parallel` (dp >= 2, one
/// device per rank). Errors: invalid_argument naming the flag.
[[nodiscard]] Result<engine::SidpOptions> to_sidp_options(const SidpFlags& f, const engine::ParallelConfig& parallel);
/// The switch policy's settings; b* as apply_sidp_flags says.
[[nodiscard]] Result<engine::SidpModePolicyOptions> to_sidp_policy(const SidpFlags& f, const engine::EngineOptions& engine,
                                                                   const engine::SidpOptions& so);

/// Fills o.sidp and o.sidp_policy (o.parallel, o.engine and o.max_batch
/// must be set). Without --sidp-switch-batch under --sidp-mode auto, b*
/// comes from the cost model (sim::CostModel::sidp_switch_batch_overlapped)
/// over this machine's memory bandwidth and GEMM rate measured now (about a
/// tenth of a second), each rank's share of them, and the link: it is
/// logged. Errors: invalid_argument naming the flag.
[[nodiscard]] Status apply_sidp_flags(const SidpFlags& f, actors::NodeOptions& o);

}  // namespace shardline::cli
