#include "worker/sidp_stepper.hpp"

#include <spdlog/spdlog.h>

namespace shardline::worker {

using model::sidp::SidpMode;

SidpStepper::SidpStepper(std::unique_ptr<engine::SidpRank> rank) : rank_(std::move(rank)) {}

const char* SidpStepper::mode_name() const { return engine::to_string(rank_->ffn().mode()); }

std::uint64_t SidpStepper::ffn_turns() const {
  const model::sidp::SidpFfnStats s = rank_->ffn().stats();
  return s.was_steps + s.cas_steps + s.dummy_steps;
}

Status SidpStepper::absorb(const Error& e) {
  if (!rank_->generation_dead()) return e;
  spdlog::info("sidp rank {}: {} (its compute generation died; following the group)", rank_->rank(), e.message);
  auto changed = rank_->refresh();
  if (!changed) return changed.error();
  return Status::ok_status();
}

Status SidpStepper::before_step() {
  auto changed = rank_->refresh();
  if (!changed) return changed.error();
  turns_before_ = ffn_turns();
  return Status::ok_status();
}

Status SidpStepper::after_step() {
  if (rank_->ffn().mode() != SidpMode::cas || ffn_turns() != turns_before_) return Status::ok_status();
  auto any = rank_->ffn().dummy_step();
  if (!any) return absorb(any.error());
  return Status::ok_status();
}

Result<SidpIdle> SidpStepper::idle() {
  auto changed = rank_->refresh();
  if (!changed) return changed.error();
  model::sidp::SidpRankFfn& ffn = rank_->ffn();
  if (ffn.mode() == SidpMode::cas) {
    auto any = ffn.dummy_step();
    if (!any) {
      if (Status st = absorb(any.error()); !st) return st.error();
      return SidpIdle{true, kIdlePoll};
    }
    // Peers had rows: their next step follows at once; else poll.
    return SidpIdle{true, *any ? std::chrono::milliseconds(0) : kIdlePoll};
  }
  if (ffn.join_pending()) {
    if (Status st = ffn.sync_mode(); !st) {
      if (Status a = absorb(st.error()); !a) return a.error();
    }
    return SidpIdle{true, std::chrono::milliseconds(0)};
  }
  return SidpIdle{};
}

void SidpStepper::directive(SidpMode mode, std::uint64_t epoch) { rank_->directive({mode, epoch}); }

}  // namespace shardline::worker
