#pragma once
/// \file
/// A tokenizer for models without tokenizer files (dummy weights of a public
/// shape, e.g. `../shared/models/shapes/stories110m`): text is a list of
/// decimal token ids ("1 403 407"), and token `id` decodes to " id". It lets
/// the engine and benchmark run on shapes alone; its text is not language.

#include "text/tokenizer.hpp"

namespace shardline::text {

class IdTokenizer final : public Tokenizer {
 public:
  /// `vocab_size` > 0; bos / eos may be -1.
  IdTokenizer(int vocab_size, std::int32_t bos_token_id, std::int32_t eos_token_id)
      : vocab_size_(vocab_size), bos_(bos_token_id), eos_(eos_token_id) {}

  /// Parses whitespace-separated decimal ids; anything else (or an id outside
  /// the vocabulary) is skipped. BOS is prepended with add_special_tokens.
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text,
                                                 bool add_special_tokens) const override;
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids,
                                   bool skip_special_tokens) const override;
  [[nodiscard]] std::string token_bytes(std::int32_t id) const override;
  [[nodiscard]] bool is_special(std::int32_t id) const override { return id == bos_ || id == eos_; }
  [[nodiscard]] bool strips_leading_space() const override { return true; }
  [[nodiscard]] int vocab_size() const override { return vocab_size_; }
  [[nodiscard]] std::int32_t bos_token_id() const override { return bos_; }
  [[nodiscard]] std::int32_t eos_token_id() const override { return eos_; }
  [[nodiscard]] std::int32_t token_to_id(std::string_view token) const override;

 private:
  int vocab_size_;
  std::int32_t bos_;
  std::int32_t eos_;
};

}  // namespace shardline::text
