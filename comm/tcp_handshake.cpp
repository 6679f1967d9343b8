#include "comm/tcp_handshake.hpp"

#include <cstdint>

#include "comm/crypto.hpp"

namespace shardline::comm::tcp_detail {

IoResult send_msg(int fd, const std::string& body, Clock::time_point deadline) {
  Writer w;
  w.u32(static_cast<std::uint32_t>(body.size()));
  w.b += body;
  return write_all(fd, w.b.data(), w.b.size(), deadline);
}

IoResult recv_msg(int fd, Clock::time_point deadline, std::string& body) {
  std::uint32_t n = 0;
  if (IoResult r = read_all(fd, &n, sizeof n, deadline); !r.ok()) return r;
  if (n == 0 || n > kMaxHandshakeMessage) {
    return io_fail(IoFail::error, "bad handshake message length " + std::to_string(n) +
                                      " (not a Shardline TCP peer?)");
  }
  body.assign(n, '\0');
  return read_all(fd, body.data(), n, deadline);
}

std::string nonce_bytes(std::size_t n) {
  Result<std::string> r = random_bytes(n);
  if (r.ok()) return std::move(r).value();
  // Fall back to a weaker source rather than failing the rendezvous.
  std::string s(n, '\0');
  std::uint64_t x = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^
                    reinterpret_cast<std::uintptr_t>(&s);
  for (auto& c : s) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(x >> 56);
  }
  return s;
}

namespace {

/// HMAC-SHA256(key, label | '\0' | hello | nonce); empty if OpenSSL fails.
std::string hmac(const std::string& key, std::string_view label, std::string_view hello,
                 std::string_view nonce) {
  std::string data;
  data.reserve(label.size() + 1 + hello.size() + nonce.size());
  data.append(label).push_back('\0');
  data.append(hello).append(nonce);
  return hmac_sha256(key, data);
}

}  // namespace

std::string reject_body(ErrorCode code, const std::string& reason) {
  return Writer()
      .u8(kReject)
      .u8(code == ErrorCode::invalid_argument ? 1 : 0)
      .str(reason)
      .b;
}

/// A reject message as an Error: "<prefix>: <reason>".
Error rejected(std::string_view body, const std::string& prefix) {
  Reader r{body};
  r.u8();
  const std::uint8_t code = r.u8();
  const std::string reason = r.str();
  return make_error(code == 1 ? ErrorCode::invalid_argument : ErrorCode::io,
                    prefix + ": " + (r.ok ? reason : "refused"));
}

/// The connecting side: hello, check the acceptor's proof, prove, await accept.
Status connector_handshake(int fd, const TcpOptions& o, int to, std::uint64_t session,
                           int listen_port, Clock::time_point deadline, const std::string& what) {
  const std::string nonce = nonce_bytes(kNonceBytes);
  const std::string hello = Writer()
                                .u8(kHello)
                                .u32(kHelloMagic)
                                .u32(kProtocolVersion)
                                .u32(static_cast<std::uint32_t>(o.world_size))
                                .u32(static_cast<std::uint32_t>(o.rank))
                                .u32(static_cast<std::uint32_t>(to))
                                .u64(session)
                                .u8(o.key.empty() ? 0 : 1)
                                .str(nonce)
                                .str(o.listen_host)
                                .u32(static_cast<std::uint32_t>(listen_port))
                                .b;
  auto fail = [&](const IoResult& r) {
    return make_error(ErrorCode::io, what + ": " + (r.fail == IoFail::timeout ? "timed out" : r.text));
  };
  if (IoResult r = send_msg(fd, hello, deadline); !r.ok()) return fail(r);
  std::string m;
  if (IoResult r = recv_msg(fd, deadline, m); !r.ok()) return fail(r);
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, what + ": refused");
  Reader rd{m};
  rd.u8();
  const std::string peer_nonce = rd.str();
  const std::string peer_mac = rd.str();
  if (!rd.ok || static_cast<std::uint8_t>(m[0]) != kChallenge) {
    return make_error(ErrorCode::io, what + ": protocol error (expected a challenge)");
  }
  std::string proof;
  if (!o.key.empty()) {
    if (!mac_equal(peer_mac, hmac(o.key, "shardline-tcp-v1 acceptor", hello, peer_nonce))) {
      const std::string reason = "wrong key: rank " + std::to_string(o.rank) +
                                 " and rank " + std::to_string(to) + " hold different keys";
      (void)send_msg(fd, reject_body(ErrorCode::invalid_argument, reason), deadline);
      return make_error(ErrorCode::invalid_argument,
                        what + ": wrong key: rank " + std::to_string(to) +
                            " could not prove knowledge of this rank's key (the keys differ)");
    }
    proof = hmac(o.key, "shardline-tcp-v1 connector", hello, peer_nonce);
  }
  if (IoResult r = send_msg(fd, Writer().u8(kProof).str(proof).b, deadline); !r.ok()) return fail(r);
  if (IoResult r = recv_msg(fd, deadline, m); !r.ok()) return fail(r);
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, what + ": refused");
  if (static_cast<std::uint8_t>(m[0]) != kAccept) {
    return make_error(ErrorCode::io, what + ": protocol error (expected accept)");
  }
  return Status();
}

/// The accepting side. `check` vets the hello (returns a reason to refuse,
/// with its code). On failure the connection was refused; the Error says why.
Result<Hello> acceptor_handshake(
    int fd, const TcpOptions& o, Clock::time_point deadline,
    const std::function<std::optional<Error>(const Hello&)>& check) {
  const std::string from_host = peer_host(fd);
  auto fail = [&](const IoResult& r) {
    return make_error(ErrorCode::io, "connection from " + from_host + ": " +
                                         (r.fail == IoFail::timeout ? "handshake timed out" : r.text));
  };
  std::string m;
  if (IoResult r = recv_msg(fd, deadline, m); !r.ok()) return fail(r);
  Hello h;
  h.body = m;
  Reader rd{m};
  const std::uint8_t type = rd.u8();
  const std::uint32_t magic = rd.u32();
  const std::uint32_t version = rd.u32();
  h.world = rd.u32();
  h.from = static_cast<int>(rd.u32());
  h.to = static_cast<int>(rd.u32());
  h.session = rd.u64();
  h.has_key = rd.u8() != 0;
  const std::string nonce = rd.str();
  h.listen_host = rd.str();
  h.listen_port = static_cast<int>(rd.u32());
  const std::string who = "connection from " + from_host +
                          (rd.ok ? " (rank " + std::to_string(h.from) + ")" : std::string());
  auto refuse = [&](ErrorCode code, const std::string& reason) {
    (void)send_msg(fd, reject_body(code, reason), deadline);
    return make_error(code, who + ": " + reason);
  };
  if (!rd.ok || type != kHello || magic != kHelloMagic) {
    return refuse(ErrorCode::io, "not a Shardline TCP hello");
  }
  if (version != kProtocolVersion) {
    return refuse(ErrorCode::invalid_argument,
                  "protocol version " + std::to_string(version) + ", rank " +
                      std::to_string(o.rank) + " speaks " + std::to_string(kProtocolVersion));
  }
  if (h.world != static_cast<std::uint32_t>(o.world_size)) {
    return refuse(ErrorCode::invalid_argument,
                  "world size " + std::to_string(h.world) + " disagrees with rank " +
                      std::to_string(o.rank) + "'s " + std::to_string(o.world_size));
  }
  if (h.to != o.rank) {
    return refuse(ErrorCode::invalid_argument, "addressed to rank " + std::to_string(h.to) +
                                                   " but reached rank " + std::to_string(o.rank));
  }
  if (h.has_key != !o.key.empty()) {
    return refuse(ErrorCode::invalid_argument,
                  "wrong key: rank " + std::to_string(h.from) +
                      (h.has_key ? " has a key but rank " + std::to_string(o.rank) + " has none"
                                 : " has no key but rank " + std::to_string(o.rank) + " requires one"));
  }
  if (auto bad = check(h)) return refuse(bad->code, bad->message);

  const std::string my_nonce = nonce_bytes(kNonceBytes);
  const std::string my_mac =
      o.key.empty() ? std::string() : hmac(o.key, "shardline-tcp-v1 acceptor", h.body, my_nonce);
  if (IoResult r = send_msg(fd, Writer().u8(kChallenge).str(my_nonce).str(my_mac).b, deadline);
      !r.ok()) {
    return fail(r);
  }
  if (IoResult r = recv_msg(fd, deadline, m); !r.ok()) return fail(r);
  if (static_cast<std::uint8_t>(m[0]) == kReject) return rejected(m, who + ": gave up");
  Reader pr{m};
  pr.u8();
  const std::string proof = pr.str();
  if (!pr.ok || static_cast<std::uint8_t>(m[0]) != kProof) {
    return refuse(ErrorCode::io, "protocol error (expected a proof)");
  }
  if (!o.key.empty() &&
      !mac_equal(proof, hmac(o.key, "shardline-tcp-v1 connector", h.body, my_nonce))) {
    return refuse(ErrorCode::invalid_argument,
                  "wrong key: rank " + std::to_string(h.from) + " could not prove knowledge of rank " +
                      std::to_string(o.rank) + "'s key (the keys differ)");
  }
  if (IoResult r = send_msg(fd, Writer().u8(kAccept).b, deadline); !r.ok()) return fail(r);
  (void)nonce;
  return h;
}

}  // namespace shardline::comm::tcp_detail
