#include "engine/group/group_kv.hpp"

#include <string>
#include <utility>

#include "engine/group/parallel_executor.hpp"

namespace shardline::engine {

namespace {

/// config, layer_begin, layer_end, token_begin, token_end, part bytes (low, high 32 bits; copy_in's part to this rank)
constexpr int kRangeWords = 7;

/// The status word of an answer: 0 ok, else 1 + the ErrorCode.
std::int32_t status_word(const Status& st) {
  return st.ok() ? 0 : 1 + static_cast<std::int32_t>(st.error().code);
}

Error refused(int rank, const char* what, std::int32_t word) {
  const auto code = static_cast<ErrorCode>(word - 1);
  return make_error(ErrorCode::internal, "KV " + std::string(what) + ": rank " + std::to_string(rank) +
                                             " refused the request (" + error_code_name(code) + ")");
}

Error bad(std::string message) { return make_error(ErrorCode::invalid_argument, std::move(message)); }

}  // namespace

// ---- a rank ------------------------------------------------------------------

Status serve_kv_request(comm::Communicator& world, std::int32_t kind, int num_words,
                        const kvstore::KvModelShape& shape, const kvstore::KvCacheView& view, bool decode_active) {
  if (num_words < 1 || (kind != kKindKvLayout && num_words < kRangeWords))
    return make_error(ErrorCode::corrupt, "KV request of kind " + std::to_string(kind) + " with " +
                                              std::to_string(num_words) + " words");
  std::vector<std::int32_t> body(static_cast<std::size_t>(num_words));
  if (Status st = world.recv(body.data(), body.size() * sizeof(std::int32_t), 0, kTagMetaBody); !st) return st;
  const bool wants_decode = body[0] == 1;
  Status verdict;
  if (wants_decode != decode_active)
    verdict = bad(std::string("a KV request under the ") + (wants_decode ? "decode" : "prefill") +
                  " config while the other one is active");
  if (kind == kKindKvLayout) {
    const kvstore::KvRankLayout& l = view.layout;
    std::vector<std::int32_t> answer(static_cast<std::size_t>(6 + shape.num_kv_heads), -1);
    answer[0] = status_word(verdict);
    answer[1] = l.layer_begin;
    answer[2] = l.layer_end;
    answer[3] = l.num_blocks;
    answer[4] = l.block_size;
    answer[5] = static_cast<std::int32_t>(l.kv_heads.size());
    for (std::size_t s = 0; s < l.kv_heads.size() && s < static_cast<std::size_t>(shape.num_kv_heads); ++s)
      answer[6 + s] = l.kv_heads[s];
    return world.send(answer.data(), answer.size() * sizeof(std::int32_t), 0, kTagKvReply);
  }
  const kvstore::KvRange range{body[1], body[2], body[3], body[4]};
  const std::span<const std::int32_t> table(body.data() + kRangeWords, body.size() - kRangeWords);
  // Sizes come from this rank's layout, which rank 0 asked for before.
  std::size_t bytes = 0;
  if (verdict.ok()) {
    if (Status st = kvstore::check_layout(shape, view.layout); !st) verdict = st;
    else if (range.layer_begin < 0 || range.layer_end > shape.num_layers || range.token_begin < 0 ||
             range.layer_begin >= range.layer_end || range.token_begin >= range.token_end)
      verdict = bad("a KV request with an empty or bad range");
    else
      bytes = kvstore::gather_bytes(shape, view.layout, range);
  }
  const std::uint64_t sent_bytes =
      static_cast<std::uint32_t>(body[5]) | (static_cast<std::uint64_t>(static_cast<std::uint32_t>(body[6])) << 32);
  std::vector<std::byte> part(bytes);
  if (kind == kKindKvOut) {
    if (verdict.ok() && bytes > 0) verdict = kvstore::gather(shape, view, table, range, part);
    const std::int32_t word = status_word(verdict);
    if (Status st = world.send(&word, sizeof word, 0, kTagKvReply); !st) return st;
    if (word == 0 && bytes > 0) return world.send(part.data(), part.size(), 0, kTagKvData);
    return Status::ok_status();
  }
  if (kind != kKindKvIn) return make_error(ErrorCode::corrupt, "KV request of unknown kind " + std::to_string(kind));
  // Read the part rank 0 sent even when refusing, so the next request
  // finds the channel clean.
  std::vector<std::byte> sent(sent_bytes);
  if (sent_bytes > 0)
    if (Status st = world.recv(sent.data(), sent.size(), 0, kTagKvData); !st) return st;
  if (verdict.ok() && sent_bytes != bytes)
    verdict = bad("a KV part of " + std::to_string(sent_bytes) + " bytes for a share of " + std::to_string(bytes));
  if (verdict.ok() && bytes > 0) verdict = kvstore::scatter(shape, view, table, range, sent);
  const std::int32_t word = status_word(verdict);
  return world.send(&word, sizeof word, 0, kTagKvReply);
}

// ---- rank 0 ------------------------------------------------------------------

std::uint64_t GroupKvCopier::remote_bytes() const {
  std::lock_guard lock(mu_);
  return remote_bytes_;
}

std::vector<std::int32_t> GroupKvCopier::body_of(std::span<const std::int32_t> table, const kvstore::KvRange& range,
                                                 std::uint64_t part_bytes) const {
  std::vector<std::int32_t> body = {a_.decode_active() ? 1 : 0,
                                    range.layer_begin,
                                    range.layer_end,
                                    range.token_begin,
                                    range.token_end,
                                    static_cast<std::int32_t>(static_cast<std::uint32_t>(part_bytes)),
                                    static_cast<std::int32_t>(static_cast<std::uint32_t>(part_bytes >> 32))};
  body.insert(body.end(), table.begin(), table.end());
  return body;
}

Status GroupKvCopier::send_request_locked(std::int32_t kind,
                                          const std::function<std::vector<std::int32_t>(int rank)>& body_for) {
  std::lock_guard meta(*a_.meta_mu);
  for (int r = 1; r < a_.world->world_size(); ++r) {
    const std::vector<std::int32_t> body = body_for(r);
    const std::int32_t header[2] = {kind, static_cast<std::int32_t>(body.size())};
    if (Status st = a_.world->send(header, sizeof header, r, kTagMetaHeader); !st) return st;
    if (Status st = a_.world->send(body.data(), body.size() * sizeof(std::int32_t), r, kTagMetaBody); !st) return st;
  }
  return Status::ok_status();
}

Result<const std::vector<kvstore::KvRankLayout>*> GroupKvCopier::layouts_locked() {
  const bool decode = a_.decode_active();
  std::optional<std::vector<kvstore::KvRankLayout>>& cached = layouts_[decode ? 1 : 0];
  if (cached) return &*cached;
  const int size = a_.world->world_size();
  const kvstore::KvModelShape& shape = a_.shape;
  std::vector<kvstore::KvRankLayout> layouts(static_cast<std::size_t>(size));
  layouts[0] = a_.own_view().layout;
  if (Status st = send_request_locked(kKindKvLayout, [&](int) { return std::vector<std::int32_t>{decode ? 1 : 0}; });
      !st)
    return st.error();
  Status first;
  for (int r = 1; r < size; ++r) {
    std::vector<std::int32_t> answer(static_cast<std::size_t>(6 + shape.num_kv_heads));
    if (Status st = a_.world->recv(answer.data(), answer.size() * sizeof(std::int32_t), r, kTagKvReply); !st)
      return st.error();
    if (answer[0] != 0) {
      if (first.ok()) first = refused(r, "layout", answer[0]);
      continue;
    }
    kvstore::KvRankLayout& l = layouts[static_cast<std::size_t>(r)];
    l.layer_begin = answer[1];
    l.layer_end = answer[2];
    l.num_blocks = answer[3];
    l.block_size = answer[4];
    const int slots = answer[5];
    if (slots < 1 || slots > shape.num_kv_heads) {
      if (first.ok()) first = make_error(ErrorCode::corrupt, "KV layout of rank " + std::to_string(r) + ": " +
                                                                  std::to_string(slots) + " head slots");
      continue;
    }
    l.kv_heads.assign(answer.begin() + 6, answer.begin() + 6 + slots);
    if (Status st = kvstore::check_layout(shape, l); !st && first.ok())
      first = make_error(ErrorCode::corrupt, "KV layout of rank " + std::to_string(r) + ": " + st.error().message);
  }
  if (!first.ok()) return first.error();
  // Together the ranks must hold every (layer, KV head).
  for (int layer = 0; layer < shape.num_layers; ++layer)
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      bool held = false;
      for (const kvstore::KvRankLayout& l : layouts)
        if (layer >= l.layer_begin && layer < l.layer_end)
          for (const int x : l.kv_heads) held = held || x == h;
      if (!held)
        return make_error(ErrorCode::internal, "KV layouts of the group: layer " + std::to_string(layer) +
                                                   " KV head " + std::to_string(h) + " is held by no rank");
    }
  cached = std::move(layouts);
  return &*cached;
}

Result<const std::vector<kvstore::KvRankLayout>*> GroupKvCopier::begin_locked(const char* op,
                                                                              const kvstore::KvRange& range,
                                                                              std::size_t chunk_size) {
  const std::size_t need = kvstore::chunk_bytes(a_.shape, range);
  if (chunk_size != need)
    return bad(std::string("KV ") + op + ": chunk of " + std::to_string(chunk_size) + " bytes, expected " +
               std::to_string(need));
  return layouts_locked();
}

Status GroupKvCopier::copy_out(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                               std::span<std::byte> chunk) {
  std::lock_guard lock(mu_);
  const kvstore::KvModelShape& shape = a_.shape;
  auto layouts = begin_locked("copy_out", range, chunk.size());
  if (!layouts.ok()) return layouts.error();
  const std::vector<kvstore::KvRankLayout>& ls = **layouts;
  const int size = a_.world->world_size();
  // Check rank 0's share first: a bad table fails here with nothing sent.
  std::vector<std::vector<std::byte>> parts(static_cast<std::size_t>(size));
  const kvstore::KvCacheView own = a_.own_view();
  parts[0].resize(kvstore::gather_bytes(shape, own.layout, range));
  if (Status st = kvstore::gather(shape, own, block_table, range, parts[0]); !st) return st;
  const std::vector<std::int32_t> body = body_of(block_table, range, 0);
  if (Status st = send_request_locked(kKindKvOut, [&](int) { return body; }); !st) return st;
  Status first;
  for (int r = 1; r < size; ++r) {
    std::int32_t word = 0;
    if (Status st = a_.world->recv(&word, sizeof word, r, kTagKvReply); !st) return st;
    auto& part = parts[static_cast<std::size_t>(r)];
    part.resize(kvstore::gather_bytes(shape, ls[static_cast<std::size_t>(r)], range));
    if (word != 0) {
      if (first.ok()) first = refused(r, "copy_out", word);
      continue;
    }
    if (!part.empty()) {
      if (Status st = a_.world->recv(part.data(), part.size(), r, kTagKvData); !st) return st;
      remote_bytes_ += part.size();
    }
  }
  if (!first.ok()) return first;
  for (int r = size - 1; r >= 0; --r) {  // the first holder of a replicated head wins
    const auto& part = parts[static_cast<std::size_t>(r)];
    if (part.empty()) continue;
    if (Status st = kvstore::merge_part(shape, ls[static_cast<std::size_t>(r)], range, part, chunk); !st) return st;
  }
  return Status::ok_status();
}

Status GroupKvCopier::copy_in(std::span<const std::int32_t> block_table, const kvstore::KvRange& range,
                              std::span<const std::byte> chunk) {
  std::lock_guard lock(mu_);
  const kvstore::KvModelShape& shape = a_.shape;
  auto layouts = begin_locked("copy_in", range, chunk.size());
  if (!layouts.ok()) return layouts.error();
  const std::vector<kvstore::KvRankLayout>& ls = **layouts;
  const int size = a_.world->world_size();
  std::vector<std::vector<std::byte>> parts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    auto& part = parts[static_cast<std::size_t>(r)];
    part.resize(kvstore::gather_bytes(shape, ls[static_cast<std::size_t>(r)], range));
    if (!part.empty())
      if (Status st = kvstore::split_part(shape, ls[static_cast<std::size_t>(r)], range, chunk, part); !st) return st;
  }
  // Rank 0's own share first: a bad table fails here with nothing sent.
  const kvstore::KvCacheView own = a_.own_view();
  if (!parts[0].empty())
    if (Status st = kvstore::scatter(shape, own, block_table, range, parts[0]); !st) return st;
  if (Status st = send_request_locked(
          kKindKvIn, [&](int r) { return body_of(block_table, range, parts[static_cast<std::size_t>(r)].size()); });
      !st)
    return st;
  for (int r = 1; r < size; ++r) {  // the parts go on their own tag, after the headers
    const auto& part = parts[static_cast<std::size_t>(r)];
    if (part.empty()) continue;
    if (Status st = a_.world->send(part.data(), part.size(), r, kTagKvData); !st) return st;
    remote_bytes_ += part.size();
  }
  Status first;
  for (int r = 1; r < size; ++r) {
    std::int32_t word = 0;
    if (Status st = a_.world->recv(&word, sizeof word, r, kTagKvReply); !st) return st;
    if (word != 0 && first.ok()) first = refused(r, "copy_in", word);
  }
  return first;
}

}  // namespace shardline::engine
