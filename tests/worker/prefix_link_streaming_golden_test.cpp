// DéjàVu's token streaming from the end of a cached prefix (issue 42): a
// request whose head hit the prefix cache sends the store a link to the
// head's prefix blocks instead of their KV. Golden against the same job
// streamed without links, over real KvStores and the stories260K model:
// the store holds the same bytes for every request, the bytes not sent are
// exactly the linked positions', and lines resumed from the linked store
// on a fresh runtime give byte-identical outputs.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kvstore/kv_store.hpp"
#include "tests/orchestrator/temp_dir.hpp"
#include "tests/support/stories_reference.hpp"
#include "tests/worker/shared_head_job.hpp"
#include "worker/worker_runtime.hpp"

namespace shardline::worker {
namespace worker_prefix_link_streaming_golden_test {

using testing_support::kStoriesDir;

/// The node's KV store without actors: DéjàVu's streaming target (acked by
/// put_many), the resume source and the prefix tier's block store over one
/// KvStore, as the KV-store actor serves them.
class DirectStore final : public AckedKvTarget, public ResumeKvSource, public PrefixBlockStore {
 public:
  explicit DirectStore(kvstore::KvStore* store) : store_(store) {}

  Status flush(const kvstore::KvChunkKey& key, std::span<const std::byte> chunk) override {
    const kvstore::KvChunkRef ref{key, 0, chunk.size()};
    return flush_linked(std::span<const kvstore::KvChunkRef>(&ref, 1), chunk, {});
  }
  Result<std::vector<std::byte>> fetch(const kvstore::KvChunkKey&) override {
    return make_error(ErrorCode::unsupported, "fetch a prefix");
  }
  Status flush_batch(std::span<const kvstore::KvChunkRef> chunks, std::span<const std::byte> buffer) override {
    return flush_linked(chunks, buffer, {});
  }
  bool takes_prefix_links() const override { return takes_links; }
  Status flush_linked(std::span<const kvstore::KvChunkRef> chunks, std::span<const std::byte> buffer,
                      std::span<const kvstore::PrefixLinkWrite> links) override {
    const auto sent_at = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    std::vector<kvstore::KvChunkWrite> writes;
    for (const kvstore::KvChunkRef& c : chunks)
      writes.push_back(kvstore::KvChunkWrite{c.key, buffer.subspan(c.offset, c.bytes)});
    auto durable = store_->put_many(writes, links);
    if (!durable.ok()) return durable.error();
    for (std::size_t i = 0; i < writes.size(); ++i)
      acks_.push_back(KvStoreAck{writes[i].key.job_id, writes[i].key.request_id, (*durable)[i]});
    for (std::size_t i = 0; i < links.size(); ++i)
      acks_.push_back(KvStoreAck{links[i].job_id, links[i].request_id, (*durable)[writes.size() + i]});
    // As the KV-store actor: the batch's requests whose link waits.
    for (const KvStoreAck& a : acks_)
      if (const auto name = store_->waiting_link_block(a.job_id, a.request_id))
        waits_.push_back(KvLinkWait{a.job_id, a.request_id, *name, sent_at});
    return Status::ok_status();
  }
  std::vector<KvStoreAck> take_acks() override {
    std::lock_guard lock(mu_);
    return std::exchange(acks_, {});
  }
  std::vector<KvLinkWait> take_link_waits() override {
    std::lock_guard lock(mu_);
    return std::exchange(waits_, {});
  }
  Result<KvPrefix> fetch_prefix(std::uint64_t job_id, std::uint64_t request_id, int max_tokens) override {
    std::lock_guard lock(mu_);
    auto p = store_->fetch_prefix(job_id, request_id, max_tokens);
    if (!p.ok()) return std::move(p).error();
    return KvPrefix{p->tokens, std::move(p->chunk), "direct"};
  }
  void drop_job(std::uint64_t job_id) override {
    std::lock_guard lock(mu_);
    (void)store_->drop_job(job_id);
  }
  Result<PrefixPutAck> put_blocks(std::uint64_t salt, std::span<const kvstore::PrefixBlockWrite> blocks) override {
    std::lock_guard lock(mu_);
    return testing::put_prefix_blocks_acked(*store_, salt, blocks);
  }
  Result<std::vector<kvstore::StoredPrefixBlock>> fetch_blocks(
      std::uint64_t salt, std::span<const kvstore::PrefixBlockQuery> queries) override {
    std::lock_guard lock(mu_);
    return store_->fetch_prefix_blocks(salt, queries);
  }

  bool takes_links = true;  ///< false: a target without links (every position is streamed)

 private:
  std::mutex mu_;
  kvstore::KvStore* store_;
  std::vector<KvStoreAck> acks_;
  std::vector<KvLinkWait> waits_;
};

WorkerRuntimeOptions options(const std::string& name) { return testing::shared_head_options(name, true); }

using testing::make_runtime;

constexpr std::uint64_t kJob = 9;

std::vector<BatchRequest> lines() { return testing::shared_head_lines(kJob, 4, 24, 900); }

using Outputs = testing::LineOutputs;
Outputs run_all(WorkerRuntime& rt) { return testing::run_to_end(rt); }

/// The latest progress reported per (line, choice).
struct ProgressLog {
  std::mutex mu;
  std::map<std::pair<std::uint64_t, int>, KvProgress> latest;
  WorkerRuntime::KvProgressCallback callback() {
    return [this](std::vector<KvProgress> progress) {
      std::lock_guard lock(mu);
      for (KvProgress& p : progress) latest[{p.line_index, p.choice}] = std::move(p);
    };
  }
};

/// A node: a KvStore in its own folder, the runtime streaming to it.
struct Node {
  orchestrator::testing::TempDir dir;
  std::unique_ptr<kvstore::KvStore> store;
  std::shared_ptr<DirectStore> direct;
  std::unique_ptr<WorkerRuntime> rt;
  ProgressLog progress;
  std::uint64_t streamed_bytes = 0;
};

/// Starts `node` with links on or off, runs `steps` steps of the job (no
/// line finishes that early) and waits for everything queued to reach the
/// store.
void start_and_step(Node& node, bool links, int steps) {
  node.rt = make_runtime(options(links ? "linked" : "streamed"));
  ASSERT_NE(node.rt, nullptr);
  kvstore::KvStoreOptions so;
  so.shape = node.rt->batch_worker().engine().kv_io().shape();
  so.disk_reserve_bytes = 0;
  auto store = kvstore::KvStore::open(node.dir.path(), so);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  node.store = std::move(store).value();
  node.direct = std::make_shared<DirectStore>(node.store.get());
  node.direct->takes_links = links;
  ASSERT_TRUE(node.rt->connect_kv_store(node.direct, node.direct, node.progress.callback()));
  ASSERT_TRUE(node.rt->connect_prefix_store(node.direct, 8u << 20));
  for (BatchRequest& l : lines()) (void)node.rt->accept(std::move(l));
  // Each step's KV and the tier's blocks reach the store before the next
  // step (as a node's would, given time): the acks a step's batch gets, and
  // the link waits the next step acts on, do not depend on how the
  // streamer's and the tier's threads were scheduled.
  for (int i = 0; i < steps; ++i) {
    auto step = node.rt->step();
    ASSERT_TRUE(step.ok()) << step.error().to_string();
    ASSERT_TRUE(step->results.empty()) << "step " << i << ": a line finished this early";
    ASSERT_TRUE(node.rt->drain_kv(std::chrono::seconds(20)));
  }
  node.streamed_bytes = node.rt->take_kv_counter_growth().streamed_bytes;
}

TEST(PrefixLinkStreaming, TheStoreHoldsTheSameBytesTheLinkedHeadIsNotSentAndResumesAreByteIdentical) {
  Outputs want;
  {
    WorkerRuntimeOptions o = options("plain");
    o.engine.enable_prefix_caching = false;
    auto plain = make_runtime(o);
    ASSERT_NE(plain, nullptr);
    for (BatchRequest& l : lines()) (void)plain->accept(std::move(l));
    want = run_all(*plain);
  }
  ASSERT_EQ(want.size(), 4u);

  constexpr int kSteps = 8;
  Node linked, streamed;
  start_and_step(streamed, false, kSteps);
  start_and_step(linked, true, kSteps);

  const auto ls = linked.store->stats();
  const auto ss = streamed.store->stats();
  ASSERT_TRUE(ls.ok() && ss.ok());
  EXPECT_EQ(ss->prefix_links, 0u);
  // Every request but the one that computed the head links its 4 blocks.
  EXPECT_EQ(ls->prefix_links, 7u);
  EXPECT_EQ(ls->prefix_links_pending, 0u);
  EXPECT_EQ(ls->linked_tokens, 7u * 64u);
  EXPECT_EQ(ls->prefix_pinned, 4u);
  // The positions the links stand for are exactly the KV bytes not sent.
  const kvstore::KvModelShape& shape = linked.store->options().shape;
  const std::uint64_t position_bytes = static_cast<std::uint64_t>(shape.num_layers) * 2 * shape.num_kv_heads *
                                       shape.head_dim * dtype_size(shape.dtype);
  EXPECT_EQ(streamed.streamed_bytes - linked.streamed_bytes, ls->linked_tokens * position_bytes);
  EXPECT_LT(ls->chunk_bytes, ss->chunk_bytes);

  // The same KV for every request, whether its head is linked or streamed.
  const std::vector<kvstore::KvRequestCoverage> lr = linked.store->requests();
  const std::vector<kvstore::KvRequestCoverage> sr = streamed.store->requests();
  ASSERT_EQ(lr.size(), 8u);
  ASSERT_EQ(sr.size(), 8u);
  for (std::size_t i = 0; i < lr.size(); ++i) {
    ASSERT_EQ(lr[i].request_id, sr[i].request_id);
    EXPECT_EQ(lr[i].durable_tokens, sr[i].durable_tokens) << "request " << lr[i].request_id;
    EXPECT_GT(lr[i].durable_tokens, 70);
    auto a = linked.store->fetch_prefix(kJob, lr[i].request_id, lr[i].durable_tokens);
    auto b = streamed.store->fetch_prefix(kJob, sr[i].request_id, sr[i].durable_tokens);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->tokens, b->tokens);
    EXPECT_TRUE(a->chunk == b->chunk) << "request " << lr[i].request_id << ": the stores' bytes differ";
  }

  // The linked worker dies; its lines resume on a fresh runtime (no prefix
  // cache of its own) from the progress the links' acks made.
  linked.rt.reset();
  WorkerRuntimeOptions fresh = options("resumed");
  fresh.engine.enable_prefix_caching = false;
  auto resumed = make_runtime(fresh);
  ASSERT_NE(resumed, nullptr);
  ASSERT_TRUE(resumed->connect_kv_store(linked.direct, linked.direct, {}));
  std::uint64_t replicated = 0;
  for (BatchRequest& l : lines()) {
    l.resume.resize(2);
    for (int c = 0; c < 2; ++c) {
      std::lock_guard lock(linked.progress.mu);
      const auto it = linked.progress.latest.find({l.line_index, c});
      ASSERT_NE(it, linked.progress.latest.end()) << "line " << l.line_index << " choice " << c;
      EXPECT_GT(it->second.replicated_tokens, 64) << "the link's positions count in the acks";
      l.resume[static_cast<std::size_t>(c)] = ChoiceResume{it->second.output_ids, it->second.replicated_tokens, {}};
      replicated += static_cast<std::uint64_t>(it->second.replicated_tokens);
    }
    const std::optional<ResumeFetchReport> report = resumed->accept(std::move(l));
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->num_fallbacks, 0);
  }
  EXPECT_EQ(run_all(*resumed), want) << "resumed through linked heads: byte-identical";
  EXPECT_EQ(resumed->take_kv_counter_growth().restored_tokens, replicated);
}

// The store dropped the head's blocks after the worker learned it kept
// them (nothing linked them any more, and other blocks took the budget):
// the next job's requests still link them, the store reports the links
// waiting, and each request streams its head as KV instead. Every request
// ends up with its whole KV acknowledged, the same bytes as streamed.
TEST(PrefixLinkStreaming, ALinkToABlockTheStoreDroppedStreamsTheHeadAsKvInstead) {
  constexpr int kSteps = 8;
  Node streamed;
  start_and_step(streamed, false, kSteps);

  Node node;
  node.rt = make_runtime(options("dropped"));
  ASSERT_NE(node.rt, nullptr);
  kvstore::KvStoreOptions so;
  so.shape = node.rt->batch_worker().engine().kv_io().shape();
  so.disk_reserve_bytes = 0;
  const std::uint64_t block_bytes = kvstore::chunk_bytes(so.shape, kvstore::KvRange{0, so.shape.num_layers, 0, 16}) +
                                    16 + 4 * 16;
  so.prefix_budget_bytes = 4 * block_bytes;  // the head's 4 blocks, no more
  auto store = kvstore::KvStore::open(node.dir.path(), so);
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  node.store = std::move(store).value();
  node.direct = std::make_shared<DirectStore>(node.store.get());
  ASSERT_TRUE(node.rt->connect_kv_store(node.direct, node.direct, node.progress.callback()));
  ASSERT_TRUE(node.rt->connect_prefix_store(node.direct, 8u << 20));
  // A first job puts the head's blocks in the store; it ends and its KV is
  // dropped, so nothing pins them.
  std::vector<BatchRequest> first = lines();
  for (BatchRequest& l : first) {
    l.job_id = kJob + 1;
    l.params.max_tokens = 2;
    (void)node.rt->accept(std::move(l));
  }
  (void)run_all(*node.rt);
  ASSERT_TRUE(node.rt->drain_kv(std::chrono::seconds(20)));
  ASSERT_TRUE(node.store->drop_job(kJob + 1).ok());
  ASSERT_EQ(node.store->stats()->prefix_blocks, 4u);
  // Four other blocks take the budget: the head's are dropped.
  std::vector<std::vector<std::int32_t>> tokens(4, std::vector<std::int32_t>(16, 7));
  std::vector<std::vector<std::byte>> chunks(4, std::vector<std::byte>(block_bytes - 16 - 64));
  std::vector<kvstore::PrefixBlockWrite> others;
  for (std::uint64_t i = 0; i < 4; ++i)
    others.push_back(kvstore::PrefixBlockWrite{node.rt->batch_worker().engine().config().prefix_cache.salt, 9000 + i,
                                               8999 + i, tokens[i], chunks[i]});
  ASSERT_TRUE(node.store->put_prefix_blocks(others).ok());
  ASSERT_EQ(node.store->stats()->prefix_evictions, 4u);

  // The job again: its requests find the head on the device and link it.
  for (BatchRequest& l : lines()) (void)node.rt->accept(std::move(l));
  for (int i = 0; i < kSteps + 4; ++i) {  // drained after each step, as above
    ASSERT_TRUE(node.rt->step().ok());
    ASSERT_TRUE(node.rt->drain_kv(std::chrono::seconds(20)));
  }
  const auto st = node.store->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_GT(st->prefix_links_pending, 0u) << "the requests linked the head, whose blocks the store dropped";
  for (const kvstore::KvRequestCoverage& r : node.store->requests()) {
    EXPECT_GT(r.durable_tokens, 70) << "request " << r.request_id << ": its head was streamed as KV";
    auto got = node.store->fetch_prefix(kJob, r.request_id, 70);
    auto want = streamed.store->fetch_prefix(kJob, r.request_id, 70);
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_TRUE(got->chunk == want->chunk) << "request " << r.request_id;
  }
}

}  // namespace worker_prefix_link_streaming_golden_test
}  // namespace shardline::worker
