#include "engine/policies/shift_policy.hpp"

#include <cmath>
#include <string>

namespace shardline::engine {

Status ShiftPolicyOptions::validate() const {
  if (threshold < 0)
    return make_error(ErrorCode::invalid_argument, "--shift-threshold must be >= 0, got " + std::to_string(threshold));
  if (!(hysteresis >= 0) || !std::isfinite(hysteresis))
    return make_error(ErrorCode::invalid_argument, "--shift-hysteresis must be a finite number >= 0");
  return Status::ok_status();
}

Result<ShiftPolicy> ShiftPolicy::create(const ShiftPolicyOptions& options) {
  if (Status st = options.validate(); !st) return st.error();
  return ShiftPolicy(options);
}

ShiftPolicy::ShiftPolicy(const ShiftPolicyOptions& o)
    : options_(o), upper_(static_cast<long long>(std::floor(static_cast<double>(o.threshold) * (1.0 + o.hysteresis)))) {}

ShiftMode ShiftPolicy::decide(long long num_tokens) {
  if (num_tokens <= 0) return mode_;
  const ShiftMode before = mode_;
  if (mode_ == ShiftMode::base && num_tokens <= options_.threshold) mode_ = ShiftMode::shift;
  else if (mode_ == ShiftMode::shift && num_tokens > upper_) mode_ = ShiftMode::base;
  if (mode_ != before) ++switches_;
  ++(mode_ == ShiftMode::base ? base_steps_ : shift_steps_);
  return mode_;
}

}  // namespace shardline::engine
