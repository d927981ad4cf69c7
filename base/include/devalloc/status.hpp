// Status and Result<T>: how devalloc's C++ layers report failure without
// exceptions at module boundaries.
//
// A caller that would rather have an exception than test ok() calls
// Result<T>::value() (or -> or *) directly: on a Result that holds an error
// it throws devalloc::Error, whose what() is the Status message, so that
//   auto config = devalloc::read_config("devalloc.toml").value();
// ends, uncaught, with "devalloc.toml: cannot open: No such file or
// directory" rather than std::bad_variant_access.
#pragma once

#include <devalloc/plugin_abi.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace devalloc {

// Mirrors the ABI's closed status set.
enum class StatusCode : int32_t {
  ok = DEVALLOC_STATUS_OK,
  invalid_argument = DEVALLOC_STATUS_INVALID_ARGUMENT,
  out_of_device_memory = DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
  out_of_host_memory = DEVALLOC_STATUS_OUT_OF_HOST_MEMORY,
  no_such_device = DEVALLOC_STATUS_NO_SUCH_DEVICE,
  runtime_unavailable = DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
  unsupported = DEVALLOC_STATUS_UNSUPPORTED,
  device_error = DEVALLOC_STATUS_DEVICE_ERROR,
  internal = DEVALLOC_STATUS_INTERNAL,
  // The host's own failures, which no plugin returns (outside the ABI's
  // range): a file that is not there, one the process may not open, a read
  // that failed, and data lost (a file cut short while it was read).
  not_found = 100,
  permission_denied = 101,
  io_error = 102,
  data_loss = 103,
};

// The code of a failed open(2), read(2) or stat(2): not_found for ENOENT
// and ENOTDIR, permission_denied for EACCES, EPERM and EROFS,
// out_of_host_memory for EMFILE, ENFILE and ENOMEM, io_error for EIO and
// the like; invalid_argument for the rest (a folder, a FIFO, a loop).
StatusCode status_code_from_errno(int error);

// "out_of_device_memory", ...; "unknown" for values outside the set.
const char* to_string(StatusCode code);

// An ABI status as a StatusCode; unknown values become internal.
StatusCode status_code_from_abi(devalloc_status status);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // A copy whose message is "context: message".
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

// What Result<T>::value() throws for a Result that holds an error: what()
// is the Status message, status() the whole Status (code included).
class Error : public std::runtime_error {
 public:
  explicit Error(Status status)
      : std::runtime_error(status.message()), status_(std::move(status)) {}
  const Status& status() const noexcept { return status_; }

 private:
  Status status_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                    // NOLINT
  Result(Status status) : v_(std::move(status)) {}             // NOLINT

  bool ok() const { return v_.index() == 0; }
  // The value; throws devalloc::Error carrying the Status when !ok().
  T& value() & {
    throw_unless_ok();
    return std::get<0>(v_);
  }
  const T& value() const& {
    throw_unless_ok();
    return std::get<0>(v_);
  }
  T&& value() && {
    throw_unless_ok();
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  // The failure; an ok Status when the result holds a value.
  Status status() const { return ok() ? Status() : std::get<1>(v_); }

 private:
  void throw_unless_ok() const {
    if (!ok()) throw Error(std::get<1>(v_));
  }

  std::variant<T, Status> v_;
};

}  // namespace devalloc
