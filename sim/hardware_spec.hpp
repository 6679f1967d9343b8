#pragma once
/// \file
/// What the simulator (sim/simulator.hpp) knows about a cluster: one kind of
/// device (compute peak, memory bandwidth and size, the links inside and
/// between nodes, the host link) and how many of them there are. Every
/// number of a device file carries its source: a datasheet, a published
/// measurement, a measurement of this machine (`simulate --calibrate`), or
/// an assumption said as such.
///
/// Device files are JSON (sim/devices/*.json, built into the binary):
///
///   {"name": "h200", "description": "...", "weight_dtype": "bf16",
///    "peak_flops": {"value": 9.89e14, "source": "NVIDIA H200 datasheet ..."},
///    "memory_bw_bytes_per_s": {...}, "memory_bytes": {...},
///    "memory_utilization": {...}, "devices_per_node": {...},
///    "intra_node_bw_bytes_per_s": {...}, "intra_node_latency_s": {...},
///    "inter_node_bw_bytes_per_s": {...}, "inter_node_latency_s": {...},
///    "host_link_bw_bytes_per_s": {...}, "gemm_efficiency": {...},
///    "prefill_gemm_efficiency": {...},
///    "memory_bw_efficiency": {...}, "step_overhead_ms": {...},
///    "seq_overhead_ms": {...}, "gemm_efficiency_by_rows" and
///    "tp_gemm_efficiency_by_rows", "shift_gemm_efficiency_by_rows",
///    "was_copy_exposed_by_rows" (optional:
///    {"value": [[rows, fraction], ...], "source": ...}),
///    "shared_memory_bus": false}
///
/// A cluster is named DEVICE or DEVICExN (`h200x8`: 8 H200 in one node;
/// `h200x64`: 8 nodes of 8, from devices_per_node), or is a JSON file
/// {"name", "device": NAME or an inline device object, "num_devices"}.
///
/// Achievable rates: a device computes at peak_flops * gemm_efficiency
/// (prefill_gemm_efficiency in steps of kLargeStepTokens tokens or more) and
/// streams memory at memory_bw_bytes_per_s * memory_bw_efficiency. With
/// shared_memory_bus (CPU devices: threads of one machine) the devices of a
/// node share those two rates evenly, as sim::CostModel::
/// for_cpu_devices assumes.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.hpp"
#include "common/result.hpp"
#include "sim/cost_model.hpp"

namespace shardline::sim {

/// One number of a device file and where it comes from.
struct Sourced {
  double value = 0;
  std::string source;
};

struct DeviceSpec {
  std::string name;
  std::string description;
  DType weight_dtype = DType::bf16;  ///< weights, KV cache and activations as simulated (f32: 4 bytes, else 2)
  Sourced peak_flops;                ///< dense GEMM FLOP/s at weight_dtype
  Sourced memory_bw_bytes_per_s;     ///< device memory bandwidth, bytes/s
  Sourced memory_bytes;              ///< device memory, bytes
  Sourced memory_utilization;        ///< fraction of memory_bytes the engine may use, (0, 1]
  Sourced devices_per_node;          ///< devices one node holds (>= 1)
  Sourced intra_node_bw_bytes_per_s; ///< bytes/s one device sends to a peer of its node (one direction)
  Sourced intra_node_latency_s;      ///< per collective or send inside a node, seconds
  Sourced inter_node_bw_bytes_per_s; ///< bytes/s one device sends to another node
  Sourced inter_node_latency_s;
  Sourced host_link_bw_bytes_per_s;  ///< device <-> host memory, bytes/s one direction
  Sourced gemm_efficiency;           ///< achieved fraction of peak_flops in steps of few tokens (decode), (0, 1]
  /// ... in steps of at least kLargeStepTokens tokens (prefill): GEMMs of
  /// many rows reach another fraction of the peak than those of a decode batch.
  Sourced prefill_gemm_efficiency;
  Sourced memory_bw_efficiency;      ///< achieved fraction of memory_bw_bytes_per_s, (0, 1]
  /// Optional (JSON "gemm_efficiency_by_rows": {"value": [[rows, fraction],
  /// ...], "source": TEXT}): the achieved fraction of peak_flops in steps
  /// below kLargeStepTokens by the rows a rank's GEMMs have, ascending in
  /// rows; it replaces gemm_efficiency there (sim::HardwareSpec::
  /// flops_by_rows: linear between points, flat beyond). `simulate
  /// --calibrate` fits it to decode steps at several batches; the GPU files
  /// leave it out.
  std::vector<std::pair<double, double>> gemm_efficiency_by_rows;
  std::string gemm_efficiency_by_rows_source;
  /// Optional (JSON "tp_gemm_efficiency_by_rows", the same form): the
  /// fraction of peak_flops a rank of a tensor-parallel group (tp > 1)
  /// achieves in steps below kLargeStepTokens, by its rows
  /// (sim::HardwareSpec::tp_flops_by_rows: TP ranks run in
  /// lockstep). `simulate --calibrate` fits it on the split device to real
  /// tp=2 decode steps; empty: gemm_efficiency_by_rows prices TP ranks too.
  std::vector<std::pair<double, double>> tp_gemm_efficiency_by_rows;
  std::string tp_gemm_efficiency_by_rows_source;
  /// Optional (JSON "shift_gemm_efficiency_by_rows", the same form): the
  /// same for the ranks of Shift Parallelism's shift config (seed 001:
  /// tp' = sp x tp over the base config's devices, sharing its KV cache) in
  /// steps below kLargeStepTokens; empty: tp_gemm_efficiency_by_rows.
  /// `simulate --calibrate` fits it on the split device to real decode steps
  /// of a Shift group (base sp=2, decode in tp=2): on this machine they ran
  /// up to 10% faster than a plain tp=2 group's (docs/simulator.md).
  std::vector<std::pair<double, double>> shift_gemm_efficiency_by_rows;
  std::string shift_gemm_efficiency_by_rows_source;
  /// Optional (JSON "was_copy_exposed_by_rows", the same form, fractions in
  /// [0, 1]): with shared_memory_bus, the fraction of a SiDP WaS rank's
  /// weight-fetch copy (sidp_was_copy_ms, sim/simulator.hpp) that lengthens
  /// its step, by the rank's rows. A CPU rank's fetch is a memcpy made by
  /// its housekeeper thread (model/sidp/weight_cache.hpp) on a core the
  /// compute threads also use, so it neither adds whole to the step nor
  /// hides whole behind it as a GPU's copy engine does (seed 002 §4.1).
  /// `simulate --calibrate` fits it on the split device to real WaS decode
  /// steps; empty: 1 (the whole copy adds).
  std::vector<std::pair<double, double>> was_copy_exposed_by_rows;
  std::string was_copy_exposed_by_rows_source;
  Sourced step_overhead_ms;          ///< per micro-batch: scheduling, launches, ms (>= 0)
  Sourced seq_overhead_ms;           ///< per sequence of a micro-batch: scheduling, sampling, ms (>= 0)
  bool shared_memory_bus = false;    ///< the devices of a node share one memory bus and one compute budget
  /// CPU only (`simulate --calibrate` on >= 2 threads): this device as
  /// calibrated with the machine's threads split over `split_devices`
  /// devices that run at once, each on its share of the threads. Its
  /// peak_flops and memory bandwidth are still the machine's totals (each
  /// busy device gets 1/N); its efficiencies and overheads are fitted on
  /// those concurrent runs. Threads that do not share one GEMM waste less
  /// time synchronising, so a config of N devices runs faster than N
  /// slices of the all-thread device (docs/simulator.md). Null: none.
  std::shared_ptr<const DeviceSpec> split;
  int split_devices = 0;
};

/// Tokens from which a step's GEMMs run at prefill_gemm_efficiency.
inline constexpr long long kLargeStepTokens = 256;

struct ClusterSpec {
  std::string name;  ///< e.g. "h200x8"
  DeviceSpec device;
  int num_devices = 1;
  [[nodiscard]] int devices_per_node() const;
  [[nodiscard]] int num_nodes() const;
};

/// Parses a device file. `origin` names it in errors. Errors: corrupt (not
/// JSON, a field missing or of the wrong type, a number without a source),
/// invalid_argument (a value out of its range, an unknown weight_dtype).
[[nodiscard]] Result<DeviceSpec> parse_device_spec(const std::string& json_text, const std::string& origin);

/// The device file as JSON text (the inverse of parse_device_spec).
[[nodiscard]] std::string device_spec_json(const DeviceSpec& device);

/// Names of the built-in device files (sorted): a10, a100-80gb, h100, h200, l20.
[[nodiscard]] std::vector<std::string> device_preset_names();

/// A built-in device. Errors: not_found naming the presets.
[[nodiscard]] Result<DeviceSpec> device_preset(const std::string& name);

/// A cluster by name (DEVICE or DEVICExN over the built-in devices) or by a
/// JSON file path. `cpu` / `cpuxN` name this machine's calibrated CPU
/// device, read from `cpu_calibration_path` (`simulate --calibrate` writes
/// it). Errors: not_found (no such preset or file), invalid_argument (bad
/// N), parse errors of the files.
[[nodiscard]] Result<ClusterSpec> load_cluster(const std::string& name_or_path,
                                               const std::string& cpu_calibration_path = "");

/// The device a run with `active_per_node` busy devices per node is priced
/// on: device.split when the node shares one memory bus, has a split fit,
/// and runs at least split_devices devices at once; else the device.
[[nodiscard]] const DeviceSpec& device_for(const ClusterSpec& cluster, int active_per_node);

/// Per-rank hardware of an engine group of `group_size` devices of `cluster`
/// (sim::CostModel's HardwareSpec): achievable FLOP/s and memory
/// bandwidth, divided by `active_per_node` (the devices busy on one node,
/// >= 1) when the node's devices share one memory bus; and the intra-node
/// link while the group fits in one node, else the inter-node one.
/// `group_size` and `active_per_node` < 1 count as 1. `large_steps`: the
/// rate of steps of kLargeStepTokens tokens or more (prefill_gemm_efficiency).
/// `shift_steps`: the hardware of Shift's shift-config steps (its TP ranks
/// on shift_gemm_efficiency_by_rows when the device has it).
[[nodiscard]] sim::HardwareSpec group_hardware(const ClusterSpec& cluster, int group_size,
                                                        int active_per_node = 1, bool large_steps = false,
                                                        bool shift_steps = false);

/// device.was_copy_exposed_by_rows at `rows` (linear between points, flat
/// beyond), or 1 when the device has none.
[[nodiscard]] double was_copy_exposed_at(const DeviceSpec& device, double rows);

/// Bytes per element of weights, KV and activations for the device's dtype.
[[nodiscard]] sim::ElementSizes element_sizes(const DeviceSpec& device);

/// Bytes the engine of one device may use: memory_bytes * memory_utilization.
[[nodiscard]] std::uint64_t usable_memory_bytes(const DeviceSpec& device);

}  // namespace shardline::sim
