// The validation layer's allocation checker: what it knows of one
// instance's device memory, the live allocations (PLUGIN-11, -12, -15) and
// the live host mappings (PLUGIN-22). Not locked: the layer's mutex guards
// it. Functions that add may throw bad_alloc with nothing changed.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

namespace devalloc::detail {

class LayerAllocations {
 public:
  // Whether [address, address + nbytes) lies inside one live allocation.
  bool inside(uint32_t device, uint64_t address, uint64_t nbytes) const;
  // Records an allocation the plugin returned; false, with nothing
  // recorded, when it overlaps a live one.
  bool add(uint32_t device, uint64_t address, uint64_t nbytes);
  // A deallocate of `base` begins: takes its allocation out (no longer
  // live: the plugin may hand the range out again at once) and returns its
  // size, or nullopt when `base` is no live allocation of the device. The
  // bytes stay counted until freed().
  std::optional<uint64_t> take(uint32_t device, uint64_t base);
  // The plugin refused to free it: live again.
  void put_back(uint32_t device, uint64_t base, uint64_t nbytes);
  // The plugin freed it: its bytes go, and its mappings end with it.
  void freed(uint32_t device, uint64_t base, uint64_t nbytes);

  uint64_t count() const;
  uint64_t bytes() const { return live_bytes_; }

  // A range mapped at `host` (a range mapped twice is two mappings).
  void add_mapping(uint32_t device, const void* host, uint64_t address, uint64_t nbytes);
  bool is_mapped(uint32_t device, const void* host) const;
  // Ends one mapping at `host`, if any.
  void remove_mapping(uint32_t device, const void* host);
  // Whether [address, address + nbytes) overlaps a live mapping.
  bool overlaps_mapping(uint32_t device, uint64_t address, uint64_t nbytes) const;

 private:
  std::map<uint32_t, std::map<uint64_t, uint64_t>> allocations_;  // device -> base -> size
  uint64_t live_bytes_ = 0;
  // device -> host pointer -> mapped range (address, nbytes).
  std::map<uint32_t, std::multimap<const void*, std::pair<uint64_t, uint64_t>>> mappings_;
};

}  // namespace devalloc::detail
