#include "release_tracker.hpp"

#include <devalloc/address_text.hpp>

#include <algorithm>
#include <optional>

namespace devalloc::detail {

namespace {

// A copy's user_data: the tracker's serial (24 bits) and the copy's number
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

// Set while a completion runs from a plugin's on_release.
thread_local bool t_in_release = false;

}  // namespace

// The live trackers, by serial: a release looks its user_data up here, with
// the registry's mutex held throughout (then a tracker's; never the other
// way round), so a release that comes after its plugin was closed, or a
// made-up one, is never followed.
struct TrackerRegistry {
  std::mutex mutex;
  std::vector<ReleaseTracker*> live;
  uint32_t last_serial = 0;

  static TrackerRegistry& get() {
    static auto* registry = new TrackerRegistry();  // never destroyed: releases may come late
    return *registry;
  }
};

extern "C" {
static void devalloc_tracked_copy_released(void* user_data) { ReleaseTracker::release(user_data); }
}

ReleaseTracker::ReleaseTracker(std::string plugin) : plugin_(std::move(plugin)) {
  TrackerRegistry& registry = TrackerRegistry::get();
  std::lock_guard lock(registry.mutex);
  // A serial no live tracker has.
  for (;;) {
    registry.last_serial = registry.last_serial % kMaxSerial + 1;
    const uint32_t candidate = registry.last_serial;
    if (std::none_of(registry.live.begin(), registry.live.end(),
                     [&](const ReleaseTracker* t) { return t->serial_ == candidate; })) {
      serial_ = candidate;
      break;
    }
  }
  registry.live.push_back(this);
}

ReleaseTracker::~ReleaseTracker() {
  TrackerRegistry& registry = TrackerRegistry::get();
  std::lock_guard lock(registry.mutex);
  auto& live = registry.live;
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
}

void* ReleaseTracker::token_of(uint64_t id) const {
  const uint64_t token = ((uint64_t{serial_} << kIdBits) | id) * kTokenFactor;
  return reinterpret_cast<void*>(static_cast<uintptr_t>(token));
}

ReleaseTracker::Copy* ReleaseTracker::find(uint64_t id) {
  if (id == 0 || index_.empty()) return nullptr;
  for (size_t i = home(id);; i = (i + 1) & index_mask_) {
    if (index_[i].id == id) return &copies_[index_[i].index];
    if (index_[i].id == 0) return nullptr;
  }
}

void ReleaseTracker::index_insert(uint64_t id, size_t index) {
  size_t i = home(id);
  while (index_[i].id != 0) i = (i + 1) & index_mask_;
  index_[i] = IndexEntry{id, index};
}

void ReleaseTracker::index_erase(uint64_t id) {
  size_t i = home(id);
  while (index_[i].id != id) {
    if (index_[i].id == 0) return;
    i = (i + 1) & index_mask_;
  }
  // Backward shift: entries after the hole that may live in it move up,
  // so that a lookup never stops at a hole before its entry.
  for (size_t j = (i + 1) & index_mask_; index_[j].id != 0; j = (j + 1) & index_mask_) {
    const size_t want = home(index_[j].id);
    // j's entry may fill the hole at i unless its home lies in (i, j].
    const bool stays = i <= j ? (i < want && want <= j) : (i < want || want <= j);
    if (!stays) {
      index_[i] = index_[j];
      i = j;
    }
  }
  index_[i] = IndexEntry{};
}

void* ReleaseTracker::issue(uint32_t device, uint64_t dst, const void* src, uint64_t nbytes,
                            const void* owner, CopyCompletion&& done) {
  std::lock_guard lock(mutex_);
  // Room first, so that a failure (bad_alloc) leaves nothing half recorded
  // and no later step allocates.
  if (retired_.empty()) retired_.assign(kReleasedCopiesKept, Retired{});
  if (free_.empty()) {
    free_.reserve(copies_.size() + 1);
    if (2 * (copies_.size() + 1) > index_.size()) {
      size_t capacity = 16;
      while (capacity < 4 * (copies_.size() + 1)) capacity *= 2;
      std::vector<IndexEntry> bigger(capacity);
      index_.swap(bigger);
      index_mask_ = capacity - 1;
      for (size_t k = 0; k < copies_.size(); ++k) {
        if (copies_[k].id != 0) index_insert(copies_[k].id, k);
      }
    }
    copies_.emplace_back();
    free_.push_back(copies_.size() - 1);
  }
  const size_t index = free_.back();
  Copy& c = copies_[index];
  free_.pop_back();
  c.id = next_id_++;
  index_insert(c.id, index);
  c.device = device;
  c.dst = dst;
  c.src = src;
  c.nbytes = nbytes;
  c.check = 0;
  c.owner = owner;
  c.done = std::move(done);
  c.released = false;
  c.released_twice = false;
  c.in_call = true;
  c.call_failed = false;
  c.owed = false;
  c.said_twice = false;
  c.reported = false;
  c.observed = false;
  c.returned = 0;
  ++in_flight_;
  return token_of(c.id);
}

CopyCompletion ReleaseTracker::take_completion(Copy& c, CopyOutcome& outcome) {
  outcome.late = c.owed;
  outcome.released_twice = c.released_twice;
  CopyCompletion done = std::move(c.done);
  c.done.reset();
  return done;
}

void ReleaseTracker::complete(size_t index, CopyCompletion done, CopyOutcome&& outcome) {
  if (done) done(std::move(outcome));
  // Gone, with what it holds, before a wait for the copy can end.
  done.reset();
  {
    std::lock_guard lock(mutex_);
    Copy& c = copies_[index];
    retired_[retired_next_] =
        Retired{c.id, c.device, c.dst, c.nbytes, c.owner, c.released_twice || c.said_twice};
    retired_next_ = (retired_next_ + 1) % retired_.size();
    index_erase(c.id);
    c.id = 0;
    free_.push_back(index);  // reserved at issue
    --in_flight_;
  }
  released_.notify_all();
}

void ReleaseTracker::returned(void* token, const Status& call) {
  const uint64_t id = (reinterpret_cast<uintptr_t>(token) * kTokenInverse) &
                      ((uint64_t{1} << kIdBits) - 1);
  CopyCompletion done;
  CopyOutcome outcome;
  size_t index = 0;
  bool finished = false;
  {
    std::unique_lock lock(mutex_);
    Copy* c = find(id);
    if (c == nullptr) return;  // not ours: never happens
    // A release the observer checks now completes the copy here, once
    // checked, so that its completion runs on the calling thread.
    released_.wait(lock, [&] {
      c = find(id);  // the records may move while it waits
      return !c->observed;
    });
    c->in_call = false;
    c->returned = ++returned_;
    c->call_failed = !call.ok();
    if (c->released) {
      outcome.call = call;
      done = take_completion(*c, outcome);
      index = static_cast<size_t>(c - copies_.data());
      finished = true;
    }
  }
  if (finished) complete(index, std::move(done), std::move(outcome));
}

uint64_t ReleaseTracker::copy_of(const void* token) const {
  const uint64_t value = reinterpret_cast<uintptr_t>(token) * kTokenInverse;
  const uint64_t id = value & ((uint64_t{1} << kIdBits) - 1);
  if (static_cast<uint32_t>(value >> kIdBits) != serial_) return 0;
  std::lock_guard lock(mutex_);
  return const_cast<ReleaseTracker*>(this)->find(id) != nullptr ? id : 0;
}

void ReleaseTracker::note_check(uint64_t id, uint64_t value) {
  std::lock_guard lock(mutex_);
  if (Copy* c = find(id)) c->check = value;
}

Unreleased ReleaseTracker::unreleased(uint32_t device, uint64_t covered, bool mark) {
  std::lock_guard lock(mutex_);
  const Copy* oldest = nullptr;
  const Copy* oldest_new = nullptr;
  Unreleased out;
  for (Copy& c : copies_) {
    if (c.id == 0 || c.released || c.in_call || c.returned > covered ||
        (device != kAnyDevice && c.device != device)) {
      continue;
    }
    ++out.count;
    if (oldest == nullptr || c.id < oldest->id) oldest = &c;
    if (!c.reported) {
      ++out.newly;
      if (oldest_new == nullptr || c.id < oldest_new->id) oldest_new = &c;
    }
    if (mark) c.reported = true;
  }
  if (oldest != nullptr) out.first = copy_text(oldest->device, oldest->dst, oldest->nbytes);
  if (oldest_new != nullptr) {
    out.first_new = copy_text(oldest_new->device, oldest_new->dst, oldest_new->nbytes);
  }
  return out;
}

bool ReleaseTracker::unreleased_reads(const void* src, uint64_t nbytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(src);
  std::lock_guard lock(mutex_);
  for (const Copy& c : copies_) {
    const auto other = reinterpret_cast<uintptr_t>(c.src);
    if (c.id != 0 && !c.released && other < begin + nbytes && begin < other + c.nbytes) {
      return true;
    }
  }
  return false;
}

uint64_t ReleaseTracker::remembered() const {
  std::lock_guard lock(mutex_);
  uint64_t n = copies_.size() - free_.size();
  for (const Retired& r : retired_) n += r.id != 0 ? 1 : 0;
  return n;
}

uint64_t ReleaseTracker::unreleased_count() const {
  std::lock_guard lock(mutex_);
  uint64_t n = 0;
  for (const Copy& c : copies_) n += c.id != 0 && !c.released ? 1 : 0;
  return n;
}

void ReleaseTracker::observe(ReleaseObserver* observer) {
  std::lock_guard lock(TrackerRegistry::get().mutex);
  observer_ = observer;
}

bool ReleaseTracker::in_release() { return t_in_release; }

uint64_t ReleaseTracker::returned_calls() const {
  std::lock_guard lock(mutex_);
  return returned_;
}

void ReleaseTracker::synchronized(uint32_t device, uint64_t covered) {
  std::lock_guard lock(mutex_);
  for (Copy& c : copies_) {
    if (c.id != 0 && c.device == device && !c.in_call && c.returned <= covered && !c.released) {
      c.owed = true;
    }
  }
}

ReleaseWait ReleaseTracker::wait_owed(uint32_t device, std::chrono::milliseconds timeout,
                                      const void* owner, const std::atomic<bool>* stop) {
  // The oldest owed copy of the device (and owner) not released yet; with
  // `completing`, also one released whose completion has not run yet.
  const auto oldest_owed = [&](bool completing) -> const Copy* {
    const Copy* oldest = nullptr;
    for (const Copy& c : copies_) {
      if (c.id != 0 && c.device == device && c.owed && (completing || !c.released) &&
          (owner == nullptr || c.owner == owner) && (oldest == nullptr || c.id < oldest->id)) {
        oldest = &c;
      }
    }
    return oldest;
  };
  ReleaseWait wait;
  std::unique_lock lock(mutex_);
  if (oldest_owed(true) == nullptr) return wait;
  wait.waited = oldest_owed(false) != nullptr;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // In slices, so that `stop` is seen without a notification.
  constexpr auto kSlice = std::chrono::milliseconds(10);
  while (oldest_owed(true) != nullptr && (stop == nullptr || !stop->load())) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    released_.wait_until(lock, std::min(deadline, now + kSlice));
  }
  if (const Copy* c = oldest_owed(false)) {
    wait.owed = OwedRelease{c->device, c->dst, c->nbytes, c->call_failed};
  }
  return wait;
}

std::string ReleaseTracker::copy_text(uint32_t device, uint64_t dst, uint64_t nbytes) const {
  return "copy_host_to_device(device " + std::to_string(device) + ", dst " + hex_address(dst) + ", " +
         std::to_string(nbytes) + " bytes)";
}

void ReleaseTracker::add_breach(ReleaseBreach breach) {
  breaches_.push_back(std::move(breach));
  if (breaches_.size() > kReleaseBreachesKept) breaches_.pop_front();
  ++breach_count_;
}

uint64_t ReleaseTracker::breach_count() const {
  std::lock_guard lock(mutex_);
  return breach_count_;
}

std::vector<ReleaseBreach> ReleaseTracker::breaches_since(uint64_t mark) const {
  std::lock_guard lock(mutex_);
  const uint64_t first_kept = breach_count_ - breaches_.size();
  std::vector<ReleaseBreach> out;
  for (uint64_t n = std::max(mark, first_kept); n < breach_count_; ++n) {
    out.push_back(breaches_[static_cast<size_t>(n - first_kept)]);
  }
  return out;
}

uint64_t ReleaseTracker::in_flight() const {
  std::lock_guard lock(mutex_);
  return in_flight_;
}

void ReleaseTracker::on_release(uint64_t id, const void* user_data) {
  CopyCompletion done;
  CopyOutcome outcome;
  size_t index = 0;
  bool finished = false;
  bool first = false;
  ReleasedCopy released;
  std::optional<StrayRelease> stray;
  {
    std::lock_guard lock(mutex_);
    const std::string rule =
        "plugin " + plugin_ + " broke PLUGIN-14 (PLUGIN-21 release accounting): ";
    Copy* c = id == 0 ? nullptr : find(id);
    if (c != nullptr && !c->released) {
      c->released = true;
      first = true;
      released = ReleasedCopy{c->id, c->device, c->dst, c->src, c->nbytes, c->check};
      // The observer sees the copy before anyone can run its completion.
      c->observed = observer_ != nullptr;
      if (!c->in_call && !c->observed) {
        done = take_completion(*c, outcome);
        index = static_cast<size_t>(c - copies_.data());
        finished = true;
      }
    } else if (c != nullptr && c->in_call) {
      // Released again while its call runs: the completion says so.
      c->released_twice = true;
      stray = StrayRelease{true, c->device, c->dst, c->nbytes, user_data};
    } else if (c != nullptr) {
      // Released again after its completion was handed over.
      stray = StrayRelease{true, c->device, c->dst, c->nbytes, user_data};
      if (!c->said_twice) {
        c->said_twice = true;
        add_breach(ReleaseBreach{c->device, c->dst, c->nbytes, c->owner, true,
                                 rule + copy_text(c->device, c->dst, c->nbytes) +
                                     " was released twice"});
      }
    } else {
      Retired* old = nullptr;
      for (Retired& r : retired_) {
        if (r.id == id && id != 0) old = &r;
      }
      if (old != nullptr) {
        stray = StrayRelease{true, old->device, old->dst, old->nbytes, user_data};
        if (!old->said_twice) {
          old->said_twice = true;
          add_breach(ReleaseBreach{old->device, old->dst, old->nbytes, old->owner, true,
                                   rule + copy_text(old->device, old->dst, old->nbytes) +
                                       " was released twice"});
        }
      } else if (id != 0 && id < next_id_) {
        stray = StrayRelease{false, 0, 0, 0, user_data};
        add_breach(ReleaseBreach{0, 0, 0, nullptr, false,
                                 rule + "on_release came for copy " + std::to_string(id) +
                                     ", released long before (a second release)"});
      } else {
        stray = StrayRelease{false, 0, 0, 0, user_data};
        add_breach(ReleaseBreach{0, 0, 0, nullptr, false,
                                 rule + "on_release came with user_data " +
                                     hex_address(reinterpret_cast<uintptr_t>(user_data)) +
                                     ", which no copy was given"});
      }
    }
  }
  // The observer first: it checks the copy before its source goes back.
  if (observer_ != nullptr && stray) observer_->stray(*stray);
  if (observer_ != nullptr && first) {
    observer_->released(released);
    std::lock_guard lock(mutex_);
    Copy* c = find(id);  // kept: its completion was not taken
    c->observed = false;
    if (!c->in_call) {
      done = take_completion(*c, outcome);
      index = static_cast<size_t>(c - copies_.data());
      finished = true;
    }
  }
  released_.notify_all();
  if (finished) {
    t_in_release = true;
    complete(index, std::move(done), std::move(outcome));
    t_in_release = false;
  }
}

void ReleaseTracker::release(void* user_data) noexcept {
  const uint64_t value = reinterpret_cast<uintptr_t>(user_data) * kTokenInverse;
  const auto serial = static_cast<uint32_t>(value >> kIdBits);
  const uint64_t id = value & ((uint64_t{1} << kIdBits) - 1);
  TrackerRegistry& registry = TrackerRegistry::get();
  std::unique_lock lock(registry.mutex);
  ReleaseTracker* tracker = nullptr;
  for (ReleaseTracker* t : registry.live) {
    if (t->serial_ == serial && serial != 0) tracker = t;
  }
  try {
    if (tracker == nullptr) {
      // No tracker's: made up, or of a plugin closed since. While exactly
      // one plugin has copies in flight it is the likely sender (with none
      // in flight anywhere, the one live plugin); otherwise no one can be
      // told (its missing release ends that load).
      int count = 0;
      for (ReleaseTracker* t : registry.live) {
        if (t->in_flight() != 0) {
          tracker = t;
          ++count;
        }
      }
      if (count == 0 && registry.live.size() == 1) {
        tracker = registry.live.front();
        count = 1;
      }
      if (count != 1) return;
      {
        std::lock_guard tracker_lock(tracker->mutex_);
        tracker->add_breach(ReleaseBreach{
            0, 0, 0, nullptr, false,
            "plugin " + tracker->plugin_ +
                " (or a plugin closed before) broke PLUGIN-14 (PLUGIN-21 release accounting): "
                "on_release came with user_data " +
                hex_address(reinterpret_cast<uintptr_t>(user_data)) + ", which no copy was given"});
      }
      tracker->released_.notify_all();
      if (tracker->observer_ != nullptr) {
        tracker->observer_->stray(StrayRelease{false, 0, 0, 0, user_data});
      }
      return;
    }
    // The completion runs with the registry held: the tracker (and its
    // Plugin) cannot go while it runs.
    tracker->on_release(id, user_data);
  } catch (...) {
    // Wording a breach allocates; without memory the breach is counted
    // with no text, never thrown into the plugin.
  }
}

// The C callback the Plugin hands with every tracked copy.
devalloc_release_fn tracked_release_callback() { return devalloc_tracked_copy_released; }

}  // namespace devalloc::detail
