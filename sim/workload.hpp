#pragma once
/// \file
/// Workloads for the simulator: only token lengths matter.
///
///  - Generated: `num` requests whose prompt and output lengths are drawn
///    from a LengthDist each, with a seeded generator (the same seed, the
///    same workload):
///      "N"                    every request N tokens
///      "uniform:A:B"          uniform integers in [A, B]
///      "loguniform:A:B"       exp(uniform(ln A, ln B)), rounded: long-tailed
///                             (the SiDP bench's long-tailed job)
///      "lognormal:MEDIAN:SIGMA[:MAX]"  median * exp(SIGMA * N(0,1)),
///                             rounded, clamped to [1, MAX] (ShareGPT-like
///                             chat lengths are close to lognormal)
///  - From a JSONL job file (the OpenAI Batch lines `run` and `job submit`
///    take, parsed by orchestrator::parse_batch_line): a prompt of token ids
///    counts its ids; a text prompt is tokenized with the model folder's
///    tokenizer; a chat line counts its messages' text the same way (the
///    template's few extra tokens are left out); the output is max_tokens
///    (or max_completion_tokens; a chat line without either gets
///    `default_output_len`); a line with n choices is n requests. Lines that
///    do not parse are skipped and counted.

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.hpp"
#include "text/tokenizer.hpp"
#include "sim/simulator.hpp"

namespace shardline::sim {

struct LengthDist {
  enum class Kind { fixed, uniform, loguniform, lognormal };
  Kind kind = Kind::fixed;
  double a = 0, b = 0;  ///< fixed: a; uniform / loguniform: [a, b]; lognormal: median a, sigma b
  double max = 0;       ///< lognormal: clamp (0 = none)
  std::string text;     ///< as parsed
};

/// Errors: invalid_argument naming the spec and the form expected (unknown
/// kind, non-numbers, lengths < 1, A > B, sigma < 0).
[[nodiscard]] Result<LengthDist> parse_length_dist(const std::string& spec);

/// `num` requests drawn from the two distributions with `seed`.
[[nodiscard]] std::vector<SimRequest> generate_workload(int num, const LengthDist& input, const LengthDist& output,
                                                        std::uint64_t seed);

struct JsonlWorkload {
  std::vector<SimRequest> requests;
  int skipped_lines = 0;  ///< lines that do not parse (a real job commits them as errors)
};

/// Reads a JSONL job file. `tokenizer` may be null when every prompt is
/// given as token ids. Errors: not_found (the file), invalid_argument (a
/// text prompt without a tokenizer).
[[nodiscard]] Result<JsonlWorkload> workload_from_jsonl(const std::string& path, const text::Tokenizer* tokenizer,
                                                        int default_output_len);

}  // namespace shardline::sim
