// Release accounting of one load's staged copies (PLUGIN-14, PLUGIN-20,
// PLUGIN-21): each copy issued from a slot gets a ticket, whose address is
// the copy's user_data; devalloc_staged_copy_released gives the slot back, once. A
// release twice, one that was never issued, or one still missing
// release_timeout after the synchronize that covered it ends the load
// naming the plugin, the rule and the copy. A ledger whose plugin broke the
// rules is never freed: a late release writes into memory still ours.
#pragma once

#include "copy_schedule.hpp"
#include "copy_texts.hpp"
#include "staging_ring.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace devalloc::load {

// A copy issued from a slot, until its release and the return of its copy
// call; then the slot's ticket serves the slot's next copy. One per slot:
// the ledger holds as many tickets as the rings hold slots, whatever the
// number of copies.
struct Ticket {
  uint64_t id = 0;                 // the copy's number in the load (0: none)
  size_t queue = 0;
  size_t ring = 0;
  size_t slot = 0;
  uint64_t nbytes = 0;
  const CopyStep* step = nullptr;  // the range the piece belongs to
  uint64_t offset = 0;             // of the piece in the step
  bool released = false;           // under the ledger's mutex
  bool copy_failed = false;        // its copy call returned an error
  bool released_twice = false;     // said once
  bool in_call = true;             // its copy call has not returned yet
  // Unreleased when a synchronize that covered it returned: its release is
  // late (PLUGIN-20), and counted when it comes.
  bool late = false;
  uint64_t returned = 0;           // Ledger::calls_returned when it did
  // A breach of this copy during its call: said after the call's own error
  // when the call fails (PLUGIN-21), else as soon as the call returns.
  std::string breach_in_call;
};

// A copy that was released and whose call returned, kept for a while to
// name it should it be released again.
struct RetiredCopy {
  uint64_t id = 0;
  size_t queue = 0;
  const CopyStep* step = nullptr;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  bool said_twice = false;
};

// Copy numbers of the copies in flight -> their tickets: open addressing
// over a table made once with room for twice the slots, so that neither a
// copy nor a release allocates.
class InFlightTable {
 public:
  void reset(size_t most);  // room for `most` entries; allocates
  void insert(uint64_t id, size_t ticket);
  // The ticket of copy id, or npos.
  size_t find(uint64_t id) const;
  void erase(uint64_t id);
  static constexpr size_t npos = static_cast<size_t>(-1);

 private:
  struct Entry {
    uint64_t id = 0;  // 0: empty
    size_t ticket = 0;
  };
  size_t home(uint64_t id) const { return (id * 0x9E3779B97F4A7C15ull >> 17) & mask_; }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
};

// The release accounting of one execute(): slots, tickets, and the first
// failure. Shared with the plugins through the copies' user_data, a token
// that names the ledger and the copy (token_of); leaked, never freed, when
// a release may still come (see abandon()).
struct Ledger {
  ~Ledger();

  // From the load's options: how long a release may come after the
  // synchronize that covered it, and how long a wait for a slot sees no
  // release before it synchronizes.
  std::chrono::milliseconds release_timeout{5000};
  std::chrono::milliseconds sync_after{15};

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Ring> rings;
  // One ticket per slot: ring r's slot s is tickets[ring_base[r] + s]. Made
  // once, before the first copy (make_tickets).
  std::vector<Ticket> tickets;
  std::vector<size_t> ring_base;
  InFlightTable in_flight_ids;
  uint64_t next_id = 1;  // copy numbers are 1, 2, ... in the order issued
  // The last retired copies, oldest overwritten first.
  std::vector<RetiredCopy> retired;
  size_t retired_next = 0;
  uint32_t serial = 0;  // this ledger's number among the process's; set by register_ledger
  const std::vector<CopyRequest>* requests = nullptr;  // the schedule's, for texts
  bool running = false;  // between register_ledger and the end of run()
  std::vector<std::set<uint64_t>> unreleased;  // per queue: copy numbers
  // Per queue: releases that came after the synchronize covering them
  // returned, and the time spent waiting for them: while at least one
  // thread waited (several may wait for the same copies at once).
  std::vector<uint64_t> late_releases;
  std::vector<std::chrono::steady_clock::duration> late_wait;
  std::vector<uint32_t> late_waiters;
  std::vector<std::chrono::steady_clock::time_point> late_wait_since;
  std::vector<const ResolvedDevice*> devices;  // per queue
  uint64_t releases_seen = 0;
  uint64_t calls_returned = 0;  // copy calls that returned, counted in order
  uint64_t in_flight = 0;
  uint64_t max_in_flight = 0;
  uint64_t forced_synchronizes = 0;
  Status failure;  // the first one; stops every thread
  bool breach = false;  // a release rule was broken: never free the ledger
  // A release did not come within release_timeout: the other queues' waits
  // end at once instead of each taking the timeout again. Other breaches
  // (a release twice, a stray one) do not end the waits: the copies still
  // in flight are waited for, so their buffers are not freed before.
  bool gave_up = false;

  // The tickets, the table and the retired list, for the rings' slots:
  // the ledger's only allocations for its copies. Before the first copy.
  void make_tickets();
  // Issues a copy of piece (step, offset, nbytes) of queue qi from slot
  // `slot` of ring ri: its ticket, filled. Mutex held; never allocates.
  Ticket& issue(size_t qi, size_t ri, size_t slot, const CopyStep& step, uint64_t offset,
                uint64_t nbytes);
  // The user_data of copy id.
  void* token_of(uint64_t id) const;
  // The ticket of copy id while it is in flight, or nullptr.
  Ticket* ticket_of(uint64_t id);
  // A copy released whose call returned: its slot goes back to its ring,
  // its ticket to the next copy. Mutex held.
  void retire(Ticket& t);

  void fail(Status s) {
    if (failure.ok()) failure = std::move(s);
  }
  // A broken release rule found after the load failed already: both are
  // said, the first failure first.
  void fail_also(const Status& s) {
    if (failure.ok()) {
      failure = s;
    } else {
      failure = Status(failure.code(), failure.message() + "; then " + s.message());
    }
  }

  // "copy of tensor "a" .. "b" (bytes 0..4096 of buffer 3) to host:0 (...)"
  std::string copy_of(const Ticket& t) const {
    return copy_text(piece_of(*t.step, t.offset, t.nbytes, *requests), *devices[t.queue]);
  }
  std::string copy_of(const RetiredCopy& c) const {
    return copy_text(piece_of(*c.step, c.offset, c.nbytes, *requests), *devices[c.queue]);
  }
  std::string plugin_of(const Ticket& t) const {
    return devices[t.queue]->plugin->name();
  }
  // "plugin a" or "plugins a, b": those this load hands until-released
  // copies to (the staged queues; a direct read gets no release).
  std::string plugins() const {
    std::set<std::string> names;
    for (const Ring& r : rings) {
      for (size_t qi : r.queues) names.insert(devices[qi]->plugin->name());
    }
    std::string text;
    for (const std::string& n : names) text += (text.empty() ? "" : ", ") + n;
    return (names.size() == 1 ? "plugin " : "plugins ") + text;
  }
};

// Makes the ledger findable by releases (before the first copy), and running.
void register_ledger(Ledger& ledger);
// The load ended: from here no release makes a text (texts name the
// schedule, which may be gone; an abandoned ledger stays).
void stop_running(Ledger& ledger);
// Keeps a ledger whose plugin broke the release rules, never freed.
void abandon(std::unique_ptr<Ledger> ledger);

// The on_release callback of every staged copy; user_data is its ticket.
extern "C" void devalloc_staged_copy_released(void* user_data);

// A free slot of ring ring_index, waiting for a release; when none comes
// for sync_after it synchronizes the ring's devices (PLUGIN-20). Fails with
// internal "stopped" once the load failed or `stop` is set.
Result<size_t> take_slot(Ledger& ledger, size_t ring_index, std::atomic<bool>& stop);

// After synchronize(queue qi's device) returned: every ticket up to
// up_to_id that it covered (calls returned, counted, at most `covered`)
// must be released within release_timeout (PLUGIN-20, PLUGIN-21); those
// released only now are counted late. Called and returns with lock held.
Status wait_released(Ledger& ledger, std::unique_lock<std::mutex>& lock, size_t qi,
                     uint64_t covered, uint64_t up_to_id);

}  // namespace devalloc::load
