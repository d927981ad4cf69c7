#include "staging_ring.hpp"

#include "file_reader.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace devalloc::load {

namespace {

constexpr uint64_t kMaxSourceAlignment = uint64_t{64} << 10;

}  // namespace

uint64_t source_alignment(const Capabilities& caps) {
  const uint64_t a = caps.copy_src_alignment;
  return a == 0 || a > kMaxSourceAlignment ? 1 : a;
}

void Ring::free_slots() {
  for (Slot& s : slots) {
    if (s.from_plugin) {
      (void)plugin->free_host(s.allocation);
    } else {
      std::free(s.allocation);
    }
  }
  slots.clear();
}

Status make_ring(Ring& ring, uint64_t budget, const std::vector<DeviceCopyQueue>& queues,
                 ReadMode* read, bool* direct_io_fallback) {
  // What the ring's queues stage: no slot is larger than the largest step
  // needs, and there are no more slots than pieces, so a budget far above
  // the model ("1TiB") costs what the model needs, not the budget.
  uint64_t largest_step = 0;
  for (size_t qi : ring.queues) {
    for (const CopyStep& s : queues[qi].steps) largest_step = std::max(largest_step, s.nbytes);
  }
  // Four slots or more, so that reading and copying overlap, of 4 KiB to
  // 8 MiB (a size pread and the copy engines run at full speed with).
  uint64_t payload =
      std::min({budget, std::clamp(budget / 4, kMinSlotBytes, kMaxSlotBytes),
                std::max(kMinSlotBytes, round_up(largest_step, kMinSlotBytes))});
  // The plugin's DMA constraints (ABI 1.2, PLUGIN-23): no piece larger than
  // one transfer, pieces a multiple of the preferred transfer and of the
  // source alignment, so that every piece of a step starts aligned.
  const Capabilities& caps = ring.plugin->capabilities();
  const uint64_t alignment = source_alignment(caps);
  // A largest transfer below one slot's minimum is not honoured: the plugin
  // splits larger copies itself, and smaller pieces would make a copy call
  // per few bytes.
  if (caps.copy_max_bytes != 0) {
    payload = std::min(payload, std::max(caps.copy_max_bytes, kMinSlotBytes));
  }
  if (caps.copy_preferred_bytes != 0 && payload >= caps.copy_preferred_bytes) {
    payload -= payload % caps.copy_preferred_bytes;
  }
  if (payload >= alignment) payload -= payload % alignment;
  uint64_t pieces = 0;
  for (size_t qi : ring.queues) {
    for (const CopyStep& s : queues[qi].steps) pieces += (s.nbytes + payload - 1) / payload;
  }
  const bool pinned = ring.plugin->capabilities().host_staging;
  uint64_t capacity = payload;
  // Pinned memory from allocate_host has no alignment the ABI promises, and
  // O_DIRECT reads into it must start on a block: a slot of it is taken
  // from a block's length more and starts at the first aligned byte.
  // A slot starts on the plugin's source alignment too.
  uint64_t slot_alignment = alignment;
  uint64_t slack = pinned && alignment > 1 ? alignment : 0;
  if (*read == ReadMode::direct_io) {
    // Room to read whole aligned blocks around any range.
    capacity = round_up(payload, kDirectIoAlign) + 2 * kDirectIoAlign;
    slot_alignment = std::max(alignment, kDirectIoAlign);
    slack = pinned ? slot_alignment : 0;
    if (capacity + slack > budget) {
      *read = ReadMode::pread;
      *direct_io_fallback = true;
      capacity = payload;
      slot_alignment = alignment;
      slack = pinned && alignment > 1 ? alignment : 0;
    }
  }
  const uint64_t count = std::max<uint64_t>(1, std::min(budget / (capacity + slack), pieces));
  ring.payload = payload;
  // Room first: a staging buffer is held from allocate_host on, and is in
  // the slots (which let go of it) without another allocation.
  ring.slots.reserve(count);
  ring.free.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    Slot slot;
    slot.capacity = capacity;
    if (pinned) {
      // The plugin handle refuses a buffer that overlaps staging still held
      // (PLUGIN-18).
      auto memory = ring.plugin->allocate_host(capacity + slack);
      if (!memory.ok()) {
        return memory.status().with_context("allocating " + std::to_string(capacity + slack) +
                                            " bytes of staging memory");
      }
      slot.allocation = static_cast<std::byte*>(*memory);
      slot.memory = slot.allocation;
      if (slack > 0) {
        const auto at = reinterpret_cast<uintptr_t>(slot.allocation);
        slot.memory += round_up(at, slot_alignment) - at;
      }
      slot.from_plugin = true;
    } else {
      const uint64_t heap_alignment = std::max(kDirectIoAlign, slot_alignment);
      slot.allocation = static_cast<std::byte*>(
          std::aligned_alloc(heap_alignment, round_up(capacity, heap_alignment)));
      slot.memory = slot.allocation;
      if (slot.memory == nullptr) {
        return Status(StatusCode::out_of_host_memory,
                      "allocating " + std::to_string(capacity) +
                          " bytes of staging memory: out of host memory");
      }
    }
    ring.slots.push_back(slot);
    ring.free.push_back(ring.slots.size() - 1);
  }
  return Status();
}

}  // namespace devalloc::load
