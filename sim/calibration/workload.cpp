#include "sim/calibration/workload.hpp"

#include <algorithm>
#include <utility>

namespace shardline::sim::calibration {

std::vector<std::vector<std::int32_t>> random_prompts(int num, int len, int vocab, std::uint64_t seed) {
  std::vector<std::vector<std::int32_t>> prompts(static_cast<std::size_t>(num));
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& p : prompts) {
    p.resize(static_cast<std::size_t>(len));
    for (auto& t : p) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<std::int32_t>(3 + (state >> 33) % static_cast<std::uint64_t>(vocab - 3));
    }
  }
  return prompts;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double decode_median_ms(const engine::LlmEngine& engine, int batch) {
  std::vector<double> ms;
  for (const engine::StepStats& s : engine.step_stats())
    if (s.num_prefill_tokens == 0 && s.num_decode_tokens == batch) ms.push_back(s.step_ms);
  return median(std::move(ms));
}

}  // namespace shardline::sim::calibration
