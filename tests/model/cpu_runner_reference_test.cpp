// The CPU forward pass against an independent double-precision reference of
// the Hugging Face modelling code, on tiny random models of each supported
// architecture: Llama (GQA, tied embeddings), Llama 3 rope scaling, Qwen2
// (q/k/v bias) and Qwen3 (per-head q/k RMSNorm, untied lm_head). The golden
// test pins Llama against real weights; this pins what stories260K does not use.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/cpu_runner.hpp"
#include "model/weights.hpp"

namespace shardline::model {
namespace model_cpu_runner_reference_test {

using Vec = std::vector<double>;

std::string config_json(const std::string& arch, bool tied, const std::string& rope_scaling) {
  return R"({"architectures": [")" + arch + R"("], "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "vocab_size": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
    "rope_theta": 500000.0, "tie_word_embeddings": )" + (tied ? "true" : "false") +
         R"(, "rope_scaling": )" + rope_scaling + "}";
}

// Reference helpers over row-major F32 weights, computed in double.
Vec matvec(const Matrix& m, const Vec& x, const Vector* bias = nullptr) {
  const float* w = static_cast<const float*>(m.data);
  Vec y(static_cast<std::size_t>(m.rows));
  for (int r = 0; r < m.rows; ++r) {
    double s = bias && !bias->empty() ? bias->data[r] : 0.0;
    for (int c = 0; c < m.cols; ++c) s += static_cast<double>(w[static_cast<std::size_t>(r) * m.cols + c]) * x[c];
    y[r] = s;
  }
  return y;
}

void rms_norm_ref(double* x, int n, const float* w, double eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
}

std::vector<double> inv_freq_ref(const ModelConfig& c) {
  const int d = c.head_dim;
  std::vector<double> f(static_cast<std::size_t>(d / 2));
  for (int i = 0; i < d / 2; ++i) f[i] = 1.0 / std::pow(static_cast<double>(c.rope_theta), 2.0 * i / d);
  if (c.rope_scaling && c.rope_scaling->rope_type == "llama3") {
    const RopeScaling& s = *c.rope_scaling;
    const double low_wl = s.original_max_position_embeddings / s.low_freq_factor;
    const double high_wl = s.original_max_position_embeddings / s.high_freq_factor;
    for (double& v : f) {
      const double wl = 2 * M_PI / v;
      if (wl > low_wl) {
        v = v / s.factor;
      } else if (wl >= high_wl) {
        const double smooth = (s.original_max_position_embeddings / wl - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        v = (1 - smooth) * v / s.factor + smooth * v;
      }
    }
  }
  return f;
}

void rope_ref(double* head, int d, int pos, const std::vector<double>& inv_freq) {
  for (int i = 0; i < d / 2; ++i) {
    const double a = pos * inv_freq[i], c = std::cos(a), s = std::sin(a);
    const double x1 = head[i], x2 = head[i + d / 2];
    head[i] = x1 * c - x2 * s;
    head[i + d / 2] = x2 * c + x1 * s;
  }
}

/// Logits [num_tokens][vocab] of the whole sequence (causal), HF semantics.
std::vector<Vec> reference_forward(const ModelWeights& w, const std::vector<std::int32_t>& tokens) {
  const ModelConfig& c = w.config;
  const int T = static_cast<int>(tokens.size()), H = c.hidden_size, d = c.head_dim;
  const int nh = c.num_attention_heads, nkv = c.num_key_value_heads, I = c.intermediate_size;
  const auto inv_freq = inv_freq_ref(c);
  const float* emb = static_cast<const float*>(w.embed_tokens.data);
  std::vector<Vec> x(static_cast<std::size_t>(T), Vec(static_cast<std::size_t>(H)));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[t][i] = emb[static_cast<std::size_t>(tokens[t]) * H + i];
  for (const LayerWeights& lw : w.layers) {
    std::vector<Vec> q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      Vec h = x[t];
      rms_norm_ref(h.data(), H, lw.input_norm.data, c.rms_norm_eps);
      const Vec qkv = matvec(lw.qkv, h, &lw.qkv_bias);
      q[t].assign(qkv.begin(), qkv.begin() + nh * d);
      k[t].assign(qkv.begin() + nh * d, qkv.begin() + (nh + nkv) * d);
      v[t].assign(qkv.begin() + (nh + nkv) * d, qkv.end());
      for (int hh = 0; hh < nh; ++hh) {
        if (c.qk_norm) rms_norm_ref(&q[t][hh * d], d, lw.q_norm.data, c.rms_norm_eps);
        rope_ref(&q[t][hh * d], d, t, inv_freq);
      }
      for (int hh = 0; hh < nkv; ++hh) {
        if (c.qk_norm) rms_norm_ref(&k[t][hh * d], d, lw.k_norm.data, c.rms_norm_eps);
        rope_ref(&k[t][hh * d], d, t, inv_freq);
      }
    }
    for (int t = 0; t < T; ++t) {
      Vec attn(static_cast<std::size_t>(nh * d), 0.0);
      for (int hh = 0; hh < nh; ++hh) {
        const int g = hh / (nh / nkv);
        Vec s(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int i = 0; i < d; ++i) dot += q[t][hh * d + i] * k[j][g * d + i];
          s[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j)
          for (int i = 0; i < d; ++i) attn[hh * d + i] += s[j] / z * v[j][g * d + i];
      }
      const Vec o = matvec(lw.o_proj, attn);
      for (int i = 0; i < H; ++i) x[t][i] += o[i];
      Vec h = x[t];
      rms_norm_ref(h.data(), H, lw.post_attention_norm.data, c.rms_norm_eps);
      const Vec gu = matvec(lw.gate_up, h);
      Vec act(static_cast<std::size_t>(I));
      for (int i = 0; i < I; ++i) act[i] = gu[i] / (1 + std::exp(-gu[i])) * gu[I + i];
      const Vec dn = matvec(lw.down_proj, act);
      for (int i = 0; i < H; ++i) x[t][i] += dn[i];
    }
  }
  std::vector<Vec> logits;
  for (int t = 0; t < T; ++t) {
    Vec h = x[t];
    rms_norm_ref(h.data(), H, w.final_norm.data, c.rms_norm_eps);
    logits.push_back(matvec(w.lm_head, h));
  }
  return logits;
}

/// Dummy weights have unit norms; randomise them so the norm weights matter.
void randomise_norms(ModelWeights& w, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  auto fill = [&](const Vector& v) {
    float* p = const_cast<float*>(v.data);  // the test owns these weights
    for (int i = 0; i < v.size; ++i) p[i] = u(rng);
  };
  for (LayerWeights& l : w.layers) {
    fill(l.input_norm);
    fill(l.post_attention_norm);
    if (!l.q_norm.empty()) fill(l.q_norm);
    if (!l.k_norm.empty()) fill(l.k_norm);
  }
  fill(w.final_norm);
}

void check_arch(const std::string& arch, bool tied, const std::string& rope_scaling) {
  auto cfg = parse_model_config(config_json(arch, tied, rope_scaling), "", "test/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  LoadOptions lo;
  lo.format = LoadFormat::dummy;
  lo.seed = 11;
  auto w = make_dummy_weights(*cfg, lo);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  randomise_norms(*w, 5);
  auto weights = std::make_shared<const ModelWeights>(std::move(w).value());
  EXPECT_EQ(weights->layers[0].qkv_bias.empty(), arch != "Qwen2ForCausalLM");
  EXPECT_EQ(weights->layers[0].q_norm.empty(), arch != "Qwen3ForCausalLM");

  std::vector<std::int32_t> tokens;
  for (int i = 0; i < 21; ++i) tokens.push_back((i * 29 + 7) % 64);
  const auto ref = reference_forward(*weights, tokens);

  auto runner = CpuModelRunner::create(weights, CpuRunnerOptions{8, 4, 0});
  ASSERT_TRUE(runner.ok()) << runner.error().to_string();
  model::StepInput in;
  in.block_size = 4;
  model::StepSeq s;
  s.num_new_tokens = static_cast<int>(tokens.size());
  s.needs_logits = true;
  s.block_table = {7, 2, 5, 0, 3, 1};  // scattered blocks
  for (int t = 0; t < static_cast<int>(tokens.size()); ++t) {
    in.token_ids.push_back(tokens[t]);
    in.positions.push_back(t);
    in.slot_mapping.push_back(s.block_table[t / 4] * 4 + t % 4);
    in.logits_rows.push_back(t);
  }
  in.seqs = {s};
  auto out = (*runner)->execute(in);
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  double max_err = 0, max_abs = 0;
  for (int t = 0; t < static_cast<int>(tokens.size()); ++t)
    for (int vv = 0; vv < 64; ++vv) {
      max_err = std::max(max_err, std::abs(out->logits[t * 64 + vv] - ref[t][vv]));
      max_abs = std::max(max_abs, std::abs(ref[t][vv]));
    }
  EXPECT_GT(max_abs, 0.05) << "logits too small to be a meaningful comparison";
  EXPECT_LT(max_err, 2e-5 * std::max(1.0, max_abs)) << arch << " max |logit error| " << max_err;
}

TEST(CpuRunnerReference, LlamaGqaTied) { check_arch("LlamaForCausalLM", true, "null"); }
TEST(CpuRunnerReference, Llama3RopeScaling) {
  check_arch("LlamaForCausalLM", false,
             R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16})");
}
TEST(CpuRunnerReference, Qwen2QkvBias) { check_arch("Qwen2ForCausalLM", false, "null"); }
TEST(CpuRunnerReference, Qwen3QkNorm) { check_arch("Qwen3ForCausalLM", true, "null"); }

// The rope scaling is really applied: without it the logits differ.
TEST(CpuRunnerReference, RopeScalingChangesLogits) {
  auto a = parse_model_config(config_json("LlamaForCausalLM", true, "null"), "", "a/config.json");
  auto b = parse_model_config(
      config_json("LlamaForCausalLM", true,
                  R"({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16})"),
      "", "b/config.json");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(inv_freq_ref(*a), inv_freq_ref(*b));
}

}  // namespace
}  // namespace shardline::model
