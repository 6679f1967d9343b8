#include "engine/sidp/sidp_rank_loop.hpp"

#include <chrono>
#include <thread>

namespace shardline::engine {

namespace sidp = model::sidp;

Status run_sidp_rank(LlmEngine& eng, sidp::SidpFfn& ffn, SidpRoundHooks& hooks) {
  bool reported_idle = false;
  while (!hooks.aborted()) {
    if (eng.has_unfinished()) {
      Result<std::vector<RequestOutput>> step = eng.step();
      if (!step.ok()) return std::move(step).error();
      for (RequestOutput& o : step.value()) hooks.output(std::move(o));
      if (!eng.step_stats().empty()) hooks.report(eng.step_stats().back().num_seqs);
      continue;
    }
    if (!reported_idle) {
      reported_idle = true;
      hooks.report(0);
    }
    if (ffn.mode() == sidp::SidpMode::cas) {  // lockstep: a dummy step until no rank has work
      Result<bool> any = ffn.dummy_step();
      if (!any.ok()) return std::move(any).error();
      if (!*any && ffn.mode() == sidp::SidpMode::cas) return Status::ok_status();
      continue;
    }
    const std::uint64_t epoch = hooks.announced_epoch();  // before join_pending: see SidpRound
    if (ffn.join_pending()) {
      if (Status s = ffn.sync_mode(); !s.ok()) return s;
      continue;
    }
    if (hooks.idle(epoch)) return Status::ok_status();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return Status::ok_status();
}

SidpRound::SidpRound(int dp) : dp_(dp), idle_at_(static_cast<std::size_t>(dp)) {}

void SidpRound::start(std::function<void()> on_done) {
  std::lock_guard lk(mu_);
  on_done_ = std::move(on_done);
  idle_at_.assign(static_cast<std::size_t>(dp_), std::nullopt);
  done_ = false;
  aborted_ = false;
}

std::uint64_t SidpRound::announce(const std::function<void(std::uint64_t)>& deliver) {
  std::lock_guard lk(mu_);
  const std::uint64_t e = ++epoch_;
  deliver(e);
  return e;
}

std::uint64_t SidpRound::epoch() const {
  std::lock_guard lk(mu_);
  return epoch_;
}

bool SidpRound::idle(int rank, std::uint64_t epoch) {
  std::lock_guard lk(mu_);
  if (done_) return true;
  idle_at_.at(static_cast<std::size_t>(rank)) = epoch;
  for (const auto& e : idle_at_)
    if (!e || *e != epoch_) return false;
  done_ = true;
  if (on_done_) on_done_();
  return true;
}

bool SidpRound::done() const {
  std::lock_guard lk(mu_);
  return done_;
}

void SidpRound::abort() {
  std::lock_guard lk(mu_);
  aborted_ = true;
}

bool SidpRound::aborted() const {
  std::lock_guard lk(mu_);
  return aborted_;
}

}  // namespace shardline::engine
