#include "worker/kv_progress.hpp"

#include <algorithm>

namespace shardline::worker {

void KvProgressTracker::seed(std::uint64_t job_id, std::uint64_t request_id, std::vector<std::int32_t> output_ids) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[{job_id, request_id}];
  e.known.assign(output_ids.size(), true);
  e.output_ids = std::move(output_ids);
}

std::vector<KvProgress> KvProgressTracker::on_flushed(std::span<const QueuedIncrement> flushed,
                                                      std::span<const KvStoreAck> acks) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const QueuedIncrement& inc : flushed) {
    Entry& e = entries_[{inc.key.job_id, inc.key.request_id}];
    e.num_prompt_tokens = inc.num_prompt_tokens;
    const int begin = inc.key.range.token_begin;
    for (std::size_t i = 0; i < inc.token_ids.size(); ++i) {
      const int pos = begin + static_cast<int>(i);
      if (pos < inc.num_prompt_tokens) continue;
      const auto slot = static_cast<std::size_t>(pos - inc.num_prompt_tokens);
      if (slot >= e.output_ids.size()) {
        e.output_ids.resize(slot + 1, 0);
        e.known.resize(slot + 1, false);
      }
      e.output_ids[slot] = inc.token_ids[i];
      e.known[slot] = true;
    }
  }
  std::vector<KvProgress> out;
  for (const KvStoreAck& a : acks) {
    auto it = entries_.find({a.job_id, a.request_id});
    if (it == entries_.end() || it->second.num_prompt_tokens < 0) continue;
    Entry& e = it->second;
    // Generated tokens known without a gap from the first.
    const auto first_gap = std::find(e.known.begin(), e.known.end(), false);
    const int known = static_cast<int>(first_gap - e.known.begin());
    // The resume feeds the tokens at positions [np, end) as generated and
    // restores KV for positions [0, t) with t <= np + out - 1
    // (engine/llm_engine.hpp ResumeState): the last fed token's position is
    // recomputed to sample the next one. Never feeding the token at the
    // acknowledged end keeps a finished choice's last token (EOS, a stop,
    // the max_tokens-th) out of its resume: its KV is never computed.
    const int np = e.num_prompt_tokens;
    const int end = std::min(a.tokens, np + known);
    const int out_count = std::max(0, end - np);
    const int t = std::min(a.tokens, std::max(0, np + out_count - 1));
    if (t <= e.reported) continue;
    e.reported = t;
    KvProgress p;
    p.job_id = a.job_id;
    p.line_index = a.request_id >> 8;
    p.choice = static_cast<int>(a.request_id & 0xFF);
    p.replicated_tokens = t;
    p.output_ids.assign(e.output_ids.begin(), e.output_ids.begin() + out_count);
    out.push_back(std::move(p));
  }
  return out;
}

void KvProgressTracker::forget(std::uint64_t job_id, std::uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase({job_id, request_id});
}

void KvProgressTracker::forget_job(std::uint64_t job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(entries_.lower_bound({job_id, 0}), entries_.lower_bound({job_id + 1, 0}));
}

std::size_t KvProgressTracker::tracked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace shardline::worker
