// How a plugin checks its vendor runtime's calls: CheckedRuntime turns a
// result into a Failure that names the call, its arguments and the
// runtime's own words ("cuMemAlloc_v2(bytesize = 4096) failed:
// CUDA_ERROR_OUT_OF_MEMORY (out of memory)"); RuntimeCall and CallArguments
// are what the kit's templates (stream_device.hpp, pinned_staging.hpp) ask a
// vendor to write such a call's text from, only once it has failed.
#pragma once

#include <devalloc/plugin_kit/error.hpp>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace devalloc::plugin {

// The base of a vendor's runtime table (Runtime, CRTP), which provides
// std::string describe(Result) const: "CUDA_ERROR_OUT_OF_MEMORY (out of
// memory)".
template <class Runtime, class Result, Result kSuccess, Result kOutOfMemory>
class CheckedRuntime {
 public:
  // Throws Failure unless result is kSuccess: "<call> failed:
  // <describe(result)>", the call printf-formatted; the status follows kind
  // (out of memory in an allocation, or DEVICE_ERROR).
  __attribute__((format(printf, 4, 5))) void check(Result result, CallKind kind,
                                                   const char* call_format, ...) const {
    if (result == kSuccess) return;
    va_list args;
    va_start(args, call_format);
    std::string call = vformat(call_format, args);
    va_end(args);
    raise(static_cast<int>(result), kind, std::move(call));
  }
  // check() of a failed result kept as an int (CallbackStream's), with the
  // call already written.
  [[noreturn]] void raise(int result, CallKind kind, std::string call) const {
    const auto failed = static_cast<Result>(result);
    raise_vendor_failure(kind, failed == kOutOfMemory,
                         static_cast<const Runtime&>(*this).describe(failed), std::move(call));
  }
  // How the runtime spells success, for require_memory().
  const char* success_name() const { return success_name_; }

 protected:
  explicit CheckedRuntime(const char* success_name) : success_name_(success_name) {}

 private:
  const char* success_name_;
};

// The runtime calls the kit's templates make through a vendor, so that the
// vendor writes each one's text in its runtime's words.
enum class RuntimeCall {
  memory_info,
  allocate,                 // nbytes: what is asked of the runtime
  free,                     // device: the runtime's base address
  copy_to_device,           // device: dst, host: src, nbytes
  bounded_wait,             // the wait before more than kCallbacksPerWait
                            // callbacks are queued (device, host, nbytes: the
                            // copy that waits)
  release,                  // the callback queued behind a copy to device
  wait_for_copy_to_device,  // the wait for a copy that the call waits out
  copy_to_host,             // device: src, host: dst, nbytes
  wait_for_copy_to_host,
  synchronize,
  allocate_host,  // nbytes
  free_host,      // host
};

struct CallArguments {
  uint64_t device = 0;
  const void* host = nullptr;
  uint64_t nbytes = 0;
};

// What a vendor's enter() returns: the runtime made to reach one device (a
// context pushed, a device made current) until the scope ends, when
// leave() (noexcept) undoes it; empty when entering failed (active()
// false), with nothing to undo.
template <class Leave>
class RuntimeScope {
 public:
  RuntimeScope() = default;
  explicit RuntimeScope(Leave leave) : leave_(std::move(leave)), active_(true) {}
  ~RuntimeScope() {
    if (active_) leave_();
  }
  RuntimeScope(const RuntimeScope&) = delete;
  RuntimeScope& operator=(const RuntimeScope&) = delete;

  bool active() const { return active_; }

 private:
  Leave leave_{};
  bool active_ = false;
};

// The scope of a runtime whose calls need no current device or context.
struct NoScope {
  bool active() const { return true; }
};

// A text that a runtime writes into a caller's char array (a device name, a
// PCI bus id): read(char* text, int capacity) fills it, and what it wrote
// is cut at capacity - 1 characters.
template <size_t kCapacity, class Read>
std::string read_text(Read&& read) {
  char text[kCapacity] = {};
  read(text, static_cast<int>(kCapacity));
  text[kCapacity - 1] = '\0';
  return text;
}

}  // namespace devalloc::plugin
