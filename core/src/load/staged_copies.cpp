#include "staged_copies.hpp"

#include <algorithm>
#include <cstdlib>

namespace devalloc::load {

namespace {

Status force_progress(StagedCopies& staged, std::unique_lock<std::mutex>& lock, size_t ring_index);

std::string late_text(const StagedCopies& staged, const ResolvedDevice& device,
                      const OwedRelease& owed, const SlotCopy* copy) {
  const std::string rule = owed.call_failed ? "PLUGIN-14" : "PLUGIN-20";
  const std::string what =
      copy != nullptr ? staged.copy_of(*copy)
                      : "copy_host_to_device(device " + std::to_string(owed.device) + ", " +
                            std::to_string(owed.nbytes) + " bytes)";
  std::string text = "plugin " + device.plugin->name() + " broke " + rule +
                     " (PLUGIN-21 release accounting): " + what +
                     (owed.call_failed ? " failed and" : "") + " was not released " +
                     std::to_string(staged.release_timeout.count()) +
                     " ms after synchronize returned ([load] release_timeout); "
                     "its staging memory is kept until the release comes";
  if (copy != nullptr) {
    text += ", and buffer " + std::to_string(copy->step->buffer->memory_id()) +
            " stays allocated until the plugin is closed";
  }
  return text;
}

}  // namespace

StagedCopies::~StagedCopies() {
  for (Ring& r : rings) {
    // Only the host's own slots go here (std::free calls no plugin).
    r.slots.erase(std::remove_if(r.slots.begin(), r.slots.end(),
                                 [](const Slot& s) { return s.from_plugin; }),
                  r.slots.end());
    r.free_slots();
  }
}

void StagedCopies::make_slot_copies() {
  ring_base.clear();
  breach_marks.clear();
  size_t slots = 0;
  for (const Ring& r : rings) {
    ring_base.push_back(slots);
    slots += r.slots.size();
    breach_marks.push_back(r.plugin->release_breach_count());
  }
  copies.assign(slots, SlotCopy{});
}

CopyCompletion StagedCopies::completion(const std::shared_ptr<StagedCopies>& self, size_t ring,
                                        size_t slot) {
  return [self, ring, slot](CopyOutcome&& outcome) {
    StagedCopies& staged = *self;
    {
      std::lock_guard lock(staged.mutex);
      SlotCopy& c = staged.copies[staged.ring_base[ring] + slot];
      if (outcome.late) ++staged.late_releases[c.queue];
      staged.in_flight -= c.nbytes;
      ++staged.releases_seen;
      bool give_back = true;
      if (outcome.released_twice && staged.running) {
        // The slot was given back by the first release: giving it again
        // would corrupt the ring. The load ends, after the copy's own error
        // when it failed (PLUGIN-21).
        try {
          const std::string breach = "plugin " + staged.devices[c.queue]->plugin->name() +
                                     " broke PLUGIN-14 (PLUGIN-21 release accounting): " +
                                     staged.copy_of(c) + " was released twice";
          if (!outcome.call.ok()) {
            // This runs before the failed call returns, on its thread.
            c.breach_after_call = breach;
            give_back = false;
          } else {
            staged.fail_also(Status(StatusCode::device_error, breach));
          }
        } catch (...) {
          staged.fail(Status(StatusCode::device_error, std::string()));
        }
      }
      if (give_back) {
        c.busy = false;
        staged.rings[ring].free.push_back(slot);  // reserved for every slot: no allocation
      }
    }
    staged.changed.notify_all();
  };
}

std::string StagedCopies::copy_of(const SlotCopy& c) const {
  return copy_text(piece_of(*c.step, c.offset, c.nbytes, *requests), *devices[c.queue]);
}

const SlotCopy* StagedCopies::find(const Plugin* plugin, uint32_t device, uint64_t dst,
                                   uint64_t nbytes) const {
  for (const SlotCopy& c : copies) {
    if (c.step == nullptr) continue;  // never used
    const ResolvedDevice& d = *devices[c.queue];
    if (d.plugin.get() != plugin || d.device != device) continue;
    const uint64_t at = c.step->buffer->address() + c.step->buffer_offset + c.offset;
    if (at == dst && c.nbytes == nbytes) return &c;
  }
  return nullptr;
}

bool StagedCopies::take_breaches() {
  bool any = false;
  for (size_t r = 0; r < rings.size(); ++r) {
    Plugin* plugin = rings[r].plugin;
    const uint64_t count = plugin->release_breach_count();
    if (count == breach_marks[r]) continue;
    std::vector<ReleaseBreach> breaches = plugin->release_breaches_since(breach_marks[r]);
    breach_marks[r] = count;
    // A second release of another load's copy is that load's to report;
    // one for no copy may be anyone's, and ends every load of the plugin.
    std::erase_if(breaches, [&](const ReleaseBreach& b) { return b.copy && b.owner != this; });
    if (breaches.empty()) continue;
    any = true;
    // The first one is said; a plugin that breaks a rule per copy would
    // otherwise make a message per copy.
    const ReleaseBreach& first = breaches.front();
    std::string text = first.text;
    if (first.copy) {
      if (const SlotCopy* copy = find(plugin, first.device, first.dst, first.nbytes)) {
        text = "plugin " + plugin->name() + " broke PLUGIN-14 (PLUGIN-21 release accounting): " +
               copy_of(*copy) + " was released twice";
      }
    }
    if (breaches.size() > 1) {
      text += " (and " + std::to_string(breaches.size() - 1) + " more release breaches)";
    }
    fail_also(Status(StatusCode::device_error, text));
  }
  return any;
}

void StagedCopies::count_late_wait(size_t qi, std::chrono::steady_clock::time_point since) {
  const auto now = std::chrono::steady_clock::now();
  const auto from = std::max(since, late_wait_until[qi]);
  if (now > from) late_wait[qi] += now - from;
  late_wait_until[qi] = std::max(late_wait_until[qi], now);
}

Result<size_t> take_slot(StagedCopies& staged, size_t ring_index, std::atomic<bool>& stop) {
  std::unique_lock lock(staged.mutex);
  Ring& ring = staged.rings[ring_index];
  for (;;) {
    if (!staged.failure.ok() || stop) {
      return Status(StatusCode::internal, "stopped");
    }
    if (!ring.free.empty()) {
      const size_t slot = ring.free.back();
      ring.free.pop_back();
      return slot;
    }
    const uint64_t seen = staged.releases_seen;
    if (staged.changed.wait_for(lock, staged.sync_after, [&] {
          return !staged.failure.ok() || stop || !ring.free.empty() ||
                 staged.releases_seen != seen;
        })) {
      continue;
    }
    // A release rule broken meanwhile (a second release, one for no copy)
    // ends the load.
    if (staged.take_breaches()) {
      stop = true;
      staged.changed.notify_all();
      continue;
    }
    // PLUGIN-20: no release for a while; the plugin may be waiting for us.
    if (Status s = force_progress(staged, lock, ring_index); !s.ok()) {
      staged.fail(s);
      stop = true;
      staged.changed.notify_all();
    }
  }
}

Status wait_released(StagedCopies& staged, size_t qi) {
  const ResolvedDevice& device = *staged.devices[qi];
  const auto since = std::chrono::steady_clock::now();
  // Set through the C++ API it may be anything; a deadline past the clock's
  // range would overflow (the config refuses more than a day).
  const std::chrono::milliseconds timeout =
      staged.gave_up ? std::chrono::milliseconds(0)
                     : std::clamp(staged.release_timeout, std::chrono::milliseconds(0),
                                  kMaxReleaseTimeout);
  const ReleaseWait wait =
      device.plugin->wait_released(device.device, timeout, &staged, &staged.gave_up);
  std::lock_guard lock(staged.mutex);
  if (wait.waited) staged.count_late_wait(qi, since);
  if (!wait.owed) return Status();
  staged.gave_up = true;
  const OwedRelease& owed = *wait.owed;
  const SlotCopy* copy = staged.find(device.plugin.get(), owed.device, owed.dst, owed.nbytes);
  return Status(StatusCode::device_error, late_text(staged, device, owed, copy));
}

namespace {

// Synchronizes each device that has a copy of the ring in flight, then
// gives its releases release_timeout to arrive. Called and returns with
// lock held.
Status force_progress(StagedCopies& staged, std::unique_lock<std::mutex>& lock,
                      size_t ring_index) {
  std::set<size_t> queues;
  for (size_t s = 0; s < staged.rings[ring_index].slots.size(); ++s) {
    const SlotCopy& c = staged.copies[staged.ring_base[ring_index] + s];
    if (c.busy) queues.insert(c.queue);
  }
  // Every slot may be with a thread still reading: nothing to wait for.
  if (queues.empty()) return Status();
  ++staged.forced_synchronizes;
  lock.unlock();
  Status result;
  for (size_t qi : queues) {
    const ResolvedDevice& device = *staged.devices[qi];
    Status s = device.plugin->synchronize(device.device);
    if (!s.ok()) {
      result = s.with_context("synchronizing " + device.describe() +
                              " while waiting for staging memory");
      break;
    }
  }
  if (result.ok()) {
    for (size_t qi : queues) {
      if (Status s = wait_released(staged, qi); !s.ok()) {
        result = s;
        break;
      }
    }
  }
  lock.lock();
  return result;
}

}  // namespace

}  // namespace devalloc::load
