#include "actors/replay_guard.hpp"

#include <atomic>
#include <charconv>

#include "comm/crypto.hpp"

namespace shardline::actors {

namespace {

constexpr std::size_t kNonceHex = 32;
constexpr std::size_t kMacHex = 64;

bool is_hex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

/// The process's nonce prefix: 8 random bytes, hex (16 digits).
const std::string& nonce_prefix() {
  static const std::string prefix = [] {
    auto r = comm::random_bytes(8);
    // Without a random generator, the pid and the clock still make process
    // prefixes differ in practice; uniqueness within a process is the counter's.
    if (!r) return comm::to_hex(std::to_string(unix_now_ms()).substr(0, 8));
    return comm::to_hex(*r);
  }();
  return prefix;
}

std::string next_nonce() {
  static std::atomic<std::uint64_t> counter{0};
  const std::uint64_t n = counter.fetch_add(1, std::memory_order_relaxed);
  char big_endian[8];
  for (int i = 0; i < 8; ++i) big_endian[i] = static_cast<char>(n >> (56 - 8 * i));
  return nonce_prefix() + comm::to_hex(std::string_view(big_endian, 8));
}

/// The MAC's hex for these fields.
std::string mac_of(const ClusterKey& key, std::string_view issued, std::string_view nonce, std::string_view bytes) {
  return comm::to_hex(comm::hmac_sha256(key.message_tag_key(), {issued, ".", nonce, ".", bytes}));
}

struct ParsedTag {
  std::int64_t issued_ms = 0;
  std::string_view issued, nonce, mac;
};

bool parse(std::string_view tag, ParsedTag& out) {
  const std::size_t a = tag.find('.');
  if (a == std::string_view::npos || a == 0 || a > 19) return false;
  const std::size_t b = tag.find('.', a + 1);
  if (b == std::string_view::npos) return false;
  out.issued = tag.substr(0, a);
  out.nonce = tag.substr(a + 1, b - a - 1);
  out.mac = tag.substr(b + 1);
  if (out.nonce.size() != kNonceHex || out.mac.size() != kMacHex || !is_hex(out.nonce) || !is_hex(out.mac))
    return false;
  const auto [end, ec] = std::from_chars(out.issued.data(), out.issued.data() + out.issued.size(), out.issued_ms);
  return ec == std::errc() && end == out.issued.data() + out.issued.size() && out.issued_ms >= 0;
}

}  // namespace

std::int64_t unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string make_message_tag(const ClusterKey& key, std::string_view bytes, std::int64_t issued_ms,
                             std::string_view nonce) {
  const std::string issued = std::to_string(issued_ms);
  return issued + "." + std::string(nonce) + "." + mac_of(key, issued, nonce, bytes);
}

std::string make_message_tag(const ClusterKey& key, std::string_view bytes) {
  return make_message_tag(key, bytes, unix_now_ms(), next_nonce());
}

bool message_tag_is_authentic(const ClusterKey& key, std::string_view tag, std::string_view bytes) {
  ParsedTag t;
  return parse(tag, t) && comm::mac_equal(t.mac, mac_of(key, t.issued, t.nonce, bytes));
}

ReplayGuard::Verdict ReplayGuard::admit(const ClusterKey& key, std::string_view tag, std::string_view bytes,
                                        std::int64_t now_ms) {
  ParsedTag t;
  if (!parse(tag, t) || !comm::mac_equal(t.mac, mac_of(key, t.issued, t.nonce, bytes))) return Verdict::bad_tag;
  forget_before(now_ms - window_ms_);
  if (t.issued_ms < now_ms - window_ms_ || t.issued_ms > now_ms + window_ms_) return Verdict::expired;
  std::string nonce(t.nonce);
  if (!seen_.insert(nonce).second) return Verdict::replayed;
  by_time_.emplace(t.issued_ms, std::move(nonce));
  return Verdict::accepted;
}

void ReplayGuard::forget_before(std::int64_t issued_ms) {
  while (!by_time_.empty() && by_time_.begin()->first < issued_ms) {
    seen_.erase(by_time_.begin()->second);
    by_time_.erase(by_time_.begin());
  }
}

namespace {
std::string reply_seal(const ClusterKey& key, std::string_view request_tag, std::string_view bytes) {
  return comm::to_hex(comm::hmac_sha256(key.reply_seal_key(), {request_tag, ".", bytes}));
}
}  // namespace

std::string seal_reply(const ClusterKey& key, std::string_view request_tag, std::string_view bytes) {
  if (bytes.empty()) return {};
  std::string out = reply_seal(key, request_tag, bytes);
  out.append(bytes);
  return out;
}

Result<std::string_view> open_reply(const ClusterKey& key, std::string_view request_tag, std::string_view reply) {
  if (reply.size() <= kReplySealHex)
    return make_error(ErrorCode::invalid_argument, "unauthenticated reply: " + std::to_string(reply.size()) +
                                                       " bytes, too short to carry a seal");
  const std::string_view seal = reply.substr(0, kReplySealHex);
  const std::string_view bytes = reply.substr(kReplySealHex);
  if (!comm::mac_equal(seal, reply_seal(key, request_tag, bytes)))
    return make_error(ErrorCode::invalid_argument,
                      "unauthenticated reply: its seal does not verify (not from a holder of the cluster key, or "
                      "not a reply to this request)");
  return bytes;
}

const char* verdict_name(ReplayGuard::Verdict v) {
  switch (v) {
    case ReplayGuard::Verdict::accepted:
      return "accepted";
    case ReplayGuard::Verdict::bad_tag:
      return "bad_tag";
    case ReplayGuard::Verdict::expired:
      return "expired";
    case ReplayGuard::Verdict::replayed:
      return "replayed";
  }
  return "?";
}

}  // namespace shardline::actors
