// The chaos fault test of replicated KV state (issue 11, DéjàVu §4.2.3): a
// two-node cluster over loopback (node a runs the orchestrator, node b joins
// it), one job of 1600 requests with 384 generated tokens each (ignore_eos),
// and at least 100 kills at random moments while it runs: workers most
// (`actor kill a/cpu:0`, `b/cpu:0`), the KV stores (`a/kvstore`,
// `b/kvstore`), the orchestrator (`actor kill orchestrator`), and `kill -9`
// of whole node processes, each node at least once, each restarted at once
// with the same flags (node a on the same port, which b reconnects to).
//
// Pass: every custom_id exactly once, the output byte-identical to a run
// without failures, KV really restored from the stores
// (shardline_recovered_tokens_total > 0), and positions recomputed after
// failures within one decode step per in-flight request per failure:
//
//   Σ shardline_recomputed_tokens_total{cause="failure"}
//       <= worker failures × max_batch × 1 token
//
// where a worker failure is a kill that hit a worker: an `actor kill` of
// one, or a `kill -9` of the node it runs on (KV-store and orchestrator
// kills leave the workers running). Metrics start at zero in each node
// process, so each node is scraped just before its `kill -9` and at the
// end, and the incarnations are summed.
//
// The seed of the kill schedule is printed; SHARDLINE_CHAOS_SEED=N replays
// the same schedule (the moments still depend on timing). The longer soak
// variant (1000 requests, 400 kills, 12 node kills) is DISABLED_ so that CI
// skips it; run it with
//   build/tests/actors_fault_tests --gtest_also_run_disabled_tests
//       --gtest_filter='*Soak*'
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/actors/node_harness.hpp"
#include "tests/support/demo_prompts.hpp"
#include "tests/support/output_ids.hpp"
#include "tests/support/process.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline {
namespace actors_kv_chaos_fault_test {

using testing_support::Child;
using testing_support::kShardline;
using testing_support::read_file;
using testing_support::run_command;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// --max-batch of both nodes: a worker runs at most this many requests in
/// one engine step (small, so the job lasts long enough for 100 kills).
constexpr int kMaxBatch = 4;
/// Tokens one decode step computes per running request.
constexpr int kTokensPerDecodeStep = 1;
constexpr int kHeartbeatMs = 200;
constexpr int kFailureTimeoutMs = 1500;

/// What one chaos run does.
struct ChaosPlan {
  // At least this many lines: long enough that 104 kills (~0.7 s each
  // under load: restarts bound the kill rate, not the job's speed) land
  // before the job ends, with margin: with the AVX2 kernels 800 lines ended
  // after 89 kills in a CI-like run. On a faster machine the job is made
  // longer (run_chaos, kill_seconds). Tokens are capped by stories260K's
  // 512 positions.
  int lines = 1600;
  int max_tokens = 384;
  int kills = 104;     ///< successful kills in all, node kill -9s included
  int node_kills = 4;  ///< kill -9s of node processes, alternating a, b, a, b, ...
  int job_timeout_s = 480;
  /// What a kill costs in wall time, restart included, whatever the
  /// machine (0.42 s measured on an AVX-512 machine with nothing else
  /// running, ~0.7 s under CI's load): the fault-free run must take at
  /// least kills x this / 0.8 (kills land over 80% of the lines), or the
  /// job gets more lines.
  double kill_seconds = 0.6;
  int max_lines = 6000;
};

/// The recovery counters of one node process (all its workers / stores).
struct Recovery {
  double recovered = 0;        ///< shardline_recovered_tokens_total
  double recomputed = 0;       ///< shardline_recomputed_tokens_total{cause="failure"}
  double fallbacks = 0;        ///< shardline_kv_resume_fallbacks_total
  double replicated = 0;       ///< shardline_kv_replicated_tokens_total
  double worker_failures = 0;  ///< shardline_worker_failures_total
  Recovery& operator+=(const Recovery& o) {
    recovered += o.recovered;
    recomputed += o.recomputed;
    fallbacks += o.fallbacks;
    replicated += o.replicated;
    worker_failures += o.worker_failures;
    return *this;
  }
};

/// Sum of every sample of metric `name` whose label set contains
/// `label_part` ("" = all) in a Prometheus text body.
double sum_samples(const std::string& body, const std::string& name, const std::string& label_part = "") {
  std::istringstream in(body);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    const auto space = line.rfind(' ');
    if (!label_part.empty() && line.substr(0, space).find(label_part) == std::string::npos) continue;
    sum += std::stod(line.substr(space + 1));
  }
  return sum;
}

/// A node's recovery counters from its /metrics; nullopt when unreachable.
std::optional<Recovery> scrape(int metrics_port) {
  httplib::Client c("127.0.0.1", metrics_port);
  c.set_connection_timeout(2);
  c.set_read_timeout(5);
  auto res = c.Get("/metrics");
  if (!res || res->status != 200) return std::nullopt;
  Recovery r;
  r.recovered = sum_samples(res->body, "shardline_recovered_tokens_total");
  r.recomputed = sum_samples(res->body, "shardline_recomputed_tokens_total", "cause=\"failure\"");
  r.fallbacks = sum_samples(res->body, "shardline_kv_resume_fallbacks_total");
  r.replicated = sum_samples(res->body, "shardline_kv_replicated_tokens_total");
  r.worker_failures = sum_samples(res->body, "shardline_worker_failures_total");
  return r;
}

/// The wall clock as the node logs stamp it ("HH:MM:SS.mmm"), to match a
/// kill with the nodes' log lines.
std::string wall_clock() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const long long ms = std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03lld", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

/// The last `n` characters of `s`.
std::string tail(const std::string& s, std::size_t n = 6000) { return s.size() <= n ? s : s.substr(s.size() - n); }

/// The first line where `got` and `want` differ, for the failure message.
std::string first_difference(const std::string& got, const std::string& want) {
  std::istringstream g(got), w(want);
  std::string gl, wl;
  for (int i = 1;; ++i) {
    const bool more_g = static_cast<bool>(std::getline(g, gl));
    const bool more_w = static_cast<bool>(std::getline(w, wl));
    if (!more_g && !more_w)
      return "no line differs (sizes " + std::to_string(got.size()) + " vs " + std::to_string(want.size()) + ")";
    if (gl != wl || more_g != more_w)
      return "line " + std::to_string(i) + ":\n  got:  " + (more_g ? gl : "<none>") +
             "\n  want: " + (more_w ? wl : "<none>");
  }
}

class KvChaosFault : public testing_support::ClusterJobTest {
 protected:
  /// One node of the cluster, over its process incarnations.
  struct Node {
    explicit Node(std::string n) : name(std::move(n)) {}
    std::string name;
    int incarnation = 0;
    std::unique_ptr<Child> proc;
    testing_support::NodeAddress addr;
    Recovery banked;  ///< counters of its killed incarnations
    bool scrape_missed = false;
  };

  void TearDown() override {
    for (Node* n : {&b_, &a_})
      if (n->proc) {
        n->proc->kill(SIGTERM);
        n->proc->wait_or_kill(std::chrono::seconds(20));
      }
    if (HasFailure()) {
      // Keep the logs of every incarnation for the post-mortem, and say
      // which kill came when.
      std::cerr << "chaos: test failed; node logs kept in " << dir_ << " (seed " << seed_ << "); kills:\n" << journal_;
      return;
    }
    ClusterJobTest::TearDown();
  }

  void write_chaos_input(int n, int max_tokens) {
    ASSERT_EQ(testing_support::write_demo_prompts(path("in.jsonl"), n,
                                                  [&](int, nlohmann::json& body) {
                                                    body["max_tokens"] = max_tokens;
                                                    body["ignore_eos"] = true;
                                                  }),
              n);
  }

  std::vector<std::string> node_argv(const Node& n) const {
    std::vector<std::string> argv{kShardline, "node", "start", "--name", n.name};
    if (n.name == "a") {
      argv.insert(argv.end(), {"--listen", "127.0.0.1:" + std::to_string(a_port_)});
    } else {
      argv.insert(argv.end(), {"--join", "127.0.0.1:" + std::to_string(a_port_)});
    }
    argv.insert(argv.end(), {"--metrics", "127.0.0.1:0", "--data-dir", path(n.name + ".data"), "--model",
                             testing_support::kStoriesDir, "--key-file", path("cluster.key"), "--max-batch",
                             std::to_string(kMaxBatch), "--threads", "1", "--heartbeat-ms",
                             std::to_string(kHeartbeatMs), "--failure-timeout-ms", std::to_string(kFailureTimeoutMs)});
    return argv;
  }

  /// Starts the next incarnation of `n` (node a on a_port_, 0 the first
  /// time); retries a few times when the process exits at once (its port
  /// still held). False when it never came up.
  bool start(Node& n) {
    for (int attempt = 0; attempt < 10; ++attempt) {
      const std::string log =
          path(n.name + "." + std::to_string(n.incarnation) + "." + std::to_string(attempt) + ".log");
      n.proc = std::make_unique<Child>(node_argv(n), log);
      n.addr = testing_support::wait_for_node(*n.proc, true);
      if (!n.proc->exited() && n.addr.metrics_port > 0) {
        if (n.name == "a") {
          const std::string want = "127.0.0.1:" + std::to_string(a_port_);
          if (a_port_ == 0) {
            a_port_ = std::stoi(n.addr.addr.substr(n.addr.addr.rfind(':') + 1));
          } else if (n.addr.addr != want) {
            ADD_FAILURE() << "node a came back on " << n.addr.addr << ", not " << want;
            return false;
          }
        }
        return true;
      }
      std::cerr << "chaos: node " << n.name << " did not start (attempt " << attempt
                << "): " << tail(n.proc->log(), 2000) << "\n";
      n.proc->kill(SIGKILL);
      n.proc->wait();
      std::this_thread::sleep_for(milliseconds(300));
    }
    return false;
  }

  /// Scrapes `n`'s counters (metrics reset with the process), kill -9s it
  /// and starts it again with the same flags. Counters the node adds
  /// between the scrape and the signal (a millisecond) are not seen.
  bool kill9_and_restart(Node& n) {
    if (const auto r = scrape(n.addr.metrics_port)) {
      n.banked += *r;
    } else {
      n.scrape_missed = true;
    }
    n.proc->kill(SIGKILL);
    EXPECT_EQ(n.proc->wait(), 128 + SIGKILL);
    ++n.incarnation;
    return start(n);
  }

  std::string client() const {
    return testing_support::client_flags("127.0.0.1:" + std::to_string(a_port_), path("cluster.key"));
  }

  /// Lines done of job 1, or -1 when no orchestrator answered.
  int done() const { return testing_support::job_done(client(), 1); }

  std::string logs() const {
    std::string out;
    for (const Node* n : {&a_, &b_})
      if (n->proc)
        out += "\n---- node " + n->name + " (incarnation " + std::to_string(n->incarnation) + ") ----\n" +
               tail(n->proc->log());
    return out;
  }

  void run_chaos(const ChaosPlan& asked);

  Node a_{"a"};
  Node b_{"b"};
  int a_port_ = 0;
  std::uint32_t seed_ = 0;
  std::string journal_;  ///< "time kill-number target lines-done" per kill
};

void KvChaosFault::run_chaos(const ChaosPlan& asked) {
  ChaosPlan plan = asked;
  ASSERT_GE(plan.node_kills, 2) << "each node must be killed at least once";
  seed_ = 20261124u;
  if (const char* s = std::getenv("SHARDLINE_CHAOS_SEED")) seed_ = static_cast<std::uint32_t>(std::stoul(s));
  std::cout << "chaos: seed " << seed_ << " (SHARDLINE_CHAOS_SEED replays the kill schedule)" << std::endl;
  RecordProperty("seed", std::to_string(seed_));
  std::mt19937 rng(seed_);

  auto t0 = Clock::now();
  write_chaos_input(plan.lines, plan.max_tokens);
  // Batch-invariant kernels: the batch size does not change the bytes, so the
  // reference runs with a larger one (faster).
  std::string expected = clean_output(32);
  auto t_clean = Clock::now();
  double clean_s = std::chrono::duration<double>(t_clean - t0).count();
  std::cout << "chaos: fault-free run of " << plan.lines << " lines " << clean_s << " s" << std::endl;
  // Kills are paced by restarts, the job by the machine: on a fast one the
  // job would end before the kills landed. Then it gets more lines, as many
  // as its speed says it needs, and a new fault-free run.
  const double need_s = plan.kills * plan.kill_seconds / 0.8;
  if (clean_s < need_s && plan.lines < plan.max_lines) {
    plan.lines = std::min(plan.max_lines, static_cast<int>(std::ceil(plan.lines * need_s / clean_s)));
    std::filesystem::remove(path("clean.jsonl"));
    std::filesystem::remove_all(path("clean.jsonl.shardline"));  // its data dir: a new job
    t0 = Clock::now();
    write_chaos_input(plan.lines, plan.max_tokens);
    expected = clean_output(32);
    t_clean = Clock::now();
    clean_s = std::chrono::duration<double>(t_clean - t0).count();
    std::cout << "chaos: too fast for " << plan.kills << " kills; fault-free run of " << plan.lines << " lines "
              << clean_s << " s" << std::endl;
  }
  testing_support::expect_each_custom_id_once(expected, static_cast<std::size_t>(plan.lines));
  // The job under kills takes the fault-free time plus the restarts'; on a
  // slow machine 480 s is not enough (a watchdog against a hang, not a
  // speed check): at least three fault-free runs.
  plan.job_timeout_s = std::max(plan.job_timeout_s, static_cast<int>(std::ceil(3 * clean_s)));

  ASSERT_TRUE(start(a_)) << logs();
  ASSERT_TRUE(start(b_)) << logs();
  // Both workers registered before the job starts.
  for (int i = 0; i < 300; ++i) {
    const std::string list = run_command(kShardline + " actor list" + client()).out;
    if (list.find("a/cpu:0") != std::string::npos && list.find("b/cpu:0") != std::string::npos &&
        list.find("b/kvstore") != std::string::npos)
      break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  submit(client());
  if (HasFatalFailure()) return;

  // The schedule: node kill -9s at evenly spread kill numbers, alternating
  // a and b; the other kills drawn at random, workers most.
  std::map<int, Node*> node_kill_at;
  for (int i = 0; i < plan.node_kills; ++i)
    node_kill_at[(i + 1) * plan.kills / (plan.node_kills + 1)] = i % 2 == 0 ? &a_ : &b_;
  const std::vector<std::pair<std::string, int>> actor_targets{
      {"a/cpu:0", 40}, {"b/cpu:0", 40}, {"a/kvstore", 7}, {"b/kvstore", 7}, {"orchestrator", 6}};
  std::vector<int> weights;
  for (const auto& t : actor_targets) weights.push_back(t.second);
  std::discrete_distribution<std::size_t> pick(weights.begin(), weights.end());
  std::uniform_int_distribution<int> pause_ms(5, 80);

  std::map<std::string, int> kills_of;  // target -> successful kills
  int worker_failures = 0, failed_attempts = 0, kills = 0, done_at_last_kill = 0, round = 0, d = -1;
  std::map<std::string, Clock::time_point> busy_until;  // target ("*": all) -> not back before
  const auto deadline = Clock::now() + std::chrono::seconds(plan.job_timeout_s);
  while (kills < plan.kills && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(pause_ms(rng)));
    // Spread the kills over the job: kill k waits until k/kills of 80% of
    // the lines are done (and the job is not).
    // (`job status` costs a process start, so it is asked every 4th round,
    // or while the gate holds.)
    const int gate = static_cast<int>(static_cast<long long>(kills) * plan.lines * 8 / 10 / plan.kills);
    if (++round % 4 == 0 || d < gate) d = done();
    if (d >= plan.lines) break;
    if (d < gate) continue;
    if (const auto it = node_kill_at.find(kills); it != node_kill_at.end()) {
      Node& n = *it->second;
      const bool back = kill9_and_restart(n);
      ASSERT_TRUE(back) << "node " << n.name << " did not come back after kill -9" << logs();
      for (const auto& t : actor_targets)
        if (n.name == "a" || t.first.rfind(n.name + "/", 0) == 0)
          busy_until[t.first] = Clock::now() + milliseconds(800);
      std::cout << "chaos: kill " << kills << ": kill -9 of node " << n.name << " at " << d << " lines done"
                << std::endl;
      journal_ += wall_clock() + " #" + std::to_string(kills) + " kill -9 " + n.name + " @" + std::to_string(d) + "\n";
      ++kills_of["kill -9 " + n.name];
      ++worker_failures;  // the node's one worker died with it
      done_at_last_kill = d;
      ++kills;
      continue;
    }
    // A target killed or refused a moment ago (the orchestrator restarting,
    // or the target not back yet: not a kill) is likely still down: wait
    // until it should be back rather than ask in vain (asking costs a
    // process start) or draw another (the workers keep their share).
    const std::string& target = actor_targets[pick(rng)].first;
    const auto ready = std::max(busy_until[target], busy_until["*"]);
    if (ready > Clock::now()) std::this_thread::sleep_until(ready);
    const std::string at = wall_clock();
    const auto r = run_command(kShardline + " actor kill " + target + client());
    if (r.exit_code != 0 || r.out.find("killed " + target) == std::string::npos) {
      ++failed_attempts;
      std::string why = r.out.substr(0, r.out.find('\n'));
      journal_ += at + " refused " + target + ": " + why.substr(0, 100) + "\n";
      busy_until[target] = Clock::now() + milliseconds(200);
      continue;
    }
    // Roughly how long the supervisor takes to bring it back.
    busy_until[target == "orchestrator" ? "*" : target] = Clock::now() + milliseconds(300);
    journal_ += at + " #" + std::to_string(kills) + " " + target + " @" + std::to_string(d) + "\n";
    ++kills_of[target];
    if (target.find("/cpu:") != std::string::npos) ++worker_failures;
    done_at_last_kill = d;
    ++kills;
  }
  const double kill_phase_s = std::chrono::duration<double>(Clock::now() - t_clean).count();
  std::string summary;
  for (const auto& [t, n] : kills_of) summary += t + "=" + std::to_string(n) + " ";
  std::cout << "chaos: " << kills << " kills in " << kill_phase_s << " s (" << summary << "), " << failed_attempts
            << " attempts refused; last at " << done_at_last_kill << " lines done" << std::endl;
  RecordProperty("kills", kills);
  RecordProperty("kills_by_target", summary);
  RecordProperty("refused_kill_attempts", failed_attempts);
  EXPECT_GE(kills, plan.kills) << "the job finished (or the time ran out) before every kill landed" << logs();
  EXPECT_LT(done_at_last_kill, plan.lines) << "the last kill did not land mid-job";
  EXPECT_GE(kills_of["kill -9 a"], 1);
  EXPECT_GE(kills_of["kill -9 b"], 1);
  EXPECT_GE(kills_of["kill -9 a"] + kills_of["kill -9 b"], 3);
  const int worker_kills = kills_of["a/cpu:0"] + kills_of["b/cpu:0"];
  EXPECT_GT(worker_kills, kills / 2) << "workers must be killed most";
  EXPECT_GE(kills_of["a/kvstore"] + kills_of["b/kvstore"], 1);
  EXPECT_GE(kills_of["orchestrator"], 1);

  const nlohmann::json status = testing_support::wait_job_done(client(), 1, std::chrono::seconds(plan.job_timeout_s));
  ASSERT_FALSE(status.is_null()) << "no job status" << logs();
  ASSERT_EQ(status["jobs"][0]["state"], "done") << status.dump() << logs();
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();

  const std::string got = read_file(path("out.jsonl"));
  testing_support::expect_each_custom_id_once(got, static_cast<std::size_t>(plan.lines));
  // The fault-free run is another job: its ids differ (issue 46, item 16).
  EXPECT_TRUE(testing_support::same_output(got, expected))
      << "output after the kills differs from the fault-free run at "
      << first_difference(testing_support::normalize_output_ids(got), testing_support::normalize_output_ids(expected));

  // Recovery, summed over every node incarnation.
  Recovery total = a_.banked;
  total += b_.banked;
  for (const Node* n : {&a_, &b_}) {
    const auto r = scrape(n->addr.metrics_port);
    ASSERT_TRUE(r.has_value()) << "node " << n->name << "'s /metrics does not answer" << logs();
    total += *r;
  }
  EXPECT_FALSE(a_.scrape_missed || b_.scrape_missed) << "a node's /metrics did not answer before its kill -9";
  const auto& job = status["jobs"][0];
  const long long bound = static_cast<long long>(worker_failures) * kMaxBatch * kTokensPerDecodeStep;
  std::cout << "chaos: recovered " << total.recovered << " positions from the stores, recomputed " << total.recomputed
            << " after failures (bound: " << worker_failures << " worker failures x " << kMaxBatch << " in flight x "
            << kTokensPerDecodeStep << " token = " << bound << "), " << total.fallbacks << " resume fallbacks, "
            << total.replicated << " positions replicated; job: requeued " << job.value("requeued", -1) << ", resumed "
            << job.value("resumed", -1) << "; clean run " << std::chrono::duration<double>(t_clean - t0).count()
            << " s, total " << total_s << " s" << std::endl;
  RecordProperty("worker_failures", worker_failures);
  RecordProperty("recovered_tokens", std::to_string(total.recovered));
  RecordProperty("recomputed_tokens_failure", std::to_string(total.recomputed));
  RecordProperty("recompute_bound", std::to_string(bound));
  RecordProperty("resume_fallbacks", std::to_string(total.fallbacks));
  RecordProperty("requeued", job.value("requeued", -1));
  RecordProperty("resumed", job.value("resumed", -1));
  RecordProperty("seconds", std::to_string(total_s));
  EXPECT_GT(total.recovered, 0) << "no KV was restored from a store: every resume recomputed";
  EXPECT_LE(total.recomputed, static_cast<double>(bound))
      << "more positions recomputed after failures than one decode step per in-flight request per failure";
  EXPECT_GT(job.value("resumed", 0), 0) << status.dump();
}

TEST_F(KvChaosFault, HundredKillsOfWorkersStoresOrchestratorAndNodesKeepTheOutputByteIdentical) {
  run_chaos(ChaosPlan{});
}

// The soak variant: CI skips it (DISABLED_); run it by hand with
// --gtest_also_run_disabled_tests --gtest_filter='*Soak*'.
TEST_F(KvChaosFault, DISABLED_SoakThousandRequestsFourHundredKills) {
  run_chaos(ChaosPlan{.lines = 1000, .max_tokens = 256, .kills = 400, .node_kills = 12, .job_timeout_s = 1800});
}

}  // namespace
}  // namespace shardline
