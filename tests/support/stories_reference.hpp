#pragma once
// The stories260K greedy reference (deploy/demo/stories260K/reference_greedy.json:
// numpy float32 forward pass, ids identical to llama2.c run.c) and a top-5
// logits check shared by the golden tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/weights.hpp"

namespace shardline::testing_support {

inline const std::string kStoriesDir = std::string(SHARDLINE_SOURCE_DIR) + "/deploy/demo/stories260K";

/// stories260K's weights (F32), loaded once per test binary.
inline std::shared_ptr<const model::ModelWeights> stories_weights() {
  static const std::shared_ptr<const model::ModelWeights> w = [] {
    auto loaded = model::load_model(kStoriesDir, model::LoadOptions{});
    return loaded.ok() ? std::make_shared<const model::ModelWeights>(std::move(loaded).value()) : nullptr;
  }();
  return w;
}

struct StoriesCase {
  std::string prompt;
  std::vector<std::int32_t> prompt_ids;     // with BOS
  std::vector<std::int32_t> generated_ids;  // 48 greedy tokens
  std::string full_text;
  std::vector<std::vector<std::pair<int, float>>> top5;  // [step][rank] -> (id, logit)
};

inline std::vector<StoriesCase> load_stories_reference() {
  std::ifstream in(kStoriesDir + "/reference_greedy.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<StoriesCase> out;
  for (const auto& c : j.at("cases")) {
    StoriesCase r;
    r.prompt = c.at("prompt").get<std::string>();
    r.prompt_ids = c.at("prompt_ids").get<std::vector<std::int32_t>>();
    r.generated_ids = c.at("generated_ids").get<std::vector<std::int32_t>>();
    r.full_text = c.at("full_text").get<std::string>();
    for (const auto& step : c.at("step_top5_logits")) {
      std::vector<std::pair<int, float>> s;
      for (const auto& e : step) s.emplace_back(e.at(0).get<int>(), e.at(1).get<float>());
      r.top5.push_back(std::move(s));
    }
    out.push_back(std::move(r));
  }
  return out;
}

/// The reference cases' prompt ids (with BOS), in case order.
inline std::vector<std::vector<std::int32_t>> stories_prompt_ids() {
  std::vector<std::vector<std::int32_t>> out;
  for (const StoriesCase& c : load_stories_reference()) out.push_back(c.prompt_ids);
  return out;
}

/// The 5 largest logits are the reference ids, in order, each within 1e-4.
inline void expect_top5(const std::vector<float>& logits, const std::vector<std::pair<int, float>>& ref,
                        const std::string& where) {
  std::vector<int> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(idx[i], ref[i].first) << where << " rank " << i;
    EXPECT_NEAR(logits[ref[i].first], ref[i].second, 1e-4) << where << " token " << ref[i].first;
  }
}

}  // namespace shardline::testing_support
