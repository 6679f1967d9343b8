#pragma once
/// \file
/// The device files of sim/devices/, built into the binary (CMake writes
/// device_presets.cpp from them at configure time).

#include <string>
#include <vector>

namespace shardline::sim {

struct DevicePresetFile {
  std::string name;  ///< the file's stem, e.g. "h200"
  std::string json;  ///< its text
};

/// Every built-in device file.
[[nodiscard]] const std::vector<DevicePresetFile>& device_preset_files();

}  // namespace shardline::sim
