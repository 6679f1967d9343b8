#include "orchestrator/output_writer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_output_writer_test {

using testing::read_file;
using testing::TempDir;

constexpr std::uint64_t kLines = 50;

std::string line_text(std::uint64_t i) { return "{\"line\":" + std::to_string(i) + ",\"pad\":\"" + std::string(i % 7, 'x') + "\"}"; }

std::string expected_file() {
  std::string s;
  for (std::uint64_t i = 0; i < kLines; ++i) s += line_text(i) + "\n";
  return s;
}

std::uint64_t new_job(JobStore& s) {
  JobRecord r;
  r.total_lines = kLines;
  return *s.create_job(r);
}

void commit(JobStore& s, std::uint64_t job, std::uint64_t line) {
  ASSERT_TRUE(s.put_result(job, StoredResult{line, line_text(line), true, 1, 1}).ok());
}

std::vector<std::uint64_t> shuffled_lines(unsigned seed) {
  std::vector<std::uint64_t> order(kLines);
  for (std::uint64_t i = 0; i < kLines; ++i) order[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

TEST(OutputWriter, OutOfOrderResultsGiveAnInOrderFile) {
  TempDir tmp;
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  const auto job = new_job(**store);
  auto w = OutputWriter::open(**store, job, tmp.file("out/result.jsonl"), kLines);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  commit(**store, job, 1);
  commit(**store, job, 2);
  EXPECT_EQ(*(*w)->advance(), 0u);  // line 0 missing: nothing written
  EXPECT_EQ(read_file(tmp.file("out/result.jsonl")), "");
  commit(**store, job, 0);
  EXPECT_EQ(*(*w)->advance(), 3u);
  EXPECT_EQ((*w)->next_line(), 3u);
  EXPECT_EQ(read_file(tmp.file("out/result.jsonl")), line_text(0) + "\n" + line_text(1) + "\n" + line_text(2) + "\n");
  for (std::uint64_t line : shuffled_lines(1)) {
    if (line < 3) continue;
    commit(**store, job, line);
    ASSERT_TRUE((*w)->advance().ok());
  }
  EXPECT_TRUE((*w)->complete());
  EXPECT_EQ(read_file(tmp.file("out/result.jsonl")), expected_file());
  const auto p = *(*store)->output_progress(job);
  EXPECT_EQ(p.next_line, kLines);
  EXPECT_EQ(p.offset, expected_file().size());
}

TEST(OutputWriter, CrashWithTornTailThenRecoverIsByteIdentical) {
  TempDir tmp;
  const std::string out = tmp.file("out.jsonl");
  const auto order = shuffled_lines(7);
  std::uint64_t job = 0;
  {
    auto store = JobStore::open(tmp.file("db"));
    ASSERT_TRUE(store.ok());
    job = new_job(**store);
    auto w = OutputWriter::open(**store, job, out, kLines);
    ASSERT_TRUE(w.ok());
    for (std::size_t k = 0; k < kLines / 2; ++k) {
      commit(**store, job, order[k]);
      ASSERT_TRUE((*w)->advance().ok());
    }
    // "Crash": objects dropped without finishing; a torn, unacknowledged write
    // follows the acknowledged bytes.
    std::ofstream garbage(out, std::ios::binary | std::ios::app);
    garbage << line_text(999) << "\n{\"torn";
  }
  {
    // A second crash right after reopening, before anything new is written.
    auto store = JobStore::open(tmp.file("db"));
    ASSERT_TRUE(store.ok());
    auto w = OutputWriter::open(**store, job, out, kLines);
    ASSERT_TRUE(w.ok());
    std::ofstream garbage(out, std::ios::binary | std::ios::app);
    garbage << "garbage";
  }
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  auto w = OutputWriter::open(**store, job, out, kLines);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(expected_file().starts_with(read_file(out)));  // torn tail gone
  for (std::size_t k = kLines / 2; k < kLines; ++k) commit(**store, job, order[k]);
  ASSERT_TRUE((*w)->advance().ok());
  EXPECT_TRUE((*w)->complete());
  EXPECT_EQ(read_file(out), expected_file());
}

TEST(OutputWriter, UnacknowledgedCompleteLinesAreRewrittenOnce) {
  // The file holds lines whose progress record never made it (crash between
  // fsync and the store write): they are cut and written again, once.
  TempDir tmp;
  const std::string out = tmp.file("out.jsonl");
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  const auto job = new_job(**store);
  for (std::uint64_t i = 0; i < kLines; ++i) commit(**store, job, i);
  const std::string first = line_text(0) + "\n";
  ASSERT_TRUE((*store)->set_output_progress(job, OutputProgress{first.size(), 1, fnv1a64(kFnv1a64Empty, first)}).ok());
  testing::write_file(out, line_text(0) + "\n" + line_text(1) + "\n" + line_text(2) + "\n");
  auto w = OutputWriter::open(**store, job, out, kLines);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(read_file(out), line_text(0) + "\n");
  ASSERT_TRUE((*w)->advance().ok());
  EXPECT_EQ(read_file(out), expected_file());
}

/// Commits lines [0, n) and writes them to `out` with a writer closed after.
void write_first(JobStore& s, std::uint64_t job, const std::string& out, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) commit(s, job, i);
  auto w = OutputWriter::open(s, job, out, kLines);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(*(*w)->advance(), n);
}

/// Commits lines [from, kLines) and writes them with `w`: then `out` must be
/// the whole job, each line once.
void finish(JobStore& s, std::uint64_t job, OutputWriter& w, std::uint64_t from, const std::string& out) {
  for (std::uint64_t i = from; i < kLines; ++i) commit(s, job, i);
  ASSERT_TRUE(w.advance().ok());
  EXPECT_EQ(read_file(out), expected_file());
}

TEST(OutputWriter, LostFileIsRebuiltFromTheStore) {
  TempDir tmp;
  const std::string out = tmp.file("out.jsonl");
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  const auto job = new_job(**store);
  write_first(**store, job, out, 10);
  std::filesystem::remove(out);
  auto w = OutputWriter::open(**store, job, out, kLines);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->next_line(), 0u);
  finish(**store, job, **w, 10, out);
}

// Issue 46, item 10: a line edited in the written prefix survived a resume.
// The prefix's checksum is kept with the progress; a mismatch on reopen
// rewrites the file from the store. An untouched file is kept as is.
TEST(OutputWriter, AnEditedPrefixIsRewrittenFromTheStoreOnReopen) {
  TempDir tmp;
  const std::string out = tmp.file("out.jsonl");
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  const auto job = new_job(**store);
  write_first(**store, job, out, 20);
  {  // untouched: resumed where it was
    auto w = OutputWriter::open(**store, job, out, kLines);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ((*w)->rebuilds(), 0);
    EXPECT_EQ((*w)->next_line(), 20u);
  }
  std::string text = read_file(out);
  const auto at = text.find("\"line\":7,");
  ASSERT_NE(at, std::string::npos);
  text[at + 7] = '8';  // same length: only the checksum can tell
  testing::write_file(out, text);
  auto w = OutputWriter::open(**store, job, out, kLines);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->rebuilds(), 1);
  EXPECT_EQ((*w)->next_line(), 0u);
  finish(**store, job, **w, 20, out);
}

// A progress record of a version without checksums (16 bytes) still opens;
// its prefix cannot be checked, and the file goes on from it.
TEST(OutputWriter, AnOldProgressRecordWithoutAChecksumIsTrusted) {
  TempDir tmp;
  const std::string out = tmp.file("out.jsonl");
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  const auto job = new_job(**store);
  for (std::uint64_t i = 0; i < kLines; ++i) commit(**store, job, i);
  const std::string expected = expected_file();
  const std::string first_five = expected.substr(0, expected.find("{\"line\":5,"));
  testing::write_file(out, first_five);
  OutputProgress old{first_five.size(), 5};
  old.checksummed = false;
  ASSERT_TRUE((*store)->set_output_progress(job, old).ok());
  auto reread = (*store)->output_progress(job);
  ASSERT_TRUE(reread.ok());
  EXPECT_FALSE(reread->checksummed);
  auto w = OutputWriter::open(**store, job, out, kLines);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->rebuilds(), 0);
  EXPECT_EQ((*w)->next_line(), 5u);
  ASSERT_TRUE((*w)->advance().ok());
  EXPECT_EQ(read_file(out), expected);
}

TEST(OutputWriter, EmptyJobIsCompleteAtOnce) {
  TempDir tmp;
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  JobRecord r;
  const auto job = *(*store)->create_job(r);
  auto w = OutputWriter::open(**store, job, tmp.file("empty.jsonl"), 0);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE((*w)->complete());
  EXPECT_EQ(*(*w)->advance(), 0u);
  EXPECT_TRUE(std::filesystem::exists(tmp.file("empty.jsonl")));
}

TEST(OutputWriter, UnwritablePathIsAnError) {
  TempDir tmp;
  auto store = JobStore::open(tmp.file("db"));
  ASSERT_TRUE(store.ok());
  testing::write_file(tmp.file("file"), "x");
  auto w = OutputWriter::open(**store, 1, tmp.file("file/sub/out.jsonl"), 1);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code, ErrorCode::io);
}

}  // namespace
}  // namespace shardline::orchestrator
