// What differs between the host plugin and its test variants, which
// tests/plugin_zoo builds from the same sources with one compile definition:
//   DEVALLOC_HOST_FAULT_INJECTION   "host_faulty": fails or corrupts chosen
//                                   calls on request, for rollback and
//                                   verify tests of the core;
//   DEVALLOC_HOST_BREAK_DURING_CALL "host_late_read": reads a during-call
//                                   source after the call returned, which
//                                   the conformance suite must catch;
//   DEVALLOC_HOST_RELEASE_ON_SYNC   "host_release_on_sync": performs and
//                                   releases until-released copies only
//                                   when synchronized (or read back, or
//                                   destroyed): the latest PLUGIN-20 allows;
//                                   a host that waits for a release without
//                                   synchronizing hangs on it;
//   DEVALLOC_HOST_DOUBLE_RELEASE    "host_double_release": releases every
//                                   until-released copy twice (breaks
//                                   PLUGIN-14; the host must fail the load,
//                                   PLUGIN-21);
//   DEVALLOC_HOST_STRAY_RELEASE     "host_stray_release": releases every
//                                   until-released copy once, then calls
//                                   on_release again with user_data + 1, a
//                                   value it was never given (breaks
//                                   PLUGIN-14; the conformance suite must
//                                   report it, not follow it);
//   DEVALLOC_HOST_EARLY_RELEASE     "host_early_release": releases every
//                                   until-released copy inside the copy
//                                   call, before it has read the source,
//                                   and reads it only when synchronized (or
//                                   read back, or destroyed): breaks
//                                   PLUGIN-14 the silent way, which the
//                                   conformance suite and the validation
//                                   layer's source check must catch;
//   DEVALLOC_HOST_ABI_1_0           "host_abi_1_0": hands out a function
//                                   table of ABI 1.0's size and no 1.1
//                                   capability, as a plugin built against
//                                   the 1.0 header would.
#pragma once

#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/options.hpp>
#include <devalloc/plugin_kit/release.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#if defined(DEVALLOC_HOST_FAULT_INJECTION) + defined(DEVALLOC_HOST_BREAK_DURING_CALL) + \
        defined(DEVALLOC_HOST_RELEASE_ON_SYNC) + defined(DEVALLOC_HOST_DOUBLE_RELEASE) + \
        defined(DEVALLOC_HOST_STRAY_RELEASE) + defined(DEVALLOC_HOST_ABI_1_0) + \
        defined(DEVALLOC_HOST_EARLY_RELEASE) > 1
#error "build one host plugin variant at a time"
#endif

namespace devalloc::host {

#if defined(DEVALLOC_HOST_FAULT_INJECTION)
inline constexpr const char* plugin_name = "host_faulty";
inline constexpr const char* accepted_options =
    "async, fail_allocate_at, fail_copy_at, fail_synchronize, flip_byte_at_copy, memory_limit, pool, "
    "release_failed_copy_twice, release_late_ms, skip_read_back_at";
#elif defined(DEVALLOC_HOST_BREAK_DURING_CALL)
inline constexpr const char* plugin_name = "host_late_read";
inline constexpr const char* accepted_options = "memory_limit, pool";
#elif defined(DEVALLOC_HOST_RELEASE_ON_SYNC)
inline constexpr const char* plugin_name = "host_release_on_sync";
inline constexpr const char* accepted_options = "memory_limit, pool";
#elif defined(DEVALLOC_HOST_DOUBLE_RELEASE)
inline constexpr const char* plugin_name = "host_double_release";
inline constexpr const char* accepted_options = "async, memory_limit, pool";
#elif defined(DEVALLOC_HOST_STRAY_RELEASE)
inline constexpr const char* plugin_name = "host_stray_release";
inline constexpr const char* accepted_options = "async, memory_limit, pool";
#elif defined(DEVALLOC_HOST_EARLY_RELEASE)
inline constexpr const char* plugin_name = "host_early_release";
inline constexpr const char* accepted_options = "memory_limit, pool";
#elif defined(DEVALLOC_HOST_ABI_1_0)
inline constexpr const char* plugin_name = "host_abi_1_0";
inline constexpr const char* accepted_options = "async, memory_limit, pool";
#else
inline constexpr const char* plugin_name = "host";
inline constexpr const char* accepted_options = "async, memory_limit, pool";
#endif

#if defined(DEVALLOC_HOST_BREAK_DURING_CALL)
// Long enough that a caller reusing src right after the call wins the race
// every time.
inline constexpr std::chrono::milliseconds during_call_read_delay{20};
inline constexpr bool breaks_during_call = true;
#else
inline constexpr std::chrono::milliseconds during_call_read_delay{0};
inline constexpr bool breaks_during_call = false;
#endif

#if defined(DEVALLOC_HOST_RELEASE_ON_SYNC)
inline constexpr bool releases_on_sync = true;
#else
inline constexpr bool releases_on_sync = false;
#endif
#if defined(DEVALLOC_HOST_EARLY_RELEASE)
inline constexpr bool releases_early = true;
#else
inline constexpr bool releases_early = false;
#endif
#if defined(DEVALLOC_HOST_DOUBLE_RELEASE)
inline constexpr bool releases_twice = true;
#else
inline constexpr bool releases_twice = false;
#endif
#if defined(DEVALLOC_HOST_STRAY_RELEASE)
inline constexpr bool releases_stray = true;
#else
inline constexpr bool releases_stray = false;
#endif
#if defined(DEVALLOC_HOST_ABI_1_0)
inline constexpr size_t api_struct_size = DEVALLOC_PLUGIN_API_V1_MIN_SIZE;
inline constexpr uint64_t abi_1_1_capabilities = 0;
#else
inline constexpr size_t api_struct_size = sizeof(devalloc_plugin_api_v1);
// Device memory is host memory: the host may read straight into it.
inline constexpr uint64_t abi_1_1_capabilities = DEVALLOC_CAPABILITY_HOST_ADDRESSABLE;
#endif

#if defined(DEVALLOC_HOST_FAULT_INJECTION)
// Options of host_faulty, each 1-based; 0 turns a fault off:
//   fail_allocate_at=N   the N-th allocate() on device 0 fails with
//                        OUT_OF_DEVICE_MEMORY;
//   fail_copy_at=N       the N-th copy fails with DEVICE_ERROR (its source
//                        is still released once);
//   flip_byte_at_copy=N  the N-th copy succeeds but lands its first byte
//                        inverted: silent corruption for verify tests;
//   fail_synchronize=true  every synchronize() fails with DEVICE_ERROR after
//                        waiting for the copies as usual;
//   release_failed_copy_twice=true  the copy that fail_copy_at fails, if
//                        until-released, releases its source twice (a
//                        PLUGIN-14 breach after the copy's own error);
//   release_late_ms=N    every until-released copy that succeeds lands at
//                        once, but its release comes N ms after the call,
//                        from a thread of its own, also after synchronize
//                        returned: late, as PLUGIN-20 forbids, but within
//                        [load] release_timeout when N is below it;
//   skip_read_back_at=N  the N-th copy_device_to_host() answers OK but
//                        writes nothing into its destination (a read-back
//                        that verify must not take for a match).
// Copies are counted over copy_host_to_device() calls on device 0 with a
// known src_lifetime, a non-zero size and a source.
class FaultPlan {
 public:
  struct Settings {
    uint64_t fail_allocate_at = 0;
    uint64_t fail_copy_at = 0;
    uint64_t flip_byte_at_copy = 0;
    bool fail_synchronize = false;
    bool release_failed_copy_twice = false;
    uint64_t release_late_ms = 0;
    uint64_t skip_read_back_at = 0;
  };

  static Settings take_settings(plugin::Options& options) {
    Settings s;
    s.fail_allocate_at = options.take_u64("fail_allocate_at", 0);
    s.fail_copy_at = options.take_u64("fail_copy_at", 0);
    s.flip_byte_at_copy = options.take_u64("flip_byte_at_copy", 0);
    s.fail_synchronize = options.take_bool("fail_synchronize", false);
    s.release_failed_copy_twice = options.take_bool("release_failed_copy_twice", false);
    // At most an hour: a test plugin, but no clock overflow either.
    s.release_late_ms = std::min<uint64_t>(options.take_u64("release_late_ms", 0), 3'600'000);
    s.skip_read_back_at = options.take_u64("skip_read_back_at", 0);
    return s;
  }

  explicit FaultPlan(const Settings& settings) : settings_(settings) {
    if (settings_.release_late_ms > 0) late_thread_ = std::thread([this] { release_late(); });
  }
  // Pending late releases fire now, in order: destroy() releases
  // everything (PLUGIN-14).
  ~FaultPlan() {
    if (!late_thread_.joinable()) return;
    {
      std::lock_guard lock(late_mutex_);
      closing_ = true;
    }
    late_changed_.notify_all();
    late_thread_.join();
  }
  FaultPlan(const FaultPlan&) = delete;
  FaultPlan& operator=(const FaultPlan&) = delete;

  void before_allocate() {
    if (++allocations_ == settings_.fail_allocate_at) {
      throw plugin::Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                            "out of device memory (injected by fail_allocate_at = " +
                                std::to_string(settings_.fail_allocate_at) + ")"};
    }
  }

  // True when this copy must flip the first byte it writes.
  bool before_copy() {
    const uint64_t n = ++copies_;
    if (n == settings_.fail_copy_at) {
      throw plugin::Failure{DEVALLOC_STATUS_DEVICE_ERROR,
                            "device error (injected by fail_copy_at = " +
                                std::to_string(n) + ")"};
    }
    return n == settings_.flip_byte_at_copy;
  }

  // True when this copy to the host must write nothing.
  bool skips_read_back() { return ++read_backs_ == settings_.skip_read_back_at; }

  bool release_failed_copy_twice() const { return settings_.release_failed_copy_twice; }

  bool releases_late() const { return settings_.release_late_ms > 0; }
  // The release of a copy that landed, fired release_late_ms from now.
  void release_later(plugin::Release release) {
    const auto due = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(settings_.release_late_ms);
    {
      std::lock_guard lock(late_mutex_);
      late_.emplace_back(due, std::move(release));
    }
    late_changed_.notify_all();
  }

  void after_synchronize() const {
    if (settings_.fail_synchronize) {
      throw plugin::Failure{DEVALLOC_STATUS_DEVICE_ERROR,
                            "device error (injected by fail_synchronize = true)"};
    }
  }

 private:
  // The late-release thread: fires each release when it is due, or at once
  // when the instance closes.
  void release_late() {
    std::unique_lock lock(late_mutex_);
    for (;;) {
      if (late_.empty()) {
        if (closing_) return;
        late_changed_.wait(lock);
        continue;
      }
      if (!closing_ && std::chrono::steady_clock::now() < late_.front().first) {
        late_changed_.wait_until(lock, late_.front().first);
        continue;
      }
      plugin::Release due = std::move(late_.front().second);
      late_.pop_front();
      lock.unlock();
      due.fire();  // without the lock (PLUGIN-14)
      lock.lock();
    }
  }

  const Settings settings_;
  std::atomic<uint64_t> allocations_{0};
  std::atomic<uint64_t> copies_{0};
  std::atomic<uint64_t> read_backs_{0};
  std::mutex late_mutex_;
  std::condition_variable late_changed_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, plugin::Release>> late_;
  bool closing_ = false;
  std::thread late_thread_;  // last: started once the rest is built
};
#else
// Without fault injection every hook is empty and inlines away.
class FaultPlan {
 public:
  struct Settings {};
  static Settings take_settings(plugin::Options&) { return {}; }
  explicit FaultPlan(const Settings&) {}
  void before_allocate() {}
  bool before_copy() { return false; }
  bool skips_read_back() { return false; }
  bool release_failed_copy_twice() const { return false; }
  bool releases_late() const { return false; }
  void release_later(plugin::Release) {}
  void after_synchronize() const {}
};
#endif

}  // namespace devalloc::host
