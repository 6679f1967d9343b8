#include "model/config.hpp"

#include "model/gguf/gguf_model.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

namespace shardline::model {

namespace {

using nlohmann::json;

constexpr int kDefaultMaxPositionEmbeddings = 2048;  // HF LlamaConfig default

[[nodiscard]] Error field_error(ErrorCode code, const std::string& file, const std::string& field,
                                const std::string& what) {
  return make_error(code, file + ": field '" + field + "': " + what);
}

[[nodiscard]] std::string json_type(const json& j) { return j.type_name(); }

/// Reads an integer field. `out` keeps its value when the field is absent or null
/// and `required` is false.
[[nodiscard]] Status read_int(const json& obj, const char* field, const std::string& file,
                              bool required, int& out) {
  const auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) {
    if (required) return field_error(ErrorCode::invalid_argument, file, field, "missing");
    return {};
  }
  long long v = 0;
  if (it->is_number_integer()) {
    v = it->is_number_unsigned()
            ? static_cast<long long>(std::min<std::uint64_t>(it->get<std::uint64_t>(),
                                                             std::uint64_t{1} << 62))
            : it->get<long long>();
  } else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() &&
             std::fabs(it->get<double>()) < 1e15) {
    v = static_cast<long long>(it->get<double>());
  } else {
    return field_error(ErrorCode::invalid_argument, file, field,
                       "expected an integer, found " + json_type(*it) + " " + it->dump());
  }
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return field_error(ErrorCode::invalid_argument, file, field,
                       "value " + std::to_string(v) + " out of range");
  }
  out = static_cast<int>(v);
  return {};
}

[[nodiscard]] Status read_positive_int(const json& obj, const char* field, const std::string& file,
                                       bool required, int& out) {
  const auto it = obj.find(field);
  const bool present = it != obj.end() && !it->is_null();
  if (Status s = read_int(obj, field, file, required, out); !s.ok()) return s;
  if (present && out <= 0) {
    return field_error(ErrorCode::invalid_argument, file, field,
                       "must be positive, found " + std::to_string(out));
  }
  return {};
}

[[nodiscard]] Status read_float(const json& obj, const char* field, const std::string& file,
                                bool positive, float& out) {
  const auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return {};
  if (!it->is_number()) {
    return field_error(ErrorCode::invalid_argument, file, field,
                       "expected a number, found " + json_type(*it) + " " + it->dump());
  }
  const double v = it->get<double>();
  if (!std::isfinite(v) || (positive && !(v > 0.0))) {
    return field_error(ErrorCode::invalid_argument, file, field,
                       "must be a positive finite number, found " + it->dump());
  }
  out = static_cast<float>(v);
  return {};
}

[[nodiscard]] Status read_bool(const json& obj, const char* field, const std::string& file,
                               bool& out) {
  const auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return {};
  if (!it->is_boolean()) {
    return field_error(ErrorCode::invalid_argument, file, field,
                       "expected true/false, found " + json_type(*it) + " " + it->dump());
  }
  out = it->get<bool>();
  return {};
}

/// Appends the ids of an `eos_token_id` field (int, list of ints, or null) to `ids`,
/// skipping duplicates.
[[nodiscard]] Status read_token_ids(const json& obj, const char* field, const std::string& file,
                                    std::vector<int>& ids) {
  const auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return {};
  auto add = [&](const json& v) -> Status {
    if (!v.is_number_integer() || v.get<long long>() < 0 ||
        v.get<long long>() > std::numeric_limits<int>::max()) {
      return field_error(ErrorCode::invalid_argument, file, field,
                         "expected a non-negative token id (or a list of them), found " + v.dump());
    }
    const int id = static_cast<int>(v.get<long long>());
    for (int x : ids) {
      if (x == id) return {};
    }
    ids.push_back(id);
    return {};
  };
  if (it->is_array()) {
    for (const json& v : *it) {
      if (Status s = add(v); !s.ok()) return s;
    }
    return {};
  }
  return add(*it);
}

[[nodiscard]] Result<json> parse_json_object(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return make_error(ErrorCode::corrupt, file + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) {
    return make_error(ErrorCode::corrupt,
                      file + ": expected a JSON object at top level, found " + json_type(j));
  }
  return j;
}

/// The rope scaling of `cfg[key]`: `key` is "rope_scaling" (transformers < 5)
/// or "rope_parameters" (transformers >= 5: the same object plus rope_theta,
/// with rope_type "default" when unscaled). Errors name `key`.
[[nodiscard]] Status parse_rope_scaling(const json& cfg, const std::string& key, const std::string& file,
                                        std::optional<RopeScaling>& out) {
  out.reset();
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  if (!it->is_object()) {
    return field_error(ErrorCode::invalid_argument, file, key,
                       "expected an object or null, found " + json_type(*it));
  }
  const json& rs = *it;
  std::string type_field = key + ".rope_type";
  auto t = rs.find("rope_type");
  if (t == rs.end() || t->is_null()) {
    t = rs.find("type");
    type_field = key + ".type";
  }
  if (t == rs.end() || t->is_null()) {
    return field_error(ErrorCode::invalid_argument, file, key + ".rope_type", "missing");
  }
  if (!t->is_string()) {
    return field_error(ErrorCode::invalid_argument, file, type_field,
                       "expected a string, found " + json_type(*t));
  }
  const std::string type = t->get<std::string>();
  if (type == "default") return {};
  if (type != "llama3") {
    return field_error(ErrorCode::unsupported, file, type_field,
                       "rope scaling type '" + type + "' is not supported (only 'llama3')");
  }
  RopeScaling r;
  r.rope_type = type;
  if (rs.find("factor") == rs.end() || rs["factor"].is_null()) {
    return field_error(ErrorCode::invalid_argument, file, key + ".factor", "missing");
  }
  const std::string f = file;
  if (Status s = read_float(rs, "factor", f, true, r.factor); !s.ok()) {
    return field_error(ErrorCode::invalid_argument, file, key + ".factor",
                       "must be a positive number");
  }
  if (Status s = read_float(rs, "low_freq_factor", f, true, r.low_freq_factor); !s.ok()) {
    return field_error(ErrorCode::invalid_argument, file, key + ".low_freq_factor",
                       "must be a positive number");
  }
  if (Status s = read_float(rs, "high_freq_factor", f, true, r.high_freq_factor); !s.ok()) {
    return field_error(ErrorCode::invalid_argument, file, key + ".high_freq_factor",
                       "must be a positive number");
  }
  if (Status s = read_positive_int(rs, "original_max_position_embeddings", f, false,
                                   r.original_max_position_embeddings);
      !s.ok()) {
    return field_error(ErrorCode::invalid_argument, file,
                       key + ".original_max_position_embeddings",
                       "must be a positive integer");
  }
  if (!(r.high_freq_factor > r.low_freq_factor)) {
    return field_error(ErrorCode::invalid_argument, file, key + ".high_freq_factor",
                       "must be greater than low_freq_factor");
  }
  out = r;
  return {};
}

[[nodiscard]] std::string generation_config_label(const std::string& source) {
  const std::filesystem::path p(source);
  if (p.filename() == "config.json") return (p.parent_path() / "generation_config.json").string();
  return source + " (generation_config.json)";
}

[[nodiscard]] Result<std::string> read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, path.string() + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::io, path.string() + ": read error");
  return ss.str();
}

}  // namespace

const char* architecture_name(Architecture a) noexcept {
  switch (a) {
    case Architecture::llama: return "LlamaForCausalLM";
    case Architecture::qwen2: return "Qwen2ForCausalLM";
    case Architecture::qwen3: return "Qwen3ForCausalLM";
  }
  return "?";
}

long long ModelConfig::num_parameters() const {
  const long long h = hidden_size;
  const long long attn_out = static_cast<long long>(num_attention_heads) * head_dim;
  long long per_layer = 0;
  per_layer += h;                                      // input_layernorm
  per_layer += static_cast<long long>(qkv_rows()) * h;  // q, k, v
  if (qkv_bias) per_layer += qkv_rows();
  if (qk_norm) per_layer += 2LL * head_dim;
  per_layer += h * attn_out;                           // o_proj
  per_layer += h;                                      // post_attention_layernorm
  per_layer += 3LL * h * intermediate_size;            // gate, up, down
  long long total = static_cast<long long>(vocab_size) * h;  // embed_tokens
  total += per_layer * num_hidden_layers;
  total += h;  // final norm
  if (!tie_word_embeddings) total += static_cast<long long>(vocab_size) * h;
  return total;
}

Result<ModelConfig> parse_model_config(const std::string& config_json,
                                       const std::string& generation_config_json,
                                       const std::string& source) {
  const std::string& file = source;
  auto parsed = parse_json_object(config_json, file);
  if (!parsed.ok()) return std::move(parsed).error();
  const json& cfg = parsed.value();

  ModelConfig c;

  // ---- architecture ----
  std::string arch;
  if (auto it = cfg.find("architectures"); it != cfg.end() && !it->is_null()) {
    if (it->is_array() && !it->empty() && (*it)[0].is_string()) {
      arch = (*it)[0].get<std::string>();
    } else if (it->is_string()) {
      arch = it->get<std::string>();
    } else {
      return field_error(ErrorCode::invalid_argument, file, "architectures",
                         "expected a non-empty list of strings, found " + it->dump());
    }
  } else {
    return field_error(ErrorCode::invalid_argument, file, "architectures", "missing");
  }
  c.architecture_string = arch;
  if (arch == "LlamaForCausalLM") {
    c.arch = Architecture::llama;
  } else if (arch == "Qwen2ForCausalLM") {
    c.arch = Architecture::qwen2;
  } else if (arch == "Qwen3ForCausalLM") {
    c.arch = Architecture::qwen3;
  } else {
    return field_error(ErrorCode::unsupported, file, "architectures",
                       "architecture '" + arch +
                           "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, "
                           "Qwen3ForCausalLM)");
  }

  // ---- sizes ----
  Status s;
  if (s = read_positive_int(cfg, "hidden_size", file, true, c.hidden_size); !s.ok()) return s.error();
  if (s = read_positive_int(cfg, "intermediate_size", file, true, c.intermediate_size); !s.ok())
    return s.error();
  if (s = read_positive_int(cfg, "num_hidden_layers", file, true, c.num_hidden_layers); !s.ok())
    return s.error();
  if (s = read_positive_int(cfg, "num_attention_heads", file, true, c.num_attention_heads); !s.ok())
    return s.error();
  if (s = read_positive_int(cfg, "vocab_size", file, true, c.vocab_size); !s.ok()) return s.error();
  c.num_key_value_heads = c.num_attention_heads;
  if (s = read_positive_int(cfg, "num_key_value_heads", file, false, c.num_key_value_heads); !s.ok())
    return s.error();
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return field_error(ErrorCode::invalid_argument, file, "num_key_value_heads",
                       "num_attention_heads (" + std::to_string(c.num_attention_heads) +
                           ") is not divisible by num_key_value_heads (" +
                           std::to_string(c.num_key_value_heads) + ")");
  }
  c.head_dim = 0;
  if (s = read_positive_int(cfg, "head_dim", file, false, c.head_dim); !s.ok()) return s.error();
  if (c.head_dim == 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return field_error(ErrorCode::invalid_argument, file, "head_dim",
                         "missing, and hidden_size (" + std::to_string(c.hidden_size) +
                             ") is not divisible by num_attention_heads (" +
                             std::to_string(c.num_attention_heads) + ")");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) {
    return field_error(ErrorCode::invalid_argument, file, "head_dim",
                       "must be even for rotary embeddings, found " + std::to_string(c.head_dim));
  }
  c.max_position_embeddings = kDefaultMaxPositionEmbeddings;
  if (s = read_positive_int(cfg, "max_position_embeddings", file, false, c.max_position_embeddings);
      !s.ok())
    return s.error();

  // Guard against sizes whose products overflow the int-typed views.
  const long long big = std::numeric_limits<int>::max();
  if (static_cast<long long>(c.num_attention_heads + 2LL * c.num_key_value_heads) * c.head_dim >
      big) {
    return field_error(ErrorCode::invalid_argument, file, "head_dim", "q/k/v sizes too large");
  }
  if (2LL * c.intermediate_size > big) {
    return field_error(ErrorCode::invalid_argument, file, "intermediate_size", "too large");
  }

  // ---- scalars ----
  if (s = read_float(cfg, "rms_norm_eps", file, true, c.rms_norm_eps); !s.ok()) return s.error();
  // transformers >= 5 writes no top-level rope_theta / rope_scaling but one
  // "rope_parameters" object holding both ({"rope_type": "default" or
  // "llama3", "rope_theta": ..., the scaling fields}); the top-level fields
  // win when a config has both.
  const auto rope_params = cfg.find("rope_parameters");
  const bool has_rope_params = rope_params != cfg.end() && !rope_params->is_null();
  if (has_rope_params && !rope_params->is_object()) {
    return field_error(ErrorCode::invalid_argument, file, "rope_parameters",
                       "expected an object or null, found " + json_type(*rope_params));
  }
  if (const auto it = cfg.find("rope_theta"); (it == cfg.end() || it->is_null()) && has_rope_params) {
    if (s = read_float(*rope_params, "rope_theta", file, true, c.rope_theta); !s.ok())
      return field_error(ErrorCode::invalid_argument, file, "rope_parameters.rope_theta",
                         "must be a positive finite number, found " + rope_params->at("rope_theta").dump());
  } else if (s = read_float(cfg, "rope_theta", file, true, c.rope_theta); !s.ok()) {
    return s.error();
  }
  if (const auto it = cfg.find("rope_scaling"); (it == cfg.end() || it->is_null()) && has_rope_params) {
    if (s = parse_rope_scaling(cfg, "rope_parameters", file, c.rope_scaling); !s.ok()) return s.error();
  } else if (s = parse_rope_scaling(cfg, "rope_scaling", file, c.rope_scaling); !s.ok()) {
    return s.error();
  }
  if (s = read_bool(cfg, "tie_word_embeddings", file, c.tie_word_embeddings); !s.ok())
    return s.error();
  bool attention_bias = false;
  if (s = read_bool(cfg, "attention_bias", file, attention_bias); !s.ok()) return s.error();
  switch (c.arch) {
    case Architecture::llama: c.qkv_bias = attention_bias; c.qk_norm = false; break;
    case Architecture::qwen2: c.qkv_bias = true; c.qk_norm = false; break;
    case Architecture::qwen3: c.qkv_bias = attention_bias; c.qk_norm = true; break;
  }
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (auto it = cfg.find(key); it != cfg.end() && !it->is_null()) {
      if (!it->is_string()) {
        return field_error(ErrorCode::invalid_argument, file, key,
                           "expected a string, found " + json_type(*it));
      }
      c.torch_dtype = it->get<std::string>();
      break;
    }
  }

  // ---- special tokens ----
  if (s = read_int(cfg, "bos_token_id", file, false, c.bos_token_id); !s.ok()) return s.error();
  if (s = read_token_ids(cfg, "eos_token_id", file, c.eos_token_ids); !s.ok()) return s.error();

  if (!generation_config_json.empty()) {
    const std::string gfile = generation_config_label(source);
    auto gen = parse_json_object(generation_config_json, gfile);
    if (!gen.ok()) return std::move(gen).error();
    if (c.bos_token_id < 0) {
      if (s = read_int(gen.value(), "bos_token_id", gfile, false, c.bos_token_id); !s.ok())
        return s.error();
    }
    if (s = read_token_ids(gen.value(), "eos_token_id", gfile, c.eos_token_ids); !s.ok())
      return s.error();
  }
  if (c.bos_token_id < -1) {
    return field_error(ErrorCode::invalid_argument, file, "bos_token_id", "must be non-negative");
  }
  return c;
}

Result<ModelConfig> load_model_config(const std::filesystem::path& dir) {
  auto gguf_path = gguf::find_gguf(dir);
  if (!gguf_path.ok()) return gguf_path.error();
  if (gguf_path->has_value()) {
    auto file = gguf::GgufFile::open(**gguf_path);
    if (!file.ok()) return file.error();
    return gguf::model_config(*file);
  }
  const std::filesystem::path config_path = dir / "config.json";
  const std::filesystem::path gen_path = dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_path, ec)) {
    return make_error(ErrorCode::not_found, config_path.string() + ": file not found");
  }
  auto text = read_text_file(config_path);
  if (!text.ok()) return std::move(text).error();
  std::string gen_text;
  if (std::filesystem::is_regular_file(gen_path, ec)) {
    auto g = read_text_file(gen_path);
    if (!g.ok()) return std::move(g).error();
    gen_text = std::move(g).value();
    if (gen_text.find_first_not_of(" \t\r\n") == std::string::npos) {
      return make_error(ErrorCode::corrupt, gen_path.string() + ": file is empty");
    }
  }
  return parse_model_config(text.value(), gen_text, config_path.string());
}

}  // namespace shardline::model
