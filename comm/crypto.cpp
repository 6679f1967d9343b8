#include "comm/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <climits>

namespace shardline::comm {

Result<std::string> random_bytes(std::size_t n) {
  if (n > static_cast<std::size_t>(INT_MAX)) {
    return make_error(ErrorCode::invalid_argument,
                      "random_bytes: " + std::to_string(n) + " bytes is more than one call may ask");
  }
  std::string s(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1) {
    return make_error(ErrorCode::internal, "the random generator failed");
  }
  return s;
}

std::string hmac_sha256(std::string_view key, std::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // HMAC() takes the key length as an int: a longer key would be truncated,
  // so refuse it (keys here are a few dozen bytes).
  if (key.size() > static_cast<std::size_t>(INT_MAX)) return {};
  const char* key_bytes = key.empty() ? "" : key.data();  // never null: null means "reuse"
  if (!HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len)) {
    return {};
  }
  return std::string(reinterpret_cast<const char*>(mac), len);
}

std::string hmac_sha256(std::string_view key, std::initializer_list<std::string_view> parts) {
  // EVP_MAC (OpenSSL 3): the HMAC implementation is fetched once.
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (!hmac) return {};
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac);
  if (!ctx) return {};
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
  const unsigned char empty = 0;
  const auto* key_bytes = key.empty() ? &empty : reinterpret_cast<const unsigned char*>(key.data());
  bool ok = EVP_MAC_init(ctx, key_bytes, key.size(), params) == 1;
  for (std::string_view part : parts)
    if (ok && !part.empty()) ok = EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(part.data()), part.size()) == 1;
  unsigned char mac[EVP_MAX_MD_SIZE];
  std::size_t len = 0;
  if (ok) ok = EVP_MAC_final(ctx, mac, &len, sizeof(mac)) == 1;
  EVP_MAC_CTX_free(ctx);
  if (!ok) return {};
  return std::string(reinterpret_cast<const char*>(mac), len);
}

std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * bytes.size(), '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    out[2 * i] = digits[c >> 4];
    out[2 * i + 1] = digits[c & 15];
  }
  return out;
}

bool mac_equal(std::string_view a, std::string_view b) noexcept {
  return !a.empty() && a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ != nullptr && EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    ctx_ = nullptr;
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(std::string_view bytes) {
  if (ctx_ == nullptr || bytes.empty()) return;
  if (EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size()) != 1) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    ctx_ = nullptr;
  }
}

std::string Sha256::finish() {
  if (ctx_ == nullptr) return {};
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const bool ok = EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len) == 1;
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
  ctx_ = nullptr;
  return ok ? std::string(reinterpret_cast<const char*>(digest), len) : std::string();
}

}  // namespace shardline::comm
