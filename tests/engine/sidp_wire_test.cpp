// The wire forms of the SiDP process group's control messages
// (engine/sidp/sidp_wire.hpp): every field survives a CBOR round trip exactly
// (logits bit for bit, NaN and infinities included), and a malformed body
// is a corrupt error naming what is wrong, never an exception or a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/sidp/sidp_wire.hpp"

namespace shardline::engine::sidp_wire {
namespace engine_sidp_wire_test {

using nlohmann::json;

json through_cbor(const json& j) { return json::from_cbor(json::to_cbor(j)); }

TEST(SidpWire, SamplingParamsRoundTripEveryField) {
  sampling::SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = -0.5f;
  p.frequency_penalty = 0.25f;
  p.seed = 0xfedcba9876543210ull;
  p.has_seed = true;
  p.max_tokens = 123;
  p.min_tokens = 7;
  p.ignore_eos = true;
  p.stop_token_ids = {2, 13};
  p.stop = {"\n\n", "The end"};
  auto got = params_from_json(through_cbor(params_to_json(p)));
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_EQ(got->temperature, p.temperature);
  EXPECT_EQ(got->top_k, p.top_k);
  EXPECT_EQ(got->top_p, p.top_p);
  EXPECT_EQ(got->min_p, p.min_p);
  EXPECT_EQ(got->repetition_penalty, p.repetition_penalty);
  EXPECT_EQ(got->presence_penalty, p.presence_penalty);
  EXPECT_EQ(got->frequency_penalty, p.frequency_penalty);
  EXPECT_EQ(got->seed, p.seed);
  EXPECT_EQ(got->has_seed, p.has_seed);
  EXPECT_EQ(got->max_tokens, p.max_tokens);
  EXPECT_EQ(got->min_tokens, p.min_tokens);
  EXPECT_EQ(got->ignore_eos, p.ignore_eos);
  EXPECT_EQ(got->stop_token_ids, p.stop_token_ids);
  EXPECT_EQ(got->stop, p.stop);
}

TEST(SidpWire, OutputsRoundTripWithLogitsBitForBit) {
  RequestOutput o;
  o.request_id = 41;
  o.prompt_token_ids = {1, 403, 407};
  o.token_ids = {432, 383, 2};
  o.text = ", there\u00e9";
  o.finish_reason = FinishReason::stop;
  o.stop_reason = "2";
  o.num_preemptions = 3;
  const float specials[] = {0.1f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), 1e30f};
  o.logits = {std::vector<float>(std::begin(specials), std::end(specials)), {}, {3.25f}};
  auto got = output_from_json(through_cbor(output_to_json(o)));
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_EQ(got->request_id, o.request_id);
  EXPECT_EQ(got->prompt_token_ids, o.prompt_token_ids);
  EXPECT_EQ(got->token_ids, o.token_ids);
  EXPECT_EQ(got->text, o.text);
  EXPECT_EQ(got->finish_reason, o.finish_reason);
  EXPECT_EQ(got->stop_reason, o.stop_reason);
  EXPECT_EQ(got->num_preemptions, o.num_preemptions);
  ASSERT_EQ(got->logits.size(), o.logits.size());
  for (std::size_t i = 0; i < o.logits.size(); ++i) {
    ASSERT_EQ(got->logits[i].size(), o.logits[i].size());
    EXPECT_EQ(0, std::memcmp(got->logits[i].data(), o.logits[i].data(), o.logits[i].size() * sizeof(float)))
        << "row " << i;
  }
}

TEST(SidpWire, StatsRoundTrip) {
  model::sidp::SidpFfnStats s;
  s.was_steps = 1;
  s.cas_steps = 2;
  s.dummy_steps = 3;
  s.cas_rows_sent = 4;
  s.cas_fused_gemms = 5;
  s.cas_fused_rows = 6;
  s.cas_peer_skips = 7;
  s.switches_to_cas = 8;
  s.switches_to_was = 9;
  s.applied_epoch = 10;
  s.cache.fetches = 11;
  s.cache.fetched_bytes = 1ull << 40;
  s.cache.fetch_retries = 13;
  s.cache.compute_waits = 14;
  s.cache.compute_wait_ms = 1.5;
  s.cache.fetch_ms = 2.75;
  auto got = stats_from_json(through_cbor(stats_to_json(s)));
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  EXPECT_EQ(got->was_steps, 1u);
  EXPECT_EQ(got->cas_steps, 2u);
  EXPECT_EQ(got->dummy_steps, 3u);
  EXPECT_EQ(got->cas_rows_sent, 4u);
  EXPECT_EQ(got->cas_fused_gemms, 5u);
  EXPECT_EQ(got->cas_fused_rows, 6u);
  EXPECT_EQ(got->cas_peer_skips, 7u);
  EXPECT_EQ(got->switches_to_cas, 8u);
  EXPECT_EQ(got->switches_to_was, 9u);
  EXPECT_EQ(got->applied_epoch, 10u);
  EXPECT_EQ(got->cache.fetches, 11u);
  EXPECT_EQ(got->cache.fetched_bytes, 1ull << 40);
  EXPECT_EQ(got->cache.fetch_retries, 13u);
  EXPECT_EQ(got->cache.compute_waits, 14u);
  EXPECT_EQ(got->cache.compute_wait_ms, 1.5);
  EXPECT_EQ(got->cache.fetch_ms, 2.75);
}

TEST(SidpWire, MalformedBodiesAreCorruptErrorsNamingTheProblem) {
  json p = params_to_json(sampling::SamplingParams{});
  p.erase("max_tokens");
  auto bad_params = params_from_json(p);
  ASSERT_FALSE(bad_params.ok());
  EXPECT_EQ(bad_params.error().code, ErrorCode::corrupt);
  EXPECT_NE(bad_params.error().message.find("max_tokens"), std::string::npos) << bad_params.error().message;

  RequestOutput o;
  o.logits = {{1.0f}};
  json out = output_to_json(o);
  out["finish"] = 9;
  auto bad_finish = output_from_json(out);
  ASSERT_FALSE(bad_finish.ok());
  EXPECT_NE(bad_finish.error().message.find("finish reason"), std::string::npos) << bad_finish.error().message;

  out = output_to_json(o);
  out["logits"][0] = json::binary(std::vector<std::uint8_t>{1, 2, 3, 4, 5});
  auto bad_row = output_from_json(out);
  ASSERT_FALSE(bad_row.ok());
  EXPECT_NE(bad_row.error().message.find("logits row"), std::string::npos) << bad_row.error().message;

  out = output_to_json(o);
  out["ids"] = "not a list";
  EXPECT_EQ(output_from_json(out).error().code, ErrorCode::corrupt);
  EXPECT_EQ(stats_from_json(json::array()).error().code, ErrorCode::corrupt);
  EXPECT_EQ(stats_from_json(json{{"was_steps", -1}}).error().code, ErrorCode::corrupt);
}

}  // namespace
}  // namespace shardline::engine::sidp_wire
