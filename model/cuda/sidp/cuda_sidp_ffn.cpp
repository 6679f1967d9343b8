#include "model/cuda/sidp/cuda_sidp_ffn.hpp"

#include <cuda_runtime.h>

#include <string>

#include "model/cuda/inproc_device_comm.hpp"

namespace shardline::model::sidp {

namespace {

Error invalid(std::string m) { return make_error(ErrorCode::invalid_argument, "sidp cuda: " + std::move(m)); }

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

CudaSidpFfn::CudaSidpFfn(const OwnershipPlan& plan, std::shared_ptr<CudaLayerOwner> owner,
                         comm::Communicator* weights_comm, SidpMode initial_mode)
    : SidpRankFfn(plan, owner->rank(), weights_comm, initial_mode), owner_(std::move(owner)) {}

CudaSidpFfn::~CudaSidpFfn() = default;

Result<std::shared_ptr<CudaSidpFfn>> CudaSidpFfn::create(const OwnershipPlan& plan,
                                                         std::shared_ptr<CudaLayerOwner> owner,
                                                         comm::Communicator* weights_comm,
                                                         comm::Communicator* compute_comm, SidpFfnOptions options) {
  if (!owner) return invalid("no layer owner");
  const int rank = owner->rank();
  if (Status st = check_rank(plan, rank, weights_comm, compute_comm, options.initial_mode); !st) return st.error();
  std::shared_ptr<CudaSidpFfn> f(new CudaSidpFfn(plan, std::move(owner), weights_comm, options.initial_mode));
  f->owner_wait_ = options.cache.owner_wait;
  if (Status st = f->attach_compute(compute_comm); !st) return st.error();
  options.cache.slot_memory = std::make_shared<DeviceSlots>(f->owner_->device());  // the slots in the GPU's memory
  // Every layer's region has the one dense CUDA layout (quantized files are
  // dequantized at load here).
  std::vector<std::size_t> region_bytes(static_cast<std::size_t>(plan.num_layers()), f->owner_->layout().bytes);
  if (Status st = f->make_cache(std::move(region_bytes), options); !st) return st.error();
  return f;
}

Result<comm::Communicator*> CudaSidpFfn::control_of(comm::Communicator* compute) {
  auto* device = dynamic_cast<InProcDeviceCommunicator*>(compute);
  if (device == nullptr)
    return invalid("rank " + std::to_string(rank_) +
                   ": the compute communicator must be an in-process device communicator (CaS rows are device copies)");
  return &device->host();
}

std::size_t CudaSidpFfn::ffn_weight_bytes() const { return owner_->bytes() + cache_bytes(); }

CudaFfnLayerWeights CudaSidpFfn::split(const void* region) const {
  const auto* base = static_cast<const char*>(region);
  return CudaFfnLayerWeights{base, base + owner_->layout().down_offset};
}

Status CudaSidpFfn::need_compute() const {
  if (compute_ != nullptr) return Status::ok_status();
  return make_error(ErrorCode::internal, "sidp cuda rank " + std::to_string(rank_) + ": no runner is bound");
}

Status CudaSidpFfn::ensure_rows(kernels::cuda::DeviceBuffer& buffer, int rows) const {
  const std::size_t bytes =
      static_cast<std::size_t>(rows) * static_cast<std::size_t>(owner_->layout().hidden) * sizeof(float);
  if (buffer.size_bytes() >= bytes) return Status::ok_status();
  if (cudaSetDevice(owner_->device()) != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::internal, "sidp cuda: cudaSetDevice(" + std::to_string(owner_->device()) + ")");
  }
  buffer = kernels::cuda::DeviceBuffer();  // free first: the old contents are not kept
  auto grown = kernels::cuda::DeviceBuffer::allocate(bytes);
  if (!grown)
    return make_error(grown.error().code, "sidp cuda rank " + std::to_string(rank_) + ": CaS buffer of " +
                                              std::to_string(bytes) + " bytes: " + grown.error().message);
  buffer = std::move(grown).value();
  return Status::ok_status();
}

Status CudaSidpFfn::forward(int layer, const float* x, int rows, float* residual) {
  if (Status st = need_compute(); !st) return st;
  if (layer < 0 || layer >= plan_.num_layers())
    return make_error(ErrorCode::internal, "sidp cuda: layer " + std::to_string(layer) + " outside the plan");
  if (mode() == SidpMode::was) return run_was(layer, x, rows, residual);
  if (plan_.owner(layer) != rank_) return run_cas_remote(layer, x, rows, residual);
  Status st = serve(layer, x, rows, residual);
  if (!st) mark_broken();
  return st;
}

Status CudaSidpFfn::run_was(int layer, const float* x, int rows, float* residual) {
  if (plan_.owner(layer) == rank_) {
    auto lease = owner_->acquire(layer, owner_wait_);
    if (!lease) return lease.error();
    if (Status st = compute_->ffn(split(lease->region()), x, rows, residual, true); !st) return st;
    return compute_->sync();  // the GEMMs read the region: done before the lease goes
  }
  Result<const void*> slot = cache_->acquire(layer);
  if (!slot) return slot.error();
  Status st = compute_->ffn(split(*slot), x, rows, residual, true);
  // The GEMMs read the slot: done before the housekeeper may refill it.
  if (Status synced = compute_->sync(); st && !synced) st = synced;
  cache_->release(layer);
  return st;
}

Status CudaSidpFfn::run_cas_remote(int layer, const float* x, int rows, float* residual) {
  if (rows == 0) return Status::ok_status();
  const int hidden = owner_->layout().hidden;
  // The rows are written by the stream's work, and from_owner_ may still be
  // read by the previous layer's add: wait for both.
  if (Status st = compute_->sync(); !st) return st;
  if (Status st = ensure_rows(from_owner_, rows); !st) return st;
  if (Status st = exchange_with_owner(layer, x, rows, hidden, from_owner_.as<float>()); !st) return st;
  return compute_->add(residual, from_owner_.as<float>(), static_cast<long>(rows) * hidden);
}

Status CudaSidpFfn::serve(int layer, const float* x, int num_rows, float* out) {
  if (Status st = need_compute(); !st) return st;
  const int hidden = owner_->layout().hidden;
  const int total = num_rows + peer_rows_to_serve();
  if (total == 0) return Status::ok_status();
  // The previous layer's GEMMs may still read staging / staged_out.
  if (Status st = compute_->sync(); !st) return st;
  if (Status st = ensure_rows(staging_, total); !st) return st;
  if (Status st = ensure_rows(staged_out_, total); !st) return st;
  float* staging = staging_.as<float>();
  float* staged_out = staged_out_.as<float>();
  const std::size_t own_elems = static_cast<std::size_t>(num_rows) * static_cast<std::size_t>(hidden);
  // Staging: this rank's rows first (on the stream, after the kernels that
  // wrote them), then each non-dummy peer's (the communicator's copies,
  // waited for on the host before the GEMMs are enqueued).
  if (num_rows > 0)
    if (cudaMemcpyAsync(staging, x, own_elems * sizeof(float), cudaMemcpyDeviceToDevice, compute_->stream()) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return make_error(ErrorCode::internal, "sidp cuda: staging this rank's CaS rows");
    }
  if (Status st = recv_peer_rows(layer, staging + own_elems, hidden); !st) return st;
  auto lease = owner_->acquire(layer, owner_wait_);
  if (!lease) return lease.error();
  if (Status st = compute_->ffn(split(lease->region()), staging, total, staged_out, false); !st) return st;
  if (num_rows > 0)
    if (Status st = compute_->add(out, staged_out, static_cast<long>(own_elems)); !st) return st;
  // The replies leave once the fused GEMMs wrote them.
  if (Status st = compute_->sync(); !st) return st;
  lease.value().reset();
  return send_peer_rows(layer, staged_out + own_elems, hidden, total);
}

void CudaSidpFfn::abort_step() { abort_control(); }

}  // namespace shardline::model::sidp
