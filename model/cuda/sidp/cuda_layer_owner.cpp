#include "model/cuda/sidp/cuda_layer_owner.hpp"

#include <cuda_runtime.h>

#include <string>

#include "model/cuda/cuda_runner.hpp"

namespace shardline::model::sidp {

FfnLayout cuda_ffn_layout(const ModelConfig& config, DType weight_dtype) {
  FfnLayout l;
  l.dtype = weight_dtype;
  l.hidden = config.hidden_size;
  l.intermediate = config.intermediate_size;
  const std::size_t elem = dtype_size(weight_dtype);
  l.gate_up_bytes = 2 * static_cast<std::size_t>(l.intermediate) * static_cast<std::size_t>(l.hidden) * elem;
  l.down_offset = (l.gate_up_bytes + 255) / 256 * 256;
  l.down_bytes = static_cast<std::size_t>(l.hidden) * static_cast<std::size_t>(l.intermediate) * elem;
  l.bytes = l.down_offset + l.down_bytes;
  return l;
}

Result<std::shared_ptr<CudaLayerOwner>> CudaLayerOwner::create(const OwnershipPlan& plan, int rank, int device,
                                                               const ModelConfig& config, DType weight_dtype) {
  if (rank < 0 || rank >= plan.dp)
    return make_error(ErrorCode::invalid_argument, "sidp cuda owner: rank " + std::to_string(rank) + " outside dp " +
                                                       std::to_string(plan.dp));
  if (plan.num_layers() != config.num_hidden_layers)
    return make_error(ErrorCode::invalid_argument, "sidp cuda owner: a plan of " + std::to_string(plan.num_layers()) +
                                                       " layers for a model of " +
                                                       std::to_string(config.num_hidden_layers));
  if (weight_dtype != DType::f32 && weight_dtype != DType::bf16 && weight_dtype != DType::f16)
    return make_error(ErrorCode::invalid_argument, std::string("sidp cuda owner: weight dtype ") +
                                                       dtype_name(weight_dtype) + " not supported");
  return std::shared_ptr<CudaLayerOwner>(new CudaLayerOwner(plan, rank, device, cuda_ffn_layout(config, weight_dtype)));
}

CudaLayerOwner::~CudaLayerOwner() { unload(); }

Status CudaLayerOwner::load(const ModelWeights& host_weights, comm::Communicator& weights_comm) {
  std::lock_guard<std::mutex> lock(mu_);
  // Dense FFN layers only: quantized ones are dequantized on the host (issue 40).
  auto dense = dequantized_weights(std::shared_ptr<const ModelWeights>(&host_weights, [](const ModelWeights*) {}));
  if (!dense) return std::move(dense).error();
  const ModelWeights& host = **dense;
  if (comm_ != nullptr) return Status::ok_status();
  if (host.layers.size() != static_cast<std::size_t>(plan_.num_layers()))
    return make_error(ErrorCode::invalid_argument, "sidp cuda owner: the host copy has no layers");
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::internal, "sidp cuda owner: cudaSetDevice(" + std::to_string(device_) + "): " +
                                               cudaGetErrorString(e));
  }
  for (int layer : plan_.owned_layers(rank_)) {
    auto buf = kernels::cuda::DeviceBuffer::allocate(layout_.bytes);
    if (!buf) {
      regions_.clear();
      return make_error(buf.error().code, "sidp cuda owner " + std::to_string(rank_) + ": layer " +
                                              std::to_string(layer) + "'s FFN (" + std::to_string(layout_.bytes) +
                                              " bytes): " + buf.error().message);
    }
    if (Status s = upload_ffn_layer(host.layers[static_cast<std::size_t>(layer)], layout_.dtype, layout_.down_offset,
                                    buf->data());
        !s) {
      regions_.clear();
      return s;
    }
    regions_.emplace(layer, std::move(buf).value());
  }
  for (const auto& [layer, buf] : regions_)
    if (Status s = weights_comm.expose(ffn_region_name(layer), buf.data(), layout_.bytes); !s) {
      for (const auto& [l, b] : regions_) (void)weights_comm.unexpose(ffn_region_name(l));
      regions_.clear();
      return s;
    }
  comm_ = &weights_comm;
  changed_.notify_all();
  return Status::ok_status();
}

void CudaLayerOwner::unload_locked() {
  if (comm_ != nullptr)
    for (const auto& [layer, buf] : regions_) (void)comm_->unexpose(ffn_region_name(layer));  // waits for gets
  comm_ = nullptr;
  if (!regions_.empty()) (void)cudaSetDevice(device_);
  regions_.clear();
}

void CudaLayerOwner::unload() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return leases_ == 0; });  // the runner's GEMMs on them are done
  unload_locked();
  changed_.notify_all();
}

Result<CudaLayerOwner::Lease> CudaLayerOwner::acquire(int layer, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (plan_.owner(layer) != rank_)
    return make_error(ErrorCode::invalid_argument, "sidp cuda owner " + std::to_string(rank_) + ": layer " +
                                                       std::to_string(layer) + " is rank " +
                                                       std::to_string(plan_.owner(layer)) + "'s");
  if (!changed_.wait_for(lock, timeout, [&] { return comm_ != nullptr; }))
    return make_error(ErrorCode::io, "sidp cuda owner " + std::to_string(rank_) + ": layer " + std::to_string(layer) +
                                         "'s FFN not loaded within " + std::to_string(timeout.count()) + " ms");
  ++leases_;
  return Lease(this, regions_.at(layer).data());
}

CudaLayerOwner::Lease& CudaLayerOwner::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    region_ = o.region_;
    o.owner_ = nullptr;
  }
  return *this;
}

void CudaLayerOwner::Lease::reset() {
  if (owner_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    --owner_->leases_;
  }
  owner_->changed_.notify_all();
  owner_ = nullptr;
  region_ = nullptr;
}

bool CudaLayerOwner::loaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return comm_ != nullptr;
}

const void* CudaLayerOwner::region(int layer) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = regions_.find(layer);
  return comm_ == nullptr || it == regions_.end() ? nullptr : it->second.data();
}

std::size_t CudaLayerOwner::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return regions_.size() * layout_.bytes;
}

}  // namespace shardline::model::sidp
