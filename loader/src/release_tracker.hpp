// Release accounting of one plugin instance's until-released copies
// (PLUGIN-14, PLUGIN-20, PLUGIN-21), owned by its Plugin handle: every
// caller's copies are accounted here, once, whoever makes them.
//
// Each copy gets a token as its user_data (the tracker's serial and the
// copy's number, times an odd constant: no pointer, so a made-up user_data
// or one off by a little names no copy). Its completion runs once, when the
// plugin released it and its call returned. A second release, or one for
// no copy, is a breach kept for the callers to find (breaches_since). A
// synchronize of a device makes the copies it covered (their calls had
// returned when it began) owed: wait_owed waits for their releases.
//
// The validation layer checks the same copies through this ledger, not one
// of its own: it watches the releases (ReleaseObserver) and asks which
// copies are still unreleased.
#pragma once

#include <devalloc/plugin.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace devalloc::detail {

// A copy as its release finds it.
struct ReleasedCopy {
  uint64_t id = 0;
  uint32_t device = 0;
  uint64_t dst = 0;
  const void* src = nullptr;
  uint64_t nbytes = 0;
  uint64_t check = 0;  // what the observer noted at issue (note_check)
};

// A release that breaks PLUGIN-14: a second release of a copy (its device
// and range), or one with a user_data that names no copy.
struct StrayRelease {
  bool second = false;
  uint32_t device = 0;
  uint64_t dst = 0;
  uint64_t nbytes = 0;
  const void* user_data = nullptr;
};

// Told of every release of a tracker's copies (the validation layer). Its
// functions run on the releasing thread with no tracker mutex held (they
// may ask the tracker), the tracker alive, and before the copy's
// completion; they must not call into the plugin.
class ReleaseObserver {
 public:
  virtual void released(const ReleasedCopy& copy) noexcept = 0;
  virtual void stray(const StrayRelease& release) noexcept = 0;

 protected:
  ~ReleaseObserver() = default;
};

// Copies that a synchronize found unreleased (see ReleaseTracker::unreleased).
struct Unreleased {
  size_t count = 0;
  std::string first;  // the oldest one's text
  size_t newly = 0;   // of those, the ones no earlier call reported
  std::string first_new;
};

class ReleaseTracker {
 public:
  // `plugin` names the plugin in breach texts ("plugin NAME").
  explicit ReleaseTracker(std::string plugin);
  ~ReleaseTracker();
  ReleaseTracker(const ReleaseTracker&) = delete;
  ReleaseTracker& operator=(const ReleaseTracker&) = delete;

  // A copy about to be handed to the plugin: its token (the user_data).
  // Allocates only when more copies are in flight than ever before; throws
  // then, with nothing recorded and `done` not taken.
  void* issue(uint32_t device, uint64_t dst, const void* src, uint64_t nbytes,
              const void* owner, CopyCompletion&& done);
  // Its copy call returned `call`: runs the completion when the copy was
  // released already. Returns `call`.
  void returned(void* token, const Status& call);

  // The number of copy calls returned so far: a synchronize that begins now
  // covers those (synchronized).
  uint64_t returned_calls() const;
  // A synchronize of `device` that began when returned_calls() said
  // `covered` returned: its copies whose calls had returned by then are
  // owed a release now (PLUGIN-20).
  void synchronized(uint32_t device, uint64_t covered);
  // See Plugin::wait_released.
  ReleaseWait wait_owed(uint32_t device, std::chrono::milliseconds timeout, const void* owner,
                        const std::atomic<bool>* stop);

  // For the validation layer. The copy a token names, or 0 when it is no
  // token of this tracker's in flight.
  uint64_t copy_of(const void* token) const;
  // Notes `value` on copy `id` for the observer's released().
  void note_check(uint64_t id, uint64_t value);
  // The copies of `device` whose calls had returned when returned_calls()
  // said `covered` and that are not released (of every device with
  // kAnyDevice), oldest first. With mark, they count as reported from now.
  static constexpr uint32_t kAnyDevice = UINT32_MAX;
  Unreleased unreleased(uint32_t device, uint64_t covered, bool mark);
  // Whether an unreleased copy reads any of [src, src + nbytes).
  bool unreleased_reads(const void* src, uint64_t nbytes) const;
  // Records kept: the copies in flight and the released ones remembered
  // (at most kReleasedCopiesKept, devalloc/plugin.hpp) to name a second release of one.
  uint64_t remembered() const;
  uint64_t unreleased_count() const;
  // The observer of this tracker's releases, or nullptr; set and cleared
  // with no release running.
  void observe(ReleaseObserver* observer);
  // True on a thread while a completion runs from a plugin's on_release.
  static bool in_release();

  uint64_t breach_count() const;
  std::vector<ReleaseBreach> breaches_since(uint64_t mark) const;
  uint64_t in_flight() const;

  // The on_release of every copy made through a Plugin.
  static void release(void* user_data) noexcept;

 private:
  struct Copy {
    uint64_t id = 0;  // 0: a free record
    uint32_t device = 0;
    uint64_t dst = 0;
    const void* src = nullptr;
    uint64_t nbytes = 0;
    uint64_t check = 0;
    const void* owner = nullptr;
    CopyCompletion done;
    bool released = false;
    bool released_twice = false;
    bool in_call = true;
    bool call_failed = false;
    bool owed = false;      // a synchronize that covered it returned
    bool said_twice = false;  // a second release after its completion was handed over
    bool reported = false;    // unreleased(mark) counted it
    bool observed = false;    // its first release is with the observer now
    uint64_t returned = 0;  // returned_ when its call returned
  };
  struct Retired {
    uint64_t id = 0;
    uint32_t device = 0;
    uint64_t dst = 0;
    uint64_t nbytes = 0;
    const void* owner = nullptr;
    bool said_twice = false;
  };

  void* token_of(uint64_t id) const;
  // The record of copy id while it is in flight, or nullptr: through an
  // open-addressing table of copy numbers, so a release costs the same with
  // 10 or 100 000 copies in flight.
  Copy* find(uint64_t id);
  void index_insert(uint64_t id, size_t index);
  void index_erase(uint64_t id);
  size_t home(uint64_t id) const { return (id * 0x9E3779B97F4A7C15ull >> 17) & index_mask_; }
  // The copy was released and its call returned: its completion, moved
  // out to be run with no lock held. The record stays (a wait for owed
  // copies waits for the completion too) until complete() ran it.
  CopyCompletion take_completion(Copy& c, CopyOutcome& outcome);
  // Runs the completion taken from copies_[index], then retires the record.
  void complete(size_t index, CopyCompletion done, CopyOutcome&& outcome);
  void add_breach(ReleaseBreach breach);
  void on_release(uint64_t id, const void* user_data);
  void stray(const void* user_data);
  std::string copy_text(uint32_t device, uint64_t dst, uint64_t nbytes) const;

  const std::string plugin_;
  ReleaseObserver* observer_ = nullptr;  // under the registry's mutex
  uint32_t serial_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<Copy> copies_;
  std::vector<size_t> free_;  // indices of free records in copies_
  // Copy number -> index + 1 into copies_ (0: empty); at most half full.
  struct IndexEntry {
    uint64_t id = 0;
    size_t index = 0;
  };
  std::vector<IndexEntry> index_;
  size_t index_mask_ = 0;
  uint64_t next_id_ = 1;
  uint64_t returned_ = 0;
  uint64_t in_flight_ = 0;
  std::vector<Retired> retired_;  // the last ones, oldest overwritten first
  size_t retired_next_ = 0;
  std::deque<ReleaseBreach> breaches_;  // the last kReleaseBreachesKept
  uint64_t breach_count_ = 0;

  friend struct TrackerRegistry;
};

// The on_release a Plugin hands with every tracked copy.
devalloc_release_fn tracked_release_callback();

}  // namespace devalloc::detail
