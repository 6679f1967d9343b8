#pragma once
/// \file
/// Errors as values: `Error` (a code plus a human-readable message naming the
/// file / tensor / field at fault) and `Result<T>` (a value or an Error).
/// Used at every boundary that can fail on user input (model folders,
/// tokenizers, requests); nothing in Shardline throws across an actor boundary.

#include <string>
#include <utility>
#include <variant>

namespace shardline {

/// Broad error classes; the message carries the specifics.
enum class ErrorCode {
  invalid_argument,  ///< a flag or request parameter is out of range
  not_found,         ///< a file or tensor is missing
  unsupported,       ///< architecture / dtype / feature not implemented
  corrupt,           ///< file content is malformed (header, JSON, offsets)
  mismatch,          ///< dtype or shape disagrees with config.json
  out_of_memory,     ///< a budget (KV blocks, memory) cannot be met
  io,                ///< an OS-level read/write/mmap failure
  internal,          ///< a broken invariant inside Shardline
  disk_full,         ///< no space left on a disk (ENOSPC, EDQUOT) or a disk byte budget is spent: retry once space is back
};

/// Name of an error code, e.g. "corrupt".
[[nodiscard]] const char* error_code_name(ErrorCode code) noexcept;

struct Error {
  ErrorCode code = ErrorCode::internal;
  std::string message;

  /// "corrupt: model.safetensors: tensor 'x' ..." — what the CLI prints.
  [[nodiscard]] std::string to_string() const {
    return std::string(error_code_name(code)) + ": " + message;
  }
};

[[nodiscard]] inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message)};
}

/// A value of type T or an Error. Minimal std::expected stand-in (C++20).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  [[nodiscard]] T& value() & { return std::get<0>(v_); }
  [[nodiscard]] const T& value() const& { return std::get<0>(v_); }
  [[nodiscard]] T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }

  [[nodiscard]] const Error& error() const& { return std::get<1>(v_); }
  [[nodiscard]] Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

/// Result of an operation with no value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  [[nodiscard]] static Status ok_status() { return Status(); }
  [[nodiscard]] bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  [[nodiscard]] const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace shardline
