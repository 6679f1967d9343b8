#include "engine/group/step_codec.hpp"

#include <gtest/gtest.h>

namespace shardline::engine {
namespace engine_step_codec_test {

model::StepInput sample_step() {
  model::StepInput in;
  in.block_size = 16;
  in.seqs.push_back({0x1234'5678'9abc'def0ull, 0, 3, true, {7}});
  in.seqs.push_back({42, 17, 1, true, {1, 9}});
  in.token_ids = {5, 6, 7, 8};
  in.positions = {0, 1, 2, 17};
  in.slot_mapping = {112, 113, 114, 145};
  in.logits_rows = {2, 3};
  return in;
}

TEST(StepCodec, RoundTripsEveryField) {
  const model::StepInput in = sample_step();
  Result<model::StepInput> out = decode_step(encode_step(in));
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  const model::StepInput& o = out.value();
  EXPECT_EQ(o.block_size, 16);
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.seqs[0].seq_id, in.seqs[0].seq_id);
  EXPECT_EQ(o.seqs[1].num_computed_tokens, 17);
  EXPECT_EQ(o.seqs[1].block_table, (std::vector<std::int32_t>{1, 9}));
  EXPECT_TRUE(o.seqs[0].needs_logits);
  EXPECT_EQ(o.token_ids, in.token_ids);
  EXPECT_EQ(o.positions, in.positions);
  EXPECT_EQ(o.slot_mapping, in.slot_mapping);
  EXPECT_EQ(o.logits_rows, in.logits_rows);
}

TEST(StepCodec, EmptyStepRoundTrips) {
  model::StepInput in;
  in.block_size = 8;
  Result<model::StepInput> out = decode_step(encode_step(in));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out.value().num_tokens(), 0);
}

TEST(StepCodec, RejectsEveryTruncationAndTrailingWords) {
  const std::vector<std::int32_t> w = encode_step(sample_step());
  for (std::size_t n = 0; n < w.size(); ++n) {
    Result<model::StepInput> r = decode_step(std::span(w.data(), n));
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " words decoded";
    EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  }
  std::vector<std::int32_t> longer = w;
  longer.push_back(0);
  Result<model::StepInput> r = decode_step(longer);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("trailing"), std::string::npos);
}

TEST(StepCodec, RejectsBadVersionAndNegativeCounts) {
  std::vector<std::int32_t> w = encode_step(sample_step());
  w[0] = 2;
  EXPECT_FALSE(decode_step(w).ok());
  w = encode_step(sample_step());
  w[2] = -1;
  EXPECT_FALSE(decode_step(w).ok());
  w = encode_step(sample_step());
  w[5 + 5] = -3;  // first sequence's table length
  EXPECT_FALSE(decode_step(w).ok());
}

}  // namespace
}  // namespace shardline::engine
