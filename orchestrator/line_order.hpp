#pragma once
/// \file
/// Prefix-aware scheduling of a job's lines (issue 42, step 4): the order in
/// which the orchestrator hands a job's lines out, so that lines sharing a
/// prompt prefix go out together, to the same worker, while the prefix is
/// in its prefix cache (engine/prefix_cache.hpp). An offline job is known
/// up front, which an online server cannot count on; BatchLLM (2024)
/// reorders offline batches by their shared prefixes for the same reason.
///
/// The order is computed once, at submit, and stored with the job
/// (JobStore::put_line_order): a depth-first walk of the prefix tree of the
/// lines' prompt texts (engine/policies/prefix_order.hpp), each node's
/// children in the order of their first line, so lines that share nothing
/// keep input order and a group of lines goes out where its first line
/// would have. The orchestrator has no tokenizer, so the key is the text,
/// cut into kChunkBytes-byte chunks and each chunk hashed (a line's key
/// costs 8 bytes per 64 bytes of prompt, not the prompt): lines whose text
/// shares its first k chunks sit together. A shared prefix is found to
/// the chunk: up to 63 bytes of it (about one KV block of tokens) may be
/// missed. The prefix tree's size gives the ideal: the share of the prompt
/// text that a perfect cache computes once (shared_bytes / prompt_bytes),
/// which `job status` shows beside the hit rate the workers measured.
///
/// The text of a line (prefix_text): a completion's prompt, or its token
/// ids as bytes; a chat line's messages as the parser normalised them (the
/// same messages give the same text, and conversations that extend one
/// another share its prefix). The chat template then adds the same tokens to
/// the same messages, so a shared text prefix is a shared token prefix.
///
/// Memory at submit: the keys, 1/8 of the prompts' bytes; stored: 32 bytes
/// per line (LineOrderEntry).

#include <cstdint>
#include <string>
#include <vector>

#include "orchestrator/job_store.hpp"
#include "orchestrator/shard_reader.hpp"
#include "worker/batch_types.hpp"

namespace shardline::orchestrator {

/// The text a line's prefix key is made of (see the file comment).
[[nodiscard]] std::string prefix_text(const worker::BatchRequest& request);

/// Builds a job's prefix-aware line order from its good lines, in one pass.
class LineOrderBuilder {
 public:
  static constexpr std::size_t kChunkBytes = 64;
  /// Line `line_index` (a request) starts at `where` in the shards.
  void add(std::uint64_t line_index, const LineCheckpoint& where, const worker::BatchRequest& request);
  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

  struct Built {
    std::vector<LineOrderEntry> order;  ///< [lines added] in hand-out order
    std::uint64_t prompt_bytes = 0;     ///< the lines' prefix texts' bytes, summed
    /// Of them, the bytes the prefix tree shares (to the chunk): what a cache
    /// that never evicts computes once instead of once per line.
    std::uint64_t shared_bytes = 0;
  };
  /// The order (the builder is left empty).
  [[nodiscard]] Built build();

 private:
  std::vector<LineOrderEntry> entries_;
  std::vector<std::vector<std::uint64_t>> keys_;  ///< [lines] chunk hashes of each line's text
  std::vector<std::uint64_t> text_bytes_;         ///< [lines]
};

}  // namespace shardline::orchestrator
