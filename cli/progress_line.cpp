#include "cli/progress_line.hpp"

namespace shardline::cli {

ProgressLine::ProgressLine(std::FILE* out, bool terminal) : out_(out), terminal_(terminal) {}

void ProgressLine::draw(const std::string& bar) {
  std::lock_guard lock(mu_);
  std::fprintf(out_, "\r%s%s", terminal_ ? "\x1b[2K" : "", bar.c_str());
  std::fflush(out_);
  bar_ = bar;
}

void ProgressLine::finish() {
  std::lock_guard lock(mu_);
  if (!bar_.empty()) std::fputc('\n', out_);
  std::fflush(out_);
  bar_.clear();
}

void ProgressLine::write_log(std::string_view line) {
  std::lock_guard lock(mu_);
  if (!bar_.empty()) std::fputs(terminal_ ? "\r\x1b[2K" : "\n", out_);
  std::fwrite(line.data(), 1, line.size(), out_);
  if (!bar_.empty()) std::fprintf(out_, "\r%s", bar_.c_str());
  std::fflush(out_);
}

void ProgressLogSink::sink_it_(const spdlog::details::log_msg& msg) {
  spdlog::memory_buf_t formatted;
  formatter_->format(msg, formatted);
  line_->write_log(std::string_view(formatted.data(), formatted.size()));
}

}  // namespace shardline::cli
