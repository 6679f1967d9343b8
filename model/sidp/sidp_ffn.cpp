#include "model/sidp/sidp_ffn.hpp"

#include <algorithm>
#include <cstring>

namespace shardline::model::sidp {

SidpFfn::SidpFfn(const OwnershipPlan& plan, int rank, std::shared_ptr<LayerOwner> owner,
                 comm::Communicator* weights_comm, const SidpFfnOptions& options)
    : SidpRankFfn(plan, rank, weights_comm, options.initial_mode),
      owner_(std::move(owner)),
      options_(options),
      hidden_(owner_->layout(0).hidden),
      intermediate_(owner_->layout(0).intermediate) {}

SidpFfn::~SidpFfn() = default;

Result<std::shared_ptr<SidpFfn>> SidpFfn::create(const OwnershipPlan& plan, int rank, std::shared_ptr<LayerOwner> owner,
                                                 comm::Communicator* weights_comm, comm::Communicator* compute_comm,
                                                 const SidpFfnOptions& options) {
  if (!owner) return make_error(ErrorCode::invalid_argument, "sidp: no layer owner");
  if (owner->rank() != rank)
    return make_error(ErrorCode::invalid_argument, "sidp: the layer owner is rank " + std::to_string(owner->rank()));
  if (Status st = check_rank(plan, rank, weights_comm, compute_comm, options.initial_mode); !st) return st.error();
  std::shared_ptr<SidpFfn> f(new SidpFfn(plan, rank, std::move(owner), weights_comm, options));
  if (Status st = f->attach_compute(compute_comm); !st) return st.error();
  if (Status st = f->make_cache(f->owner_->region_bytes(), options); !st) return st.error();
  return f;
}

std::size_t SidpFfn::ffn_weight_bytes() const { return owner_->weight_bytes() + cache_bytes(); }

Status SidpFfn::begin_step(int num_rows) { return begin_control(num_rows); }

Status SidpFfn::serve(int layer, const float* x, int num_rows, float* out) {
  const int hidden = hidden_;
  const int inter = intermediate_;
  const std::size_t row_elems = static_cast<std::size_t>(hidden);
  const int total = num_rows + peer_rows_to_serve();
  if (total == 0) return Status::ok_status();
  if (staging_.size() < static_cast<std::size_t>(total) * row_elems) {
    staging_.resize(static_cast<std::size_t>(total) * row_elems);
    staged_out_.resize(static_cast<std::size_t>(total) * row_elems);
  }
  // Staging: this rank's rows first, then each non-dummy peer's in rank order.
  const std::size_t own_elems = static_cast<std::size_t>(num_rows) * row_elems;
  if (num_rows > 0) std::memcpy(staging_.data(), x, own_elems * sizeof(float));
  if (Status st = recv_peer_rows(layer, staging_.data() + own_elems, hidden); !st) return st;
  auto lease = owner_->acquire(layer, options_.cache.owner_wait);
  if (!lease) return std::move(lease).error();
  gate_up_.resize(std::max(gate_up_.size(), static_cast<std::size_t>(total) * 2 * inter));
  act_.resize(std::max(act_.size(), static_cast<std::size_t>(total) * inter));
  ffn_forward(lease->matrices(), staging_.data(), total, gate_up_.data(), act_.data(), staged_out_.data());
  if (num_rows > 0) std::memcpy(out, staged_out_.data(), own_elems * sizeof(float));
  return send_peer_rows(layer, staged_out_.data() + own_elems, hidden, total);
}

Status SidpFfn::forward(int layer, const float* x, int num_rows, float* out) {
  const int inter = intermediate_;
  const int owner = plan_.owner(layer);
  if (mode() == SidpMode::cas) {
    if (owner != rank_) return num_rows > 0 ? exchange_with_owner(layer, x, num_rows, hidden_, out)
                                            : Status::ok_status();
    Status st = serve(layer, x, num_rows, out);
    if (!st) mark_broken();
    return st;
  }
  gate_up_.resize(std::max(gate_up_.size(), static_cast<std::size_t>(num_rows) * 2 * inter));
  act_.resize(std::max(act_.size(), static_cast<std::size_t>(num_rows) * inter));
  if (owner == rank_) {
    auto lease = owner_->acquire(layer, options_.cache.owner_wait);
    if (!lease) return std::move(lease).error();
    ffn_forward(lease->matrices(), x, num_rows, gate_up_.data(), act_.data(), out);
    return Status::ok_status();
  }
  auto region = cache_->acquire(layer);
  if (!region) return std::move(region).error();
  auto views = ffn_views(owner_->layout(layer), *region);
  if (views.ok()) ffn_forward(*views, x, num_rows, gate_up_.data(), act_.data(), out);
  cache_->release(layer);
  return views.ok() ? Status::ok_status() : Status(views.error());
}

void SidpFfn::abort_step() { abort_control(); }

}  // namespace shardline::model::sidp
