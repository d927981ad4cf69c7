#include <devalloc/status.hpp>

#include <cerrno>
#include <cstdio>

namespace devalloc {

const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::out_of_device_memory: return "out_of_device_memory";
    case StatusCode::out_of_host_memory: return "out_of_host_memory";
    case StatusCode::no_such_device: return "no_such_device";
    case StatusCode::runtime_unavailable: return "runtime_unavailable";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::device_error: return "device_error";
    case StatusCode::internal: return "internal";
    case StatusCode::not_found: return "not_found";
    case StatusCode::permission_denied: return "permission_denied";
    case StatusCode::io_error: return "io_error";
    case StatusCode::data_loss: return "data_loss";
  }
  return "unknown";
}

StatusCode status_code_from_errno(int error) {
  switch (error) {
    case ENOENT:
    case ENOTDIR:
      return StatusCode::not_found;
    case EACCES:
    case EPERM:
    case EROFS:
      return StatusCode::permission_denied;
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return StatusCode::out_of_host_memory;
    case EIO:
    case ENXIO:
    case ENODEV:
    case ESTALE:
    case ETIMEDOUT:
      return StatusCode::io_error;
    default:
      return StatusCode::invalid_argument;
  }
}

StatusCode status_code_from_abi(devalloc_status status) {
  if (status < DEVALLOC_STATUS_OK || status > DEVALLOC_STATUS_INTERNAL) {
    return StatusCode::internal;
  }
  return static_cast<StatusCode>(status);
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace devalloc
