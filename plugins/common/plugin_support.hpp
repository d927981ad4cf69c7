// Shared glue for devalloc's own plugins: error text, option parsing,
// version negotiation, the exception barrier and allocation bookkeeping.
// Compiled into each plugin (static, hidden); never part of the ABI.
#pragma once

#include <devalloc/plugin_abi.h>

#include <cstdarg>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace devalloc::plugin {

// Writes a printf-style message into a caller-owned error (if any) and
// returns status, so that failures read `return fail(error, STATUS, ...)`.
devalloc_status fail(devalloc_error* error, devalloc_status status,
                     const char* format, ...)
    __attribute__((format(printf, 3, 4)));

// printf into a std::string, any length.
std::string format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string vformat(const char* format, va_list args);

// Thrown inside a plugin to leave through guard() with a status.
struct Failure {
  devalloc_status status;
  std::string message;
};

// Runs body, turning Failure, std::bad_alloc and any other exception into a
// status and message: no exception crosses the ABI.
template <class Body>
devalloc_status guard(devalloc_error* error, Body&& body) noexcept {
  try {
    return std::forward<Body>(body)();
  } catch (const Failure& f) {
    return fail(error, f.status, "%s", f.message.c_str());
  } catch (const std::bad_alloc&) {
    return fail(error, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY,
                "out of host memory");
  } catch (const std::exception& e) {
    return fail(error, DEVALLOC_STATUS_INTERNAL, "internal error: %s",
                e.what());
  } catch (...) {
    return fail(error, DEVALLOC_STATUS_INTERNAL, "internal error");
  }
}

// True when a struct handed in by the host is at least `needed` bytes.
inline bool has_size(const void* p, size_t struct_size, size_t needed) {
  return p != nullptr && struct_size >= needed;
}

// The standard negotiation of a plugin that speaks major 1 only.
devalloc_status negotiate_v1(devalloc_negotiation* negotiation,
                             devalloc_error* error,
                             const devalloc_plugin_api_v1* api);

// Key/value options from create(); every key must be consumed.
class Options {
 public:
  // Throws Failure(INVALID_ARGUMENT) on NULL arrays with a non-zero count.
  explicit Options(const devalloc_create_args& args);

  // Removes and returns the value of key, if present.
  bool take(std::string_view key, std::string& value);
  // "true"/"false"/"1"/"0"; throws Failure on anything else.
  bool take_bool(std::string_view key, bool fallback);
  // Decimal unsigned; throws Failure on anything else.
  uint64_t take_u64(std::string_view key, uint64_t fallback);
  // Throws Failure(INVALID_ARGUMENT) naming every key not taken and the
  // accepted ones.
  void reject_unknown(const char* plugin_name, const char* accepted) const;

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

// Live allocations of one device, to validate copy ranges and frees.
class AllocationTable {
 public:
  void insert(uint64_t address, uint64_t nbytes);
  // Removes and returns the size; false if address is not a live base.
  bool erase(uint64_t address, uint64_t* nbytes);
  // True when [address, address + nbytes) lies inside one live allocation.
  bool contains(uint64_t address, uint64_t nbytes) const;
  // Every live allocation, for destroy().
  std::vector<std::pair<uint64_t, uint64_t>> all() const;
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<uint64_t, uint64_t> live_;  // base -> nbytes
};

inline bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace devalloc::plugin
