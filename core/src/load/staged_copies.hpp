// The staged copies of one load in flight: which staging slots are free,
// the piece each busy slot is copying, and the load's first failure. The
// plugin handle accounts the releases (Plugin::copy_to_device_until_released,
// loader/src/release_tracker.hpp); each copy's completion gives its slot
// back here. The completions share this state: a copy whose release never
// came keeps it for as long as its plugin may still call back (PLUGIN-20);
// the plugin's staging it reads is then never freed by the host.
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

// The piece a slot is copying, from its copy call to its completion.
struct SlotCopy {
  bool busy = false;
  size_t queue = 0;
  const CopyStep* step = nullptr;  // the range the piece belongs to
  uint64_t offset = 0;             // of the piece in the step
  uint64_t nbytes = 0;
  // Released twice during a copy call that failed: said after the call's
  // own error, by the thread that made the call, which then frees the slot.
  std::string breach_after_call;
};

struct StagedCopies {
  // Frees the host's own slots. The plugin's staging (allocate_host) is
  // freed by ~Pipeline once every copy was released, or else kept, for its
  // instance to free (PLUGIN-9): this may run in a late release's
  // completion, on the plugin's thread, which must not call into the
  // plugin (PLUGIN-14).
  ~StagedCopies();

  // From the load's options: how long a release may come after the
  // synchronize that covered it, and how long a wait for a slot sees no
  // release before it synchronizes.
  std::chrono::milliseconds release_timeout{5000};
  std::chrono::milliseconds sync_after{15};

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Ring> rings;
  // Per slot: ring r's slot s is copies[ring_base[r] + s]. Made once, before
  // the first copy (make_slot_copies).
  std::vector<SlotCopy> copies;
  std::vector<size_t> ring_base;
  // Per ring: its plugin's release_breach_count() before the first copy.
  std::vector<uint64_t> breach_marks;
  const std::vector<CopyRequest>* requests = nullptr;  // the schedule's, for texts
  std::vector<const ResolvedDevice*> devices;          // per queue
  // Texts name the schedule's steps, which may be gone once the load
  // returned: a completion after that only gives its slot back.
  bool running = true;
  // Per queue: releases that came after a synchronize covering them
  // returned, and the time waited for them (the union of the waits).
  std::vector<uint64_t> late_releases;
  std::vector<std::chrono::steady_clock::duration> late_wait;
  std::vector<std::chrono::steady_clock::time_point> late_wait_until;
  uint64_t releases_seen = 0;
  uint64_t in_flight = 0;
  uint64_t max_in_flight = 0;
  uint64_t forced_synchronizes = 0;
  Status failure;  // the first one; stops every thread
  // A release did not come within release_timeout: the other waits end at
  // once instead of each taking the timeout again.
  std::atomic<bool> gave_up{false};

  void make_slot_copies();
  // The completion of the copy from slot `slot` of ring `ring`.
  static CopyCompletion completion(const std::shared_ptr<StagedCopies>& self, size_t ring,
                                   size_t slot);

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
  std::string copy_of(const SlotCopy& c) const;
  // The busy slot copying [dst, dst + nbytes) on `device` of `plugin`, or
  // nullptr (a copy of another load). Mutex held.
  const SlotCopy* find(const Plugin* plugin, uint32_t device, uint64_t dst, uint64_t nbytes) const;
  // Release breaches the rings' plugins kept since the load began, as the
  // load's failure (fail_also). Mutex held; returns whether there were any.
  bool take_breaches();
  // Adds a wait of queue qi that found late copies, from `since` to now,
  // to its late_wait (the union of such waits). Mutex held.
  void count_late_wait(size_t qi, std::chrono::steady_clock::time_point since);
};

// A free slot of ring ring_index, waiting for a release; when none comes
// for sync_after it synchronizes the ring's devices (PLUGIN-20). Fails with
// internal "stopped" once the load failed or `stop` is set.
Result<size_t> take_slot(StagedCopies& staged, size_t ring_index, std::atomic<bool>& stop);

// After synchronize(queue qi's device) returned: every copy of the load
// that it covered must be released within release_timeout (PLUGIN-20,
// PLUGIN-14 for a failed one). Mutex not held.
Status wait_released(StagedCopies& staged, size_t qi);

}  // namespace devalloc::load
