// Device memory of fake devices, kept on the host heap behind addresses the
// host cannot dereference (non-canonical on x86-64: bit 47 set), so that a
// plugin that touches device memory from the host faults instead of passing
// by luck. Allocations are aligned to exactly 256 bytes (never 512), are
// never reused, and a page-sized gap follows each. Pinned (page-locked)
// host blocks are tracked too, with the copies in flight that read them.
// Every misuse is recorded as a violation in the fake's FakeRecord, and live
// allocations and pinned blocks are counted there as live objects.
#pragma once

#include "fake_record.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace devalloc::fake {

struct Allocation {
  int device = 0;
  uint64_t base = 0;
  uint64_t size = 0;
  // Shared with copies in flight, which may outlive a (wrong) free.
  std::shared_ptr<std::byte[]> bytes;
  bool freed = false;
};

class DeviceHeap {
 public:
  DeviceHeap(FakeRecord& record, const char* free_name) : record_(record), free_name_(free_name) {}

  // Sets up `count` devices of `bytes_each` memory; forgets earlier ones.
  void reset_devices(size_t count, uint64_t bytes_each);
  size_t device_count() const;
  uint64_t total(int device) const;
  uint64_t used(int device) const;

  // 0 when the device's memory is exhausted (the caller answers with its
  // runtime's out-of-memory error).
  uint64_t allocate(int device, uint64_t nbytes);

  enum class FreeResult { ok, unknown, double_free };
  // Records a violation for anything but ok; freeing another device's
  // memory is a violation too, but the memory is freed.
  FreeResult free(int device, uint64_t address);

  // The live allocation of `device` that holds [address, address + n), or
  // a violation (naming `call`) and nullptr.
  std::shared_ptr<Allocation> range(const char* call, int device, uint64_t address,
                                    uint64_t n) const;
  // True (and the allocation still usable) unless it was freed meanwhile.
  bool still_live(const Allocation& allocation) const;

  // Frees every allocation of device (its context went away); returns how
  // many were live.
  uint64_t drop_device(int device);
  uint64_t live(int device) const;  // device < 0: all
  // Reads device memory directly: 0, or -1 if not live.
  int read(uint64_t address, void* dst, size_t nbytes) const;

  // Pinned host memory: page-aligned blocks from pin_allocate.
  void* pin_allocate(size_t nbytes);
  // False (and a violation naming `call`) when p is not a live block; a
  // block still read by copies in flight is a violation and stays until
  // they are done.
  bool pin_free(const char* call, void* p);
  // The block holding [p, p + n), counted as read by one more copy in
  // flight; 0 for pageable memory. Hand it back with unpin().
  uintptr_t pin_for_copy(const void* p, size_t n);
  void unpin(uintptr_t block);
  // Blocks never freed, as violations (at exit).
  void report_unfreed_pins();

 private:
  struct Device {
    uint64_t total = 0;
    uint64_t used = 0;
    uint64_t next_address = 0;
  };
  struct PinnedBlock {
    void* memory = nullptr;
    size_t size = 0;
    int copies_in_flight = 0;
    bool freed = false;
  };

  FakeRecord& record_;
  const char* free_name_;
  mutable std::mutex mutex_;
  std::vector<Device> devices_;
  // By base address; freed ones stay, as addresses are never reused.
  std::map<uint64_t, std::shared_ptr<Allocation>> allocations_;
  std::map<uintptr_t, PinnedBlock> pinned_;
};

}  // namespace devalloc::fake
