#include "common/result.hpp"

namespace shardline {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::not_found: return "not_found";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::corrupt: return "corrupt";
    case ErrorCode::mismatch: return "mismatch";
    case ErrorCode::out_of_memory: return "out_of_memory";
    case ErrorCode::disk_full: return "disk_full";
    case ErrorCode::io: return "io";
    case ErrorCode::internal: return "internal";
  }
  return "unknown";
}

}  // namespace shardline
