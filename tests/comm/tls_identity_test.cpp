// comm/tls_identity.hpp against the `openssl` command line tool: the key is
// RFC 8032's Ed25519 key for the seed (test vector 1), the certificate is the
// same bytes for the same seed (its fingerprint is what `openssl x509
// -fingerprint -sha256` prints), it verifies as its own CA, and a
// certificate of another seed does not verify against it.
#include "comm/tls_identity.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>

#include "tests/support/process.hpp"

namespace shardline::comm {
namespace comm_tls_identity_test {

using testing_support::run_command;
using TlsIdentityTest = testing_support::TempDirTest;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

/// Lower-case hex digits of `text` with everything else dropped.
std::string hex_digits(const std::string& text) {
  std::string out;
  for (char c : text)
    if (std::isxdigit(static_cast<unsigned char>(c))) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// RFC 8032 §7.1, TEST 1.
const std::string kSeed = from_hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60");
const std::string kPublicKey = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

TEST_F(TlsIdentityTest, IsTheRfc8032KeyInASelfSignedCertificateTheOpensslToolAccepts) {
  auto id = TlsIdentity::create(kSeed, "shardline cluster");
  ASSERT_TRUE(id) << id.error().message;
  const std::string pem = id->certificate_pem();
  ASSERT_EQ(pem.rfind("-----BEGIN CERTIFICATE-----", 0), 0u) << pem;
  std::ofstream(path("cert.pem")) << pem;

  const auto text = run_command("openssl x509 -noout -text -in " + path("cert.pem"));
  ASSERT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("ED25519"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("CN = shardline cluster"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("CA:TRUE"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("Not After : Dec 31 23:59:59 9999 GMT"), std::string::npos) << text.out;
  const std::size_t pub = text.out.find("pub:");
  ASSERT_NE(pub, std::string::npos) << text.out;
  const std::size_t pub_end = text.out.find("X509v3", pub);
  ASSERT_NE(pub_end, std::string::npos) << text.out;
  EXPECT_EQ(hex_digits(text.out.substr(pub + 4, pub_end - pub - 4)), kPublicKey) << text.out;

  const auto fingerprint = run_command("openssl x509 -noout -fingerprint -sha256 -in " + path("cert.pem"));
  ASSERT_EQ(fingerprint.exit_code, 0) << fingerprint.out;
  const std::size_t eq = fingerprint.out.find('=');
  ASSERT_NE(eq, std::string::npos) << fingerprint.out;
  EXPECT_EQ(hex_digits(fingerprint.out.substr(eq + 1)), id->fingerprint_sha256());

  const auto verify = run_command("openssl verify -CAfile " + path("cert.pem") + " " + path("cert.pem"));
  EXPECT_EQ(verify.exit_code, 0) << verify.out;
  EXPECT_NE(verify.out.find(": OK"), std::string::npos) << verify.out;
}

TEST_F(TlsIdentityTest, SameSeedSameBytesAnotherSeedDoesNotVerify) {
  auto a = TlsIdentity::create(kSeed, "shardline cluster");
  auto b = TlsIdentity::create(kSeed, "shardline cluster");
  std::string other_seed = kSeed;
  other_seed[0] ^= 1;
  auto c = TlsIdentity::create(other_seed, "shardline cluster");
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->certificate_pem(), b->certificate_pem());
  EXPECT_EQ(a->fingerprint_sha256(), b->fingerprint_sha256());
  EXPECT_EQ(a->fingerprint_sha256().size(), 64u);
  EXPECT_NE(a->certificate_pem(), c->certificate_pem());
  EXPECT_NE(a->fingerprint_sha256(), c->fingerprint_sha256());
  // Same subject, another key: the signature does not verify.
  std::ofstream(path("a.pem")) << a->certificate_pem();
  std::ofstream(path("c.pem")) << c->certificate_pem();
  const auto verify = run_command("openssl verify -CAfile " + path("a.pem") + " " + path("c.pem"));
  EXPECT_NE(verify.exit_code, 0) << verify.out;
}

TEST(TlsIdentity, BadSeedOrNameIsAnInvalidArgument) {
  auto short_seed = TlsIdentity::create(kSeed.substr(0, 31), "shardline cluster");
  ASSERT_FALSE(short_seed);
  EXPECT_EQ(short_seed.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(short_seed.error().message.find("32 bytes, got 31"), std::string::npos) << short_seed.error().message;
  auto no_name = TlsIdentity::create(kSeed, "");
  ASSERT_FALSE(no_name);
  EXPECT_EQ(no_name.error().code, ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace shardline::comm
