#include "sim/hardware_spec.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "sim/device_presets.hpp"

namespace shardline::sim {
namespace {

using json = nlohmann::json;

struct Field {
  const char* key;
  Sourced DeviceSpec::*member;
  double min;       ///< value >= min (or > min when exclusive)
  bool exclusive;
  double max;       ///< value <= max
};

constexpr double kInf = 1e300;

const Field kFields[] = {
    {"peak_flops", &DeviceSpec::peak_flops, 0, true, kInf},
    {"memory_bw_bytes_per_s", &DeviceSpec::memory_bw_bytes_per_s, 0, true, kInf},
    {"memory_bytes", &DeviceSpec::memory_bytes, 0, true, kInf},
    {"memory_utilization", &DeviceSpec::memory_utilization, 0, true, 1},
    {"devices_per_node", &DeviceSpec::devices_per_node, 1, false, 1e6},
    {"intra_node_bw_bytes_per_s", &DeviceSpec::intra_node_bw_bytes_per_s, 0, true, kInf},
    {"intra_node_latency_s", &DeviceSpec::intra_node_latency_s, 0, false, 1},
    {"inter_node_bw_bytes_per_s", &DeviceSpec::inter_node_bw_bytes_per_s, 0, true, kInf},
    {"inter_node_latency_s", &DeviceSpec::inter_node_latency_s, 0, false, 1},
    {"host_link_bw_bytes_per_s", &DeviceSpec::host_link_bw_bytes_per_s, 0, true, kInf},
    {"gemm_efficiency", &DeviceSpec::gemm_efficiency, 0, true, 1},
    {"prefill_gemm_efficiency", &DeviceSpec::prefill_gemm_efficiency, 0, true, 1},
    {"memory_bw_efficiency", &DeviceSpec::memory_bw_efficiency, 0, true, 1},
    {"step_overhead_ms", &DeviceSpec::step_overhead_ms, 0, false, 1e6},
    {"seq_overhead_ms", &DeviceSpec::seq_overhead_ms, 0, false, 1e6},
};

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::not_found, path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string preset_list() {
  std::string s;
  for (const auto& n : device_preset_names()) s += (s.empty() ? "" : ", ") + n;
  return s + ", cpu";
}

/// j[key] (optional) as {"value": [[rows, fraction], ...], "source": TEXT}
/// into points / source. Errors: corrupt (wrong form, no source),
/// invalid_argument (rows < 1 or not ascending, a fraction outside (0, 1],
/// or [0, 1] with `zero_allowed`).
Status parse_efficiency_curve(const json& j, const std::string& key, const std::string& origin,
                              std::vector<std::pair<double, double>>& points, std::string& source,
                              bool zero_allowed = false) {
  if (!j.contains(key)) return Status::ok_status();
  const json& v = j[key];
  const std::string shape = ": '" + key + "' must be {\"value\": [[ROWS, FRACTION], ...], \"source\": TEXT}";
  if (!v.is_object() || !v.contains("value") || !v["value"].is_array() || v["value"].empty())
    return make_error(ErrorCode::corrupt, origin + shape);
  if (!v.contains("source") || !v["source"].is_string() || v["source"].get<std::string>().empty())
    return make_error(ErrorCode::corrupt, origin + ": '" + key + "' has no source");
  for (const json& point : v["value"]) {
    if (!point.is_array() || point.size() != 2 || !point[0].is_number() || !point[1].is_number())
      return make_error(ErrorCode::corrupt, origin + shape);
    const double rows = point[0].get<double>(), e = point[1].get<double>();
    const bool low = zero_allowed ? !(e >= 0) : !(e > 0);
    if (!(rows >= 1) || low || !(e <= 1) || (!points.empty() && !(rows > points.back().first)))
      return make_error(ErrorCode::invalid_argument, origin + ": '" + key + "' needs rows >= 1 ascending and fractions in " +
                                                         (zero_allowed ? "[0, 1]" : "(0, 1]"));
    points.emplace_back(rows, e);
  }
  source = v["source"].get<std::string>();
  return Status::ok_status();
}

/// The inverse of parse_efficiency_curve (nothing for no points).
void emit_efficiency_curve(nlohmann::ordered_json& j, const std::string& key,
                           const std::vector<std::pair<double, double>>& points, const std::string& source) {
  if (points.empty()) return;
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const auto& [rows, e] : points) a.push_back({rows, e});
  j[key] = {{"value", a}, {"source", source}};
}

}  // namespace

int ClusterSpec::devices_per_node() const {
  return std::max(1, static_cast<int>(std::lround(device.devices_per_node.value)));
}

int ClusterSpec::num_nodes() const { return (num_devices + devices_per_node() - 1) / devices_per_node(); }

Result<DeviceSpec> parse_device_spec(const std::string& json_text, const std::string& origin) {
  const json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(ErrorCode::corrupt, origin + ": not a JSON object");
  DeviceSpec d;
  try {
    d.name = j.at("name").get<std::string>();
    d.description = j.value("description", std::string());
    std::string dtype = j.value("weight_dtype", std::string("bf16"));
    std::transform(dtype.begin(), dtype.end(), dtype.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (dtype == "bf16") d.weight_dtype = DType::bf16;
    else if (dtype == "f16") d.weight_dtype = DType::f16;
    else if (dtype == "f32") d.weight_dtype = DType::f32;
    else return make_error(ErrorCode::invalid_argument, origin + ": weight_dtype: bf16, f16 or f32, got '" + dtype + "'");
    d.shared_memory_bus = j.value("shared_memory_bus", false);
    for (const Field& f : kFields) {
      if (!j.contains(f.key)) return make_error(ErrorCode::corrupt, origin + ": missing '" + f.key + "'");
      const json& v = j.at(f.key);
      if (!v.is_object() || !v.contains("value") || !v["value"].is_number())
        return make_error(ErrorCode::corrupt, origin + ": '" + f.key + "' must be {\"value\": NUMBER, \"source\": TEXT}");
      if (!v.contains("source") || !v["source"].is_string() || v["source"].get<std::string>().empty())
        return make_error(ErrorCode::corrupt, origin + ": '" + f.key + "' has no source");
      Sourced& s = d.*(f.member);
      s.value = v["value"].get<double>();
      s.source = v["source"].get<std::string>();
      const bool low = f.exclusive ? s.value <= f.min : s.value < f.min;
      if (!std::isfinite(s.value) || low || s.value > f.max)
        return make_error(ErrorCode::invalid_argument, origin + ": '" + f.key + "' = " + std::to_string(s.value) +
                                                           " is out of range");
    }
    if (Status st = parse_efficiency_curve(j, "gemm_efficiency_by_rows", origin, d.gemm_efficiency_by_rows,
                                           d.gemm_efficiency_by_rows_source);
        !st.ok())
      return st.error();
    if (Status st = parse_efficiency_curve(j, "tp_gemm_efficiency_by_rows", origin, d.tp_gemm_efficiency_by_rows,
                                           d.tp_gemm_efficiency_by_rows_source);
        !st.ok())
      return st.error();
    if (Status st = parse_efficiency_curve(j, "shift_gemm_efficiency_by_rows", origin,
                                           d.shift_gemm_efficiency_by_rows, d.shift_gemm_efficiency_by_rows_source);
        !st.ok())
      return st.error();
    if (Status st = parse_efficiency_curve(j, "was_copy_exposed_by_rows", origin, d.was_copy_exposed_by_rows,
                                           d.was_copy_exposed_by_rows_source, /*zero_allowed=*/true);
        !st.ok())
      return st.error();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::corrupt, origin + ": " + e.what());
  }
  if (d.name.empty()) return make_error(ErrorCode::corrupt, origin + ": empty 'name'");
  if (j.contains("split")) {
    const json& sj = j["split"];
    if (!sj.is_object() || !j.contains("split_devices") || !j["split_devices"].is_number_integer())
      return make_error(ErrorCode::corrupt, origin + ": 'split' must be a device object beside an integer 'split_devices'");
    d.split_devices = j["split_devices"].get<int>();
    if (d.split_devices < 2) return make_error(ErrorCode::invalid_argument, origin + ": 'split_devices' must be >= 2");
    if (sj.contains("split")) return make_error(ErrorCode::corrupt, origin + ": a split device has no split of its own");
    auto split = parse_device_spec(sj.dump(), origin + " (split)");
    if (!split) return split.error();
    d.split = std::make_shared<const DeviceSpec>(std::move(split).value());
  }
  return d;
}

std::string device_spec_json(const DeviceSpec& d) {
  nlohmann::ordered_json j;
  j["name"] = d.name;
  j["description"] = d.description;
  std::string dtype = dtype_name(d.weight_dtype);
  std::transform(dtype.begin(), dtype.end(), dtype.begin(), [](unsigned char ch) { return std::tolower(ch); });
  j["weight_dtype"] = dtype;
  j["shared_memory_bus"] = d.shared_memory_bus;
  for (const Field& f : kFields) {
    const Sourced& s = d.*(f.member);
    j[f.key] = {{"value", s.value}, {"source", s.source}};
  }
  emit_efficiency_curve(j, "gemm_efficiency_by_rows", d.gemm_efficiency_by_rows, d.gemm_efficiency_by_rows_source);
  emit_efficiency_curve(j, "tp_gemm_efficiency_by_rows", d.tp_gemm_efficiency_by_rows,
                        d.tp_gemm_efficiency_by_rows_source);
  emit_efficiency_curve(j, "shift_gemm_efficiency_by_rows", d.shift_gemm_efficiency_by_rows,
                        d.shift_gemm_efficiency_by_rows_source);
  emit_efficiency_curve(j, "was_copy_exposed_by_rows", d.was_copy_exposed_by_rows, d.was_copy_exposed_by_rows_source);
  if (d.split) {
    j["split_devices"] = d.split_devices;
    j["split"] = nlohmann::ordered_json::parse(device_spec_json(*d.split));
  }
  return j.dump(2) + "\n";
}

std::vector<std::string> device_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : device_preset_files()) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  return names;
}

Result<DeviceSpec> device_preset(const std::string& name) {
  for (const auto& p : device_preset_files())
    if (p.name == name) return parse_device_spec(p.json, "sim/devices/" + name + ".json");
  return make_error(ErrorCode::not_found, "no device '" + name + "' (built in: " + preset_list() + ")");
}

Result<ClusterSpec> load_cluster(const std::string& name_or_path, const std::string& cpu_calibration_path) {
  auto device_named = [&](const std::string& name) -> Result<DeviceSpec> {
    if (name != "cpu") return device_preset(name);
    if (cpu_calibration_path.empty())
      return make_error(ErrorCode::not_found, "the cpu device needs a calibration file (shardline simulate --calibrate)");
    auto text = read_text(cpu_calibration_path);
    if (!text) return make_error(ErrorCode::not_found, cpu_calibration_path +
                                                           ": no CPU calibration (write one with `shardline simulate "
                                                           "--calibrate`)");
    return parse_device_spec(*text, cpu_calibration_path);
  };
  ClusterSpec c;
  const bool is_file = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json");
  if (is_file) {
    auto text = read_text(name_or_path);
    if (!text) return text.error();
    const json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return make_error(ErrorCode::corrupt, name_or_path + ": not a JSON object");
    if (!j.contains("device")) return make_error(ErrorCode::corrupt, name_or_path + ": missing 'device'");
    Result<DeviceSpec> d = j["device"].is_string() ? device_named(j["device"].get<std::string>())
                                                   : parse_device_spec(j["device"].dump(), name_or_path + ": device");
    if (!d) return d.error();
    c.device = std::move(d).value();
    c.num_devices = j.value("num_devices", 1);
    c.name = j.value("name", std::filesystem::path(name_or_path).stem().string());
  } else {
    std::string device = name_or_path;
    int n = 1;
    const auto x = name_or_path.rfind('x');
    if (x != std::string::npos && x + 1 < name_or_path.size() &&
        name_or_path.find_first_not_of("0123456789", x + 1) == std::string::npos) {
      device = name_or_path.substr(0, x);
      n = std::stoi(name_or_path.substr(x + 1));
    }
    auto d = device_named(device);
    if (!d) return d.error();
    c.device = std::move(d).value();
    c.num_devices = n;
    c.name = name_or_path;
  }
  if (c.num_devices < 1 || c.num_devices > 1 << 20)
    return make_error(ErrorCode::invalid_argument, "cluster " + c.name + ": num_devices must be >= 1");
  return c;
}

const DeviceSpec& device_for(const ClusterSpec& cluster, int active_per_node) {
  const DeviceSpec& d = cluster.device;
  if (d.shared_memory_bus && d.split && d.split_devices >= 2 && active_per_node >= d.split_devices) return *d.split;
  return d;
}

sim::HardwareSpec group_hardware(const ClusterSpec& cluster, int group_size, int active_per_node,
                                          bool large_steps, bool shift_steps) {
  active_per_node = std::max(active_per_node, 1);
  const DeviceSpec& d = device_for(cluster, active_per_node);
  group_size = std::max(group_size, 1);
  const double share = d.shared_memory_bus ? 1.0 / active_per_node : 1.0;
  sim::HardwareSpec hw;
  hw.flops_per_s =
      d.peak_flops.value * (large_steps ? d.prefill_gemm_efficiency.value : d.gemm_efficiency.value) * share;
  if (!large_steps) {
    for (const auto& [rows, e] : d.gemm_efficiency_by_rows)
      hw.flops_by_rows.emplace_back(rows, d.peak_flops.value * e * share);
    const auto& tp_curve = shift_steps && !d.shift_gemm_efficiency_by_rows.empty() ? d.shift_gemm_efficiency_by_rows
                                                                                   : d.tp_gemm_efficiency_by_rows;
    for (const auto& [rows, e] : tp_curve) hw.tp_flops_by_rows.emplace_back(rows, d.peak_flops.value * e * share);
  }
  hw.memory_bw_bytes_per_s = d.memory_bw_bytes_per_s.value * d.memory_bw_efficiency.value * share;
  const bool one_node = group_size <= cluster.devices_per_node();
  hw.comm_bw_bytes_per_s = one_node ? d.intra_node_bw_bytes_per_s.value : d.inter_node_bw_bytes_per_s.value;
  hw.comm_latency_s = one_node ? d.intra_node_latency_s.value : d.inter_node_latency_s.value;
  return hw;
}

double was_copy_exposed_at(const DeviceSpec& device, double rows) {
  return device.was_copy_exposed_by_rows.empty() ? 1.0
                                                 : sim::interpolate_by_rows(device.was_copy_exposed_by_rows, rows);
}

sim::ElementSizes element_sizes(const DeviceSpec& device) {
  const double b = device.weight_dtype == DType::f32 ? 4.0 : 2.0;
  sim::ElementSizes s;
  s.weight_bytes = b;
  s.kv_bytes = b;
  // CPU devices compute in F32 whatever the weights (model/shard_runner).
  s.activation_bytes = device.shared_memory_bus ? 4.0 : b;
  return s;
}

std::uint64_t usable_memory_bytes(const DeviceSpec& device) {
  return static_cast<std::uint64_t>(device.memory_bytes.value * device.memory_utilization.value);
}

}  // namespace shardline::sim
