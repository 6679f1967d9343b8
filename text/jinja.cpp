#include "text/jinja.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace shardline::text::jinja {

using ojson = nlohmann::ordered_json;

// ============================================================================
// Values (Python semantics)
// ============================================================================

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python dicts

struct MacroDef;

struct Value {
  enum class K { undefined, none, boolean, integer, floating, string, array, object, ns, function, macro };
  K k = K::undefined;
  bool b = false;
  std::int64_t i = 0;
  double d = 0;
  std::string s;                  // string; function: its name
  std::shared_ptr<Array> a;       // array
  std::shared_ptr<Object> o;      // object, ns (namespace: mutable, shared)
  std::shared_ptr<const MacroDef> macro;

  static Value none() { return Value{K::none}; }
  static Value boolean(bool v) {
    Value x{K::boolean};
    x.b = v;
    return x;
  }
  static Value integer(std::int64_t v) {
    Value x{K::integer};
    x.i = v;
    return x;
  }
  static Value floating(double v) {
    Value x{K::floating};
    x.d = v;
    return x;
  }
  static Value string(std::string v) {
    Value x{K::string};
    x.s = std::move(v);
    return x;
  }
  static Value array(Array v = {}) {
    Value x{K::array};
    x.a = std::make_shared<Array>(std::move(v));
    return x;
  }
  static Value object(Object v = {}) {
    Value x{K::object};
    x.o = std::make_shared<Object>(std::move(v));
    return x;
  }
  [[nodiscard]] bool is_number() const { return k == K::integer || k == K::floating || k == K::boolean; }
  [[nodiscard]] double num() const { return k == K::floating ? d : k == K::boolean ? (b ? 1 : 0) : static_cast<double>(i); }
  [[nodiscard]] bool is_mapping() const { return k == K::object || k == K::ns; }
};

const Value* find_key(const Object& o, std::string_view key) {
  for (const auto& [k, v] : o)
    if (k == key) return &v;
  return nullptr;
}

void set_key(Object& o, const std::string& key, Value v) {
  for (auto& [k, x] : o)
    if (k == key) {
      x = std::move(v);
      return;
    }
  o.emplace_back(key, std::move(v));
}

Value from_json(const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null:
      return Value::none();
    case ojson::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned:
      return Value::integer(j.get<std::int64_t>());
    case ojson::value_t::number_float:
      return Value::floating(j.get<double>());
    case ojson::value_t::string:
      return Value::string(j.get<std::string>());
    case ojson::value_t::array: {
      Array a;
      for (const auto& x : j) a.push_back(from_json(x));
      return Value::array(std::move(a));
    }
    case ojson::value_t::object: {
      Object o;
      for (const auto& [k, v] : j.items()) o.emplace_back(k, from_json(v));
      return Value::object(std::move(o));
    }
    default:
      return Value{};
  }
}

ojson to_json(const Value& v) {
  switch (v.k) {
    case Value::K::none:
    case Value::K::undefined:
      return nullptr;
    case Value::K::boolean:
      return v.b;
    case Value::K::integer:
      return v.i;
    case Value::K::floating:
      return v.d;
    case Value::K::string:
      return v.s;
    case Value::K::array: {
      ojson a = ojson::array();
      for (const Value& x : *v.a) a.push_back(to_json(x));
      return a;
    }
    case Value::K::object:
    case Value::K::ns: {
      ojson o = ojson::object();
      for (const auto& [k, x] : *v.o) o[k] = to_json(x);
      return o;
    }
    default:
      return nullptr;
  }
}

bool truthy(const Value& v) {
  switch (v.k) {
    case Value::K::undefined:
    case Value::K::none:
      return false;
    case Value::K::boolean:
      return v.b;
    case Value::K::integer:
      return v.i != 0;
    case Value::K::floating:
      return v.d != 0;
    case Value::K::string:
      return !v.s.empty();
    case Value::K::array:
      return !v.a->empty();
    case Value::K::object:
      return !v.o->empty();
    default:
      return true;
  }
}

/// Python's repr() of a float (shortest round trip, at least one decimal).
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eninf") == std::string::npos) s += ".0";
  // Python writes 1e+20 as 1e+20 and 1e16 as 1e+16: %g agrees for these.
  return s;
}

std::string py_repr(const Value& v);

/// Python's str() of a value, as `{{ x }}` prints it.
std::string py_str(const Value& v) {
  switch (v.k) {
    case Value::K::undefined:
      return "";
    case Value::K::none:
      return "None";
    case Value::K::boolean:
      return v.b ? "True" : "False";
    case Value::K::integer:
      return std::to_string(v.i);
    case Value::K::floating:
      return float_repr(v.d);
    case Value::K::string:
      return v.s;
    default:
      return py_repr(v);
  }
}

std::string py_string_repr(const std::string& s) {
  // Python picks single quotes unless the string has ' and no ".
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  out += q;
  return out;
}

std::string py_repr(const Value& v) {
  switch (v.k) {
    case Value::K::string:
      return py_string_repr(v.s);
    case Value::K::array: {
      std::string out = "[";
      for (std::size_t n = 0; n < v.a->size(); ++n) out += (n ? ", " : "") + py_repr((*v.a)[n]);
      return out + "]";
    }
    case Value::K::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : *v.o) {
        out += (first ? "" : ", ") + py_string_repr(k) + ": " + py_repr(x);
        first = false;
      }
      return out + "}";
    }
    case Value::K::ns:
      return "<Namespace>";
    case Value::K::function:
    case Value::K::macro:
      return "<function>";
    default:
      return py_str(v);
  }
}

/// Python's json.dumps(x, ensure_ascii=False, indent=indent) as transformers' tojson.
std::string dumps(const Value& v, int indent, int depth = 0) {
  const auto nl = [&](int d) { return indent < 0 ? std::string() : "\n" + std::string(static_cast<std::size_t>(indent * d), ' '); };
  const std::string item_sep = indent < 0 ? ", " : ",";
  switch (v.k) {
    case Value::K::undefined:
    case Value::K::none:
      return "null";
    case Value::K::boolean:
      return v.b ? "true" : "false";
    case Value::K::integer:
      return std::to_string(v.i);
    case Value::K::floating:
      if (std::isnan(v.d)) return "NaN";
      if (std::isinf(v.d)) return v.d > 0 ? "Infinity" : "-Infinity";
      return float_repr(v.d);
    case Value::K::string: {
      std::string out = "\"";
      for (const char ch : v.s) {
        const auto c = static_cast<unsigned char>(ch);
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          default:
            if (c < 0x20) {
              char buf[8];
              std::snprintf(buf, sizeof buf, "\\u%04x", c);
              out += buf;
            } else {
              out += ch;
            }
        }
      }
      return out + "\"";
    }
    case Value::K::array: {
      if (v.a->empty()) return "[]";
      std::string out = "[";
      for (std::size_t n = 0; n < v.a->size(); ++n)
        out += (n ? item_sep : "") + nl(depth + 1) + dumps((*v.a)[n], indent, depth + 1);
      return out + nl(depth) + "]";
    }
    case Value::K::object:
    case Value::K::ns: {
      if (v.o->empty()) return "{}";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : *v.o) {
        out += (first ? "" : item_sep) + nl(depth + 1) + dumps(Value::string(k), indent) + ": " +
               dumps(x, indent, depth + 1);
        first = false;
      }
      return out + nl(depth) + "}";
    }
    default:
      return "null";
  }
}

int compare_values(const Value& a, const Value& b, bool& ok) {
  ok = true;
  if (a.is_number() && b.is_number()) {
    if (a.k != Value::K::floating && b.k != Value::K::floating) {
      const std::int64_t x = a.k == Value::K::boolean ? a.b : a.i, y = b.k == Value::K::boolean ? b.b : b.i;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
  }
  if (a.k == Value::K::string && b.k == Value::K::string) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  ok = false;
  return 0;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    bool ok = false;
    return compare_values(a, b, ok) == 0;
  }
  if (a.k != b.k) {
    // none == undefined is False in Jinja2 (Undefined equals only Undefined).
    return false;
  }
  switch (a.k) {
    case Value::K::undefined:
    case Value::K::none:
      return true;
    case Value::K::string:
      return a.s == b.s;
    case Value::K::array:
      if (a.a->size() != b.a->size()) return false;
      for (std::size_t n = 0; n < a.a->size(); ++n)
        if (!equal((*a.a)[n], (*b.a)[n])) return false;
      return true;
    case Value::K::object:
      if (a.o->size() != b.o->size()) return false;
      for (const auto& [k, x] : *a.o) {
        const Value* y = find_key(*b.o, k);
        if (y == nullptr || !equal(x, *y)) return false;
      }
      return true;
    default:
      return a.o == b.o && a.macro == b.macro && a.s == b.s;
  }
}

// ============================================================================
// Syntax tree
// ============================================================================

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class T { literal, name, list, dict, attr, item, slice, call, filter, test, unary, binary, cond };
  T t = T::literal;
  int line = 0;
  Value value;                 // literal
  std::string name;            // name, attr, filter / test name, operator
  ExprPtr a, b, c;             // operands (slice: start, stop, step in args)
  std::vector<ExprPtr> args;   // list items, call / filter / test args, dict values
  std::vector<std::string> keys;              // dict keys (as expressions in args, keys literal)
  std::vector<ExprPtr> key_exprs;             // dict keys
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negate = false;         // test: "is not"
};

struct Node {
  enum class T { text, output, if_, for_, set, set_block, macro, block, break_, continue_ };
  T t = T::text;
  int line = 0;
  std::string text;
  ExprPtr expr;                              // output, set value, for iterable
  std::vector<std::pair<ExprPtr, std::vector<std::shared_ptr<Node>>>> branches;  // if / elif; else: null cond
  std::vector<std::string> targets;          // for / set names ("ns.attr" as {ns, attr} in target_attr)
  std::string target_attr;                   // set ns.attr
  ExprPtr filter;                            // for ... if cond
  std::vector<std::shared_ptr<Node>> body, else_body;
  std::vector<std::string> params;           // macro
  std::vector<ExprPtr> defaults;             // macro defaults (null: none)
};
using NodePtr = std::shared_ptr<Node>;

struct MacroDef {
  const Node* node = nullptr;
};

// ============================================================================
// Lexer: text and tags, with trim_blocks / lstrip_blocks / '-' controls
// ============================================================================

struct Piece {
  enum class T { text, var, block, comment } t = T::text;
  std::string body;  // inside the delimiters, or the text
  int line = 1;
};

Error syntax(int line, const std::string& what) {
  return make_error(ErrorCode::invalid_argument, "template line " + std::to_string(line) + ": " + what);
}

Result<std::vector<Piece>> lex(std::string_view src) {
  std::vector<Piece> out;
  std::size_t pos = 0;
  int line = 1;
  bool strip_next_ws = false;  // a "-%}" / "-}}" before: the next text loses its leading whitespace
  bool trim_newline = false;   // trim_blocks: one newline after a block tag or comment goes
  const auto count_lines = [](std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); };
  for (;;) {
    // The next tag opening: "{{", "{%" or "{#".
    std::size_t open = pos;
    for (;;) {
      open = src.find('{', open);
      if (open == std::string_view::npos || open + 1 >= src.size()) {
        open = std::string_view::npos;
        break;
      }
      const char k = src[open + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++open;
    }
    const std::string_view raw = src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos);
    std::string text(raw);
    const int text_line = line;
    line += count_lines(raw);
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (strip_next_ws) {
      const std::size_t k = text.find_first_not_of(" \t\r\n");
      text.erase(0, k == std::string::npos ? text.size() : k);
    }
    trim_newline = strip_next_ws = false;
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Piece::T::text, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    const bool minus_left = open + 2 < src.size() && src[open + 2] == '-';
    const bool plus_left = open + 2 < src.size() && src[open + 2] == '+';
    if (minus_left) {
      const std::size_t k = text.find_last_not_of(" \t\r\n");
      text.erase(k == std::string::npos ? 0 : k + 1);
    } else if ((kind == '%' || kind == '#') && !plus_left) {
      // lstrip_blocks: a block tag or comment that only spaces and tabs
      // precede on its line (in the source) takes them away.
      const std::size_t nl = raw.find_last_of('\n');
      const bool line_start = nl != std::string_view::npos || pos == 0 || src[pos - 1] == '\n';
      const std::size_t from = nl == std::string_view::npos ? 0 : nl + 1;
      if (line_start && raw.find_first_not_of(" \t", from) == std::string_view::npos) {
        const std::size_t blank = raw.size() - from;
        text.erase(text.size() - std::min(blank, text.size()));
      }
    }
    if (!text.empty()) out.push_back({Piece::T::text, text, text_line});
    const char close[3] = {kind == '{' ? '}' : kind == '%' ? '%' : '#', '}', 0};
    const std::size_t body_start = open + 2 + (minus_left || plus_left ? 1 : 0);
    std::size_t end = std::string_view::npos;
    if (kind == '#') {
      end = src.find(close, body_start);
    } else {
      // A closing delimiter inside a string literal does not close the tag.
      char quote = 0;
      for (std::size_t k = body_start; k + 1 < src.size(); ++k) {
        const char c = src[k];
        if (quote) {
          if (c == '\\') ++k;
          else if (c == quote) quote = 0;
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (c == close[0] && src[k + 1] == '}') {
          end = k;
          break;
        }
      }
    }
    if (end == std::string_view::npos) return syntax(line, std::string("unclosed '{") + kind + "'");
    const bool minus_right = end > body_start && src[end - 1] == '-';
    std::string body(src.substr(body_start, end - body_start - (minus_right ? 1 : 0)));
    if (kind != '#') out.push_back({kind == '{' ? Piece::T::var : Piece::T::block, body, line});
    line += count_lines(src.substr(open, end + 2 - open));
    strip_next_ws = minus_right;
    trim_newline = kind != '{';
    pos = end + 2;
  }
  return out;
}

// ============================================================================
// Expression parser
// ============================================================================

struct Token {
  enum class T { name, string, integer, floating, op, end } t = T::end;
  std::string s;
  std::int64_t i = 0;
  double d = 0;
};

Result<std::vector<Token>> tokenize_expr(const std::string& src, int line) {
  std::vector<Token> out;
  std::size_t p = 0;
  while (p < src.size()) {
    const char c = src[p];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++p;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t q = p;
      while (q < src.size() && (std::isalnum(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
      out.push_back({Token::T::name, src.substr(p, q - p)});
      p = q;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t q = p;
      bool is_float = false;
      while (q < src.size() && (std::isdigit(static_cast<unsigned char>(src[q])) || src[q] == '_')) ++q;
      if (q + 1 < src.size() && src[q] == '.' && std::isdigit(static_cast<unsigned char>(src[q + 1]))) {
        is_float = true;
        ++q;
        while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) ++q;
      }
      std::string digits = src.substr(p, q - p);
      std::erase(digits, '_');
      Token t;
      t.t = is_float ? Token::T::floating : Token::T::integer;
      if (is_float) t.d = std::strtod(digits.c_str(), nullptr);
      else t.i = std::strtoll(digits.c_str(), nullptr, 10);
      out.push_back(t);
      p = q;
    } else if (c == '\'' || c == '"') {
      std::string s;
      std::size_t q = p + 1;
      for (; q < src.size() && src[q] != c; ++q) {
        if (src[q] == '\\' && q + 1 < src.size()) {
          const char e = src[++q];
          switch (e) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case '\\': s += '\\'; break;
            case '\'': s += '\''; break;
            case '"': s += '"'; break;
            default:
              s += '\\';
              s += e;
          }
        } else {
          s += src[q];
        }
      }
      if (q >= src.size()) return syntax(line, "unterminated string");
      out.push_back({Token::T::string, s});
      p = q + 1;
    } else {
      static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                         "(", ")", "[", "]", "{", "}", ",", ":", ".", "|", "="};
      bool found = false;
      for (const char* op : kOps) {
        const std::size_t n = std::char_traits<char>::length(op);
        if (src.compare(p, n, op) == 0) {
          out.push_back({Token::T::op, op});
          p += n;
          found = true;
          break;
        }
      }
      if (!found) return syntax(line, std::string("unexpected character '") + c + "'");
    }
  }
  out.push_back({Token::T::end, ""});
  return out;
}

class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

  Result<ExprPtr> parse_expression() { return parse_cond(); }
  [[nodiscard]] bool at_end() const { return t_[p_].t == Token::T::end; }
  [[nodiscard]] const Token& peek(int ahead = 0) const {
    return t_[std::min(p_ + static_cast<std::size_t>(ahead), t_.size() - 1)];
  }
  bool accept_op(const char* op) {
    if (t_[p_].t == Token::T::op && t_[p_].s == op) {
      ++p_;
      return true;
    }
    return false;
  }
  bool accept_name(const char* name) {
    if (t_[p_].t == Token::T::name && t_[p_].s == name) {
      ++p_;
      return true;
    }
    return false;
  }
  Result<std::string> expect_name() {
    if (t_[p_].t != Token::T::name) return syntax(line_, "expected a name, got '" + t_[p_].s + "'");
    return t_[p_++].s;
  }
  Status expect_op(const char* op) {
    if (!accept_op(op)) return syntax(line_, std::string("expected '") + op + "', got '" + t_[p_].s + "'");
    return Status::ok_status();
  }
  Status expect_end() {
    if (!at_end()) return syntax(line_, "unexpected '" + t_[p_].s + "'");
    return Status::ok_status();
  }
  /// Without the conditional expression (for `for x in y if cond`).
  Result<ExprPtr> parse_or_expr() { return parse_or(); }

 private:
  std::shared_ptr<Expr> make(Expr::T t) {
    auto e = std::make_shared<Expr>();
    e->t = t;
    e->line = line_;
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r) {
    auto e = std::make_shared<Expr>();
    e->t = Expr::T::binary;
    e->line = line_;
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  Result<ExprPtr> parse_cond() {
    auto x = parse_or();
    if (!x.ok()) return x;
    while (accept_name("if")) {
      auto cond = parse_or();
      if (!cond.ok()) return cond;
      ExprPtr other;
      if (accept_name("else")) {
        auto o = parse_cond();
        if (!o.ok()) return o;
        other = *o;
      }
      auto e = std::make_shared<Expr>();
      e->t = Expr::T::cond;
      e->line = line_;
      e->a = *x;
      e->b = *cond;
      e->c = other;
      x = ExprPtr(e);
    }
    return x;
  }
  Result<ExprPtr> parse_or() {
    auto x = parse_and();
    if (!x.ok()) return x;
    while (accept_name("or")) {
      auto y = parse_and();
      if (!y.ok()) return y;
      x = binary("or", *x, *y);
    }
    return x;
  }
  Result<ExprPtr> parse_and() {
    auto x = parse_not();
    if (!x.ok()) return x;
    while (accept_name("and")) {
      auto y = parse_not();
      if (!y.ok()) return y;
      x = binary("and", *x, *y);
    }
    return x;
  }
  Result<ExprPtr> parse_not() {
    if (peek().t == Token::T::name && peek().s == "not") {
      ++p_;
      auto x = parse_not();
      if (!x.ok()) return x;
      auto e = std::make_shared<Expr>();
      e->t = Expr::T::unary;
      e->line = line_;
      e->name = "not";
      e->a = *x;
      return ExprPtr(e);
    }
    return parse_compare();
  }
  Result<ExprPtr> parse_compare() {
    auto x = parse_concat();
    if (!x.ok()) return x;
    for (;;) {
      std::string op;
      if (peek().t == Token::T::op &&
          (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == "<=" || peek().s == ">" ||
           peek().s == ">=")) {
        op = peek().s;
        ++p_;
      } else if (accept_name("in")) {
        op = "in";
      } else if (peek().t == Token::T::name && peek().s == "not" && peek(1).t == Token::T::name && peek(1).s == "in") {
        p_ += 2;
        op = "not in";
      } else {
        return x;
      }
      auto y = parse_concat();
      if (!y.ok()) return y;
      x = binary(op, *x, *y);
    }
  }
  Result<ExprPtr> parse_concat() {
    auto x = parse_add();
    if (!x.ok()) return x;
    while (accept_op("~")) {
      auto y = parse_add();
      if (!y.ok()) return y;
      x = binary("~", *x, *y);
    }
    return x;
  }
  Result<ExprPtr> parse_add() {
    auto x = parse_mul();
    if (!x.ok()) return x;
    for (;;) {
      if (peek().t == Token::T::op && (peek().s == "+" || peek().s == "-")) {
        const std::string op = peek().s;
        ++p_;
        auto y = parse_mul();
        if (!y.ok()) return y;
        x = binary(op, *x, *y);
      } else {
        return x;
      }
    }
  }
  Result<ExprPtr> parse_mul() {
    auto x = parse_pow();
    if (!x.ok()) return x;
    for (;;) {
      if (peek().t == Token::T::op && (peek().s == "*" || peek().s == "/" || peek().s == "//" || peek().s == "%")) {
        const std::string op = peek().s;
        ++p_;
        auto y = parse_pow();
        if (!y.ok()) return y;
        x = binary(op, *x, *y);
      } else {
        return x;
      }
    }
  }
  Result<ExprPtr> parse_pow() {
    auto x = parse_unary();
    if (!x.ok()) return x;
    while (accept_op("**")) {
      auto y = parse_unary();
      if (!y.ok()) return y;
      x = binary("**", *x, *y);
    }
    return x;
  }
  Result<ExprPtr> parse_unary() {
    if (peek().t == Token::T::op && (peek().s == "-" || peek().s == "+")) {
      const std::string op = peek().s;
      ++p_;
      auto x = parse_unary();
      if (!x.ok()) return x;
      auto e = std::make_shared<Expr>();
      e->t = Expr::T::unary;
      e->line = line_;
      e->name = op;
      e->a = *x;
      return ExprPtr(e);
    }
    return parse_postfix();
  }
  Status parse_args(std::vector<ExprPtr>& args, std::vector<std::pair<std::string, ExprPtr>>& kwargs) {
    // after '('
    if (accept_op(")")) return Status::ok_status();
    for (;;) {
      if (peek().t == Token::T::name && peek(1).t == Token::T::op && peek(1).s == "=") {
        const std::string key = peek().s;
        p_ += 2;
        auto v = parse_cond();
        if (!v.ok()) return v.error();
        kwargs.emplace_back(key, *v);
      } else {
        auto v = parse_cond();
        if (!v.ok()) return v.error();
        args.push_back(*v);
      }
      if (accept_op(")")) return Status::ok_status();
      if (Status s = expect_op(","); !s) return s;
    }
  }
  Result<ExprPtr> parse_postfix() {
    auto x = parse_primary();
    if (!x.ok()) return x;
    for (;;) {
      if (accept_op(".")) {
        auto n = expect_name();
        if (!n.ok()) return n.error();
        auto e = make(Expr::T::attr);
        e->a = *x;
        e->name = *n;
        x = ExprPtr(e);
      } else if (accept_op("[")) {
        // subscript or slice
        ExprPtr start, stop, step;
        bool is_slice = false;
        if (!(peek().t == Token::T::op && peek().s == ":")) {
          auto s = parse_cond();
          if (!s.ok()) return s;
          start = *s;
        }
        if (accept_op(":")) {
          is_slice = true;
          if (!(peek().t == Token::T::op && (peek().s == ":" || peek().s == "]"))) {
            auto s = parse_cond();
            if (!s.ok()) return s;
            stop = *s;
          }
          if (accept_op(":")) {
            if (!(peek().t == Token::T::op && peek().s == "]")) {
              auto s = parse_cond();
              if (!s.ok()) return s;
              step = *s;
            }
          }
        }
        if (Status s = expect_op("]"); !s) return s.error();
        auto e = make(is_slice ? Expr::T::slice : Expr::T::item);
        e->a = *x;
        e->b = start;
        if (is_slice) e->args = {start, stop, step};
        x = ExprPtr(e);
      } else if (accept_op("(")) {
        auto e = make(Expr::T::call);
        e->a = *x;
        if (Status s = parse_args(e->args, e->kwargs); !s) return s.error();
        x = ExprPtr(e);
      } else if (accept_op("|")) {
        auto n = expect_name();
        if (!n.ok()) return n.error();
        auto e = make(Expr::T::filter);
        e->a = *x;
        e->name = *n;
        if (accept_op("("))
          if (Status s = parse_args(e->args, e->kwargs); !s) return s.error();
        x = ExprPtr(e);
      } else if (peek().t == Token::T::name && peek().s == "is") {
        ++p_;
        auto e = make(Expr::T::test);
        e->a = *x;
        e->negate = accept_name("not");
        if (peek().t == Token::T::name) {
          e->name = peek().s;
          ++p_;
        } else if (peek().t == Token::T::op && (peek().s == "==" || peek().s == "!=")) {
          e->name = peek().s == "==" ? "eq" : "ne";
          ++p_;
        } else {
          return syntax(line_, "expected a test name after 'is'");
        }
        if (accept_op("(")) {
          if (Status s = parse_args(e->args, e->kwargs); !s) return s.error();
        } else if (peek().t == Token::T::string || peek().t == Token::T::integer || peek().t == Token::T::floating ||
                   (peek().t == Token::T::name && peek().s != "and" && peek().s != "or" && peek().s != "else" &&
                    peek().s != "if" && peek().s != "in" && peek().s != "not" && peek().s != "is")) {
          auto arg = parse_primary();  // `is divisibleby 3`, `is sameas x`
          if (!arg.ok()) return arg;
          e->args.push_back(*arg);
        }
        x = ExprPtr(e);
      } else {
        return x;
      }
    }
  }
  Result<ExprPtr> parse_primary() {
    const Token tok = peek();
    ++p_;
    switch (tok.t) {
      case Token::T::string: {
        auto e = make(Expr::T::literal);
        std::string s = tok.s;
        while (peek().t == Token::T::string) s += t_[p_++].s;  // adjacent literals concatenate
        e->value = Value::string(s);
        return ExprPtr(e);
      }
      case Token::T::integer: {
        auto e = make(Expr::T::literal);
        e->value = Value::integer(tok.i);
        return ExprPtr(e);
      }
      case Token::T::floating: {
        auto e = make(Expr::T::literal);
        e->value = Value::floating(tok.d);
        return ExprPtr(e);
      }
      case Token::T::name: {
        auto e = make(Expr::T::literal);
        if (tok.s == "true" || tok.s == "True") e->value = Value::boolean(true);
        else if (tok.s == "false" || tok.s == "False") e->value = Value::boolean(false);
        else if (tok.s == "none" || tok.s == "None") e->value = Value::none();
        else {
          e->t = Expr::T::name;
          e->name = tok.s;
        }
        return ExprPtr(e);
      }
      case Token::T::op:
        if (tok.s == "(") {
          auto x = parse_cond();
          if (!x.ok()) return x;
          if (accept_op(",")) {  // a tuple: a list here
            auto e = make(Expr::T::list);
            e->args.push_back(*x);
            while (!accept_op(")")) {
              auto y = parse_cond();
              if (!y.ok()) return y;
              e->args.push_back(*y);
              if (!accept_op(",") && !(peek().t == Token::T::op && peek().s == ")"))
                return syntax(line_, "expected ',' or ')'");
            }
            return ExprPtr(e);
          }
          if (Status s = expect_op(")"); !s) return s.error();
          return x;
        }
        if (tok.s == "[") {
          auto e = make(Expr::T::list);
          while (!accept_op("]")) {
            auto y = parse_cond();
            if (!y.ok()) return y;
            e->args.push_back(*y);
            if (!accept_op(",") && !(peek().t == Token::T::op && peek().s == "]"))
              return syntax(line_, "expected ',' or ']'");
          }
          return ExprPtr(e);
        }
        if (tok.s == "{") {
          auto e = make(Expr::T::dict);
          while (!accept_op("}")) {
            auto k = parse_cond();
            if (!k.ok()) return k;
            if (Status s = expect_op(":"); !s) return s.error();
            auto v = parse_cond();
            if (!v.ok()) return v;
            e->key_exprs.push_back(*k);
            e->args.push_back(*v);
            if (!accept_op(",") && !(peek().t == Token::T::op && peek().s == "}"))
              return syntax(line_, "expected ',' or '}'");
          }
          return ExprPtr(e);
        }
        return syntax(line_, "unexpected '" + tok.s + "'");
      default:
        return syntax(line_, "unexpected end of expression");
    }
  }

  std::vector<Token> t_;
  std::size_t p_ = 0;
  int line_;
};

Result<ExprPtr> parse_expr_text(const std::string& text, int line) {
  auto toks = tokenize_expr(text, line);
  if (!toks.ok()) return toks.error();
  ExprParser p(std::move(toks).value(), line);
  auto e = p.parse_expression();
  if (!e.ok()) return e;
  if (Status s = p.expect_end(); !s) return s.error();
  return e;
}

// ============================================================================
// Statement parser
// ============================================================================

class NodeParser {
 public:
  explicit NodeParser(std::vector<Piece> pieces) : ps_(std::move(pieces)) {}

  /// Parses nodes until a block tag whose first word is in `ends` (returned in `*end_tag`).
  Status parse_body(std::vector<NodePtr>& out, const std::vector<std::string>& ends, std::string* end_tag,
                    Piece* end_piece) {
    while (i_ < ps_.size()) {
      const Piece& p = ps_[i_++];
      if (p.t == Piece::T::text) {
        auto n = std::make_shared<Node>();
        n->t = Node::T::text;
        n->text = p.body;
        out.push_back(n);
        continue;
      }
      if (p.t == Piece::T::var) {
        auto e = parse_expr_text(p.body, p.line);
        if (!e.ok()) return e.error();
        auto n = std::make_shared<Node>();
        n->t = Node::T::output;
        n->line = p.line;
        n->expr = *e;
        out.push_back(n);
        continue;
      }
      // block tag
      auto toks = tokenize_expr(p.body, p.line);
      if (!toks.ok()) return toks.error();
      const std::string word = toks->empty() || toks->front().t != Token::T::name ? "" : toks->front().s;
      if (std::find(ends.begin(), ends.end(), word) != ends.end()) {
        if (end_tag) *end_tag = word;
        if (end_piece) *end_piece = p;
        return Status::ok_status();
      }
      ExprParser ep(std::move(toks).value(), p.line);
      ep.accept_name(word.c_str());
      auto n = std::make_shared<Node>();
      n->line = p.line;
      if (word == "if") {
        n->t = Node::T::if_;
        auto cond = ep.parse_expression();
        if (!cond.ok()) return cond.error();
        if (Status s = ep.expect_end(); !s) return s;
        ExprPtr c = *cond;
        for (;;) {
          std::vector<NodePtr> body;
          std::string end;
          Piece endp;
          if (Status s = parse_body(body, {"elif", "else", "endif"}, &end, &endp); !s) return s;
          if (end.empty()) return syntax(p.line, "'if' without 'endif'");
          n->branches.emplace_back(c, std::move(body));
          if (end == "endif") break;
          auto et = tokenize_expr(endp.body, endp.line);
          if (!et.ok()) return et.error();
          ExprParser eep(std::move(et).value(), endp.line);
          eep.accept_name(end.c_str());
          if (end == "elif") {
            auto c2 = eep.parse_expression();
            if (!c2.ok()) return c2.error();
            if (Status s = eep.expect_end(); !s) return s;
            c = *c2;
          } else {
            c = nullptr;  // else
          }
        }
      } else if (word == "for") {
        n->t = Node::T::for_;
        for (;;) {
          auto name = ep.expect_name();
          if (!name.ok()) return name.error();
          n->targets.push_back(*name);
          if (!ep.accept_op(",")) break;
        }
        if (!ep.accept_name("in")) return syntax(p.line, "expected 'in' in 'for'");
        auto it = ep.parse_or_expr();
        if (!it.ok()) return it.error();
        n->expr = *it;
        if (ep.accept_name("if")) {
          auto f = ep.parse_or_expr();
          if (!f.ok()) return f.error();
          n->filter = *f;
        }
        if (ep.accept_name("recursive")) return syntax(p.line, "recursive loops are not supported");
        if (Status s = ep.expect_end(); !s) return s;
        std::string end;
        if (Status s = parse_body(n->body, {"else", "endfor"}, &end, nullptr); !s) return s;
        if (end.empty()) return syntax(p.line, "'for' without 'endfor'");
        if (end == "else") {
          if (Status s = parse_body(n->else_body, {"endfor"}, &end, nullptr); !s) return s;
          if (end.empty()) return syntax(p.line, "'for' without 'endfor'");
        }
      } else if (word == "set") {
        auto name = ep.expect_name();
        if (!name.ok()) return name.error();
        n->targets.push_back(*name);
        if (ep.accept_op(".")) {
          auto attr = ep.expect_name();
          if (!attr.ok()) return attr.error();
          n->target_attr = *attr;
        }
        while (ep.accept_op(",")) {
          auto more = ep.expect_name();
          if (!more.ok()) return more.error();
          n->targets.push_back(*more);
        }
        if (ep.accept_op("=")) {
          n->t = Node::T::set;
          auto v = ep.parse_expression();
          if (!v.ok()) return v.error();
          n->expr = *v;
          if (Status s = ep.expect_end(); !s) return s;
        } else {
          n->t = Node::T::set_block;
          if (!ep.at_end()) return syntax(p.line, "block 'set' with a filter is not supported");
          std::string end;
          if (Status s = parse_body(n->body, {"endset"}, &end, nullptr); !s) return s;
          if (end.empty()) return syntax(p.line, "'set' without 'endset'");
        }
      } else if (word == "macro") {
        n->t = Node::T::macro;
        auto name = ep.expect_name();
        if (!name.ok()) return name.error();
        n->targets.push_back(*name);
        if (Status s = ep.expect_op("("); !s) return s;
        while (!ep.accept_op(")")) {
          auto param = ep.expect_name();
          if (!param.ok()) return param.error();
          n->params.push_back(*param);
          ExprPtr def;
          if (ep.accept_op("=")) {
            auto d = ep.parse_expression();
            if (!d.ok()) return d.error();
            def = *d;
          }
          n->defaults.push_back(def);
          if (!ep.accept_op(",") && !(ep.peek().t == Token::T::op && ep.peek().s == ")"))
            return syntax(p.line, "expected ',' or ')' in macro parameters");
        }
        std::string end;
        if (Status s = parse_body(n->body, {"endmacro"}, &end, nullptr); !s) return s;
        if (end.empty()) return syntax(p.line, "'macro' without 'endmacro'");
      } else if (word == "generation") {
        n->t = Node::T::block;
        std::string end;
        if (Status s = parse_body(n->body, {"endgeneration"}, &end, nullptr); !s) return s;
        if (end.empty()) return syntax(p.line, "'generation' without 'endgeneration'");
      } else if (word == "break" || word == "continue") {
        n->t = word == "break" ? Node::T::break_ : Node::T::continue_;
      } else {
        return syntax(p.line, "unsupported tag '" + (word.empty() ? p.body : word) + "'");
      }
      out.push_back(n);
    }
    if (end_tag) end_tag->clear();
    return Status::ok_status();
  }

 private:
  std::vector<Piece> ps_;
  std::size_t i_ = 0;
};

// ============================================================================
// Evaluation
// ============================================================================

enum class Flow { normal, break_, continue_ };

class Renderer {
 public:
  Renderer(const std::map<std::string, Template::Function>& functions) : fns_(functions) {}

  std::vector<std::map<std::string, Value>> frames;

  Status render(const std::vector<NodePtr>& nodes, std::string& out, Flow& flow) {
    for (const NodePtr& n : nodes) {
      if (Status s = render_node(*n, out, flow); !s) return s;
      if (flow != Flow::normal) return Status::ok_status();
    }
    return Status::ok_status();
  }

 private:
  const std::map<std::string, Template::Function>& fns_;

  Error fail(int line, const std::string& what) { return syntax(line, what); }

  Value lookup(const std::string& name) {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      const auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    if (fns_.count(name)) {
      Value v{Value::K::function};
      v.s = name;
      return v;
    }
    if (name == "range" || name == "namespace" || name == "dict") {
      Value v{Value::K::function};
      v.s = name;
      return v;
    }
    return Value{};
  }

  Status render_node(const Node& n, std::string& out, Flow& flow) {
    switch (n.t) {
      case Node::T::text:
        out += n.text;
        return Status::ok_status();
      case Node::T::output: {
        auto v = eval(*n.expr);
        if (!v.ok()) return v.error();
        out += py_str(*v);
        return Status::ok_status();
      }
      case Node::T::if_:
        for (const auto& [cond, body] : n.branches) {
          bool take = true;
          if (cond) {
            auto v = eval(*cond);
            if (!v.ok()) return v.error();
            take = truthy(*v);
          }
          if (take) return render(body, out, flow);
        }
        return Status::ok_status();
      case Node::T::for_:
        return render_for(n, out);
      case Node::T::set: {
        auto v = eval(*n.expr);
        if (!v.ok()) return v.error();
        return assign(n, std::move(v).value());
      }
      case Node::T::set_block: {
        std::string body;
        Flow inner = Flow::normal;
        if (Status s = render(n.body, body, inner); !s) return s;
        return assign(n, Value::string(body));
      }
      case Node::T::macro: {
        Value v{Value::K::macro};
        auto def = std::make_shared<MacroDef>();
        def->node = &n;
        v.macro = def;
        frames.back()[n.targets[0]] = v;
        return Status::ok_status();
      }
      case Node::T::block:
        return render(n.body, out, flow);
      case Node::T::break_:
        flow = Flow::break_;
        return Status::ok_status();
      case Node::T::continue_:
        flow = Flow::continue_;
        return Status::ok_status();
    }
    return Status::ok_status();
  }

  Status assign(const Node& n, Value v) {
    if (!n.target_attr.empty()) {
      Value target = lookup(n.targets[0]);
      if (target.k != Value::K::ns)
        return fail(n.line, "cannot assign attribute '" + n.target_attr + "' on '" + n.targets[0] +
                                "': not a namespace");
      set_key(*target.o, n.target_attr, std::move(v));
      return Status::ok_status();
    }
    if (n.targets.size() == 1) {
      frames.back()[n.targets[0]] = std::move(v);
      return Status::ok_status();
    }
    if (v.k != Value::K::array || v.a->size() != n.targets.size())
      return fail(n.line, "cannot unpack into " + std::to_string(n.targets.size()) + " names");
    for (std::size_t k = 0; k < n.targets.size(); ++k) frames.back()[n.targets[k]] = (*v.a)[k];
    return Status::ok_status();
  }

  Result<Array> iterate(const Value& v, int line) {
    switch (v.k) {
      case Value::K::array:
        return *v.a;
      case Value::K::object: {
        Array keys;
        for (const auto& [k, x] : *v.o) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::K::string: {
        Array chars;
        for (std::size_t k = 0; k < v.s.size();) {
          std::size_t n = 1;
          const auto c = static_cast<unsigned char>(v.s[k]);
          if (c >= 0xF0) n = 4;
          else if (c >= 0xE0) n = 3;
          else if (c >= 0xC0) n = 2;
          chars.push_back(Value::string(v.s.substr(k, n)));
          k += n;
        }
        return chars;
      }
      case Value::K::undefined:
        return Array{};  // Jinja2: iterating an undefined value gives nothing
      default:
        return fail(line, "'" + py_repr(v) + "' is not iterable");
    }
  }

  Status render_for(const Node& n, std::string& out) {
    auto seq = eval(*n.expr);
    if (!seq.ok()) return seq.error();
    auto items = iterate(*seq, n.line);
    if (!items.ok()) return items.error();
    Array all = std::move(items).value();
    if (n.filter) {  // `for x in y if cond`: the loop runs over the kept items
      Array kept;
      for (const Value& item : all) {
        frames.emplace_back();
        if (Status s = bind_targets(n, item); !s) return s;
        auto c = eval(*n.filter);
        frames.pop_back();
        if (!c.ok()) return c.error();
        if (truthy(*c)) kept.push_back(item);
      }
      all = std::move(kept);
    }
    if (all.empty()) {
      Flow f = Flow::normal;
      frames.emplace_back();
      Status s = render(n.else_body, out, f);
      frames.pop_back();
      return s;
    }
    const auto len = static_cast<std::int64_t>(all.size());
    for (std::int64_t k = 0; k < len; ++k) {
      frames.emplace_back();
      if (Status s = bind_targets(n, all[static_cast<std::size_t>(k)]); !s) return s;
      Object loop = {{"index", Value::integer(k + 1)},
                     {"index0", Value::integer(k)},
                     {"revindex", Value::integer(len - k)},
                     {"revindex0", Value::integer(len - k - 1)},
                     {"first", Value::boolean(k == 0)},
                     {"last", Value::boolean(k == len - 1)},
                     {"length", Value::integer(len)},
                     {"previtem", k > 0 ? all[static_cast<std::size_t>(k - 1)] : Value{}},
                     {"nextitem", k + 1 < len ? all[static_cast<std::size_t>(k + 1)] : Value{}}};
      frames.back()["loop"] = Value::object(std::move(loop));
      Flow flow = Flow::normal;
      Status s = render(n.body, out, flow);
      frames.pop_back();
      if (!s) return s;
      if (flow == Flow::break_) break;
    }
    return Status::ok_status();
  }

  Status bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      frames.back()[n.targets[0]] = item;
      return Status::ok_status();
    }
    if (item.k != Value::K::array || item.a->size() != n.targets.size())
      return fail(n.line, "cannot unpack a loop item into " + std::to_string(n.targets.size()) + " names");
    for (std::size_t k = 0; k < n.targets.size(); ++k) frames.back()[n.targets[k]] = (*item.a)[k];
    return Status::ok_status();
  }

  // ---- expressions ----------------------------------------------------------

  Result<Value> eval(const Expr& e) {
    switch (e.t) {
      case Expr::T::literal:
        return e.value;
      case Expr::T::name:
        return lookup(e.name);
      case Expr::T::list: {
        Array a;
        for (const ExprPtr& x : e.args) {
          auto v = eval(*x);
          if (!v.ok()) return v;
          a.push_back(std::move(v).value());
        }
        return Value::array(std::move(a));
      }
      case Expr::T::dict: {
        Object o;
        for (std::size_t k = 0; k < e.args.size(); ++k) {
          auto key = eval(*e.key_exprs[k]);
          if (!key.ok()) return key;
          auto v = eval(*e.args[k]);
          if (!v.ok()) return v;
          set_key(o, py_str(*key), std::move(v).value());
        }
        return Value::object(std::move(o));
      }
      case Expr::T::attr: {
        auto obj = eval(*e.a);
        if (!obj.ok()) return obj;
        return get_attr(*obj, e.name, e.line);
      }
      case Expr::T::item: {
        auto obj = eval(*e.a);
        if (!obj.ok()) return obj;
        auto key = eval(*e.b);
        if (!key.ok()) return key;
        return get_item(*obj, *key, e.line);
      }
      case Expr::T::slice:
        return eval_slice(e);
      case Expr::T::call:
        return eval_call(e);
      case Expr::T::filter:
        return eval_filter(e);
      case Expr::T::test: {
        auto r = eval_test(e);
        if (!r.ok()) return r.error();
        return Value::boolean(*r != e.negate);
      }
      case Expr::T::unary: {
        auto v = eval(*e.a);
        if (!v.ok()) return v;
        if (e.name == "not") return Value::boolean(!truthy(*v));
        if (!v->is_number()) return fail(e.line, "bad operand for unary " + e.name + ": " + py_repr(*v));
        if (e.name == "+") return *v;
        if (v->k == Value::K::floating) return Value::floating(-v->d);
        return Value::integer(-(v->k == Value::K::boolean ? v->b : v->i));
      }
      case Expr::T::binary:
        return eval_binary(e);
      case Expr::T::cond: {
        auto c = eval(*e.b);
        if (!c.ok()) return c;
        if (truthy(*c)) return eval(*e.a);
        if (e.c) return eval(*e.c);
        return Value{};
      }
    }
    return fail(e.line, "bad expression");
  }

  Result<Value> get_attr(const Value& obj, const std::string& name, int line) {
    if (obj.is_mapping()) {
      if (const Value* v = find_key(*obj.o, name)) return *v;
      return Value{};
    }
    if (obj.k == Value::K::undefined) return fail(line, "'" + name + "' of an undefined value");
    if (obj.k == Value::K::none) return fail(line, "'None' has no attribute '" + name + "'");
    return Value{};  // a method: resolved by the call
  }

  Result<Value> get_item(const Value& obj, const Value& key, int line) {
    if (obj.is_mapping()) {
      if (const Value* v = find_key(*obj.o, py_str(key))) return *v;
      return Value{};
    }
    if ((obj.k == Value::K::array || obj.k == Value::K::string) && key.is_number() && key.k != Value::K::floating) {
      const auto size = static_cast<std::int64_t>(obj.k == Value::K::array ? obj.a->size() : obj.s.size());
      std::int64_t idx = key.k == Value::K::boolean ? key.b : key.i;
      if (idx < 0) idx += size;
      if (idx < 0 || idx >= size) return Value{};
      if (obj.k == Value::K::array) return (*obj.a)[static_cast<std::size_t>(idx)];
      return Value::string(obj.s.substr(static_cast<std::size_t>(idx), 1));
    }
    if (obj.k == Value::K::undefined) return fail(line, "subscript of an undefined value");
    return Value{};
  }

  Result<Value> eval_slice(const Expr& e) {
    auto obj = eval(*e.a);
    if (!obj.ok()) return obj;
    std::optional<std::int64_t> part[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[static_cast<std::size_t>(k)]) continue;
      auto v = eval(*e.args[static_cast<std::size_t>(k)]);
      if (!v.ok()) return v;
      if (v->k == Value::K::none) continue;
      if (v->k != Value::K::integer) return fail(e.line, "slice indices must be integers");
      part[k] = v->i;
    }
    const std::int64_t step = part[2].value_or(1);
    if (step == 0) return fail(e.line, "slice step cannot be zero");
    Array items;
    if (obj->k == Value::K::array) items = *obj->a;
    else if (obj->k == Value::K::string) {
      auto chars = iterate(*obj, e.line);
      if (!chars.ok()) return chars.error();
      items = std::move(chars).value();
    } else {
      return fail(e.line, "cannot slice " + py_repr(*obj));
    }
    const auto n = static_cast<std::int64_t>(items.size());
    const auto clamp = [&](std::optional<std::int64_t> x, std::int64_t def, bool neg_step) {
      if (!x) return def;
      std::int64_t v = *x < 0 ? *x + n : *x;
      if (neg_step) return std::clamp<std::int64_t>(v, -1, n - 1);
      return std::clamp<std::int64_t>(v, 0, n);
    };
    Array out;
    if (step > 0) {
      for (std::int64_t k = clamp(part[0], 0, false), stop = clamp(part[1], n, false); k < stop; k += step)
        out.push_back(items[static_cast<std::size_t>(k)]);
    } else {
      for (std::int64_t k = clamp(part[0], n - 1, true), stop = clamp(part[1], -1, true); k > stop; k += step)
        out.push_back(items[static_cast<std::size_t>(k)]);
    }
    if (obj->k == Value::K::string) {
      std::string s;
      for (const Value& c : out) s += c.s;
      return Value::string(s);
    }
    return Value::array(std::move(out));
  }

  Result<Value> eval_binary(const Expr& e) {
    if (e.name == "and" || e.name == "or") {
      auto l = eval(*e.a);
      if (!l.ok()) return l;
      if ((e.name == "and") != truthy(*l)) return l;
      return eval(*e.b);
    }
    auto l = eval(*e.a);
    if (!l.ok()) return l;
    auto r = eval(*e.b);
    if (!r.ok()) return r;
    const Value& a = *l;
    const Value& b = *r;
    const std::string& op = e.name;
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      bool ok = false;
      const int c = compare_values(a, b, ok);
      if (!ok) return fail(e.line, "'" + op + "' between " + py_repr(a) + " and " + py_repr(b));
      return Value::boolean(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
    }
    if (op == "in" || op == "not in") {
      auto in = contains(b, a, e.line);
      if (!in.ok()) return in.error();
      return Value::boolean(*in == (op == "in"));
    }
    if (op == "~") return Value::string(py_str(a) + py_str(b));
    if (op == "+") {
      if (a.k == Value::K::string && b.k == Value::K::string) return Value::string(a.s + b.s);
      if (a.k == Value::K::array && b.k == Value::K::array) {
        Array out = *a.a;
        out.insert(out.end(), b.a->begin(), b.a->end());
        return Value::array(std::move(out));
      }
    }
    if (op == "*" && ((a.k == Value::K::string && b.k == Value::K::integer) ||
                      (a.k == Value::K::integer && b.k == Value::K::string))) {
      const Value& s = a.k == Value::K::string ? a : b;
      const std::int64_t times = a.k == Value::K::integer ? a.i : b.i;
      std::string out;
      for (std::int64_t k = 0; k < times; ++k) out += s.s;
      return Value::string(out);
    }
    if (!a.is_number() || !b.is_number())
      return fail(e.line, "unsupported operand types for " + op + ": " + py_repr(a) + " and " + py_repr(b));
    const bool ints = a.k != Value::K::floating && b.k != Value::K::floating;
    const std::int64_t x = a.k == Value::K::boolean ? a.b : a.i, y = b.k == Value::K::boolean ? b.b : b.i;
    if (op == "+") return ints ? Value::integer(x + y) : Value::floating(a.num() + b.num());
    if (op == "-") return ints ? Value::integer(x - y) : Value::floating(a.num() - b.num());
    if (op == "*") return ints ? Value::integer(x * y) : Value::floating(a.num() * b.num());
    if (op == "/") {
      if (b.num() == 0) return fail(e.line, "division by zero");
      return Value::floating(a.num() / b.num());
    }
    if (op == "//" || op == "%") {
      if (b.num() == 0) return fail(e.line, "division by zero");
      if (ints) {
        std::int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      const double q = std::floor(a.num() / b.num());
      return Value::floating(op == "//" ? q : a.num() - q * b.num());
    }
    if (op == "**") {
      if (ints && y >= 0) {
        std::int64_t r = 1;
        for (std::int64_t k = 0; k < y; ++k) r *= x;
        return Value::integer(r);
      }
      return Value::floating(std::pow(a.num(), b.num()));
    }
    return fail(e.line, "unsupported operator " + op);
  }

  Result<bool> contains(const Value& container, const Value& item, int line) {
    switch (container.k) {
      case Value::K::string:
        if (item.k != Value::K::string) return fail(line, "'in <string>' requires a string");
        return container.s.find(item.s) != std::string::npos;
      case Value::K::array:
        for (const Value& x : *container.a)
          if (equal(x, item)) return true;
        return false;
      case Value::K::object:
      case Value::K::ns:
        return find_key(*container.o, py_str(item)) != nullptr;
      case Value::K::undefined:
        return fail(line, "'in' on an undefined value");
      default:
        return fail(line, "argument of type " + py_repr(container) + " is not iterable");
    }
  }

  // ---- calls, methods, filters, tests ---------------------------------------

  Result<std::vector<Value>> eval_args(const Expr& e) {
    std::vector<Value> out;
    for (const ExprPtr& a : e.args) {
      auto v = eval(*a);
      if (!v.ok()) return v.error();
      out.push_back(std::move(v).value());
    }
    return out;
  }

  Result<Value> eval_call(const Expr& e) {
    auto args = eval_args(e);
    if (!args.ok()) return args.error();
    std::vector<std::pair<std::string, Value>> kwargs;
    for (const auto& [k, x] : e.kwargs) {
      auto v = eval(*x);
      if (!v.ok()) return v;
      kwargs.emplace_back(k, std::move(v).value());
    }
    if (e.a->t == Expr::T::attr) {  // a method call
      auto obj = eval(*e.a->a);
      if (!obj.ok()) return obj;
      if (!obj->is_mapping() || find_key(*obj->o, e.a->name) == nullptr)
        return call_method(*obj, e.a->name, *args, e.line);
    }
    auto callee = eval(*e.a);
    if (!callee.ok()) return callee;
    if (callee->k == Value::K::macro) return call_macro(*callee->macro->node, *args, kwargs, e.line);
    if (callee->k != Value::K::function) return fail(e.line, "'" + py_repr(*callee) + "' is not callable");
    const std::string& name = callee->s;
    if (name == "range") {
      std::int64_t start = 0, stop = 0, step = 1;
      if (args->size() == 1) stop = (*args)[0].i;
      else if (args->size() >= 2) {
        start = (*args)[0].i;
        stop = (*args)[1].i;
        if (args->size() == 3) step = (*args)[2].i;
      }
      if (step == 0) return fail(e.line, "range() step must not be zero");
      Array out;
      for (std::int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(Value::integer(k));
      return Value::array(std::move(out));
    }
    if (name == "namespace" || name == "dict") {
      Value ns{name == "namespace" ? Value::K::ns : Value::K::object};
      ns.o = std::make_shared<Object>();
      for (const Value& a : *args)
        if (a.is_mapping())
          for (const auto& [k, v] : *a.o) set_key(*ns.o, k, v);
      for (auto& [k, v] : kwargs) set_key(*ns.o, k, v);
      return ns;
    }
    const auto it = fns_.find(name);
    if (it == fns_.end()) return fail(e.line, "unknown function '" + name + "'");
    std::vector<ojson> jargs;
    for (const Value& a : *args) jargs.push_back(to_json(a));
    auto r = it->second(jargs);
    if (!r.ok()) return r.error();
    return from_json(*r);
  }

  Result<Value> call_macro(const Node& m, const std::vector<Value>& args,
                           const std::vector<std::pair<std::string, Value>>& kwargs, int line) {
    if (args.size() > m.params.size()) return fail(line, "macro '" + m.targets[0] + "' takes " +
                                                             std::to_string(m.params.size()) + " arguments");
    std::map<std::string, Value> frame;
    for (std::size_t k = 0; k < m.params.size(); ++k) {
      if (k < args.size()) {
        frame[m.params[k]] = args[k];
      } else if (m.defaults[k]) {
        auto d = eval(*m.defaults[k]);
        if (!d.ok()) return d;
        frame[m.params[k]] = std::move(d).value();
      }
    }
    for (const auto& [k, v] : kwargs) frame[k] = v;
    // A macro sees the template's globals (the outermost frame) and its arguments.
    std::vector<std::map<std::string, Value>> saved;
    saved.swap(frames);
    frames.push_back(saved.front());
    frames.push_back(std::move(frame));
    std::string out;
    Flow flow = Flow::normal;
    Status s = render(m.body, out, flow);
    frames.swap(saved);
    if (!s) return s.error();
    return Value::string(out);
  }

  static std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
    std::size_t b = 0, e = s.size();
    if (left) {
      b = s.find_first_not_of(chars);
      if (b == std::string::npos) return "";
    }
    if (right) {
      const std::size_t k = s.find_last_not_of(chars);
      e = k == std::string::npos ? 0 : k + 1;
    }
    return e > b ? s.substr(b, e - b) : "";
  }

  Result<Value> call_method(const Value& obj, const std::string& name, const std::vector<Value>& args, int line) {
    const auto str_arg = [&](std::size_t k, const char* def) {
      return k < args.size() && args[k].k == Value::K::string ? args[k].s : std::string(def);
    };
    if (obj.k == Value::K::string) {
      const std::string& s = obj.s;
      static const std::string kWs = " \t\n\r\x0b\x0c";
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const std::string chars = args.empty() || args[0].k == Value::K::none ? kWs : str_arg(0, "");
        return Value::string(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
      }
      if (name == "startswith" || name == "endswith") {
        std::vector<std::string> options;
        if (!args.empty() && args[0].k == Value::K::array) {
          for (const Value& x : *args[0].a) options.push_back(x.s);
        } else {
          options.push_back(str_arg(0, ""));
        }
        for (const std::string& p : options) {
          if (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                   : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "upper" || name == "lower") {
        std::string out = s;
        for (char& c : out) c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                                                 : std::tolower(static_cast<unsigned char>(c)));
        return Value::string(out);
      }
      if (name == "title" || name == "capitalize") return apply_case(s, name);
      if (name == "replace") {
        std::string out;
        const std::string from = str_arg(0, ""), to = str_arg(1, "");
        if (from.empty()) return fail(line, "replace() with an empty pattern is not supported");
        std::size_t pos = 0;
        for (std::size_t at; (at = s.find(from, pos)) != std::string::npos; pos = at + from.size())
          out += s.substr(pos, at - pos) + to;
        out += s.substr(pos);
        return Value::string(out);
      }
      if (name == "split") {
        Array parts;
        const std::int64_t maxsplit = args.size() > 1 && args[1].k == Value::K::integer ? args[1].i : -1;
        if (args.empty() || args[0].k == Value::K::none) {  // on runs of whitespace
          std::size_t k = 0;
          std::int64_t splits = 0;
          while (k < s.size()) {
            k = s.find_first_not_of(kWs, k);
            if (k == std::string::npos) break;
            if (maxsplit >= 0 && splits == maxsplit) {
              parts.push_back(Value::string(strip_chars(s.substr(k), kWs, false, true)));
              break;
            }
            const std::size_t e2 = s.find_first_of(kWs, k);
            parts.push_back(Value::string(s.substr(k, e2 == std::string::npos ? std::string::npos : e2 - k)));
            ++splits;
            if (e2 == std::string::npos) break;
            k = e2;
          }
          return Value::array(std::move(parts));
        }
        const std::string sep = str_arg(0, "");
        if (sep.empty()) return fail(line, "split() with an empty separator");
        std::size_t pos = 0;
        std::int64_t splits = 0;
        for (std::size_t at; (maxsplit < 0 || splits < maxsplit) && (at = s.find(sep, pos)) != std::string::npos;
             pos = at + sep.size(), ++splits)
          parts.push_back(Value::string(s.substr(pos, at - pos)));
        parts.push_back(Value::string(s.substr(pos)));
        return Value::array(std::move(parts));
      }
    }
    if (obj.is_mapping()) {
      if (name == "items") {
        Array out;
        for (const auto& [k, v] : *obj.o) out.push_back(Value::array({Value::string(k), v}));
        return Value::array(std::move(out));
      }
      if (name == "keys" || name == "values") {
        Array out;
        for (const auto& [k, v] : *obj.o) out.push_back(name == "keys" ? Value::string(k) : v);
        return Value::array(std::move(out));
      }
      if (name == "get") {
        if (args.empty()) return fail(line, "get() needs a key");
        if (const Value* v = find_key(*obj.o, py_str(args[0]))) return *v;
        return args.size() > 1 ? args[1] : Value::none();
      }
    }
    if (obj.k == Value::K::undefined) return fail(line, "'" + name + "' of an undefined value");
    return fail(line, "unsupported method '" + name + "' on " + py_repr(obj).substr(0, 40));
  }

  static Result<Value> apply_case(const std::string& s, const std::string& how) {
    std::string out = s;
    bool start = true;
    for (std::size_t k = 0; k < out.size(); ++k) {
      const auto c = static_cast<unsigned char>(out[k]);
      if (how == "capitalize") {
        out[k] = static_cast<char>(k == 0 ? std::toupper(c) : std::tolower(c));
      } else {  // title: first letter of each word up, the rest down
        if (std::isalpha(c)) {
          out[k] = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
          start = false;
        } else {
          start = !(std::isalnum(c) || c == '\'');
        }
      }
    }
    return Value::string(out);
  }

  Result<Value> eval_filter(const Expr& e) {
    auto target = eval(*e.a);
    if (!target.ok()) return target;
    auto args = eval_args(e);
    if (!args.ok()) return args.error();
    std::map<std::string, Value> kw;
    for (const auto& [k, x] : e.kwargs) {
      auto v = eval(*x);
      if (!v.ok()) return v;
      kw[k] = std::move(v).value();
    }
    return apply_filter(e.name, *target, *args, kw, e.line);
  }

  Result<Value> apply_filter(const std::string& f, const Value& v, const std::vector<Value>& args,
                             std::map<std::string, Value>& kw, int line) {
    const auto arg = [&](std::size_t k, const char* key) -> const Value* {
      if (k < args.size()) return &args[k];
      const auto it = kw.find(key);
      return it == kw.end() ? nullptr : &it->second;
    };
    if (f == "safe") return v;
    if (f == "string") return Value::string(py_str(v));
    if (f == "trim") {
      if (v.k != Value::K::string) return Value::string(strip_chars(py_str(v), " \t\n\r\x0b\x0c", true, true));
      return Value::string(strip_chars(v.s, " \t\n\r\x0b\x0c", true, true));
    }
    if (f == "length" || f == "count") {
      if (v.k == Value::K::string) {
        std::int64_t n = 0;
        for (const char c : v.s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
        return Value::integer(n);
      }
      if (v.k == Value::K::array) return Value::integer(static_cast<std::int64_t>(v.a->size()));
      if (v.is_mapping()) return Value::integer(static_cast<std::int64_t>(v.o->size()));
      if (v.k == Value::K::undefined) return Value::integer(0);
      return fail(line, "object of type " + py_repr(v) + " has no len()");
    }
    if (f == "tojson") {
      const Value* indent = arg(0, "indent");
      return Value::string(dumps(v, indent != nullptr && indent->k == Value::K::integer ? static_cast<int>(indent->i) : -1));
    }
    if (f == "lower" || f == "upper") return call_method(Value::string(py_str(v)), f, {}, line);
    if (f == "capitalize" || f == "title") return apply_case(py_str(v), f);
    if (f == "default" || f == "d") {
      const Value* def = arg(0, "default_value");
      const Value* boolean = arg(1, "boolean");
      const bool use = v.k == Value::K::undefined || (boolean != nullptr && truthy(*boolean) && !truthy(v));
      return use ? (def ? *def : Value::string("")) : v;
    }
    if (f == "join") {
      const Value* sep = arg(0, "d");
      const Value* attr = arg(1, "attribute");
      auto items = iterate(v, line);
      if (!items.ok()) return items.error();
      std::string out;
      bool first = true;
      for (const Value& x : *items) {
        if (!first) out += sep ? py_str(*sep) : "";
        first = false;
        if (attr) {
          auto a = get_attr(x, py_str(*attr), line);
          if (!a.ok()) return a;
          out += py_str(*a);
        } else {
          out += py_str(x);
        }
      }
      return Value::string(out);
    }
    if (f == "first" || f == "last") {
      auto items = iterate(v, line);
      if (!items.ok()) return items.error();
      if (items->empty()) return Value{};
      return f == "first" ? items->front() : items->back();
    }
    if (f == "list") {
      auto items = iterate(v, line);
      if (!items.ok()) return items.error();
      return Value::array(std::move(items).value());
    }
    if (f == "reverse") {
      if (v.k == Value::K::string) return Value::string(std::string(v.s.rbegin(), v.s.rend()));
      auto items = iterate(v, line);
      if (!items.ok()) return items.error();
      std::reverse(items->begin(), items->end());
      return Value::array(std::move(items).value());
    }
    if (f == "unique") {
      auto items = iterate(v, line);
      if (!items.ok()) return items.error();
      Array out;
      for (const Value& x : *items) {
        bool seen = false;
        for (const Value& y : out) seen = seen || equal(x, y);
        if (!seen) out.push_back(x);
      }
      return Value::array(std::move(out));
    }
    if (f == "sort") {
      auto items = iterate(v, line);
      if (!items.ok()) return items.error();
      const Value* rev = arg(0, "reverse");
      const Value* attr = arg(2, "attribute");
      Array out = std::move(items).value();
      bool bad = false;
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        Value a = x, b = y;
        if (attr) {
          a = x.is_mapping() && find_key(*x.o, py_str(*attr)) ? *find_key(*x.o, py_str(*attr)) : Value{};
          b = y.is_mapping() && find_key(*y.o, py_str(*attr)) ? *find_key(*y.o, py_str(*attr)) : Value{};
        }
        bool ok = false;
        const int c = compare_values(a, b, ok);
        bad = bad || !ok;
        return rev && truthy(*rev) ? c > 0 : c < 0;
      });
      if (bad) return fail(line, "sort of values that do not compare");
      return Value::array(std::move(out));
    }
    if (f == "int") {
      if (v.k == Value::K::integer) return v;
      if (v.k == Value::K::floating) return Value::integer(static_cast<std::int64_t>(v.d));
      if (v.k == Value::K::boolean) return Value::integer(v.b);
      if (v.k == Value::K::string) {
        char* end = nullptr;
        const long long x = std::strtoll(v.s.c_str(), &end, 10);
        if (end != v.s.c_str() && *end == '\0') return Value::integer(x);
        const double d = std::strtod(v.s.c_str(), &end);
        if (end != v.s.c_str() && *end == '\0') return Value::integer(static_cast<std::int64_t>(d));
      }
      const Value* def = arg(0, "default");
      return def ? *def : Value::integer(0);
    }
    if (f == "float") {
      if (v.is_number()) return Value::floating(v.num());
      if (v.k == Value::K::string) {
        char* end = nullptr;
        const double d = std::strtod(v.s.c_str(), &end);
        if (end != v.s.c_str() && *end == '\0') return Value::floating(d);
      }
      const Value* def = arg(0, "default");
      return def ? *def : Value::floating(0);
    }
    if (f == "abs") {
      if (v.k == Value::K::integer) return Value::integer(v.i < 0 ? -v.i : v.i);
      if (v.k == Value::K::floating) return Value::floating(std::fabs(v.d));
      return fail(line, "abs of a non-number");
    }
    if (f == "replace") {
      const Value* from = arg(0, "old");
      const Value* to = arg(1, "new");
      if (!from || !to) return fail(line, "replace needs two arguments");
      return call_method(Value::string(py_str(v)), "replace", {Value::string(py_str(*from)), Value::string(py_str(*to))},
                         line);
    }
    if (f == "items") {
      if (v.k == Value::K::undefined) return Value::array();
      if (!v.is_mapping()) return fail(line, "items of a non-mapping");
      return call_method(v, "items", {}, line);
    }
    if (f == "indent") {
      const Value* width_v = arg(0, "width");
      const Value* first_v = arg(1, "first");
      const Value* blank_v = arg(2, "blank");
      const std::string pad = width_v && width_v->k == Value::K::string
                                  ? width_v->s
                                  : std::string(static_cast<std::size_t>(width_v ? width_v->i : 4), ' ');
      const bool first = first_v && truthy(*first_v), blank = blank_v && truthy(*blank_v);
      const std::string s = py_str(v);
      std::string out;
      std::size_t pos = 0;
      bool is_first = true;
      while (pos <= s.size()) {
        const std::size_t nl = s.find('\n', pos);
        const std::string ln = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
        if ((is_first ? first : true) && (blank || !ln.empty()) && !(is_first && !first)) out += pad;
        out += ln;
        if (nl == std::string::npos) break;
        out += '\n';
        pos = nl + 1;
        is_first = false;
      }
      return Value::string(out);
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      const bool attr_form = f == "selectattr" || f == "rejectattr";
      const bool keep_when = f == "selectattr" || f == "select";
      auto items = iterate(v, line);
      if (!items.ok()) return items.error();
      std::size_t k = 0;
      std::string attr;
      if (attr_form) {
        if (args.empty()) return fail(line, f + " needs an attribute");
        attr = py_str(args[k++]);
      }
      const std::string test = k < args.size() ? py_str(args[k++]) : "";
      std::vector<Value> test_args(args.begin() + static_cast<std::ptrdiff_t>(std::min(k, args.size())), args.end());
      Array out;
      for (const Value& x : *items) {
        Value subject = x;
        if (attr_form) {
          auto a = x.is_mapping() ? get_attr(x, attr, line) : Result<Value>(Value{});
          if (!a.ok()) return a;
          subject = *a;
        }
        bool r = false;
        if (test.empty()) {
          r = truthy(subject);
        } else {
          auto t = run_test(test, subject, test_args, line);
          if (!t.ok()) return t.error();
          r = *t;
        }
        if (r == keep_when) out.push_back(x);
      }
      return Value::array(std::move(out));
    }
    if (f == "map") {
      auto items = iterate(v, line);
      if (!items.ok()) return items.error();
      Array out;
      const auto attr = kw.find("attribute");
      for (const Value& x : *items) {
        if (attr != kw.end()) {
          auto a = x.is_mapping() ? get_attr(x, py_str(attr->second), line) : Result<Value>(Value{});
          if (!a.ok()) return a;
          if (a->k == Value::K::undefined && kw.count("default")) out.push_back(kw["default"]);
          else out.push_back(*a);
        } else {
          if (args.empty()) return fail(line, "map needs a filter name or attribute=");
          std::vector<Value> rest(args.begin() + 1, args.end());
          std::map<std::string, Value> nokw;
          auto r = apply_filter(py_str(args[0]), x, rest, nokw, line);
          if (!r.ok()) return r;
          out.push_back(std::move(r).value());
        }
      }
      return Value::array(std::move(out));
    }
    return fail(line, "unsupported filter '" + f + "'");
  }

  Result<bool> eval_test(const Expr& e) {
    auto args = eval_args(e);
    if (!args.ok()) return args.error();
    if (e.name == "defined" || e.name == "undefined") {
      // Jinja2 evaluates the operand leniently: a missing attribute is undefined.
      auto v = eval(*e.a);
      const bool defined = v.ok() && v->k != Value::K::undefined;
      return e.name == "defined" ? defined : !defined;
    }
    auto v = eval(*e.a);
    if (!v.ok()) return v.error();
    return run_test(e.name, *v, *args, e.line);
  }

  Result<bool> run_test(const std::string& t, const Value& v, const std::vector<Value>& args, int line) {
    using K = Value::K;
    if (t == "defined") return v.k != K::undefined;
    if (t == "undefined") return v.k == K::undefined;
    if (t == "none") return v.k == K::none;
    if (t == "string") return v.k == K::string;
    if (t == "mapping") return v.is_mapping();
    if (t == "iterable") return v.k == K::string || v.k == K::array || v.is_mapping();
    if (t == "sequence") return v.k == K::string || v.k == K::array || v.is_mapping();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.k == K::integer;
    if (t == "float") return v.k == K::floating;
    if (t == "boolean") return v.k == K::boolean;
    if (t == "true") return v.k == K::boolean && v.b;
    if (t == "false") return v.k == K::boolean && !v.b;
    if (t == "callable") return v.k == K::function || v.k == K::macro;
    if (t == "odd" || t == "even") {
      if (v.k != K::integer) return fail(line, "'" + t + "' of a non-integer");
      return ((v.i % 2) != 0) == (t == "odd");
    }
    if (t == "eq" || t == "equalto" || t == "==" || t == "sameas") {
      if (args.empty()) return fail(line, "'" + t + "' needs an argument");
      return equal(v, args[0]);
    }
    if (t == "ne" || t == "!=") {
      if (args.empty()) return fail(line, "'" + t + "' needs an argument");
      return !equal(v, args[0]);
    }
    if (t == "in") {
      if (args.empty()) return fail(line, "'in' needs an argument");
      return contains(args[0], v, line);
    }
    return fail(line, "unsupported test '" + t + "'");
  }
};


Result<Template> Template::parse(std::string_view source) {
  // Jinja2's keep_trailing_newline=False: one final newline of the source goes.
  if (!source.empty() && source.back() == '\n') source.remove_suffix(source.size() >= 2 && source[source.size() - 2] == '\r' ? 2 : 1);
  auto pieces = lex(source);
  if (!pieces.ok()) return pieces.error();
  NodeParser parser(std::move(pieces).value());
  auto root = std::make_shared<Node>();
  root->t = Node::T::block;
  std::string end;
  if (Status s = parser.parse_body(root->body, {}, &end, nullptr); !s) return s.error();
  Template t;
  t.root_ = root;
  return t;
}

Result<std::string> Template::render(const ojson& context, const std::map<std::string, Function>& functions) const {
  if (!root_) return make_error(ErrorCode::invalid_argument, "template: not parsed");
  Renderer r(functions);
  r.frames.emplace_back();
  if (context.is_object())
    for (const auto& [k, v] : context.items()) r.frames.back()[k] = from_json(v);
  r.frames.emplace_back();  // the template's own top-level assignments
  std::string out;
  Flow flow = Flow::normal;
  if (Status s = r.render(root_->body, out, flow); !s) return s.error();
  return out;
}

}  // namespace shardline::text::jinja
