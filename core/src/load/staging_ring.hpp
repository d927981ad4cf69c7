// The staging ring: a fixed set of host buffers (slots) that staged pieces
// are read into and copied from, sized once per load to fit [load]
// staging, from the plugin's allocate_host when it offers HOST_STAGING
// (whose handle refuses a buffer handed out twice while held, PLUGIN-18).
#pragma once

#include "copy_schedule.hpp"

#include <devalloc/plugin.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace devalloc::load {

constexpr uint64_t kMaxSlotBytes = uint64_t{8} << 20;
constexpr uint64_t kMinSlotBytes = uint64_t{4} << 10;

// The alignment copy sources of a plugin need (ABI 1.2, PLUGIN-23): 1 when
// it states none, or more than the most honoured (64 KiB: a plugin's 1 GiB
// would put a gigabyte of slack into every slot).
uint64_t source_alignment(const Capabilities& caps);

// One slot of a staging ring.
struct Slot {
  std::byte* memory = nullptr;      // capacity bytes; aligned for O_DIRECT
  std::byte* allocation = nullptr;  // what to free (memory, or a little before)
  uint64_t capacity = 0;
  bool from_plugin = false;
};

// A fixed set of staging buffers for the devices of one plugin.
struct Ring {
  Plugin* plugin = nullptr;  // not owned: a leaked ring never calls it
  uint64_t payload = 0;      // bytes of file a slot carries
  std::vector<Slot> slots;
  std::vector<size_t> free;  // indices into slots
  std::vector<size_t> queues;  // the device queues it serves

  // Frees the slots; only once nothing may read them (StagedCopies).
  void free_slots();
};

// Fills ring.slots within budget bytes for the steps of its queues (of
// `queues`): slots of 4 KiB to 8 MiB, cut to the plugin's DMA constraints,
// no more than the pieces need. *read is direct_io when O_DIRECT is
// wanted; when its block slack does not fit the budget it becomes pread,
// and *direct_io_fallback says so.
Status make_ring(Ring& ring, uint64_t budget, const std::vector<DeviceCopyQueue>& queues,
                 ReadMode* read, bool* direct_io_fallback);

}  // namespace devalloc::load
