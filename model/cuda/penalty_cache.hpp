#pragma once
/// \file
/// Per-sequence penalty lists for device sampling, kept up to date step by
/// step instead of rebuilt. kernels::cuda::make_penalty_list sorts prompt +
/// output ids for every sampled row with a repetition / presence / frequency
/// penalty -- for 256 rows of ~500 tokens, milliseconds of host time per
/// decode step. A sequence's prompt never changes and its output only grows,
/// so the cache folds in just the output ids added since the last step (one
/// binary search and insert each) and gives the same list as
/// make_penalty_list(prompt, output, vocab), element for element.
///
/// Entries of sequences not sampled for `max_idle_steps` steps are dropped
/// (finished or preempted sequences); a dropped or inconsistent entry (the
/// output shorter than what was folded in, another prompt: a request id
/// reused by a later request) is rebuilt
/// from scratch, so the cache never changes a result, only its cost.
/// Plain host C++ (no CUDA), not thread-safe.

#include <algorithm>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/sampling.hpp"

namespace shardline::model {

class PenaltyCache {
 public:
  explicit PenaltyCache(int max_idle_steps = 4) : max_idle_steps_(max_idle_steps) {}

  /// The penalty list of `seq_id` with these prompt and output ids (ids
  /// outside [0, vocab) ignored, as make_penalty_list does). Valid until the
  /// next call for the same sequence or the next end_step().
  [[nodiscard]] const kernels::cuda::PenaltyList& get(std::uint64_t seq_id, std::span<const std::int32_t> prompt_ids,
                                                     std::span<const std::int32_t> output_ids, int vocab) {
    Entry& e = entries_[seq_id];
    e.last_step = step_;
    if (e.vocab != vocab || e.output_len > output_ids.size() ||
        !std::equal(prompt_ids.begin(), prompt_ids.end(), e.prompt.begin(), e.prompt.end())) {
      e.list = kernels::cuda::make_penalty_list(prompt_ids, output_ids, vocab);
      e.vocab = vocab;
      e.prompt.assign(prompt_ids.begin(), prompt_ids.end());
      e.output_len = output_ids.size();
      return e.list;
    }
    for (std::size_t i = e.output_len; i < output_ids.size(); ++i) {
      const std::int32_t id = output_ids[i];
      if (id < 0 || id >= vocab) continue;
      auto& ids = e.list.ids;
      auto& counts = e.list.output_counts;
      const auto it = std::lower_bound(ids.begin(), ids.end(), id);
      const auto pos = it - ids.begin();
      if (it != ids.end() && *it == id) {
        ++counts[static_cast<std::size_t>(pos)];
      } else {
        ids.insert(it, id);
        counts.insert(counts.begin() + pos, 1);
      }
    }
    e.output_len = output_ids.size();
    return e.list;
  }

  /// Ends a step: drops the entries not used in the last max_idle_steps steps.
  void end_step() {
    ++step_;
    for (auto it = entries_.begin(); it != entries_.end();)
      it = step_ - it->second.last_step > static_cast<std::uint64_t>(max_idle_steps_) ? entries_.erase(it)
                                                                                      : std::next(it);
  }

  [[nodiscard]] std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    kernels::cuda::PenaltyList list;
    int vocab = -1;
    std::vector<std::int32_t> prompt;  ///< the prompt the list was built from (an id may be reused)
    std::size_t output_len = 0;  ///< output ids folded in
    std::uint64_t last_step = 0;
  };
  std::unordered_map<std::uint64_t, Entry> entries_;
  std::uint64_t step_ = 0;
  int max_idle_steps_;
};

}  // namespace shardline::model
