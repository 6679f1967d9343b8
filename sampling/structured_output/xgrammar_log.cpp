// xgrammar's log sink (see xgrammar_log.hpp). Compiled into the xgrammar
// library target (cmake/xgrammar.cmake), so that every xgrammar object
// finds these definitions.
#include "sampling/structured_output/xgrammar_log.hpp"

#include <cstdio>
#include <stdexcept>
#include <string>

namespace shardline::sampling::detail {
namespace {
thread_local WarningCapture* open_capture = nullptr;
}  // namespace

WarningCapture::WarningCapture() : previous_(open_capture) { open_capture = this; }
WarningCapture::~WarningCapture() { open_capture = previous_; }

bool WarningCapture::record(const std::string& message) {
  if (open_capture == nullptr) return false;
  open_capture->warnings_.push_back(message);
  return true;
}

}  // namespace shardline::sampling::detail

namespace xgrammar {

// Levels as xgrammar's support/logging.h numbers them.
constexpr int kLogLevelWarning = 2;

[[noreturn]] void LogFatalImpl(const std::string& file, int lineno, const std::string& message) {
  (void)file;
  (void)lineno;
  throw std::runtime_error(message);
}

void LogMessageImpl(const std::string& file, int lineno, int level, const std::string& message) {
  if (level < kLogLevelWarning) return;  // info and debug: not ours to print
  if (shardline::sampling::detail::WarningCapture::record(message)) return;
  std::fprintf(stderr, "[xgrammar] %s:%d: %s\n", file.c_str(), lineno, message.c_str());
}

}  // namespace xgrammar
