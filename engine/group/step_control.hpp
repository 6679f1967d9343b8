#pragma once
/// \file
/// The control words on an engine group's world communicator, in one place:
/// its tags (GroupTag) and the kinds of the driver's headers (kKind*). The
/// driver (rank 0, engine/group/parallel_executor.hpp) sends every other
/// rank a header int32[2] {kind, num_words} on kTagMetaHeader, then the
/// kind's body of num_words int32 on kTagMetaBody.

#include <cstdint>

namespace shardline::engine {

/// Tags on a group's world communicator.
enum GroupTag : int {
  kTagMetaHeader = 101,  ///< driver -> rank: int32[2] {kind, num_words} (the kinds below)
  kTagMetaBody = 102,    ///< driver -> rank: int32[num_words] (a step: encode_step(), engine/group/step_codec.hpp)
  kTagActivations = 103, ///< stage s -> s+1: float[chunk_rows, hidden]
  kTagLogits = 104,      ///< last stage (0, 0) -> driver: float[num_logits, vocab]; int32 0 ("done") when num_logits = 0
  kTagTransitionAck = 105,  ///< rank -> driver after a config switch (Seesaw): int64 microseconds re-sharding weights
  kTagKvData = 106,   ///< KV parts of a sequence, both ways (engine/group/group_kv.hpp)
  kTagKvReply = 107,  ///< rank -> driver: a KV request's status word (and a layout)
};

// Header kinds (the first word of a kTagMetaHeader header).
/// A step in the group's own config (cp under Seesaw); body: encode_step().
inline constexpr std::int32_t kKindStep = 0;
/// Stop serving; no body.
inline constexpr std::int32_t kKindShutdown = 1;
/// A step in Shift Parallelism's shift config (seed 001 §3.3); body: encode_step().
inline constexpr std::int32_t kKindStepShift = 2;
/// A step in Seesaw's decode config cd (seed 000 §4.1); body: encode_step().
inline constexpr std::int32_t kKindStepDecode = 3;
/// Seesaw: switch between cp and cd; body int32[2] {0 cp / 1 cd, 1 reload}.
inline constexpr std::int32_t kKindSwitchConfig = 4;
/// KV copies of ranks in other processes (engine/group/group_kv.hpp):
/// copy out, copy in, and the rank's KV layout.
inline constexpr std::int32_t kKindKvOut = 5;
inline constexpr std::int32_t kKindKvIn = 6;
inline constexpr std::int32_t kKindKvLayout = 7;

}  // namespace shardline::engine
