// ShardReader and its sparse LineIndex: after one read of the shards, every
// line is reached from its checkpoint (never from the shards' start) with
// the same text, index, shard line number and too-long flag as a reading
// from the start; blank lines, CRLF, a last line without '\n', too-long
// lines and blank-only shards on the way.

#include "orchestrator/shard_reader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/orchestrator/temp_dir.hpp"

namespace shardline::orchestrator {
namespace orchestrator_shard_reader_test {

struct ReadLine {
  std::string text;
  std::uint64_t file_line = 0;
  std::size_t shard = 0;
  bool too_long = false;
  bool operator==(const ReadLine&) const = default;
};

ReadLine current(const ShardReader& r, const std::string& text) {
  return ReadLine{text, r.file_line(), r.shard(), r.too_long()};
}

/// Three shards of irregular lines: blank runs, CRLF, lines over the limit
/// of 200 bytes, a blank-only shard and a last line without '\n'.
std::vector<std::string> write_shards(const testing::TempDir& dir) {
  std::mt19937 rng(7);
  std::vector<std::string> paths;
  for (int s = 0; s < 4; ++s) {
    paths.push_back(dir.file("shard" + std::to_string(s) + ".jsonl"));
    std::ofstream out(paths.back(), std::ios::binary);
    if (s == 2) {
      out << "\n  \n\t\r\n";  // blank only
      continue;
    }
    const int lines = s == 0 ? 2500 : 1700;
    for (int i = 0; i < lines; ++i) {
      const unsigned roll = rng() % 100;
      if (roll < 5) out << "\n";
      if (roll < 2) out << "   \r\n";
      const std::string body = roll >= 97 ? std::string(300 + rng() % 5000, 'x') : std::string(rng() % 40, 'a' + s);
      out << "{\"i\":" << i << ",\"b\":\"" << body << "\"}";
      if (s == 3 && i == lines - 1) break;  // no final newline
      out << (roll % 3 == 0 ? "\r\n" : "\n");
    }
  }
  return paths;
}

TEST(ShardReader, EveryLineIsReachedFromItsCheckpointAsReadFromTheStart) {
  testing::TempDir dir;
  const std::vector<std::string> paths = write_shards(dir);
  LineIndex index;
  std::vector<ReadLine> all;
  {
    ShardReader first(paths, 200, &index);
    std::string line;
    for (;;) {
      auto more = first.next(line);
      ASSERT_TRUE(more.ok()) << more.error().to_string();
      if (!*more) break;
      ASSERT_EQ(first.next_index(), all.size() + 1);
      all.push_back(current(first, line));
    }
    EXPECT_TRUE(first.done());
  }
  ASSERT_EQ(all.size(), 2500u + 1700u + 1700u);
  ASSERT_EQ(index.checkpoints.size(), (all.size() + LineIndex::kStride - 1) / LineIndex::kStride);
  std::size_t too_long = 0;
  for (const ReadLine& l : all) too_long += l.too_long ? 1 : 0;
  ASSERT_GT(too_long, 50u) << "the shards have too-long lines";

  // Any line, in any order, from one reader sharing the index: what it
  // reads there equals the first reading, and it reads at most a stride of
  // raw lines (plus blanks) past the checkpoint to get there.
  ShardReader reader(paths, 200, &index);
  std::mt19937 rng(11);
  std::string line;
  const std::vector<std::uint64_t> first_probes = {all.size() - 1, 0, 4097};
  for (int probe = 0; probe < 300; ++probe) {
    const std::uint64_t want = probe < 3 ? first_probes[static_cast<std::size_t>(probe)] : rng() % all.size();
    ASSERT_TRUE(reader.seek_near(want).ok());
    const std::uint64_t raw_before = reader.raw_lines_read();
    while (reader.next_index() <= want) {
      auto more = reader.next(line);
      ASSERT_TRUE(more.ok());
      ASSERT_TRUE(*more) << "line " << want << " not reached";
    }
    EXPECT_EQ(current(reader, line), all[want]) << "line " << want;
    EXPECT_LE(reader.raw_lines_read() - raw_before, LineIndex::kStride * 2) << "line " << want << " was read from afar";
  }
  // The index is complete: readers record nothing twice.
  EXPECT_EQ(index.checkpoints.size(), (all.size() + LineIndex::kStride - 1) / LineIndex::kStride);
}

// seek_to (a prefix-ordered job's reads, orchestrator/line_order.hpp):
// every line, in a shuffled order, read exactly where last_line_start()
// said it starts, with one raw line read each (never a run of lines), the
// same text, shard, line number and too-long flag as the first reading.
TEST(ShardReader, EveryLineIsReadWhereItsStartWasRecordedInAnyOrder) {
  testing::TempDir dir;
  const std::vector<std::string> paths = write_shards(dir);
  std::vector<ReadLine> all;
  std::vector<LineCheckpoint> starts;
  {
    ShardReader first(paths, 200);
    std::string line;
    for (;;) {
      auto more = first.next(line);
      ASSERT_TRUE(more.ok()) << more.error().to_string();
      if (!*more) break;
      all.push_back(current(first, line));
      starts.push_back(first.last_line_start());
    }
  }
  std::vector<std::uint64_t> order(all.size());
  for (std::uint64_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  order.insert(order.begin() + 10, order[9] + 1 < all.size() ? order[9] + 1 : 0);  // a next line: read on
  ShardReader reader(paths, 200);
  std::string line;
  for (const std::uint64_t want : order) {
    ASSERT_TRUE(reader.seek_to(want, starts[want]).ok());
    const std::uint64_t raw_before = reader.raw_lines_read();
    auto more = reader.next(line);
    ASSERT_TRUE(more.ok());
    ASSERT_TRUE(*more) << "line " << want;
    EXPECT_EQ(reader.next_index(), want + 1);
    EXPECT_EQ(current(reader, line), all[want]) << "line " << want;
    EXPECT_EQ(reader.raw_lines_read() - raw_before, 1u) << "line " << want << " did not start where recorded";
  }
  EXPECT_FALSE(reader.seek_to(0, LineCheckpoint{9, 0, 0}).ok()) << "no shard 9";
}

TEST(ShardReader, SeekingAheadWithoutCheckpointsReadsOnAndAMissingShardIsAnError) {
  testing::TempDir dir;
  const std::vector<std::string> paths = write_shards(dir);
  ShardReader reader(paths, 200);  // no index: reading on is the only way
  std::string line;
  ASSERT_TRUE(reader.seek_near(3000).ok());
  while (reader.next_index() <= 3000) ASSERT_TRUE(*reader.next(line));
  EXPECT_EQ(reader.shard(), 1u);
  ASSERT_TRUE(reader.seek_near(5).ok());  // behind it: from the start again
  EXPECT_EQ(reader.next_index(), 0u);
  ASSERT_TRUE(*reader.next(line));
  EXPECT_EQ(line.rfind("{\"i\":0,", 0), 0u) << line;

  ShardReader missing({dir.file("none.jsonl")}, 0);
  auto r = missing.next(line);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::not_found);
  EXPECT_EQ(r.error().message, "input shard " + dir.file("none.jsonl") + ": cannot open");
}

}  // namespace orchestrator_shard_reader_test
}  // namespace shardline::orchestrator
