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
#include "engine/group/parallel_config.hpp"
#include "kvstore/kv_stream.hpp"
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
  std::uint64_t requeued = 0;  ///< failures: lines handed back because their worker failed (this process)
  std::uint64_t resumed = 0;   ///< recoveries: lines handed out again with replicated KV (this process)
  /// Why the job failed, or why an unfinished job is held back (recorded on
  /// another model than the cluster's); "" = nothing to say.
  std::string error;
  /// "" unless the job is paused because a write failed: that error
  /// ("disk_full: ..."); it resumes by itself once the write succeeds.
  std::string paused;
  /// Prefix caching (issue 42): prompt tokens the workers found cached (the
  /// first choice of each committed line), whether the job's lines go out in
  /// prefix-aware order, and its prompts' prefix tree's share of their text
  /// (0..1: the hit rate a cache that never evicts reaches).
  std::uint64_t cached_tokens = 0;
  bool prefix_ordered = false;
  double prefix_ideal_hit_rate = 0.0;
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
  /// Bytes of weights the worker's devices hold (under SiDP: the replicated
  /// attention / embedding / lm_head weights, the owned FFN layers and the
  /// WaS cache slots).
  std::uint64_t weight_bytes = 0;
  std::string sidp_mode;  ///< the mode its SiDP rank runs in now, "was" / "cas"; "" = not SiDP
  std::string seesaw_phase;             ///< Seesaw: "prefill" / "decode" now; "" = no phases
  std::uint64_t seesaw_transitions = 0;  ///< Seesaw: phase transitions (config switches) so far
  bool operator==(const WorkerStatus&) const = default;
};

/// One WaS <-> CaS switch the orchestrator broadcast to a SiDP group.
struct SidpSwitchRecord {
  std::string to_mode;         ///< "was" / "cas"
  std::uint64_t at_unix_ms = 0;  ///< wall clock, ms since 1970
  std::uint64_t group_batch = 0; ///< the group's effective batch when it decided
  std::uint64_t epoch = 0;
  bool operator==(const SidpSwitchRecord&) const = default;
};

/// The switching state of one SiDP DP group (seed 002 §4.3).
struct SidpGroupStatus {
  std::string group;    ///< "NODE/sidp"
  std::string mode;     ///< "was" / "cas": the mode last broadcast
  std::string setting;  ///< "auto" / "was" / "cas"
  std::uint32_t num_ranks = 0;
  std::uint64_t switch_batch = 0;  ///< b*, on the group's effective batch
  std::uint64_t group_batch = 0;   ///< the group's effective batch at the last report
  std::vector<SidpSwitchRecord> switches;  ///< oldest first; at most the last kMaxListedSwitches
  std::uint64_t num_switches = 0;          ///< all of them
  static constexpr std::size_t kMaxListedSwitches = 64;
  bool operator==(const SidpGroupStatus&) const = default;
};

/// One actor of the system.
struct ActorInfo {
  std::string name;
  std::string kind;   ///< e.g. "orchestrator", "worker", "kvstore"
  std::string node;
  std::string state;
  std::string parallel;  ///< a worker's engine group ("tp=2,pp=1,sp=1"); "" for other actors
  /// What else the kind reports; a KV store: its bytes in memory and on
  /// disk and its replication lag, e.g. "mem 1.5 MiB / 256 MiB, disk 3.0 MiB,
  /// 12 requests, replica b/kvstore lag 0 tokens".
  std::string detail;
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
  /// `--weight-sharing` of the job, "none" or "sidp": it must be what the
  /// cluster runs (else the submit is refused); "" = not given.
  std::string weight_sharing;
  /// `--chat-template FILE` of the job, as text: chat lines are rendered
  /// with it; "" = the model folder's template.
  std::string chat_template;
  /// `--overwrite`: the job may replace an existing, non-empty output file
  /// (else the submit is refused; orchestrator::JobManager::submit).
  bool overwrite = false;
  bool operator==(const SubmitJob&) const = default;
};

struct JobStatusQuery {
  std::uint64_t job_id = 0;  ///< 0 = all jobs
  bool operator==(const JobStatusQuery&) const = default;
};

/// Cancel an unfinished job (`shardline job cancel`, the batch API's
/// cancel; orchestrator::JobManager::cancel). Reply: a JobStatusList with
/// the job's progress after it; errors: not_found, invalid_argument (the
/// job is done or failed).
struct JobCancel {
  std::uint64_t job_id = 0;
  bool operator==(const JobCancel&) const = default;
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
  std::vector<worker::LineRef> held;
  /// SiDP (seed 002): the worker is rank `sidp_rank` of the DP group
  /// `sidp_group` ("NODE/sidp") of `sidp_ranks` ranks; "" = not SiDP.
  std::string sidp_group;
  std::uint32_t sidp_rank = 0;
  std::uint32_t sidp_ranks = 0;
  bool operator==(const WorkerHello&) const = default;
};

/// A SiDP layer owner (seed 002 §4.1) registers, and re-registers every
/// heartbeat with its state; `actor list` shows it and `actor kill` reaches it.
struct LayerOwnerHello {
  std::string owner_name;  ///< "NODE/cpu:I/owner"
  std::string node;
  std::string group;       ///< its SiDP DP group ("NODE/sidp")
  std::uint32_t rank = 0;
  std::vector<std::uint32_t> layers;  ///< the FFN layers it owns
  std::uint64_t weight_bytes = 0;     ///< packed FFN weights it holds (0 while not loaded)
  bool loaded = false;
  std::uint32_t loads = 0;            ///< loads of its layers in this process (1 + respawns)
  bool operator==(const LayerOwnerHello&) const = default;
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

/// A KV store registers with the orchestrator (again after a restart); the
/// orchestrator answers every store with the ring (SetRing).
struct KvStoreHello {
  std::string store_name;  ///< "NODE/kvstore"
  std::string node;
  bool operator==(const KvStoreHello&) const = default;
};


/// What the orchestrator forwards from a worker: its KV store's
/// acknowledgements with the tokens (worker::KvProgress).
struct KvProgressReport {
  std::string worker_name;
  std::vector<worker::KvProgress> progress;
  bool operator==(const KvProgressReport&) const = default;
};

// ---- orchestrator replies -------------------------------------------------------

struct JobSubmitted {
  std::uint64_t job_id = 0;
  bool operator==(const JobSubmitted&) const = default;
};

struct JobStatusList {
  std::vector<JobProgress> jobs;
  std::vector<SidpGroupStatus> sidp_groups;  ///< the cluster's SiDP groups and their switches
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

/// The orchestrator's SiDP mode directive (seed 002 §4.3 "consistent mode
/// switching"): every rank of `group` applies it at one step boundary.
struct SidpSwitch {
  std::string group;   ///< "NODE/sidp"
  std::string mode = "was";  ///< "was" / "cas" (checked by the codec)
  std::uint64_t epoch = 1;   ///< increasing per cluster; older ones are ignored (>= 1)
  bool operator==(const SidpSwitch&) const = default;
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

/// A KV store's state (its heartbeat to the orchestrator, its stats answer).
struct KvStoreStats {
  std::uint64_t num_entries = 0;     ///< chunks in the host-memory tier
  std::uint64_t bytes_used = 0;      ///< their bytes
  std::uint64_t bytes_capacity = 0;  ///< the tier's budget, bytes
  std::uint64_t disk_bytes = 0;      ///< every file of its RocksDB directory
  std::uint64_t requests = 0;        ///< requests with stored chunks
  std::uint64_t chunks = 0;          ///< chunks on disk
  std::string replica;               ///< the peer it replicates to ("" = none)
  std::uint64_t lag_tokens = 0;      ///< positions the replica is behind the local store
  std::uint64_t replicated_tokens = 0;  ///< positions acknowledged by every replica since open
  std::string store_name;
  std::uint64_t prefix_blocks = 0;   ///< prefix blocks kept (the persistent prefix tier)
  std::uint64_t prefix_bytes = 0;    ///< their bytes
  std::uint64_t prefix_links = 0;    ///< requests whose head is a prefix link
  std::uint64_t linked_tokens = 0;   ///< positions counted from links since open (KV not sent again)
  bool operator==(const KvStoreStats&) const = default;
};

/// A store's heartbeat (KV store -> orchestrator).
struct KvStoreHeartbeat {
  KvStoreStats stats;
  bool operator==(const KvStoreHeartbeat&) const = default;
};

/// One canonical chunk of a request.
struct KvChunkData {
  kvstore::KvChunkKey key;
  std::vector<std::byte> chunk;  ///< kvstore::chunk_bytes(shape, key.range) bytes
  bool operator==(const KvChunkData&) const = default;
};

/// A request's positions [0, c) as prefix blocks the store keeps
/// (kvstore/kv_store.hpp "Prefix links"; kvstore::PrefixLinkWrite).
struct PrefixLinkData {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;
  std::uint64_t salt = 0;
  std::uint64_t root = 0;               ///< the first block's parent name
  std::vector<std::uint64_t> names;     ///< the blocks, first first
  std::vector<std::int32_t> tokens;     ///< the request's tokens at [0, c)
  bool operator==(const PrefixLinkData&) const = default;
};

/// Store chunks: from a worker's streamer (from_peer ""), or from the peer
/// store that replicates to this one (from_peer = its name; not forwarded).
struct PutChunks {
  std::vector<KvChunkData> chunks;
  std::string from_peer;
  std::vector<PrefixLinkData> links;  ///< requests' heads as prefix blocks, acked with the chunks
  bool operator==(const PutChunks&) const = default;
};

/// The durable prefix of a request, at most max_tokens positions.
struct FetchPrefix {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;
  int max_tokens = 0;
  bool ask_peers = false;  ///< when short here, ask the other stores of the ring
  bool operator==(const FetchPrefix&) const = default;
};

/// Delete requests' KV (empty request_ids: the whole job's).
struct DropRequests {
  std::uint64_t job_id = 0;
  std::vector<std::uint64_t> request_ids;
  std::string from_peer;
  bool operator==(const DropRequests&) const = default;
};

/// The replication ring: every store of the cluster, in ring order.
struct SetRing {
  std::vector<std::string> names;
  bool operator==(const SetRing&) const = default;
};

/// The acknowledged prefix of one request: the paper's (x, j, t).
struct KvAck {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;
  int tokens = 0;
  bool operator==(const KvAck&) const = default;
};

/// A request whose prefix link waits for a block the store does not keep
/// (kvstore::KvStore::waiting_link_block).
struct LinkWaitData {
  std::uint64_t job_id = 0;
  std::uint64_t request_id = 0;
  std::uint64_t name = 0;  ///< the block it waits for
  bool operator==(const LinkWaitData&) const = default;
};

struct ChunksAcked {
  std::vector<KvAck> acks;
  std::vector<LinkWaitData> waits;  ///< the batch's requests whose prefix link waits for a block
  bool operator==(const ChunksAcked&) const = default;
};

struct KvPrefixData {
  int tokens = 0;
  std::vector<std::byte> chunk;  ///< all layers x [0, tokens)
  std::string source;            ///< the store that had it
  bool operator==(const KvPrefixData&) const = default;
};

/// A full KV block of a shared prompt prefix (kvstore/kv_store.hpp "Prefix
/// blocks"). In a FetchPrefixBlocks query its chunk is empty.
struct PrefixBlockData {
  std::uint64_t name = 0;
  std::uint64_t parent = 0;
  std::vector<std::int32_t> tokens;  ///< the block's token ids
  std::vector<std::byte> chunk;      ///< canonical chunk of all layers x tokens.size() positions
  bool operator==(const PrefixBlockData&) const = default;
};

/// Keep prefix blocks a worker's prefix tier spilled (the store forwards
/// them to its replica: from_peer as PutChunks').
struct PutPrefixBlocks {
  std::uint64_t salt = 0;  ///< what else changes the KV (model, dtypes, layout)
  std::vector<PrefixBlockData> blocks;
  std::string from_peer;
  bool operator==(const PutPrefixBlocks&) const = default;
};

/// The leading run of `blocks` (queries: chunks empty) the store keeps.
struct FetchPrefixBlocks {
  std::uint64_t salt = 0;
  std::vector<PrefixBlockData> blocks;
  bool operator==(const FetchPrefixBlocks&) const = default;
};

/// The answer to PutPrefixBlocks (`stored`: blocks newly kept, `kept`: the
/// names of its blocks the store keeps after it, `blocks` empty) and to
/// FetchPrefixBlocks (`blocks`: the leading run, with chunks).
struct PrefixBlocksData {
  std::vector<PrefixBlockData> blocks;
  int stored = 0;
  std::vector<std::uint64_t> kept;
  bool operator==(const PrefixBlocksData&) const = default;
};

// ---- inboxes and replies ------------------------------------------------------------
//
// One std::variant per Cap'n Proto root (the struct with `version` and an
// unnamed union). Its alternatives are listed in the order of the union's
// members: the variant index is the union's which() (the codec's tables
// static_assert it). To add a message, see docs/messages.md.

/// What the orchestrator receives (orchestrator.capnp OrchestratorMessage).
using OrchestratorMsg = std::variant<SubmitJob, JobStatusQuery, ActorListQuery, KillActor, WorkerHello,
                                     WorkerResults, WorkerHeartbeat, Shutdown, KvStoreHello, KvStoreHeartbeat,
                                     KvProgressReport, LayerOwnerHello, JobCancel>;

/// What the orchestrator answers a client (orchestrator.capnp OrchestratorReply);
/// Error travels as `errorReply`.
using OrchestratorReply = std::variant<JobSubmitted, JobStatusList, ActorList, Ack, Error>;

/// What a worker receives (worker.capnp WorkerMessage); WorkerStatusQuery
/// travels as `statusQuery`.
using WorkerMsg = std::variant<AssignWork, CancelJob, WorkerStatusQuery, Shutdown, HelloAgain, SidpSwitch>;

/// A worker's answer (worker.capnp WorkerReply); WorkerStatus travels as `status`.
using WorkerReply = std::variant<WorkerStatus, Ack, Error>;

/// What the KV store receives (kvstore.capnp KvStoreMessage).
/// PutBlocks / GetBlocks / DropBlocks are retired (the opaque-blob store
/// before issue 11); the store answers them with an `unsupported` error.
using KvStoreMsg = std::variant<PutBlocks, GetBlocks, DropBlocks, StatsQuery, PutChunks, FetchPrefix, DropRequests,
                                SetRing, PutPrefixBlocks, FetchPrefixBlocks>;

/// The KV store's answer (kvstore.capnp KvStoreReply); KvStoreStats travels as `stats`.
using KvStoreReply = std::variant<BlocksData, KvStoreStats, Ack, Error, ChunksAcked, KvPrefixData, PrefixBlocksData>;

}  // namespace shardline::messages
