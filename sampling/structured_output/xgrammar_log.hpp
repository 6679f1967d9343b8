#pragma once
/// \file
/// Private to sampling/structured_output/: xgrammar's log, captured. Built
/// with XGRAMMAR_LOG_CUSTOMIZE=1 (cmake/xgrammar.cmake), xgrammar calls
/// xgrammar::LogFatalImpl and xgrammar::LogMessageImpl, defined in
/// xgrammar_log.cpp (compiled into the xgrammar library): a fatal message
/// throws std::runtime_error with it (xgrammar's own behaviour), and a
/// warning goes to the calling thread's WarningCapture when one is open,
/// else to stderr. xgrammar warns when it compiles a schema but ignores part
/// of it ("Keyword allOf is not supported", "ignoring multipleOf", ...): a
/// grammar that would let through outputs outside the schema, which
/// GrammarCompiler refuses.

#include <string>
#include <vector>

namespace shardline::sampling::detail {

/// Collects the warnings xgrammar logs on this thread while it lives.
class WarningCapture {
 public:
  WarningCapture();
  ~WarningCapture();
  WarningCapture(const WarningCapture&) = delete;
  WarningCapture& operator=(const WarningCapture&) = delete;
  [[nodiscard]] const std::vector<std::string>& warnings() const { return warnings_; }
  /// Called by LogMessageImpl: adds `message` to the open capture of this
  /// thread; false when none is open.
  static bool record(const std::string& message);

 private:
  WarningCapture* previous_ = nullptr;
  std::vector<std::string> warnings_;
};

}  // namespace shardline::sampling::detail
