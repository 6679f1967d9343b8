#pragma once
// A rocksdb::FileSystem that loses what RocksDB did not sync, for crash tests
// of the JobStore. RocksDB's own FaultInjectionTestFS is not in the installed
// headers (librocksdb-dev 7.8), so this is a small one in its spirit:
//  - for every file written through it, it tracks the size at the last
//    Sync()/Fsync() (RangeSync() does not count);
//  - a file created (or renamed from one created) since the last fsync of
//    its folder has no durable name yet;
//  - simulate_crash() cuts every tracked file back to its synced size and
//    deletes the files without a durable name, or, where such a rename
//    replaced a file, puts the replaced file's content back (RocksDB swaps
//    CURRENT that way) — DropUnsyncedFileData and
//    DeleteFilesCreatedAfterLastDirSync of FaultInjectionTestFS.
// Mutating operations ask the shared CrashSwitch first (see
// fault_injection_fs.hpp): once the power is cut they fail with IOError and
// leave the disk untouched. Renames and deletes take effect at once (a legal
// outcome of a crash). Use it as JobStoreOptions::file_system; close the DB
// before simulate_crash().

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <rocksdb/file_system.h>
#include <rocksdb/io_status.h>

#include "tests/support/fault_injection_fs.hpp"

namespace shardline::testing_support {

class FaultInjectionRocksDbFs final : public rocksdb::FileSystemWrapper {
 public:
  explicit FaultInjectionRocksDbFs(std::shared_ptr<CrashSwitch> power,
                                   const std::shared_ptr<rocksdb::FileSystem>& base = rocksdb::FileSystem::Default())
      : rocksdb::FileSystemWrapper(base), power_(std::move(power)) {}

  const char* Name() const override { return "ShardlineFaultInjectionRocksDbFs"; }

  rocksdb::IOStatus NewWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    if (!power_->admit("rocksdb create " + fname)) return power_cut(fname);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus st = target()->NewWritableFile(fname, opts, &file, dbg);
    if (!st.ok()) return st;
    const std::string key = fault_fs_key(fname);
    {
      std::lock_guard lock(mu_);
      files_[key] = Sizes{};
      unsynced_names_[parent_directory(key)].emplace(key, std::nullopt);
    }
    *result = std::make_unique<File>(*this, key, std::move(file));
    return st;
  }

  rocksdb::IOStatus ReopenWritableFile(const std::string& fname, const rocksdb::FileOptions& opts,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override {
    const std::string key = fault_fs_key(fname);
    std::error_code ec;
    const bool exists = std::filesystem::exists(key, ec);
    if (exists ? power_->down() : !power_->admit("rocksdb create " + fname)) return power_cut(fname);
    std::unique_ptr<rocksdb::FSWritableFile> file;
    rocksdb::IOStatus st = target()->ReopenWritableFile(fname, opts, &file, dbg);
    if (!st.ok()) return st;
    {
      std::lock_guard lock(mu_);
      if (!exists) {
        files_[key] = Sizes{};
        unsynced_names_[parent_directory(key)].emplace(key, std::nullopt);
      } else if (files_.count(key) == 0) {
        const auto size = std::filesystem::file_size(key, ec);
        files_[key] = Sizes{ec ? 0 : size, ec ? 0 : size};  // there before: durable
      }
    }
    *result = std::make_unique<File>(*this, key, std::move(file));
    return st;
  }

  // Not used by the JobStore's options; refused rather than left untracked.
  rocksdb::IOStatus ReuseWritableFile(const std::string&, const std::string&, const rocksdb::FileOptions&,
                                      std::unique_ptr<rocksdb::FSWritableFile>*, rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("ReuseWritableFile (fault injection)");
  }
  rocksdb::IOStatus NewRandomRWFile(const std::string&, const rocksdb::FileOptions&,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>*, rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("NewRandomRWFile (fault injection)");
  }
  rocksdb::IOStatus LinkFile(const std::string&, const std::string&, const rocksdb::IOOptions&,
                             rocksdb::IODebugContext*) override {
    return rocksdb::IOStatus::NotSupported("LinkFile (fault injection)");
  }

  rocksdb::IOStatus NewDirectory(const std::string& name, const rocksdb::IOOptions& opts,
                                 std::unique_ptr<rocksdb::FSDirectory>* result,
                                 rocksdb::IODebugContext* dbg) override {
    if (power_->down()) return power_cut(name);
    std::unique_ptr<rocksdb::FSDirectory> dir;
    rocksdb::IOStatus st = target()->NewDirectory(name, opts, &dir, dbg);
    if (!st.ok()) return st;
    *result = std::make_unique<Directory>(*this, fault_fs_key(name), std::move(dir));
    return st;
  }

  rocksdb::IOStatus RenameFile(const std::string& src, const std::string& dst, const rocksdb::IOOptions& opts,
                               rocksdb::IODebugContext* dbg) override {
    if (!power_->admit("rocksdb rename " + src + " -> " + dst)) return power_cut(src);
    const std::string s = fault_fs_key(src), d = fault_fs_key(dst);
    std::error_code ec;
    std::optional<std::string> replaced;
    if (std::filesystem::exists(d, ec)) replaced = fault_fs_read(d);
    rocksdb::IOStatus st = target()->RenameFile(src, dst, opts, dbg);
    if (!st.ok()) return st;
    std::lock_guard lock(mu_);
    if (auto it = files_.find(s); it != files_.end()) {
      files_[d] = it->second;
      files_.erase(s);
    } else {
      files_.erase(d);  // an untracked file, there before: durable
    }
    const bool src_new = unsynced_names_[parent_directory(s)].erase(s) != 0;
    auto& names = unsynced_names_[parent_directory(d)];
    if (!src_new) names.erase(d);
    else if (names.count(d) == 0) names.emplace(d, std::move(replaced));
    // else: d itself was new; what a crash leaves of it stays as it was
    return st;
  }

  rocksdb::IOStatus DeleteFile(const std::string& fname, const rocksdb::IOOptions& opts,
                               rocksdb::IODebugContext* dbg) override {
    if (!power_->admit("rocksdb delete " + fname)) return power_cut(fname);
    rocksdb::IOStatus st = target()->DeleteFile(fname, opts, dbg);
    if (!st.ok()) return st;
    const std::string key = fault_fs_key(fname);
    std::lock_guard lock(mu_);
    files_.erase(key);
    unsynced_names_[parent_directory(key)].erase(key);
    return st;
  }

  rocksdb::IOStatus Truncate(const std::string& fname, size_t size, const rocksdb::IOOptions& opts,
                             rocksdb::IODebugContext* dbg) override {
    if (!power_->admit("rocksdb truncate " + fname)) return power_cut(fname);
    rocksdb::IOStatus st = target()->Truncate(fname, size, opts, dbg);
    if (st.ok()) resized(fault_fs_key(fname), size);
    return st;
  }

  rocksdb::IOStatus CreateDir(const std::string& d, const rocksdb::IOOptions& opts,
                              rocksdb::IODebugContext* dbg) override {
    if (!power_->admit("rocksdb mkdir " + d)) return power_cut(d);
    return target()->CreateDir(d, opts, dbg);
  }
  rocksdb::IOStatus CreateDirIfMissing(const std::string& d, const rocksdb::IOOptions& opts,
                                       rocksdb::IODebugContext* dbg) override {
    if (!power_->admit("rocksdb mkdir -p " + d)) return power_cut(d);
    return target()->CreateDirIfMissing(d, opts, dbg);
  }
  rocksdb::IOStatus DeleteDir(const std::string& d, const rocksdb::IOOptions& opts,
                              rocksdb::IODebugContext* dbg) override {
    if (!power_->admit("rocksdb rmdir " + d)) return power_cut(d);
    return target()->DeleteDir(d, opts, dbg);
  }

  /// The crash itself; call after the DB is closed.
  void simulate_crash() {
    std::lock_guard lock(mu_);
    std::error_code ec;
    for (auto& [key, sizes] : files_) {
      if (std::filesystem::exists(key, ec)) std::filesystem::resize_file(key, sizes.synced, ec);
      sizes.size = sizes.synced;
    }
    for (const auto& [dir, names] : unsynced_names_) {
      for (const auto& [name, replaced] : names) {
        if (!replaced) {
          std::filesystem::remove(name, ec);
          files_.erase(name);
          continue;
        }
        std::ofstream(name, std::ios::binary | std::ios::trunc) << *replaced;
        files_[name] = Sizes{replaced->size(), replaced->size()};
      }
    }
    unsynced_names_.clear();
  }

 private:
  struct Sizes {
    std::uint64_t size = 0;    ///< bytes written
    std::uint64_t synced = 0;  ///< bytes durable
  };

  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(FaultInjectionRocksDbFs& fs, std::string key, std::unique_ptr<rocksdb::FSWritableFile> base)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(base)), fs_(fs), key_(std::move(key)) {}

    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& opts,
                             rocksdb::IODebugContext* dbg) override {
      if (!fs_.power_->admit("rocksdb append " + key_)) return power_cut(key_);
      rocksdb::IOStatus st = target()->Append(data, opts, dbg);
      if (st.ok()) fs_.appended(key_, data.size());
      return st;
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& opts,
                             const rocksdb::DataVerificationInfo& info, rocksdb::IODebugContext* dbg) override {
      if (!fs_.power_->admit("rocksdb append " + key_)) return power_cut(key_);
      rocksdb::IOStatus st = target()->Append(data, opts, info, dbg);
      if (st.ok()) fs_.appended(key_, data.size());
      return st;
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset, const rocksdb::IOOptions& opts,
                                       rocksdb::IODebugContext* dbg) override {
      if (!fs_.power_->admit("rocksdb write " + key_)) return power_cut(key_);
      rocksdb::IOStatus st = target()->PositionedAppend(data, offset, opts, dbg);
      if (st.ok()) fs_.written_to(key_, offset + data.size());
      return st;
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset, const rocksdb::IOOptions& opts,
                                       const rocksdb::DataVerificationInfo& info,
                                       rocksdb::IODebugContext* dbg) override {
      if (!fs_.power_->admit("rocksdb write " + key_)) return power_cut(key_);
      rocksdb::IOStatus st = target()->PositionedAppend(data, offset, opts, info, dbg);
      if (st.ok()) fs_.written_to(key_, offset + data.size());
      return st;
    }
    rocksdb::IOStatus Truncate(uint64_t size, const rocksdb::IOOptions& opts, rocksdb::IODebugContext* dbg) override {
      if (!fs_.power_->admit("rocksdb truncate " + key_)) return power_cut(key_);
      rocksdb::IOStatus st = target()->Truncate(size, opts, dbg);
      if (st.ok()) fs_.resized(key_, size);
      return st;
    }
    rocksdb::IOStatus Flush(const rocksdb::IOOptions& opts, rocksdb::IODebugContext* dbg) override {
      if (fs_.power_->down()) return power_cut(key_);
      return target()->Flush(opts, dbg);
    }
    // Simulated: what was written so far becomes durable; the disk is not asked.
    rocksdb::IOStatus Sync(const rocksdb::IOOptions&, rocksdb::IODebugContext*) override { return sync(); }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions&, rocksdb::IODebugContext*) override { return sync(); }
    rocksdb::IOStatus RangeSync(uint64_t, uint64_t, const rocksdb::IOOptions&, rocksdb::IODebugContext*) override {
      if (fs_.power_->down()) return power_cut(key_);
      return rocksdb::IOStatus::OK();  // not a durability point
    }

   private:
    rocksdb::IOStatus sync() {
      if (!fs_.power_->admit("rocksdb sync " + key_)) return power_cut(key_);
      fs_.synced(key_);
      return rocksdb::IOStatus::OK();
    }
    FaultInjectionRocksDbFs& fs_;
    std::string key_;
  };

  class Directory final : public rocksdb::FSDirectory {
   public:
    Directory(FaultInjectionRocksDbFs& fs, std::string key, std::unique_ptr<rocksdb::FSDirectory> base)
        : fs_(fs), key_(std::move(key)), base_(std::move(base)) {}
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions&, rocksdb::IODebugContext*) override {
      if (!fs_.power_->admit("rocksdb sync folder " + key_)) return power_cut(key_);
      std::lock_guard lock(fs_.mu_);
      fs_.unsynced_names_.erase(key_);
      return rocksdb::IOStatus::OK();
    }
    rocksdb::IOStatus Close(const rocksdb::IOOptions& opts, rocksdb::IODebugContext* dbg) override {
      return base_->Close(opts, dbg);
    }
    size_t GetUniqueId(char* id, size_t max_size) const override { return base_->GetUniqueId(id, max_size); }

   private:
    FaultInjectionRocksDbFs& fs_;
    std::string key_;
    std::unique_ptr<rocksdb::FSDirectory> base_;
  };

  static rocksdb::IOStatus power_cut(const std::string& what) {
    return rocksdb::IOStatus::IOError(what, "simulated power cut");
  }
  void appended(const std::string& key, std::uint64_t n) {
    std::lock_guard lock(mu_);
    files_[key].size += n;
  }
  void written_to(const std::string& key, std::uint64_t end) {
    std::lock_guard lock(mu_);
    auto& s = files_[key];
    if (end > s.size) s.size = end;
  }
  void resized(const std::string& key, std::uint64_t size) {
    std::lock_guard lock(mu_);
    auto& s = files_[key];
    s.size = size;
    if (s.synced > size) s.synced = size;
  }
  void synced(const std::string& key) {
    std::lock_guard lock(mu_);
    auto& s = files_[key];
    s.synced = s.size;
  }

  std::shared_ptr<CrashSwitch> power_;
  std::mutex mu_;
  std::map<std::string, Sizes> files_;  ///< files written through this layer
  /// folder → names made since its fsync → the content of the file a rename
  /// over that name replaced (nullopt: none).
  std::map<std::string, std::map<std::string, std::optional<std::string>>> unsynced_names_;
};

}  // namespace shardline::testing_support
