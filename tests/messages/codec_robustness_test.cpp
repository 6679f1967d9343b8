// The decoders on hostile input: every prefix, seeded random mutations, random
// bytes. Each input must yield an Error or a value (that re-encodes and
// decodes again), never a crash, hang or escaping exception.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>

#include "messages/codec.hpp"
#include "samples.hpp"

namespace shardline::messages {
namespace {

using namespace shardline::messages::testing;  // NOLINT

void put_le32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

TEST(MessagesCodecRobustness, EveryPrefixIsRejected) {
  for (const std::string& bytes : all_encoded_samples()) {
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      // A prefix never matches its segment table: all six decoders must refuse it.
      EXPECT_EQ(decode_with_all(std::string_view(bytes).substr(0, n)), 0) << n << "/" << bytes.size();
    }
  }
}

TEST(MessagesCodecRobustness, TruncatedSegmentsWithPatchedTable) {
  // Cut the segment and fix the table so that the frame check passes and the
  // Cap'n Proto pointer bounds checks face the truncation.
  int accepted = 0, total = 0;
  for (const std::string& bytes : all_encoded_samples()) {
    ASSERT_EQ(bytes[0], 0);  // single segment
    for (std::size_t words = 1; words * 8 + 8 <= bytes.size(); ++words) {
      std::string cut = bytes.substr(0, 8 + words * 8);
      put_le32(cut, 4, static_cast<std::uint32_t>(words));
      accepted += decode_with_all(cut);
      total += 6;
    }
  }
  EXPECT_LT(accepted, total);
}

TEST(MessagesCodecRobustness, SeededRandomMutations) {
  const auto samples = all_encoded_samples();
  std::mt19937_64 rng(20240611);
  const auto t0 = std::chrono::steady_clock::now();
  int accepted = 0;
  constexpr int kRounds = 12000;
  for (int round = 0; round < kRounds; ++round) {
    std::string b = samples[rng() % samples.size()];
    // Mostly leave the segment table alone so that mutations reach the pointers.
    const std::size_t lo = (rng() % 8 == 0) ? 0 : 8;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = lo + rng() % (b.size() - lo);
      switch (rng() % 5) {
        case 0: b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8))); break;  // bit flip
        case 1: b[at] = static_cast<char>(rng()); break;                        // random byte
        case 2:                                                                 // interesting u32
          if (at + 4 <= b.size()) {
            static const std::uint32_t kInteresting[] = {0u, 1u, 0x7FFFFFFFu, 0x80000000u,
                                                         0xFFFFFFFFu, 0x1FFFFFFFu, 0xFFFFFFFCu};
            put_le32(b, at, kInteresting[rng() % std::size(kInteresting)]);
          }
          break;
        case 3: {  // copy a word over another word (pointer confusion)
          const std::size_t words = b.size() / 8;
          const std::size_t from = rng() % words, to = 1 + rng() % (words - 1);
          b.replace(to * 8, 8, b.substr(from * 8, 8));
          break;
        }
        case 4:  // truncate by whole words, keep the table honest
          if (const std::size_t seg = b.size() / 8 - 1; seg >= 2 && b[0] == 0) {
            b.resize(b.size() - 8 * (1 + rng() % std::min<std::size_t>(3, seg - 1)));
            put_le32(b, 4, static_cast<std::uint32_t>(b.size() / 8 - 1));
          }
          break;
      }
    }
    accepted += decode_with_all(b);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("accepted", accepted);
  EXPECT_GT(accepted, 0);  // many mutations hit payload bytes and stay valid
  EXPECT_LT(s, 5.0);
}

TEST(MessagesCodecRobustness, RandomBytes) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 2000; ++round) {
    const std::size_t words = 1 + rng() % 64;
    std::string b(words * 8 + (round % 10 == 0 ? rng() % 8 : 0), '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    if (round % 2 == 0) {  // a plausible single-segment table, random content
      put_le32(b, 0, 0);
      put_le32(b, 4, static_cast<std::uint32_t>(words - 1));
    }
    decode_with_all(b);
  }
}

TEST(MessagesCodecRobustness, HugeDeclaredSegmentSizes) {
  const std::string good = encode(WorkerMsg{AssignWork{{sample_request(0), sample_request(1)}}});
  for (std::uint32_t segs : {0u, 1u, 2u, 3u, 511u, 512u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
    for (std::uint32_t size : {0u, 1u, 0x10000000u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
      std::string b = good;
      put_le32(b, 0, segs);
      put_le32(b, 4, size);
      EXPECT_EQ(decode_with_all(b), 0) << segs << " " << size;
    }
  }
}

}  // namespace
}  // namespace shardline::messages
