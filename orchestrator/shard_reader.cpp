#include "orchestrator/shard_reader.hpp"

#include <algorithm>
#include <cstring>

#include "orchestrator/batch_format.hpp"

namespace shardline::orchestrator {

ShardReader::ShardReader(std::vector<std::string> paths, std::uint64_t max_line_bytes, LineIndex* index)
    : paths_(std::move(paths)), max_line_bytes_(max_line_bytes), index_(index) {}

Status ShardReader::open_shard(std::size_t shard, std::uint64_t byte_offset) {
  block_.clear();
  block_pos_ = 0;
  block_offset_ = byte_offset;
  if (in_.is_open() && shard_ == shard) {  // the same shard: a seek, not a new open
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(byte_offset));
    return Status::ok_status();
  }
  in_.close();
  in_.clear();
  shard_ = shard;
  in_.open(paths_[shard_], std::ios::binary);
  if (!in_.is_open()) return make_error(ErrorCode::not_found, "input shard " + paths_[shard_] + ": cannot open");
  if (byte_offset != 0) in_.seekg(static_cast<std::streamoff>(byte_offset));
  return Status::ok_status();
}

bool ShardReader::read_line(std::string& line) {
  constexpr std::size_t kBlockBytes = 64 * 1024;
  line.clear();
  line_bytes_ = 0;
  too_long_ = false;
  bool any = false;
  for (;;) {
    if (block_pos_ >= block_.size()) {
      block_offset_ += block_.size();
      block_.resize(kBlockBytes);
      in_.read(block_.data(), static_cast<std::streamsize>(block_.size()));
      block_.resize(static_cast<std::size_t>(in_.gcount()));
      block_pos_ = 0;
      if (block_.empty()) return any;  // end of the shard (a last line without '\n' ends here)
    }
    any = true;
    const char* begin = block_.data() + block_pos_;
    const std::size_t avail = block_.size() - block_pos_;
    const auto* nl = static_cast<const char*>(std::memchr(begin, '\n', avail));
    const std::size_t n = nl != nullptr ? static_cast<std::size_t>(nl - begin) : avail;
    line_bytes_ += n;
    if (max_line_bytes_ != 0 && line_bytes_ > max_line_bytes_) {
      too_long_ = true;
      std::string().swap(line);  // never hold more than the limit
    } else {
      line.append(begin, n);
    }
    block_pos_ += n + (nl != nullptr ? 1 : 0);
    if (nl != nullptr) return true;
  }
}

Result<bool> ShardReader::next(std::string& line) {
  while (!done_) {
    if (!in_.is_open()) {
      if (shard_ >= paths_.size()) {
        done_ = true;
        break;
      }
      if (Status st = open_shard(shard_, 0); !st) return st.error();
      file_line_ = 0;
    }
    const LineCheckpoint here{shard_, block_offset_ + block_pos_, file_line_};
    if (read_line(line)) {
      ++raw_lines_read_;
      ++file_line_;
      if (!too_long_) {
        if (is_blank_line(line)) continue;
        if (!line.empty() && line.back() == '\r') {
          line.pop_back();
          --line_bytes_;
        }
      }
      // `here` is where line next_index_ starts.
      last_start_ = here;
      if (index_ != nullptr && next_index_ % LineIndex::kStride == 0 &&
          index_->checkpoints.size() == next_index_ / LineIndex::kStride)
        index_->checkpoints.push_back(here);
      ++next_index_;
      return true;
    }
    if (in_.bad()) return make_error(ErrorCode::io, "input shard " + paths_[shard_] + ": read error");
    in_.close();
    ++shard_;
  }
  return false;
}

Status ShardReader::seek_to(std::uint64_t line_index, const LineCheckpoint& where) {
  if (where.shard >= paths_.size())
    return make_error(ErrorCode::invalid_argument, "line " + std::to_string(line_index) + ": shard " +
                                                       std::to_string(where.shard) + " of " +
                                                       std::to_string(paths_.size()));
  done_ = false;
  too_long_ = false;
  line_bytes_ = 0;
  // In the block read last (up to its end, where reading on continues):
  // no new read; else a seek, or an open of another shard.
  if (in_.is_open() && shard_ == where.shard && where.byte_offset >= block_offset_ &&
      where.byte_offset <= block_offset_ + block_.size()) {
    block_pos_ = static_cast<std::size_t>(where.byte_offset - block_offset_);
  } else if (Status st = open_shard(where.shard, where.byte_offset); !st) {
    return st;
  }
  next_index_ = line_index;
  file_line_ = where.file_line;
  return Status::ok_status();
}

Status ShardReader::seek_near(std::uint64_t line_index) {
  const std::size_t recorded = index_ == nullptr ? 0 : index_->checkpoints.size();
  const std::uint64_t near =
      recorded == 0 ? 0 : std::min<std::uint64_t>(line_index / LineIndex::kStride, recorded - 1) * LineIndex::kStride;
  if (!done_ && next_index_ <= line_index && near <= next_index_) return Status::ok_status();  // read on
  done_ = false;
  too_long_ = false;
  line_bytes_ = 0;
  if (recorded == 0) {
    in_.close();
    shard_ = 0;
    next_index_ = 0;
    file_line_ = 0;
    return Status::ok_status();
  }
  const LineCheckpoint& c = index_->checkpoints[static_cast<std::size_t>(near / LineIndex::kStride)];
  if (Status st = open_shard(c.shard, c.byte_offset); !st) return st;
  next_index_ = near;
  file_line_ = c.file_line;
  return Status::ok_status();
}

}  // namespace shardline::orchestrator
