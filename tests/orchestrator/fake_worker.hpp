#pragma once
// What a worker would answer for a line, without an engine: one "stop"
// choice whose text is derived from the prompt (deterministic), for the
// orchestrator's crash and fault tests.

#include "worker/batch_types.hpp"

namespace shardline::orchestrator::testing {

inline worker::BatchResult fake_result(const worker::BatchRequest& r) {
  worker::BatchResult out;
  out.job_id = r.job_id;
  out.line_index = r.line_index;
  out.custom_id = r.custom_id;
  out.ok = true;
  worker::BatchChoice c;
  c.text = " out:" + r.prompt;
  c.finish_reason = "stop";
  out.choices.push_back(c);
  out.prompt_tokens = 3;
  out.completion_tokens = 4;
  return out;
}

}  // namespace shardline::orchestrator::testing
