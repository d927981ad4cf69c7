#include "release_ledger.hpp"

#include <algorithm>
#include <cstdio>

namespace devalloc::load {

namespace {

// A copy's user_data: the ledger's serial (24 bits) and the copy's number
// (40 bits), multiplied by an odd constant, so that a made-up value or one
// off by a little (user_data + 1) names no copy in flight, not the next.
constexpr uint32_t kMaxSerial = (uint32_t{1} << 24) - 1;
constexpr uint64_t kIdBits = 40;
constexpr uint64_t kTokenFactor = 0x9E3779B97F4A7C15ull;
constexpr uint64_t inverse_of(uint64_t odd) {
  uint64_t inverse = odd;  // Newton's iteration: 5 steps reach 64 bits
  for (int i = 0; i < 5; ++i) inverse *= 2 - odd * inverse;
  return inverse;
}
constexpr uint64_t kTokenInverse = inverse_of(kTokenFactor);
static_assert(kTokenFactor * kTokenInverse == 1);

uint64_t encode_token(uint32_t serial, uint64_t id) {
  return ((uint64_t{serial} << kIdBits) | id) * kTokenFactor;
}

void decode_token(uint64_t token, uint32_t* serial, uint64_t* id) {
  const uint64_t value = token * kTokenInverse;
  *serial = static_cast<uint32_t>(value >> kIdBits);
  *id = value & ((uint64_t{1} << kIdBits) - 1);
}

// The ledgers a release may be for: each load's while it runs, and the
// abandoned ones for ever. devalloc_staged_copy_released looks its user_data up here,
// with g_ledgers_mutex held throughout (then a ledger's mutex; never the
// other way round), so a made-up user_data, or a release that comes after
// its load ended and its ledger was freed, is never followed.
std::mutex g_ledgers_mutex;
std::vector<Ledger*>& registered_ledgers() {
  static auto* list = new std::vector<Ledger*>();
  return *list;
}

// A release whose user_data is no ticket of any ledger (PLUGIN-14): made
// up, or for a load that ended. While exactly one load runs it is the
// likely recipient, and fails; otherwise the release is dropped (a copy it
// should have released is then missing, and PLUGIN-21 ends that load).
// g_ledgers_mutex held.
void stray_release(const void* user_data) {
  Ledger* running = nullptr;
  int count = 0;
  for (Ledger* l : registered_ledgers()) {
    if (l->running) {
      running = l;
      ++count;
    }
  }
  if (count != 1) return;
  {
    std::lock_guard lock(running->mutex);
    running->breach = true;
    char address[32];
    std::snprintf(address, sizeof address, "%p", user_data);
    // The callback went only to plugins of loads: this one's, or an
    // earlier one's that releases after its load ended.
    const std::string who = running->rings.empty()
                                ? std::string("a plugin of an earlier load")
                                : running->plugins() + " (or a plugin of an earlier load)";
    running->fail(Status(StatusCode::device_error,
                         who + " broke PLUGIN-14 (PLUGIN-21 release accounting): on_release "
                               "came with user_data " +
                             address + ", which no copy of this load was given"));
  }
  running->changed.notify_all();
}


Status force_progress(Ledger& ledger, std::unique_lock<std::mutex>& lock, size_t ring_index);

}  // namespace

void register_ledger(Ledger& ledger) {
  std::lock_guard lock(g_ledgers_mutex);
  // A number no registered ledger has (abandoned ones stay registered).
  static uint32_t last = 0;
  for (;;) {
    last = last % kMaxSerial + 1;
    const auto& list = registered_ledgers();
    if (std::none_of(list.begin(), list.end(), [](const Ledger* l) { return l->serial == last; })) {
      break;
    }
  }
  ledger.serial = last;
  ledger.running = true;
  registered_ledgers().push_back(&ledger);
}

Ledger::~Ledger() {
  std::lock_guard lock(g_ledgers_mutex);
  auto& list = registered_ledgers();
  list.erase(std::remove(list.begin(), list.end(), this), list.end());
}

void InFlightTable::reset(size_t most) {
  size_t capacity = 16;
  while (capacity < 2 * most) capacity *= 2;
  entries_.assign(capacity, Entry{});
  mask_ = capacity - 1;
}

void InFlightTable::insert(uint64_t id, size_t ticket) {
  size_t i = home(id);
  while (entries_[i].id != 0) i = (i + 1) & mask_;
  entries_[i] = Entry{id, ticket};
}

size_t InFlightTable::find(uint64_t id) const {
  if (id == 0 || entries_.empty()) return npos;
  for (size_t i = home(id);; i = (i + 1) & mask_) {
    if (entries_[i].id == id) return entries_[i].ticket;
    if (entries_[i].id == 0) return npos;
  }
}

void InFlightTable::erase(uint64_t id) {
  size_t i = home(id);
  while (entries_[i].id != id) {
    if (entries_[i].id == 0) return;
    i = (i + 1) & mask_;
  }
  // Backward shift: entries after the hole that may live in it move up,
  // so that a lookup never stops at a hole before its entry.
  for (size_t j = (i + 1) & mask_; entries_[j].id != 0; j = (j + 1) & mask_) {
    const size_t want = home(entries_[j].id);
    // j's entry may fill the hole at i unless its home lies in (i, j].
    const bool stays = i <= j ? (i < want && want <= j) : (i < want || want <= j);
    if (!stays) {
      entries_[i] = entries_[j];
      i = j;
    }
  }
  entries_[i] = Entry{};
}

void Ledger::make_tickets() {
  ring_base.clear();
  size_t slots = 0;
  for (const Ring& r : rings) {
    ring_base.push_back(slots);
    slots += r.slots.size();
  }
  tickets.assign(slots, Ticket{});
  in_flight_ids.reset(slots);
  retired.assign(std::max<size_t>(slots, 16), RetiredCopy{});
}

Ticket& Ledger::issue(size_t qi, size_t ri, size_t slot, const CopyStep& step, uint64_t offset,
                      uint64_t nbytes) {
  const size_t index = ring_base[ri] + slot;
  Ticket& t = tickets[index];
  t.breach_in_call.clear();  // keeps its capacity: no allocation
  t.id = next_id++;
  t.queue = qi;
  t.ring = ri;
  t.slot = slot;
  t.nbytes = nbytes;
  t.step = &step;
  t.offset = offset;
  t.released = false;
  t.copy_failed = false;
  t.released_twice = false;
  t.in_call = true;
  t.late = false;
  t.returned = 0;
  in_flight_ids.insert(t.id, index);
  return t;
}

void* Ledger::token_of(uint64_t id) const {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(encode_token(serial, id)));
}

Ticket* Ledger::ticket_of(uint64_t id) {
  const size_t index = in_flight_ids.find(id);
  return index == InFlightTable::npos ? nullptr : &tickets[index];
}

void Ledger::retire(Ticket& t) {
  retired[retired_next] = RetiredCopy{t.id, t.queue, t.step, t.offset, t.nbytes, t.released_twice};
  retired_next = (retired_next + 1) % retired.size();
  in_flight_ids.erase(t.id);
  rings[t.ring].free.push_back(t.slot);  // reserved for every slot: no allocation
  t.id = 0;
}

extern "C" void devalloc_staged_copy_released(void* user_data) {
  std::lock_guard registry(g_ledgers_mutex);
  uint32_t serial = 0;
  uint64_t id = 0;
  decode_token(reinterpret_cast<uintptr_t>(user_data), &serial, &id);
  Ledger* found = nullptr;
  for (Ledger* l : registered_ledgers()) {
    if (l->serial == serial && serial != 0) {
      found = l;
      break;
    }
  }
  if (found == nullptr) {
    stray_release(user_data);
    return;
  }
  Ledger& ledger = *found;
  {
    std::lock_guard lock(ledger.mutex);
    // Texts name the schedule's steps and devices: only while the load
    // runs (an abandoned ledger outlives its schedule).
    if (id == 0 || id >= ledger.next_id) {
      ledger.breach = true;
      if (ledger.running) {
        ledger.fail(Status(StatusCode::device_error,
                           ledger.plugins() +
                               " broke PLUGIN-14 (PLUGIN-21 release accounting): on_release "
                               "came for a copy that was never issued"));
      }
      ledger.changed.notify_all();
      return;
    }
    Ticket* t = ledger.ticket_of(id);
    if (t == nullptr || t->released) {
      // The first release gave the slot back already (or will when the
      // call returns); giving it again would corrupt the ring. The load
      // ends instead, after the copy's own error when it failed
      // (PLUGIN-21), and says so once.
      ledger.breach = true;
      if (t != nullptr) {
        if (ledger.running && !t->released_twice) {
          std::string breach = "plugin " + ledger.plugin_of(*t) +
                               " broke PLUGIN-14 (PLUGIN-21 release accounting): " +
                               ledger.copy_of(*t) + " was released twice";
          if (t->in_call) {
            t->breach_in_call = std::move(breach);
          } else {
            ledger.fail_also(Status(StatusCode::device_error, breach));
          }
        }
        t->released_twice = true;
      } else if (ledger.running) {
        // Retired: named while it is among the last ones.
        RetiredCopy* old = nullptr;
        for (RetiredCopy& c : ledger.retired) {
          if (c.id == id) old = &c;
        }
        if (old == nullptr || !old->said_twice) {
          const std::string what =
              old == nullptr ? "copy " + std::to_string(id) + " of the load"
                             : ledger.copy_of(*old);
          const std::string plugin =
              old == nullptr ? ledger.plugins() : "plugin " + ledger.devices[old->queue]->plugin->name();
          ledger.fail_also(Status(StatusCode::device_error,
                                  plugin + " broke PLUGIN-14 (PLUGIN-21 release accounting): " +
                                      what + " was released twice"));
          if (old != nullptr) old->said_twice = true;
        }
      }
    } else {
      t->released = true;
      if (t->late) ++ledger.late_releases[t->queue];
      ledger.unreleased[t->queue].erase(t->id);
      ledger.in_flight -= t->nbytes;
      ++ledger.releases_seen;
      // Its slot and ticket serve the next copy once the call returned too.
      if (!t->in_call) ledger.retire(*t);
    }
  }
  ledger.changed.notify_all();
}

void stop_running(Ledger& ledger) {
  std::lock_guard lock(g_ledgers_mutex);
  ledger.running = false;
}

// A ledger whose plugin broke the release rules is never freed: a late
// release writes into memory that is still ours, and no slot is freed
// under a copy that may still read it. It stays in registered_ledgers()
// (it was registered before any copy), which keeps it reachable and found
// by later releases.
void abandon(std::unique_ptr<Ledger> ledger) { static_cast<void>(ledger.release()); }

Result<size_t> take_slot(Ledger& ledger, size_t ring_index, std::atomic<bool>& stop) {
  std::unique_lock lock(ledger.mutex);
  Ring& ring = ledger.rings[ring_index];
  for (;;) {
    if (!ledger.failure.ok() || stop) {
      return Status(StatusCode::internal, "stopped");
    }
    if (!ring.free.empty()) {
      const size_t slot = ring.free.back();
      ring.free.pop_back();
      return slot;
    }
    const uint64_t seen = ledger.releases_seen;
    if (ledger.changed.wait_for(lock, ledger.sync_after, [&] {
          return !ledger.failure.ok() || stop || !ring.free.empty() ||
                 ledger.releases_seen != seen;
        })) {
      continue;
    }
    // PLUGIN-20: no release for a while; the plugin may be waiting for us.
    if (Status s = force_progress(ledger, lock, ring_index); !s.ok()) {
      ledger.fail(s);
      stop = true;
      ledger.changed.notify_all();
    }
  }
}

namespace {

// Synchronizes each device that holds a slot of the ring, then gives its
// releases release_timeout to arrive. Called and returns with lock held.
Status force_progress(Ledger& ledger, std::unique_lock<std::mutex>& lock, size_t ring_index) {
  std::vector<std::pair<size_t, uint64_t>> waits;  // queue, last ticket before sync
  for (size_t qi : ledger.rings[ring_index].queues) {
    if (!ledger.unreleased[qi].empty()) waits.emplace_back(qi, *ledger.unreleased[qi].rbegin());
  }
  // Every slot may be with a thread still reading: nothing to wait for.
  if (waits.empty()) return Status();
  ++ledger.forced_synchronizes;
  // The synchronize covers the copies whose call returned before it.
  const uint64_t covered = ledger.calls_returned;
  lock.unlock();
  Status synced;
  for (const auto& [qi, last] : waits) {
    const ResolvedDevice& device = *ledger.devices[qi];
    Status s = device.plugin->synchronize(device.device);
    if (!s.ok() && synced.ok()) {
      synced = s.with_context("synchronizing " + device.describe() +
                              " while waiting for staging memory");
    }
  }
  lock.lock();
  if (!synced.ok()) return synced;
  for (const auto& [qi, last] : waits) {
    if (Status s = wait_released(ledger, lock, qi, covered, last); !s.ok()) return s;
  }
  return Status();
}

}  // namespace

Status wait_released(Ledger& ledger, std::unique_lock<std::mutex>& lock, size_t qi,
                     uint64_t covered, uint64_t up_to_id) {
  auto& pending = ledger.unreleased[qi];
  // Set through the C++ API it may be anything; a deadline past the clock's
  // range would overflow (the config refuses more than a day).
  const std::chrono::milliseconds timeout =
      std::clamp(ledger.release_timeout, std::chrono::milliseconds(0), kMaxReleaseTimeout);
  // A copy whose call returned before the synchronize (its returned count
  // at most `covered`) and that is still unreleased now is late (PLUGIN-20),
  // counted once when its release comes, however many threads wait for it.
  // One still in its call then, on another thread, is not.
  // Only those are waited for: PLUGIN-20 lets a plugin keep the release of
  // a copy whose call was still running until a later synchronize, which
  // the caller's next wait for a slot makes (a copy call may take longer
  // than release_timeout, and its thread may have no piece after it).
  const auto covered_by_the_synchronize = [&](const Ticket& t) {
    return !t.in_call && t.returned <= covered;
  };
  // The oldest ticket up to up_to_id that the synchronize covered and that
  // is still unreleased, or nullptr.
  const auto first_owed = [&]() -> const Ticket* {
    for (auto it = pending.begin(); it != pending.end() && *it <= up_to_id; ++it) {
      const Ticket* t = ledger.ticket_of(*it);
      if (t != nullptr && covered_by_the_synchronize(*t)) return t;
    }
    return nullptr;
  };
  bool late = false;
  for (auto it = pending.begin(); it != pending.end() && *it <= up_to_id; ++it) {
    Ticket* t = ledger.ticket_of(*it);
    if (t != nullptr && covered_by_the_synchronize(*t)) t->late = late = true;
  }
  if (late && ledger.late_waiters[qi]++ == 0) {
    ledger.late_wait_since[qi] = std::chrono::steady_clock::now();
  }
  const bool done = !late || ledger.changed.wait_for(lock, timeout, [&] {
    return ledger.gave_up || first_owed() == nullptr;
  });
  if (late && --ledger.late_waiters[qi] == 0) {
    ledger.late_wait[qi] += std::chrono::steady_clock::now() - ledger.late_wait_since[qi];
  }
  const Ticket* owed = first_owed();
  if (done || owed == nullptr) return Status();
  ledger.breach = true;
  ledger.gave_up = true;
  const Ticket& t = *owed;
  // A failed copy is released too (PLUGIN-14); a copy that went through
  // is released by the synchronize that covers it at the latest (PLUGIN-20).
  const std::string rule = t.copy_failed ? "PLUGIN-14" : "PLUGIN-20";
  return Status(StatusCode::device_error,
                "plugin " + ledger.plugin_of(t) + " broke " + rule +
                    " (PLUGIN-21 release accounting): " + ledger.copy_of(t) +
                    (t.copy_failed ? " failed and" : "") + " was not released " +
                    std::to_string(timeout.count()) +
                    " ms after synchronize returned ([load] release_timeout); "
                    "its staging memory is kept, never freed, and buffer " +
                    std::to_string(t.step->buffer->memory_id()) +
                    " stays allocated until the plugin is closed");
}

}  // namespace devalloc::load
