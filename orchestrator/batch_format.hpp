#pragma once
/// \file
/// The OpenAI Batch JSONL format: one input line → a BatchRequest (or a
/// per-line error), one BatchResult → one output line.
///
/// Input lines (one JSON object per line) come in two forms:
///  - the OpenAI Batch form
///      {"custom_id": "a", "method": "POST", "url": "/v1/completions",
///       "body": {"model": "m", "prompt": "Hello", "max_tokens": 32, ...}}
///    with url "/v1/completions" or "/v1/chat/completions".
///    `method` and `url` may be left out (they default to POST and
///    /v1/completions); `custom_id` may be left out (it defaults to the
///    1-based line number, see below). Top-level keys other than these four
///    are unknown_parameter errors. A line is in this form when it has any of
///    the keys "body", "method" or "url".
///  - the plain form: the body keys at the top level, {"prompt": "Hello",
///    "max_tokens": 32}, plus an optional "custom_id"; a chat body when it
///    has "messages" and no "prompt".
///
/// Body keys of both endpoints: model (string, ignored: the job's model
/// answers), max_tokens (completions default 16), temperature (default 1.0),
/// top_p, top_k, min_p, seed (any 64-bit integer; negative values wrap to
/// uint64), stop (string or array of strings), n (1..128; choice i samples
/// with seed + i), return_token_ids (bool), presence_penalty,
/// frequency_penalty, repetition_penalty, min_tokens, ignore_eos (bool),
/// stop_token_ids (array of integers); structured outputs, at most one of
/// response_format, guided_json, guided_regex, guided_choice, guided_grammar
/// and structured_outputs (into BatchRequest::grammar_*; docs/cli.md);
/// user, store, metadata, service_tier,
/// prompt_cache_key and safety_identifier are accepted and ignored.
/// Completions: prompt (a non-empty string, or a non-empty array of token ids
/// in [0, 2^31)), logprobs (0..20: the sampled token's logprob and the k most
/// likely), echo (bool; not with logprobs), best_of (only equal to n).
/// Chat: messages (a non-empty array of objects with a string "role";
/// "content" a string, null, or an array of {"type": "text", "text"} parts,
/// joined with "\n"; other keys go to the template as given),
/// max_completion_tokens (wins over max_tokens; with neither, up to the end
/// of the context), logprobs (bool), top_logprobs (0..20, needs logprobs),
/// chat_template_kwargs (object), add_generation_prompt (bool, default true),
/// parallel_tool_calls (ignored).
/// Refused unless "off" (unsupported_parameter): stream (false),
/// stream_options, logit_bias ({}), suffix (""), tools ([]), tool_choice
/// ("none"), functions, function_call, modalities (["text"]), audio, prediction, reasoning_effort,
/// web_search_options, verbosity. A key with the value null counts as not
/// given. Integers may be written as integral floats (16.0).
///
/// Errors (BatchResult.ok == false, error_code, error_message naming the field):
///   invalid_json           the line is not JSON or not a JSON object
///   missing_prompt         no "prompt" / "messages" (or no "body" in the OpenAI form)
///   invalid_parameter      a value of the wrong type or out of range
///                          (ranges from sampling::SamplingParams::validate)
///   unknown_parameter      a key that is not in the lists above
///   unsupported_parameter  a known field with a value Shardline does not implement
///   unsupported_url        url other than the two endpoints
///   invalid_method         method other than "POST"
/// The job manager adds line_too_long (a line over
/// JobManagerOptions::max_line_bytes, never parsed) and duplicate_custom_id.
/// The worker adds chat_template_missing, chat_template_error,
/// context_length_exceeded and invalid_response_format (a grammar it cannot
/// compile or enforce) (worker/batch_worker.hpp).
///
/// Blank lines (only whitespace, including a lone '\r') are skipped by the
/// job manager: they get no line index and no output line. `line_index` is the
/// 0-based index over the non-blank lines of all shards of a job, in order, and
/// the default custom_id is `std::to_string(line_index + 1)`.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "common/result.hpp"
#include "worker/batch_types.hpp"

namespace shardline::orchestrator {

/// A parsed input line: a request, or an error result (ok == false) that is
/// committed as is.
struct BatchLine {
  std::variant<worker::BatchRequest, worker::BatchResult> value;

  [[nodiscard]] bool is_request() const noexcept { return value.index() == 0; }
  [[nodiscard]] const worker::BatchRequest& request() const { return std::get<0>(value); }
  [[nodiscard]] worker::BatchRequest& request() { return std::get<0>(value); }
  [[nodiscard]] const worker::BatchResult& error() const { return std::get<1>(value); }
  [[nodiscard]] worker::BatchResult& error() { return std::get<1>(value); }
};

/// True when the line holds only whitespace (such lines are skipped).
[[nodiscard]] bool is_blank_line(std::string_view line) noexcept;

/// Parses one input line. Never throws. A blank line gives an invalid_json
/// error (callers skip blank lines before calling).
[[nodiscard]] BatchLine parse_batch_line(std::string_view line, std::uint64_t job_id,
                                         std::uint64_t line_index);

/// `custom_id` used when a line gives none: the 1-based line number.
[[nodiscard]] std::string default_custom_id(std::uint64_t line_index);

/// A per-line error result.
[[nodiscard]] worker::BatchResult make_error_result(std::uint64_t job_id, std::uint64_t line_index,
                                            std::string custom_id, std::string code,
                                            std::string message);

/// One output line (no trailing newline), keys in a fixed order:
///   {"id":"batch_req_<suffix>","custom_id":...,
///    "response":{"status_code":200,"request_id":"<prefix><suffix>",
///      "body":{"object":"text_completion","model":<model>,
///        "choices":[{"index","text","finish_reason",["token_ids",]"logprobs"}],
///        "usage":{"prompt_tokens","completion_tokens","total_tokens"}}},
///    "error":null}
/// A chat result has "object":"chat.completion", choices
/// {"index","message":{"role":"assistant","content"},"finish_reason",
/// ["token_ids",]"logprobs"} and request_id "chat<prefix>..." (chatcmpl-).
/// "logprobs" is null unless asked for; then completions write
/// {"tokens","token_logprobs","top_logprobs":[{text: logprob}],"text_offset"}
/// and chat writes {"content":[{"token","logprob","bytes","top_logprobs":
/// [{"token","logprob","bytes"}]}],"refusal":null}.
/// An error result is
///   {"id":...,"custom_id":...,"response":null,"error":{"code":...,"message":...,"line":N}}
/// with "line" the 1-based line number of the input line in its shard
/// (`input_line`, as the `line` of OpenAI's batch errors); left out when 0.
/// <suffix> is output_line_id(output_id_key, line index): 32 hex digits
/// unique to the job's key and the line (OpenAI's ids are random too); with
/// an empty key (jobs of older versions) "<job>_<line>", <line> the 0-based
/// line index. "token_ids" is written for every choice
/// when any choice of the result carries token ids (workers fill them only
/// when the request asked with return_token_ids). Invalid UTF-8 in texts is
/// replaced by U+FFFD. No timestamps: the same result always gives the same
/// bytes.
[[nodiscard]] std::string format_result_line(const worker::BatchResult& result, std::string_view model,
                                             std::string_view request_id_prefix,
                                             std::string_view output_id_key = {}, std::uint64_t input_line = 0);

/// A new job's output id key: 32 hex digits of 16 bytes from OpenSSL's
/// CSPRNG (comm::random_bytes). Errors: its internal error.
[[nodiscard]] Result<std::string> new_output_id_key();

/// The id suffix of line `line_index` under `key` (new_output_id_key()):
/// 32 hex digits, two keyed SplitMix64 finalizers of the line index. The
/// first half is a bijection of the index, so the lines of one job never
/// share an id; other jobs' keys are independent draws.
[[nodiscard]] std::string output_line_id(std::string_view key, std::uint64_t line_index);

}  // namespace shardline::orchestrator
