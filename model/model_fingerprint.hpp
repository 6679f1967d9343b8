#pragma once
/// \file
/// What model a folder holds, as one hex string (issue 46, item 10): a job
/// records the fingerprint of the model its lines were computed with, and a
/// node refuses to resume it on another one (orchestrator/job_manager.hpp),
/// instead of writing two models' lines into one file.
///
/// SHA-256 over, in name order:
///  - whole: config.json, generation_config.json, the tokenizer files
///    (tokenizer.json, tokenizer.model, tokenizer_config.json,
///    special_tokens_map.json), chat_template.jinja and a safetensors index;
///  - sampled, for weight files (*.safetensors, *.gguf): name, size, the
///    first MiB (the safetensors header with every tensor's name, dtype,
///    shape and offsets; a GGUF's metadata) and 64 blocks of 4 KiB spread
///    evenly over the rest. Reading gigabytes at every node start is not
///    worth it: a change to weights that touches none of the sampled bytes
///    goes unseen (a fine-tune changes every tensor, so it is seen).
/// Paths, times and other files do not count: the same model copied
/// elsewhere has the same fingerprint.

#include <filesystem>
#include <string>

#include "common/result.hpp"

namespace shardline::model {

/// The fingerprint (64 hex digits) of the model folder `dir`, or of a GGUF
/// file. Errors: not_found (no such folder or file), io (a file cannot be
/// read).
[[nodiscard]] Result<std::string> model_fingerprint(const std::filesystem::path& dir);

}  // namespace shardline::model
