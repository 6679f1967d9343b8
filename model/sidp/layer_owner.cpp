#include "model/sidp/layer_owner.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/ops.hpp"

namespace shardline::model::sidp {

namespace kc = kernels::cpu;

FfnLayout ffn_layout(const ModelConfig& c, DType dtype) {
  FfnLayout l;
  l.dtype = dtype;
  l.hidden = c.hidden_size;
  l.intermediate = c.intermediate_size;
  l.gate_up_bytes = kc::PackedLinear::packed_bytes(dtype, 2 * c.intermediate_size, c.hidden_size);
  l.down_offset = (l.gate_up_bytes + 63) / 64 * 64;
  l.down_bytes = kc::PackedLinear::packed_bytes(dtype, c.hidden_size, c.intermediate_size);
  l.bytes = l.down_offset + l.down_bytes;
  return l;
}

std::string ffn_region_name(int layer) { return "sidp.ffn." + std::to_string(layer); }

FfnMatrices ffn_views(const FfnLayout& l, const void* region) {
  const auto* base = static_cast<const std::byte*>(region);
  return FfnMatrices{kc::PackedLinear::view(base, l.dtype, 2 * l.intermediate, l.hidden),
                     kc::PackedLinear::view(base + l.down_offset, l.dtype, l.hidden, l.intermediate)};
}

void ffn_forward(const FfnMatrices& w, const float* x, int rows, float* gate_up, float* act, float* out) {
  const int hidden = w.gate_up.in_features();
  const int inter = w.down.in_features();
  kc::linear(x, rows, hidden, w.gate_up, nullptr, gate_up, 2 * inter);
  kc::silu_and_mul(gate_up, act, rows, inter);
  kc::linear(act, rows, inter, w.down, nullptr, out, hidden);
}

LayerOwner::LayerOwner(std::shared_ptr<const ModelWeights> weights, int rank, std::vector<int> owned,
                       FfnLayout layout)
    : weights_(std::move(weights)), rank_(rank), owned_(std::move(owned)), layout_(layout) {}

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
  for (const LayerWeights& lw : weights->layers)
    if (lw.gate_up.quantized() || lw.down_proj.quantized())
      return make_error(ErrorCode::unsupported,
                        "sidp owner: the FFN weights are quantized (" + lw.gate_up.format_name() +
                            "); SiDP shares dense layers only (model::dequantized_weights)");
  const FfnLayout layout = ffn_layout(weights->config, weights->dtype);
  return std::unique_ptr<LayerOwner>(new LayerOwner(std::move(weights), rank, plan.owned_layers(rank), layout));
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
    AlignedBuffer region = allocate_aligned(layout_.bytes);
    if (!region)
      return make_error(ErrorCode::out_of_memory, "sidp owner " + std::to_string(rank_) + ": cannot allocate " +
                                                      std::to_string(layout_.bytes) + " bytes for layer " +
                                                      std::to_string(l));
    auto* base = static_cast<std::byte*>(region.get());
    std::memset(base, 0, layout_.bytes);
    const kc::PackedLinear gu = kc::PackedLinear::pack(lw.gate_up.data, lw.gate_up.dtype, lw.gate_up.rows,
                                                       lw.gate_up.cols);
    const kc::PackedLinear dn = kc::PackedLinear::pack(lw.down_proj.data, lw.down_proj.dtype, lw.down_proj.rows,
                                                       lw.down_proj.cols);
    std::memcpy(base, gu.data(), gu.bytes());
    std::memcpy(base + layout_.down_offset, dn.data(), dn.bytes());
    regions.push_back(std::move(region));
  }
  if (comm != nullptr) {
    for (std::size_t i = 0; i < owned_.size(); ++i) {
      if (Status st = comm->expose(ffn_region_name(owned_[i]), regions[i].get(), layout_.bytes); !st) {
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
        lease.m_ = ffn_views(layout_, regions_[idx].get());
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
