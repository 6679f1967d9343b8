// kernels/cpu/kernel_paths.hpp: the run-time choice every CPU kernel family
// (linear, quantized linear, attention, ops) makes of its instruction path.
#include "kernels/cpu/kernel_paths.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace kernels_kernel_paths_test {

using shardline::kernels::cpu::detail::cpu_has;
using shardline::kernels::cpu::detail::CpuFeatures;
using shardline::kernels::cpu::detail::KernelPaths;

constexpr CpuFeatures kAll[] = {CpuFeatures::none, CpuFeatures::avx2, CpuFeatures::avx512,
                                CpuFeatures::avx512_bf16, CpuFeatures::avx512_vnni};

// One family per test below: each Kernel type caches its automatic choice.
enum class Probe { automatic, wide, narrow, unlisted };

TEST(KernelPaths, AutomaticIsTheWidestPathTheCpuRuns) {
  for (const CpuFeatures wide : kAll) {
    SCOPED_TRACE(static_cast<int>(wide));
    const KernelPaths<Probe, 2> paths{
        "probe", Probe::automatic, nullptr, {{{Probe::wide, "wide", wide}, {Probe::narrow, "narrow", CpuFeatures::none}}}};
    EXPECT_TRUE(paths.supported(Probe::automatic));
    EXPECT_TRUE(paths.supported(Probe::narrow));
    EXPECT_EQ(paths.supported(Probe::wide), cpu_has(wide));
    EXPECT_FALSE(paths.supported(Probe::unlisted));
    EXPECT_EQ(paths.resolve(Probe::narrow), Probe::narrow);
    if (cpu_has(wide)) {
      EXPECT_EQ(paths.resolve(Probe::wide), Probe::wide);
    } else {
      // A path this CPU lacks is refused by name, never run.
      try {
        (void)paths.resolve(Probe::wide);
        ADD_FAILURE() << "resolved a path the CPU lacks";
      } catch (const std::invalid_argument& e) {
        EXPECT_EQ(std::string(e.what()), "probe: the wide path on a CPU without it");
      }
    }
    EXPECT_STREQ(paths.name(Probe::wide), "wide");
    EXPECT_STREQ(paths.name(Probe::unlisted), "?");
  }
}

TEST(KernelPaths, FeatureGroupsNest) {
  // What each group adds to the one below it (the SIMD files' flags).
  if (cpu_has(CpuFeatures::avx512)) {
    EXPECT_TRUE(cpu_has(CpuFeatures::avx2));
  }
  if (cpu_has(CpuFeatures::avx512_bf16) || cpu_has(CpuFeatures::avx512_vnni)) {
    EXPECT_TRUE(cpu_has(CpuFeatures::avx512));
  }
  EXPECT_TRUE(cpu_has(CpuFeatures::none));
  EXPECT_EQ(cpu_has(CpuFeatures::avx2), __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

enum class Chosen { automatic, avx2, portable };

TEST(KernelPaths, ChosenIsTheFirstSupportedOfTheList) {
  const KernelPaths<Chosen, 2> paths{"chosen",
                                     Chosen::automatic,
                                     "SHARDLINE_KERNEL_PATHS_TEST_UNSET",
                                     {{{Chosen::avx2, "avx2", CpuFeatures::avx2},
                                       {Chosen::portable, "portable", CpuFeatures::none}}}};
  ::unsetenv("SHARDLINE_KERNEL_PATHS_TEST_UNSET");
  const Chosen want = cpu_has(CpuFeatures::avx2) ? Chosen::avx2 : Chosen::portable;
  EXPECT_EQ(paths.chosen(), want);
  EXPECT_EQ(paths.resolve(Chosen::automatic), want);
  EXPECT_STREQ(paths.name(Chosen::automatic), want == Chosen::avx2 ? "avx2" : "portable");
}

enum class Named { automatic, avx2, portable };

TEST(KernelPaths, TheEnvironmentVariableNamesTheAutomaticPath) {
  ::setenv("SHARDLINE_KERNEL_PATHS_TEST_NAMED", "portable", 1);
  const KernelPaths<Named, 2> paths{"named",
                                    Named::automatic,
                                    "SHARDLINE_KERNEL_PATHS_TEST_NAMED",
                                    {{{Named::avx2, "avx2", CpuFeatures::avx2},
                                      {Named::portable, "portable", CpuFeatures::none}}}};
  EXPECT_EQ(paths.chosen(), Named::portable);
  EXPECT_STREQ(paths.name(Named::automatic), "portable");
  // Read once: a later change does not move it.
  ::setenv("SHARDLINE_KERNEL_PATHS_TEST_NAMED", "avx2", 1);
  EXPECT_EQ(paths.chosen(), Named::portable);
  ::unsetenv("SHARDLINE_KERNEL_PATHS_TEST_NAMED");
}

enum class Misnamed { automatic, wide, portable };

TEST(KernelPaths, AnEnvironmentValueThatIsNoRunnablePathIsIgnored) {
  // A typo, or a path this CPU lacks: automatic stays the widest it runs.
  const bool have_avx512 = cpu_has(CpuFeatures::avx512);
  ::setenv("SHARDLINE_KERNEL_PATHS_TEST_MISNAMED", have_avx512 ? "no_such_path" : "wide", 1);
  const KernelPaths<Misnamed, 2> paths{"misnamed",
                                       Misnamed::automatic,
                                       "SHARDLINE_KERNEL_PATHS_TEST_MISNAMED",
                                       {{{Misnamed::wide, "wide", CpuFeatures::avx512},
                                         {Misnamed::portable, "portable", CpuFeatures::none}}}};
  EXPECT_EQ(paths.chosen(), have_avx512 ? Misnamed::wide : Misnamed::portable);
  ::unsetenv("SHARDLINE_KERNEL_PATHS_TEST_MISNAMED");
}

}  // namespace kernels_kernel_paths_test
