// model/cuda/penalty_cache.hpp: the incrementally kept penalty list equals
// make_penalty_list of the whole prompt + output at every step, through
// growth, out-of-range ids, eviction and a reused sequence id. Plain host
// code: runs in every build.
#include "model/cuda/penalty_cache.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace shardline::model {
namespace model_cuda_penalty_cache_test {

void expect_same(const kernels::cuda::PenaltyList& got, const kernels::cuda::PenaltyList& want, int step) {
  EXPECT_EQ(got.ids, want.ids) << "step " << step;
  EXPECT_EQ(got.output_counts, want.output_counts) << "step " << step;
}

TEST(PenaltyCache, IncrementalListEqualsARebuildEveryStep) {
  constexpr int kVocab = 50;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> id(-3, kVocab + 2);  // some out of range
  PenaltyCache cache;
  std::vector<std::vector<std::int32_t>> prompts(6), outputs(6);
  for (auto& p : prompts)
    for (int i = 0; i < 20; ++i) p.push_back(id(rng));
  for (int step = 0; step < 200; ++step) {
    for (std::size_t s = 0; s < prompts.size(); ++s) {
      if ((step + static_cast<int>(s)) % 3 == 0) continue;  // not sampled every step
      const int grow = step % 7 == 0 ? 3 : 1;                // several new ids at once too
      for (int g = 0; g < grow; ++g) outputs[s].push_back(id(rng));
      expect_same(cache.get(s, prompts[s], outputs[s], kVocab),
                  kernels::cuda::make_penalty_list(prompts[s], outputs[s], kVocab), step);
    }
    cache.end_step();
  }
  EXPECT_EQ(cache.size(), prompts.size());
}

TEST(PenaltyCache, IdleEntriesAreDroppedAndReusedIdsRebuilt) {
  PenaltyCache cache(2);
  const std::vector<std::int32_t> prompt_a = {1, 2, 3}, prompt_b = {7, 8, 9};
  std::vector<std::int32_t> out = {4};
  (void)cache.get(1, prompt_a, out, 10);
  for (int i = 0; i < 3; ++i) cache.end_step();
  EXPECT_EQ(cache.size(), 0u);
  // A new request reusing id 1 with another prompt of the same length and an
  // empty output: the list is the new prompt's, not the old one's.
  (void)cache.get(1, prompt_a, {}, 10);
  cache.end_step();
  const std::vector<std::int32_t> none;
  expect_same(cache.get(1, prompt_b, none, 10), kernels::cuda::make_penalty_list(prompt_b, none, 10), 0);
  // An output that shrank (a different request) is rebuilt too.
  out = {4, 4, 5};
  (void)cache.get(2, prompt_a, out, 10);
  const std::vector<std::int32_t> shorter = {6};
  expect_same(cache.get(2, prompt_a, shorter, 10), kernels::cuda::make_penalty_list(prompt_a, shorter, 10), 1);
}

}  // namespace
}  // namespace shardline::model
