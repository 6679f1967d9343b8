#pragma once
/// \file
/// `--devices` and `--parallel` of `shardline run` and `node start`: what
/// they mean, checked and resolved into the devices and parallel config
/// that actors::NodeOptions takes.

#include <string>
#include <vector>

#include "common/result.hpp"
#include "engine/group/parallel_config.hpp"
#include "model/device_executor.hpp"

namespace shardline::cli {

/// A parsed `--devices`: "cpu:N" (N >= 1: devices 0..N-1) or "cuda:LIST"
/// with LIST indices and ranges, e.g. cuda:0, cuda:0,2, cuda:0-3; an item
/// may end in xK for K ranks sharing each of its GPUs (cuda:0x2: two ranks
/// on GPU 0), the same K for every item.
struct DeviceList {
  model::DeviceKind kind = model::DeviceKind::cpu;
  std::vector<int> indices;  ///< device indices, in the order given
  int ranks_per_device = 1;  ///< cuda: the K of xK (1 without)
};
/// Errors: invalid_argument (not cpu:N / cuda:LIST, N outside [1, 64], an
/// index outside [0, 63] or named twice, K outside [1, 8] or not the same
/// for every item).
[[nodiscard]] Result<DeviceList> parse_devices(const std::string& devices);

/// The devices and parallel config of a node, resolved from its flags.
struct NodeDevices {
  int num_cpu_devices = 1;  ///< 0 with cuda
  model::DeviceKind kind = model::DeviceKind::cpu;
  /// With cuda: the GPUs. One worker per GPU (its group's ranks sharing
  /// it) when cuda_ranks_per_gpu = tp * pp * sp; with tp * pp * sp = 1 and
  /// cuda_ranks_per_gpu = K > 1 (`cuda:0x2 --parallel dp=2`), K
  /// single-device workers per GPU (the list holds each GPU K times);
  /// otherwise (1 rank per GPU) worker i's group is GPUs [i * g, (i + 1) * g)
  /// of the list, g = tp * pp * sp.
  std::vector<int> cuda_devices;
  int cuda_ranks_per_gpu = 1;  ///< the K of cuda:LISTxK
  engine::ParallelConfig parallel;
};

/// The devices and parallel config of a node from `--devices` and
/// `--parallel` ("" = not given):
///  - --parallel given: --devices defaults to cpu:W with W = world_size();
///    a given --devices must have exactly W devices;
///  - --parallel not given: --devices cpu:N (default cpu:1) means N
///    single-device workers, i.e. dp = N;
///  - --devices cuda:LIST: one worker per GPU (dp = the count); a
///    --parallel must then be dp only;
///  - --devices cuda:LISTxK: one worker per GPU, each a group of K ranks
///    sharing it (model::CudaShardGroup): tp = K without --parallel; a
///    --parallel must say tp*pp*sp = K (and dp = the count);
///  - --devices cuda:LIST with --parallel tp*pp*sp > 1: a GPU per rank (the
///    group's ranks talk over NCCL); the list must have tp*pp*sp*dp GPUs.
/// Errors: invalid_argument (bad --parallel, bad --devices, or a device count
/// other than the world size, naming both numbers).
[[nodiscard]] Result<NodeDevices> resolve_node_devices(const std::string& devices, const std::string& parallel);

}  // namespace shardline::cli
