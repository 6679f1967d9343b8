#pragma once
// Shared checks of the SiDP golden tests (tests/engine/sidp_group_golden_test.cpp,
// tests/engine/sidp_process_golden_test.cpp): one device's reference run, the
// scripted mode switches, bit-identical outputs (memcmp of every logit) and
// which modes every rank ran.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "engine/data_parallel.hpp"
#include "engine/group/engine_builder.hpp"
#include "engine/sidp/sidp_group.hpp"

namespace shardline::testing_support {

/// `prompts` on one device built from `o` (the reference).
inline Result<std::vector<engine::RequestOutput>> run_single(const engine::EngineOptions& o,
                                                             const std::vector<std::vector<std::int32_t>>& prompts,
                                                             const sampling::SamplingParams& params) {
  Result<engine::EngineInstance> e = engine::build_engine(o);
  if (!e.ok()) return std::move(e).error();
  std::vector<engine::LlmEngine*> engines = {e->engine.get()};
  return engine::generate_data_parallel(engines, prompts, params);
}

/// How a run drives the mode: fixed, or switched by rank 0's step count.
enum class SidpDrive { was, cas, switching };
inline const char* drive_name(SidpDrive d) {
  return d == SidpDrive::was ? "was" : d == SidpDrive::cas ? "cas" : "switching";
}

/// WaS -> CaS at rank 0's 3rd step, back to WaS at its 8th, CaS again at its
/// 14th (directives reach remote ranks over their control group). Each
/// directive waits until rank 0 has applied the one before: a newer directive
/// supersedes one that no rank has applied yet (SidpFfn::announce), so on a
/// fast machine a remote rank that got the 8th step's WaS and the 14th's CaS
/// together would otherwise never run the WaS stretch.
inline engine::SidpStepObserver scripted_switches(engine::SidpGroup& g, std::atomic<int>& rank0_steps) {
  struct Script {
    std::size_t next = 0;     // index of the next directive
    std::uint64_t epoch = 0;  // the epoch the last one was given
  };
  auto script = std::make_shared<Script>();
  return [&g, &rank0_steps, script](int rank, int) {
    if (rank != 0) return;  // rank 0's thread only: the script needs no lock
    static constexpr int kAtStep[] = {3, 8, 14};
    static constexpr model::sidp::SidpMode kMode[] = {model::sidp::SidpMode::cas, model::sidp::SidpMode::was,
                                                      model::sidp::SidpMode::cas};
    const int s = ++rank0_steps;
    if (script->next >= std::size(kAtStep) || s < kAtStep[script->next]) return;
    if (g.ffn_stats(0).applied_epoch < script->epoch) return;  // the last one is still in flight
    script->epoch = g.announce(kMode[script->next]);
    ++script->next;
  };
}

/// Same ids, text and every logit bit for bit (memcmp).
inline void expect_bit_identical(const std::vector<engine::RequestOutput>& got,
                                 const std::vector<engine::RequestOutput>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(got[i].request_id, ref[i].request_id) << what;
    EXPECT_EQ(got[i].token_ids, ref[i].token_ids) << what << " request " << i;
    EXPECT_EQ(got[i].text, ref[i].text) << what << " request " << i;
    ASSERT_EQ(got[i].logits.size(), ref[i].logits.size()) << what << " request " << i;
    for (std::size_t s = 0; s < ref[i].logits.size(); ++s) {
      ASSERT_EQ(got[i].logits[s].size(), ref[i].logits[s].size());
      EXPECT_EQ(0, std::memcmp(got[i].logits[s].data(), ref[i].logits[s].data(), ref[i].logits[s].size() * 4))
          << what << " request " << i << " step " << s << " not bit-identical";
    }
  }
}

/// Every rank ran the drive's modes: WaS fetched weights and ran no CaS
/// step; CaS fetched nothing; switching went both ways; an owner fused.
inline void expect_modes_ran(const std::vector<model::sidp::SidpFfnStats>& stats, SidpDrive drive,
                             const std::string& what) {
  std::uint64_t fused = 0;
  for (std::size_t r = 0; r < stats.size(); ++r) {
    const auto& st = stats[r];
    fused += st.cas_fused_gemms;
    if (drive == SidpDrive::was) {
      EXPECT_EQ(st.cas_steps + st.dummy_steps, 0u) << what << " rank " << r;
      EXPECT_GT(st.cache.fetches, 0u) << what << " rank " << r << " fetched no weights in WaS";
    }
    if (drive == SidpDrive::cas) {
      EXPECT_EQ(st.cache.fetches, 0u) << what << " rank " << r << " fetched weights in CaS";
      EXPECT_EQ(st.was_steps, 0u) << what << " rank " << r;
    }
    if (drive == SidpDrive::switching) {
      EXPECT_GE(st.switches_to_cas, 1u) << what << " rank " << r;
      EXPECT_GE(st.switches_to_was, 1u) << what << " rank " << r;
    }
  }
  if (drive != SidpDrive::was) {
    EXPECT_GT(fused, 0u) << what << ": no owner ran a fused CaS GEMM";
  }
}

}  // namespace shardline::testing_support
