#pragma once
// Simulated power cuts for tests, in the spirit of RocksDB's
// FaultInjectionTestFS:
//  - CrashSwitch: the power switch of one simulated machine, shared by its
//    fault-injecting file systems. It counts their mutating operations and,
//    when armed, cuts the power just before the n-th: that operation and
//    every later one fail with an I/O error and leave the disk untouched.
//  - FaultInjectionFileSystem: a shardline::FileSystem (common/file_system.hpp)
//    over the real files that remembers what was made durable (a file's bytes
//    at its last sync(); a name once its folder was synced) and, at
//    simulate_crash(), throws away everything else.
// The RocksDB counterpart is tests/support/fault_injection_rocksdb_fs.hpp.
//
// Syncs are simulated only (no fdatasync reaches the disk): the real machine
// does not crash during a test, and thousands of crash points stay fast.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

#include "common/file_system.hpp"
#include "common/result.hpp"

namespace shardline::testing_support {

class CrashSwitch {
 public:
  /// Cuts the power just before mutating operation number `op` (1-based,
  /// counted from the last power_on()); 0: never.
  void crash_before(std::uint64_t op) {
    std::lock_guard lock(mu_);
    crash_at_ = op;
  }
  /// Asked by a fault-injecting file system before each mutating operation
  /// (`what`: "write /path", for messages): false when the power is (now)
  /// off, and then the operation must not run. With SHARDLINE_FAULT_TRACE set
  /// in the environment every operation is printed to stderr.
  [[nodiscard]] bool admit(std::string_view what) {
    std::lock_guard lock(mu_);
    if (down_) return false;
    ++ops_;
    if (std::getenv("SHARDLINE_FAULT_TRACE") != nullptr)
      std::fprintf(stderr, "fault op %llu: %.*s\n", static_cast<unsigned long long>(ops_),
                   static_cast<int>(what.size()), what.data());
    if (crash_at_ != 0 && ops_ >= crash_at_) {
      down_ = true;
      cut_before_ = std::string(what);
      return false;
    }
    return true;
  }
  /// The operation the cut refused ("" while the power is on).
  [[nodiscard]] std::string cut_before() const {
    std::lock_guard lock(mu_);
    return cut_before_;
  }
  [[nodiscard]] bool down() const {
    std::lock_guard lock(mu_);
    return down_;
  }
  /// Mutating operations admitted (plus the one the cut refused).
  [[nodiscard]] std::uint64_t ops() const {
    std::lock_guard lock(mu_);
    return ops_;
  }
  /// Power back on, counter at 0, not armed.
  void power_on() {
    std::lock_guard lock(mu_);
    down_ = false;
    ops_ = 0;
    crash_at_ = 0;
    cut_before_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::uint64_t ops_ = 0;
  std::uint64_t crash_at_ = 0;
  bool down_ = false;
  std::string cut_before_;
};

/// What a crash does to the bytes written since a file's last sync.
enum class UnsyncedData {
  drop,  ///< the file is cut back to its synced content (FaultInjectionTestFS)
  zero,  ///< the size survives, the unsynced bytes read as zeros (a file
         ///< system that journals the size before the data: ext4 data=writeback)
};

/// "/abs/normal/path" of `path`, the key of every map below.
inline std::string fault_fs_key(const std::string& path) {
  std::error_code ec;
  auto p = std::filesystem::absolute(path, ec);
  if (ec) p = path;
  return p.lexically_normal().string();
}

inline std::string fault_fs_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class FaultInjectionFileSystem final : public FileSystem {
 public:
  explicit FaultInjectionFileSystem(std::shared_ptr<CrashSwitch> power,
                                    std::shared_ptr<FileSystem> base = posix_file_system())
      : power_(std::move(power)), base_(std::move(base)) {}

  Result<OpenedFile> open_writable(const std::string& path) override {
    const std::string key = fault_fs_key(path);
    std::error_code ec;
    const bool exists = std::filesystem::exists(key, ec);
    if (exists ? power_->down() : !power_->admit("create " + key)) return power_cut("open", path);
    auto opened = base_->open_writable(path);
    if (!opened.ok()) return opened;
    std::lock_guard lock(mu_);
    if (opened->created) {
      durable_[key] = "";  // once its name is durable the file exists, empty
      unsynced_names_[parent_directory(key)].insert(key);
    } else if (durable_.count(key) == 0) {
      durable_[key] = fault_fs_read(key);  // there before this file system: durable
    }
    return OpenedFile{std::make_unique<File>(*this, key, std::move(opened->file)), opened->created};
  }

  Result<bool> make_directory(const std::string& path) override {
    const std::string key = fault_fs_key(path);
    std::error_code ec;
    if (std::filesystem::is_directory(key, ec)) {
      if (power_->down()) return power_cut("mkdir", path);
      return false;
    }
    if (!power_->admit("mkdir " + key)) return power_cut("mkdir", path);
    auto made = base_->make_directory(path);
    if (made.ok() && *made) {
      std::lock_guard lock(mu_);
      unsynced_names_[parent_directory(key)].insert(key);
    }
    return made;
  }

  Status sync_dir(const std::string& path) override {
    if (!power_->admit("sync folder " + fault_fs_key(path))) return power_cut("sync folder", path);
    std::lock_guard lock(mu_);
    unsynced_names_.erase(fault_fs_key(path));
    return Status::ok_status();
  }

  /// The crash itself; call once the code under test let go of its files.
  /// Removes every file and folder whose name was not made durable (with what
  /// is in it), and sets every other file it wrote back to its synced content
  /// (UnsyncedData::drop) or to that content followed by zeros up to its
  /// current size (UnsyncedData::zero). Everything left counts as durable.
  void simulate_crash(UnsyncedData mode) {
    std::lock_guard lock(mu_);
    std::error_code ec;
    for (const auto& [dir, names] : unsynced_names_) {
      for (const auto& name : names) {
        std::filesystem::remove_all(name, ec);
        for (auto it = durable_.begin(); it != durable_.end();) {
          if (it->first == name || it->first.starts_with(name + "/")) it = durable_.erase(it);
          else ++it;
        }
      }
    }
    unsynced_names_.clear();
    for (auto it = durable_.begin(); it != durable_.end();) {
      if (!std::filesystem::exists(it->first, ec)) {
        it = durable_.erase(it);
        continue;
      }
      std::string content = it->second;
      const auto size = std::filesystem::file_size(it->first, ec);
      if (mode == UnsyncedData::zero && !ec && size > content.size()) content.resize(size, '\0');
      std::ofstream(it->first, std::ios::binary | std::ios::trunc) << content;
      it->second = std::move(content);
      ++it;
    }
  }

 private:
  class File final : public WritableFile {
   public:
    File(FaultInjectionFileSystem& fs, std::string key, std::unique_ptr<WritableFile> base)
        : fs_(fs), key_(std::move(key)), base_(std::move(base)) {}
    Status write_at(std::uint64_t offset, std::string_view data) override {
      if (!fs_.power_->admit("write " + key_)) return power_cut("write", key_);
      return base_->write_at(offset, data);
    }
    Status truncate(std::uint64_t size) override {
      if (!fs_.power_->admit("truncate " + key_)) return power_cut("truncate", key_);
      return base_->truncate(size);
    }
    Status sync() override {
      if (!fs_.power_->admit("sync " + key_)) return power_cut("sync", key_);
      std::lock_guard lock(fs_.mu_);
      fs_.durable_[key_] = fault_fs_read(key_);
      return Status::ok_status();
    }
    Result<std::uint64_t> size() override {
      if (fs_.power_->down()) return power_cut("stat", key_);
      return base_->size();
    }
    Result<std::size_t> read_at(std::uint64_t offset, std::span<char> out) override {
      if (fs_.power_->down()) return power_cut("read", key_);
      return base_->read_at(offset, out);
    }

   private:
    FaultInjectionFileSystem& fs_;
    std::string key_;
    std::unique_ptr<WritableFile> base_;
  };

  static Error power_cut(const std::string& what, const std::string& path) {
    return make_error(ErrorCode::io, what + " " + path + ": simulated power cut");
  }

  std::shared_ptr<CrashSwitch> power_;
  std::shared_ptr<FileSystem> base_;
  std::mutex mu_;
  std::map<std::string, std::string> durable_;  ///< file → its content at the last sync
  std::map<std::string, std::set<std::string>> unsynced_names_;  ///< folder → names made since its sync
};

}  // namespace shardline::testing_support
