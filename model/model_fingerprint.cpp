#include "model/model_fingerprint.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <string_view>
#include <vector>

#include "comm/crypto.hpp"

namespace shardline::model {
namespace {

namespace fs = std::filesystem;

constexpr std::array<std::string_view, 9> kWholeFiles = {
    "config.json",           "generation_config.json",   "tokenizer.json",
    "tokenizer.model",       "tokenizer_config.json",    "special_tokens_map.json",
    "chat_template.jinja",   "model.safetensors.index.json", "params.json"};

constexpr std::uint64_t kHeadBytes = 1 << 20;
constexpr std::uint64_t kSampleBytes = 4 << 10;
constexpr int kSamples = 64;

bool is_weight_file(const std::string& name) { return name.ends_with(".safetensors") || name.ends_with(".gguf"); }

/// Adds `n` bytes of `in` at `offset` to the hash.
Status hash_range(std::ifstream& in, const fs::path& file, std::uint64_t offset, std::uint64_t n,
                  comm::Sha256& sha) {
  std::string buf(static_cast<std::size_t>(std::min<std::uint64_t>(n, 1 << 20)), '\0');
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  while (n > 0) {
    const auto want = static_cast<std::streamsize>(std::min<std::uint64_t>(n, buf.size()));
    in.read(buf.data(), want);
    if (in.gcount() != want) return make_error(ErrorCode::io, "model fingerprint: cannot read " + file.string());
    sha.update(std::string_view(buf.data(), static_cast<std::size_t>(want)));
    n -= static_cast<std::uint64_t>(want);
  }
  return Status::ok_status();
}

Status hash_file(const fs::path& file, bool sampled, comm::Sha256& sha) {
  std::error_code ec;
  const std::uint64_t size = fs::file_size(file, ec);
  if (ec) return make_error(ErrorCode::io, "model fingerprint: " + file.string() + ": " + ec.message());
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io, "model fingerprint: cannot open " + file.string());
  const std::string name = file.filename().string();
  sha.update(name);
  sha.update(std::string_view("\0", 1));
  sha.update(std::to_string(size));
  sha.update(std::string_view("\0", 1));
  if (!sampled || size <= kHeadBytes + kSamples * kSampleBytes) return hash_range(in, file, 0, size, sha);
  if (Status st = hash_range(in, file, 0, kHeadBytes, sha); !st.ok()) return st;
  const std::uint64_t span = size - kHeadBytes - kSampleBytes;
  for (int i = 0; i < kSamples; ++i) {
    const std::uint64_t at = kHeadBytes + span * static_cast<std::uint64_t>(i) / (kSamples - 1);
    if (Status st = hash_range(in, file, at, kSampleBytes, sha); !st.ok()) return st;
  }
  return Status::ok_status();
}

}  // namespace

Result<std::string> model_fingerprint(const fs::path& dir) {
  std::error_code ec;
  std::vector<std::pair<fs::path, bool>> files;  // (file, sampled)
  if (fs::is_regular_file(dir, ec)) {
    files.emplace_back(dir, true);
  } else if (fs::is_directory(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (!e.is_regular_file(ec)) continue;
      const std::string name = e.path().filename().string();
      if (is_weight_file(name)) files.emplace_back(e.path(), true);
      else if (std::find(kWholeFiles.begin(), kWholeFiles.end(), name) != kWholeFiles.end())
        files.emplace_back(e.path(), false);
    }
    if (ec) return make_error(ErrorCode::io, "model fingerprint: " + dir.string() + ": " + ec.message());
  } else {
    return make_error(ErrorCode::not_found, "model fingerprint: " + dir.string() + ": no such folder or file");
  }
  std::sort(files.begin(), files.end(),
            [](const auto& a, const auto& b) { return a.first.filename() < b.first.filename(); });
  comm::Sha256 sha;
  sha.update("shardline model fingerprint v1");
  for (const auto& [file, sampled] : files)
    if (Status st = hash_file(file, sampled, sha); !st.ok()) return st.error();
  const std::string digest = sha.finish();
  if (digest.empty()) return make_error(ErrorCode::internal, "model fingerprint: SHA-256 failed");
  return comm::to_hex(digest);
}

}  // namespace shardline::model
