// The run progress bar owns its line (issue 46, item 15): a log line written
// while the bar shows starts on a line of its own, is written whole, and the
// bar comes back below it; on a terminal the bar's line is erased first.

#include "cli/progress_line.hpp"

#include <gtest/gtest.h>
#include <spdlog/logger.h>

#include <cstdio>
#include <string>

namespace shardline::cli {
namespace cli_progress_line_test {

/// What `fn` writes through a ProgressLine on a temporary file.
template <typename Fn>
std::string written(bool terminal, Fn&& fn) {
  std::FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  {
    auto line = std::make_shared<ProgressLine>(f, terminal);
    fn(line);
  }
  std::rewind(f);
  std::string out;
  for (int c; (c = std::fgetc(f)) != EOF;) out.push_back(static_cast<char>(c));
  std::fclose(f);
  return out;
}

TEST(ProgressLine, ALogLineNeverLandsInsideTheBar) {
  const auto plain = written(false, [](const std::shared_ptr<ProgressLine>& line) {
    line->draw("[#   ] 1/4");
    line->write_log("[warning] worker missed its heartbeats\n");
    line->draw("[##  ] 2/4");
    line->finish();
    line->write_log("after\n");
  });
  EXPECT_EQ(plain, "\r[#   ] 1/4\n[warning] worker missed its heartbeats\n\r[#   ] 1/4\r[##  ] 2/4\nafter\n");
  const auto tty = written(true, [](const std::shared_ptr<ProgressLine>& line) {
    line->draw("[#   ] 1/4");
    line->write_log("[warning] x\n");
    line->finish();
  });
  EXPECT_EQ(tty, "\r\x1b[2K[#   ] 1/4\r\x1b[2K[warning] x\n\r[#   ] 1/4\n");
  // Without a bar, logs are written as they are.
  EXPECT_EQ(written(false, [](const auto& line) { line->write_log("a\n"); }), "a\n");
}

TEST(ProgressLine, SpdlogWritesThroughTheSink) {
  const auto out = written(false, [](const std::shared_ptr<ProgressLine>& line) {
    auto sink = std::make_shared<ProgressLogSink>(line);
    sink->set_pattern("[%l] %v");
    spdlog::logger logger("test", sink);
    line->draw("BAR");
    logger.warn("disk {}", "full");
    line->finish();
  });
  EXPECT_EQ(out, "\rBAR\n[warning] disk full\n\rBAR\n");
}

}  // namespace
}  // namespace shardline::cli
