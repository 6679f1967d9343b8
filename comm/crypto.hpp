#pragma once
/// \file
/// The few cryptographic primitives Shardline uses, on OpenSSL (libcrypto):
/// random bytes, HMAC-SHA256, SHA-256 and a constant-time MAC comparison. Used by the
/// TCP handshake (comm/tcp_handshake.cpp) and the cluster key
/// (actors/auth.hpp). Keys and MACs are raw bytes in std::string.

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

#include "common/result.hpp"

namespace shardline::comm {

/// Bytes of an HMAC-SHA256 MAC.
inline constexpr std::size_t kHmacSha256Bytes = 32;

/// `n` bytes from OpenSSL's CSPRNG (RAND_bytes).
/// Errors: internal ("the random generator failed"), invalid_argument (n
/// over INT_MAX).
[[nodiscard]] Result<std::string> random_bytes(std::size_t n);

/// HMAC-SHA256(key, data): kHmacSha256Bytes raw bytes. Any key length
/// (RFC 2104). Empty only if OpenSSL fails (out of memory); mac_equal never
/// accepts an empty MAC.
[[nodiscard]] std::string hmac_sha256(std::string_view key, std::string_view data);

/// HMAC-SHA256(key, parts[0] || parts[1] || ...) without joining the parts
/// (a KV chunk may be megabytes): what hmac_sha256 gives for their
/// concatenation. Empty only if OpenSSL fails.
[[nodiscard]] std::string hmac_sha256(std::string_view key, std::initializer_list<std::string_view> parts);

/// A running SHA-256 (OpenSSL EVP), for hashing data that arrives in
/// pieces (files, read block by block).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  /// Adds `bytes` to the hash.
  void update(std::string_view bytes);
  /// The 32-byte digest of everything added; ends the hash (a later update
  /// or finish is an error: empty). Empty if OpenSSL failed.
  [[nodiscard]] std::string finish();

 private:
  void* ctx_;  ///< EVP_MD_CTX*; null after finish() or a failure
};

/// `bytes` as lower-case hex digits (two per byte).
[[nodiscard]] std::string to_hex(std::string_view bytes);

/// Whether two MACs are equal, in time independent of where they differ
/// (CRYPTO_memcmp; the lengths are compared first, they are not secret).
/// False when either is empty.
[[nodiscard]] bool mac_equal(std::string_view a, std::string_view b) noexcept;

}  // namespace shardline::comm
