#include "engine/sidp/sidp_wire.hpp"

#include <cstring>
#include <stdexcept>

namespace shardline::engine::sidp_wire {

namespace sidp = model::sidp;
using nlohmann::json;

namespace {

json params_json(const sampling::SamplingParams& p) {
  return json{{"temperature", p.temperature},   {"top_k", p.top_k},
              {"top_p", p.top_p},               {"min_p", p.min_p},
              {"repetition_penalty", p.repetition_penalty},
              {"presence_penalty", p.presence_penalty},
              {"frequency_penalty", p.frequency_penalty},
              {"seed", p.seed},                 {"has_seed", p.has_seed},
              {"max_tokens", p.max_tokens},     {"min_tokens", p.min_tokens},
              {"ignore_eos", p.ignore_eos},     {"stop_token_ids", p.stop_token_ids},
              {"stop", p.stop}};
}

sampling::SamplingParams params_from_json_or_throw(const json& j) {
  sampling::SamplingParams p;
  p.temperature = j.at("temperature").get<float>();
  p.top_k = j.at("top_k").get<int>();
  p.top_p = j.at("top_p").get<float>();
  p.min_p = j.at("min_p").get<float>();
  p.repetition_penalty = j.at("repetition_penalty").get<float>();
  p.presence_penalty = j.at("presence_penalty").get<float>();
  p.frequency_penalty = j.at("frequency_penalty").get<float>();
  p.seed = j.at("seed").get<std::uint64_t>();
  p.has_seed = j.at("has_seed").get<bool>();
  p.max_tokens = j.at("max_tokens").get<int>();
  p.min_tokens = j.at("min_tokens").get<int>();
  p.ignore_eos = j.at("ignore_eos").get<bool>();
  p.stop_token_ids = j.at("stop_token_ids").get<std::vector<int>>();
  p.stop = j.at("stop").get<std::vector<std::string>>();
  return p;
}

json output_json(const RequestOutput& o) {
  json logits = json::array();
  for (const std::vector<float>& row : o.logits) {
    std::vector<std::uint8_t> bytes(row.size() * sizeof(float));
    if (!row.empty()) std::memcpy(bytes.data(), row.data(), bytes.size());
    logits.push_back(json::binary(std::move(bytes)));
  }
  return json{{"id", o.request_id},
              {"prompt", o.prompt_token_ids},
              {"ids", o.token_ids},
              {"text", o.text},
              {"finish", static_cast<int>(o.finish_reason)},
              {"stop_reason", o.stop_reason},
              {"preemptions", o.num_preemptions},
              {"logits", std::move(logits)}};
}

RequestOutput output_from_json_or_throw(const json& j) {
  RequestOutput o;
  o.request_id = j.at("id").get<std::uint64_t>();
  o.prompt_token_ids = j.at("prompt").get<std::vector<std::int32_t>>();
  o.token_ids = j.at("ids").get<std::vector<std::int32_t>>();
  o.text = j.at("text").get<std::string>();
  const int finish = j.at("finish").get<int>();
  if (finish < 0 || finish > static_cast<int>(FinishReason::abort)) throw std::out_of_range("finish reason");
  o.finish_reason = static_cast<FinishReason>(finish);
  o.stop_reason = j.at("stop_reason").get<std::string>();
  o.num_preemptions = j.at("preemptions").get<int>();
  for (const json& row : j.at("logits")) {
    const auto& bytes = row.get_binary();
    if (bytes.size() % sizeof(float) != 0) throw std::out_of_range("logits row bytes");
    std::vector<float> r(bytes.size() / sizeof(float));
    if (!r.empty()) std::memcpy(r.data(), bytes.data(), bytes.size());
    o.logits.push_back(std::move(r));
  }
  return o;
}

json stats_json(const sidp::SidpFfnStats& s) {
  return json{{"was_steps", s.was_steps},
              {"cas_steps", s.cas_steps},
              {"dummy_steps", s.dummy_steps},
              {"cas_rows_sent", s.cas_rows_sent},
              {"cas_fused_gemms", s.cas_fused_gemms},
              {"cas_fused_rows", s.cas_fused_rows},
              {"cas_peer_skips", s.cas_peer_skips},
              {"switches_to_cas", s.switches_to_cas},
              {"switches_to_was", s.switches_to_was},
              {"applied_epoch", s.applied_epoch},
              {"fetches", s.cache.fetches},
              {"fetched_bytes", s.cache.fetched_bytes},
              {"fetch_retries", s.cache.fetch_retries},
              {"compute_waits", s.cache.compute_waits},
              {"compute_wait_ms", s.cache.compute_wait_ms},
              {"fetch_ms", s.cache.fetch_ms}};
}

sidp::SidpFfnStats stats_from_json_or_throw(const json& j) {
  sidp::SidpFfnStats s;
  s.was_steps = j.at("was_steps").get<std::uint64_t>();
  s.cas_steps = j.at("cas_steps").get<std::uint64_t>();
  s.dummy_steps = j.at("dummy_steps").get<std::uint64_t>();
  s.cas_rows_sent = j.at("cas_rows_sent").get<std::uint64_t>();
  s.cas_fused_gemms = j.at("cas_fused_gemms").get<std::uint64_t>();
  s.cas_fused_rows = j.at("cas_fused_rows").get<std::uint64_t>();
  s.cas_peer_skips = j.at("cas_peer_skips").get<std::uint64_t>();
  s.switches_to_cas = j.at("switches_to_cas").get<std::uint64_t>();
  s.switches_to_was = j.at("switches_to_was").get<std::uint64_t>();
  s.applied_epoch = j.at("applied_epoch").get<std::uint64_t>();
  s.cache.fetches = j.at("fetches").get<std::uint64_t>();
  s.cache.fetched_bytes = j.at("fetched_bytes").get<std::uint64_t>();
  s.cache.fetch_retries = j.at("fetch_retries").get<std::uint64_t>();
  s.cache.compute_waits = j.at("compute_waits").get<std::uint64_t>();
  s.cache.compute_wait_ms = j.at("compute_wait_ms").get<double>();
  s.cache.fetch_ms = j.at("fetch_ms").get<double>();
  return s;
}


template <class T, class F>
Result<T> decode(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::corrupt, std::string("sidp control: ") + what + ": " + e.what());
  }
}

}  // namespace

json params_to_json(const sampling::SamplingParams& p) { return params_json(p); }
Result<sampling::SamplingParams> params_from_json(const json& j) {
  return decode<sampling::SamplingParams>("sampling params", [&] { return params_from_json_or_throw(j); });
}
json output_to_json(const RequestOutput& o) { return output_json(o); }
Result<RequestOutput> output_from_json(const json& j) {
  return decode<RequestOutput>("output", [&] { return output_from_json_or_throw(j); });
}
json stats_to_json(const sidp::SidpFfnStats& s) { return stats_json(s); }
Result<sidp::SidpFfnStats> stats_from_json(const json& j) {
  return decode<sidp::SidpFfnStats>("stats", [&] { return stats_from_json_or_throw(j); });
}

}  // namespace shardline::engine::sidp_wire
