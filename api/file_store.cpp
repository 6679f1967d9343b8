#include "api/file_store.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

namespace shardline::api {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json to_json(const FileInfo& f) {
  return json{{"id", f.id}, {"bytes", f.bytes}, {"created_at", f.created_at}, {"filename", f.filename},
              {"purpose", f.purpose}};
}

}  // namespace

std::string random_id(std::string_view prefix) {
  static std::mutex mu;
  static std::random_device rd;
  std::lock_guard<std::mutex> lock(mu);
  static const char* const kHex = "0123456789abcdef";
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kHex[rd() % 16];
  return id;
}

Status write_file_atomically(const fs::path& path, std::string_view text) {
  auto fsys = posix_file_system();
  const fs::path tmp = path.string() + ".tmp";
  std::error_code ec;
  fs::remove(tmp, ec);
  auto opened = fsys->open_writable(tmp.string());
  if (!opened) return opened.error();
  if (Status s = opened->file->write_at(0, text); !s) return s;
  if (Status s = opened->file->sync(); !s) return s;
  opened->file.reset();
  fs::rename(tmp, path, ec);
  if (ec) return make_error(ErrorCode::io, "cannot rename " + tmp.string() + ": " + ec.message());
  (void)fsys->sync_dir(path.parent_path().string());  // some file systems cannot sync a folder
  return {};
}

Result<std::unique_ptr<FileStore>> FileStore::open(const fs::path& dir) {
  if (Status s = create_directories_durably(*posix_file_system(), dir.string()); !s) return s.error();
  std::unique_ptr<FileStore> store(new FileStore(dir));
  std::error_code ec;
  std::vector<fs::path> contents;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path p = entry.path();
    if (p.extension() == ".tmp") {
      fs::remove(p, ec);  // an interrupted metadata write
    } else if (p.extension() == ".data") {
      contents.push_back(p);
    } else if (p.extension() == ".json") {
      std::ifstream in(p);
      std::stringstream ss;
      ss << in.rdbuf();
      const json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string())
        return make_error(ErrorCode::corrupt, p.string() + ": not a file record");
      FileInfo f;
      f.id = j["id"].get<std::string>();
      f.bytes = j.value("bytes", std::uint64_t{0});
      f.created_at = j.value("created_at", std::int64_t{0});
      f.filename = j.value("filename", std::string());
      f.purpose = j.value("purpose", std::string());
      store->files_[f.id] = std::move(f);
    }
  }
  if (ec) return make_error(ErrorCode::io, "cannot read " + dir.string() + ": " + ec.message());
  for (const fs::path& p : contents)
    if (store->files_.count(p.stem().string()) == 0) fs::remove(p, ec);  // never committed
  return store;
}

FileStore::Writer::Writer(FileStore* store, FileInfo info, std::unique_ptr<WritableFile> out, std::uint64_t max_bytes)
    : store_(store), info_(std::move(info)), out_(std::move(out)), max_bytes_(max_bytes) {}
FileStore::Writer::Writer(Writer&&) noexcept = default;
FileStore::Writer& FileStore::Writer::operator=(Writer&& other) noexcept {
  if (this != &other) {
    discard();
    store_ = other.store_;
    info_ = std::move(other.info_);
    out_ = std::move(other.out_);
    max_bytes_ = other.max_bytes_;
    other.store_ = nullptr;
  }
  return *this;
}
FileStore::Writer::~Writer() { discard(); }

void FileStore::Writer::discard() {
  if (out_ == nullptr || store_ == nullptr) return;
  out_.reset();
  std::error_code ec;
  fs::remove(store_->content_path(info_.id), ec);
}

Status FileStore::Writer::write(std::string_view data) {
  if (out_ == nullptr) return make_error(ErrorCode::invalid_argument, "file writer already finished");
  if (max_bytes_ > 0 && info_.bytes + data.size() > max_bytes_) {
    discard();
    return make_error(ErrorCode::out_of_memory, "the file exceeds the upload limit of " + std::to_string(max_bytes_) +
                                                    " bytes");
  }
  if (Status s = out_->write_at(info_.bytes, data); !s) return s;
  info_.bytes += data.size();
  return {};
}

Result<FileInfo> FileStore::Writer::commit() {
  if (out_ == nullptr) return make_error(ErrorCode::invalid_argument, "file writer already finished");
  if (Status s = out_->sync(); !s) return s.error();
  out_.reset();
  (void)posix_file_system()->sync_dir(store_->dir_.string());
  if (Status s = store_->write_metadata(info_); !s) return s.error();
  std::lock_guard<std::mutex> lock(store_->mu_);
  store_->files_[info_.id] = info_;
  return info_;
}

Result<FileStore::Writer> FileStore::create(std::string filename, std::string purpose, std::uint64_t max_bytes) {
  FileInfo info;
  info.id = random_id("file-");
  info.created_at = unix_now();
  info.filename = std::move(filename);
  info.purpose = std::move(purpose);
  auto opened = posix_file_system()->open_writable(content_path(info.id).string());
  if (!opened) return opened.error();
  return Writer(this, std::move(info), std::move(opened->file), max_bytes);
}

Status FileStore::write_metadata(const FileInfo& info) {
  // A client's file name may hold any bytes: invalid UTF-8 becomes U+FFFD.
  return write_file_atomically(dir_ / (info.id + ".json"), to_json(info).dump(-1, ' ', false, json::error_handler_t::replace));
}

std::optional<FileInfo> FileStore::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(id);
  if (it == files_.end()) return std::nullopt;
  return it->second;
}

std::vector<FileInfo> FileStore::list() const {
  std::vector<FileInfo> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, f] : files_) out.push_back(f);
  }
  std::sort(out.begin(), out.end(), [](const FileInfo& a, const FileInfo& b) {
    return std::pair(a.created_at, a.id) > std::pair(b.created_at, b.id);
  });
  return out;
}

fs::path FileStore::content_path(const std::string& id) const { return dir_ / (id + ".data"); }

Status FileStore::remove(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (files_.erase(id) == 0) return make_error(ErrorCode::not_found, "no such file: " + id);
  }
  std::error_code ec;
  fs::remove(dir_ / (id + ".json"), ec);  // the metadata first: without it the content is garbage
  if (ec) return make_error(ErrorCode::io, "cannot delete " + id + ": " + ec.message());
  fs::remove(content_path(id), ec);
  return {};
}

}  // namespace shardline::api
