#include "actors/auth.hpp"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "comm/crypto.hpp"

namespace shardline::actors {

namespace {

constexpr std::size_t kSecretBytes = 32;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<ClusterKey> ClusterKey::generate() {
  Result<std::string> secret = comm::random_bytes(kSecretBytes);
  if (!secret) return make_error(secret.error().code, "cluster key: " + secret.error().message);
  ClusterKey k;
  k.set_secret(std::move(secret).value());
  return k;
}

Result<ClusterKey> ClusterKey::load(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return make_error(ErrorCode::not_found, file.string() + ": cluster key file not found");
  std::string hex;
  std::getline(in, hex);
  while (!hex.empty() && (hex.back() == '\r' || hex.back() == ' ')) hex.pop_back();
  if (hex.size() != 2 * kSecretBytes)
    return make_error(ErrorCode::corrupt, file.string() + ": a cluster key is 64 hex digits, found " +
                                              std::to_string(hex.size()) + " characters");
  std::string secret(kSecretBytes, '\0');
  for (std::size_t i = 0; i < kSecretBytes; ++i) {
    const int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return make_error(ErrorCode::corrupt, file.string() + ": cluster key is not hex");
    secret[i] = static_cast<char>(hi * 16 + lo);
  }
  ClusterKey k;
  k.set_secret(std::move(secret));
  return k;
}

Status ClusterKey::save(const std::filesystem::path& file) const {
  if (std::filesystem::exists(file))
    return make_error(ErrorCode::invalid_argument, file.string() + ": exists; not overwriting a cluster key");
  if (file.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
  }
  {
    std::ofstream out(file);
    if (!out) return make_error(ErrorCode::io, file.string() + ": cannot write the cluster key");
    out << comm::to_hex(secret_) << "\n";
    if (!out) return make_error(ErrorCode::io, file.string() + ": write failed");
  }
  if (::chmod(file.c_str(), 0600) != 0)
    return make_error(ErrorCode::io, file.string() + ": cannot set mode 0600");
  return Status::ok_status();
}

std::string ClusterKey::sign(std::string_view message) const {
  return comm::to_hex(comm::hmac_sha256(secret_, message));
}

void ClusterKey::set_secret(std::string secret) {
  secret_ = std::move(secret);
  message_tag_key_ = derive("shardline message tag v1");
  reply_seal_key_ = derive("shardline reply seal v1");
}

std::string ClusterKey::derive(std::string_view label) const { return comm::hmac_sha256(secret_, label); }

bool ClusterKey::verify(std::string_view message, std::string_view tag) const {
  return comm::mac_equal(tag, sign(message));
}

}  // namespace shardline::actors
