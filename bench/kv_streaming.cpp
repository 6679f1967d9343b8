#include "bench/kv_streaming.hpp"

#include <caf/all.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "actors/actors.hpp"
#include "actors/kv_client.hpp"
#include "actors/protocol.hpp"
#include "messages/codec.hpp"
#include "worker/kv_streamer.hpp"

namespace shardline::bench {

Result<KvStreamMode> parse_kv_stream_mode(const std::string& name) {
  if (name == "off") return KvStreamMode::off;
  if (name == "store") return KvStreamMode::store;
  if (name == "replicated") return KvStreamMode::replicated;
  return make_error(ErrorCode::invalid_argument, "--kv-stream: '" + name + "', expected off, store or replicated");
}

const char* kv_stream_mode_name(KvStreamMode mode) noexcept {
  switch (mode) {
    case KvStreamMode::off: return "off";
    case KvStreamMode::store: return "store";
    case KvStreamMode::replicated: return "replicated";
  }
  return "?";
}

namespace {

/// Engine increments -> the streamer's queue, under job 1 (request id = the
/// engine's).
class Sink final : public engine::KvStreamSink {
 public:
  explicit Sink(worker::KvStreamer& streamer) : streamer_(streamer) {}
  bool accepting() const override { return streamer_.accepting(); }
  void push(engine::KvIncrement inc) override {
    worker::QueuedIncrement q;
    q.key = kvstore::KvChunkKey{1, inc.request_id, inc.range};
    q.chunk = std::move(inc.chunk);
    q.token_ids = std::move(inc.token_ids);
    q.num_prompt_tokens = inc.num_prompt_tokens;
    streamer_.push(std::move(q));
  }

 private:
  worker::KvStreamer& streamer_;
};

}  // namespace

struct KvStreaming::Impl {
  std::filesystem::path dir;
  caf::actor_system_config config;
  std::unique_ptr<caf::actor_system> system;
  std::shared_ptr<const actors::ClusterKey> key;
  std::vector<caf::actor> stores;
  std::shared_ptr<actors::KvStoreLink> link = std::make_shared<actors::KvStoreLink>();
  std::shared_ptr<actors::ActorKvTarget> target;
  std::mutex mu;
  std::map<std::uint64_t, int> acked;  ///< request -> acknowledged positions
  std::unique_ptr<worker::KvStreamer> streamer;
  std::unique_ptr<Sink> sink;

  ~Impl() {
    streamer.reset();
    for (const caf::actor& s : stores) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    stores.clear();
    link->set(caf::actor());
    target.reset();
    if (system) system->await_all_actors_done();
    system.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

KvStreaming::KvStreaming(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvStreaming::~KvStreaming() = default;

Result<std::unique_ptr<KvStreaming>> KvStreaming::start(KvStreamMode mode, const kvstore::KvModelShape& shape,
                                                        kvstore::KvSyncPolicy sync) {
  auto impl = std::make_unique<Impl>();
  impl->dir = std::filesystem::temp_directory_path() /
              ("shardline-bench-kv-" + std::to_string(::getpid()) + "-" +
               std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  impl->config.set("scheduler.max-threads", 1);
  impl->config.set("logger.console-verbosity", caf::atom("quiet"));
  impl->system = std::make_unique<caf::actor_system>(impl->config);
  auto key = actors::ClusterKey::generate();
  if (!key) return std::move(key).error();
  impl->key = std::make_shared<const actors::ClusterKey>(std::move(key).value());
  std::vector<std::string> names{"bench0/kvstore"};
  if (mode == KvStreamMode::replicated) names.push_back("bench1/kvstore");
  for (const std::string& name : names) {
    actors::KvStoreConfig c;
    c.name = name;
    c.node_name = name.substr(0, name.find('/'));
    c.dir = (impl->dir / c.node_name).string();
    c.shape = shape;
    c.sync = sync;
    c.replication_factor = 2;
    c.key = impl->key;
    c.heartbeat_ms = 3'600'000;
    impl->stores.push_back(actors::spawn_kvstore(*impl->system, std::move(c)));
  }
  // The ring, as the orchestrator would send it.
  const actors::Signed ring =
      actors::sign(*impl->key, messages::encode(messages::KvStoreMsg{messages::SetRing{names}}));
  for (const caf::actor& s : impl->stores) caf::anon_send(s, actors::ring_atom::value, ring.tag, ring.bytes, impl->stores);
  // A store that cannot open its directory quits; ask it for its stats first.
  for (const caf::actor& s : impl->stores) {
    auto stats = actors::ask_kv_store(*impl->system, s, *impl->key, messages::StatsQuery{}, std::chrono::seconds(30));
    if (!stats) return std::move(stats).error();
  }
  impl->link->set(impl->stores.front());
  impl->target = std::make_shared<actors::ActorKvTarget>(*impl->system, impl->link, impl->key);
  Impl* raw = impl.get();
  impl->streamer = std::make_unique<worker::KvStreamer>(
      impl->target, worker::KvStreamerOptions{},
      [raw](std::vector<worker::QueuedIncrement>) {
        std::lock_guard<std::mutex> lock(raw->mu);
        for (const worker::KvStoreAck& a : raw->target->take_acks()) {
          int& t = raw->acked[a.request_id];
          t = std::max(t, a.tokens);
        }
      });
  impl->sink = std::make_unique<Sink>(*impl->streamer);
  return std::unique_ptr<KvStreaming>(new KvStreaming(std::move(impl)));
}

engine::KvStreamSink* KvStreaming::sink() { return impl_->sink.get(); }

Result<KvStreamingStats> KvStreaming::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  if (!impl_->streamer->drain(std::chrono::minutes(10)))
    return make_error(ErrorCode::io, "bench: the KV streamer did not drain in 10 minutes");
  KvStreamingStats out;
  out.drain_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const worker::KvStreamerStats s = impl_->streamer->stats();
  out.streamed_bytes = s.flushed_bytes;
  out.increments = s.flushed;
  out.batches = s.batches;
  out.failed_flushes = s.failed_flushes;
  out.max_queued_bytes = s.max_queued_bytes_seen;
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [r, t] : impl_->acked) out.acked_tokens += static_cast<std::uint64_t>(t);
  return out;
}

}  // namespace shardline::bench
