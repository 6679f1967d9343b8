#pragma once
/// \file
/// A SiDP group (seed 002 §4) whose ranks are processes joined over TCP:
/// rank 0 is the process that drives the group (a SidpGroup made with
/// SidpOptions::processes, e.g. `shardline generate --weight-sharing sidp
/// --group-master HOST:PORT`); every other rank is a `shardline shard serve
/// --weight-sharing sidp` process. Each process holds its own engine (its
/// scheduler and KV cache), its layer owner and its WaS cache slots; the
/// owners' FFN regions are read with one-sided gets and CaS activation rows
/// travel as p2p messages over real sockets.
///
/// Three TCP groups (comm/tcp.hpp) over the dp processes, all with the
/// group's key:
///  - control, at rank 0's --group-master: the messages below;
///  - weights: the owners expose their FFN regions, housekeepers get;
///  - compute: CaS p2p and the step control all-gather.
/// Rank 0 binds the weights and compute groups on free ports of the master's
/// host and sends them in the setup.
///
/// Control messages (CBOR maps, nlohmann::json::to_cbor; a 16-byte header
/// {kind, body bytes} on one tag, the body on another, one message at a time
/// per sender):
///   0 -> r: setup {version, dp, rank, num_layers, hidden, vocab, dtype,
///           owners [num_layers], cache_slots, peak_shifting, initial_mode,
///           capture_logits, owner_wait_ms, comm_timeout_ms, link_gbps,
///           link_latency_us, weights_port, compute_port}
///   r -> 0: ready {weight_bytes, num_kv_blocks} | error {message}
///   0 -> r: round {round, ids, prompts, params} | directive {mode, epoch}
///           | stop {round} | abort {round} | shutdown
///   r -> 0: report {round, num_seqs} | idle {round, epoch}
///           | done {round, outputs, stats} | error {message}
/// Outputs carry their logits rows as CBOR byte strings (exact bits).
///
/// Termination across processes: rank 0's SidpRound ends a round when every
/// rank (local and remote, through `idle` messages) is idle in WaS at the
/// newest epoch, and then sends `stop`; a round that ends in CaS ends on
/// every rank at the same dummy step (no rank had work). A rank that dies
/// closes its sockets: its peers' CaS collectives and gets fail with io at
/// once, rank 0's round fails naming it, and a `shard serve` whose rank 0
/// went away (or sent `shutdown`) returns.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/tcp.hpp"
#include "common/result.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/llm_engine.hpp"
#include "engine/sidp/sidp_rank_loop.hpp"
#include "engine/group/tcp_group.hpp"
#include "model/sidp/mode.hpp"
#include "model/sidp/ownership.hpp"
#include "model/sidp/sidp_ffn.hpp"

namespace shardline::engine {

/// What rank 0 tells every rank (the group's settings are rank 0's).
struct SidpProcessSetup {
  int dp = 0;
  model::sidp::OwnershipPlan plan;
  int num_layers = 0, hidden_size = 0, vocab_size = 0;
  DType dtype = DType::f32;
  int cache_slots = 2;
  bool peak_shifting = true;
  model::sidp::SidpMode initial_mode = model::sidp::SidpMode::was;
  bool capture_logits = false;
  std::chrono::milliseconds owner_wait{30'000};
  std::chrono::milliseconds comm_timeout{60'000};
  double link_gbps = 0, link_latency_us = 0;
};

/// Rank 0's side of the remote ranks 1..dp-1.
class SidpRemoteRanks {
 public:
  /// Joins the control group as rank 0 at tcp.master (blocks until every
  /// rank joined or tcp.timeout), binds the weights and compute groups,
  /// sends the setup and joins those. Errors: invalid_argument (address,
  /// key), io (a rank missing).
  [[nodiscard]] static Result<std::unique_ptr<SidpRemoteRanks>> connect(const SidpProcessSetup& setup,
                                                                        const TcpGroupOptions& tcp);
  /// Sends `shutdown` to every rank.
  ~SidpRemoteRanks();

  /// Rank 0's weights and compute communicators (once each; the caller owns them).
  [[nodiscard]] std::unique_ptr<comm::TcpCommunicator> take_weights() { return std::move(weights_); }
  [[nodiscard]] std::unique_ptr<comm::TcpCommunicator> take_compute() { return std::move(compute_); }

  /// Waits for every rank's `ready` (its owner exposed, its engine built).
  /// Errors: what a rank reports, io (a rank died or the timeout).
  [[nodiscard]] Status wait_ready(std::chrono::milliseconds timeout);

  /// Sends a directive to every remote rank. Thread-safe.
  void announce(model::sidp::SidpMode mode, std::uint64_t epoch);
  /// Sends `stop` (every rank idle) / `abort` (a rank failed) for `round`.
  void stop(std::uint64_t round);
  void abort(std::uint64_t round);

  /// Rank `rank`'s part of round `round`: sends it its requests, then
  /// handles its messages until its `done` (outputs into `outputs` at their
  /// request ids, reports to `observer`, idles to `sidp_round`). Returns
  /// early (ok) when sidp_round is aborted. Errors: what the rank reports
  /// (io / its error), io (it died), corrupt (a bad message).
  [[nodiscard]] Status run_round(int rank, std::uint64_t round, const std::vector<std::uint64_t>& ids,
                                 const std::vector<std::vector<std::int32_t>>& prompts,
                                 const std::vector<sampling::SamplingParams>& params,
                                 const std::function<void(int rank, int num_seqs)>& observer, SidpRound& sidp_round,
                                 std::vector<RequestOutput>& outputs);

  /// The rank's SiDP counters as of its last `done` (zeros before).
  [[nodiscard]] model::sidp::SidpFfnStats stats(int rank) const;
  /// The rank's weight bytes and KV blocks from its `ready`.
  [[nodiscard]] std::size_t weight_bytes(int rank) const;
  [[nodiscard]] int num_kv_blocks(int rank) const;
  /// Payload bytes rank `rank` sent on its weights / compute groups as of its last `done`.
  [[nodiscard]] std::uint64_t bytes_sent(int rank) const;

  class Control;

 private:
  SidpRemoteRanks() = default;
  struct Peer {
    model::sidp::SidpFfnStats stats;
    std::size_t weight_bytes = 0;
    int num_kv_blocks = 0;
    std::uint64_t bytes_sent = 0;
  };
  int dp_ = 0;
  std::unique_ptr<Control> control_;
  std::unique_ptr<comm::TcpCommunicator> weights_;
  std::unique_ptr<comm::TcpCommunicator> compute_;
  mutable std::mutex mu_;
  std::vector<Peer> peers_;  ///< [dp], entry 0 unused
};

/// A rank > 0 (`shardline shard serve --weight-sharing sidp`): joins the
/// group at tcp.master as `rank` of `dp`, checks rank 0's setup against its
/// model (`base` with this process's engine flags; its parallel config one
/// device), loads and exposes its owner's layers, builds its engine and
/// serves rounds until rank 0 sends `shutdown` (ok) or goes away, or a
/// round fails (the error). `log` gets one line per event (may be empty).
/// Errors: invalid_argument (rank, options), mismatch (a setting differs
/// from rank 0's, named), io, what loading or a round returns.
[[nodiscard]] Status serve_sidp_rank(const EngineOptions& base, int dp, int rank, const TcpGroupOptions& tcp,
                                     const std::function<void(const std::string&)>& log = {});

}  // namespace shardline::engine
