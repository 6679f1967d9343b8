// Engine flags (cli/engine_flags.hpp): --device-memory takes plain bytes or a
// binary unit (parse_byte_size) and reaches EngineOptions; the step overlap
// and prefix caching flags reach it too.
#include "cli/engine_flags.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardline::cli {
namespace cli_engine_flags_test {

std::uint64_t bytes_of(std::string_view text) {
  auto r = parse_byte_size(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.error().to_string();
  return r.ok() ? *r : 0;
}

TEST(ParseByteSize, PlainBytesAndBinaryUnits) {
  EXPECT_EQ(bytes_of("0"), 0u);
  EXPECT_EQ(bytes_of("1048576"), 1048576u);
  EXPECT_EQ(bytes_of("010"), 10u);  // decimal, not octal
  EXPECT_EQ(bytes_of("7B"), 7u);
  EXPECT_EQ(bytes_of("1K"), 1024u);
  EXPECT_EQ(bytes_of("16KB"), 16u * 1024u);
  EXPECT_EQ(bytes_of("16kib"), 16u * 1024u);
  EXPECT_EQ(bytes_of("512M"), 512ull << 20);
  EXPECT_EQ(bytes_of("512MiB"), 512ull << 20);
  EXPECT_EQ(bytes_of("8G"), 8ull << 30);
  EXPECT_EQ(bytes_of("8GiB"), 8ull << 30);
  EXPECT_EQ(bytes_of("8gb"), 8ull << 30);
  EXPECT_EQ(bytes_of(" 2 GiB "), 2ull << 30);
  EXPECT_EQ(bytes_of("3T"), 3ull << 40);
  EXPECT_EQ(bytes_of("16777215T"), 16777215ull << 40);  // 2^64 - 2^40
  EXPECT_EQ(bytes_of("18446744073709551615"), 18446744073709551615ull);
}

TEST(ParseByteSize, FractionsWithAUnitRoundDown) {
  EXPECT_EQ(bytes_of("1.5G"), 1610612736u);  // 1.5 x 2^30
  EXPECT_EQ(bytes_of("0.5K"), 512u);
  EXPECT_EQ(bytes_of("0.001K"), 1u);         // 1.024 -> 1
  EXPECT_EQ(bytes_of("2.25MiB"), 2359296u);  // 2.25 x 2^20
  EXPECT_EQ(bytes_of("0.1T"), 109951162777u);  // floor(2^40 / 10) = 109951162777.6
  EXPECT_EQ(bytes_of("1.0T"), 1ull << 40);
  // The largest whole T plus 0.9999999 T: (2^64 - 2^40) + floor(2^40 x 0.9999999).
  EXPECT_EQ(bytes_of("16777215.9999999T"), 18446744073709441664ull);
}

TEST(ParseByteSize, MalformedSizesAreRefusedWithTheText) {
  for (const char* bad : {"", " ", "-1", "+5", "1.5", "1.", ".5G", "12X", "GiB", "G8", "0x10", "1e9", "1 2",
                          "1.5 bytes", "18446744073709551616", "16777216T"}) {
    auto r = parse_byte_size(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "' gave " << *r;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find("'" + std::string(bad) + "'"), std::string::npos) << r.error().message;
  }
}

/// The engine options of `shardline ... ARGS` with the engine flags.
Result<engine::EngineOptions> options_of(std::vector<const char*> args) {
  CLI::App app;
  EngineFlags f;
  add_engine_flags(app, f);
  args.insert(args.begin(), "shardline");
  app.parse(static_cast<int>(args.size()), args.data());
  return to_engine_options(f, "/model");
}

TEST(EngineFlags, DeviceMemoryReachesTheEngineOptions) {
  auto o = options_of({});
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_EQ(o->device_memory_bytes, 0u);  // off by default
  o = options_of({"--device-memory", "6GiB"});
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_EQ(o->device_memory_bytes, 6ull << 30);
  o = options_of({"--device-memory", "123456"});
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_EQ(o->device_memory_bytes, 123456u);
  o = options_of({"--device-memory", "-1"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(o.error().message.find("--device-memory"), std::string::npos) << o.error().message;
}

TEST(EngineFlags, StepOverlapAndItsPrefetchBudgetReachTheEngineOptions) {
  auto o = options_of({});
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_EQ(o->step_overlap, model::StepOverlap::none);
  EXPECT_EQ(o->overlap_prefetch_bytes, std::size_t{12} << 20);
  o = options_of({"--step-overlap", "nano-batch", "--overlap-prefetch-mib", "0.5"});
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_EQ(o->step_overlap, model::StepOverlap::nano_batch);
  EXPECT_EQ(o->overlap_prefetch_bytes, std::size_t{512} << 10);
  o = options_of({"--step-overlap", "kv-prefetch", "--overlap-prefetch-mib", "0"});
  ASSERT_TRUE(o.ok()) << o.error().to_string();
  EXPECT_EQ(o->step_overlap, model::StepOverlap::kv_prefetch);
  EXPECT_EQ(o->overlap_prefetch_bytes, 0u);
  o = options_of({"--step-overlap", "nanoflow"});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(o.error().message.find("--step-overlap"), std::string::npos) << o.error().message;
  EXPECT_NE(o.error().message.find("'nanoflow'"), std::string::npos) << o.error().message;
  o = options_of({"--overlap-prefetch-mib", "-2"});
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.error().message.find("--overlap-prefetch-mib"), std::string::npos) << o.error().message;
}

TEST(EngineFlags, PrefixCachingIsOnUnlessTurnedOff) {
  for (const auto& [args, on] : std::vector<std::pair<std::vector<const char*>, bool>>{
           {{}, true},
           {{"--enable-prefix-caching"}, true},
           {{"--no-prefix-caching"}, false},
           {{"--enable-prefix-caching", "--no-prefix-caching"}, false},
           {{"--no-prefix-caching", "--enable-prefix-caching"}, false}}) {
    auto o = options_of(args);
    ASSERT_TRUE(o.ok()) << o.error().to_string();
    EXPECT_EQ(o->enable_prefix_caching, on) << args.size();
  }
}

}  // namespace
}  // namespace shardline::cli
