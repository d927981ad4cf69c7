// One piece of a load: read straight into device memory (direct), or read
// into a staging slot and issued as an until-released copy (staged).
#include "pipeline.hpp"

#include "copy_texts.hpp"
#include "staged_copies.hpp"
#include "staging_ring.hpp"

#include <devalloc/input_text.hpp>

#include <cstring>
#include <string>
#include <utility>

namespace devalloc::load {

Status Pipeline::direct_piece(const Piece& p) {
  const CopyStep& s = *p.step;
  std::byte* dst = nullptr;
  if (contexts_[p.queue].mapped) {
    dst = mappings_.host_address(s.buffer, s.buffer_offset) + p.offset;
  } else {
    dst = reinterpret_cast<std::byte*>(
        static_cast<uintptr_t>(s.buffer->address() + s.buffer_offset + p.offset));
  }
  // O_DIRECT wants aligned destinations the device memory need not have:
  // direct_io reads direct pieces with pread.
  return read_step(chooser_, s, p.offset, p.nbytes, dst);
}

Status Pipeline::staged_piece(const Piece& p) {
  const CopyStep& s = *p.step;
  const QueueContext& c = contexts_[p.queue];
  auto taken = take_slot(*staged_, c.ring, stop_);
  if (!taken.ok()) return taken.status();
  StagedCopies& staged = *staged_;
  Ring& ring = staged.rings[c.ring];
  const Slot slot = ring.slots[*taken];
  const uint64_t offset = s.file_offset + p.offset;

  const std::byte* payload = slot.memory;
  Status read;
  // O_DIRECT reads whole blocks: a strided step's runs are read apart.
  if (read_ != ReadMode::direct_io || direct_io_.fd(s.file) < 0 || s.run_bytes != 0) {
    read = read_step(chooser_, s, p.offset, p.nbytes, slot.memory);
  } else {
    const uint64_t start = offset / kDirectIoAlign * kDirectIoAlign;
    const uint64_t length = round_up(offset + p.nbytes, kDirectIoAlign) - start;
    uint64_t got = 0;
    read = pread_all(direct_io_.fd(s.file), slot.memory, length, start, *s.file, &got);
    if (read.ok() && got < offset + p.nbytes - start) {
      read = Status(StatusCode::data_loss,
                    path_for_message(s.file->path().string()) + ": ends before offset " +
                        std::to_string(offset + p.nbytes) + " (was it truncated?)");
    }
    payload = slot.memory + (offset - start);
    // The block read left the piece where the plugin would bounce it
    // (PLUGIN-23): one move within the slot puts it on the slot's start,
    // which is aligned for it.
    const uint64_t alignment = source_alignment(ring.plugin->capabilities());
    if (read.ok() && reinterpret_cast<uintptr_t>(payload) % alignment != 0) {
      std::memmove(slot.memory, payload, p.nbytes);
      payload = slot.memory;
      ++realigned_pieces_;
    }
  }
  SlotCopy& copy = staged.copies[staged.ring_base[c.ring] + *taken];
  {
    std::lock_guard lock(staged.mutex);
    if (!read.ok()) {
      ring.free.push_back(*taken);  // free never outgrows its capacity, all the ring's slots
    } else {
      copy.busy = true;
      copy.queue = p.queue;
      copy.step = &s;
      copy.offset = p.offset;
      copy.nbytes = p.nbytes;
      staged.in_flight += p.nbytes;
      staged.max_in_flight = std::max(staged.max_in_flight, staged.in_flight);
    }
  }
  if (!read.ok()) {
    staged.changed.notify_all();
    return read.with_context("reading tensor " +
                             tensors_text(piece_of(s, p.offset, p.nbytes, requests_)));
  }
  const ResolvedDevice& device = queues_[p.queue].device;
  // The plugin handle accounts the release; the completion gives the slot
  // back, once the plugin released it and the call returned.
  Status copied = device.plugin->copy_to_device_until_released(
      device.device, s.buffer->address() + s.buffer_offset + p.offset, payload, p.nbytes,
      StagedCopies::completion(staged_, c.ring, *taken), staged_.get());
  if (!copied.ok()) {
    bool given_back = false;
    {
      std::lock_guard lock(staged.mutex);
      // Released twice during the failed call: the breach follows the
      // call's own error (PLUGIN-21), and the slot goes back now.
      if (!copy.breach_after_call.empty()) {
        copied = Status(copied.code(), copied.message() + "; then " + copy.breach_after_call);
        copy.breach_after_call.clear();
        copy.busy = false;
        ring.free.push_back(*taken);
        given_back = true;
      }
    }
    if (given_back) staged.changed.notify_all();
  }
  return copied;
}

}  // namespace devalloc::load
