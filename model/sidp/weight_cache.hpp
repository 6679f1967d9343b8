#pragma once
/// \file
/// WaS's weight cache (seed 002 §4.2, "Asynchronous buffer management"): a
/// ring of pre-allocated cache slots, each holding one remote layer's FFN
/// region, and a housekeeper thread that fills them ahead of the compute.
///
///  - The housekeeper walks the rank's prefetch order (ownership.hpp, with or
///    without peak shifting) over and over. For each layer it reserves a free
///    slot, reads the owner's region into it with a one-sided get on its own
///    communicator (the compute thread never waits on it), and marks the slot
///    ready. A get that fails because the owner is down (not_found: its
///    regions are withdrawn while it respawns) is retried every
///    `retry_interval` until `owner_wait` has passed; then the slot carries
///    the error. io (the owner's rank is dead, e.g. a process that exited,
///    or it did not answer within the communicator's timeout) fails the
///    slot at once.
///  - The compute thread calls acquire(layer) just before the layer's GEMMs
///    (waiting for the transfer if it is still in flight) and release(layer)
///    right after them; only then is the slot free for the next prefetch. No
///    slot is reused before its GEMM finished, and nothing is allocated per
///    layer.
///  - pause() stops new prefetches (CaS mode needs no weights); slots that
///    are ready stay valid (weights never change), so a switch back to WaS
///    finds its first layers already there.
///  - reset() after a failed step: drops ready slots and restarts the order,
///    so the ring is in phase with a step that starts at its first layer.
///
/// Slot count: at least min_cache_slots() for the order, or the compute
/// would wait for a layer the full ring can never fetch; create() raises a
/// smaller request to that minimum (and says so in slots()).

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "common/memory.hpp"
#include "common/result.hpp"
#include "model/sidp/layer_owner.hpp"
#include "model/sidp/ownership.hpp"

namespace shardline::model::sidp {

/// Where the cache's slots live. Host memory without one; a device backend
/// gives device memory (model/cuda/sidp: WaS on CUDA, the slots in GPU
/// memory and `comm` a device communicator whose get is a device copy).
class SlotMemory {
 public:
  virtual ~SlotMemory() = default;
  /// `bytes` of zeroed memory for one slot; null when there is none.
  [[nodiscard]] virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* slot) noexcept = 0;
};

struct WeightCacheOptions {
  int cache_slots = 2;                                ///< requested; raised to min_cache_slots
  std::chrono::milliseconds owner_wait{30'000};       ///< how long a fetch waits for a down owner
  std::chrono::milliseconds retry_interval{5};        ///< between retries of a failed get
  bool start_paused = false;                          ///< created paused (a rank that starts in CaS)
  std::shared_ptr<SlotMemory> slot_memory;            ///< null: host memory
};

/// Counters (monotonic).
struct WeightCacheStats {
  std::uint64_t fetches = 0;         ///< regions read from owners
  std::uint64_t fetched_bytes = 0;
  std::uint64_t fetch_retries = 0;   ///< gets retried (owner down or respawning)
  std::uint64_t compute_waits = 0;   ///< acquire() found its layer not ready yet
  double compute_wait_ms = 0;        ///< time acquire() waited in total
  double fetch_ms = 0;               ///< time the housekeeper spent in gets
};

class WeightCache {
 public:
  /// Allocates max(options.cache_slots, min_cache_slots) slots, each the
  /// largest of the fetched layers' regions (`region_bytes` [num_layers]:
  /// the bytes of each layer's region, LayerOwner::region_bytes(); layers
  /// may differ, a Q4_K_M file's Q6_K ffn_down), and starts the
  /// housekeeper, which uses `comm` (this rank of the group the owners
  /// expose on; used by the housekeeper thread only, and not owned). Errors:
  /// invalid_argument (empty order, no comm, region_bytes not one per layer
  /// of the plan, a layer outside it), out_of_memory.
  [[nodiscard]] static Result<std::unique_ptr<WeightCache>> create(const OwnershipPlan& plan, int rank,
                                                                   std::vector<int> fetch_order,
                                                                   std::vector<std::size_t> region_bytes,
                                                                   comm::Communicator* comm,
                                                                   const WeightCacheOptions& options);
  ~WeightCache();  ///< stops the housekeeper (a get in flight ends first)
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;

  /// Waits until a slot holds `layer` (fetched), marks it in use and returns
  /// its region (region_bytes[layer] of it are the layer's). Errors: what the fetch failed with (io
  /// naming the owner when it stayed down past owner_wait), internal when the
  /// ring is full of other layers (out of phase: call reset()).
  [[nodiscard]] Result<const void*> acquire(int layer);
  /// The GEMMs of `layer` are done: its slot is free for the next prefetch.
  void release(int layer);

  void pause();   ///< no new prefetches (transfers in flight finish)
  void resume();
  /// Drops every ready slot and restarts the prefetch order (the next step
  /// begins at its first layer). Slots in use must have been released.
  void reset();

  [[nodiscard]] int slots() const { return static_cast<int>(slots_.size()); }
  [[nodiscard]] std::size_t slot_bytes() const { return slot_bytes_; }
  [[nodiscard]] const std::vector<int>& fetch_order() const { return order_; }
  [[nodiscard]] WeightCacheStats stats() const;
  /// The layers of the slots that are ready or in use, by slot (-1: free or
  /// filling). For tests.
  [[nodiscard]] std::vector<int> resident_layers() const;

 private:
  enum class SlotState { free, filling, ready, in_use, failed };
  struct Slot {
    AlignedBuffer host;      // [slot_bytes] without a SlotMemory
    void* region = nullptr;  // [slot_bytes]: host.get() or the SlotMemory's
    SlotState state = SlotState::free;
    int layer = -1;
    std::uint64_t generation = 0;  ///< reset() generation of the fetch
    Status error;                  ///< failed: why
  };

  WeightCache(const OwnershipPlan& plan, int rank, std::vector<int> order, std::vector<std::size_t> region_bytes,
              std::size_t slot_bytes, comm::Communicator* comm, const WeightCacheOptions& options);
  void housekeeper_loop();
  [[nodiscard]] Status fetch(int layer, void* dst);

  OwnershipPlan plan_;
  int rank_;
  std::vector<int> order_;
  std::vector<std::size_t> region_bytes_;  ///< [num_layers]
  std::size_t slot_bytes_;                 ///< max of region_bytes_ over order_
  comm::Communicator* comm_;
  WeightCacheOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // slot state changes, pause / stop
  std::vector<Slot> slots_;
  std::size_t cursor_ = 0;       ///< next index into order_ (cyclic)
  std::uint64_t generation_ = 0;
  bool paused_ = false;
  bool stop_ = false;
  WeightCacheStats stats_;
  std::thread housekeeper_;
};

}  // namespace shardline::model::sidp
