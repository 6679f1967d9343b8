#pragma once
/// \file
/// Cluster authentication. `shardline cluster init` writes a key file holding
/// a random 256-bit secret (hex, file mode 0600). Every message between nodes
/// and every remote command carries an HMAC-SHA256 tag under the secret; the
/// receiving actor verifies it before decoding and answers an
/// "unauthenticated" error (and logs the sender) when it does not match.
/// Before any message, every connection is mutual TLS with a key derived
/// from this one (actors/cluster_tls.hpp), so a peer without the secret
/// cannot connect at all. Message tags add a signing time and a nonce so
/// that each is valid once (actors/replay_guard.hpp).

#include <filesystem>
#include <string>
#include <string_view>

#include "common/result.hpp"

namespace shardline::actors {

/// A cluster secret (32 random bytes).
class ClusterKey {
 public:
  /// Generates a new random key (comm::random_bytes: OpenSSL RAND_bytes).
  /// Errors: internal (the random generator failed).
  [[nodiscard]] static Result<ClusterKey> generate();
  /// Reads a key file (64 hex digits, optional trailing newline).
  /// Errors: not_found, corrupt (wrong length or non-hex; names the file).
  [[nodiscard]] static Result<ClusterKey> load(const std::filesystem::path& file);
  /// Writes the key as hex with mode 0600; refuses to overwrite an existing
  /// file. Errors: invalid_argument (exists), io.
  [[nodiscard]] Status save(const std::filesystem::path& file) const;

  /// HMAC-SHA256 of `message` (comm::hmac_sha256), as 64 hex digits.
  [[nodiscard]] std::string sign(std::string_view message) const;
  /// Constant-time comparison of `tag` with sign(message) (comm::mac_equal;
  /// an empty tag never verifies).
  [[nodiscard]] bool verify(std::string_view message, std::string_view tag) const;
  /// A key for another purpose: HMAC-SHA256(secret, label), 32 raw bytes
  /// (the HKDF-Expand step of RFC 5869 with one block). Different labels
  /// give independent keys, and none reveals the secret. Labels in use:
  /// "shardline node tls v1" (actors/cluster_tls.hpp), and the two below.
  [[nodiscard]] std::string derive(std::string_view label) const;
  /// derive("shardline message tag v1") and derive("shardline reply seal
  /// v1"), computed once with the key: the MAC keys of every message's tag
  /// and every reply's seal (actors/replay_guard.hpp).
  [[nodiscard]] const std::string& message_tag_key() const { return message_tag_key_; }
  [[nodiscard]] const std::string& reply_seal_key() const { return reply_seal_key_; }

 private:
  /// Sets the secret and the keys derived from it.
  void set_secret(std::string secret);
  std::string secret_;  // 32 raw bytes
  std::string message_tag_key_;
  std::string reply_seal_key_;
};

}  // namespace shardline::actors
