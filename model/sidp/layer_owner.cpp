#include "model/sidp/layer_owner.hpp"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "kernels/cpu/ops.hpp"
#include "model/weight_pack.hpp"

namespace shardline::model::sidp {

namespace kc = kernels::cpu;

namespace {

[[nodiscard]] std::size_t align64(std::size_t v) { return (v + 63) / 64 * 64; }

/// Appends the parts of `m` (one per run of rows of one format) from
/// `offset`; returns the offset after the last one (unaligned).
Result<std::size_t> place_parts(const Matrix& m, const std::string& what, std::size_t offset,
                                std::vector<RegionPart>& parts) {
  for (const RowRun& run : m.runs()) {
    auto bytes = kc::packed_part_bytes(m.dtype, run.type, run.rows, m.cols);
    if (!bytes.ok()) return make_error(bytes.error().code, what + ": " + bytes.error().message);
    offset = align64(offset);
    parts.push_back(RegionPart{kc::PackedPart{m.dtype, run.type, run.rows, m.cols, *bytes, nullptr}, offset});
    offset += *bytes;
  }
  return offset;
}

/// Packs the rows of run `run` of `m` (its part `p`) into `dst`.
Status pack_part_into(const Matrix& m, const RowRun& run, const RegionPart& p, std::byte* dst,
                      const std::string& what) {
  auto w = pack_part(m.dtype, run.type, run.data, run.rows, m.cols, what);
  if (!w.ok()) return w.error();
  const kc::PackedPart packed = w->parts().front();  // one run: one part
  std::memcpy(dst + p.offset, packed.data, packed.bytes);
  return Status::ok_status();
}

Result<kc::PackedWeight> view_parts(const std::vector<RegionPart>& parts, const std::byte* base) {
  std::vector<kc::PackedPart> at;
  for (const RegionPart& p : parts) {
    kc::PackedPart v = p.part;
    v.data = base + p.offset;
    at.push_back(v);
  }
  return kc::PackedWeight::view(at);
}

}  // namespace

Result<FfnLayout> ffn_layout(const ModelConfig& c, const LayerWeights& lw, int layer) {
  FfnLayout l;
  l.dtype = lw.gate_up.dtype;
  l.hidden = c.hidden_size;
  l.intermediate = c.intermediate_size;
  const std::string b = "blk." + std::to_string(layer) + ".";
  auto gu_end = place_parts(lw.gate_up, b + "ffn_gate_up", 0, l.gate_up_parts);
  if (!gu_end.ok()) return gu_end.error();
  l.gate_up_bytes = *gu_end;
  l.down_offset = align64(l.gate_up_bytes);
  auto dn_end = place_parts(lw.down_proj, b + "ffn_down", l.down_offset, l.down_parts);
  if (!dn_end.ok()) return dn_end.error();
  l.down_bytes = *dn_end - l.down_offset;
  l.bytes = *dn_end;
  return l;
}

std::string ffn_region_name(int layer) { return "sidp.ffn." + std::to_string(layer); }

Result<FfnMatrices> ffn_views(const FfnLayout& l, const void* region) {
  const auto* base = static_cast<const std::byte*>(region);
  auto gu = view_parts(l.gate_up_parts, base);
  if (!gu.ok()) return gu.error();
  auto dn = view_parts(l.down_parts, base);
  if (!dn.ok()) return dn.error();
  return FfnMatrices{std::move(gu).value(), std::move(dn).value()};
}

void ffn_forward(const FfnMatrices& w, const float* x, int rows, float* gate_up, float* act, float* out) {
  const int hidden = w.gate_up.in_features();
  const int inter = w.down.in_features();
  kc::linear(x, rows, hidden, w.gate_up, nullptr, gate_up, 2 * inter);
  kc::silu_and_mul(gate_up, act, rows, inter);
  kc::linear(act, rows, inter, w.down, nullptr, out, hidden);
}

LayerOwner::LayerOwner(std::shared_ptr<const ModelWeights> weights, int rank, std::vector<int> owned,
                       std::vector<FfnLayout> layouts, std::string format)
    : weights_(std::move(weights)),
      rank_(rank),
      owned_(std::move(owned)),
      layouts_(std::move(layouts)),
      format_(std::move(format)) {}

LayerOwner::~LayerOwner() = default;

Result<std::unique_ptr<LayerOwner>> LayerOwner::create(std::shared_ptr<const ModelWeights> weights,
                                                       const OwnershipPlan& plan, int rank) {
  if (!weights) return make_error(ErrorCode::invalid_argument, "sidp owner: no weights");
  if (rank < 0 || rank >= plan.dp)
    return make_error(ErrorCode::invalid_argument, "sidp owner: rank " + std::to_string(rank) + " outside dp=" +
                                                       std::to_string(plan.dp));
  if (plan.num_layers() != weights->config.num_hidden_layers)
    return make_error(ErrorCode::invalid_argument,
                      "sidp owner: the plan has " + std::to_string(plan.num_layers()) + " layers, the model " +
                          std::to_string(weights->config.num_hidden_layers));
  std::vector<FfnLayout> layouts;
  std::string format;
  for (std::size_t l = 0; l < weights->layers.size(); ++l) {
    const LayerWeights& lw = weights->layers[l];
    auto layout = ffn_layout(weights->config, lw, static_cast<int>(l));
    if (!layout.ok()) return make_error(layout.error().code, "sidp owner: " + layout.error().message);
    layouts.push_back(std::move(layout).value());
    for (const auto* parts : {&layouts.back().gate_up_parts, &layouts.back().down_parts})
      for (const RegionPart& p : *parts) {
        const std::string name = p.part.quant ? kernels::ggml_type_name(static_cast<std::uint32_t>(*p.part.quant))
                                              : std::string(dtype_name(p.part.dtype));
        if (("+" + format + "+").find("+" + name + "+") == std::string::npos)
          format += (format.empty() ? "" : "+") + name;
      }
  }
  return std::unique_ptr<LayerOwner>(
      new LayerOwner(std::move(weights), rank, plan.owned_layers(rank), std::move(layouts), std::move(format)));
}

Status LayerOwner::load(comm::Communicator* comm) {
  std::unique_lock use(use_mu_);
  {
    std::lock_guard lk(mu_);
    if (loaded_) return Status::ok_status();
  }
  std::vector<AlignedBuffer> regions;
  for (int l : owned_) {
    const LayerWeights& lw = weights_->layers[static_cast<std::size_t>(l)];
    const FfnLayout& layout = layouts_[static_cast<std::size_t>(l)];
    AlignedBuffer region = allocate_aligned(layout.bytes);
    if (!region)
      return make_error(ErrorCode::out_of_memory, "sidp owner " + std::to_string(rank_) + ": cannot allocate " +
                                                      std::to_string(layout.bytes) + " bytes for layer " +
                                                      std::to_string(l));
    auto* base = static_cast<std::byte*>(region.get());
    std::memset(base, 0, layout.bytes);
    const std::string b = "sidp owner: blk." + std::to_string(l) + ".";
    for (const auto& [m, parts, what] : {std::tuple{&lw.gate_up, &layout.gate_up_parts, b + "ffn_gate_up"},
                                         std::tuple{&lw.down_proj, &layout.down_parts, b + "ffn_down"}}) {
      const std::vector<RowRun> runs = m->runs();
      for (std::size_t i = 0; i < runs.size(); ++i)
        if (Status st = pack_part_into(*m, runs[i], (*parts)[i], base, what); !st) return st;
    }
    regions.push_back(std::move(region));
  }
  if (comm != nullptr) {
    for (std::size_t i = 0; i < owned_.size(); ++i) {
      const std::size_t bytes = layouts_[static_cast<std::size_t>(owned_[i])].bytes;
      if (Status st = comm->expose(ffn_region_name(owned_[i]), regions[i].get(), bytes); !st) {
        for (std::size_t j = 0; j < i; ++j) (void)comm->unexpose(ffn_region_name(owned_[j]));
        return st;
      }
    }
  }
  {
    std::lock_guard lk(mu_);
    regions_ = std::move(regions);
    loaded_ = true;
    ++loads_;
  }
  loaded_cv_.notify_all();
  return Status::ok_status();
}

void LayerOwner::unload(comm::Communicator* comm) {
  std::unique_lock use(use_mu_);  // waits for the leases in use
  std::lock_guard lk(mu_);
  if (!loaded_) return;
  if (comm != nullptr)
    for (int l : owned_) (void)comm->unexpose(ffn_region_name(l));  // waits for gets in flight
  regions_.clear();
  loaded_ = false;
}

bool LayerOwner::loaded() const {
  std::lock_guard lk(mu_);
  return loaded_;
}

std::vector<std::size_t> LayerOwner::region_bytes() const {
  std::vector<std::size_t> out;
  for (const FfnLayout& l : layouts_) out.push_back(l.bytes);
  return out;
}

std::size_t LayerOwner::weight_bytes() const {
  std::size_t total = 0;
  for (int l : owned_) total += layouts_[static_cast<std::size_t>(l)].bytes;
  return total;
}

std::uint64_t LayerOwner::loads() const {
  std::lock_guard lk(mu_);
  return loads_;
}

Result<LayerOwner::Lease> LayerOwner::acquire(int layer, std::chrono::milliseconds wait) {
  const auto it = std::find(owned_.begin(), owned_.end(), layer);
  if (it == owned_.end())
    return make_error(ErrorCode::invalid_argument,
                      "sidp owner " + std::to_string(rank_) + " does not own layer " + std::to_string(layer));
  const std::size_t idx = static_cast<std::size_t>(it - owned_.begin());
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    Lease lease;
    lease.lock_ = std::shared_lock(use_mu_);
    {
      std::unique_lock lk(mu_);
      if (loaded_) {
        auto views = ffn_views(layouts_[static_cast<std::size_t>(layer)], regions_[idx].get());
        if (!views.ok()) return views.error();
        lease.m_ = std::move(views).value();
        return lease;
      }
    }
    lease.lock_.unlock();
    std::unique_lock lk(mu_);
    if (!loaded_cv_.wait_until(lk, deadline, [&] { return loaded_; }))
      return make_error(ErrorCode::io, "sidp owner " + std::to_string(rank_) + " of layer " + std::to_string(layer) +
                                           " is down and was not respawned within " +
                                           std::to_string(wait.count()) + " ms");
  }
}

}  // namespace shardline::model::sidp
