// The two raw paths of a real driver that devalloc_driver_bench measures
// (bench/driver_bench.cpp says what and how), one implementation per
// driver: driver_bench_vulkan.cpp (Mesa's lavapipe), driver_bench_opencl.cpp
// (PoCL). Each opens its driver's loader with dlopen at run time, so the
// bench builds and runs where a driver is absent (it is then skipped).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace devalloc::bench {

// A driver call that failed after the driver was opened: the message names
// the call, its arguments and what it returned.
struct DriverError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Copies [src, src + n) into dst with two threads, one half each (the
// calling thread and one more): (b) and (c) copy through it alike.
void two_thread_copy(std::byte* dst, const std::byte* src, uint64_t n);

// One device of a driver, with the buffers of (a) and (b) allocated.
class DriverPaths {
 public:
  virtual ~DriverPaths() = default;

  // "llvmpipe (LLVM 15.0.6, 256 bits)", as the driver names its device.
  virtual std::string device_name() const = 0;

  // (a): the bytes already in host-visible staging memory (filled from the
  // source when the paths were opened) copied to a device buffer in
  // `chunk`-byte copies, two in flight; returns when all have landed.
  virtual void copy_through_staging() = 0;

  // (b): the device buffer of (b) mapped into the host, the source copied
  // into it by two_thread_copy, and unmapped; returns when the bytes are
  // the device's.
  virtual void copy_into_mapping(const std::byte* src) = 0;

  // Reads the device buffer of (a) or (b) back through the driver and
  // compares it with `expected` (the source): empty when every byte is
  // right, else where the first wrong byte is.
  virtual std::string check_copied(const std::byte* expected) = 0;
  virtual std::string check_mapped(const std::byte* expected) = 0;
};

// Opens the driver, its first device, and the buffers of (a) and (b) of
// `nbytes` each (staging filled from `src`, (b)'s destination touched once).
// Returns null with `*skipped` set when the driver cannot be used here (no
// loader library, no device): a line for the report, not a failure. Throws
// DriverError when a call fails once the driver is open.
std::unique_ptr<DriverPaths> open_vulkan(const std::byte* src, uint64_t nbytes, uint64_t chunk,
                                         std::string* skipped);
std::unique_ptr<DriverPaths> open_opencl(const std::byte* src, uint64_t nbytes, uint64_t chunk,
                                         std::string* skipped);

// Where expected and actual first differ, as a line: "byte 1234 of 16777216
// is 0x00, expected 0x5a"; empty when they are equal. `base` is added to
// the offsets (the readback's chunk).
std::string first_difference(const std::byte* actual, const std::byte* expected, uint64_t n,
                             uint64_t base, uint64_t total);

}  // namespace devalloc::bench
