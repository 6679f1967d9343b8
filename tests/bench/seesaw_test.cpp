// The Seesaw benchmark (bench/seesaw.hpp) on stories260K: what it reports is
// what ran (every config served every request with all its tokens, only the
// Seesaw rows ran phases, through a host KV buffer that forced several
// transitions), and bad ratios, pairs and options are refused with the text
// named. No timing is asserted.
#include "bench/seesaw.hpp"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/stories_reference.hpp"

namespace shardline::bench {
namespace bench_seesaw_test {

TEST(SeesawBench, ParsesRatios) {
  auto r = parse_seesaw_ratios("2048/64,1024/256,8/1");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0], (SeesawRatio{2048, 64}));
  EXPECT_EQ((*r)[1], (SeesawRatio{1024, 256}));
  EXPECT_EQ((*r)[2], (SeesawRatio{8, 1}));
  EXPECT_EQ((*r)[1].to_string(), "1024/256");
  auto none = parse_seesaw_ratios("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  for (const auto& [text, item] : {std::pair<const char*, const char*>{"1024", "1024"},
                                   {"1024/0", "1024/0"},
                                   {"a/1", "a/1"},
                                   {"1024/256,", ""},
                                   {"-1/2", "-1/2"},
                                   {"3/4x", "3/4x"},
                                   {"2048/64,/64", "/64"},
                                   {"1/2/3", "1/2/3"}}) {
    auto bad = parse_seesaw_ratios(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(bad.error().message.find(std::string("INPUT/OUTPUT")), std::string::npos) << bad.error().message;
    EXPECT_NE(bad.error().message.find(std::string("got '") + item + "'"), std::string::npos) << bad.error().message;
  }
}

TEST(SeesawBench, ParsesThePair) {
  auto p = parse_seesaw_pair("pp=4:tp=2,pp=2");
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(p->first, (engine::ParallelConfig{.pp = 4}));
  EXPECT_EQ(p->second, (engine::ParallelConfig{.tp = 2, .pp = 2}));
  for (const char* text : {"pp=2", "pp=2:tp=2:sp=2", ""}) {
    auto bad = parse_seesaw_pair(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(bad.error().message.find("CP:CD"), std::string::npos) << bad.error().message;
  }
  auto bad = parse_seesaw_pair("pp=2:xx=2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--seesaw 'pp=2:xx=2'"), std::string::npos) << bad.error().message;
}

// stories260K keeps 1280 bytes of f32 KV per token (5 layers x 2 x 4 heads x
// 8); a host buffer of 100 tokens holds two offloaded 40-token prompts.
constexpr std::uint64_t kKvBytesPerToken = 5 * 2 * 4 * 8 * 4;
constexpr int kHostTokens = 100;

SeesawBenchOptions small() {
  SeesawBenchOptions o;
  o.engine.model_dir = testing_support::kStoriesDir;
  o.engine.num_threads = 1;
  o.engine.block_size = 4;
  o.engine.swap_space_bytes = kHostTokens * kKvBytesPerToken;
  o.cp = {.pp = 2};
  o.cd = {.tp = 2};
  o.ratios = {{40, 4}, {8, 24}};
  o.schedule_ratios = {{16, 16}};
  o.copy_ratios = {{16, 16}};
  o.engine.host_link = comm::LinkSpec{0.05, 100};  // 50 MB/s: each copy lasts a few ms
  o.num_requests = 6;
  o.repeats = 2;
  o.measure_hardware = false;
  return o;
}

TEST(SeesawBench, ReportsWhatRan) {
  const SeesawBenchOptions o = small();
  auto rep = run_seesaw_bench(o);
  ASSERT_TRUE(rep.ok()) << rep.error().to_string();
  EXPECT_EQ(rep->devices, 2);
  EXPECT_EQ(rep->cp, "pp=2");
  EXPECT_EQ(rep->cd, "tp=2");
  // configs: 2 ratios x 2 repeats x 4 configs; schedules: 1 ratio x 2 repeats
  // x 3; copies: 1 ratio x 2 repeats x (sync, async).
  ASSERT_EQ(rep->runs.size(), 2u * 2u * 4u + 2u * 3u + 2u * 2u);
  const char* configs[] = {"static-cd", "static-cp", "static-dp", "seesaw"};
  const char* schedules[] = {"transition-minimizing", "prefill-prioritizing", "decode-prioritizing"};
  std::uint64_t tp_weights = 0, dp_weights = 0;
  for (std::size_t i = 0; i < rep->runs.size(); ++i) {
    const SeesawRun& r = rep->runs[i];
    const bool copy_table = i >= 22;
    const bool schedule_table = i >= 16 && !copy_table;
    SCOPED_TRACE(r.table + " " + r.ratio.to_string() + " " + r.config + " " + r.schedule + " " + r.kv_copy);
    EXPECT_EQ(r.table, copy_table ? "copies" : schedule_table ? "schedules" : "configs");
    // The configs alternate within each repeat.
    EXPECT_EQ(r.config, schedule_table || copy_table ? "seesaw" : configs[i % 4]);
    EXPECT_EQ(r.repeat, copy_table       ? static_cast<int>((i - 22) / 2)
                        : schedule_table ? static_cast<int>((i - 16) / 3)
                                         : static_cast<int>(i % 8 / 4));
    EXPECT_EQ(r.ratio, schedule_table || copy_table ? (SeesawRatio{16, 16}) : o.ratios[i / 8]);
    // Every config served every request to its last token.
    EXPECT_EQ(r.num_requests, o.num_requests);
    EXPECT_EQ(r.num_generated, static_cast<long long>(o.num_requests) * r.ratio.output_len);
    EXPECT_GT(r.total_tok_s, r.output_tok_s);
    EXPECT_GT(r.output_tok_s, 0);
    EXPECT_GT(r.prefill_steps, 0);
    EXPECT_GT(r.decode_steps, 0);
    EXPECT_GT(r.mean_decode_batch, 0);
    EXPECT_GT(r.weight_bytes, 0u);
    if (r.config == "seesaw") {
      EXPECT_EQ(r.parallel, "pp=2->tp=2");
      EXPECT_EQ(r.schedule, schedule_table ? schedules[(i - 16) % 3] : "transition-minimizing");
      // KV copies: async (the default) but in the copies table's sync runs,
      // all paced, so they take time; a sync copy is all waited for. (An
      // async wait can exceed the copies' own time when the prefetcher
      // thread waits for a core, so only the clamped share is bounded.)
      EXPECT_EQ(r.kv_copy, copy_table && i % 2 == 0 ? "sync" : "async");
      EXPECT_GT(r.kv_copy_ms, 0);
      EXPECT_GE(r.hidden_share, 0);
      EXPECT_LE(r.hidden_share, 1);
      if (r.kv_copy == "sync") {
        EXPECT_EQ(r.kv_wait_ms, r.kv_copy_ms);
        EXPECT_EQ(r.hidden_share, 0);
      }
      EXPECT_EQ(r.token_budget, "throttle");  // cp has pp, as static-cp
      EXPECT_GT(r.decode_weight_bytes, 0u);  // rank 0 also holds its tp=2 shard
      // Every prompt went through the host buffer, which holds at most two.
      EXPECT_GE(r.offloads, o.num_requests);
      EXPECT_GE(r.onboards, o.num_requests);
      // Prefill admits only beside the sequences about to be offloaded, so
      // none of them falls back to recomputation, even in this tight buffer.
      EXPECT_EQ(r.offload_fallbacks, 0);
      EXPECT_GT(r.host_peak_tokens, 0);
      EXPECT_LE(r.host_peak_tokens, kHostTokens);
      EXPECT_GT(r.transitions, 0);
      EXPECT_GT(r.transition_ms, 0);
      EXPECT_GT(r.switch_ms, 0);
      EXPECT_LE(r.switch_ms, r.transition_ms);
      // transition-minimizing, 40-token prompts: each prefill phase takes
      // two (the buffer's room), so six need three prefill phases.
      if (r.ratio == SeesawRatio{40, 4} && r.schedule == "transition-minimizing") {
        EXPECT_GE(r.transitions, 5);
      }
    } else {
      EXPECT_EQ(r.schedule, "");
      EXPECT_EQ(r.transitions, 0);
      EXPECT_EQ(r.offloads, 0);
      EXPECT_EQ(r.onboards, 0);
      EXPECT_EQ(r.decode_weight_bytes, 0u);
      EXPECT_EQ(r.kv_copy, "");
      EXPECT_EQ(r.kv_copy_ms, 0);
      EXPECT_EQ(r.parallel, r.config == "static-cd" ? "tp=2" : r.config == "static-cp" ? "pp=2" : "dp=2");
      EXPECT_EQ(r.token_budget, r.config == "static-cp" ? "throttle" : "fixed");
      if (r.config == "static-cd") tp_weights = r.weight_bytes;
      if (r.config == "static-dp") dp_weights = r.weight_bytes;
      // Each of the two dp replicas decodes its half of the requests.
      if (r.config == "static-dp") {
        EXPECT_LE(r.mean_decode_batch, (o.num_requests + 1) / 2);
      }
    }
  }
  // A dp replica holds the whole model; a tp=2 rank about half of it.
  EXPECT_GT(dp_weights, tp_weights);

  // Summary: one row per (table, ratio, config), with the medians of its runs.
  ASSERT_EQ(rep->summary.size(), 2u * 4u + 3u + 2u);
  for (const SeesawSummary& s : rep->summary) {
    EXPECT_EQ(s.runs, 2);
    EXPECT_LE(s.total_tok_s_min, s.total_tok_s);
    EXPECT_GE(s.total_tok_s_max, s.total_tok_s);
    if (s.table == "configs" && s.config == "seesaw") {
      EXPECT_GT(s.speedup_vs_best_static, 0);
      EXPECT_FALSE(s.best_static.empty());
      EXPECT_GT(s.transitions, 0);
    } else {
      EXPECT_EQ(s.speedup_vs_best_static, 0);
    }
  }
  // One JSON object per line: setup, runs, summary rows.
  const std::string json = rep->to_json();
  std::size_t lines = 0;
  for (std::size_t pos = 0; pos < json.size(); ++lines) {
    const std::size_t nl = std::min(json.find('\n', pos), json.size());
    const auto j = nlohmann::json::parse(json.substr(pos, nl - pos));
    EXPECT_EQ(j["row"], lines == 0 ? "setup" : lines <= rep->runs.size() ? "run" : "summary");
    pos = nl + 1;
  }
  EXPECT_EQ(lines, 1 + rep->runs.size() + rep->summary.size());
  EXPECT_NE(rep->to_table().find("pp=2->tp=2"), std::string::npos);
  EXPECT_NE(rep->to_table().find("# copies"), std::string::npos);
}

TEST(SeesawBench, RefusesBadOptions) {
  const auto refused = [](SeesawBenchOptions o, const std::string& text) {
    auto rep = run_seesaw_bench(o);
    ASSERT_FALSE(rep.ok()) << text;
    EXPECT_EQ(rep.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(rep.error().message.find("bench --seesaw: " + text), std::string::npos) << rep.error().message;
  };
  SeesawBenchOptions o = small();
  o.cd = o.cp;
  refused(o, "cp and cd must differ");
  o = small();
  o.cd = {.tp = 4};
  refused(o, "cp and cd must use the same number of devices");
  o = small();
  o.cp = {.pp = 2, .dp = 2};
  refused(o, "cp and cd are one group's configs");
  o = small();
  o.cp = {};
  o.cd = {};
  refused(o, "cp and cd must use the same number of devices, at least 2");
  o = small();
  o.ratios.clear();
  refused(o, "no ratios");
  o = small();
  o.num_requests = 0;
  refused(o, "the requests and the repeats must be >= 1");
  o = small();
  o.repeats = 0;
  refused(o, "the requests and the repeats must be >= 1");
}

}  // namespace
}  // namespace shardline::bench
