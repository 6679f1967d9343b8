#include "model/cuda/sidp/cuda_was.hpp"

#include <cuda_runtime.h>

#include <string>

namespace shardline::model::sidp {

namespace {

/// WaS's cache slots in one GPU's memory (zeroed).
class DeviceSlots final : public SlotMemory {
 public:
  explicit DeviceSlots(int device) : device_(device) {}
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    if (cudaSetDevice(device_) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (cudaMemset(p, 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaFree(p);
      return nullptr;
    }
    return p;
  }
  void release(void* slot) noexcept override {
    (void)cudaSetDevice(device_);
    (void)cudaFree(slot);
  }

 private:
  int device_;
};

}  // namespace

Result<std::shared_ptr<CudaWas>> CudaWas::create(const OwnershipPlan& plan, std::shared_ptr<CudaLayerOwner> owner,
                                                 comm::Communicator* weights_comm, WeightCacheOptions cache,
                                                 bool peak_shifting) {
  if (!owner || weights_comm == nullptr)
    return make_error(ErrorCode::invalid_argument, "sidp cuda WaS: no layer owner or weights communicator");
  const int rank = owner->rank();
  if (weights_comm->rank() != rank || weights_comm->world_size() != plan.dp)
    return make_error(ErrorCode::invalid_argument, "sidp cuda WaS: rank " + std::to_string(rank) +
                                                       " of dp " + std::to_string(plan.dp) +
                                                       " with a communicator of rank " +
                                                       std::to_string(weights_comm->rank()) + " of " +
                                                       std::to_string(weights_comm->world_size()));
  std::shared_ptr<CudaWas> was(new CudaWas(plan, owner));
  std::vector<int> order = prefetch_order(plan, rank, peak_shifting);
  if (!order.empty()) {
    cache.slot_memory = std::make_shared<DeviceSlots>(owner->device());
    auto c = WeightCache::create(plan, rank, std::move(order), owner->layout(), weights_comm, cache);
    if (!c) return std::move(c).error();
    was->cache_ = std::move(c).value();
  }
  return was;
}

CudaWas::~CudaWas() = default;

CudaFfnLayerWeights CudaWas::split(const void* region) const {
  const auto* base = static_cast<const char*>(region);
  return CudaFfnLayerWeights{base, base + owner_->layout().down_offset};
}

Result<CudaFfnLayerWeights> CudaWas::acquire(int layer) {
  if (layer < 0 || layer >= plan_.num_layers())
    return make_error(ErrorCode::internal, "sidp cuda WaS: layer " + std::to_string(layer) + " outside the plan");
  if (plan_.owner(layer) == owner_->rank()) {
    const void* region = owner_->region(layer);
    if (region == nullptr)
      return make_error(ErrorCode::internal, "sidp cuda WaS: rank " + std::to_string(owner_->rank()) +
                                                 "'s own layer " + std::to_string(layer) + " is not loaded");
    return split(region);
  }
  Result<const void*> slot = cache_->acquire(layer);
  if (!slot) return slot.error();
  return split(*slot);
}

void CudaWas::release(int layer) {
  if (plan_.owner(layer) != owner_->rank()) cache_->release(layer);
}

void CudaWas::abort_step() {
  if (cache_) cache_->reset();
}

std::size_t CudaWas::ffn_weight_bytes() const {
  return owner_->bytes() + (cache_ ? static_cast<std::size_t>(cache_->slots()) * cache_->slot_bytes() : 0);
}

WeightCacheStats CudaWas::cache_stats() const { return cache_ ? cache_->stats() : WeightCacheStats{}; }

}  // namespace shardline::model::sidp
