// Cluster key files and message authentication.
#include "actors/auth.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace shardline::actors {
namespace actors_auth_test {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("shardline_auth_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(ClusterKey, SaveLoadRoundTripWithPrivateMode) {
  const fs::path dir = temp_dir("roundtrip");
  auto key = ClusterKey::generate();
  ASSERT_TRUE(key.ok());
  ASSERT_TRUE(key->save(dir / "cluster.key").ok());
  struct stat st{};
  ASSERT_EQ(::stat((dir / "cluster.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto loaded = ClusterKey::load(dir / "cluster.key");
  ASSERT_TRUE(loaded.ok()) << loaded.error().to_string();
  EXPECT_EQ(loaded->sign("job submit"), key->sign("job submit"));
  // Never overwrites a key.
  const Status again = key->save(dir / "cluster.key");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::invalid_argument);
  fs::remove_all(dir);
}

TEST(ClusterKey, VerifyAcceptsOnlyTheRightKeyAndMessage) {
  auto a = ClusterKey::generate();
  auto b = ClusterKey::generate();
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string tag = a->sign("payload");
  EXPECT_EQ(tag.size(), 64u);
  EXPECT_TRUE(a->verify("payload", tag));
  EXPECT_FALSE(b->verify("payload", tag));       // wrong secret
  EXPECT_FALSE(a->verify("payload!", tag));      // tampered message
  EXPECT_FALSE(a->verify("payload", ""));        // missing tag
  EXPECT_FALSE(a->verify("payload", tag.substr(1) + "0"));
}

TEST(ClusterKey, BadKeyFilesAreClearErrors) {
  const fs::path dir = temp_dir("bad");
  auto missing = ClusterKey::load(dir / "nope.key");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
  EXPECT_NE(missing.error().message.find("nope.key"), std::string::npos);
  std::ofstream(dir / "short.key") << "abcd\n";
  auto short_key = ClusterKey::load(dir / "short.key");
  ASSERT_FALSE(short_key.ok());
  EXPECT_EQ(short_key.error().code, ErrorCode::corrupt);
  std::ofstream(dir / "nothex.key") << std::string(64, 'z') << "\n";
  auto not_hex = ClusterKey::load(dir / "nothex.key");
  ASSERT_FALSE(not_hex.ok());
  EXPECT_EQ(not_hex.error().code, ErrorCode::corrupt);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardline::actors
