#pragma once
/// \file
/// Internal to comm/ (the TCP backend, comm/tcp.hpp): the control messages
/// of the rendezvous and the handshake every connection of a TCP group
/// passes before it carries data.
///
/// A control message is a u32 length (1 .. 1 MiB) and a body whose first
/// byte is its type (Hs). Bodies are built with Writer and read with Reader
/// (u8 / u32 / u64 in host order, strings as u32 length + bytes).
///
/// Handshake (protocol version kProtocolVersion): the connecting side sends a
/// hello (magic, version, world size, both ranks, session id, whether it has
/// a key, a kNonceBytes random nonce, its listening address); the accepting
/// side checks it and answers a challenge (its own nonce and, when a key is
/// set, HMAC-SHA256(key, "shardline-tcp-v1 acceptor\0" | hello | nonce)); the
/// connecting side checks that MAC and answers a proof
/// (HMAC-SHA256(key, "shardline-tcp-v1 connector\0" | hello | nonce)); the
/// accepting side checks it and answers accept. Either side may answer a
/// reject instead (code + reason), which the other side reports as its error.

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "comm/tcp.hpp"
#include "comm/tcp_socket.hpp"
#include "common/result.hpp"

namespace shardline::comm::tcp_detail {

static_assert(std::endian::native == std::endian::little,
              "the TCP control messages are little-endian host order");

constexpr std::uint32_t kHelloMagic = 0x43544853;  // "SHTC"
constexpr std::uint32_t kProtocolVersion = 1;
constexpr std::size_t kNonceBytes = 32;
constexpr std::size_t kMaxHandshakeMessage = 1 << 20;
constexpr auto kHandshakeSlice = std::chrono::seconds(10);  ///< one connection's handshake

/// Control message types (the first byte of a body). kHello .. kAccept and
/// kReject: the handshake; kTable, kReady, kGo: the rendezvous.
enum Hs : std::uint8_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kAccept = 4,
  kReject = 5,
  kTable = 6,
  kReady = 7,
  kGo = 8,
};

/// Builds a control message body.
struct Writer {
  std::string b;
  Writer& u8(std::uint8_t v) {
    b.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(std::uint32_t v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& u64(std::uint64_t v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    b.append(s);
    return *this;
  }
};

/// Reads a control message body; a read past the end clears `ok` and
/// returns zeros / empty strings from then on.
struct Reader {
  std::string_view b;
  std::size_t pos = 0;
  bool ok = true;
  std::string_view take(std::size_t n) {
    if (!ok || b.size() - pos < n) {
      ok = false;
      return {};
    }
    auto s = b.substr(pos, n);
    pos += n;
    return s;
  }
  std::uint8_t u8() {
    auto s = take(1);
    return ok ? static_cast<std::uint8_t>(s[0]) : 0;
  }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    auto s = take(sizeof v);
    if (ok) std::memcpy(&v, s.data(), sizeof v);
    return v;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    auto s = take(sizeof v);
    if (ok) std::memcpy(&v, s.data(), sizeof v);
    return v;
  }
  std::string str() {
    const std::uint32_t n = u32();
    return std::string(take(n));
  }
};

/// Sends one control message (length + body).
[[nodiscard]] IoResult send_msg(int fd, const std::string& body, Clock::time_point deadline);
/// Receives one control message into `body` (never empty on success); a
/// length of 0 or over kMaxHandshakeMessage fails with error.
[[nodiscard]] IoResult recv_msg(int fd, Clock::time_point deadline, std::string& body);

/// Random bytes for nonces and session ids: comm::random_bytes (OpenSSL),
/// or, should it fail, a weaker clock-seeded source rather than
/// failing the rendezvous.
[[nodiscard]] std::string nonce_bytes(std::size_t n);

/// A reject body: code invalid_argument travels as such, any other as io.
[[nodiscard]] std::string reject_body(ErrorCode code, const std::string& reason);
/// A reject message as an Error: "<prefix>: <reason>".
[[nodiscard]] Error rejected(std::string_view body, const std::string& prefix);

/// A hello as the accepting side read it.
struct Hello {
  std::string body;  ///< as sent, for the MACs
  std::uint32_t world = 0;
  int from = -1;
  int to = -1;
  std::uint64_t session = 0;
  bool has_key = false;
  std::string listen_host;
  int listen_port = 0;
};

/// The connecting side (rank o.rank, to rank `to`): hello, check the
/// acceptor's proof, prove, await accept. `what` prefixes every error.
/// Errors: invalid_argument (wrong key, refused for the caller's fault), io.
[[nodiscard]] Status connector_handshake(int fd, const TcpOptions& o, int to, std::uint64_t session,
                                         int listen_port, Clock::time_point deadline,
                                         const std::string& what);

/// The accepting side. `check` vets a well-formed hello (returns a reason to
/// refuse, with its code). On failure the connection was refused; the Error
/// says why (naming the connecting host and rank).
[[nodiscard]] Result<Hello> acceptor_handshake(
    int fd, const TcpOptions& o, Clock::time_point deadline,
    const std::function<std::optional<Error>(const Hello&)>& check);

}  // namespace shardline::comm::tcp_detail
