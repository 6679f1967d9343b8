#pragma once
/// \file
/// A TLS identity every holder of one secret derives alike: an Ed25519 key
/// whose 32-byte private key is the seed, and a self-signed X.509 v3
/// certificate over it with fixed fields (serial 1, valid 2000-01-01 to
/// 9999-12-31, subject = issuer = `common_name`, CA:TRUE). Ed25519
/// signatures are deterministic (RFC 8032 §5.1.6), so two processes given
/// the same seed make byte-identical certificates. Used as both the
/// certificate and the only trusted CA, it makes mutual TLS between holders
/// of the seed: a peer without it can present no certificate that verifies
/// and cannot complete the handshake (actors/cluster_tls.hpp: the node port).
///
/// Kept in memory only (never written to a file): it is worth as much as the
/// seed, and a file would outlive a killed process.

#include <memory>
#include <string>
#include <string_view>

#include "common/result.hpp"

struct evp_pkey_st;  // OpenSSL EVP_PKEY
struct x509_st;      // OpenSSL X509

namespace shardline::comm {

class TlsIdentity {
 public:
  /// Bytes of the seed (an Ed25519 private key, RFC 8032 §5.1.5).
  static constexpr std::size_t kSeedBytes = 32;

  /// Derives the key and certificate from `seed`.
  /// Errors: invalid_argument (seed not kSeedBytes, empty common_name),
  /// internal (OpenSSL).
  [[nodiscard]] static Result<TlsIdentity> create(std::string_view seed, std::string_view common_name);

  /// The private key (EVP_PKEY*) and the certificate (X509*), owned by this
  /// object; OpenSSL's setters (SSL_CTX_use_certificate, ...) take their own
  /// references.
  [[nodiscard]] evp_pkey_st* key() const { return key_.get(); }
  [[nodiscard]] x509_st* certificate() const { return certificate_.get(); }
  /// The certificate in PEM.
  [[nodiscard]] std::string certificate_pem() const;
  /// SHA-256 of the certificate's DER bytes, as 64 hex digits (what
  /// `openssl x509 -fingerprint -sha256` prints, without the colons).
  [[nodiscard]] const std::string& fingerprint_sha256() const { return fingerprint_; }

 private:
  struct KeyFree {
    void operator()(evp_pkey_st* p) const;
  };
  struct CertFree {
    void operator()(x509_st* p) const;
  };
  TlsIdentity() = default;
  std::unique_ptr<evp_pkey_st, KeyFree> key_;
  std::unique_ptr<x509_st, CertFree> certificate_;
  std::string fingerprint_;
};

}  // namespace shardline::comm
