#include "comm/tls_identity.hpp"

#include "comm/crypto.hpp"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace shardline::comm {

void TlsIdentity::KeyFree::operator()(evp_pkey_st* p) const { EVP_PKEY_free(p); }
void TlsIdentity::CertFree::operator()(x509_st* p) const { X509_free(p); }

namespace {

struct ExtFree {
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};

Error openssl_error(const std::string& what) { return make_error(ErrorCode::internal, "TLS identity: " + what); }

/// Adds extension `nid` with value `value` ("critical,CA:TRUE") to `cert`.
bool add_extension(X509* cert, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, ExtFree> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value));
  return ext && X509_add_ext(cert, ext.get(), -1) == 1;
}

}  // namespace

Result<TlsIdentity> TlsIdentity::create(std::string_view seed, std::string_view common_name) {
  if (seed.size() != kSeedBytes)
    return make_error(ErrorCode::invalid_argument, "TLS identity: the seed is " + std::to_string(kSeedBytes) +
                                                       " bytes, got " + std::to_string(seed.size()));
  if (common_name.empty()) return make_error(ErrorCode::invalid_argument, "TLS identity: empty common name");

  TlsIdentity id;
  id.key_.reset(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr,
                                             reinterpret_cast<const unsigned char*>(seed.data()), seed.size()));
  if (!id.key_) return openssl_error("cannot make the Ed25519 key");
  id.certificate_.reset(X509_new());
  X509* cert = id.certificate_.get();
  if (!cert) return openssl_error("out of memory");
  const std::string cn(common_name);
  X509_NAME* name = X509_get_subject_name(cert);
  // Fixed fields only: every holder of the seed makes the same bytes.
  const bool built =
      X509_set_version(cert, 2) == 1 && ASN1_INTEGER_set(X509_get_serialNumber(cert), 1) == 1 &&
      ASN1_TIME_set_string_X509(X509_getm_notBefore(cert), "20000101000000Z") == 1 &&
      ASN1_TIME_set_string_X509(X509_getm_notAfter(cert), "99991231235959Z") == 1 &&
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1,
                                 -1, 0) == 1 &&
      X509_set_issuer_name(cert, name) == 1 && X509_set_pubkey(cert, id.key_.get()) == 1 &&
      add_extension(cert, NID_basic_constraints, "critical,CA:TRUE") &&
      add_extension(cert, NID_key_usage, "critical,digitalSignature,keyCertSign") &&
      add_extension(cert, NID_subject_key_identifier, "hash") &&
      // Ed25519 signs the message itself: no separate digest (RFC 8410 §6).
      X509_sign(cert, id.key_.get(), nullptr) > 0;
  if (!built) return openssl_error("cannot build the certificate");

  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  if (X509_digest(cert, EVP_sha256(), digest, &digest_len) != 1) return openssl_error("cannot hash the certificate");
  id.fingerprint_ = to_hex(std::string_view(reinterpret_cast<const char*>(digest), digest_len));
  return id;
}

std::string TlsIdentity::certificate_pem() const {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), certificate_.get()) != 1) return {};
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

}  // namespace shardline::comm
