#pragma once
// A CPU executor that "samples on its device": it runs the wrapped executor,
// then samples every logits row the way a device sampler must, from its
// model::RowSampling only (the grammar's token bitmask first, then
// sampling::sample), and returns the ids. So an engine driving it must give
// the outputs it gives when it samples the same logits itself.
#include <gtest/gtest.h>

#include <vector>

#include "model/executor.hpp"
#include "sampling/sampler.hpp"
#include "sampling/structured_output/grammar.hpp"

namespace shardline::testing_support {

class SamplingExecutor final : public model::ModelExecutor {
 public:
  explicit SamplingExecutor(model::ModelExecutor& inner) : inner_(inner) {}
  Result<model::StepOutput> execute(const model::StepInput& in) override {
    Result<model::StepOutput> r = inner_.execute(in);
    if (!r.ok() || in.sampling.empty()) {
      ++logits_steps_;
      return r;
    }
    model::StepOutput out = std::move(r).value();
    EXPECT_EQ(in.sampling.size(), static_cast<std::size_t>(in.num_logits()));
    const auto vocab = static_cast<std::size_t>(out.vocab_size);
    for (std::size_t i = 0; i < in.sampling.size(); ++i) {
      std::vector<float> row(out.logits.begin() + static_cast<long>(i * vocab),
                             out.logits.begin() + static_cast<long>((i + 1) * vocab));
      const model::RowSampling& rs = in.sampling[i];
      if (!rs.token_bitmask.empty()) {
        EXPECT_EQ(rs.token_bitmask.size(), static_cast<std::size_t>(sampling::bitmask_words(out.vocab_size)));
        sampling::apply_token_bitmask(row, rs.token_bitmask);
        ++masked_rows_;
      }
      out.sampled_token_ids.push_back(sampling::sample(row, *rs.params, rs.ctx));
    }
    out.logits.clear();
    ++sampled_steps_;
    return out;
  }
  int vocab_size() const override { return inner_.vocab_size(); }
  int num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int block_size() const override { return inner_.block_size(); }
  bool samples_on_device() const override { return true; }
  int sampled_steps_ = 0;  ///< steps whose rows it sampled
  int logits_steps_ = 0;   ///< steps it returned logits for (host sampling)
  long masked_rows_ = 0;   ///< rows it sampled under a grammar's mask

 private:
  model::ModelExecutor& inner_;
};

}  // namespace shardline::testing_support
