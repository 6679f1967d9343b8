// `shardline cluster init`, `node start`, `job submit|status`, `actor list|kill`, `run`.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/client.hpp"
#include "model/tokenizer_loader.hpp"
#include "actors/node.hpp"
#include "api/batch_api.hpp"
#include "api/client_job_service.hpp"
#include "api/http_server.hpp"
#include "cli/commands.hpp"
#include "cli/progress_line.hpp"
#include "cli/parallel_auto.hpp"
#include "cli/devices.hpp"
#include "cli/engine_flags.hpp"
#include "cli/shift_threshold.hpp"
#include "cli/sidp_flags.hpp"
#include "cli/sidp_status.hpp"
#include "comm/address.hpp"
#include "engine/group/tcp_group.hpp"
#include "orchestrator/job_admission.hpp"
#include "engine/policies/token_budget_policies.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"
#include "kvstore/kv_store.hpp"
#include "kvstore/replication.hpp"

namespace shardline::cli {

namespace {

std::string default_key_file() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.shardline/cluster.key";
}

// ---- cluster init -------------------------------------------------------------

int run_cluster_init(const std::string& key_file) {
  auto key = actors::ClusterKey::generate();
  if (!key) return fail(key.error());
  if (Status s = key->save(key_file); !s) return fail(s.error());
  std::cout << "cluster key written to " << key_file << " (mode 0600); give it to every node and client\n";
  return 0;
}

// ---- node start ---------------------------------------------------------------

/// `--kv-sync`, `--kv-replication`, `--kv-store-mib`, `--kv-disk-mib`,
/// `--kv-disk-reserve-mib`, `--kv-prefix-mib` of `run` and `node start`.
struct KvFlags {
  std::string sync = "wal";
  int replication = kvstore::kDefaultReplicationFactor;
  std::uint64_t store_mib = 256;
  std::uint64_t disk_mib = 0;
  std::uint64_t disk_reserve_mib = 256;
  std::uint64_t prefix_mib = 1024;
};

struct NodeArgs {
  std::string name = "node0";
  std::string listen = "127.0.0.1:7411";
  std::string join;
  std::string devices;   // "" = the --parallel world size (cpu:1 without --parallel)
  std::string parallel;  // "" = not given: --devices cpu:N is N single-device workers
  std::string data_dir = "shardline-data";
  std::string model_dir;
  std::string key_file = default_key_file();
  std::string metrics;
  std::string http;            // --http HOST:PORT of the OpenAI Files / Batches API; "" = none
  std::string api_key_file;    // --api-key-file; "" = loopback only, no keys
  std::uint64_t max_upload_mib = 200;
  int max_batch = 64;
  std::string group_master;    // "" = every rank in this process
  std::string group_key_file;  // shared secret of a TCP group
  int group_timeout_ms = 60'000;
  actors::FailureDetection failure;
  KvFlags kv;
  EngineFlags engine;
  SidpFlags sidp;
};

/// --group-master / --group-key-file into the engine options: the engine
/// group's ranks 1.. are `shardline shard serve` processes over TCP.
Status tcp_group_flags(const std::string& master, const std::string& key_file, int timeout_ms,
                       const engine::ParallelConfig& pc, engine::EngineOptions& eo) {
  if (master.empty()) {
    if (!key_file.empty())
      return make_error(ErrorCode::invalid_argument, "--group-key-file needs --group-master");
    return Status::ok_status();
  }
  if (auto hp = comm::parse_host_port(master); !hp) return hp.error();
  if (pc.dp != 1 || pc.group_size() < 2)
    return make_error(ErrorCode::invalid_argument,
                      "--group-master needs one engine group of several ranks (dp=1, tp*pp*sp > 1), got --parallel " +
                          pc.to_string());
  if (timeout_ms < 1) return make_error(ErrorCode::invalid_argument, "--group-timeout-ms must be >= 1");
  eo.group_master = master;
  eo.group_timeout_ms = timeout_ms;
  if (!key_file.empty()) {
    std::ifstream in(key_file, std::ios::binary);
    if (!in) return make_error(ErrorCode::not_found, "cannot read --group-key-file " + key_file);
    eo.group_key.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return Status::ok_status();
}

Result<actors::NodeOptions> node_options(const NodeArgs& a) {
  auto devices = resolve_node_devices(a.devices, a.parallel);
  if (!devices) return std::move(devices).error();
  auto eo = to_engine_options(a.engine, a.model_dir);
  if (!eo) return std::move(eo).error();
  actors::NodeOptions o;
  o.name = a.name;
  o.listen = a.listen;
  o.join = a.join;
  o.num_cpu_devices = devices->num_cpu_devices;
  o.device_kind = devices->kind;
  o.cuda_devices = devices->cuda_devices;
  o.cuda_ranks_per_gpu = devices->cuda_ranks_per_gpu;
  o.parallel = devices->parallel;
  o.data_dir = a.data_dir;
  o.engine = *eo;
  if (Status st = tcp_group_flags(a.group_master, a.group_key_file, a.group_timeout_ms, o.parallel, o.engine); !st) return st.error();
  // Each device (a rank of an engine group) gets its share of the cores
  // unless told otherwise.
  if (o.engine.num_threads == 0)
    o.engine.num_threads =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, devices->num_cpu_devices));
  if (Status st = resolve_shift_threshold(a.engine, o.parallel, o.engine); !st) return st.error();
  if (const auto& cd = o.engine.parallel_decode; cd && cd->group_size() != o.parallel.group_size())
    return make_error(ErrorCode::invalid_argument,
                      "--parallel-decode " + a.engine.parallel_decode + " must use the " +
                          std::to_string(o.parallel.group_size()) + " devices of each --parallel group (" +
                          o.parallel.to_string() + "), got " + std::to_string(cd->group_size()));
  o.max_batch = a.max_batch;
  o.key_file = a.key_file;
  o.metrics = a.metrics;
  if (Status st = a.failure.check(); !st) return st.error();
  o.failure = a.failure;
  auto sync = kvstore::parse_kv_sync_policy(a.kv.sync);
  if (!sync) return make_error(ErrorCode::invalid_argument, "--kv-sync: " + sync.error().message);
  o.kv_sync = *sync;
  if (a.kv.replication < 0)
    return make_error(ErrorCode::invalid_argument,
                      "--kv-replication must be >= 0, got " + std::to_string(a.kv.replication));
  o.kv_replication = a.kv.replication;
  if (Status st = apply_sidp_flags(a.sidp, o); !st) return st.error();
  o.kv_store_bytes = a.kv.store_mib << 20;
  o.kv_disk_bytes = a.kv.disk_mib << 20;
  o.kv_disk_reserve_bytes = a.kv.disk_reserve_mib << 20;
  o.kv_prefix_bytes = a.kv.prefix_mib << 20;
  return o;
}

/// "2 workers of [tp=2,pp=1,sp=1] on cpu:4, 1 thread per device".
std::string describe_workers(const actors::NodeOptions& o) {
  if (o.device_kind == model::DeviceKind::cuda) {
    std::string list;
    for (int d : o.cuda_devices) list += (list.empty() ? "" : ",") + std::to_string(d);
    const int group = o.parallel.group_size();
    const std::string shape = "each a group of [tp=" + std::to_string(o.parallel.tp) + ",pp=" +
                              std::to_string(o.parallel.pp) + ",sp=" + std::to_string(o.parallel.sp) + "]: ";
    const std::string each = group == 1 ? (o.cuda_ranks_per_gpu > 1 ? std::to_string(o.cuda_ranks_per_gpu) +
                                                                          " workers sharing each GPU"
                                                                    : "one device each")
                             : o.cuda_ranks_per_gpu == 1
                                 ? shape + "a GPU per rank, over NCCL"
                                 : shape + std::to_string(group) + " ranks sharing its GPU";
    return std::to_string(o.parallel.dp) + (o.parallel.dp == 1 ? " worker" : " workers") + " on cuda:" + list + " (" +
           each + ", --gpu-memory-utilization " + std::to_string(o.engine.gpu_memory_utilization).substr(0, 4) +
           (o.engine.deterministic ? ", deterministic" : "") + ")";
  }
  std::string sidp;
  if (o.sidp)
    sidp = ", SiDP weight sharing (--sidp-mode " + std::string(engine::to_string(o.sidp_policy.setting)) +
           (o.sidp_policy.setting == engine::SidpModeSetting::automatic
                ? ", b* = " + std::to_string(o.sidp_policy.switch_batch) + " running sequences"
                : std::string()) +
           ")";
  return std::to_string(o.parallel.dp) + (o.parallel.dp == 1 ? " worker" : " workers") + " of [" +
         orchestrator::group_label(o.parallel) + "] on cpu:" + std::to_string(o.num_cpu_devices) + ", " +
         std::to_string(o.engine.num_threads) + (o.engine.num_threads == 1 ? " thread" : " threads") +
         " per device" + sidp;
}

/// --devices and --parallel of `run` and `node start`.
void add_placement_flags(CLI::App& cmd, std::string& devices, std::string& parallel) {
  cmd.add_option("--devices", devices,
                 "cpu:N; must be tp*pp*sp*dp of --parallel (default: that many; cpu:1 without --parallel, where "
                 "cpu:N means N single-device workers); or cuda:LIST (cuda:0, cuda:0,1, cuda:0-3): one "
                 "single-device worker per GPU, or with --parallel tp*pp*sp > 1 a GPU per rank (tp*pp*sp*dp GPUs; the ranks talk over NCCL); cuda:0x2: two ranks sharing GPU 0 (tp=2 without --parallel; --parallel pp=2 or sp=2 makes them pipeline stages or Ulysses ranks; --parallel dp=2 makes them two single-device workers, e.g. for --weight-sharing sidp)");
  cmd.add_option("--parallel,--parallel-prefill", parallel,
                 "tp=..,pp=..,sp=..,dp=..: dp workers, each one engine group of tp*pp*sp devices (default: single); "
                 "with --parallel-decode, the config prefill runs in (Seesaw's cp). `run --parallel auto`: the "
                 "planner's choice for --devices (default: every core) and the input (docs/simulator.md)");
}

/// --group-master, --group-key-file and --group-timeout-ms of `run` and `node start`.
void add_tcp_group_flags(CLI::App& cmd, std::string& master, std::string& key_file, int& timeout_ms) {
  cmd.add_option("--group-master", master,
                 "HOST:PORT this process (rank 0) binds; the engine group's other ranks are `shardline shard "
                 "serve` processes joining there over TCP (needs dp=1)");
  cmd.add_option("--group-key-file", key_file,
                 "Shared secret the TCP group's ranks must all know (e.g. the cluster key file)");
  cmd.add_option("--group-timeout-ms", timeout_ms,
                 "How long rank 0 waits for the TCP group's ranks to join, and for any peer in a step")
      ->capture_default_str();
}

/// --heartbeat-ms and --failure-timeout-ms of `run` and `node start`.
void add_failure_flags(CLI::App& cmd, actors::FailureDetection& f) {
  cmd.add_option("--heartbeat-ms", f.heartbeat_ms,
                 "How often each worker sends a heartbeat, between engine steps (a worker stuck in a step sends none)")
      ->capture_default_str();
  cmd.add_option("--failure-timeout-ms", f.failure_timeout_ms,
                 "A worker silent this long is declared dead: killed, its lines requeued, and replaced (must exceed "
                 "--heartbeat-ms; the orchestrator's node decides)")
      ->capture_default_str();
}

void add_kv_flags(CLI::App& cmd, KvFlags& kv) {
  cmd.add_option("--kv-sync", kv.sync,
                 "When a KV store write counts as durable: none (memory), wal (survives kill -9), fsync (survives "
                 "power loss); see docs/kv-recovery.md")
      ->capture_default_str();
  cmd.add_option("--kv-replication", kv.replication,
                 "Copies of each request's KV: this node's store plus the next stores of the ring (DéjàVu); "
                 "1 = local RocksDB only, 0 = no KV streaming (a failed line recomputes from its tokens)")
      ->capture_default_str();
  cmd.add_option("--kv-store-mib", kv.store_mib, "Host-memory tier of this node's KV store, MiB")
      ->capture_default_str();
  cmd.add_option("--kv-disk-mib", kv.disk_mib,
                 "Most chunk bytes this node's KV store keeps on disk, MiB (0 = no cap); past it, new KV is not "
                 "stored and a failed line recomputes it")
      ->capture_default_str();
  cmd.add_option("--kv-disk-reserve-mib", kv.disk_reserve_mib,
                 "Free space the KV store leaves on its disk for jobs.db and outputs, MiB (0 = none)")
      ->capture_default_str();
  cmd.add_option("--kv-prefix-mib", kv.prefix_mib,
                 "Prefix blocks this node's KV store keeps for prefix caching, MiB, least recently used dropped "
                 "first: shared prompt prefixes survive a restart and serve the next job (0 = none)")
      ->capture_default_str();
}

// The stop signals (SIGINT, SIGTERM) reach the node's main thread through a
// pipe. Blocking them in every thread and sigwait-ing in main is not enough:
// a thread that a shared library started before main() runs with them
// unblocked (OpenBLAS's pthread build starts its pool in its constructor),
// the kernel may hand a process-directed signal to that thread, and there
// the default action ends the process with 128 + signal, no clean stop. A
// handler runs on whichever thread takes the signal and only writes the
// signal's number to the pipe (async-signal-safe).
int g_stop_pipe[2] = {-1, -1};  // [read end, write end (non-blocking)]

void on_stop_signal(int sig) {
  const int saved_errno = errno;
  const auto byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_stop_pipe[1], &byte, 1);
  errno = saved_errno;
}

/// Installs the stop handler for SIGINT and SIGTERM and blocks both in the
/// calling thread, so that the threads it starts from now on inherit the
/// block and only the main thread (in wait_for_stop_signal) or a foreign
/// thread takes them. Errors: internal when the pipe or a handler cannot be
/// set up.
[[nodiscard]] Status install_stop_signals() {
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0 || ::fcntl(g_stop_pipe[1], F_SETFL, O_NONBLOCK) != 0)
    return make_error(ErrorCode::internal, std::string("stop-signal pipe: ") + std::strerror(errno));
  struct sigaction action{};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigset_t set;
  sigemptyset(&set);
  for (const int sig : {SIGINT, SIGTERM}) {
    if (::sigaction(sig, &action, nullptr) != 0)
      return make_error(ErrorCode::internal, std::string("stop-signal handler: ") + std::strerror(errno));
    sigaddset(&set, sig);
  }
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return Status::ok_status();
}

/// Unblocks the stop signals in the calling (main) thread and waits until
/// one has arrived, on any thread; returns its number.
int wait_for_stop_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  unsigned char byte = 0;
  while (::read(g_stop_pipe[0], &byte, 1) != 1) {
    if (errno != EINTR) return 0;
  }
  return byte;
}

int run_node_start(NodeArgs& a) {
  if (Status s = install_stop_signals(); !s) return fail(s.error());
  auto o = node_options(a);
  if (!o) return fail(o.error(), 2);
  if (!o->join.empty()) o->listen.clear();
  const std::string workers = describe_workers(*o);
  auto node = actors::Node::start(std::move(o).value());
  // A bad flag value for this model or machine (a tp that does not divide
  // its heads) is a usage error; a missing or broken model folder is not.
  if (!node) return fail(node.error(), node.error().code == ErrorCode::invalid_argument ? 2 : 1);
  if ((*node)->port() > 0) {
    const std::string host = a.listen.substr(0, a.listen.rfind(':'));
    std::cout << "shardline node " << a.name << " listening on " << host << ":" << (*node)->port() << std::endl;
  } else {
    std::cout << "shardline node " << a.name << " joined " << a.join << std::endl;
  }
  std::cout << "workers: " << workers << std::endl;
  if ((*node)->metrics_port() > 0)
    std::cout << "metrics on port " << (*node)->metrics_port() << std::endl;
  // The OpenAI Files / Batches API (docs/http.md): batches become jobs of
  // this cluster through a client of the node's orchestrator (or its proxy).
  std::unique_ptr<api::ClientJobService> api_jobs;
  std::unique_ptr<api::BatchApi> batch_api;
  std::unique_ptr<api::HttpApiServer> http;
  if (!a.http.empty()) {
    api_jobs = std::make_unique<api::ClientJobService>(
        actors::Client::local((*node)->system(), (*node)->orchestrator(), (*node)->key()));
    api::BatchApiOptions bo;
    bo.dir = std::filesystem::path(a.data_dir) / "api";
    bo.model_dir = std::filesystem::absolute(a.model_dir).lexically_normal().string();
    bo.max_upload_bytes = a.max_upload_mib << 20;
    auto opened = api::BatchApi::open(bo, *api_jobs);
    if (!opened) return fail(opened.error());
    batch_api = std::move(opened).value();
    actors::MetricsRegistry& metrics = (*node)->metrics();
    metrics.describe("shardline_http_auth_failures_total", "counter",
                     "HTTP API requests refused for a missing or wrong API key.");
    api::HttpApiOptions ho;
    ho.host_port = a.http;
    ho.api_key_file = a.api_key_file;
    ho.on_auth_failure = [&metrics] { metrics.add("shardline_http_auth_failures_total", "", 1); };
    auto started = api::HttpApiServer::start(ho, *batch_api);
    if (!started) return fail(started.error(), started.error().code == ErrorCode::invalid_argument ? 2 : 1);
    http = std::move(started).value();
    std::cout << "http api on port " << http->port() << std::endl;
    if (!http->authenticated())
      spdlog::warn("http api on {} without --api-key-file: loopback only, no authentication", a.http);
  }
  const int sig = wait_for_stop_signal();
  spdlog::info("node {}: signal {}, stopping", a.name, sig);
  http.reset();  // no new batches while the node stops
  (*node)->stop();
  // Every actor of this node has stopped and all durable state is synced
  // (RocksDB writes and the output file are synced at each commit). The CAF
  // 0.17 actor system itself is not torn down: actors that a peer node still
  // references keep their threads until that connection closes, so
  // ~actor_system could wait on another process. Exit directly instead.
  spdlog::shutdown();
  std::cout.flush();
  std::_Exit(0);
}

// ---- job / actor commands -------------------------------------------------------

struct ClientArgs {
  std::string node = "127.0.0.1:7411";
  std::string key_file = default_key_file();
};

void add_client_flags(CLI::App& cmd, ClientArgs& c) {
  cmd.add_option("--node", c.node, "HOST:PORT of a node running the orchestrator")->capture_default_str();
  cmd.add_option("--key-file", c.key_file, "Cluster key (from `shardline cluster init`)")->capture_default_str();
}

std::string format_eta(double s) {
  if (s < 0) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

nlohmann::json to_json(const messages::JobProgress& p) {
  return {{"job_id", p.job_id},   {"state", p.state},
          {"total", p.total},     {"done", p.done},
          {"failed", p.failed},   {"prompt_tokens", p.prompt_tokens},
          {"completion_tokens", p.completion_tokens},
          {"tokens_per_s", p.tokens_per_s}, {"eta_s", p.eta_s},
          {"output", p.output},   {"parallel", p.parallel},
          {"token_budget", p.token_budget}, {"requeued", p.requeued},
          {"resumed", p.resumed}, {"error", p.error}, {"paused", p.paused},
          {"cached_tokens", p.cached_tokens}, {"prefix_ordered", p.prefix_ordered},
          {"prefix_ideal_hit_rate", p.prefix_ideal_hit_rate}};
}

/// "prefix cache: 87.5% of prompt tokens cached (ideal 93.4%, the prompts'
/// prefix tree; lines in prefix order)", or "" when the job has no prompt
/// tokens or nothing to share.
std::string prefix_cache_line(const messages::JobProgress& p) {
  if (p.prompt_tokens == 0 || (p.cached_tokens == 0 && p.prefix_ideal_hit_rate <= 0)) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "prefix cache: %.1f%% of prompt tokens cached (ideal %.1f%%, the prompts' prefix tree%s)",
                100.0 * static_cast<double>(p.cached_tokens) / static_cast<double>(p.prompt_tokens),
                100.0 * p.prefix_ideal_hit_rate, p.prefix_ordered ? "; lines in prefix order" : "");
  return buf;
}

void print_actor_table(const messages::ActorList& actors) {
  std::printf("%-24s %-12s %-8s %-18s %-22s %s\n", "ACTOR", "KIND", "NODE", "GROUP", "STATE", "DETAIL");
  for (const auto& a : actors.actors) {
    const std::string group = a.parallel.empty() ? "-" : "[" + a.parallel + "]";
    std::printf("%-24s %-12s %-8s %-18s %-22s %s\n", a.name.c_str(), a.kind.c_str(), a.node.c_str(), group.c_str(),
                a.state.c_str(), a.detail.c_str());
  }
}

void print_progress_table(const messages::JobStatusList& jobs, const messages::ActorList* actors) {
  std::printf("%-6s %-8s %14s %8s %12s %12s %10s %8s %9s %8s  %-20s %-9s %s\n", "JOB", "STATE", "DONE/TOTAL",
              "FAILED", "PROMPT_TOK", "GEN_TOK", "TOK/S", "ETA", "REQUEUED", "RESUMED", "PARALLEL", "BUDGET",
              "OUTPUT");
  for (const auto& p : jobs.jobs) {
    const std::string frac = std::to_string(p.done) + "/" + std::to_string(p.total);
    const std::string state = p.paused.empty() ? p.state : "paused";  // unfinished, waiting for a write to succeed
    std::printf("%-6llu %-8s %14s %8llu %12llu %12llu %10.1f %8s %9llu %8llu  %-20s %-9s %s\n",
                static_cast<unsigned long long>(p.job_id), state.c_str(), frac.c_str(),
                static_cast<unsigned long long>(p.failed), static_cast<unsigned long long>(p.prompt_tokens),
                static_cast<unsigned long long>(p.completion_tokens), p.tokens_per_s, format_eta(p.eta_s).c_str(),
                static_cast<unsigned long long>(p.requeued), static_cast<unsigned long long>(p.resumed),
                p.parallel.empty() ? "-" : p.parallel.c_str(), p.token_budget.c_str(), p.output.c_str());
    if (const std::string line = prefix_cache_line(p); !line.empty()) std::printf("       %s\n", line.c_str());
    if (!p.error.empty()) std::printf("       %s\n", p.error.c_str());  // why it failed or is held back
    if (!p.paused.empty())  // a write failed (a full disk): retried until it succeeds
      std::printf("       paused: %s (retrying)\n", p.paused.c_str());
  }
  if (!jobs.sidp_groups.empty()) std::printf("\n%s", format_sidp_groups(jobs.sidp_groups).c_str());
  if (actors) {
    std::printf("\n");
    print_actor_table(*actors);
  }
  std::fflush(stdout);
}

struct SubmitArgs {
  ClientArgs client;
  std::string model_dir;
  std::vector<std::string> inputs;
  std::string output;
  std::string parallel;            // "" = not given (whatever the cluster runs)
  std::string token_budget = "fixed";
  std::string weight_sharing;      // "" = not given (whatever the cluster runs)
  std::string chat_template;       // --chat-template FILE; "" = the model folder's
  bool overwrite = false;
};

/// The job's --parallel, --token-budget and --chat-template (read and
/// parsed here, so a broken template refuses the submit instead of failing
/// every chat line), checked before anything is sent.
Status job_flags(const std::string& parallel, const std::string& token_budget, const std::string& chat_template,
                 const std::string& model_dir, messages::SubmitJob& sj) {
  if (!chat_template.empty()) {
    std::ifstream in(chat_template, std::ios::binary);
    if (!in) return make_error(ErrorCode::io, "--chat-template: cannot read " + chat_template);
    std::ostringstream text;
    text << in.rdbuf();
    auto parsed = model::chat_template_from_source(model_dir, text.str(), chat_template);
    if (!parsed) return make_error(parsed.error().code, "--chat-template: " + parsed.error().message);
    sj.chat_template = text.str();
  }
  if (!parallel.empty()) {
    auto pc = engine::parse_parallel_config(parallel);
    if (!pc) return pc.error();
    sj.parallel = *pc;
  }
  auto budget = orchestrator::normalize_token_budget(token_budget);
  if (!budget) return budget.error();
  sj.token_budget = *budget;
  return {};
}

std::string absolute(const std::string& p) { return std::filesystem::absolute(p).lexically_normal().string(); }

/// `job submit --parallel auto`: the planner's config for the job's lines
/// on the cluster's devices (every registered worker's engine group, CPU
/// devices), said on stderr. Errors: not_found (no worker registered),
/// invalid_argument (CUDA workers), the planner's.
Result<std::string> plan_for_cluster(actors::Client& client, const SubmitArgs& a) {
  auto actors = client.call<messages::ActorList>(messages::ActorListQuery{});
  if (!actors) return actors.error();
  int num_devices = 0;
  for (const messages::ActorInfo& info : actors->actors) {
    if (info.kind != "worker") continue;
    if (info.name.find("cuda") != std::string::npos)
      return make_error(ErrorCode::invalid_argument,
                        "--parallel auto plans for CPU devices; worker " + info.name + " runs on CUDA");
    auto pc = engine::parse_parallel_config(info.parallel.empty() ? "single" : info.parallel);
    num_devices += pc ? pc->group_size() : 1;
  }
  if (num_devices == 0)
    return make_error(ErrorCode::not_found, "--parallel auto: no worker has registered with the cluster yet");
  std::vector<std::string> inputs(a.inputs.begin(), a.inputs.end());
  auto chosen = plan_parallel_auto(a.model_dir, inputs, "cpu:" + std::to_string(num_devices), a.token_budget,
                                   engine::EngineConfig{}.max_num_seqs);
  if (!chosen) return chosen.error();
  std::cerr << "shardline job submit: --parallel auto: " << chosen->parallel << " on the cluster's "
            << chosen->devices << ". " << chosen->why << "\n";
  return chosen->parallel;
}

int run_job_submit(const SubmitArgs& a) {
  messages::SubmitJob sj;
  auto client = actors::Client::connect(a.client.node, a.client.key_file);
  if (!client) return fail(client.error());
  std::string parallel = a.parallel;
  if (parallel == "auto") {
    auto chosen = plan_for_cluster(**client, a);
    if (!chosen) return fail(chosen.error(), chosen.error().code == ErrorCode::invalid_argument ? 2 : 1);
    parallel = *chosen;
  }
  if (Status st = job_flags(parallel, a.token_budget, a.chat_template, a.model_dir, sj); !st)
    return fail(st.error(), 2);
  sj.weight_sharing = a.weight_sharing;
  sj.overwrite = a.overwrite;
  sj.model_dir = absolute(a.model_dir);
  for (const auto& in : a.inputs) sj.inputs.push_back(absolute(in));
  sj.output = absolute(a.output);
  auto reply = (*client)->call<messages::JobSubmitted>(sj, std::chrono::minutes(5));
  if (!reply) return fail(reply.error());
  std::cout << reply->job_id << std::endl;
  return 0;
}

struct StatusArgs {
  ClientArgs client;
  std::uint64_t job_id = 0;
  bool watch = false;
  bool json = false;
};

int run_job_status(const StatusArgs& a) {
  auto client = actors::Client::connect(a.client.node, a.client.key_file);
  if (!client) return fail(client.error());
  while (true) {
    auto reply = (*client)->call<messages::JobStatusList>(messages::JobStatusQuery{a.job_id});
    if (!reply) return fail(reply.error());
    const messages::JobStatusList& jobs = *reply;
    auto actors_reply = (*client)->call<messages::ActorList>(messages::ActorListQuery{});
    if (a.json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& p : jobs.jobs) arr.push_back(to_json(p));
      nlohmann::json workers = nlohmann::json::array();
      if (actors_reply)
        for (const auto& x : actors_reply->actors)
          workers.push_back({{"name", x.name},
                             {"kind", x.kind},
                             {"node", x.node},
                             {"state", x.state},
                             {"parallel", x.parallel},
                             {"detail", x.detail}});
      const nlohmann::json out{{"jobs", arr}, {"actors", workers}, {"sidp_groups", sidp_groups_json(jobs.sidp_groups)}};
      std::cout << out.dump() << std::endl;
    } else {
      if (a.watch) std::cout << "\033[2J\033[H";
      print_progress_table(jobs, actors_reply ? &*actors_reply : nullptr);
    }
    if (!a.watch) return 0;
    bool all_finished = !jobs.jobs.empty();
    for (const auto& p : jobs.jobs)
      all_finished = all_finished && (p.state == "done" || p.state == "failed" || p.state == "cancelled");
    if (all_finished) return 0;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

int run_job_cancel(const ClientArgs& c, std::uint64_t job_id) {
  auto client = actors::Client::connect(c.node, c.key_file);
  if (!client) return fail(client.error());
  auto reply = (*client)->call<messages::JobStatusList>(messages::JobCancel{job_id});
  if (!reply) return fail(reply.error());
  if (reply->jobs.empty()) return fail(make_error(ErrorCode::internal, "the orchestrator sent no progress"));
  const messages::JobProgress& p = reply->jobs.front();
  std::cout << "job " << p.job_id << " cancelled: " << p.done << " of " << p.total << " lines (" << p.failed
            << " with errors) in " << p.output << "\n";
  return 0;
}

int run_actor_list(const ClientArgs& c) {
  auto client = actors::Client::connect(c.node, c.key_file);
  if (!client) return fail(client.error());
  auto reply = (*client)->call<messages::ActorList>(messages::ActorListQuery{});
  if (!reply) return fail(reply.error());
  print_actor_table(*reply);
  return 0;
}

int run_actor_kill(const ClientArgs& c, const std::string& name) {
  auto client = actors::Client::connect(c.node, c.key_file);
  if (!client) return fail(client.error());
  auto reply = (*client)->call<messages::Ack>(messages::KillActor{name});
  if (!reply) return fail(reply.error());
  std::cout << "killed " << name << std::endl;
  return 0;
}

// ---- run (embedded) ------------------------------------------------------------------

struct RunArgs {
  std::string model_dir;
  std::vector<std::string> inputs;
  std::string output;
  std::string devices;   // "" = the --parallel world size (cpu:1 without --parallel)
  std::string parallel;  // "" = --devices cpu:N single-device workers
  std::string token_budget = "fixed";
  std::string chat_template;  // --chat-template FILE; "" = the model folder's
  std::string data_dir;  // default: OUTPUT.shardline
  std::string metrics;
  std::string metrics_file;  // --metrics-file: the final metrics at exit; "" = none
  int max_batch = 64;
  bool quiet = false;
  bool overwrite = false;
  std::string group_master;
  std::string group_key_file;
  int group_timeout_ms = 60'000;
  actors::FailureDetection failure;
  KvFlags kv;
  EngineFlags engine;
  SidpFlags sidp;
};

std::string progress_bar(const messages::JobProgress& p) {
  const int width = 30;
  const double frac = p.total ? static_cast<double>(p.done) / static_cast<double>(p.total) : 0.0;
  const int filled = static_cast<int>(frac * width);
  char buf[256];
  std::snprintf(buf, sizeof buf, "[%s%s] %llu/%llu lines (%llu failed)  %.0f tok/s  ETA %s   ",
                std::string(static_cast<std::size_t>(filled), '#').c_str(),
                std::string(static_cast<std::size_t>(width - filled), ' ').c_str(),
                static_cast<unsigned long long>(p.done), static_cast<unsigned long long>(p.total),
                static_cast<unsigned long long>(p.failed), p.tokens_per_s, format_eta(p.eta_s).c_str());
  // Paused by a failed write: the reason's code ("disk_full"), the message
  // is in the log line above the bar.
  if (!p.paused.empty()) return std::string(buf) + "PAUSED: " + p.paused.substr(0, p.paused.find(':')) + "   ";
  return buf;
}

/// Submits (or continues) `run`'s job on its node and follows it to the
/// end with the progress bar; the exit code.
int follow_run_job(const RunArgs& a, actors::Node& node, messages::SubmitJob sj, const std::string& data_dir,
                   ProgressLine& bar) {
  auto client = actors::Client::local(node.system(), node.orchestrator(), node.key());

  // The same command again resumes its job: the newest job of the data dir
  // with the same inputs and output is continued if unfinished (after a
  // crash) or reported if finished (with --overwrite: run again); otherwise
  // a new job is submitted.
  const std::string output = absolute(a.output);
  std::vector<std::string> inputs;
  for (const auto& in : a.inputs) inputs.push_back(absolute(in));
  std::uint64_t job_id = 0;
  auto existing = client->call<messages::JobStatusList>(messages::JobStatusQuery{0});
  if (!existing) return fail(existing.error());
  for (const auto& p : existing->jobs)
    if (p.output == output && p.inputs == inputs) job_id = p.job_id;
  if (job_id != 0 && a.overwrite)
    for (const auto& p : existing->jobs)
      if (p.job_id == job_id && (p.state == "done" || p.state == "failed" || p.state == "cancelled")) job_id = 0;
  if (job_id == 0) {
    sj.overwrite = a.overwrite;
    sj.model_dir = a.model_dir;
    sj.inputs = inputs;
    sj.output = output;
    auto reply = client->call<messages::JobSubmitted>(sj, std::chrono::minutes(5));
    if (!reply) return fail(reply.error());
    job_id = reply->job_id;
  } else if (!a.quiet) {
    std::cerr << "continuing job " << job_id << " of " << data_dir << "\n";
  }
  while (true) {
    auto reply = client->call<messages::JobStatusList>(messages::JobStatusQuery{job_id});
    if (!reply) return fail(reply.error());
    const messages::JobProgress& p = reply->jobs.at(0);
    if (!a.quiet) bar.draw(progress_bar(p));
    const bool finished = p.state == "done" || p.state == "failed" || p.state == "cancelled";
    if (!finished && !p.error.empty()) {  // held back: recorded with another model (issue 46, item 10)
      bar.finish();
      std::cerr << "error: " << p.error << "\n";
      return 1;
    }
    if (!finished && node.worker_start_failures() >= node.num_workers()) {
      bar.finish();
      // The cause is the final error (issue 46, item 14): what the first
      // worker that failed said, not only a log line above.
      std::cerr << "error: no worker could start its engine: " << node.first_worker_start_error() << "; job "
                << job_id << " stays resumable in " << data_dir << "\n";
      return 1;
    }
    if (finished) {
      bar.finish();
      if (p.state != "done") {
        std::cerr << "error: job " << job_id << " " << p.state << " (" << p.done << " of " << p.total
                  << " lines in " << p.output << ")" << (p.error.empty() ? "" : ": " + p.error) << "\n";
        return 1;
      }
      if (!a.quiet) {
        std::cerr << "job " << job_id << ": " << p.done << " lines (" << p.failed << " with errors) -> " << p.output
                  << "\n";
        if (const std::string line = prefix_cache_line(p); !line.empty()) std::cerr << line << "\n";
      }
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

int run_run(RunArgs& a) {
  // The progress bar is the run's report: info lines would land before and
  // inside it. Warnings and errors still show; --quiet keeps errors only.
  if (user_log_level().empty()) spdlog::set_level(a.quiet ? spdlog::level::err : spdlog::level::warn);
  // The bar owns its line: every log line goes through it, above the bar
  // (set before the node's threads log; the sink outlives them).
  const auto bar = std::make_shared<ProgressLine>(stderr, ::isatty(STDERR_FILENO) != 0);
  if (!a.quiet) {
    auto sink = std::make_shared<ProgressLogSink>(bar);
    sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
    spdlog::default_logger()->sinks() = {sink};
  }
  if (a.parallel == "auto") {
    std::vector<std::string> inputs;
    for (const auto& in : a.inputs) inputs.push_back(in);
    auto chosen = plan_parallel_auto(a.model_dir, inputs, a.devices, a.token_budget, a.max_batch);
    if (!chosen) return fail(chosen.error(), 2);
    if (!a.quiet) std::cerr << "shardline run: --parallel auto: " << chosen->parallel << " on " << chosen->devices
                            << ". " << chosen->why << "\n";
    a.parallel = chosen->parallel;
    a.devices = chosen->devices;
  }
  // A folder without a tokenizer would run every line on token ids and
  // write ids as text, then exit 0 (issue 46, item 12): refuse it before
  // anything is created, as `generate` does. Dummy weights (benchmark
  // shapes) are the exception: there the ids are the point.
  if (std::error_code ec; !std::filesystem::is_directory(a.model_dir, ec))
    return fail(make_error(ErrorCode::not_found, "--model " + a.model_dir + ": no such folder"));
  if (a.engine.load_format != "dummy" && !model::has_tokenizer(a.model_dir))
    return fail(make_error(ErrorCode::not_found,
                           a.model_dir + " has no tokenizer (tokenizer.json, tokenizer.model or a GGUF file): `run` "
                                         "writes text, so it needs one (random-weight shapes run with "
                                         "--load-format dummy)"),
                2);
  NodeArgs na;
  na.name = "local";
  na.listen.clear();
  na.devices = a.devices;
  na.parallel = a.parallel;
  na.data_dir = a.data_dir.empty() ? a.output + ".shardline" : a.data_dir;
  na.model_dir = a.model_dir;
  na.key_file.clear();
  na.metrics = a.metrics;
  na.max_batch = a.max_batch;
  na.group_master = a.group_master;
  na.group_key_file = a.group_key_file;
  na.group_timeout_ms = a.group_timeout_ms;
  na.failure = a.failure;
  na.kv = a.kv;
  na.engine = a.engine;
  na.sidp = a.sidp;
  auto o = node_options(na);
  if (!o) return fail(o.error(), 2);
  o->key_file.clear();
  messages::SubmitJob sj;
  if (Status st = job_flags(a.parallel, a.token_budget, a.chat_template, a.model_dir, sj); !st)
    return fail(st.error(), 2);
  if (!a.quiet) std::cerr << "shardline run: " << describe_workers(*o) << "\n";
  auto node = actors::Node::start(std::move(o).value());
  // A bad flag value for this model or machine (a tp that does not divide
  // its heads) is a usage error; a missing or broken model folder is not.
  if (!node) return fail(node.error(), node.error().code == ErrorCode::invalid_argument ? 2 : 1);
  // (on stderr: stdout stays for what a script reads; tests read the port here)
  if ((*node)->metrics_port() > 0) std::cerr << "metrics on port " << (*node)->metrics_port() << std::endl;
  int rc = follow_run_job(a, **node, sj, na.data_dir, *bar);
  if (!a.metrics_file.empty()) {
    // The final counters, once every actor has stopped: a batch run exits
    // before a scraper's next visit.
    (*node)->stop();
    std::ofstream out(a.metrics_file, std::ios::trunc);
    out << (*node)->metrics().render();
    out.close();
    if (!out) {
      std::cerr << "error: --metrics-file " << a.metrics_file << ": cannot write it\n";
      if (rc == 0) rc = 1;
    }
  }
  return rc;
}

}  // namespace

void add_cluster_commands(CLI::App& app, std::function<int()>& run) {
  // cluster init
  CLI::App* cluster = app.add_subcommand("cluster", "Cluster set-up");
  cluster->require_subcommand(1);
  auto key_file = std::make_shared<std::string>(default_key_file());
  CLI::App* init = cluster->add_subcommand("init", "Write a new cluster key file");
  init->add_option("--key-file", *key_file, "Where to write the key")->capture_default_str();
  init->callback([&run, key_file] { run = [key_file] { return run_cluster_init(*key_file); }; });

  // node start
  CLI::App* node = app.add_subcommand("node", "Run a node");
  node->require_subcommand(1);
  auto na = std::make_shared<NodeArgs>();
  CLI::App* start = node->add_subcommand("start", "Start a node and serve until SIGINT/SIGTERM");
  start->add_option("--name", na->name, "Node name (prefixes its actors' names)")->capture_default_str();
  start->add_option("--listen", na->listen, "HOST:PORT for clients and nodes (loopback by default)")
      ->capture_default_str();
  start->add_option("--join", na->join, "HOST:PORT of the node running the orchestrator (this node adds workers)");
  add_placement_flags(*start, na->devices, na->parallel);
  start->add_option("--data-dir", na->data_dir, "Durable job state (RocksDB)")->capture_default_str();
  start->add_option("--model", na->model_dir, "Model folder the workers load")->required();
  start->add_option("--key-file", na->key_file, "Cluster key")->capture_default_str();
  start->add_option("--metrics", na->metrics, "HOST:PORT of a Prometheus /metrics endpoint");
  start->add_option("--http", na->http,
                    "HOST:PORT of the OpenAI Files and Batches API (docs/http.md); without --api-key-file only a "
                    "loopback address");
  start->add_option("--api-key-file", na->api_key_file,
                    "API keys, one per line: every HTTP request needs Authorization: Bearer KEY");
  start->add_option("--max-upload-mib", na->max_upload_mib, "Largest file the HTTP API accepts, in MiB")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  start->add_option("--max-batch", na->max_batch, "Running sequences per worker")->capture_default_str();
  add_tcp_group_flags(*start, na->group_master, na->group_key_file, na->group_timeout_ms);
  add_failure_flags(*start, na->failure);
  add_kv_flags(*start, na->kv);
  add_engine_flags(*start, na->engine);
  add_shift_flags(*start, na->engine);
  add_seesaw_flags(*start, na->engine);
  add_sidp_flags(*start, na->sidp);
  start->callback([&run, na] { run = [na] { return run_node_start(*na); }; });

  // job submit / status
  CLI::App* job = app.add_subcommand("job", "Submit, follow and cancel jobs");
  job->require_subcommand(1);
  auto sa = std::make_shared<SubmitArgs>();
  CLI::App* submit = job->add_subcommand("submit", "Submit a job; prints its id");
  add_client_flags(*submit, sa->client);
  submit->add_option("--model", sa->model_dir, "Model folder (must be the one the cluster serves)")->required();
  submit->add_option("--input", sa->inputs, "JSONL shard (repeatable; read in order)")->required();
  submit->add_option("--output", sa->output, "Output JSONL")->required();
  submit->add_option("--parallel", sa->parallel,
                     "tp=..,pp=..,sp=..,dp=..: the config the job must run on; refused when the cluster's "
                     "workers run another (default: whatever they run). auto: the planner's choice for the job's "
                     "lines on the cluster's devices (docs/simulator.md)");
  submit->add_option("--token-budget", sa->token_budget,
                     std::string("Per-micro-batch token budget policy of the job: ") +
                         engine::token_budget_policy_names())
      ->capture_default_str();
  submit->add_option("--weight-sharing", sa->weight_sharing,
                     "none or sidp: what the job expects the cluster to run (refused if it runs the other; "
                     "default: whatever it runs)")
      ->check(CLI::IsMember({"none", "sidp"}));
  submit->add_option("--chat-template", sa->chat_template,
                     "Jinja chat template FILE for the job's /v1/chat/completions lines (default: the model "
                     "folder's chat_template.jinja or tokenizer_config.json chat_template)");
  submit->add_flag("--overwrite", sa->overwrite, "Replace the output file if it exists (else the submit is refused)");
  submit->callback([&run, sa] { run = [sa] { return run_job_submit(*sa); }; });
  auto st = std::make_shared<StatusArgs>();
  CLI::App* status = job->add_subcommand("status", "Progress of one job or all jobs, and per-worker state");
  add_client_flags(*status, st->client);
  status->add_option("job", st->job_id, "Job id (default: all jobs)");
  status->add_flag("--watch", st->watch, "Refresh every second until the jobs finish");
  status->add_flag("--json", st->json, "JSON output");
  status->callback([&run, st] { run = [st] { return run_job_status(*st); }; });
  auto cancel_client = std::make_shared<ClientArgs>();
  auto cancel_id = std::make_shared<std::uint64_t>(0);
  CLI::App* cancel = job->add_subcommand(
      "cancel", "Cancel an unfinished job: its output file keeps the lines finished so far, in input order");
  add_client_flags(*cancel, *cancel_client);
  cancel->add_option("job", *cancel_id, "Job id")->required();
  cancel->callback([&run, cancel_client, cancel_id] {
    run = [cancel_client, cancel_id] { return run_job_cancel(*cancel_client, *cancel_id); };
  });

  // actor list / kill
  CLI::App* actor = app.add_subcommand("actor", "List or kill actors");
  actor->require_subcommand(1);
  auto ca = std::make_shared<ClientArgs>();
  CLI::App* list = actor->add_subcommand("list", "List the actors of the cluster");
  add_client_flags(*list, *ca);
  list->callback([&run, ca] { run = [ca] { return run_actor_list(*ca); }; });
  auto ka = std::make_shared<ClientArgs>();
  auto kill_name = std::make_shared<std::string>();
  CLI::App* kill = actor->add_subcommand("kill", "Kill an actor the way a crash would");
  add_client_flags(*kill, *ka);
  kill->add_option("name", *kill_name, "Actor name (see `actor list`)")->required();
  kill->callback([&run, ka, kill_name] { run = [ka, kill_name] { return run_actor_kill(*ka, *kill_name); }; });

  // run
  auto ra = std::make_shared<RunArgs>();
  CLI::App* r = app.add_subcommand("run", "Run one offline job in this process (a node, the job, a progress bar)");
  r->add_option("--model", ra->model_dir, "Model folder")->required();
  r->add_option("--input", ra->inputs, "JSONL shard (repeatable)")->required();
  r->add_option("--output", ra->output, "Output JSONL")->required();
  add_placement_flags(*r, ra->devices, ra->parallel);
  r->add_option("--token-budget", ra->token_budget,
                std::string("Per-micro-batch token budget policy: ") + engine::token_budget_policy_names())
      ->capture_default_str();
  r->add_option("--chat-template", ra->chat_template,
                "Jinja chat template FILE for /v1/chat/completions lines (default: the model folder's)");
  r->add_option("--data-dir", ra->data_dir, "Durable state (default: OUTPUT.shardline); rerun to resume");
  r->add_option("--metrics", ra->metrics, "HOST:PORT of a Prometheus /metrics endpoint");
  r->add_option("--metrics-file", ra->metrics_file,
                "FILE: at exit, the run's final metrics in Prometheus text (the counters a scrape of --metrics would "
                "miss once the run ends)");
  r->add_option("--max-batch", ra->max_batch, "Running sequences per worker")->capture_default_str();
  r->add_flag("--quiet", ra->quiet, "No progress bar, and only errors logged");
  r->add_flag("--overwrite", ra->overwrite,
              "Replace the output file if it exists (else refused; a rerun of the same command continues its job, "
              "or with --overwrite runs a finished one again)");
  add_tcp_group_flags(*r, ra->group_master, ra->group_key_file, ra->group_timeout_ms);
  add_failure_flags(*r, ra->failure);
  add_kv_flags(*r, ra->kv);
  add_engine_flags(*r, ra->engine);
  add_shift_flags(*r, ra->engine);
  add_seesaw_flags(*r, ra->engine);
  add_sidp_flags(*r, ra->sidp);
  r->callback([&run, ra] { run = [ra] { return run_run(*ra); }; });
}

}  // namespace shardline::cli
