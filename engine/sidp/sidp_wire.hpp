#pragma once
/// \file
/// The wire forms of a SiDP process group's control messages
/// (engine/sidp/sidp_process.hpp): sampling params, request outputs and a rank's
/// SiDP counters as JSON values, sent as CBOR (nlohmann::json::to_cbor).
/// Logits rows travel as CBOR byte strings: the exact bits of each float
/// [vocab], NaN payloads included.

#include <nlohmann/json.hpp>

#include "common/result.hpp"
#include "engine/llm_engine.hpp"
#include "model/sidp/sidp_ffn.hpp"
#include "sampling/sampling_params.hpp"

namespace shardline::engine::sidp_wire {

[[nodiscard]] nlohmann::json params_to_json(const sampling::SamplingParams& p);
/// Errors: corrupt (a field missing or of the wrong type, named).
[[nodiscard]] Result<sampling::SamplingParams> params_from_json(const nlohmann::json& j);

[[nodiscard]] nlohmann::json output_to_json(const RequestOutput& o);
/// Errors: corrupt (a field missing or of the wrong type, a finish reason
/// out of range, a logits row whose bytes are not whole floats).
[[nodiscard]] Result<RequestOutput> output_from_json(const nlohmann::json& j);

[[nodiscard]] nlohmann::json stats_to_json(const model::sidp::SidpFfnStats& s);
/// Errors: corrupt.
[[nodiscard]] Result<model::sidp::SidpFfnStats> stats_from_json(const nlohmann::json& j);

}  // namespace shardline::engine::sidp_wire
