#pragma once
/// \file
/// SiDP's two ways of running a layer this rank does not own (seed 002 §4):
/// WaS, Weight-as-a-Service (§4.2: fetch the owner's FFN weights, compute
/// locally) and CaS, Compute-as-a-Service (§4.3: send the activation rows to
/// the owner, which computes them with its own and returns the slice).

#include <optional>
#include <string_view>

namespace shardline::model::sidp {

enum class SidpMode { was, cas };

/// "was" / "cas".
[[nodiscard]] constexpr const char* mode_name(SidpMode m) noexcept { return m == SidpMode::was ? "was" : "cas"; }

/// Parses "was" / "cas"; nullopt otherwise.
[[nodiscard]] inline std::optional<SidpMode> parse_mode(std::string_view s) noexcept {
  if (s == "was") return SidpMode::was;
  if (s == "cas") return SidpMode::cas;
  return std::nullopt;
}

}  // namespace shardline::model::sidp
