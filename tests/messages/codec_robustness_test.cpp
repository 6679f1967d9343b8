// The decoders on hostile input: every prefix, seeded random mutations, random
// bytes. Each input must yield an Error or a value (that re-encodes and
// decodes again), never a crash, hang or escaping exception. (How fast they
// refuse it is measured in bench/micro_bench.cpp, not asserted here.)

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>

#include "messages/codec.hpp"
#include "samples.hpp"

namespace shardline::messages {
namespace messages_codec_robustness_test {

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
  RecordProperty("accepted", accepted);
  EXPECT_GT(accepted, 0);  // many mutations hit payload bytes and stay valid
}

// ---- RandomBytes: what each decoder did with each input ----------------------

/// The documented limits of decoded values (messages/codec.hpp), checked on
/// whatever a decoder accepted from random input.
bool in_limits(const engine::ParallelConfig& pc) { return pc.tp >= 1 && pc.pp >= 1 && pc.sp >= 1 && pc.dp >= 1; }
bool in_limits(const Error& e) { return e.code <= ErrorCode::disk_full; }
bool in_limits(const BatchRequest& r) {
  return r.n >= 1 && r.prompt_token_ids.size() <= kMaxListElements &&
         std::all_of(r.prompt_token_ids.begin(), r.prompt_token_ids.end(), [](std::int32_t id) { return id >= 0; }) &&
         r.params.validate().ok();
}
bool in_limits(const BatchResult& r) {
  return r.prompt_tokens >= 0 && r.completion_tokens >= 0 && r.choices.size() <= kMaxListElements &&
         std::all_of(r.choices.begin(), r.choices.end(), [](const BatchChoice& c) {
           return c.index >= 0 && std::all_of(c.token_ids.begin(), c.token_ids.end(), [](int id) { return id >= 0; });
         });
}
bool in_limits(const OrchestratorMsg& m) {
  if (const auto* sj = std::get_if<SubmitJob>(&m)) return !sj->parallel || in_limits(*sj->parallel);
  if (const auto* hello = std::get_if<WorkerHello>(&m)) return in_limits(hello->parallel) && hello->parallel.dp == 1;
  if (const auto* wr = std::get_if<WorkerResults>(&m))
    return std::all_of(wr->results.begin(), wr->results.end(), [](const BatchResult& r) { return in_limits(r); });
  return true;
}
/// A reply is within the limits unless it is an error outside them.
template <class Reply>
bool reply_in_limits(const Reply& m) {
  const auto* e = std::get_if<Error>(&m);
  return e == nullptr || in_limits(*e);
}
bool in_limits(const OrchestratorReply& m) { return reply_in_limits(m); }
bool in_limits(const WorkerMsg& m) {
  const auto* aw = std::get_if<AssignWork>(&m);
  return aw == nullptr || std::all_of(aw->requests.begin(), aw->requests.end(),
                                      [](const BatchRequest& r) { return in_limits(r); });
}
bool in_limits(const WorkerReply& m) { return reply_in_limits(m); }
bool in_limits(const KvStoreMsg&) { return true; }
bool in_limits(const KvStoreReply& m) { return reply_in_limits(m); }

/// Counts of what the six decoders did with a set of inputs.
struct Tally {
  int accepted = 0;
  int corrupt = 0;           ///< refused as not well-formed
  int invalid_argument = 0;  ///< well-formed but refused (version, limits, ranges)
};

/// Runs one decoder on `bytes` and checks the contract: an accepted value
/// is within the documented limits and re-encodes to bytes that decode and
/// re-encode to the same bytes; a refusal is `corrupt` or `invalid_argument`
/// with a message that starts with the decoder's name ("worker message: ...")
/// and says more.
template <class Decode>
void decode_one(std::string_view bytes, const std::string& what, Decode decode, Tally& tally) {
  const auto r = decode(bytes);
  if (r.ok()) {
    ++tally.accepted;
    EXPECT_TRUE(in_limits(r.value())) << what << " accepted a value outside the limits";
    const std::string once = encode(r.value());
    const auto again = decode(once);
    ASSERT_TRUE(again.ok()) << what << ": " << again.error().to_string();
    EXPECT_EQ(encode(again.value()), once) << what << ": re-encoding is not stable";
    return;
  }
  const Error& e = r.error();
  if (e.code == ErrorCode::corrupt) {
    ++tally.corrupt;
  } else if (e.code == ErrorCode::invalid_argument) {
    ++tally.invalid_argument;
  } else {
    ADD_FAILURE() << what << " refused random bytes with " << e.to_string();
  }
  // "<what>: detail" or, once the union member is known, "<what> <kind>: detail".
  const bool named = e.message.rfind(what + ": ", 0) == 0 ||
                     (e.message.rfind(what + " ", 0) == 0 && e.message.find(": ", what.size()) != std::string::npos);
  EXPECT_TRUE(named) << e.message;
  EXPECT_GT(e.message.size() - e.message.find(": "), 2u) << e.message;
}

void tally_all_decoders(std::string_view bytes, Tally& tally) {
  decode_one(bytes, "orchestrator message", [](std::string_view b) { return decode_orchestrator(b); }, tally);
  decode_one(bytes, "orchestrator reply", [](std::string_view b) { return decode_orchestrator_reply(b); }, tally);
  decode_one(bytes, "worker message", [](std::string_view b) { return decode_worker(b); }, tally);
  decode_one(bytes, "worker reply", [](std::string_view b) { return decode_worker_reply(b); }, tally);
  decode_one(bytes, "kvstore message", [](std::string_view b) { return decode_kvstore(b); }, tally);
  decode_one(bytes, "kvstore reply", [](std::string_view b) { return decode_kvstore_reply(b); }, tally);
}

TEST(MessagesCodecRobustness, RandomBytes) {
  const auto samples = all_encoded_samples();
  // Every root is {version: UInt16, union tag: UInt16; one pointer}: the root
  // pointer (segment word 0) says offset 0, one data word, one pointer.
  for (const std::string& sample : samples) ASSERT_EQ(sample.substr(8, 8), std::string("\0\0\0\0\1\0\1\0", 8));
  std::mt19937_64 rng(7);
  auto random_bytes = [&](std::size_t n) {
    std::string b(n, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    return b;
  };
  constexpr int kRounds = 1000;
  // Sizes that are not whole words: refused before anything is read.
  Tally ragged;
  for (int round = 0; round < kRounds; ++round)
    tally_all_decoders(random_bytes(8 * (rng() % 64) + 1 + rng() % 7), ragged);
  // Whole words, random segment table: the frame check refuses them.
  Tally random_table;
  for (int round = 0; round < kRounds; ++round) tally_all_decoders(random_bytes(8 * (1 + rng() % 64)), random_table);
  // A consistent single-segment table over random words: the frame passes,
  // the random root pointer is refused.
  Tally random_root;
  for (int round = 0; round < kRounds; ++round) {
    const std::size_t words = 2 + rng() % 63;
    std::string b = random_bytes(8 * words);
    put_le32(b, 0, 0);
    put_le32(b, 4, static_cast<std::uint32_t>(words - 1));
    tally_all_decoders(b, random_root);
  }
  // A real message's frame and root pointer over random words with any
  // schema version but ours: refused at the version check.
  Tally other_version;
  for (int round = 0; round < kRounds; ++round) {
    const std::size_t words = 4 + rng() % 61;  // table, root pointer, root data, root pointer section
    std::string b = samples[rng() % samples.size()].substr(0, 16) + random_bytes(8 * (words - 2));
    put_le32(b, 4, static_cast<std::uint32_t>(words - 1));
    std::uint16_t version = static_cast<std::uint16_t>(rng());
    if (version == kSchemaVersion) version ^= 0x8000;
    b[16] = static_cast<char>(version & 0xFF);
    b[17] = static_cast<char>(version >> 8);
    tally_all_decoders(b, other_version);
  }
  // A real message's frame and root (root pointer, version, union tag, some
  // of them randomized) over a random body: the union member's pointer is
  // null, points into the random words, or is random.
  Tally random_body;
  for (int round = 0; round < kRounds; ++round) {
    const std::string& sample = samples[rng() % samples.size()];
    const std::size_t words = 4 + rng() % 61;
    std::string b = sample.substr(0, 24) + random_bytes(8 * (words - 3));
    put_le32(b, 4, static_cast<std::uint32_t>(words - 1));
    if (rng() % 2 == 0) {  // any union tag, also unknown ones
      b[18] = static_cast<char>(rng() % 12);
      b[19] = 0;
    }
    switch (rng() % 3) {
      case 0: std::fill(b.begin() + 24, b.begin() + 32, '\0'); break;  // null: the member's default
      case 1: {  // a struct pointer into the random words, small sections
        const std::uint64_t offset = rng() % (words - 3), data_words = rng() % 4, pointers = rng() % 4;
        const std::uint64_t ptr = (offset << 2) | (data_words << 32) | (pointers << 48);
        for (int i = 0; i < 8; ++i) b[24 + i] = static_cast<char>((ptr >> (8 * i)) & 0xFF);
        break;
      }
      default: break;  // random
    }
    tally_all_decoders(b, random_body);
  }
  const auto show = [](const Tally& t) {
    return std::to_string(t.accepted) + " accepted, " + std::to_string(t.corrupt) + " corrupt, " +
           std::to_string(t.invalid_argument) + " invalid_argument";
  };
  RecordProperty("random_body", show(random_body));
  // Six decoders on every input; random bytes are never a message.
  EXPECT_EQ(ragged.corrupt, 6 * kRounds) << show(ragged);
  EXPECT_EQ(random_table.corrupt, 6 * kRounds) << show(random_table);
  EXPECT_EQ(random_root.corrupt, 6 * kRounds) << show(random_root);
  EXPECT_EQ(other_version.invalid_argument, 6 * kRounds) << show(other_version);
  // Under a valid root, both outcomes occur: the decoders accept what is
  // well-formed and in range, and refuse the rest.
  EXPECT_GT(random_body.accepted, 0) << show(random_body);
  EXPECT_GT(random_body.corrupt, 0) << show(random_body);
  EXPECT_EQ(random_body.accepted + random_body.corrupt + random_body.invalid_argument, 6 * kRounds);
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
