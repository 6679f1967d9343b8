#pragma once
/// \file
/// Plain C++ structs of the actor messages, and each actor's inbox and reply
/// as a std::variant of them (see messages/*.capnp for the wire form and
/// messages/codec.hpp for the conversion). Structs that already exist
/// elsewhere (worker::BatchRequest / BatchResult / BatchChoice,
/// sampling::SamplingParams, shardline::Error) are reused, not mirrored.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/result.hpp"
#include "engine/parallel_config.hpp"
#include "orchestrator/job_manager.hpp"
#include "worker/batch_types.hpp"

namespace shardline::messages {

using worker::BatchChoice;
using worker::BatchRequest;
using worker::BatchResult;

/// Every encoded message carries this; a decoder rejects any other value.
inline constexpr std::uint16_t kSchemaVersion = 1;

/// Encoded messages larger than this are rejected on decode.
inline constexpr std::size_t kMaxMessageBytes = std::size_t{64} << 20;  // 64 MiB

/// Any list in a message longer than this is rejected on decode.
inline constexpr std::size_t kMaxListElements = std::size_t{1} << 22;

/// Nesting depth (structs / lists) a decoder follows at most; the deepest
/// legitimate path is ~5 (message -> results -> choice -> tokenIds).
inline constexpr int kMaxNestingDepth = 16;

/// At most this many segments in an encoded message.
inline constexpr std::size_t kMaxSegments = 512;

// ---- payload-free messages (tags) ---------------------------------------------

struct ActorListQuery { bool operator==(const ActorListQuery&) const = default; };
struct WorkerStatusQuery { bool operator==(const WorkerStatusQuery&) const = default; };
/// To a worker: the orchestrator does not know you (it restarted); say hello again.
struct HelloAgain { bool operator==(const HelloAgain&) const = default; };
struct StatsQuery { bool operator==(const StatsQuery&) const = default; };
struct Shutdown { bool operator==(const Shutdown&) const = default; };
struct Ack { bool operator==(const Ack&) const = default; };

// ---- shared -------------------------------------------------------------------

/// Progress of one job as reported to clients.
struct JobProgress {
  std::uint64_t job_id = 0;
  std::string state;  ///< e.g. "queued", "running", "done", "failed", "cancelled"
  std::uint64_t total = 0;   ///< input lines
  std::uint64_t done = 0;    ///< lines with a result (ok or error)
  std::uint64_t failed = 0;  ///< lines with an error result
  std::uint64_t prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;
  double tokens_per_s = 0.0;
  double eta_s = 0.0;
  std::string output;  ///< output file
  std::vector<std::string> inputs;  ///< input shards, in order
  std::string parallel;      ///< the job's parallel config ("tp=2,pp=1,sp=1,dp=1"); "" = not recorded
  std::string token_budget;  ///< the job's token budget policy ("fixed", "throttle")
  bool operator==(const JobProgress&) const = default;
};

/// A worker's state.
struct WorkerStatus {
  std::string worker_name;
  std::string device;  ///< e.g. "cpu", "cuda:0"
  std::string state;   ///< e.g. "idle", "busy", "draining"
  std::uint32_t num_running = 0;
  std::uint32_t num_waiting = 0;
  std::uint64_t kv_blocks_used = 0;
  std::uint64_t kv_blocks_total = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t generated_tokens = 0;
  std::uint64_t steps_done = 0;
  bool operator==(const WorkerStatus&) const = default;
};

/// One actor of the system.
struct ActorInfo {
  std::string name;
  std::string kind;   ///< e.g. "orchestrator", "worker", "kvstore"
  std::string node;
  std::string state;
  std::string parallel;  ///< a worker's engine group ("tp=2,pp=1,sp=1"); "" for other actors
  bool operator==(const ActorInfo&) const = default;
};

// ---- orchestrator inbox -------------------------------------------------------

/// Start a job: run the model over the JSONL shards, write one output file.
struct SubmitJob {
  std::string model_dir;
  std::vector<std::string> inputs;  ///< JSONL shards, in order
  std::string output;
  /// `--parallel` of the job: it must be what the cluster runs (else the
  /// submit is refused); nullopt = not given.
  std::optional<engine::ParallelConfig> parallel;
  std::string token_budget;  ///< "fixed" or "throttle"; "" = fixed
  bool operator==(const SubmitJob&) const = default;
};

struct JobStatusQuery {
  std::uint64_t job_id = 0;  ///< 0 = all jobs
  bool operator==(const JobStatusQuery&) const = default;
};

struct KillActor {
  std::string name;
  bool operator==(const KillActor&) const = default;
};

struct WorkerHello {
  std::string worker_name;
  std::string device;
  std::uint32_t max_batch = 0;
  engine::ParallelConfig parallel;  ///< the worker's engine group (dp == 1)
  /// Lines the worker holds (accepted, no result sent yet): empty on its
  /// first hello; filled when a restarted orchestrator asks it to say hello
  /// again (HelloAgain), so they stay in flight on it.
  std::vector<orchestrator::LineRef> held;
  bool operator==(const WorkerHello&) const = default;
};

struct WorkerResults {
  std::string worker_name;
  std::vector<worker::BatchResult> results;
};

struct WorkerHeartbeat {
  std::string worker_name;
  WorkerStatus status;
  bool operator==(const WorkerHeartbeat&) const = default;
};

// ---- orchestrator replies -------------------------------------------------------

struct JobSubmitted {
  std::uint64_t job_id = 0;
  bool operator==(const JobSubmitted&) const = default;
};

struct JobStatusList {
  std::vector<JobProgress> jobs;
  bool operator==(const JobStatusList&) const = default;
};

struct ActorList {
  std::vector<ActorInfo> actors;
  bool operator==(const ActorList&) const = default;
};

// ---- worker inbox -----------------------------------------------------------------

struct AssignWork {
  std::vector<worker::BatchRequest> requests;
};

struct CancelJob {
  std::uint64_t job_id = 0;
  bool operator==(const CancelJob&) const = default;
};

// ---- kvstore inbox / replies ------------------------------------------------------

struct PutBlocks {
  std::string key;
  std::string data;  ///< opaque bytes
  bool operator==(const PutBlocks&) const = default;
};

struct GetBlocks {
  std::string key;
  bool operator==(const GetBlocks&) const = default;
};

struct DropBlocks {
  std::string key;
  bool operator==(const DropBlocks&) const = default;
};

struct BlocksData {
  std::string key;
  std::string data;  ///< empty when !found
  bool found = false;
  bool operator==(const BlocksData&) const = default;
};

struct KvStoreStats {
  std::uint64_t num_entries = 0;
  std::uint64_t bytes_used = 0;
  std::uint64_t bytes_capacity = 0;
  bool operator==(const KvStoreStats&) const = default;
};

// ---- inboxes and replies ------------------------------------------------------------
//
// One std::variant per Cap'n Proto root (the struct with `version` and an
// unnamed union). Its alternatives are listed in the order of the union's
// members: the variant index is the union's which() (the codec's tables
// static_assert it). To add a message, see docs/messages.md.

/// What the orchestrator receives (orchestrator.capnp OrchestratorMessage).
using OrchestratorMsg = std::variant<SubmitJob, JobStatusQuery, ActorListQuery, KillActor, WorkerHello,
                                     WorkerResults, WorkerHeartbeat, Shutdown>;

/// What the orchestrator answers a client (orchestrator.capnp OrchestratorReply);
/// Error travels as `errorReply`.
using OrchestratorReply = std::variant<JobSubmitted, JobStatusList, ActorList, Ack, Error>;

/// What a worker receives (worker.capnp WorkerMessage); WorkerStatusQuery
/// travels as `statusQuery`.
using WorkerMsg = std::variant<AssignWork, CancelJob, WorkerStatusQuery, Shutdown, HelloAgain>;

/// A worker's answer (worker.capnp WorkerReply); WorkerStatus travels as `status`.
using WorkerReply = std::variant<WorkerStatus, Ack, Error>;

/// What the KV store receives (kvstore.capnp KvStoreMessage).
using KvStoreMsg = std::variant<PutBlocks, GetBlocks, DropBlocks, StatsQuery>;

/// The KV store's answer (kvstore.capnp KvStoreReply); KvStoreStats travels as `stats`.
using KvStoreReply = std::variant<BlocksData, KvStoreStats, Ack, Error>;

}  // namespace shardline::messages
