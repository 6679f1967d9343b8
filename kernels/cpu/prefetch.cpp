#include "kernels/cpu/prefetch.hpp"

#include <algorithm>

namespace shardline::kernels::cpu {

void LinePrefetchQueue::assign(std::vector<std::vector<LineRun>> per_thread) {
  slices_ = std::move(per_thread);
  next_.assign(slices_.size(), 0);
  total_lines_ = 0;
  for (const std::vector<LineRun>& slice : slices_)
    for (const LineRun& r : slice) total_lines_ += static_cast<std::size_t>(std::max(r.lines, 0));
}

bool LinePrefetchQueue::pop(int thread, LineRun& run) {
  if (thread < 0 || static_cast<std::size_t>(thread) >= slices_.size()) return false;
  const std::size_t t = static_cast<std::size_t>(thread);
  if (next_[t] >= slices_[t].size()) return false;
  run = slices_[t][next_[t]++];
  return true;
}

std::size_t LinePrefetchQueue::runs_left() const {
  std::size_t n = 0;
  for (std::size_t t = 0; t < slices_.size(); ++t) n += slices_[t].size() - next_[t];
  return n;
}

std::size_t LinePrefetchQueue::size() const {
  std::size_t n = 0;
  for (const std::vector<LineRun>& slice : slices_) n += slice.size();
  return n;
}

}  // namespace shardline::kernels::cpu
