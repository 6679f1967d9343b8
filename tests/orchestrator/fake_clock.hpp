#pragma once
// A clock the test sets by hand (JobManagerOptions::clock): seconds, from 100.

#include <functional>

namespace shardline::orchestrator::testing {

struct FakeClock {
  double t = 100.0;  ///< now, seconds
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

}  // namespace shardline::orchestrator::testing
