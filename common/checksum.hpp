#pragma once
/// \file
/// FNV-1a, 64-bit: a running checksum whose state is its value, so it can
/// be stored and extended later (the output file's committed prefix,
/// orchestrator/output_writer.hpp). It detects edits and damage, not a
/// forger (anyone can recompute it). Its own ten lines rather than a library:
/// zlib's crc32 is also extendable but 32-bit, and the streaming states of
/// xxHash and SHA-256 cannot be kept as one stored number.

#include <cstdint>
#include <string_view>

namespace shardline {

/// The checksum of no bytes.
inline constexpr std::uint64_t kFnv1a64Empty = 0xCBF29CE484222325ull;

/// `state` (the checksum of some bytes A) extended by `bytes`: the checksum of A + bytes.
[[nodiscard]] constexpr std::uint64_t fnv1a64(std::uint64_t state, std::string_view bytes) noexcept {
  for (const char c : bytes) {
    state ^= static_cast<unsigned char>(c);
    state *= 0x100000001B3ull;
  }
  return state;
}

}  // namespace shardline
