#pragma once
/// \file
/// Structured outputs (issue 43, step 1: the library): a line's output
/// constrained to a JSON schema, any JSON object, a regex, one of a list of
/// choices or an EBNF grammar, as OpenAI's `response_format` and vLLM's
/// `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` ask.
///
/// The grammar engine is xgrammar's C++ core (Apache-2.0, the engine of
/// vLLM, SGLang and TensorRT-LLM; built from its PyPI sdist, pinned:
/// cmake/xgrammar.cmake), used as vLLM uses it:
///   - the vocabulary comes from Shardline's own tokenizer: each token's
///     bytes as it adds them to text (text::Tokenizer::token_bytes), special
///     tokens empty (so never allowed), the stop tokens given;
///   - a compiled grammar is cached per compiler (one per job: lines that
///     share a schema compile it once);
///   - each constrained sequence carries a GrammarMatcher: before sampling,
///     fill_next_token_bitmask gives the allowed tokens of the next step and
///     apply_token_bitmask sets the others' logits to -inf; after sampling,
///     accept_token advances the matcher. A stop token is allowed exactly
///     when the grammar may end.
///
/// Token bitmask: [bitmask_words(vocab_size)] 32-bit words; token i is
/// allowed iff bit (i % 32) of word i / 32 is set (xgrammar's and vLLM's
/// layout). Not thread-safe per object: one matcher per sequence, one
/// thread at a time; a compiler may be shared.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.hpp"
#include "text/tokenizer.hpp"

namespace shardline::sampling {

/// What a line's output must match.
enum class GrammarKind {
  json_schema,  ///< `text` is a JSON schema (response_format json_schema, guided_json)
  json_object,  ///< any JSON object (response_format json_object), whitespace runs bounded as a schema's; `text` unused
  regex,        ///< `text` is a regular expression the whole output matches (guided_regex)
  choice,       ///< the output is exactly one of `choices` (guided_choice)
  ebnf,         ///< `text` is an EBNF grammar with a `root` rule, xgrammar's GBNF dialect (guided_grammar)
};

/// "json_schema", "json_object", "regex", "choice" or "ebnf".
[[nodiscard]] const char* grammar_kind_name(GrammarKind kind) noexcept;
/// The kind grammar_kind_name names; nullopt for any other text.
[[nodiscard]] std::optional<GrammarKind> parse_grammar_kind(std::string_view name) noexcept;

/// One constraint, as a request gives it.
struct GrammarSpec {
  GrammarKind kind = GrammarKind::json_object;
  std::string text;                  ///< schema / regex / grammar (json_schema, regex, ebnf)
  std::vector<std::string> choices;  ///< choice: the allowed outputs (at least one)
  /// JSON kinds: whitespace between tokens may be any amount (vLLM's
  /// default); false: the compact separators only.
  bool any_whitespace = true;
};

/// Words of a token bitmask over `vocab_size` tokens: ceil(vocab_size / 32).
[[nodiscard]] int bitmask_words(int vocab_size) noexcept;

/// Sets logits[i] to -inf for every token i < logits.size() whose bit in
/// `bitmask` is clear; the others are left as they are. Precondition:
/// bitmask.size() >= bitmask_words(logits.size()).
void apply_token_bitmask(std::span<float> logits, std::span<const std::uint32_t> bitmask) noexcept;

class CompiledGrammar;

/// Compiles GrammarSpecs against one vocabulary, caching each compiled
/// grammar by its spec. Thread-safe (compile may be called concurrently).
class GrammarCompiler {
 public:
  /// A compiler over `tokenizer`'s vocabulary padded to `vocab_size` ids
  /// (the logits' width; ids past the tokenizer's vocabulary are never
  /// allowed). `stop_token_ids`: the ids that end a constrained output
  /// (EOS, a chat template's end token); each must be < vocab_size.
  /// `max_threads`: xgrammar's compile threads. Errors: invalid_argument
  /// (vocab_size below the tokenizer's, no stop token, a stop id out of
  /// range, max_threads < 1).
  [[nodiscard]] static Result<std::shared_ptr<GrammarCompiler>> create(const text::Tokenizer& tokenizer,
                                                                       int vocab_size,
                                                                       std::vector<std::int32_t> stop_token_ids,
                                                                       int max_threads = 1);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  /// The compiled grammar of `spec`, from the cache when a spec with the
  /// same kind, text, choices and whitespace rule was compiled before.
  /// A JSON schema is checked and adjusted first, so that every output
  /// validates against it: the keywords xgrammar would silently ignore
  /// (not, if/then/else, dependentRequired, dependentSchemas, uniqueItems,
  /// contains, minContains, maxContains) are refused; the formats date,
  /// date-time and ipv4, whose xgrammar regexes are wider than the formats,
  /// become exact patterns; optional groups in patterns are rewritten
  /// around an xgrammar 0.2.9 bug (grammar.cpp). A compile during which
  /// xgrammar warns that it ignores part of the input (allOf of several
  /// schemas, multipleOf on a number, ...) is refused too.
  /// Errors: invalid_argument starting with the kind's name and saying what
  /// failed (a schema that is not JSON, a refused keyword, a format with a
  /// pattern, what xgrammar reported or warned; a regex or grammar that
  /// does not parse; an empty choice list).
  [[nodiscard]] Result<std::shared_ptr<const CompiledGrammar>> compile(const GrammarSpec& spec);

  [[nodiscard]] int vocab_size() const noexcept { return vocab_size_; }
  /// Grammars compiled so far (cache misses), for tests and the benchmark.
  [[nodiscard]] long long num_compiled() const noexcept;

 private:
  struct Impl;
  explicit GrammarCompiler(std::unique_ptr<Impl> impl, int vocab_size);
  std::unique_ptr<Impl> impl_;
  int vocab_size_ = 0;
};

/// A grammar compiled for one vocabulary (immutable, shared by matchers).
class CompiledGrammar {
 public:
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;
  [[nodiscard]] int vocab_size() const noexcept { return vocab_size_; }

 private:
  friend class GrammarCompiler;
  friend class GrammarMatcher;
  struct Impl;
  CompiledGrammar(std::unique_ptr<Impl> impl, int vocab_size);
  std::unique_ptr<Impl> impl_;
  int vocab_size_ = 0;
};

/// The state of one constrained sequence.
class GrammarMatcher {
 public:
  /// A matcher at the start of `grammar`.
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  /// Writes the allowed next tokens into `bitmask`
  /// ([bitmask_words(vocab_size)] words). Errors: invalid_argument (a
  /// bitmask of another size), internal (called after a stop token).
  [[nodiscard]] Status fill_next_token_bitmask(std::span<std::uint32_t> bitmask);
  /// Advances by `token_id`. Errors: invalid_argument when the grammar does
  /// not allow it here (the matcher is unchanged).
  [[nodiscard]] Status accept_token(std::int32_t token_id);
  /// Undoes the last `num_tokens` accepted tokens. Errors: invalid_argument
  /// (more than were accepted).
  [[nodiscard]] Status rollback(int num_tokens);
  /// A stop token was accepted: the output is complete.
  [[nodiscard]] bool is_terminated() const;
  /// Tokens accepted since the start (or the last reset).
  [[nodiscard]] int num_accepted() const noexcept { return num_accepted_; }
  [[nodiscard]] int vocab_size() const noexcept { return vocab_size_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int vocab_size_ = 0;
  int num_accepted_ = 0;
};

}  // namespace shardline::sampling
