// `shardline_fake_cuda`'s set-up: the real `shardline` command linked with
// the fake CUDA device and fake NCCL (tests/model/cuda/fake_device.cpp,
// fake_nccl.cpp) in place of cudart, the CUDA kernels and libnccl (link-time
// substitution: the fake's definitions are objects of the executable, so
// the linker takes them before any archive member or shared library). CLI
// end-to-end tests run it as `shardline` on a machine without a GPU.
//
// Environment (read once, before main):
//   SHARDLINE_FAKE_CUDA_DEVICES    the fake GPUs (default 2);
//   SHARDLINE_FAKE_CUDA_MEMORY_MIB each one's memory as reported (default
//                                  8192: the memory plan sizes the KV cache
//                                  from it, and the fake allocates host memory);
//   SHARDLINE_FAKE_CUDA_EXECUTION  `deferred` (default: queued work runs only
//                                  when waited for) or `immediate`.
// At exit every anomaly the fake recorded (a range outside its allocation,
// a kernel on another device's memory, a deadlocked collective, ...) is
// printed to stderr as "fake device anomaly: ..." and the exit status
// becomes 86, so a test sees any.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/model/cuda/fake_device.hpp"

namespace {

namespace fc = shardline::testing_support::fake_cuda;

long env_number(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 1) {
    std::fprintf(stderr, "fake device: %s must be a positive integer, got '%s'\n", name, v);
    std::_Exit(2);
  }
  return n;
}

void report_anomalies() {
  const auto anomalies = fc::anomalies();
  for (const std::string& a : anomalies) std::fprintf(stderr, "fake device anomaly: %s\n", a.c_str());
  if (!anomalies.empty()) {
    std::fflush(nullptr);
    std::_Exit(86);
  }
}

struct Setup {
  Setup() {
    const char* mode = std::getenv("SHARDLINE_FAKE_CUDA_EXECUTION");
    const std::string m = mode == nullptr ? "deferred" : mode;
    if (m != "deferred" && m != "immediate") {
      std::fprintf(stderr, "fake device: SHARDLINE_FAKE_CUDA_EXECUTION must be deferred or immediate\n");
      std::_Exit(2);
    }
    fc::reset(m == "immediate" ? fc::Execution::immediate : fc::Execution::deferred);
    fc::set_device_count(static_cast<int>(env_number("SHARDLINE_FAKE_CUDA_DEVICES", 2)));
    fc::set_memory_bytes(static_cast<std::size_t>(env_number("SHARDLINE_FAKE_CUDA_MEMORY_MIB", 8192)) << 20);
    std::atexit(report_anomalies);
  }
} setup;

}  // namespace
