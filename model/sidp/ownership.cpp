#include "model/sidp/ownership.hpp"

#include <algorithm>
#include <charconv>
#include <deque>

namespace shardline::model::sidp {

namespace {
Error invalid(std::string msg) { return make_error(ErrorCode::invalid_argument, "sidp ownership: " + std::move(msg)); }
}  // namespace

std::vector<int> OwnershipPlan::owned_layers(int rank) const {
  std::vector<int> out;
  for (int l = 0; l < num_layers(); ++l)
    if (owner(l) == rank) out.push_back(l);
  return out;
}

std::vector<int> OwnershipPlan::remote_layers(int rank) const {
  std::vector<int> out;
  for (int l = 0; l < num_layers(); ++l)
    if (owner(l) != rank) out.push_back(l);
  return out;
}

std::string OwnershipPlan::to_string() const {
  std::string s;
  for (std::size_t l = 0; l < owner_of_layer.size(); ++l) {
    if (l > 0) s += ',';
    s += std::to_string(owner_of_layer[l]);
  }
  return s;
}

Result<OwnershipPlan> balanced_plan(int num_layers, int dp) {
  if (num_layers < 1) return invalid("the model has no layers");
  if (dp < 2) return invalid("weight sharing needs a DP group of at least 2 ranks, got dp=" + std::to_string(dp));
  OwnershipPlan p;
  p.dp = dp;
  p.owner_of_layer.resize(static_cast<std::size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) p.owner_of_layer[static_cast<std::size_t>(l)] = l % dp;
  return p;
}

Result<OwnershipPlan> parse_plan(std::string_view text, int num_layers, int dp) {
  if (text.empty() || text == "balanced") return balanced_plan(num_layers, dp);
  if (dp < 2) return invalid("weight sharing needs a DP group of at least 2 ranks, got dp=" + std::to_string(dp));
  OwnershipPlan p;
  p.dp = dp;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view part = text.substr(pos, comma - pos);
    int owner = -1;
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), owner);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size())
      return invalid("owner '" + std::string(part) + "' of layer " + std::to_string(p.owner_of_layer.size()) +
                     " is not a number (expected e.g. 0,1,0,1 or balanced)");
    if (owner < 0 || owner >= dp)
      return invalid("layer " + std::to_string(p.owner_of_layer.size()) + " is owned by rank " +
                     std::to_string(owner) + ", outside [0, " + std::to_string(dp) + ")");
    p.owner_of_layer.push_back(owner);
    pos = comma + 1;
  }
  if (p.num_layers() != num_layers)
    return invalid("the plan names " + std::to_string(p.num_layers()) + " owners but the model has " +
                   std::to_string(num_layers) + " layers");
  return p;
}

std::vector<int> prefetch_order(const OwnershipPlan& plan, int rank, bool peak_shifting) {
  if (!peak_shifting) return plan.remote_layers(rank);
  std::vector<int> order;
  const int n = plan.num_layers();
  for (int c = 0; c < n; c += plan.dp) {
    const int len = std::min(plan.dp, n - c);  // the last cycle may be short
    for (int i = 0; i < len; ++i) {
      const int l = c + (rank + i) % len;
      if (plan.owner(l) != rank) order.push_back(l);
    }
  }
  return order;
}

int min_cache_slots(const OwnershipPlan& plan, int rank, const std::vector<int>& fetch_order) {
  const std::vector<int> compute = plan.remote_layers(rank);
  if (compute.empty()) return 0;
  const std::size_t passes = 2;
  for (std::size_t slots = 1; slots <= compute.size(); ++slots) {
    // The ring holds a multiset of fetched-but-not-computed layers.
    std::deque<int> ring;
    std::size_t fetched = 0;
    bool ok = true;
    for (std::size_t k = 0; k < passes * compute.size() && ok; ++k) {
      while (ring.size() < slots && fetched < passes * fetch_order.size())
        ring.push_back(fetch_order[fetched++ % fetch_order.size()]);
      const auto it = std::find(ring.begin(), ring.end(), compute[k % compute.size()]);
      if (it == ring.end()) ok = false;
      else ring.erase(it);
    }
    if (ok) return static_cast<int>(slots);
  }
  return static_cast<int>(compute.size());
}

}  // namespace shardline::model::sidp
