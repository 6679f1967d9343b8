#pragma once
/// \file
/// Turns a KV store's acknowledgements into what the orchestrator records
/// per choice (DéjàVu, seed 003 §4.2.3: the (x, j, t) messages, here with
/// the tokens): worker::KvProgress{replicated_tokens, output_ids}.
///
/// The store acknowledges positions [0, t) of a request's KV; to resume the
/// request elsewhere the orchestrator also needs the tokens generated up to
/// position t (the token at position t is known before its KV: it is the
/// one sampled last). This tracker learns those tokens from the streamed
/// increments (their token_ids cover positions [token_begin, token_end + 1))
/// and, for a resumed request, from the output ids it resumed with (seed()).
/// What it reports is directly a valid resume (engine/llm_engine.hpp
/// ResumeState): for an acknowledged prefix [0, a) and generated tokens
/// known up to position a, output_ids = the generated tokens at positions
/// [num_prompt, a) and replicated_tokens = min(a, num_prompt + |output_ids| - 1):
/// the KV of the last fed token's position is recomputed, because its logits
/// sample the next token. So a resumed choice recomputes one position (one
/// decode step's token) beyond what was lost, and a finished choice's last
/// token (EOS, a stop, the max_tokens-th), whose KV is never computed, is
/// never in a resume. Nothing is reported past a gap in the known tokens.
///
/// Thread safety: every method may be called from any thread (the worker
/// actor seeds and forgets; the streamer's thread reports).

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "worker/batch_types.hpp"
#include "worker/kv_streamer.hpp"

namespace shardline::worker {

/// One acknowledgement of the store: (job, request) holds positions [0, tokens).
struct KvStoreAck {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;  ///< kv_request_key(line, choice)
  int tokens = 0;
};

class KvProgressTracker {
 public:
  /// A resumed choice starts from `output_ids` (ChoiceResume::output_ids):
  /// its generated tokens at positions [num_prompt, num_prompt + size).
  void seed(std::uint64_t job_id, std::uint64_t request_id, std::vector<std::int32_t> output_ids);

  /// Learns the tokens of flushed increments, then turns `acks` into one
  /// KvProgress per request whose replicated_tokens advanced (see the file
  /// comment). Requests never streamed here (no increment seen) are skipped.
  [[nodiscard]] std::vector<KvProgress> on_flushed(std::span<const QueuedIncrement> flushed,
                                                   std::span<const KvStoreAck> acks);

  /// The request finished or was cancelled.
  void forget(std::uint64_t job_id, std::uint64_t request_id);
  void forget_job(std::uint64_t job_id);
  [[nodiscard]] std::size_t tracked() const;

 private:
  struct Entry {
    int num_prompt_tokens = -1;              ///< -1 until an increment said
    std::vector<std::int32_t> output_ids;    ///< [i] = token at position num_prompt + i
    std::vector<bool> known;                 ///< output_ids[i] is set
    int reported = 0;                        ///< replicated_tokens last reported
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, Entry> entries_;
};

}  // namespace shardline::worker
