#include "engine/step_phases.hpp"

#include <utility>

namespace shardline::engine {

Result<bool> EngineParts::offload(const SwapOut& offload) const {
  Result<bool> kept = kv_io->begin_offload(offload);
  if (!kept.ok()) return kept.error();
  if (!*kept) {  // no room in the host KV buffer: it is prefilled again
    if (Status s = scheduler->offload_done(offload.seq_id, false); !s.ok())
      return make_error(ErrorCode::internal, s.error().message);
    return false;
  }
  return true;
}

Status EngineParts::offload_all(std::span<const SwapOut> offloads, StepPhaseHook* hook) const {
  for (const SwapOut& o : offloads) {
    Result<bool> started = offload(o);
    if (!started.ok()) return std::move(started).error();
    if (*started && hook != nullptr) hook->on_offload();
  }
  return Status::ok_status();
}

Status EngineParts::apply_done(Result<std::vector<KvCacheIo::MoveDone>> done) const {
  if (!done.ok()) return std::move(done).error();
  for (const KvCacheIo::MoveDone& d : *done) {
    Status s = d.to_host ? scheduler->offload_done(d.seq_id, true) : scheduler->onboard_done(d.seq_id);
    if (!s.ok()) return make_error(ErrorCode::internal, s.error().message);
  }
  return Status::ok_status();
}

long long EngineParts::host_held_tokens() const {
  const auto per_token = static_cast<long long>(kv_io->bytes_for(1));
  const auto used = static_cast<long long>(kv_io->stats().swap_space_bytes_used);
  return per_token > 0 ? (used + per_token - 1) / per_token : 0;
}

long long EngineParts::host_capacity_tokens() const {
  const auto per_token = static_cast<long long>(kv_io->bytes_for(1));
  return per_token > 0 ? static_cast<long long>(swap_space_bytes) / per_token : 0;
}

}  // namespace shardline::engine
