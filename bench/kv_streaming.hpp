#pragma once
/// \file
/// The benchmark's KV streaming (DéjàVu §4.1.1 (3) token streaming and
/// §4.2.3 replication) over the real parts: the engine's KvStreamSink feeds
/// a worker::KvStreamer whose target is the KV-store actor (ActorKvTarget);
/// with `replicated` a second store actor is that store's ring successor, so
/// each flush is stored, forwarded and acknowledged as in a two-node
/// cluster. Both stores run in one in-process CAF actor system (messages go
/// through Cap'n Proto and the actors' mailboxes, not loopback TCP), each on
/// RocksDB in a temporary directory.
///
/// This machine has no separate copy engine: the streamer's thread and the
/// stores share the CPU cores with the engine's threads (a GPU deployment
/// streams with DMA and host threads beside the GPU). The bench reports the
/// overhead as measured; run the engine with fewer threads than cores to
/// give the streaming a core of its own, as the paper's setting does.

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.hpp"
#include "engine/llm_engine.hpp"
#include "kvstore/kv_store.hpp"

namespace shardline::bench {

enum class KvStreamMode { off, store, replicated };

/// "off", "store" or "replicated". Errors: invalid_argument.
[[nodiscard]] Result<KvStreamMode> parse_kv_stream_mode(const std::string& name);
[[nodiscard]] const char* kv_stream_mode_name(KvStreamMode mode) noexcept;

struct KvStreamingStats {
  std::uint64_t streamed_bytes = 0;   ///< chunk bytes the stores accepted
  std::uint64_t increments = 0;       ///< increments flushed
  std::uint64_t batches = 0;          ///< flushes (buffered copies: one message each)
  std::uint64_t failed_flushes = 0;
  std::uint64_t max_queued_bytes = 0; ///< the streamer's queue at its fullest
  std::uint64_t acked_tokens = 0;     ///< positions acknowledged (local store and replica), summed over requests
  double drain_s = 0;                 ///< after the last step, until every increment was flushed
};

class KvStreaming {
 public:
  /// Starts the actor system, the store(s) and the streamer. Errors: the
  /// stores' (a directory that cannot be opened).
  [[nodiscard]] static Result<std::unique_ptr<KvStreaming>> start(KvStreamMode mode,
                                                                  const kvstore::KvModelShape& shape,
                                                                  kvstore::KvSyncPolicy sync);
  ~KvStreaming();
  KvStreaming(const KvStreaming&) = delete;
  KvStreaming& operator=(const KvStreaming&) = delete;

  /// The sink to hand to LlmEngine::set_kv_sink.
  [[nodiscard]] engine::KvStreamSink* sink();
  /// Waits for the queue to drain and reports.
  [[nodiscard]] Result<KvStreamingStats> finish();

 private:
  struct Impl;
  explicit KvStreaming(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardline::bench
