#include "kvstore/host_kv_store.hpp"

namespace shardline::kvstore {

Status HostKvStore::put(const std::string& key, std::string data) {
  if (key.empty()) return make_error(ErrorCode::invalid_argument, "kv store: empty key");
  const auto it = blobs_.find(key);
  const std::uint64_t old = it == blobs_.end() ? 0 : it->second.size();
  if (used_ - old + data.size() > capacity_)
    return make_error(ErrorCode::out_of_memory,
                      "kv store: '" + key + "' (" + std::to_string(data.size()) + " bytes) exceeds the capacity of " +
                          std::to_string(capacity_) + " bytes (" + std::to_string(used_ - old) + " in use)");
  used_ = used_ - old + data.size();
  blobs_[key] = std::move(data);
  return Status::ok_status();
}

const std::string* HostKvStore::get(const std::string& key) const {
  const auto it = blobs_.find(key);
  return it == blobs_.end() ? nullptr : &it->second;
}

bool HostKvStore::drop(const std::string& key) {
  const auto it = blobs_.find(key);
  if (it == blobs_.end()) return false;
  used_ -= it->second.size();
  blobs_.erase(it);
  return true;
}

HostKvStats HostKvStore::stats() const { return HostKvStats{blobs_.size(), used_, capacity_}; }

}  // namespace shardline::kvstore
