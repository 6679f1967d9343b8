#pragma once
/// \file
/// KV copies of whole sequences between rank 0 of an engine group and ranks
/// whose caches it cannot address (processes over TCP, engine/group/tcp_group.hpp):
/// what Seesaw's tiered KV buffer (seed 000 §4.2) and swap preemption need
/// when the group's devices are not in this process.
///
/// In an in-process group, rank 0 reads and writes every rank's cache
/// through host-addressable views (kvstore::copy_out / copy_in). Over TCP
/// each rank gathers (or scatters) its own share of a sequence and the
/// bytes cross the group's world communicator:
///  - copy_out: rank 0 sends every rank a request (kind kKindKvOut on the
///    step-metadata tags, so it lands in the rank's serving loop between
///    two steps); each rank gathers its layers and KV head slots of the
///    range (kvstore::gather) and answers a status word, then its part;
///    rank 0 gathers its own part and merges all of them into the canonical
///    chunk (kvstore::merge_part, in reverse rank order: the first holder of
///    a replicated head wins, as in kvstore::copy_out).
///  - copy_in: rank 0 splits the chunk into each rank's share
///    (kvstore::split_part) and sends it with the request (kKindKvIn); each
///    rank scatters it and answers a status word; copy_in returns once all
///    have.
///  - the first copy under a config asks every rank for its cache layout
///    (kKindKvLayout), checks that the ranks together hold every layer and
///    KV head, and keeps them.
/// So the KV re-sharding of Seesaw (a chunk out of cp's layout, into cd's)
/// works across processes exactly as in one.
///
/// Wire (tags of parallel_executor.hpp): header int32[2] {kind, num_words}
/// on kTagMetaHeader and int32[num_words] on kTagMetaBody, sent under the
/// executor's metadata mutex so they never interleave with a step's; body
///   layout:  {config}
///   out/in:  {config, layer_begin, layer_end, token_begin, token_end,
///             part_bytes low, high (in: the part that follows), block_table...}
/// with config 0 = cp (the group's own), 1 = cd (Seesaw's decode config),
/// which must be the rank's active one. Answers on kTagKvReply: int32
/// status (0 ok, else an ErrorCode) and, for layout, int32[5 + num_kv_heads]
/// {layer_begin, layer_end, num_blocks, block_size, num_slots, kv_heads...
/// (padded with -1)}; parts on kTagKvData (none when a rank holds no layer
/// of the range).
///
/// Thread safety: GroupKvCopier serializes its own calls (one request at a
/// time over the group) and may run on another thread than the steps (the
/// world communicator must allow concurrent send / recv on distinct tags,
/// as comm::TcpCommunicator does).

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "comm/communicator.hpp"
#include "common/result.hpp"
#include "engine/group/step_control.hpp"
#include "kvstore/kv_stream.hpp"

namespace shardline::engine {


/// A rank's side: serves one KV request whose header (`kind`, `num_words`)
/// its loop has read. `view` is the rank's cache under its active config
/// (`decode_active`: cd). A request the rank refuses (a bad table, another
/// config) is answered with its error code and serving goes on; the
/// returned error is a communication failure only (the rank is then dead).
[[nodiscard]] Status serve_kv_request(comm::Communicator& world, std::int32_t kind, int num_words,
                                      const kvstore::KvModelShape& shape, const kvstore::KvCacheView& view,
                                      bool decode_active);

/// Rank 0's side: the group's caches as a KvCopier.
class GroupKvCopier final : public kvstore::KvCopier {
 public:
  /// What the executor lends it; every pointer outlives the copier.
  struct Access {
    comm::Communicator* world = nullptr;  ///< the group's world (rank 0)
    std::mutex* meta_mu = nullptr;        ///< held while a header and its body are sent
    kvstore::KvModelShape shape;
    /// Rank 0's cache under the active config, and which config that is.
    std::function<kvstore::KvCacheView()> own_view;
    std::function<bool()> decode_active;
  };
  explicit GroupKvCopier(Access access) : a_(std::move(access)) {}

  [[nodiscard]] int num_devices() const override { return a_.world->world_size(); }
  /// Errors: invalid_argument (a chunk of the wrong size, a bad table or
  /// range on rank 0), internal (a rank refused: the message names it and
  /// its error code; ranks that do not hold the whole model together), io
  /// (a rank is gone).
  [[nodiscard]] Status copy_out(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                                std::span<std::byte> chunk) override;
  [[nodiscard]] Status copy_in(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                               std::span<const std::byte> chunk) override;
  /// Bytes of parts received from / sent to the other ranks so far.
  [[nodiscard]] std::uint64_t remote_bytes() const;

 private:
  /// Every rank's layout under the active config (asked once per config).
  [[nodiscard]] Result<const std::vector<kvstore::KvRankLayout>*> layouts_locked();
  /// Checks a chunk's size against `range`, then layouts_locked().
  [[nodiscard]] Result<const std::vector<kvstore::KvRankLayout>*> begin_locked(const char* op,
                                                                              const kvstore::KvRange& range,
                                                                              std::size_t chunk_size);
  /// Sends header + body_for(rank) to every rank > 0 under the metadata mutex.
  [[nodiscard]] Status send_request_locked(std::int32_t kind,
                                           const std::function<std::vector<std::int32_t>(int rank)>& body_for);
  [[nodiscard]] std::vector<std::int32_t> body_of(std::span<const std::int32_t> table, const kvstore::KvRange& range,
                                                  std::uint64_t part_bytes) const;

  Access a_;
  mutable std::mutex mu_;  // one request at a time
  std::array<std::optional<std::vector<kvstore::KvRankLayout>>, 2> layouts_;  // [cp, cd]
  std::uint64_t remote_bytes_ = 0;
};

}  // namespace shardline::engine
