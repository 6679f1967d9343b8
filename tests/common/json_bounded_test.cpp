// parse_json_bounded (common/json_bounded.hpp): untrusted JSON with a depth
// bound, so that no later dump / copy / compare recurses deeply (issue 46,
// item 5: a line of 100,000 nested arrays crashed a node).
#include "common/json_bounded.hpp"

#include <gtest/gtest.h>

#include <string>

namespace shardline {
namespace common_json_bounded_test {

std::string nested(int levels, char open = '[', char close = ']') {
  return std::string(static_cast<std::size_t>(levels), open) + std::string(static_cast<std::size_t>(levels), close);
}

TEST(JsonBounded, NestingUpToTheBoundParsesOneMoreIsRefused) {
  auto ok = parse_json_bounded(nested(kMaxJsonDepth));
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  EXPECT_EQ(ok->dump(), nested(kMaxJsonDepth));
  auto deep = parse_json_bounded(nested(kMaxJsonDepth + 1));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(deep.error().message.find("nested deeper than 64 levels"), std::string::npos) << deep.error().message;
  // Objects count the same; a small bound applies as given.
  EXPECT_TRUE(parse_json_bounded(R"({"a":{"b":{"c":1}}})", 3).ok());
  EXPECT_FALSE(parse_json_bounded(R"({"a":{"b":{"c":{}}}})", 3).ok());
  EXPECT_FALSE(parse_json_bounded(R"({"a":[{"c":[]}]})", 3).ok());
}

TEST(JsonBounded, HundredThousandLevelsAreAnErrorNotACrash) {
  const std::string line = R"({"prompt":"Hi","max_tokens":)" + nested(100000) + "}";
  auto r = parse_json_bounded(line);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  auto o = parse_json_bounded<nlohmann::ordered_json>(nested(100000, '{', '}'));
  EXPECT_FALSE(o.ok());  // (not valid JSON either: '{' needs a key)
  // Unclosed, too: refused at the bound, before the end of the text.
  EXPECT_EQ(parse_json_bounded(std::string(1000000, '[')).error().code, ErrorCode::invalid_argument);
}

TEST(JsonBounded, BracketsInsideStringsDoNotCountAndBadJsonIsCorrupt) {
  const std::string text = R"({"s":")" + nested(1000) + R"("})";
  auto r = parse_json_bounded(text);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ((*r)["s"].get<std::string>(), nested(1000));
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "nul", "\"\\x\""}) {
    auto b = parse_json_bounded(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.error().code, ErrorCode::corrupt) << bad;
  }
  auto ordered = parse_json_bounded<nlohmann::ordered_json>(R"({"z":1,"a":2})");
  ASSERT_TRUE(ordered.ok());
  EXPECT_EQ(ordered->dump(), R"({"z":1,"a":2})");
}

}  // namespace
}  // namespace shardline
