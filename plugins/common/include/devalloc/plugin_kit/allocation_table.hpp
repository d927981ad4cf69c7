// Live allocations of one device (or the live staging buffers of an
// instance): aligned over-allocation on top of a runtime's natural
// alignment, range lookup for copies (PLUGIN-15), frees of exactly the
// addresses handed out (PLUGIN-12). The bookkeeping never loses a runtime
// allocation: recording one that fails frees it, and a free that fails
// keeps it, so that destroy() still frees it.
#pragma once

#include <devalloc/plugin_kit/error.hpp>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

namespace devalloc::plugin {

// Calls free_fn(handle, nbytes), or free_fn(handle) when it takes the
// handle alone: how the tables below call a runtime's free.
template <class FreeFn, class Handle>
void call_free(FreeFn& free_fn, Handle handle, uint64_t nbytes) {
  if constexpr (std::is_invocable_v<FreeFn&, Handle, uint64_t>) {
    free_fn(handle, nbytes);
  } else {
    free_fn(handle);
  }
}

inline bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
inline uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

// What to ask a runtime that aligns to `natural` for, so that an address
// aligned to `alignment` has nbytes behind it. Throws Failure
// (OUT_OF_DEVICE_MEMORY) when that overflows (PLUGIN-11).
uint64_t over_allocation(uint64_t nbytes, uint64_t alignment, uint64_t natural);

class AllocationTable {
 public:
  struct Allocation {
    uint64_t address = 0;  // what the plugin handed out
    uint64_t nbytes = 0;
    uint64_t base = 0;     // what the runtime returned, to free
  };

  // `live_name` completes "0x10 is not ..." for frees of unknown addresses.
  explicit AllocationTable(const char* live_name = "a live allocation of this device (PLUGIN-12)")
      : live_name_(live_name) {}

  // Records the runtime allocation `base` (of at least
  // over_allocation(nbytes, alignment, ...) bytes) and returns the aligned
  // address inside it. If recording throws, calls free_base(base, nbytes)
  // (or free_base(base), for a runtime whose free takes the base alone)
  // first: a bad_alloc here never leaks the runtime's memory.
  // Memory that overlaps a live allocation is not handed out twice
  // (PLUGIN-12): the runtime gave again what a free that reported failure
  // had freed after all. Throws Failure(DEVICE_ERROR) naming `call` (the
  // runtime call that answered) without freeing base: the live entry
  // frees that memory when its buffer is freed.
  template <class FreeBase>
  uint64_t adopt(uint64_t base, uint64_t nbytes, uint64_t alignment, FreeBase&& free_base,
                 const std::string& call = {}) {
    const uint64_t address = align_up(base, alignment);
    std::optional<Failure> twice;
    try {
      std::lock_guard lock(mutex_);
      twice = overlap(address, nbytes, call);
      if (!twice) {
        live_.emplace(address, Entry{nbytes, base, false});
        live_bytes_ += nbytes;
      }
    } catch (...) {
      call_free(free_base, base, nbytes);
      throw;
    }
    if (twice) throw std::move(*twice);
    return address;
  }

  // Frees the allocation at address with free_base(base, nbytes) (nbytes
  // as recorded: without the slack of over_allocation), or
  // free_base(base): the entry is removed only once free_base returned, and
  // kept (and freeable again) if it threw. Throws Failure(INVALID_ARGUMENT,
  // PLUGIN-12) for an address that is not live or is being freed by another
  // thread.
  template <class FreeBase>
  void free(uint64_t address, FreeBase&& free_base) {
    const Allocation claimed = claim(address);
    try {
      call_free(free_base, claimed.base, claimed.nbytes);
    } catch (...) {
      unclaim(address);
      throw;
    }
    erase(address);
  }

  // True when [address, address + nbytes) lies inside one live allocation.
  bool contains(uint64_t address, uint64_t nbytes) const noexcept;
  // Throws Failure(INVALID_ARGUMENT) naming the range, the role ("the
  // destination") and PLUGIN-15 unless contains().
  void require_range(uint64_t address, uint64_t nbytes, const char* role) const;

  // Calls visit(const Allocation&) for every live allocation under the
  // table's lock; allocates nothing, for destroy paths.
  template <class Visit>
  void for_each(Visit&& visit) const noexcept {
    std::lock_guard lock(mutex_);
    for (const auto& [address, entry] : live_) {
      visit(Allocation{address, entry.nbytes, entry.base});
    }
  }
  // Forgets everything (after destroy freed it all).
  void clear() noexcept;
  size_t size() const noexcept;
  // The nbytes of every live allocation, summed (what was asked for, not
  // the over-allocation behind it).
  uint64_t live_bytes() const noexcept;

 private:
  struct Entry {
    uint64_t nbytes;
    uint64_t base;
    bool freeing;
  };
  // The Failure adopt() throws when [address, +nbytes) overlaps a live
  // allocation; mutex_ held.
  std::optional<Failure> overlap(uint64_t address, uint64_t nbytes,
                                 const std::string& call) const;
  Allocation claim(uint64_t address);
  void unclaim(uint64_t address) noexcept;
  void erase(uint64_t address) noexcept;

  const char* live_name_;
  mutable std::mutex mutex_;
  std::map<uint64_t, Entry> live_;  // by the address handed out
  uint64_t live_bytes_ = 0;
};

// Pinned host memory handed out for staging (allocate_host): which
// pointers are live, and whether a copy's source lies in one of them.
class StagingTable {
 public:
  // As AllocationTable::adopt, `call` naming the runtime call that gave it:
  // free_buffer(buffer, nbytes), or free_buffer(buffer) for a runtime whose
  // free needs no size, frees it if recording throws.
  template <class FreeBuffer>
  void adopt(void* buffer, uint64_t nbytes, FreeBuffer&& free_buffer,
             const std::string& call = {}) {
    table_.adopt(
        address(buffer), nbytes, 1,
        [&](uint64_t, uint64_t size) { call_free(free_buffer, buffer, size); }, call);
  }
  // Frees buffer with free_buffer(buffer, nbytes) (munmap needs the size),
  // or free_buffer(buffer), as AllocationTable::free. Throws
  // Failure(INVALID_ARGUMENT) for a pointer not from adopt().
  template <class FreeBuffer>
  void free(void* buffer, FreeBuffer&& free_buffer) {
    table_.free(address(buffer),
                [&](uint64_t, uint64_t size) { call_free(free_buffer, buffer, size); });
  }
  // True when [p, p + nbytes) lies in one staging buffer.
  bool holds(const void* p, uint64_t nbytes) const noexcept {
    return table_.contains(address(p), nbytes);
  }
  template <class Visit>
  void for_each(Visit&& visit) const noexcept {
    table_.for_each([&](const AllocationTable::Allocation& a) {
      visit(reinterpret_cast<void*>(static_cast<uintptr_t>(a.address)), a.nbytes);
    });
  }
  void clear() noexcept { table_.clear(); }
  size_t size() const noexcept { return table_.size(); }

 private:
  static uint64_t address(const void* p) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
  }
  AllocationTable table_{"a live buffer from allocate_host (PLUGIN-18)"};
};

}  // namespace devalloc::plugin
