// comm/crypto.hpp: HMAC-SHA256 against the RFC 4231 test vectors, SHA-256
// against FIPS 180-2's, the MAC comparison, and random bytes.
#include "comm/crypto.hpp"

#include <gtest/gtest.h>

#include <string>

namespace shardline::comm {
namespace comm_crypto_test {

TEST(Crypto, ToHexIsTwoLowerCaseDigitsPerByte) {
  EXPECT_EQ(to_hex(std::string("\x00\x0f\xa0\xff", 4)), "000fa0ff");
  EXPECT_EQ(to_hex(""), "");
}

TEST(Crypto, HmacSha256OfPartsIsTheHmacOfTheirConcatenation) {
  // RFC 4231 section 4.3, test case 2, in three parts (one empty).
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", {"what do ya", "", " want for nothing?"})),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::string big(1 << 20, 'x');
  EXPECT_EQ(hmac_sha256("k", {"head.", big}), hmac_sha256("k", "head." + big));
  EXPECT_EQ(hmac_sha256("", {"a", "b"}), hmac_sha256("", "ab"));
  EXPECT_NE(hmac_sha256("k", {"ab", "c"}), hmac_sha256("k", "abd"));
}

TEST(Crypto, Sha256MatchesFips180VectorsInPieces) {
  // FIPS 180-2 appendix B.1 ("abc") and B.2 (the 448-bit message), fed in pieces.
  Sha256 abc;
  abc.update("a");
  abc.update("");
  abc.update("bc");
  EXPECT_EQ(to_hex(abc.finish()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(abc.finish(), "");  // ended
  Sha256 two_blocks;
  two_blocks.update("abcdbcdecdefdefgefghfghighijhijkijkl");
  two_blocks.update("jklmklmnlmnomnopnopq");
  EXPECT_EQ(to_hex(two_blocks.finish()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 empty;
  EXPECT_EQ(to_hex(empty.finish()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Crypto, HmacSha256MatchesRfc4231) {
  // RFC 4231 section 4.2, test case 1.
  EXPECT_EQ(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than SHA-256's block, hashed first.
  EXPECT_EQ(to_hex(hmac_sha256(std::string(131, '\xaa'),
                            "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hmac_sha256("key", "data").size(), kHmacSha256Bytes);
}

TEST(Crypto, HmacSha256OfAnEmptyKeyAndMessage) {
  EXPECT_EQ(to_hex(hmac_sha256("", "")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST(Crypto, HmacSha256TakesEveryByteOfKeyAndData) {
  const std::string key("k\0y", 3), data("d\0ta", 4);
  const std::string mac = hmac_sha256(key, data);
  EXPECT_NE(mac, hmac_sha256(std::string("k\0z", 3), data));
  EXPECT_NE(mac, hmac_sha256(key, std::string("d\0tb", 4)));
  EXPECT_NE(mac, hmac_sha256("k", data));  // a C-string view would stop at the NUL
}

TEST(Crypto, MacEqual) {
  const std::string mac = hmac_sha256("key", "data");
  EXPECT_TRUE(mac_equal(mac, hmac_sha256("key", "data")));
  std::string last = mac;
  last.back() = static_cast<char>(last.back() ^ 1);
  EXPECT_FALSE(mac_equal(mac, last));
  std::string first = mac;
  first.front() = static_cast<char>(first.front() ^ 0x80);
  EXPECT_FALSE(mac_equal(mac, first));
  EXPECT_FALSE(mac_equal(mac, mac.substr(0, mac.size() - 1)));  // a prefix is no match
  EXPECT_FALSE(mac_equal(mac.substr(0, mac.size() - 1), mac));
  EXPECT_FALSE(mac_equal("", ""));                                // an empty MAC never verifies
  EXPECT_FALSE(mac_equal(mac, ""));
}

TEST(Crypto, RandomBytes) {
  auto a = random_bytes(32);
  auto b = random_bytes(32);
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  EXPECT_EQ(a->size(), 32u);
  EXPECT_NE(*a, *b);  // 2^-256 to fail by chance
  EXPECT_NE(*a, std::string(32, '\0'));
  auto none = random_bytes(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace shardline::comm
