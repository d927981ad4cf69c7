// Releases on an engine whose completion is a fence value that only grows
// (a Vulkan timeline semaphore, a DMA ring's fence counter): the vendor
// submits a copy, learns the value the engine will signal when it is over,
// and pushes (value, device, release) under its own submission lock, so
// that values arrive in order. One worker thread waits the values in
// order, through the vendor's wait function, and fires each release as
// soon as its value is reached: no synchronize is needed for that. One
// FenceReleases per engine (per fence); it may serve several devices, and
// keeps failures per device.
#pragma once

#include <devalloc/plugin_kit/release.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace devalloc::plugin {

class FenceReleases {
 public:
  // Blocks until the fence has reached `value`. Throws Failure only when it
  // never will and no work it covers can still read host memory (the
  // device is lost): the releases it covers fire then. A wait that fails
  // while the work may still run must keep waiting (poll) instead.
  using Wait = std::function<void(uint64_t value)>;

  explicit FenceReleases(Wait wait);
  // Waits every value pushed (through Wait) and fires every release, in
  // order, then joins the worker. A release whose wait threw fires too.
  ~FenceReleases();
  FenceReleases(const FenceReleases&) = delete;
  FenceReleases& operator=(const FenceReleases&) = delete;

  // The release of work that is over once the fence reaches `value`
  // (already submitted: the worker will wait for it). Values never
  // decrease from one push to the next; several pushes may share one.
  // Throws bad_alloc, or Failure(INTERNAL) for a value below the last one,
  // with `release` left as it was: the caller then waits for the value
  // itself before it lets the release fire (PLUGIN-14).
  void push(uint64_t value, uint32_t device, Release&& release);
  // Returns once every release pushed with a value up to `value` has fired
  // (its wait returned or threw). Does not wait the fence for values that
  // no push carries: the vendor's own wait does that.
  void wait_for(uint64_t value) noexcept;
  // wait_for the last value pushed so far.
  void wait_for_all_pushed() noexcept;
  // The failures of waits that covered releases of `device` since the last
  // call for it, if any: reported once, then cleared.
  std::optional<std::string> take_error(uint32_t device);

 private:
  struct Entry {
    uint64_t value;
    uint32_t device;
    Release release;
  };
  struct Failures {
    uint64_t count = 0;
    std::string first;
  };
  void run() noexcept;
  // mutex_ held.
  void record_failure(uint32_t device, const std::string& message) noexcept;

  Wait wait_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<Entry> entries_;
  uint64_t last_pushed_ = 0;
  // The worker is firing the entries up to firing_value_, out of entries_.
  bool firing_ = false;
  uint64_t firing_value_ = 0;
  bool stopping_ = false;
  std::map<uint32_t, Failures> failures_;
  std::thread worker_;
};

}  // namespace devalloc::plugin
