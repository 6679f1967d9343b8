#pragma once
/// \file
/// The line `shardline run`'s progress bar owns on stderr, shared with the
/// log (issue 46, item 15: a warning was printed into the bar's line). A log
/// line written while the bar shows first clears the bar's line (on a
/// terminal; elsewhere it starts a new line), is written whole, and the bar
/// is drawn again below it. ProgressLogSink routes spdlog through it.

#include <spdlog/sinks/base_sink.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace shardline::cli {

class ProgressLine {
 public:
  /// Writes to `out` (not owned). `terminal`: clear lines with ANSI "erase
  /// line" (a TTY); else a log line after the bar starts with '\n'.
  ProgressLine(std::FILE* out, bool terminal);

  /// Shows `bar` (one line, no newline) in place of the previous one.
  void draw(const std::string& bar);
  /// Ends the bar's line with '\n'; later logs print as usual.
  void finish();
  /// Writes a log line (`line` ends with '\n') above the bar.
  void write_log(std::string_view line);

 private:
  std::mutex mu_;
  std::FILE* out_;
  bool terminal_;
  std::string bar_;    ///< what is shown; "" = nothing
};

/// An spdlog sink that writes each formatted message through a ProgressLine.
class ProgressLogSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ProgressLogSink(std::shared_ptr<ProgressLine> line) : line_(std::move(line)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  std::shared_ptr<ProgressLine> line_;
};

}  // namespace shardline::cli
