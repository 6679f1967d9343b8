// SiDP's FFN executor at the layer level (seed 002 §4.3): CaS packs each
// rank's rows to the owner, which runs one fused GEMM over all of them and
// returns each rank exactly its slice (bit-identical to computing the rows
// locally); a dummy rank sends nothing; a rank that dies mid-CaS makes its
// peers fail within the communicator timeout instead of hanging.
#include "model/sidp/sidp_ffn.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "comm/inproc.hpp"
#include "model/weights.hpp"
#include "tests/support/stories_reference.hpp"

namespace shardline::model::sidp {
namespace model_sidp_sidp_ffn_test {

using namespace std::chrono_literals;

std::shared_ptr<const ModelWeights> stories() { return testing_support::stories_weights(); }

struct Group {
  OwnershipPlan plan;
  std::shared_ptr<comm::InProcGroup> wg, cg;
  std::vector<std::unique_ptr<comm::Communicator>> wc, cc;
  std::vector<std::shared_ptr<LayerOwner>> owners;
  std::vector<std::shared_ptr<SidpFfn>> ffn;
  Group(int dp, SidpMode mode, std::chrono::milliseconds timeout = 20s) {
    plan = *balanced_plan(5, dp);
    wg = *comm::InProcGroup::create(dp);
    cg = *comm::InProcGroup::create(dp);
    for (int r = 0; r < dp; ++r) {
      wc.push_back(std::move(wg->communicator(r)).value());
      cc.push_back(std::move(cg->communicator(r)).value());
      cc.back()->set_timeout(timeout);
      owners.push_back(std::move(LayerOwner::create(stories(), plan, r)).value());
      EXPECT_TRUE(owners.back()->load(wc.back().get()).ok());
    }
    SidpFfnOptions o;
    o.initial_mode = mode;
    for (int r = 0; r < dp; ++r)
      ffn.push_back(std::move(SidpFfn::create(plan, r, owners[static_cast<std::size_t>(r)], wc[r].get(),
                                              cc[r].get(), o))
                        .value());
  }
  ~Group() {
    ffn.clear();
    for (std::size_t r = 0; r < owners.size(); ++r) owners[r]->unload(wc[r].get());
  }
};

std::vector<float> random_rows(int rows, int hidden, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(rows) * hidden);
  for (float& v : x) v = d(g);
  return x;
}

/// The layer's FFN on `rows` rows computed alone, from freshly packed weights.
std::vector<float> local_ffn(int layer, const std::vector<float>& x, int rows) {
  const auto& lw = stories()->layers[static_cast<std::size_t>(layer)];
  const int hidden = stories()->config.hidden_size, inter = stories()->config.intermediate_size;
  FfnMatrices m{kernels::cpu::PackedWeight(kernels::cpu::PackedLinear::pack(lw.gate_up.data, lw.gate_up.dtype,
                                                                            lw.gate_up.rows, lw.gate_up.cols)),
                kernels::cpu::PackedWeight(kernels::cpu::PackedLinear::pack(
                    lw.down_proj.data, lw.down_proj.dtype, lw.down_proj.rows, lw.down_proj.cols))};
  std::vector<float> gu(static_cast<std::size_t>(rows) * 2 * inter), act(static_cast<std::size_t>(rows) * inter),
      out(static_cast<std::size_t>(rows) * hidden);
  ffn_forward(m, x.data(), rows, gu.data(), act.data(), out.data());
  return out;
}

// Ranks 0..2 with 3, 0 (dummy) and 5 rows: every layer's output is each
// rank's own slice, bit-identical to computing its rows alone.
TEST(SidpFfn, CasReturnsEachRankItsSliceOfTheFusedGemm) {
  Group g(3, SidpMode::cas);
  const int hidden = stories()->config.hidden_size;
  const std::vector<int> rows = {3, 0, 5};
  std::vector<std::vector<std::vector<float>>> outs(3);  // [rank][layer]
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < 3; ++r) xs.push_back(random_rows(std::max(1, rows[static_cast<std::size_t>(r)]), hidden, 7 + r));
  std::vector<Status> st(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      SidpFfn& f = *g.ffn[static_cast<std::size_t>(r)];
      const int n = rows[static_cast<std::size_t>(r)];
      if (n == 0) {
        auto any = f.dummy_step();
        st[static_cast<std::size_t>(r)] = any.ok() ? Status::ok_status() : Status(any.error());
        return;
      }
      if (Status s = f.begin_step(n); !s) {
        st[static_cast<std::size_t>(r)] = s;
        return;
      }
      for (int l = 0; l < 5; ++l) {
        std::vector<float> out(static_cast<std::size_t>(n) * hidden);
        if (Status s = f.forward(l, xs[static_cast<std::size_t>(r)].data(), n, out.data()); !s) {
          st[static_cast<std::size_t>(r)] = s;
          return;
        }
        outs[static_cast<std::size_t>(r)].push_back(std::move(out));
      }
      f.end_step();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(st[static_cast<std::size_t>(r)].ok()) << st[static_cast<std::size_t>(r)].error().to_string();
  for (int r : {0, 2})
    for (int l = 0; l < 5; ++l) {
      const auto want = local_ffn(l, xs[static_cast<std::size_t>(r)], rows[static_cast<std::size_t>(r)]);
      ASSERT_EQ(outs[static_cast<std::size_t>(r)][static_cast<std::size_t>(l)].size(), want.size());
      EXPECT_EQ(0, std::memcmp(outs[static_cast<std::size_t>(r)][static_cast<std::size_t>(l)].data(), want.data(),
                               want.size() * sizeof(float)))
          << "rank " << r << " layer " << l;
    }
  // Owners fused 8 rows (3 + 5) per layer: one GEMM chain per layer.
  std::uint64_t fused = 0, fused_rows = 0;
  for (auto& f : g.ffn) {
    fused += f->stats().cas_fused_gemms;
    fused_rows += f->stats().cas_fused_rows;
  }
  EXPECT_EQ(fused, 5u);
  EXPECT_EQ(fused_rows, 5u * 8u);
  // The dummy rank 1 sent no rows; rank 0 sent its 3 rows for the 3 layers
  // it does not own (1, 2, 4), rank 2 its 5 for layers 0, 1, 3, 4.
  EXPECT_EQ(g.ffn[1]->stats().cas_rows_sent, 0u);
  EXPECT_EQ(g.ffn[0]->stats().cas_rows_sent, 3u * 3u);
  EXPECT_EQ(g.ffn[2]->stats().cas_rows_sent, 5u * 4u);
  // Owners 0 and 2 skipped dummy rank 1 for each layer they own (0, 3 / 2).
  EXPECT_EQ(g.ffn[0]->stats().cas_peer_skips, 2u);
  EXPECT_EQ(g.ffn[2]->stats().cas_peer_skips, 1u);
}

TEST(SidpFfn, WasComputesLocallyFromFetchedWeightsBitIdentically) {
  Group g(2, SidpMode::was);
  const int hidden = stories()->config.hidden_size;
  const auto x = random_rows(4, hidden, 3);
  SidpFfn& f = *g.ffn[1];
  ASSERT_TRUE(f.begin_step(4).ok());
  for (int l = 0; l < 5; ++l) {
    std::vector<float> out(4 * static_cast<std::size_t>(hidden));
    ASSERT_TRUE(f.forward(l, x.data(), 4, out.data()).ok());
    const auto want = local_ffn(l, x, 4);
    EXPECT_EQ(0, std::memcmp(out.data(), want.data(), want.size() * sizeof(float))) << "layer " << l;
  }
  f.end_step();
  EXPECT_EQ(f.stats().cache.fetches >= 3, true);  // layers 0, 2, 4 came from owner 0
  EXPECT_EQ(g.cc[1]->bytes_sent(), 0u) << "WaS moved activations";
}

// A rank that dies mid-CaS: its peers' recv / collective fails with io within
// the communicator timeout (not a hang), and the group is broken afterwards.
TEST(SidpFfn, ARankDyingMidCasFailsItsPeersWithinTheTimeout) {
  Group g(2, SidpMode::cas, 300ms);
  const int hidden = stories()->config.hidden_size;
  const auto x = random_rows(2, hidden, 5);
  Status st0 = Status::ok_status();
  const auto t0 = std::chrono::steady_clock::now();
  std::thread t([&] {
    SidpFfn& f = *g.ffn[0];
    st0 = f.begin_step(2);
    if (!st0) return;
    std::vector<float> out(2 * static_cast<std::size_t>(hidden));
    for (int l = 0; l < 5 && st0; ++l) st0 = f.forward(l, x.data(), 2, out.data());
  });
  // Rank 1 takes part in the control exchange, then dies before layer 0.
  ASSERT_TRUE(g.ffn[1]->begin_step(2).ok());
  t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(st0.ok());
  EXPECT_EQ(st0.error().code, ErrorCode::io) << st0.error().to_string();
  EXPECT_LT(s, 20.0) << "a dead peer must fail the step within the timeout";
  auto again = g.ffn[0]->begin_step(2);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("broken"), std::string::npos) << again.error().message;
}

}  // namespace
}  // namespace shardline::model::sidp
