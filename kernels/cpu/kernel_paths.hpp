#pragma once

// Private to kernels/cpu: the run-time choice of a CPU kernel family's
// instruction path, shared by linear.cpp, quant_linear.cpp, attention.cpp
// and ops.cpp. Each family lists its paths widest first; `automatic` runs
// the widest this CPU has (decided once per process), unless the family's
// environment variable names another path the CPU runs (to measure a
// narrower path on a wider machine). The SIMD path files are compiled for
// their own instructions (kernels/CMakeLists.txt), so the checks here are
// what makes running them safe.

#include <array>
#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace shardline::kernels::cpu::detail {

/// The instruction-set groups the SIMD path files are compiled for.
enum class CpuFeatures {
  none,         ///< any x86-64 CPU: the portable / scalar paths
  avx2,         ///< AVX2 + FMA (`*_avx2.cpp`: -mavx2 -mfma)
  avx512,       ///< AVX-512 F, BW and VL + FMA (`*_avx512.cpp`)
  avx512_bf16,  ///< avx512 + AVX512-BF16 (VDPBF16PS)
  avx512_vnni,  ///< avx512 + AVX512-VNNI (VPDPBUSD, VPDPWSSD)
};

/// Whether this CPU has every instruction of `features` (CPUID, cached by
/// the compiler runtime).
[[nodiscard]] inline bool cpu_has(CpuFeatures features) {
  switch (features) {
    case CpuFeatures::none: return true;
    case CpuFeatures::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuFeatures::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
    case CpuFeatures::avx512_bf16: return cpu_has(CpuFeatures::avx512) && __builtin_cpu_supports("avx512bf16");
    case CpuFeatures::avx512_vnni: return cpu_has(CpuFeatures::avx512) && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

/// One instruction path of a kernel family.
template <class Kernel>
struct KernelPath {
  Kernel kernel;
  const char* name;    ///< as bench and the logs report it, e.g. "avx2"
  CpuFeatures needs;   ///< what the CPU must have to run it
};

/// A kernel family's paths, widest first; the last needs nothing (the
/// portable path). One object per Kernel type: the automatic choice is
/// cached per type.
template <class Kernel, std::size_t N>
struct KernelPaths {
  const char* family;     ///< "attention": the start of error messages
  Kernel automatic;       ///< the family's value that asks for the widest path
  const char* env_var;    ///< names a path for `automatic` (nullptr: none)
  std::array<KernelPath<Kernel>, N> widest_first;

  /// Whether this CPU runs `kernel` (automatic: always).
  [[nodiscard]] bool supported(Kernel kernel) const {
    if (kernel == automatic) return true;
    for (const auto& p : widest_first)
      if (p.kernel == kernel) return cpu_has(p.needs);
    return false;
  }

  /// The path `automatic` runs here: the one `env_var` names if the CPU runs
  /// it, else the widest the CPU runs. Decided on the first call.
  [[nodiscard]] Kernel chosen() const {
    static const Kernel kernel = [this] {
      const char* env = env_var != nullptr ? std::getenv(env_var) : nullptr;
      if (env != nullptr)
        for (const auto& p : widest_first)
          if (std::string(env) == p.name && cpu_has(p.needs)) return p.kernel;
      for (const auto& p : widest_first)
        if (cpu_has(p.needs)) return p.kernel;
      return widest_first.back().kernel;
    }();
    return kernel;
  }

  /// `kernel` with automatic made chosen(). Throws std::invalid_argument
  /// ("<family>: the <name> path on a CPU without it") for a path this CPU
  /// does not run.
  [[nodiscard]] Kernel resolve(Kernel kernel) const {
    if (kernel == automatic) return chosen();
    if (!supported(kernel))
      throw std::invalid_argument(std::string(family) + ": the " + name(kernel) + " path on a CPU without it");
    return kernel;
  }

  /// The name of `kernel` (automatic: of chosen()); "?" for a value that is
  /// not a path.
  [[nodiscard]] const char* name(Kernel kernel) const {
    if (kernel == automatic) kernel = chosen();
    for (const auto& p : widest_first)
      if (p.kernel == kernel) return p.name;
    return "?";
  }
};

}  // namespace shardline::kernels::cpu::detail
