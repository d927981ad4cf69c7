// One piece of a load: read straight into device memory (direct), or read
// into a staging slot and issued as an until-released copy (staged).
#include "pipeline.hpp"

#include "copy_texts.hpp"
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
  auto taken = take_slot(*ledger_, c.ring, stop_);
  if (!taken.ok()) return taken.status();
  Ledger& ledger = *ledger_;
  const Slot slot = ledger.rings[c.ring].slots[*taken];
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
    const uint64_t alignment = source_alignment(ledger.rings[c.ring].plugin->capabilities());
    if (read.ok() && reinterpret_cast<uintptr_t>(payload) % alignment != 0) {
      std::memmove(slot.memory, payload, p.nbytes);
      payload = slot.memory;
      ++realigned_pieces_;
    }
  }
  Ticket* ticket = nullptr;
  void* token = nullptr;  // the copy's user_data
  {
    std::lock_guard lock(ledger.mutex);
    if (read.ok()) {
      // The one allocation here, first: if it fails, nothing is
      // registered and the slot goes back (free never outgrows its
      // capacity, all the ring's slots).
      try {
        ledger.unreleased[p.queue].insert(ledger.next_id);
      } catch (...) {
        ledger.rings[c.ring].free.push_back(*taken);
        throw;
      }
    }
    if (!read.ok()) {
      ledger.rings[c.ring].free.push_back(*taken);
    } else {
      ticket = &ledger.issue(p.queue, c.ring, *taken, s, p.offset, p.nbytes);
      token = ledger.token_of(ticket->id);
      ledger.in_flight += p.nbytes;
      ledger.max_in_flight = std::max(ledger.max_in_flight, ledger.in_flight);
    }
  }
  if (!read.ok()) {
    ledger.changed.notify_all();
    return read.with_context("reading tensor " +
                             tensors_text(piece_of(s, p.offset, p.nbytes, requests_)));
  }
  const ResolvedDevice& device = queues_[p.queue].device;
  // The plugin releases the copy exactly once, also when this fails.
  Status copied = device.plugin->copy_to_device_until_released(
      device.device, s.buffer->address() + s.buffer_offset + p.offset, payload,
      p.nbytes, devalloc_staged_copy_released, token);
  bool failed = false;  // waiting threads must see the new failure, or the slot
  {
    std::lock_guard lock(ledger.mutex);
    ticket->in_call = false;
    ticket->returned = ++ledger.calls_returned;
    if (!copied.ok()) {
      ticket->copy_failed = true;
      if (!ticket->breach_in_call.empty()) {
        copied = Status(copied.code(), copied.message() + "; then " + ticket->breach_in_call);
      }
    } else if (!ticket->breach_in_call.empty()) {
      ledger.fail_also(Status(StatusCode::device_error, ticket->breach_in_call));
      failed = true;
    }
    // Released during the call: its slot goes back now.
    if (ticket->released) {
      ledger.retire(*ticket);
      failed = true;
    }
  }
  if (failed) ledger.changed.notify_all();
  return copied;
}

}  // namespace devalloc::load
