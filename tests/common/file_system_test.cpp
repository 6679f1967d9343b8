#include "common/file_system.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/orchestrator/temp_dir.hpp"

namespace shardline {
namespace common_file_system_test {

using orchestrator::testing::read_file;
using orchestrator::testing::TempDir;
using orchestrator::testing::write_file;

TEST(PosixFileSystem, OpenCreatesOnceAndNeverTruncates) {
  TempDir tmp;
  auto fs = posix_file_system();
  {
    auto f = fs->open_writable(tmp.file("a"));
    ASSERT_TRUE(f.ok()) << f.error().to_string();
    EXPECT_TRUE(f->created);
    ASSERT_TRUE(f->file->write_at(0, "hello world").ok());
    ASSERT_TRUE(f->file->sync().ok());
    EXPECT_EQ(*f->file->size(), 11u);
  }
  auto f = fs->open_writable(tmp.file("a"));
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->created);
  EXPECT_EQ(*f->file->size(), 11u);
  ASSERT_TRUE(f->file->write_at(6, "there").ok());
  EXPECT_EQ(read_file(tmp.file("a")), "hello there");
  ASSERT_TRUE(f->file->truncate(5).ok());
  EXPECT_EQ(read_file(tmp.file("a")), "hello");
  ASSERT_TRUE(f->file->write_at(7, "!").ok());  // past the end: a hole of zeros
  EXPECT_EQ(read_file(tmp.file("a")), std::string("hello\0\0!", 8));
}

TEST(PosixFileSystem, ErrorsAreIoAndNameTheFile) {
  TempDir tmp;
  auto fs = posix_file_system();
  auto f = fs->open_writable(tmp.file("no/such/folder/x"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, ErrorCode::io);
  EXPECT_NE(f.error().message.find(tmp.file("no/such/folder/x")), std::string::npos) << f.error().message;
  write_file(tmp.file("file"), "x");
  auto d = fs->make_directory(tmp.file("file"));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::io);
  EXPECT_FALSE(fs->sync_dir(tmp.file("missing")).ok());
}

TEST(PosixFileSystem, MakeDirectoryTellsWhetherItCreated) {
  TempDir tmp;
  auto fs = posix_file_system();
  EXPECT_TRUE(*fs->make_directory(tmp.file("d")));
  EXPECT_FALSE(*fs->make_directory(tmp.file("d")));
  EXPECT_TRUE(std::filesystem::is_directory(tmp.file("d")));
  EXPECT_TRUE(fs->sync_dir(tmp.file("d")).ok());
}

TEST(FileSystem, ParentDirectory) {
  EXPECT_EQ(parent_directory("/a/b/c.jsonl"), "/a/b");
  EXPECT_EQ(parent_directory("/a/b/"), "/a");
  EXPECT_EQ(parent_directory("c.jsonl"), ".");
  EXPECT_EQ(parent_directory("/x"), "/");
  EXPECT_EQ(parent_directory("a/./b"), "a");
}

/// Records the calls, makes folders for real.
class RecordingFileSystem final : public FileSystem {
 public:
  Result<OpenedFile> open_writable(const std::string& path) override { return posix_file_system()->open_writable(path); }
  Result<bool> make_directory(const std::string& path) override {
    calls.push_back("mkdir " + path);
    return posix_file_system()->make_directory(path);
  }
  Status sync_dir(const std::string& path) override {
    calls.push_back("sync " + path);
    return Status::ok_status();
  }
  std::vector<std::string> calls;
};

TEST(FileSystem, CreateDirectoriesDurablySyncsTheParentOfEachNewFolder) {
  TempDir tmp;
  RecordingFileSystem fs;
  ASSERT_TRUE(create_directories_durably(fs, tmp.file("a/b/c/")).ok());
  EXPECT_TRUE(std::filesystem::is_directory(tmp.file("a/b/c")));
  const std::vector<std::string> want = {"mkdir " + tmp.file("a"),   "sync " + tmp.path(),
                                         "mkdir " + tmp.file("a/b"), "sync " + tmp.file("a"),
                                         "mkdir " + tmp.file("a/b/c"), "sync " + tmp.file("a/b")};
  EXPECT_EQ(fs.calls, want);
  fs.calls.clear();
  ASSERT_TRUE(create_directories_durably(fs, tmp.file("a/b")).ok());  // there: nothing to do
  EXPECT_TRUE(fs.calls.empty());
  write_file(tmp.file("file"), "x");
  const Status st = create_directories_durably(fs, tmp.file("file/sub"));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::io);
}

}  // namespace
}  // namespace shardline
