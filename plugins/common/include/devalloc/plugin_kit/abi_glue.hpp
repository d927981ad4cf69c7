// The checks every ABI function makes before it does any work, and the
// exception barrier. Each check throws Failure with a message that names
// the call and the PLUGIN rule the argument breaks; guard() turns it into
// the status and the caller's devalloc_error (PLUGIN-6, PLUGIN-7).
#pragma once

#include <devalloc/plugin_kit/error.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <utility>

namespace devalloc::plugin {

// Runs body, turning Failure, std::bad_alloc and any other exception into a
// status and message: no exception crosses the ABI (PLUGIN-7).
template <class Body>
devalloc_status guard(devalloc_error* error, Body&& body) noexcept {
  try {
    return std::forward<Body>(body)();
  } catch (const Failure& f) {
    return fail(error, f.status, "%s", f.message.c_str());
  } catch (const std::bad_alloc&) {
    return fail(error, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(error, DEVALLOC_STATUS_INTERNAL, "internal error: %s", e.what());
  } catch (...) {
    return fail(error, DEVALLOC_STATUS_INTERNAL, "internal error");
  }
}

// Runs body; a Failure or bad_alloc leaving it gets describe() (the call and
// its arguments, e.g. "allocate(device = 0, nbytes = 64, alignment = 0)")
// in front of its message, so that every message says which request it
// answers.
template <class Describe, class Body>
void in_call(const Describe& describe, Body&& body) {
  try {
    std::forward<Body>(body)();
  } catch (Failure& f) {
    f.message.insert(0, describe() + ": ");
    throw;
  } catch (const std::bad_alloc&) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, describe() + ": out of host memory"};
  }
}

// INVALID_ARGUMENT "<call>: <what> (<rule>)" unless condition holds.
void require(bool condition, const char* call, const char* rule, const char* what);

// A struct handed in by the host must be non-NULL and at least as large as
// the ABI version that introduced its last used field (PLUGIN-4).
template <class Struct>
void require_struct(const Struct* s, size_t needed, const char* call, const char* name) {
  if (s != nullptr && s->struct_size >= needed) return;
  throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                s == nullptr ? format("%s: %s is NULL (PLUGIN-4)", call, name)
                             : format("%s: %s->struct_size is %zu, below the %zu bytes its "
                                      "fields need (PLUGIN-4)",
                                      call, name, s->struct_size, needed)};
}

// NO_SUCH_DEVICE naming the index and the count (PLUGIN-10).
void require_device(uint32_t device, uint32_t count, const char* call);

// The alignment allocate() honours: natural for 0; INVALID_ARGUMENT if not a
// power of two, UNSUPPORTED above max (PLUGIN-11).
uint64_t checked_alignment(uint64_t alignment, uint64_t natural, uint64_t max);

// A runtime's PCI address ("domain:bus:device.function" in hex, any case
// and domain width) in the ABI's form "dddd:bb:dd.f"; "" if unparsable.
std::string normalize_pci_bus_id(const char* text);

// "during_call", "until_released" or "unknown".
const char* lifetime_name(devalloc_src_lifetime lifetime);

// The standard negotiation of a plugin that speaks major 1 only (PLUGIN-2).
devalloc_status negotiate_v1(devalloc_negotiation* negotiation, devalloc_error* error,
                             const devalloc_plugin_api_v1* api);

}  // namespace devalloc::plugin
