// Device addresses of the OpenCL plugin. OpenCL 1.2 buffers have no device
// address the host can see (a cl_mem is an opaque handle), so each buffer
// gets an address window of its own: nbytes of a process-wide address
// range, aligned as asked, never handed out twice in the process (PLUGIN-12,
// also across instances and devices), and never a pointer the host could
// dereference (the range is non-canonical on x86-64 and AArch64). base + k
// maps back to (buffer, offset k) through the device's BufferTable.
#pragma once

#include <CL/cl.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cl_runtime.hpp"

namespace devalloc::opencl {

// The first window starts here; every window is followed by an unused gap,
// so that one buffer's end is never another's start.
inline constexpr uint64_t kFirstWindow = uint64_t{0x0c1} << 52;
inline constexpr uint64_t kWindowGap = 4096;

// A window of nbytes (> 0) aligned to alignment (a power of two), unique in
// the process. Throws Failure(OUT_OF_DEVICE_MEMORY) once the range is spent.
uint64_t reserve_window(uint64_t nbytes, uint64_t alignment);

// A range of one live buffer, with a reference on the buffer (clRetainMemObject)
// for as long as this lives, so that a deallocate racing with a copy (a
// host bug) frees nothing under the copy's enqueue.
class HeldRange {
 public:
  HeldRange(const Runtime& cl, cl_mem buffer, uint64_t offset, uint64_t allocation)
      : cl_(&cl), buffer_(buffer), offset_(offset), allocation_(allocation) {}
  HeldRange(HeldRange&& other) noexcept
      : cl_(other.cl_),
        buffer_(std::exchange(other.buffer_, nullptr)),
        offset_(other.offset_),
        allocation_(other.allocation_) {}
  HeldRange& operator=(HeldRange&&) = delete;
  HeldRange(const HeldRange&) = delete;
  HeldRange& operator=(const HeldRange&) = delete;
  ~HeldRange();

  cl_mem buffer() const { return buffer_; }
  uint64_t offset() const { return offset_; }
  // The address allocate() returned for the buffer.
  uint64_t allocation() const { return allocation_; }

 private:
  const Runtime* cl_;
  cl_mem buffer_;
  uint64_t offset_;
  uint64_t allocation_;
};

// The live buffers of one device by address window.
class BufferTable {
 public:
  explicit BufferTable(const Runtime& cl) : cl_(cl) {}

  // Records buffer at its window. Throws bad_alloc, recording nothing.
  void add(uint64_t address, uint64_t nbytes, cl_mem buffer);
  // The buffer and offset of [address, address + nbytes), which must lie in
  // one live buffer; else Failure(INVALID_ARGUMENT) "<role> [0x…, +n) is not
  // inside one live allocation of device <index> (<rule>)".
  HeldRange find(uint64_t address, uint64_t nbytes, uint32_t index, const char* role,
                 const char* rule) const;
  // Frees the buffer at address with free_buffer(buffer): the entry is
  // removed once free_buffer returned, and kept if it threw. Throws
  // Failure(INVALID_ARGUMENT, PLUGIN-12) for an address that is not live or
  // is being freed by another thread.
  template <class FreeBuffer>
  void free(uint64_t address, uint32_t index, FreeBuffer&& free_buffer) {
    cl_mem buffer = claim(address, index);
    try {
      free_buffer(buffer);
    } catch (...) {
      unclaim(address);
      throw;
    }
    erase(address);
  }
  // Calls visit(address, buffer) for every live buffer, under the lock.
  template <class Visit>
  void for_each(Visit&& visit) const noexcept {
    std::lock_guard lock(mutex_);
    for (const auto& [address, entry] : live_) visit(address, entry.buffer);
  }
  void clear() noexcept;

 private:
  struct Entry {
    uint64_t nbytes;
    cl_mem buffer;
    bool freeing;
  };
  cl_mem claim(uint64_t address, uint32_t index);
  void unclaim(uint64_t address) noexcept;
  void erase(uint64_t address) noexcept;

  const Runtime& cl_;
  mutable std::mutex mutex_;
  std::map<uint64_t, Entry> live_;
};

}  // namespace devalloc::opencl
