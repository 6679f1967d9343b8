// WorkerRuntime: what a worker does between messages, without actors, over
// stories260K and a KV store played by the test (worker/kv_store_client.hpp).
// A runtime that dies mid-job and one that resumes its lines from the
// progress it reported give results byte-identical to an undisturbed run;
// fetch failures fall back to the tokens alone; cancellation, held lines,
// the step hook, SiDP directives and the counters' growth.

#include "worker/worker_runtime.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/support/kv_host_tier.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::worker {
namespace worker_worker_runtime_test {

using testing_support::kStoriesDir;

WorkerRuntimeOptions options(const std::string& name) {
  WorkerRuntimeOptions o;
  o.name = name;
  o.engine.model_dir = kStoriesDir;
  o.engine.block_size = 16;
  o.engine.kv_cache_bytes = 2u << 20;
  o.engine.max_num_seqs = 32;
  o.engine.max_num_batched_tokens = 256;
  o.engine.num_threads = 1;
  o.resume_retry_interval = std::chrono::milliseconds(1);
  return o;
}

std::unique_ptr<WorkerRuntime> make_runtime(WorkerRuntimeOptions o) {
  auto rt = WorkerRuntime::create(std::move(o));
  EXPECT_TRUE(rt.ok()) << (rt.ok() ? "" : rt.error().to_string());
  return rt.ok() ? std::move(rt).value() : nullptr;
}

/// Lines of job `job`, seeded and sampled, two choices each.
std::vector<BatchRequest> lines(std::uint64_t job) {
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily wanted to", "One day"};
  std::vector<BatchRequest> out;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    BatchRequest r;
    r.job_id = job;
    r.line_index = i;
    r.custom_id = "line" + std::to_string(i);
    r.prompt = prompts[i];
    r.params.temperature = 0.8f;
    r.params.max_tokens = 40;
    r.params.seed = 900 + i;
    r.params.has_seed = true;
    r.return_token_ids = true;
    r.n = 2;
    out.push_back(std::move(r));
  }
  return out;
}

using Key = std::pair<std::uint64_t, std::uint64_t>;

/// Steps until idle; results by (job, line).
std::map<Key, BatchResult> run_all(WorkerRuntime& rt) {
  std::map<Key, BatchResult> out;
  for (int i = 0; i < 10000 && rt.has_work(); ++i) {
    auto step = rt.step();
    EXPECT_TRUE(step.ok()) << (step.ok() ? "" : step.error().to_string());
    if (!step.ok()) break;
    EXPECT_TRUE(step->stepped);
    for (BatchResult& r : step->results) {
      const Key k{r.job_id, r.line_index};
      EXPECT_EQ(out.count(k), 0u) << "a second result for line " << r.line_index;
      out[k] = std::move(r);
    }
  }
  return out;
}

void expect_same(const std::map<Key, BatchResult>& got, const std::map<Key, BatchResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [k, w] : want) {
    ASSERT_EQ(got.count(k), 1u) << "line " << k.second;
    const BatchResult& g = got.at(k);
    ASSERT_TRUE(g.ok) << g.error_message;
    ASSERT_EQ(g.choices.size(), w.choices.size());
    for (std::size_t c = 0; c < w.choices.size(); ++c) {
      EXPECT_EQ(g.choices[c].token_ids, w.choices[c].token_ids) << "line " << k.second << " choice " << c;
      EXPECT_EQ(g.choices[c].text, w.choices[c].text);
    }
  }
}

/// The node's KV store, played in memory: flushes merge into one host
/// tier per request and are acknowledged up to its contiguous prefix;
/// fetches cut that prefix back out. The first `failing_fetches` fetches
/// (all when negative) fail with io, as a restarting store's do.
class TestStore final : public AckedKvTarget, public ResumeKvSource {
 public:
  explicit TestStore(kvstore::KvModelShape shape) : shape_(shape) {}

  Status flush(const kvstore::KvChunkKey& key, std::span<const std::byte> chunk) override {
    const kvstore::KvChunkRef ref{key, 0, chunk.size()};
    return flush_batch(std::span<const kvstore::KvChunkRef>(&ref, 1), chunk);
  }
  Result<std::vector<std::byte>> fetch(const kvstore::KvChunkKey&) override {
    return make_error(ErrorCode::unsupported, "fetch a prefix");
  }
  Status flush_batch(std::span<const kvstore::KvChunkRef> chunks, std::span<const std::byte> buffer) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<Key> touched;
    for (const kvstore::KvChunkRef& c : chunks) {
      auto& tier = tiers_[{c.key.job_id, c.key.request_id}];
      if (!tier) tier = std::make_unique<testing_support::HostTier>(shape_);
      tier->merge(c.key.range, buffer.subspan(c.offset, c.bytes));
      touched.insert({c.key.job_id, c.key.request_id});
    }
    for (const Key& k : touched) acks_.push_back(KvStoreAck{k.first, k.second, tiers_[k]->covered});
    return Status::ok_status();
  }
  std::vector<KvStoreAck> take_acks() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<KvStoreAck> out;
    out.swap(acks_);
    return out;
  }
  Result<KvPrefix> fetch_prefix(std::uint64_t job_id, std::uint64_t request_id, int max_tokens) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++fetches;
    if (failing_fetches < 0 || fetches <= failing_fetches) return make_error(ErrorCode::io, "the store restarts");
    if (holds_nothing) return KvPrefix{0, {}, "test"};
    const auto it = tiers_.find({job_id, request_id});
    if (it == tiers_.end()) return make_error(ErrorCode::not_found, "no such request");
    const int n = std::min(max_tokens, it->second->covered);
    return KvPrefix{n, it->second->prefix(n), "test"};
  }
  void drop_job(std::uint64_t job_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    dropped.push_back(job_id);
  }

  int failing_fetches = 0;
  bool holds_nothing = false;  ///< fetches succeed with 0 positions (the KV was lost)
  int fetches = 0;
  std::vector<std::uint64_t> dropped;

 private:
  kvstore::KvModelShape shape_;
  std::mutex mu_;
  std::map<Key, std::unique_ptr<testing_support::HostTier>> tiers_;
  std::vector<KvStoreAck> acks_;
};

/// The latest progress reported per (job, line, choice).
struct ProgressLog {
  std::mutex mu;
  std::map<std::tuple<std::uint64_t, std::uint64_t, int>, KvProgress> latest;
  WorkerRuntime::KvProgressCallback callback() {
    return [this](std::vector<KvProgress> progress) {
      std::lock_guard<std::mutex> lock(mu);
      for (KvProgress& p : progress) latest[{p.job_id, p.line_index, p.choice}] = std::move(p);
    };
  }
};

TEST(WorkerRuntime, ALineResumedFromTheProgressItsDeadRuntimeReportedIsByteIdentical) {
  std::map<Key, BatchResult> want;
  {
    auto ref = make_runtime(options("ref"));
    ASSERT_NE(ref, nullptr);
    for (BatchRequest& l : lines(3)) EXPECT_FALSE(ref->accept(std::move(l)).has_value());
    want = run_all(*ref);
  }
  ASSERT_EQ(want.size(), 4u);

  auto doomed = make_runtime(options("doomed"));
  ASSERT_NE(doomed, nullptr);
  auto store = std::make_shared<TestStore>(doomed->batch_worker().engine().kv_io().shape());
  ProgressLog progress;
  ASSERT_TRUE(doomed->connect_kv_store(store, store, progress.callback()));
  for (BatchRequest& l : lines(3)) doomed->accept(std::move(l));
  EXPECT_EQ(doomed->held().size(), 4u);
  for (int i = 0; i < 12; ++i) {
    auto step = doomed->step();
    ASSERT_TRUE(step.ok());
    ASSERT_TRUE(step->results.empty()) << "nothing finishes this early";
    ASSERT_EQ(step->next_step, std::chrono::milliseconds(0)) << "work is left: step again at once";
  }
  ASSERT_TRUE(doomed->drain_kv(std::chrono::seconds(10)));
  EXPECT_GT(doomed->take_kv_counter_growth().streamed_bytes, 0u);
  doomed.reset();  // the worker dies; the store and the reported progress stay

  // The orchestrator's resume of each line: the latest progress per choice.
  auto resumed = make_runtime(options("resumed"));
  ASSERT_NE(resumed, nullptr);
  store->failing_fetches = 3;  // the store is restarting: the first fetches fail
  ASSERT_TRUE(resumed->connect_kv_store(store, store, progress.callback()));
  std::uint64_t replicated = 0;
  for (BatchRequest& l : lines(3)) {
    l.resume.resize(2);
    for (int c = 0; c < 2; ++c) {
      std::lock_guard<std::mutex> lock(progress.mu);
      const auto it = progress.latest.find({l.job_id, l.line_index, c});
      ASSERT_NE(it, progress.latest.end()) << "line " << l.line_index << " choice " << c << " reported nothing";
      ASSERT_GT(it->second.replicated_tokens, 0);
      l.resume[static_cast<std::size_t>(c)] = ChoiceResume{it->second.output_ids, it->second.replicated_tokens, {}};
      replicated += static_cast<std::uint64_t>(it->second.replicated_tokens);
    }
    const std::optional<ResumeFetchReport> report = resumed->accept(std::move(l));
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->num_fallbacks, 0);
  }
  EXPECT_EQ(store->fetches, 3 + 8) << "three failures asked again, then one fetch per choice";
  expect_same(run_all(*resumed), want);
  EXPECT_EQ(resumed->status().kv_restored_tokens, replicated);
  EXPECT_TRUE(resumed->held().empty());
  const KvCounterGrowth grew = resumed->take_kv_counter_growth();
  EXPECT_EQ(grew.restored_tokens, replicated);
  EXPECT_EQ(grew.resume_fallbacks, 0u);
  EXPECT_EQ(resumed->take_kv_counter_growth().restored_tokens, 0u) << "growth is counted once";
}

/// A fetch that keeps failing (the store is away), or that succeeds with
/// none of the promised positions (the store lost them): each choice is a
/// fallback and recomputes, with the same result.
class ResumeFallback : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(Store, ResumeFallback, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "HoldsNothing" : "Away"; });

TEST_P(ResumeFallback, EachChoiceResumesFromItsTokensAloneWithTheSameResult) {
  auto ref = make_runtime(options("ref"));
  ASSERT_NE(ref, nullptr);
  for (BatchRequest& l : lines(5)) ref->accept(std::move(l));
  const auto want = run_all(*ref);

  WorkerRuntimeOptions o = options("resumed");
  o.resume_fetch_window = std::chrono::milliseconds(20);
  auto resumed = make_runtime(o);
  ASSERT_NE(resumed, nullptr);
  auto store = std::make_shared<TestStore>(resumed->batch_worker().engine().kv_io().shape());
  if (GetParam())
    store->holds_nothing = true;
  else
    store->failing_fetches = -1;
  ASSERT_TRUE(resumed->connect_kv_store(store, store, {}));
  for (BatchRequest& l : lines(5)) {
    const auto& w = want.at({5, l.line_index});
    l.resume.resize(2);
    for (int c = 0; c < 2; ++c) {
      // Three generated tokens known, their KV "replicated" but lost.
      const auto& ids = w.choices[static_cast<std::size_t>(c)].token_ids;
      ASSERT_GE(ids.size(), 3u);
      l.resume[static_cast<std::size_t>(c)] = ChoiceResume{{ids.begin(), ids.begin() + 3}, 4, {}};
    }
    const auto report = resumed->accept(std::move(l));
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->num_fallbacks, 2) << "both choices recompute";
  }
  if (GetParam())
    EXPECT_EQ(store->fetches, 8) << "one fetch per choice: an answer is not asked again";
  else
    EXPECT_GT(store->fetches, 8) << "each choice's fetch was asked again within the window";
  expect_same(run_all(*resumed), want);
  EXPECT_EQ(resumed->status().kv_restored_tokens, 0u);
}

TEST(WorkerRuntime, CancellingAJobDropsItsLinesAndItsStoredKvAndNothingElse) {
  auto rt = make_runtime(options("w"));
  ASSERT_NE(rt, nullptr);
  auto store = std::make_shared<TestStore>(rt->batch_worker().engine().kv_io().shape());
  ASSERT_TRUE(rt->connect_kv_store(store, store, {}));
  for (BatchRequest& l : lines(1)) rt->accept(std::move(l));
  for (BatchRequest& l : lines(2)) rt->accept(std::move(l));
  EXPECT_EQ(rt->held().size(), 8u);
  ASSERT_TRUE(rt->step().ok());
  rt->cancel_job(1);
  EXPECT_EQ(store->dropped, std::vector<std::uint64_t>{1});
  ASSERT_EQ(rt->held().size(), 4u);
  for (const LineRef& l : rt->held()) EXPECT_EQ(l.job_id, 2u);
  const auto got = run_all(*rt);
  EXPECT_EQ(got.size(), 4u);
  for (const auto& [k, r] : got) EXPECT_EQ(k.first, 2u) << "a result of the cancelled job";
  EXPECT_TRUE(rt->held().empty());
}

TEST(WorkerRuntime, TheStepHookSeesEachEngineStepAndAnIdleRuntimeWaitsForMessages) {
  WorkerRuntimeOptions o = options("w");
  std::vector<std::uint64_t> seen;
  o.before_step = [&seen](std::uint64_t step) { seen.push_back(step); };
  auto rt = make_runtime(o);
  ASSERT_NE(rt, nullptr);
  ASSERT_TRUE(rt->join_sidp().ok()) << "no SiDP: nothing to join";
  auto idle = rt->step();
  ASSERT_TRUE(idle.ok());
  EXPECT_FALSE(idle->stepped);
  EXPECT_FALSE(idle->next_step.has_value()) << "no work and no SiDP: wait for a message";
  for (BatchRequest& l : lines(7)) rt->accept(std::move(l));
  const auto got = run_all(*rt);
  EXPECT_EQ(got.size(), 4u);
  ASSERT_FALSE(seen.empty());
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i + 1);
  EXPECT_EQ(rt->status().steps_done, seen.size());
  EXPECT_GT(rt->take_kv_counter_growth().computed_tokens, 0u);
  EXPECT_EQ(rt->take_kv_counter_growth().computed_tokens, 0u);
}

TEST(WorkerRuntime, ADirectiveForAGroupItIsNotInIsRefusedAndItKeepsWorking) {
  auto rt = make_runtime(options("w"));
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->sidp_mode_name(), nullptr);
  const Status s = rt->directive("node0/sidp", "cas", 1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(s.error().message, "worker w is not in SiDP group 'node0/sidp'");
  for (BatchRequest& l : lines(8)) rt->accept(std::move(l));
  EXPECT_EQ(run_all(*rt).size(), 4u);
}

TEST(WorkerRuntime, ABadModelFolderFailsCreateWithItsCause) {
  WorkerRuntimeOptions o = options("w");
  o.engine.model_dir = "/no/such/model";
  auto rt = WorkerRuntime::create(o);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.error().message.find("/no/such/model"), std::string::npos) << rt.error().message;
}

}  // namespace worker_worker_runtime_test
}  // namespace shardline::worker
