#pragma once
/// \file
/// A model from one GGUF file (llama.cpp's format): hyper-parameters from the
/// `{arch}.*` keys, weights dequantized at load into the engine's storage
/// dtype, the tokenizer from the `tokenizer.ggml.*` keys and the chat
/// template from `tokenizer.chat_template`. Architectures `llama`, `qwen2`
/// and `qwen3` (GGUF names), the same three the safetensors loader takes.
///
/// Tensor names are llama.cpp's (`token_embd`, `blk.N.attn_q`, ...). For
/// `llama`, llama.cpp's converter permutes the rows of attn_q and attn_k
/// (convert_hf_to_gguf.py `LlamaModel.permute`, for GGML's interleaved RoPE);
/// the loader undoes it, so the weights are Hugging Face's again and the
/// engine's rotate-half RoPE applies. `qwen2` and `qwen3` are stored
/// unpermuted.
///
/// RoPE scaling as llama.cpp takes it: a `rope_freqs.weight` tensor
/// ([head_dim / 2] divisors of the frequencies, its converter's form of
/// llama3 scaling) or `{arch}.rope.scaling.type` linear with
/// `rope.scaling.factor`, both as ModelConfig::rope_freq_factors.
///
/// Not taken (refused with `unsupported` naming the key or tensor): other
/// `rope.scaling.type`s (yarn, ...), partial rotary dims, Q8_1 and the
/// IQ / ternary types, tokenizer models other than `gpt2` and `llama`,
/// pre-tokenizers without a mapping (see `pre_tokenizer_regexes`).

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.hpp"
#include "model/config.hpp"
#include "model/gguf/gguf_file.hpp"
#include "text/tokenizer.hpp"
#include "model/weights.hpp"

namespace shardline::model::gguf {

/// The model's hyper-parameters. Errors: unsupported (architecture, RoPE
/// scaling, partial rotary), not_found (a required key, named), mismatch (a
/// key of the wrong type), invalid_argument (values that disagree, e.g. heads
/// not divisible by KV heads; the message names the GGUF key).
[[nodiscard]] Result<ModelConfig> model_config(const GgufFile& file);

/// The weights, dequantized (kernels::dequantize_row) and converted to
/// `options.dtype` (F32 or BF16, round to nearest even), q/k/v and gate/up
/// fused as the safetensors loader fuses them. With
/// `options.keep_quantized`, a matrix whose tensors all have one type of
/// matrix_stays_quantized() is kept as the file's blocks instead
/// (Matrix::quant; llama's q/k rows un-permuted the same way). Errors: not_found (a tensor,
/// named), mismatch (a tensor's shape disagrees with the hyper-parameters:
/// both shapes, in [rows, cols] order), unsupported (a tensor type without a
/// dequantization), out_of_memory.
[[nodiscard]] Result<ModelWeights> load_weights(const GgufFile& file, const ModelConfig& config,
                                                const LoadOptions& options);

/// The Split regexes, applied in order, of llama.cpp's pre-tokenizer
/// `tokenizer.ggml.pre` = `name` (llama-vocab.cpp); nullopt for a name
/// without a mapping here.
[[nodiscard]] std::optional<std::vector<std::string>> pre_tokenizer_regexes(const std::string& name);

/// The tokenizer the file describes, as the text of an equivalent Hugging
/// Face tokenizer.json (what llama.cpp runs), by `tokenizer.ggml.model`:
///  - `gpt2`: the pre-tokenizer's regexes as isolated Splits, byte-level BPE
///    over the file's tokens and merges;
///  - `llama` (SentencePiece-style, llama.cpp's SPM): BPE over characters
///    with `<0xNN>` byte fallback, its merges from `tokenizer.ggml.merges`
///    or, as a llama vocabulary has none, from `tokenizer.ggml.scores`
///    (`merges_from_scores`); spaces as U+2581 and, when
///    `tokenizer.ggml.add_space_prefix` (default true), a U+2581 before each
///    run of text as llama.cpp and SentencePiece's add_dummy_prefix put it
///    (also before text that starts with a space: transformers' GGUF
///    converter uses a Metaspace that does not, a known difference,
///    docs/models.md);
/// control tokens (and `llama`'s UNKNOWN) special, user-defined tokens added.
/// Errors: unsupported (another `tokenizer.ggml.model`, an unknown
/// `tokenizer.ggml.pre`: both named), not_found / mismatch / corrupt (keys,
/// named).
[[nodiscard]] Result<std::string> tokenizer_json(const GgufFile& file);

/// The BPE merges a SentencePiece vocabulary implies, as transformers'
/// `generate_merges(vocab, scores)` builds them (tokenization_utils_base.py):
/// every split of a token (at code point boundaries) into two tokens of the
/// vocabulary, ranked by the token's score, then the left and right lengths
/// in code points, highest first (ties keep token order, then (left id,
/// right id)). `scores` has one entry per token.
[[nodiscard]] std::vector<std::pair<std::string, std::string>> merges_from_scores(
    const std::vector<std::string>& tokens, const std::vector<double>& scores);

/// The tokenizer (a BpeTokenizer over `tokenizer_json`), with BOS / EOS from
/// `tokenizer.ggml.bos_token_id` / `eos_token_id` and BOS prepended when
/// `tokenizer.ggml.add_bos_token` is true.
[[nodiscard]] Result<std::unique_ptr<text::Tokenizer>> load_tokenizer(const GgufFile& file);

/// `tokenizer.chat_template`, or nullopt when the file has none.
[[nodiscard]] Result<std::optional<std::string>> chat_template(const GgufFile& file);

/// The special tokens' texts a chat template sees (bos_token, eos_token,
/// unk_token, pad_token), from the tokenizer ids, as transformers sets them.
[[nodiscard]] Result<std::vector<std::pair<std::string, std::string>>> special_token_texts(const GgufFile& file);

}  // namespace shardline::model::gguf
