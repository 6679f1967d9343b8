#include "sampling/logprobs.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace shardline::sampling {

SampleLogprobs compute_logprobs(std::span<const float> logits, std::int32_t sampled_id, int num_top) {
  const auto vocab = static_cast<std::int32_t>(logits.size());
  auto value = [&](std::int32_t i) {
    const float x = logits[static_cast<std::size_t>(i)];
    return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x;
  };
  float max_logit = -std::numeric_limits<float>::infinity();
  for (std::int32_t i = 0; i < vocab; ++i) max_logit = std::max(max_logit, value(i));
  double sum = 0.0;
  if (std::isfinite(max_logit))
    for (std::int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(value(i)) - max_logit);
  // All -inf (cannot happen for a real model): every token gets -inf.
  const double log_z = std::isfinite(max_logit) ? max_logit + std::log(sum) : std::numeric_limits<double>::infinity();
  auto logprob = [&](std::int32_t i) { return static_cast<float>(static_cast<double>(value(i)) - log_z); };

  SampleLogprobs out;
  out.sampled = {sampled_id, logprob(sampled_id)};
  const int k = std::clamp(num_top, 0, static_cast<int>(vocab));
  if (k == 0) return out;
  // One pass keeping the k best in `best`, sorted by (value desc, id asc).
  std::vector<std::int32_t> best;
  best.reserve(static_cast<std::size_t>(k) + 1);
  auto better = [&](std::int32_t a, std::int32_t b) { return value(a) > value(b) || (value(a) == value(b) && a < b); };
  for (std::int32_t i = 0; i < vocab; ++i) {
    if (static_cast<int>(best.size()) == k && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (static_cast<int>(best.size()) > k) best.pop_back();
  }
  out.top.reserve(best.size());
  for (std::int32_t id : best) out.top.push_back({id, logprob(id)});
  return out;
}

}  // namespace shardline::sampling
