#pragma once
/// \file
/// A compact Jinja2 interpreter for the subset chat templates use (no C++
/// Jinja library is packaged in Debian). Rendering follows Jinja2 3.x with
/// transformers' settings for chat templates: `trim_blocks`,
/// `lstrip_blocks`, the loop-controls extension, Python's value semantics
/// (truthiness, comparison, `str()` of values), and default (lenient)
/// undefined values. Its differential test renders every shipped template
/// with Python's jinja2 as the oracle (tests/text/jinja_test.cpp).
///
/// The subset:
///  - statements: `if` / `elif` / `else`, `for` (one or two targets, an
///    `if` filter, `else`, `loop.index` / `index0` / `revindex` /
///    `revindex0` / `first` / `last` / `length` / `previtem` / `nextitem`),
///    `break` / `continue`, `set` (a name, `ns.attr`, or a block `set`),
///    `macro` (positional and default arguments), `generation` blocks
///    (transformers' marker, rendered as their body), comments, and the
///    `{%-` / `-%}` / `{{-` / `-}}` whitespace controls;
///  - expressions: literals (strings, integers, floats, true / false / none,
///    lists, dicts), names, attributes, subscripts and slices (`[::-1]`),
///    calls, filters, `is` / `is not` tests, `in` / `not in`, `not`, `and`,
///    `or`, `~`, `+ - * / // % **`, comparisons, the conditional expression;
///  - string methods: strip, lstrip, rstrip, startswith, endswith, split,
///    upper, lower, replace, title, capitalize, format is not supported;
///    dict methods: items, keys, values, get;
///  - filters: trim, length / count, tojson, lower, upper, default / d,
///    join, first, last, list, string, int, float, replace, selectattr,
///    rejectattr, map (attribute= or a filter name), items, safe,
///    capitalize, title, indent, reverse, abs, unique, sort;
///  - tests: defined, undefined, none, string, mapping, iterable, sequence,
///    number, integer, float, boolean, true, false, callable, odd, even,
///    eq / equalto / ==, ne / !=, in;
///  - globals: range, namespace, raise_exception (from the caller), and
///    any value the caller passes.
/// Anything else is an error naming the template line, never a wrong text.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.hpp"

namespace shardline::text::jinja {

struct Node;  // jinja.cpp

/// A template parsed once, rendered many times (thread-safe: render() is const).
class Template {
 public:
  /// Parses `source`. Errors: invalid_argument "template line N: ..." for a
  /// syntax error or a construct outside the subset.
  [[nodiscard]] static Result<Template> parse(std::string_view source);

  /// A function the template may call (e.g. raise_exception): positional
  /// arguments as JSON values; returns a JSON value, or an error to stop
  /// rendering with.
  using Function = std::function<Result<nlohmann::ordered_json>(const std::vector<nlohmann::ordered_json>& args)>;

  /// Renders with `context` (a JSON object: its keys are the template's
  /// globals) and `functions`. Errors: invalid_argument "template line N:
  /// ..." (a type error, an unsupported filter or method, an undefined
  /// value used where Jinja2 raises), or what a function returned.
  [[nodiscard]] Result<std::string> render(const nlohmann::ordered_json& context,
                                           const std::map<std::string, Function>& functions = {}) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace shardline::text::jinja
