#include "engine/sidp/sidp_process.hpp"

#include <omp.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/address.hpp"
#include "comm/paced.hpp"
#include "engine/sidp/sidp_wire.hpp"
#include "model/cpu_runner.hpp"
#include "model/sidp/layer_owner.hpp"

namespace shardline::engine {

namespace sidp = model::sidp;
using nlohmann::json;

namespace {

constexpr int kSetupVersion = 1;
constexpr int kTagHeader = 10;
constexpr int kTagBody = 11;
/// How long one control recv waits before the caller checks on its peer.
constexpr std::chrono::milliseconds kPoll{250};

enum class Kind : std::int64_t {
  setup = 1,
  ready,
  round,
  directive,
  stop,
  abort,
  shutdown,
  report,
  idle,
  done,
  error,
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::setup: return "setup";
    case Kind::ready: return "ready";
    case Kind::round: return "round";
    case Kind::directive: return "directive";
    case Kind::stop: return "stop";
    case Kind::abort: return "abort";
    case Kind::shutdown: return "shutdown";
    case Kind::report: return "report";
    case Kind::idle: return "idle";
    case Kind::done: return "done";
    case Kind::error: return "error";
  }
  return "?";
}

struct Message {
  Kind kind = Kind::error;
  json body;
};

Error corrupt(const std::string& what) { return make_error(ErrorCode::corrupt, "sidp control: " + what); }

Result<std::unique_ptr<comm::TcpCommunicator>> join_tcp(const std::string& host, int port, int rank, int dp,
                                                        const TcpGroupOptions& tcp) {
  comm::TcpOptions t;
  t.rank = rank;
  t.world_size = dp;
  t.master_host = host;
  t.master_port = port;
  t.timeout = tcp.timeout;
  t.key = tcp.key;
  return comm::TcpGroup::create(t);
}

}  // namespace

// ---- the control channel -----------------------------------------------------

/// One process's end of the control group: one message at a time per
/// sender (a header, then the CBOR body), any thread; recv per peer from one
/// thread at a time.
class SidpRemoteRanks::Control {
 public:
  explicit Control(std::unique_ptr<comm::TcpCommunicator> comm) : comm_(std::move(comm)) { comm_->set_timeout(kPoll); }

  Status send(int peer, Kind kind, const json& body) {
    const std::vector<std::uint8_t> bytes = json::to_cbor(body);
    const std::int64_t header[2] = {static_cast<std::int64_t>(kind), static_cast<std::int64_t>(bytes.size())};
    std::lock_guard lk(send_mu_);
    if (Status st = comm_->send(header, sizeof header, peer, kTagHeader); !st) return st;
    return comm_->send(bytes.data(), bytes.size(), peer, kTagBody);
  }

  /// The next message from `peer`, waiting up to `wait` (checked every kPoll).
  /// Errors: io (the peer died or nothing came in time), corrupt.
  Result<Message> recv(int peer, std::chrono::milliseconds wait, const std::function<bool()>& give_up = {}) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    std::int64_t header[2] = {};
    for (;;) {
      Status st = comm_->recv(header, sizeof header, peer, kTagHeader);
      if (st.ok()) break;
      if (st.error().code != ErrorCode::io) return st.error();
      if (comm_->peer_dead(peer))
        return make_error(ErrorCode::io, "sidp control: rank " + std::to_string(peer) + " went away");
      if (give_up && give_up()) return make_error(ErrorCode::io, "sidp control: given up");
      if (std::chrono::steady_clock::now() >= deadline)
        return make_error(ErrorCode::io, "sidp control: nothing from rank " + std::to_string(peer) + " in " +
                                             std::to_string(wait.count()) + " ms");
    }
    if (header[0] < static_cast<std::int64_t>(Kind::setup) || header[0] > static_cast<std::int64_t>(Kind::error) ||
        header[1] < 0)
      return corrupt("bad header from rank " + std::to_string(peer));
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(header[1]));
    // The body was sent right after its header: wait for it as for a peer call,
    // unless the peer died between the two (killed after its header went out:
    // without this check rank 0 waited the whole 60 s, seen once in CI).
    const auto body_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      Status st = comm_->recv(bytes.data(), bytes.size(), peer, kTagBody);
      if (st.ok()) break;
      if (st.error().code != ErrorCode::io || std::chrono::steady_clock::now() >= body_deadline) return st.error();
      if (comm_->peer_dead(peer))
        return make_error(ErrorCode::io, "sidp control: rank " + std::to_string(peer) + " went away");
    }
    Message m;
    m.kind = static_cast<Kind>(header[0]);
    m.body = json::from_cbor(bytes, true, false);
    if (m.body.is_discarded()) return corrupt(std::string("undecodable ") + kind_name(m.kind) + " body");
    return m;
  }

  [[nodiscard]] comm::TcpCommunicator& comm() { return *comm_; }

 private:
  std::unique_ptr<comm::TcpCommunicator> comm_;
  std::mutex send_mu_;
};

// ---- rank 0 ------------------------------------------------------------------

Result<std::unique_ptr<SidpRemoteRanks>> SidpRemoteRanks::connect(const SidpProcessSetup& s,
                                                                  const TcpGroupOptions& tcp) {
  auto addr = comm::parse_host_port(tcp.master);
  if (!addr) return std::move(addr).error();
  const auto& [host, port] = addr.value();
  auto control = join_tcp(host, port, 0, s.dp, tcp);
  if (!control) return std::move(control).error();
  std::unique_ptr<SidpRemoteRanks> g(new SidpRemoteRanks());
  g->dp_ = s.dp;
  g->peers_.resize(static_cast<std::size_t>(s.dp));
  g->control_ = std::make_unique<Control>(std::move(control).value());
  const auto listen = [&]() {
    comm::TcpOptions t;
    t.rank = 0;
    t.world_size = s.dp;
    t.master_host = host;
    t.master_port = 0;
    t.timeout = tcp.timeout;
    t.key = tcp.key;
    return comm::TcpGroup::listen(t);
  };
  auto wl = listen();
  if (!wl) return std::move(wl).error();
  auto cl = listen();
  if (!cl) return std::move(cl).error();
  for (int r = 1; r < s.dp; ++r) {
    const json body{{"version", kSetupVersion},
                    {"dp", s.dp},
                    {"rank", r},
                    {"num_layers", s.num_layers},
                    {"hidden", s.hidden_size},
                    {"vocab", s.vocab_size},
                    {"dtype", static_cast<int>(s.dtype)},
                    {"owners", s.plan.owner_of_layer},
                    {"cache_slots", s.cache_slots},
                    {"peak_shifting", s.peak_shifting},
                    {"initial_mode", sidp::mode_name(s.initial_mode)},
                    {"capture_logits", s.capture_logits},
                    {"owner_wait_ms", s.owner_wait.count()},
                    {"comm_timeout_ms", s.comm_timeout.count()},
                    {"link_gbps", s.link_gbps},
                    {"link_latency_us", s.link_latency_us},
                    {"weights_port", wl->port()},
                    {"compute_port", cl->port()}};
    if (Status st = g->control_->send(r, Kind::setup, body); !st) return st.error();
  }
  auto w = wl->connect();
  if (!w) return std::move(w).error();
  g->weights_ = std::move(w).value();
  auto c = cl->connect();
  if (!c) return std::move(c).error();
  g->compute_ = std::move(c).value();
  return g;
}

SidpRemoteRanks::~SidpRemoteRanks() {
  if (!control_) return;
  for (int r = 1; r < dp_; ++r) (void)control_->send(r, Kind::shutdown, json::object());
}

Status SidpRemoteRanks::wait_ready(std::chrono::milliseconds timeout) {
  for (int r = 1; r < dp_; ++r) {
    auto m = control_->recv(r, timeout);
    if (!m) return m.error();
    try {
      if (m->kind == Kind::error)
        return make_error(ErrorCode::io, "sidp rank " + std::to_string(r) + ": " + m->body.at("message").get<std::string>());
      if (m->kind != Kind::ready)
        return corrupt(std::string("expected ready from rank ") + std::to_string(r) + ", got " + kind_name(m->kind));
      std::lock_guard lk(mu_);
      Peer& p = peers_[static_cast<std::size_t>(r)];
      p.weight_bytes = m->body.at("weight_bytes").get<std::size_t>();
      p.num_kv_blocks = m->body.at("num_kv_blocks").get<int>();
    } catch (const json::exception& e) {
      return corrupt(std::string("ready: ") + e.what());
    }
  }
  return Status::ok_status();
}

void SidpRemoteRanks::announce(sidp::SidpMode mode, std::uint64_t epoch) {
  for (int r = 1; r < dp_; ++r)
    (void)control_->send(r, Kind::directive, json{{"mode", sidp::mode_name(mode)}, {"epoch", epoch}});
}

void SidpRemoteRanks::stop(std::uint64_t round) {
  for (int r = 1; r < dp_; ++r) (void)control_->send(r, Kind::stop, json{{"round", round}});
}

void SidpRemoteRanks::abort(std::uint64_t round) {
  for (int r = 1; r < dp_; ++r) (void)control_->send(r, Kind::abort, json{{"round", round}});
}

Status SidpRemoteRanks::run_round(int rank, std::uint64_t round, const std::vector<std::uint64_t>& ids,
                                  const std::vector<std::vector<std::int32_t>>& prompts,
                                  const std::vector<sampling::SamplingParams>& params,
                                  const std::function<void(int, int)>& observer, SidpRound& sidp_round,
                                  std::vector<RequestOutput>& outputs) {
  json ps = json::array();
  for (const auto& p : params) ps.push_back(sidp_wire::params_to_json(p));
  if (Status st = control_->send(rank, Kind::round,
                                 json{{"round", round}, {"ids", ids}, {"prompts", prompts}, {"params", std::move(ps)}});
      !st)
    return st;
  for (;;) {
    // No deadline: an idle rank waits silently while its peers still work.
    auto m = control_->recv(rank, std::chrono::hours(24 * 365), [&] { return sidp_round.aborted(); });
    if (!m) return sidp_round.aborted() ? Status::ok_status() : Status(std::move(m).error());
    try {
      const json& b = m->body;
      if (m->kind == Kind::error)
        return make_error(ErrorCode::io, "sidp rank " + std::to_string(rank) + ": " + b.at("message").get<std::string>());
      if (b.at("round").get<std::uint64_t>() != round) continue;  // late news of an aborted round
      switch (m->kind) {
        case Kind::report:
          if (observer) observer(rank, b.at("num_seqs").get<int>());
          break;
        case Kind::idle:
          (void)sidp_round.idle(rank, b.at("epoch").get<std::uint64_t>());
          break;
        case Kind::done: {
          for (const json& o : b.at("outputs")) {
            auto decoded = sidp_wire::output_from_json(o);
            if (!decoded) return decoded.error();
            RequestOutput out = std::move(decoded).value();
            if (out.request_id >= outputs.size())
              return corrupt("rank " + std::to_string(rank) + " returned request " + std::to_string(out.request_id));
            outputs[out.request_id] = std::move(out);
          }
          auto stats = sidp_wire::stats_from_json(b.at("stats"));
          if (!stats) return stats.error();
          std::lock_guard lk(mu_);
          Peer& p = peers_[static_cast<std::size_t>(rank)];
          p.stats = *stats;
          p.bytes_sent = b.at("bytes_sent").get<std::uint64_t>();
          return Status::ok_status();
        }
        default:
          return corrupt(std::string("unexpected ") + kind_name(m->kind) + " from rank " + std::to_string(rank));
      }
    } catch (const std::exception& e) {
      return corrupt(std::string(kind_name(m->kind)) + " from rank " + std::to_string(rank) + ": " + e.what());
    }
  }
}

sidp::SidpFfnStats SidpRemoteRanks::stats(int rank) const {
  std::lock_guard lk(mu_);
  return peers_.at(static_cast<std::size_t>(rank)).stats;
}

std::size_t SidpRemoteRanks::weight_bytes(int rank) const {
  std::lock_guard lk(mu_);
  return peers_.at(static_cast<std::size_t>(rank)).weight_bytes;
}

int SidpRemoteRanks::num_kv_blocks(int rank) const {
  std::lock_guard lk(mu_);
  return peers_.at(static_cast<std::size_t>(rank)).num_kv_blocks;
}

std::uint64_t SidpRemoteRanks::bytes_sent(int rank) const {
  std::lock_guard lk(mu_);
  return peers_.at(static_cast<std::size_t>(rank)).bytes_sent;
}

// ---- a rank > 0 --------------------------------------------------------------

namespace {

/// The hooks of a remote rank's loop: reports and idles go to rank 0; the
/// control thread delivers directives, stop and abort.
class RemoteHooks final : public SidpRoundHooks {
 public:
  RemoteHooks(SidpRemoteRanks::Control& control, std::uint64_t round, const std::atomic<std::uint64_t>& announced,
              const std::atomic<std::uint64_t>& stopped, const std::atomic<std::uint64_t>& aborted,
              const std::atomic<bool>& lost)
      : control_(control), round_(round), announced_(announced), stopped_(stopped), aborted_(aborted), lost_(lost) {}
  void report(int num_seqs) override {
    (void)control_.send(0, Kind::report, json{{"round", round_}, {"num_seqs", num_seqs}});
  }
  void output(RequestOutput&& out) override { outputs.push_back(std::move(out)); }
  std::uint64_t announced_epoch() override { return announced_.load(); }
  bool idle(std::uint64_t epoch) override {
    if (!sent_idle_ || epoch != sent_epoch_) {
      sent_idle_ = true;
      sent_epoch_ = epoch;
      (void)control_.send(0, Kind::idle, json{{"round", round_}, {"epoch", epoch}});
    }
    return stopped_.load() == round_;
  }
  bool aborted() override { return aborted_.load() == round_ || lost_.load(); }

  std::vector<RequestOutput> outputs;

 private:
  SidpRemoteRanks::Control& control_;
  std::uint64_t round_;
  const std::atomic<std::uint64_t>& announced_;
  const std::atomic<std::uint64_t>& stopped_;
  const std::atomic<std::uint64_t>& aborted_;
  const std::atomic<bool>& lost_;
  bool sent_idle_ = false;
  std::uint64_t sent_epoch_ = 0;
};

}  // namespace

namespace {

/// Tells rank 0 about a failure of this rank, and returns it.
Status tell_rank0(SidpRemoteRanks::Control& control, Error e) {
  (void)control.send(0, Kind::error, json{{"message", e.to_string()}});
  return e;
}

/// The setup rank 0 sent, checked against this rank's arguments, options
/// and model. Errors: mismatch (another dp, rank, model shape or dtype),
/// corrupt (a field missing or out of range).
Result<SidpProcessSetup> read_setup(const json& s, const EngineOptions& base, const model::ModelConfig& cfg, int dp,
                                    int rank) {
  const auto mismatch = [&](const std::string& what, long long mine, long long theirs) {
    return make_error(ErrorCode::mismatch, "rank " + std::to_string(rank) + ": " + what + " is " +
                                               std::to_string(mine) + " here but " + std::to_string(theirs) +
                                               " on rank 0");
  };
  SidpProcessSetup setup;
  try {
    if (s.at("version").get<int>() != kSetupVersion)
      return mismatch("setup version", kSetupVersion, s.at("version").get<int>());
    if (s.at("dp").get<int>() != dp) return mismatch("dp", dp, s.at("dp").get<int>());
    if (s.at("rank").get<int>() != rank) return mismatch("rank", rank, s.at("rank").get<int>());
    if (s.at("num_layers").get<int>() != cfg.num_hidden_layers)
      return mismatch("num_hidden_layers", cfg.num_hidden_layers, s.at("num_layers").get<int>());
    if (s.at("hidden").get<int>() != cfg.hidden_size)
      return mismatch("hidden_size", cfg.hidden_size, s.at("hidden").get<int>());
    if (s.at("vocab").get<int>() != cfg.vocab_size)
      return mismatch("vocab_size", cfg.vocab_size, s.at("vocab").get<int>());
    if (s.at("dtype").get<int>() != static_cast<int>(base.dtype))
      return make_error(ErrorCode::mismatch, "rank " + std::to_string(rank) + ": weights dtype is " +
                                                 dtype_name(base.dtype) + " here but " +
                                                 dtype_name(static_cast<DType>(s.at("dtype").get<int>())) +
                                                 " on rank 0");
    setup.dp = dp;
    setup.plan.dp = dp;
    setup.plan.owner_of_layer = s.at("owners").get<std::vector<int>>();
    if (setup.plan.num_layers() != cfg.num_hidden_layers) return corrupt("setup: owners do not cover the layers");
    for (int o : setup.plan.owner_of_layer)
      if (o < 0 || o >= dp) return corrupt("setup: owner " + std::to_string(o) + " outside the group");
    setup.cache_slots = s.at("cache_slots").get<int>();
    setup.peak_shifting = s.at("peak_shifting").get<bool>();
    const auto mode = sidp::parse_mode(s.at("initial_mode").get<std::string>());
    if (!mode) return corrupt("setup: bad initial_mode");
    setup.initial_mode = *mode;
    setup.capture_logits = s.at("capture_logits").get<bool>();
    setup.owner_wait = std::chrono::milliseconds(s.at("owner_wait_ms").get<long long>());
    setup.comm_timeout = std::chrono::milliseconds(s.at("comm_timeout_ms").get<long long>());
    setup.link_gbps = s.at("link_gbps").get<double>();
    setup.link_latency_us = s.at("link_latency_us").get<double>();
  } catch (const json::exception& e) {
    return corrupt(std::string("setup: ") + e.what());
  }
  return setup;
}

/// A rank's weights and compute communicators, paced by the emulated link
/// when the setup asks for one.
struct RankComms {
  std::unique_ptr<comm::TcpCommunicator> weights_tcp, compute_tcp;
  std::unique_ptr<comm::Communicator> paced_weights, paced_compute;
  comm::Communicator* weights = nullptr;
  comm::Communicator* compute = nullptr;

  /// Sets the setup's timeout and pacing. Errors: the link model's.
  Status configure(const SidpProcessSetup& setup, int dp) {
    weights_tcp->set_timeout(setup.comm_timeout);
    compute_tcp->set_timeout(setup.comm_timeout);
    weights = weights_tcp.get();
    compute = compute_tcp.get();
    if (setup.link_gbps <= 0) return Status::ok_status();
    // This process paces its own transfers; an owner's egress shared by
    // readers in several processes is not modelled across processes.
    auto link = comm::LinkModel::create(dp, comm::LinkSpec{setup.link_gbps, setup.link_latency_us});
    if (!link) return std::move(link).error();
    auto pw = comm::PacedCommunicator::create(*weights_tcp, *link);
    if (!pw) return std::move(pw).error();
    auto pc = comm::PacedCommunicator::create(*compute_tcp, *link);
    if (!pc) return std::move(pc).error();
    paced_weights = std::move(pw).value();
    paced_compute = std::move(pc).value();
    weights = paced_weights.get();
    compute = paced_compute.get();
    return Status::ok_status();
  }
};

/// A rank's engine over its SiDP FFN: the layer owner of its layers (loaded
/// and exposed on the weights group), the FFN, and the engine. Torn down in
/// order: the engine and the FFN (whose housekeeper uses the weights
/// group), then the owner's regions.
struct RankEngine {
  std::shared_ptr<sidp::LayerOwner> owner;
  std::shared_ptr<sidp::SidpFfn> ffn;
  EngineInstance inst;
  comm::Communicator* weights_comm = nullptr;
  std::size_t weight_bytes = 0;  ///< FFN layers held plus the packed rest

  RankEngine() = default;
  RankEngine(const RankEngine&) = delete;
  RankEngine& operator=(const RankEngine&) = delete;
  ~RankEngine() {
    inst.engine.reset();
    inst.executor.reset();
    ffn.reset();
    if (owner) owner->unload(weights_comm);
  }

  Status build(const EngineOptions& base, std::shared_ptr<const model::ModelWeights> weights,
               const SidpProcessSetup& setup, int rank, const RankComms& comms) {
    weights_comm = comms.weights;
    auto owner_made = sidp::LayerOwner::create(weights, setup.plan, rank);
    if (!owner_made) return std::move(owner_made).error();
    owner = std::move(owner_made).value();
    if (Status st = owner->load(comms.weights); !st) return st;
    sidp::SidpFfnOptions fo;
    fo.cache.cache_slots = setup.cache_slots;
    fo.cache.owner_wait = setup.owner_wait;
    fo.peak_shifting = setup.peak_shifting;
    fo.initial_mode = setup.initial_mode;
    auto ffn_made = sidp::SidpFfn::create(setup.plan, rank, owner, comms.weights, comms.compute, fo);
    if (!ffn_made) return std::move(ffn_made).error();
    ffn = std::move(ffn_made).value();
    EngineOptions eo = base;
    eo.weights = std::move(weights);
    eo.ffn = ffn;
    eo.capture_logits = setup.capture_logits;
    eo.sidp_owned_ffn_layers = static_cast<int>(owner->owned_layers().size());
    eo.sidp_cache_slots = ffn->cache_slots();
    auto built = build_engine(eo);
    if (!built) return std::move(built).error();
    inst = std::move(built).value();
    weight_bytes = ffn->ffn_weight_bytes();
    if (auto* cpu = inst.executor_as<model::CpuModelRunner>()) weight_bytes += cpu->packed_weight_bytes();
    return Status::ok_status();
  }
};

/// A rank's control thread: takes rank 0's directives (announced to the
/// FFN at once), rounds (queued for the rank's loop), stop / abort of a
/// round and shutdown. The round hooks read its flags.
class RankControl {
 public:
  RankControl(SidpRemoteRanks::Control& control, sidp::SidpFfn& ffn) : control_(control), ffn_(ffn) {
    thread_ = std::thread([this] { run(); });
  }
  ~RankControl() {
    quit_ = true;
    thread_.join();
  }
  RankControl(const RankControl&) = delete;
  RankControl& operator=(const RankControl&) = delete;

  /// The next round's message (waits for one); nullopt when rank 0 shut
  /// this rank down. Errors: io (rank 0 went away), corrupt (a bad message).
  Result<std::optional<json>> next_round(int rank) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return shutdown_ || !rounds_.empty(); });
    if (rounds_.empty()) {
      if (!error_.ok() && error_.error().code != ErrorCode::io) return error_.error();
      if (lost_)
        return make_error(ErrorCode::io, "sidp rank " + std::to_string(rank) + ": rank 0 went away (" +
                                             error_.error().message + ")");
      return std::optional<json>();
    }
    json round = std::move(rounds_.front());
    rounds_.pop_front();
    return std::optional<json>(std::move(round));
  }

  std::atomic<std::uint64_t> announced{0}, stopped{0}, aborted{0};
  [[nodiscard]] const std::atomic<bool>& lost() const { return lost_; }

 private:
  void run() {
    for (;;) {
      auto m = control_.recv(0, std::chrono::hours(24 * 365), [&] { return quit_.load(); });
      std::lock_guard lk(mu_);
      if (quit_) return;
      if (!m) {
        lost_ = true;
        shutdown_ = true;
        error_ = std::move(m).error();
        cv_.notify_all();
        return;
      }
      try {
        handle(*m);
      } catch (const std::exception& e) {
        lost_ = true;
        shutdown_ = true;
        error_ = corrupt(std::string(kind_name(m->kind)) + ": " + e.what());
      }
      cv_.notify_all();
      if (shutdown_) return;
    }
  }

  /// One message from rank 0 (under mu_). Throws on a bad body.
  void handle(Message& m) {
    switch (m.kind) {
      case Kind::directive: {
        const auto mode = sidp::parse_mode(m.body.at("mode").get<std::string>());
        const auto epoch = m.body.at("epoch").get<std::uint64_t>();
        if (!mode) throw std::out_of_range("mode");
        ffn_.announce(*mode, epoch);
        if (epoch > announced.load()) announced = epoch;
        break;
      }
      case Kind::round: rounds_.push_back(std::move(m.body)); break;
      case Kind::stop: stopped = m.body.at("round").get<std::uint64_t>(); break;
      case Kind::abort: aborted = m.body.at("round").get<std::uint64_t>(); break;
      case Kind::shutdown: shutdown_ = true; break;
      default: throw std::out_of_range(std::string("unexpected ") + kind_name(m.kind));
    }
  }

  SidpRemoteRanks::Control& control_;
  sidp::SidpFfn& ffn_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> quit_{false};  ///< the rank returns: the thread stops
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<json> rounds_;
  bool shutdown_ = false;
  Status error_ = Status::ok_status();
  std::thread thread_;  ///< last: starts once the rest is built
};

/// One round rank 0 sent: its requests join the engine, the rank's loop
/// runs them (run_sidp_rank), and `done` carries the outputs and the FFN's
/// stats back. Errors: a bad round or a failed loop (rank 0 is told), io
/// when the round was aborted (the group is rebuilt, this process with it).
Status serve_round(const json& round_msg, int rank, RankEngine& re, RankControl& rc,
                   SidpRemoteRanks::Control& control, const RankComms& comms) {
  std::uint64_t round = 0;
  std::vector<std::uint64_t> ids;
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<sampling::SamplingParams> params;
  try {
    round = round_msg.at("round").get<std::uint64_t>();
    ids = round_msg.at("ids").get<std::vector<std::uint64_t>>();
    prompts = round_msg.at("prompts").get<std::vector<std::vector<std::int32_t>>>();
    for (const json& p : round_msg.at("params")) {
      auto decoded = sidp_wire::params_from_json(p);
      if (!decoded) return tell_rank0(control, decoded.error());
      params.push_back(*decoded);
    }
  } catch (const json::exception& e) {
    return tell_rank0(control, corrupt(std::string("round: ") + e.what()));
  }
  if (ids.size() != prompts.size() || ids.size() != params.size())
    return tell_rank0(control, corrupt("round: ids, prompts and params differ in length"));
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (Status st = re.inst.engine->add_request(ids[i], prompts[i], params[i]); !st)
      return tell_rank0(control, st.error());
  RemoteHooks hooks(control, round, rc.announced, rc.stopped, rc.aborted, rc.lost());
  if (Status st = run_sidp_rank(*re.inst.engine, *re.ffn, hooks); !st) return tell_rank0(control, st.error());
  if (hooks.aborted()) {
    // A peer failed: the group is broken (its CaS collectives may be
    // poisoned) and is rebuilt, this process with it.
    (void)control.send(0, Kind::done, json{{"round", round}, {"outputs", json::array()},
                                           {"stats", sidp_wire::stats_to_json(re.ffn->stats())}, {"bytes_sent", 0}});
    return make_error(ErrorCode::io, "sidp rank " + std::to_string(rank) + ": round " + std::to_string(round) +
                                         " aborted (a peer failed or rank 0 went away); the group must be rebuilt");
  }
  json outs = json::array();
  for (const RequestOutput& o : hooks.outputs) outs.push_back(sidp_wire::output_to_json(o));
  const std::uint64_t sent = comms.weights->bytes_sent() + comms.compute->bytes_sent();
  return control.send(0, Kind::done, json{{"round", round},
                                          {"outputs", std::move(outs)},
                                          {"stats", sidp_wire::stats_to_json(re.ffn->stats())},
                                          {"bytes_sent", sent}});
}

}  // namespace

Status serve_sidp_rank(const EngineOptions& base, int dp, int rank, const TcpGroupOptions& tcp,
                       const std::function<void(const std::string&)>& log) {
  const auto say = [&](const std::string& line) {
    if (log) log(line);
  };
  if (dp < 2 || rank < 1 || rank >= dp)
    return make_error(ErrorCode::invalid_argument,
                      "--rank must be in [1, " + std::to_string(dp) + ") for a SiDP group of dp=" + std::to_string(dp));
  if (base.parallel.group_size() != 1 || base.parallel.dp != 1)
    return make_error(ErrorCode::invalid_argument, "--weight-sharing sidp: each DP rank is one CPU device");
  if (base.device != model::DeviceKind::cpu)
    return make_error(ErrorCode::unsupported, "--weight-sharing sidp runs on CPU devices so far");
  auto addr = comm::parse_host_port(tcp.master);
  if (!addr) return std::move(addr).error();
  const auto& [host, port] = addr.value();
  if (port == 0) return make_error(ErrorCode::invalid_argument, "rank " + std::to_string(rank) + " needs rank 0's port");
  auto control_comm = join_tcp(host, port, rank, dp, tcp);
  if (!control_comm) return std::move(control_comm).error();
  SidpRemoteRanks::Control control(std::move(control_comm).value());
  // From here on every failure is told to rank 0 as well.
  auto setup_msg = control.recv(0, tcp.timeout);
  if (!setup_msg) return std::move(setup_msg).error();
  if (setup_msg->kind != Kind::setup)
    return tell_rank0(control, corrupt(std::string("expected setup, got ") + kind_name(setup_msg->kind)));
  const json& s = setup_msg->body;
  // Join the weights and compute groups first, so that rank 0 hears a
  // mismatch below as this rank's error (not as a rank that never joined).
  RankComms comms;
  try {
    auto w = join_tcp(host, s.at("weights_port").get<int>(), rank, dp, tcp);
    if (!w) return tell_rank0(control, std::move(w).error());
    comms.weights_tcp = std::move(w).value();
    auto c = join_tcp(host, s.at("compute_port").get<int>(), rank, dp, tcp);
    if (!c) return tell_rank0(control, std::move(c).error());
    comms.compute_tcp = std::move(c).value();
  } catch (const json::exception& e) {
    return tell_rank0(control, corrupt(std::string("setup: ") + e.what()));
  }
  auto weights = load_weights(base);
  if (!weights) return tell_rank0(control, std::move(weights).error());
  auto setup = read_setup(s, base, (*weights)->config, dp, rank);
  if (!setup) return tell_rank0(control, std::move(setup).error());
  if (Status st = comms.configure(*setup, dp); !st) return tell_rank0(control, st.error());
  RankEngine re;
  if (Status st = re.build(base, std::move(weights).value(), *setup, rank, comms); !st)
    return tell_rank0(control, st.error());
  const json ready{{"weight_bytes", re.weight_bytes}, {"num_kv_blocks", re.inst.num_kv_blocks}};
  if (Status st = control.send(0, Kind::ready, ready); !st) return st;
  say("sidp rank " + std::to_string(rank) + " of dp=" + std::to_string(dp) + " ready: owns layers " +
      std::to_string(re.owner->owned_layers().size()) + " of " + std::to_string(setup->plan.num_layers()) + ", " +
      std::to_string(re.weight_bytes) + " weight bytes, " + std::to_string(re.inst.num_kv_blocks) + " KV blocks");

  RankControl rc(control, *re.ffn);  // destroyed (its thread joined) before the engine
  if (base.num_threads > 0) omp_set_num_threads(base.num_threads);
  for (;;) {
    auto round = rc.next_round(rank);
    if (!round) return std::move(round).error();
    if (!*round) {
      say("sidp rank " + std::to_string(rank) + ": shutdown by rank 0");
      return Status::ok_status();
    }
    if (Status st = serve_round(**round, rank, re, rc, control, comms); !st) return st;
  }
}

}  // namespace shardline::engine
