#include "comm/exchange.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

namespace shardline::comm::detail {

const char* coll_op_name(std::uint8_t op) noexcept {
  switch (static_cast<CollOp>(op)) {
    case CollOp::barrier: return "barrier";
    case CollOp::all_reduce_sum: return "all_reduce_sum";
    case CollOp::all_gather: return "all_gather";
    case CollOp::reduce_scatter_sum: return "reduce_scatter_sum";
    case CollOp::all_to_all: return "all_to_all";
    case CollOp::broadcast: return "broadcast";
  }
  return "collective";
}

const char* bad_args_text(std::uint8_t bad) noexcept {
  switch (static_cast<BadArgs>(bad)) {
    case BadArgs::none: return "none";
    case BadArgs::null_buffer: return "null buffer";
    case BadArgs::overlap: return "send and recv overlap";
    case BadArgs::root_out_of_range: return "root is out of range";
    case BadArgs::too_large: return "count is too large";
  }
  return "bad arguments";
}

std::pair<std::size_t, std::size_t> reduce_slice(std::size_t n, int r, int w) noexcept {
  const std::size_t base = n / static_cast<std::size_t>(w);
  const std::size_t rem = n % static_cast<std::size_t>(w);
  const auto ur = static_cast<std::size_t>(r);
  const std::size_t begin = ur * base + std::min(ur, rem);
  return {begin, begin + base + (ur < rem ? 1 : 0)};
}

namespace {

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  if (an == 0 || bn == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

BadArgs check_args(const CollCall& c, int world) {
  const std::size_t n = c.count;
  const auto w = static_cast<std::size_t>(world);
  if (n > std::numeric_limits<std::size_t>::max() / sizeof(float) / w) return BadArgs::too_large;
  switch (c.op) {
    case CollOp::barrier: return BadArgs::none;
    case CollOp::all_reduce_sum:
      return n > 0 && c.recv == nullptr ? BadArgs::null_buffer : BadArgs::none;
    case CollOp::broadcast:
      if (c.root < 0 || c.root >= world) return BadArgs::root_out_of_range;
      return n > 0 && c.recv == nullptr ? BadArgs::null_buffer : BadArgs::none;
    case CollOp::all_gather:
    case CollOp::reduce_scatter_sum:
      return n > 0 && (c.send == nullptr || c.recv == nullptr) ? BadArgs::null_buffer
                                                                : BadArgs::none;
    case CollOp::all_to_all: {
      if (n > 0 && (c.send == nullptr || c.recv == nullptr)) return BadArgs::null_buffer;
      const std::size_t total = n * w * sizeof(float);
      return overlaps(c.send, total, c.recv, total) ? BadArgs::overlap : BadArgs::none;
    }
  }
  return BadArgs::none;
}

/// Phase-1 payload that `sender` sends to `receiver` (pointer valid on the
/// sender only) and its size in bytes.
std::pair<const void*, std::size_t> phase1_payload(const CollCall& c, CollOp op, std::size_t n,
                                                   int root, int sender, int receiver,
                                                   int world) {
  const auto k = static_cast<std::size_t>(receiver);
  switch (op) {
    case CollOp::barrier: return {nullptr, 0};
    case CollOp::all_reduce_sum: {
      const auto [b, e] = reduce_slice(n, receiver, world);
      return {c.recv ? c.recv + b : nullptr, (e - b) * sizeof(float)};
    }
    case CollOp::all_gather: return {c.send, n * sizeof(float)};
    case CollOp::reduce_scatter_sum:
    case CollOp::all_to_all: return {c.send ? c.send + k * n : nullptr, n * sizeof(float)};
    case CollOp::broadcast:
      return sender == root ? std::pair<const void*, std::size_t>{c.recv, n * sizeof(float)}
                            : std::pair<const void*, std::size_t>{nullptr, 0};
  }
  return {nullptr, 0};
}

std::string describe(int r, const CollDesc& d) {
  std::string s = "rank " + std::to_string(r) + " called " + coll_op_name(d.op) +
                  "(count=" + std::to_string(d.count);
  if (static_cast<CollOp>(d.op) == CollOp::broadcast) s += ", root=" + std::to_string(d.root);
  return s + ")";
}

const float* as_floats(const ByteBuf& v) {
  return reinterpret_cast<const float*>(v.data());
}

}  // namespace

Status run_collective(CollTransport& t, int rank, int world, std::uint64_t seq,
                      const CollCall& call, std::uint64_t& bytes_sent) {
  const char* name = coll_op_name(static_cast<std::uint8_t>(call.op));
  const std::string who = std::string(name) + ": rank " + std::to_string(rank);
  const std::size_t n = call.count;
  const auto uw = static_cast<std::size_t>(world);
  const auto ur = static_cast<std::size_t>(rank);

  CollDesc mine;
  mine.op = static_cast<std::uint8_t>(call.op);
  mine.phase = 1;
  mine.bad = static_cast<std::uint8_t>(check_args(call, world));
  mine.root = call.root;
  mine.seq = seq;
  mine.count = n;

  // Phase 1: one message to every peer.
  for (int k = 0; k < world; ++k) {
    if (k == rank) continue;
    CollDesc d = mine;
    const void* payload = nullptr;
    if (d.bad == 0) {
      auto [p, bytes] = phase1_payload(call, call.op, n, call.root, rank, k, world);
      payload = p;
      d.payload_bytes = bytes;
    }
    if (Status st = t.post(k, d, payload, name); !st.ok()) return st;
    bytes_sent += d.payload_bytes;
  }
  std::vector<CollMsg> msgs(uw);
  for (int k = 0; k < world; ++k) {
    if (k == rank) continue;
    if (Status st = t.take(k, seq, 1, msgs[static_cast<std::size_t>(k)], name); !st.ok()) return st;
  }

  // The verdict: every rank sees the same descriptors, in the same order.
  auto desc_of = [&](int k) -> const CollDesc& {
    return k == rank ? mine : msgs[static_cast<std::size_t>(k)].desc;
  };
  const CollDesc& d0 = desc_of(0);
  for (int k = 0; k < world; ++k) {
    const CollDesc& d = desc_of(k);
    if (d.bad != 0) {
      return make_error(ErrorCode::invalid_argument,
                        who + ": rank " + std::to_string(k) + " passed bad arguments to " +
                            coll_op_name(d.op) + ": " + bad_args_text(d.bad));
    }
    if (d.op != d0.op || d.count != d0.count ||
        (static_cast<CollOp>(d0.op) == CollOp::broadcast && d.root != d0.root)) {
      return make_error(ErrorCode::invalid_argument,
                        who + ": ranks disagree: " + describe(0, d0) + ", " + describe(k, d));
    }
  }
  for (int k = 0; k < world; ++k) {
    if (k == rank) continue;
    const auto& m = msgs[static_cast<std::size_t>(k)];
    const std::size_t expected =
        phase1_payload(call, call.op, n, call.root, k, rank, world).second;
    if (m.payload.size() != expected) {
      return make_error(ErrorCode::io, who + ": rank " + std::to_string(k) + " sent " +
                                           std::to_string(m.payload.size()) + " bytes, expected " +
                                           std::to_string(expected) + " (protocol error)");
    }
  }

  auto row = [&](int k, std::size_t off) -> const float* {  // rank k's phase-1 floats
    return as_floats(msgs[static_cast<std::size_t>(k)].payload) + off;
  };

  switch (call.op) {
    case CollOp::barrier: return Status();

    case CollOp::all_gather: {
      for (int k = 0; k < world; ++k) {
        float* dst = call.recv + static_cast<std::size_t>(k) * n;
        if (n == 0) break;
        if (k == rank) {
          if (call.send != dst) std::memmove(dst, call.send, n * sizeof(float));
        } else {
          std::memcpy(dst, row(k, 0), n * sizeof(float));
        }
      }
      return Status();
    }

    case CollOp::all_to_all: {
      for (int k = 0; k < world && n > 0; ++k) {
        float* dst = call.recv + static_cast<std::size_t>(k) * n;
        const float* src = k == rank ? call.send + ur * n : row(k, 0);
        std::memcpy(dst, src, n * sizeof(float));
      }
      return Status();
    }

    case CollOp::broadcast: {
      if (rank != call.root && n > 0) std::memcpy(call.recv, row(call.root, 0), n * sizeof(float));
      return Status();
    }

    case CollOp::reduce_scatter_sum: {
      if (n == 0) return Status();
      const float* own = call.send + ur * n;
      std::vector<float> out(n);
      for (std::size_t i = 0; i < n; ++i) {
        float acc = rank == 0 ? own[i] : row(0, 0)[i];
        for (int k = 1; k < world; ++k) acc += k == rank ? own[i] : row(k, 0)[i];
        out[i] = acc;
      }
      std::memcpy(call.recv, out.data(), n * sizeof(float));
      return Status();
    }

    case CollOp::all_reduce_sum: {
      // Sum my slice in rank order; send it to everyone; collect the others.
      const auto [b, e] = reduce_slice(n, rank, world);
      std::vector<float> mine_sum(e - b);
      for (std::size_t i = b; i < e; ++i) {
        float acc = rank == 0 ? call.recv[i] : row(0, 0)[i - b];
        for (int k = 1; k < world; ++k) acc += k == rank ? call.recv[i] : row(k, 0)[i - b];
        mine_sum[i - b] = acc;
      }
      CollDesc d2 = mine;
      d2.phase = 2;
      d2.payload_bytes = mine_sum.size() * sizeof(float);
      for (int k = 0; k < world; ++k) {
        if (k == rank) continue;
        if (Status st = t.post(k, d2, mine_sum.data(), name); !st.ok()) return st;
        bytes_sent += d2.payload_bytes;
      }
      std::vector<CollMsg> sums(uw);
      for (int k = 0; k < world; ++k) {
        if (k == rank) continue;
        auto& m = sums[static_cast<std::size_t>(k)];
        if (Status st = t.take(k, seq, 2, m, name); !st.ok()) return st;
        const auto [kb, ke] = reduce_slice(n, k, world);
        if (m.payload.size() != (ke - kb) * sizeof(float)) {
          return make_error(ErrorCode::io, who + ": rank " + std::to_string(k) + " sent " +
                                               std::to_string(m.payload.size()) +
                                               " bytes of reduced slice, expected " +
                                               std::to_string((ke - kb) * sizeof(float)) +
                                               " (protocol error)");
        }
      }
      // Everything arrived: only now write into the caller's buffer.
      for (int k = 0; k < world; ++k) {
        const auto [kb, ke] = reduce_slice(n, k, world);
        if (ke == kb) continue;
        const void* src = k == rank ? static_cast<const void*>(mine_sum.data())
                                    : static_cast<const void*>(sums[static_cast<std::size_t>(k)].payload.data());
        std::memcpy(call.recv + kb, src, (ke - kb) * sizeof(float));
      }
      return Status();
    }
  }
  return make_error(ErrorCode::internal, who + ": unknown collective");
}

}  // namespace shardline::comm::detail
