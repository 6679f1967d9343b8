// common/openmp_pool.hpp: freeing the calling thread's idle OpenMP pool
// works outside a parallel region, is refused inside one, and the next
// region makes a new team (docs/performance.md has the speed it buys, a
// benchmark's figure, not a test's).
#include "common/openmp_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace shardline {
namespace common_openmp_pool_test {

TEST(OpenmpPool, ReleasedOutsideARegionRefusedInsideAndMadeAgain) {
  std::atomic<int> ran{0};
#pragma omp parallel num_threads(2)
  ran.fetch_add(1);
  EXPECT_EQ(ran.load(), 2);
  EXPECT_TRUE(release_openmp_pool());

  std::atomic<int> refused{0};
#pragma omp parallel num_threads(2)
  if (!release_openmp_pool()) refused.fetch_add(1);
  EXPECT_EQ(refused.load(), 2) << "inside a region the pool is in use";

  // Freed on another thread too, and a new team runs in full after it.
  std::thread t([] {
    std::atomic<int> n{0};
#pragma omp parallel num_threads(2)
    n.fetch_add(1);
    EXPECT_TRUE(release_openmp_pool());
#pragma omp parallel num_threads(2)
    n.fetch_add(1);
    EXPECT_EQ(n.load(), 4);
  });
  t.join();
}

}  // namespace
}  // namespace shardline
