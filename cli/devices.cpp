#include "cli/devices.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>

namespace shardline::cli {

Result<DeviceList> parse_devices(const std::string& devices) {
  DeviceList out;
  const auto number = [](std::string_view text, int& n) {
    const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    return ec == std::errc() && p == text.data() + text.size();
  };
  if (devices.rfind("cuda:", 0) == 0) {
    out.kind = model::DeviceKind::cuda;
    const std::string_view list = std::string_view(devices).substr(5);
    const auto bad = [&] {
      return make_error(ErrorCode::invalid_argument,
                        "--devices cuda:LIST needs device indices like cuda:0, cuda:0,1, cuda:0-3 or cuda:0x2, got '" +
                            devices + "'");
    };
    std::size_t pos = 0;
    int ranks = 0;  // K of xK, 0 until the first item
    while (pos <= list.size()) {
      const std::size_t comma = std::min(list.find(',', pos), list.size());
      std::string_view item = list.substr(pos, comma - pos);
      int k = 1;
      if (const std::size_t x = item.find('x'); x != std::string_view::npos) {
        if (!number(item.substr(x + 1), k) || k < 1 || k > 8) return bad();
        item = item.substr(0, x);
      }
      if (ranks != 0 && k != ranks)
        return make_error(ErrorCode::invalid_argument,
                          "--devices " + devices + ": every GPU of the list needs the same number of ranks (xK)");
      ranks = k;
      const std::size_t dash = item.find('-');
      int first = 0, last = 0;
      if (dash == std::string_view::npos) {
        if (!number(item, first)) return bad();
        last = first;
      } else if (!number(item.substr(0, dash), first) || !number(item.substr(dash + 1), last) || last < first) {
        return bad();
      }
      if (first < 0 || last > 63) return bad();
      for (int d = first; d <= last; ++d) {
        if (std::find(out.indices.begin(), out.indices.end(), d) != out.indices.end())
          return make_error(ErrorCode::invalid_argument, "--devices " + devices + " names cuda:" + std::to_string(d) + " twice");
        out.indices.push_back(d);
      }
      pos = comma + 1;
    }
    out.ranks_per_device = ranks;
    return out;
  }
  if (devices.rfind("cpu:", 0) != 0)
    return make_error(ErrorCode::invalid_argument, "--devices must be cpu:N or cuda:LIST, got '" + devices + "'");
  int n = 0;
  if (!number(std::string_view(devices).substr(4), n) || n < 1 || n > 64)
    return make_error(ErrorCode::invalid_argument, "--devices cpu:N needs 1 <= N <= 64, got '" + devices + "'");
  for (int i = 0; i < n; ++i) out.indices.push_back(i);
  return out;
}

namespace {

/// resolve_node_devices for --devices cuda:LIST.
Result<NodeDevices> resolve_cuda_devices(const std::string& devices, const std::string& parallel) {
  NodeDevices out;
  auto list = parse_devices(devices);
  if (!list) return std::move(list).error();
  const int n = static_cast<int>(list->indices.size());
  const int k = list->ranks_per_device;
  engine::ParallelConfig pc{k, 1, 1, n};
  if (!parallel.empty()) {
    auto given = engine::parse_parallel_config(parallel);
    if (!given) return std::move(given).error();
    const int group = given->group_size();
    if (group > 1 && k == 1) {
      // Each rank on a GPU of its own: the group's ranks talk over NCCL.
      if (n != group * given->dp)
        return make_error(ErrorCode::invalid_argument,
                          "--devices " + devices + " gives " + std::to_string(n) + " GPUs but --parallel " +
                              given->to_string() + " needs tp*pp*sp*dp = " + std::to_string(group * given->dp) +
                              " (one per rank; for ranks sharing a GPU write cuda:0x" + std::to_string(group) + ")");
    } else if (group == 1 && k > 1) {
      // dp single-device workers sharing each GPU (`cuda:0x2 --parallel dp=2`).
      if (given->dp != n * k)
        return make_error(ErrorCode::invalid_argument,
                          "--devices " + devices + " puts " + std::to_string(k) + " workers on each of " +
                              std::to_string(n) + " GPUs but --parallel " + given->to_string() + " asks dp=" +
                              std::to_string(given->dp) + " (want " + std::to_string(n * k) + ")");
    } else if (group != k) {
      return make_error(ErrorCode::invalid_argument, "--devices " + devices + " puts " + std::to_string(k) +
                                                         " ranks on each GPU but --parallel " + given->to_string() +
                                                         " asks tp*pp*sp=" + std::to_string(group));
    } else if (given->dp != n) {
      return make_error(ErrorCode::invalid_argument, "--devices " + devices + " gives " + std::to_string(n) +
                                                         " devices but --parallel " + given->to_string() + " needs " +
                                                         std::to_string(given->dp));
    }
    pc = *given;
  }
  out.kind = model::DeviceKind::cuda;
  out.cuda_devices = list->indices;
  if (pc.group_size() == 1 && k > 1) {  // each GPU's index once per worker on it
    out.cuda_devices.clear();
    for (int d : list->indices) out.cuda_devices.insert(out.cuda_devices.end(), static_cast<std::size_t>(k), d);
  }
  out.cuda_ranks_per_gpu = k;
  out.num_cpu_devices = 0;
  out.parallel = pc;
  return out;
}

}  // namespace

Result<NodeDevices> resolve_node_devices(const std::string& devices, const std::string& parallel) {
  if (devices.rfind("cuda", 0) == 0) return resolve_cuda_devices(devices, parallel);
  NodeDevices out;
  if (parallel.empty()) {
    auto list = parse_devices(devices.empty() ? "cpu:1" : devices);
    if (!list) return std::move(list).error();
    const int n = static_cast<int>(list->indices.size());
    out.num_cpu_devices = n;
    out.parallel.dp = n;
    return out;
  }
  auto pc = engine::parse_parallel_config(parallel);
  if (!pc) return std::move(pc).error();
  out.parallel = *pc;
  const int world = pc->world_size();
  if (world > 64)
    return make_error(ErrorCode::invalid_argument, "--parallel " + pc->to_string() + " needs " +
                                                       std::to_string(world) + " devices; a node has at most 64");
  if (devices.empty()) {
    out.num_cpu_devices = world;
    return out;
  }
  auto list = parse_devices(devices);
  if (!list) return std::move(list).error();
  const int n = static_cast<int>(list->indices.size());
  if (n != world)
    return make_error(ErrorCode::invalid_argument,
                      "--devices " + devices + " gives " + std::to_string(n) + " device" + (n == 1 ? "" : "s") +
                          " but --parallel " + pc->to_string() + " needs tp*pp*sp*dp = " + std::to_string(world) +
                          " (leave out --devices to use " + std::to_string(world) + ")");
  out.num_cpu_devices = n;
  return out;
}

}  // namespace shardline::cli
