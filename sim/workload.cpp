#include "sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "orchestrator/batch_format.hpp"

namespace shardline::sim {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

bool to_number(const std::string& s, double* v) {
  try {
    std::size_t used = 0;
    *v = std::stod(s, &used);
    return used == s.size() && std::isfinite(*v);
  } catch (const std::exception&) {
    return false;
  }
}

int draw(const LengthDist& d, std::mt19937_64& rng) {
  double x = d.a;
  switch (d.kind) {
    case LengthDist::Kind::fixed: break;
    case LengthDist::Kind::uniform:
      x = static_cast<double>(std::uniform_int_distribution<long long>(static_cast<long long>(d.a),
                                                                       static_cast<long long>(d.b))(rng));
      break;
    case LengthDist::Kind::loguniform:
      x = std::exp(std::uniform_real_distribution<double>(std::log(d.a), std::log(d.b))(rng));
      break;
    case LengthDist::Kind::lognormal:
      x = d.a * std::exp(d.b * std::normal_distribution<double>(0.0, 1.0)(rng));
      if (d.max > 0) x = std::min(x, d.max);
      break;
  }
  return std::max(1, static_cast<int>(std::lround(x)));
}

}  // namespace

Result<LengthDist> parse_length_dist(const std::string& spec) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::invalid_argument,
                      "length distribution '" + spec + "': " + why +
                          " (N, uniform:A:B, loguniform:A:B or lognormal:MEDIAN:SIGMA[:MAX])");
  };
  LengthDist d;
  d.text = spec;
  const auto parts = split(spec, ':');
  if (parts.empty()) return bad("empty");
  std::vector<double> v;
  for (std::size_t i = parts.size() == 1 ? 0 : 1; i < parts.size(); ++i) {
    double x = 0;
    if (!to_number(parts[i], &x)) return bad("'" + parts[i] + "' is not a number");
    v.push_back(x);
  }
  if (parts.size() == 1) {
    d.kind = LengthDist::Kind::fixed;
    d.a = v[0];
    if (d.a < 1) return bad("lengths must be >= 1");
    return d;
  }
  const std::string& kind = parts[0];
  if (kind == "uniform" || kind == "loguniform") {
    if (v.size() != 2) return bad("two bounds expected");
    d.kind = kind == "uniform" ? LengthDist::Kind::uniform : LengthDist::Kind::loguniform;
    d.a = v[0];
    d.b = v[1];
    if (d.a < 1 || d.b < d.a) return bad("need 1 <= A <= B");
  } else if (kind == "lognormal") {
    if (v.size() != 2 && v.size() != 3) return bad("MEDIAN:SIGMA[:MAX] expected");
    d.kind = LengthDist::Kind::lognormal;
    d.a = v[0];
    d.b = v[1];
    d.max = v.size() == 3 ? v[2] : 0;
    if (d.a < 1 || d.b < 0 || (v.size() == 3 && d.max < 1)) return bad("need MEDIAN >= 1, SIGMA >= 0, MAX >= 1");
  } else {
    return bad("unknown kind '" + kind + "'");
  }
  return d;
}

std::vector<SimRequest> generate_workload(int num, const LengthDist& input, const LengthDist& output,
                                          std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<SimRequest> out;
  out.reserve(static_cast<std::size_t>(std::max(num, 0)));
  for (int i = 0; i < num; ++i) {
    const int in = draw(input, rng);
    const int len = draw(output, rng);
    out.push_back(SimRequest{in, len});
  }
  return out;
}

Result<JsonlWorkload> workload_from_jsonl(const std::string& path, const text::Tokenizer* tokenizer,
                                          int default_output_len) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::not_found, path + ": cannot open");
  JsonlWorkload w;
  std::string line;
  std::uint64_t index = 0;
  auto count_text = [&](const std::string& text) -> Result<int> {
    if (tokenizer == nullptr)
      return make_error(ErrorCode::invalid_argument,
                        path + ": a text prompt needs a tokenizer (give --model, a folder with tokenizer files)");
    return static_cast<int>(tokenizer->encode(text, /*add_special_tokens=*/true).size());
  };
  while (std::getline(in, line)) {
    if (orchestrator::is_blank_line(line)) continue;
    orchestrator::BatchLine parsed = orchestrator::parse_batch_line(line, 0, index++);
    if (!parsed.is_request()) {
      ++w.skipped_lines;
      continue;
    }
    const worker::BatchRequest& r = parsed.request();
    int prompt_len = 0;
    if (!r.prompt_token_ids.empty()) {
      prompt_len = static_cast<int>(r.prompt_token_ids.size());
    } else if (r.chat) {
      const nlohmann::json messages = nlohmann::json::parse(r.messages_json, nullptr, false);
      std::string text;
      if (messages.is_array())
        for (const auto& m : messages)
          if (m.contains("content") && m["content"].is_string()) text += m["content"].get<std::string>() + "\n";
      auto n = count_text(text);
      if (!n) return n.error();
      prompt_len = *n;
    } else {
      auto n = count_text(r.prompt);
      if (!n) return n.error();
      prompt_len = *n;
    }
    const int output_len = r.max_tokens_from_context ? default_output_len : r.params.max_tokens;
    for (int c = 0; c < std::max(1, r.n); ++c)
      w.requests.push_back(SimRequest{std::max(1, prompt_len), std::max(1, output_len)});
  }
  return w;
}

}  // namespace shardline::sim
