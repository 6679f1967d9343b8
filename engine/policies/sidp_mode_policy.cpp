#include "engine/policies/sidp_mode_policy.hpp"

#include <cmath>
#include <string>

namespace shardline::engine {

namespace {

Status bad(const std::string& m) { return Status(make_error(ErrorCode::invalid_argument, "sidp mode policy: " + m)); }

bool non_negative(double v) { return std::isfinite(v) && v >= 0; }

double seconds_between(SidpModePolicy::TimePoint from, SidpModePolicy::TimePoint to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

const char* to_string(SidpMode mode) noexcept { return mode == SidpMode::cas ? "cas" : "was"; }

Result<SidpMode> parse_sidp_mode(std::string_view text) {
  if (text == "was") return SidpMode::was;
  if (text == "cas") return SidpMode::cas;
  return make_error(ErrorCode::invalid_argument, "SiDP mode must be was or cas, got '" + std::string(text) + "'");
}

const char* to_string(SidpModeSetting setting) noexcept {
  switch (setting) {
    case SidpModeSetting::was: return "was";
    case SidpModeSetting::cas: return "cas";
    case SidpModeSetting::automatic: break;
  }
  return "auto";
}

Result<SidpModeSetting> parse_sidp_mode_setting(std::string_view text) {
  if (text == "auto") return SidpModeSetting::automatic;
  if (text == "was") return SidpModeSetting::was;
  if (text == "cas") return SidpModeSetting::cas;
  return make_error(ErrorCode::invalid_argument,
                    "--sidp-mode must be auto, was or cas, got '" + std::string(text) + "'");
}

Status SidpModePolicyOptions::validate() const {
  if (setting == SidpModeSetting::automatic && switch_batch < 1)
    return bad("switch_batch (b*) must be >= 1 with --sidp-mode auto, got " + std::to_string(switch_batch));
  if (!non_negative(hysteresis)) return bad("hysteresis (h) must be >= 0, got " + std::to_string(hysteresis));
  if (!non_negative(min_dwell_s)) return bad("min_dwell_s must be >= 0, got " + std::to_string(min_dwell_s));
  if (!non_negative(back_dwell_s)) return bad("back_dwell_s must be >= 0, got " + std::to_string(back_dwell_s));
  if (num_ranks < 1) return bad("num_ranks must be >= 1, got " + std::to_string(num_ranks));
  return Status::ok_status();
}

Result<SidpModePolicy> SidpModePolicy::create(const SidpModePolicyOptions& options) {
  if (Status st = options.validate(); !st) return st.error();
  return SidpModePolicy(options);
}

SidpModePolicy::SidpModePolicy(const SidpModePolicyOptions& options)
    : options_(options),
      mode_(options.setting == SidpModeSetting::cas ? SidpMode::cas : SidpMode::was),
      latest_(static_cast<size_t>(options.num_ranks), -1),
      latest_waiting_(static_cast<size_t>(options.num_ranks), 0) {}

double SidpModePolicy::switch_back_batch() const {
  return static_cast<double>(options_.switch_batch) * (1.0 + options_.hysteresis);
}

bool SidpModePolicy::leave_condition() const {
  // An idle group (G = 0) is not a tail: nothing runs that CaS would speed
  // up. Nor is a group with prompts waiting: their prefill is the bulk.
  if (mode_ == SidpMode::was)
    return group_batch_ > 0 && group_batch_ < options_.switch_batch && group_waiting_ == 0;
  return static_cast<double>(group_batch_) > switch_back_batch() || group_waiting_ > 0;
}

Status SidpModePolicy::observe(TimePoint now, int rank, long long effective_batch, long long waiting_prompts) {
  if (rank < 0 || rank >= options_.num_ranks)
    return bad("report from rank " + std::to_string(rank) + " outside the group's ranks [0, " +
               std::to_string(options_.num_ranks) + ")");
  if (effective_batch < 0 || waiting_prompts < 0)
    return bad("rank " + std::to_string(rank) + " reported a negative effective batch or waiting count (" +
               std::to_string(effective_batch) + ", " + std::to_string(waiting_prompts) + ")");
  long long& slot = latest_[static_cast<size_t>(rank)];
  if (slot < 0) {
    ++num_reported_;
    slot = 0;
  }
  group_batch_ += effective_batch - slot;
  slot = effective_batch;
  long long& waiting = latest_waiting_[static_cast<size_t>(rank)];
  group_waiting_ += waiting_prompts - waiting;
  waiting = waiting_prompts;

  if (!ready() || !leave_condition())
    held_since_.reset();
  else if (!held_since_)
    held_since_ = now;
  return Status::ok_status();
}

std::optional<SidpSwitch> SidpModePolicy::decide(TimePoint now) {
  if (options_.setting != SidpModeSetting::automatic) return std::nullopt;
  if (!ready() || !held_since_) return std::nullopt;
  const double dwell = mode_ == SidpMode::was ? options_.min_dwell_s : options_.back_dwell_s;
  if (seconds_between(*held_since_, now) < dwell) return std::nullopt;
  if (last_switch_ && seconds_between(*last_switch_, now) < options_.min_dwell_s) return std::nullopt;

  SidpSwitch s;
  s.from = mode_;
  s.to = mode_ == SidpMode::was ? SidpMode::cas : SidpMode::was;
  s.at = now;
  s.since = *held_since_;
  s.group_batch = group_batch_;
  mode_ = s.to;
  ++num_switches_;
  last_switch_ = now;
  // G < b* and G > b*(1+h) exclude each other (h >= 0), so the condition to
  // leave the new mode does not hold yet: its dwell starts at a later report.
  held_since_.reset();
  return s;
}

}  // namespace shardline::engine
