#include "engine/structured_output/grammar_masks.hpp"

#include <utility>

namespace shardline::engine {

GrammarState::GrammarState(std::shared_ptr<const sampling::CompiledGrammar> grammar)
    : matcher(grammar), mask(static_cast<std::size_t>(sampling::bitmask_words(grammar->vocab_size()))) {}

Status GrammarState::fill_mask() {
  if (mask_ready) return {};
  if (Status s = matcher.fill_next_token_bitmask(mask); !s.ok()) return s;
  mask_ready = true;
  return {};
}

Status GrammarState::accept(std::int32_t token_id) {
  mask_ready = false;
  return matcher.accept_token(token_id);
}

GrammarMaskFiller::~GrammarMaskFiller() { (void)wait(); }

void GrammarMaskFiller::start(std::vector<std::shared_ptr<GrammarState>> states) {
  Status previous = wait();
  if (states.empty() && previous.ok()) return;
  pending_ = std::async(std::launch::async, [states = std::move(states), previous]() -> Filled {
    if (!previous.ok()) return {previous, 0};  // reported by the next wait()
    const auto t0 = std::chrono::steady_clock::now();
    Status status = Status::ok_status();
    for (const std::shared_ptr<GrammarState>& s : states) {
      if (s->matcher.is_terminated()) continue;
      if (status = s->fill_mask(); !status.ok()) break;
    }
    return {status, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()};
  });
}

Status GrammarMaskFiller::wait() {
  if (!pending_.valid()) {
    last_fill_ms_ = 0;
    return {};
  }
  Filled f = pending_.get();
  last_fill_ms_ = f.fill_ms;
  return f.status;
}

}  // namespace shardline::engine
