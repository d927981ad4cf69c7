// The host plugin's test variants, each a wrapper around the real host
// plugin: it opens the built libdevalloc_host.so (DEVALLOC_ZOO_HOST_LIBRARY)
// with dlopen, hands out a function table of its own that forwards every
// call to the host's, and misbehaves where its variant says. The build
// compiles this file once per variant, DEVALLOC_ZOO_HOST_VARIANT naming it:
//   faulty           "host_faulty": misbehaves in chosen calls on request
//                    (the options of FaultPlan: corrupt, late or double
//                    releases, empty read-backs), for rollback and verify
//                    tests of the core (plain failures are the validation
//                    layer's fault injection, FaultInjection);
//   late_read        "host_late_read": reads a during-call source 20 ms after
//                    the call returned (breaks PLUGIN-13), which the
//                    conformance suite must catch;
//   release_on_sync  "host_release_on_sync": performs and releases
//                    until-released copies only when synchronized (or read
//                    back, deallocated, destroyed): the latest PLUGIN-20
//                    allows; a host that waits for a release without
//                    synchronizing hangs on it;
//   double_release   "host_double_release": releases every until-released
//                    copy twice (breaks PLUGIN-14; the host must fail the
//                    load, PLUGIN-21);
//   stray_release    "host_stray_release": releases every until-released
//                    copy once, then calls on_release again with
//                    user_data + 1, a value it was never given (breaks
//                    PLUGIN-14; the conformance suite must report it, not
//                    follow it);
//   early_release    "host_early_release": releases every until-released
//                    copy inside the copy call and reads its source only
//                    when synchronized (or read back, deallocated,
//                    destroyed): breaks PLUGIN-14 the silent way, which the
//                    conformance suite and the validation layer's source
//                    check must catch;
//   abi_1_0          "host_abi_1_0": a function table of ABI 1.0's size and
//                    no capability of 1.1 or later, as a plugin built
//                    against the 1.0 header would hand out.
// Every variant takes the host's options (async, memory_limit, pool; not
// async in host_late_read) and hands them on. A call with malformed
// arguments, or one the variant has no part in, goes to the host as it came:
// the host checks it and answers with its own message, and releases what it
// was given.
#include <devalloc/plugin_abi.h>
#include <devalloc/plugin_kit/abi_glue.hpp>
#include <devalloc/plugin_kit/completion_thread.hpp>
#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/options.hpp>
#include <devalloc/plugin_kit/release.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#if !defined(DEVALLOC_ZOO_HOST_VARIANT) || !defined(DEVALLOC_ZOO_HOST_LIBRARY)
#error "the build defines DEVALLOC_ZOO_HOST_VARIANT and DEVALLOC_ZOO_HOST_LIBRARY"
#endif
#define DEVALLOC_ZOO_TEXT_(x) #x
#define DEVALLOC_ZOO_TEXT(x) DEVALLOC_ZOO_TEXT_(x)

namespace {

using devalloc::plugin::CompletionThread;
using devalloc::plugin::fail;
using devalloc::plugin::Failure;
using devalloc::plugin::format;
using devalloc::plugin::guard;
using devalloc::plugin::Release;

enum class Variant {
  faulty,
  late_read,
  release_on_sync,
  double_release,
  stray_release,
  early_release,
  abi_1_0
};
constexpr Variant kVariant = Variant::DEVALLOC_ZOO_HOST_VARIANT;
constexpr const char* kName = "host_" DEVALLOC_ZOO_TEXT(DEVALLOC_ZOO_HOST_VARIANT);

// The options a variant names when it refuses an unknown one.
// host_release_on_sync and host_early_release take async too, unnamed.
constexpr const char* accepted_options() {
  switch (kVariant) {
    case Variant::faulty:
      return "async, flip_byte_at_copy, memory_limit, pool, release_late_ms, "
             "release_twice_failed_copy_at, skip_read_back_at";
    case Variant::late_read:
    case Variant::release_on_sync:
    case Variant::early_release: return "memory_limit, pool";
    default: return "async, memory_limit, pool";
  }
}

// Until-released copies held by the wrapper and performed when the host
// next synchronizes (PLUGIN-20's latest).
constexpr bool kDefersCopies =
    kVariant == Variant::release_on_sync || kVariant == Variant::early_release;
// Long enough that a caller reusing src right after the call wins the race
// every time.
constexpr std::chrono::milliseconds kLateReadDelay{20};

// The host plugin's table: opened at the first negotiation (library()).
const devalloc_plugin_api_v1& host_api();

// ---------------------------------------------------------------------------
// host_faulty's faults.

// Releases fired a fixed time after their copy, from a thread of their own:
// late, also after synchronize returned (release_late_ms).
class LateReleases {
 public:
  explicit LateReleases(std::chrono::milliseconds delay)
      : delay_(delay), thread_([this] { run(); }) {}
  // What is still pending fires now, in order: destroy() releases
  // everything (PLUGIN-14).
  ~LateReleases() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  LateReleases(const LateReleases&) = delete;
  LateReleases& operator=(const LateReleases&) = delete;

  // Throws bad_alloc, firing the release as it unwinds.
  void add(Release release) {
    const auto due = std::chrono::steady_clock::now() + delay_;
    {
      std::lock_guard lock(mutex_);
      pending_.emplace_back(due, Release());
      pending_.back().second = std::move(release);
    }
    changed_.notify_all();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (pending_.empty()) {
        if (closing_) return;
        changed_.wait(lock);
        continue;
      }
      if (!closing_ && std::chrono::steady_clock::now() < pending_.front().first) {
        changed_.wait_until(lock, pending_.front().first);
        continue;
      }
      Release due = std::move(pending_.front().second);
      pending_.pop_front();
      lock.unlock();
      due.fire();  // without the lock (PLUGIN-14)
      lock.lock();
    }
  }

  const std::chrono::milliseconds delay_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, Release>> pending_;
  bool closing_ = false;
  std::thread thread_;  // last: started once the rest is built
};

// host_faulty's options, each 1-based; 0 turns a fault off:
//   flip_byte_at_copy=N  the N-th copy succeeds but lands its first byte
//                        inverted: silent corruption for verify tests;
//   release_twice_failed_copy_at=N  the N-th copy fails with DEVICE_ERROR
//                        and, if until-released, releases its source twice
//                        (a PLUGIN-14 breach after the copy's own error);
//   release_late_ms=N    every until-released copy that succeeds lands at
//                        once, but its release comes N ms after the call,
//                        from a thread of its own, also after synchronize
//                        returned: late, as PLUGIN-20 forbids, but within
//                        [load] release_timeout when N is below it;
//   skip_read_back_at=N  the N-th copy_device_to_host() answers OK but
//                        writes nothing into its destination (a read-back
//                        that verify must not take for a match).
// Copies are counted over copy_host_to_device() calls on device 0 with a
// known src_lifetime, a non-zero size and a source; read-backs over those
// with a non-zero size and a destination. The other variants have a plan
// with every fault off.
class FaultPlan {
 public:
  struct Settings {
    uint64_t flip_byte_at_copy = 0;
    uint64_t release_twice_failed_copy_at = 0;
    uint64_t release_late_ms = 0;
    uint64_t skip_read_back_at = 0;

    static Settings take(devalloc::plugin::Options& options) {
      Settings s;
      s.flip_byte_at_copy = options.take_u64("flip_byte_at_copy", 0);
      s.release_twice_failed_copy_at = options.take_u64("release_twice_failed_copy_at", 0);
      // At most an hour: a test plugin, but no clock overflow either.
      s.release_late_ms = std::min<uint64_t>(options.take_u64("release_late_ms", 0), 3'600'000);
      s.skip_read_back_at = options.take_u64("skip_read_back_at", 0);
      return s;
    }
  };
  enum class CopyFault { none, fail_releasing_twice, flip };

  explicit FaultPlan(const Settings& settings) : settings_(settings) {
    if (settings_.release_late_ms > 0) {
      late_ = std::make_unique<LateReleases>(std::chrono::milliseconds(settings_.release_late_ms));
    }
  }

  const Settings& settings() const { return settings_; }
  // Each counts one call and says whether it is the one to break.
  CopyFault next_copy() {
    const uint64_t n = ++copies_;
    if (n == settings_.release_twice_failed_copy_at) return CopyFault::fail_releasing_twice;
    return n == settings_.flip_byte_at_copy ? CopyFault::flip : CopyFault::none;
  }
  bool read_back_skipped() { return ++read_backs_ == settings_.skip_read_back_at; }

  LateReleases* late_releases() const { return late_.get(); }

 private:
  const Settings settings_;
  std::atomic<uint64_t> copies_{0};
  std::atomic<uint64_t> read_backs_{0};
  std::unique_ptr<LateReleases> late_;
};

// ---------------------------------------------------------------------------
// What the wrapper needs of the host's copies.

// Has the host read src before it returns (PLUGIN-13's during-call copy).
devalloc_status copy_now(devalloc_instance* host_instance, uint32_t device, uint64_t dst,
                         const void* src, uint64_t nbytes, devalloc_error* error) {
  devalloc_copy_to_device_args now{};
  now.struct_size = sizeof now;
  now.device = device;
  now.src_lifetime = DEVALLOC_SRC_DURING_CALL;
  now.dst = dst;
  now.src = src;
  now.nbytes = nbytes;
  return host_api().copy_host_to_device(host_instance, &now, error);
}

// copy_now that throws the host's failure: for copies performed on a thread.
void copy_now_or_throw(devalloc_instance* host_instance, uint32_t device, uint64_t dst,
                       const void* src, uint64_t nbytes) {
  devalloc_error error{};
  error.struct_size = sizeof error;
  const devalloc_status status = copy_now(host_instance, device, dst, src, nbytes, &error);
  if (status != DEVALLOC_STATUS_OK) throw Failure{status, error.message};
}

// The call as the host's messages name it, for the failures the wrapper
// makes up.
std::string describe(const devalloc_copy_to_device_args& a) {
  return format("copy_host_to_device(device = %u, dst = 0x%" PRIx64 ", nbytes = %" PRIu64
                ", src_lifetime = %s)",
                a.device, a.dst, a.nbytes, devalloc::plugin::lifetime_name(a.src_lifetime));
}

// The live allocations, so that a copy the wrapper performs later is checked
// to lie in one (PLUGIN-15) when it is issued, as the host checks its own.
class LiveRanges {
 public:
  void add(uint32_t device, uint64_t address, uint64_t nbytes) {
    std::lock_guard lock(mutex_);
    live_[{device, address}] = nbytes;
  }
  void remove(uint32_t device, uint64_t address) {
    std::lock_guard lock(mutex_);
    live_.erase({device, address});
  }
  bool contains(uint32_t device, uint64_t address, uint64_t nbytes) const {
    std::lock_guard lock(mutex_);
    auto it = live_.upper_bound({device, address});
    if (it == live_.begin()) return false;
    --it;  // the allocation starting at or below address
    const auto& [start, size] = *it;
    const uint64_t offset = address - start.second;
    return start.first == device && offset < size && nbytes <= size - offset;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> live_;  // (device, address) -> nbytes
};

// Until-released copies held for later (kDefersCopies), in issue order, each
// with the release it still owes (none for host_early_release's: released
// already).
class DeferredCopies {
 public:
  // Throws bad_alloc, firing the release as it unwinds, after the lock.
  void add(const devalloc_copy_to_device_args& a, Release release) {
    std::lock_guard lock(mutex_);
    pending_.push_back(Copy{a.device, a.dst, a.src, a.nbytes, Release()});
    pending_.back().release = std::move(release);
  }

  // Performs every held copy through the host, then fires its release. The
  // first failure ends it and is returned; the copies after it are released
  // unperformed (PLUGIN-14).
  devalloc_status land(devalloc_instance* host_instance, devalloc_error* error) noexcept {
    // Held while landing: a synchronize on another thread that finds the
    // list already taken must still wait until those copies landed.
    std::lock_guard landing(landing_mutex_);
    std::vector<Copy> copies;
    {
      std::lock_guard lock(mutex_);
      copies.swap(pending_);
    }
    for (Copy& c : copies) {
      const devalloc_status status =
          copy_now(host_instance, c.device, c.dst, c.src, c.nbytes, error);
      c.release.fire();
      if (status != DEVALLOC_STATUS_OK) return status;
    }
    return DEVALLOC_STATUS_OK;
  }

 private:
  struct Copy {
    uint32_t device;
    uint64_t dst;
    const void* src;
    uint64_t nbytes;
    Release release;
  };
  std::mutex landing_mutex_;
  std::mutex mutex_;
  std::vector<Copy> pending_;
};

// ---------------------------------------------------------------------------
// The instance: the host's, and what the variant keeps beside it.

class Instance {
 public:
  Instance(devalloc_instance* host_instance, uint32_t devices, const FaultPlan::Settings& faults)
      : host(host_instance), device_count(devices), faults_(faults) {
    if constexpr (kVariant == Variant::late_read) {
      late_reads_ = std::make_unique<CompletionThread>();
    }
  }
  // The held copies land and are released, then the host is destroyed;
  // late releases still pending fire last (faults_).
  ~Instance() {
    deferred_.land(host, nullptr);
    late_reads_.reset();
    host_api().destroy(host);
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  static Instance* of(devalloc_instance* instance) { return reinterpret_cast<Instance*>(instance); }
  static devalloc_instance* host_of(devalloc_instance* instance) {
    return instance == nullptr ? nullptr : of(instance)->host;
  }

  devalloc_status allocate(devalloc_allocate_args* args, devalloc_error* error);
  devalloc_status deallocate(uint32_t device, uint64_t address, devalloc_error* error);
  devalloc_status copy(const devalloc_copy_to_device_args& a, devalloc_error* error);
  devalloc_status copy_to_host(const devalloc_copy_to_host_args* args, devalloc_error* error);
  devalloc_status synchronize(uint32_t device, devalloc_error* error);

  devalloc_instance* const host;
  const uint32_t device_count;

 private:
  // What the variant does with a well-formed copy that no fault took.
  devalloc_status copy_as_variant(const devalloc_copy_to_device_args& a, devalloc_error* error);

  FaultPlan faults_;
  LiveRanges live_;
  DeferredCopies deferred_;                      // kDefersCopies
  std::unique_ptr<CompletionThread> late_reads_;  // host_late_read's copies, in order
};

devalloc_status Instance::allocate(devalloc_allocate_args* args, devalloc_error* error) {
  const devalloc_status status = host_api().allocate(host, args, error);
  if (status != DEVALLOC_STATUS_OK || args->nbytes == 0) return status;
  return guard(error, [&] {
    try {
      live_.add(args->device, args->address, args->nbytes);
    } catch (...) {
      host_api().deallocate(host, args->device, args->address, nullptr);
      args->address = 0;
      throw;
    }
    return DEVALLOC_STATUS_OK;
  });
}

devalloc_status Instance::deallocate(uint32_t device, uint64_t address, devalloc_error* error) {
  // Copies held for the allocation land before it goes.
  const devalloc_status landed = deferred_.land(host, error);
  if (landed != DEVALLOC_STATUS_OK) return landed;
  const devalloc_status status = host_api().deallocate(host, device, address, error);
  if (status == DEVALLOC_STATUS_OK) live_.remove(device, address);
  return status;
}

devalloc_status Instance::copy(const devalloc_copy_to_device_args& a, devalloc_error* error) {
  const bool until_released = a.src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED;
  switch (faults_.next_copy()) {
    case FaultPlan::CopyFault::fail_releasing_twice:
      if (until_released && a.on_release != nullptr) {
        a.on_release(a.user_data);
        a.on_release(a.user_data);
      }
      return fail(error, DEVALLOC_STATUS_DEVICE_ERROR,
                  "%s: device error (injected by release_twice_failed_copy_at = %" PRIu64 ")",
                  describe(a).c_str(), faults_.settings().release_twice_failed_copy_at);
    case FaultPlan::CopyFault::flip: {
      // Lands at once, first byte inverted, and is released after.
      Release release(until_released ? a.on_release : nullptr, a.user_data);
      const auto* bytes = static_cast<const std::byte*>(a.src);
      std::vector<std::byte> flipped(bytes, bytes + a.nbytes);
      flipped[0] ^= std::byte{0xff};
      return copy_now(host, a.device, a.dst, flipped.data(), a.nbytes, error);
    }
    case FaultPlan::CopyFault::none: break;
  }
  if (LateReleases* late = faults_.late_releases(); late != nullptr && until_released) {
    Release release(a.on_release, a.user_data);
    const devalloc_status status = copy_now(host, a.device, a.dst, a.src, a.nbytes, error);
    if (status == DEVALLOC_STATUS_OK) late->add(std::move(release));
    return status;
  }
  return copy_as_variant(a, error);
}

devalloc_status Instance::copy_as_variant(const devalloc_copy_to_device_args& a,
                                          devalloc_error* error) {
  const bool until_released = a.src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED;
  // A copy performed later is checked now; one outside a live allocation
  // goes to the host, which refuses it.
  const bool lands_later = kVariant == Variant::late_read || (kDefersCopies && until_released);
  if (lands_later && !live_.contains(a.device, a.dst, a.nbytes)) {
    return host_api().copy_host_to_device(host, &a, error);
  }
  if constexpr (kVariant == Variant::late_read) {
    // Every copy, in issue order, on one thread; the during-call ones only
    // after kLateReadDelay, when their caller has reused src.
    const auto delay = until_released ? std::chrono::milliseconds(0) : kLateReadDelay;
    late_reads_->push(
        [this, a, delay] {
          std::this_thread::sleep_for(delay);
          copy_now_or_throw(host, a.device, a.dst, a.src, a.nbytes);
        },
        Release(until_released ? a.on_release : nullptr, a.user_data));
    return DEVALLOC_STATUS_OK;
  } else if constexpr (kDefersCopies) {
    if (until_released) {
      Release release(a.on_release, a.user_data);
      if constexpr (kVariant == Variant::early_release) {
        deferred_.add(a, Release());
        release.fire();  // the breach: src is read only later, when landing
      } else {
        deferred_.add(a, std::move(release));
      }
      return DEVALLOC_STATUS_OK;
    }
  } else if constexpr (kVariant == Variant::double_release ||
                       kVariant == Variant::stray_release) {
    if (until_released) {
      const devalloc_status status = copy_now(host, a.device, a.dst, a.src, a.nbytes, error);
      if (a.on_release != nullptr) {
        a.on_release(a.user_data);
        if (status == DEVALLOC_STATUS_OK) {
          // The breach: a second release, or one with a user_data one
          // byte past the copy's.
          a.on_release(kVariant == Variant::double_release
                           ? a.user_data
                           : reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(a.user_data) + 1));
        }
      }
      return status;
    }
  }
  return host_api().copy_host_to_device(host, &a, error);
}

devalloc_status Instance::copy_to_host(const devalloc_copy_to_host_args* args,
                                       devalloc_error* error) {
  // Ordered after the copies the wrapper still holds.
  if (late_reads_) late_reads_->wait_for_earlier();
  const devalloc_status landed = deferred_.land(host, error);
  if (landed != DEVALLOC_STATUS_OK) return landed;
  if (faults_.read_back_skipped()) return DEVALLOC_STATUS_OK;
  return host_api().copy_device_to_host(host, args, error);
}

devalloc_status Instance::synchronize(uint32_t device, devalloc_error* error) {
  if (late_reads_) {
    late_reads_->wait_for_earlier();
    if (auto failure = late_reads_->take_error()) {
      return fail(error, DEVALLOC_STATUS_DEVICE_ERROR,
                  "synchronize(device = %u): an earlier queued copy failed: %s", device,
                  failure->c_str());
    }
  }
  const devalloc_status landed = deferred_.land(host, error);
  if (landed != DEVALLOC_STATUS_OK) return landed;
  return host_api().synchronize(host, device, error);
}

// ---------------------------------------------------------------------------
// The wrapper's function table. Each function hands a call whose arguments
// the host would refuse to the host as it came.

devalloc_status create(devalloc_create_args* args, devalloc_error* error) {
  if (args == nullptr || args->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_create_args, instance)) {
    return host_api().create(args, error);
  }
  return guard(error, [&] {
    args->instance = nullptr;
    devalloc::plugin::Options options(*args);
    // The host's own options, handed on as given: the host checks their
    // values. host_late_read's copies run late whatever async says: it
    // refuses the option.
    std::vector<std::string> keys, values;
    for (const char* key : {"async", "memory_limit", "pool"}) {
      std::string value;
      const bool refused = kVariant == Variant::late_read && std::string_view(key) == "async";
      if (!refused && options.take(key, value)) {
        keys.emplace_back(key);
        values.push_back(std::move(value));
      }
    }
    const FaultPlan::Settings faults =
        kVariant == Variant::faulty ? FaultPlan::Settings::take(options) : FaultPlan::Settings{};
    options.reject_unknown(kName, accepted_options());

    std::vector<const char*> key_texts, value_texts;
    for (size_t i = 0; i < keys.size(); ++i) {
      key_texts.push_back(keys[i].c_str());
      value_texts.push_back(values[i].c_str());
    }
    devalloc_create_args host_args{};
    host_args.struct_size = sizeof host_args;
    host_args.option_keys = key_texts.data();
    host_args.option_values = value_texts.data();
    host_args.option_count = keys.size();
    const devalloc_status status = host_api().create(&host_args, error);
    if (status != DEVALLOC_STATUS_OK) return status;
    devalloc_instance* const host_instance = host_args.instance;
    uint32_t devices = 0;
    const devalloc_status counted = host_api().get_device_count(host_instance, &devices, error);
    if (counted != DEVALLOC_STATUS_OK) {
      host_api().destroy(host_instance);
      return counted;
    }
    try {
      args->instance = reinterpret_cast<devalloc_instance*>(
          new Instance(host_instance, devices, faults));
    } catch (...) {
      host_api().destroy(host_instance);
      throw;
    }
    return DEVALLOC_STATUS_OK;
  });
}

void destroy(devalloc_instance* instance) { delete Instance::of(instance); }

devalloc_status get_capabilities(devalloc_instance* instance, devalloc_capabilities* capabilities,
                                 devalloc_error* error) {
  const devalloc_status status =
      host_api().get_capabilities(Instance::host_of(instance), capabilities, error);
  if (status != DEVALLOC_STATUS_OK) return status;
  if constexpr (kVariant == Variant::abi_1_0) {
    // Only the flags ABI 1.0 defines.
    capabilities->flags &= DEVALLOC_CAPABILITY_ASYNC_COPY | DEVALLOC_CAPABILITY_HOST_STAGING;
  } else if constexpr (kVariant == Variant::late_read || kDefersCopies) {
    // Its copies are still in flight when the call returns.
    capabilities->flags |= DEVALLOC_CAPABILITY_ASYNC_COPY;
  }
  return status;
}

devalloc_status get_device_count(devalloc_instance* instance, uint32_t* count,
                                 devalloc_error* error) {
  return host_api().get_device_count(Instance::host_of(instance), count, error);
}

devalloc_status get_device_properties(devalloc_instance* instance, uint32_t device,
                                      devalloc_device_properties* properties,
                                      devalloc_error* error) {
  return host_api().get_device_properties(Instance::host_of(instance), device, properties, error);
}

devalloc_status allocate(devalloc_instance* instance, devalloc_allocate_args* args,
                         devalloc_error* error) {
  if (instance == nullptr) return host_api().allocate(nullptr, args, error);
  return Instance::of(instance)->allocate(args, error);
}

devalloc_status deallocate(devalloc_instance* instance, uint32_t device,
                           devalloc_device_address address, devalloc_error* error) {
  if (instance == nullptr) return host_api().deallocate(nullptr, device, address, error);
  return Instance::of(instance)->deallocate(device, address, error);
}

devalloc_status copy_host_to_device(devalloc_instance* instance,
                                    const devalloc_copy_to_device_args* args,
                                    devalloc_error* error) {
  Instance* self = Instance::of(instance);
  const bool well_formed =
      self != nullptr && args != nullptr &&
      args->struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_copy_to_device_args, user_data) &&
      args->device < self->device_count &&
      (args->src_lifetime == DEVALLOC_SRC_DURING_CALL ||
       args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED) &&
      args->nbytes > 0 && args->src != nullptr;
  if (!well_formed) return host_api().copy_host_to_device(Instance::host_of(instance), args, error);
  // A bad_alloc inside fires the release of whichever Release holds it.
  return guard(error, [&] { return self->copy(*args, error); });
}

devalloc_status copy_device_to_host(devalloc_instance* instance,
                                    const devalloc_copy_to_host_args* args,
                                    devalloc_error* error) {
  Instance* self = Instance::of(instance);
  const bool well_formed =
      self != nullptr && args != nullptr &&
      args->struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_copy_to_host_args, nbytes) &&
      args->reserved0 == 0 && args->device < self->device_count && args->nbytes > 0 &&
      args->dst != nullptr;
  if (!well_formed) return host_api().copy_device_to_host(Instance::host_of(instance), args, error);
  return self->copy_to_host(args, error);
}

devalloc_status synchronize(devalloc_instance* instance, uint32_t device, devalloc_error* error) {
  Instance* self = Instance::of(instance);
  if (self == nullptr || device >= self->device_count) {
    return host_api().synchronize(Instance::host_of(instance), device, error);
  }
  return self->synchronize(device, error);
}

devalloc_status allocate_host(devalloc_instance* instance, uint64_t nbytes, void** buffer,
                              devalloc_error* error) {
  return host_api().allocate_host(Instance::host_of(instance), nbytes, buffer, error);
}

devalloc_status free_host(devalloc_instance* instance, void* buffer, devalloc_error* error) {
  return host_api().free_host(Instance::host_of(instance), buffer, error);
}

devalloc_status get_memory_info(devalloc_instance* instance, uint32_t device,
                                uint64_t* free_bytes, uint64_t* total_bytes,
                                devalloc_error* error) {
  return host_api().get_memory_info(Instance::host_of(instance), device, free_bytes, total_bytes,
                                error);
}

devalloc_status map_to_host(devalloc_instance* instance, devalloc_map_args* args,
                            devalloc_error* error) {
  return host_api().map_to_host(Instance::host_of(instance), args, error);
}

devalloc_status unmap_from_host(devalloc_instance* instance, uint32_t device, void* mapped,
                                devalloc_error* error) {
  return host_api().unmap_from_host(Instance::host_of(instance), device, mapped, error);
}

// ---------------------------------------------------------------------------
// The host plugin, opened once, and the table handed out over it.

class Library {
 public:
  // Throws Failure(RUNTIME_UNAVAILABLE) when the host plugin cannot be
  // opened or does not answer with a table of this build's ABI.
  Library() {
    const char* path = DEVALLOC_ZOO_HOST_LIBRARY;
    handle_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      throw Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                    format("%s: cannot open the host plugin: %s", kName, dlerror())};
    }
    const auto negotiate = reinterpret_cast<devalloc_plugin_negotiate_fn>(
        dlsym(handle_, DEVALLOC_PLUGIN_ENTRY_POINT_NAME));
    devalloc_negotiation n{};
    n.struct_size = sizeof n;
    n.host_min_major = DEVALLOC_ABI_VERSION_MAJOR;
    n.host_max_major = DEVALLOC_ABI_VERSION_MAJOR;
    n.host_max_minor = DEVALLOC_ABI_VERSION_MINOR;
    if (negotiate == nullptr || negotiate(&n, nullptr) != DEVALLOC_STATUS_OK ||
        n.api == nullptr ||
        static_cast<const devalloc_plugin_api_v1*>(n.api)->struct_size <
            sizeof(devalloc_plugin_api_v1)) {
      dlclose(handle_);
      throw Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                    format("%s: the host plugin %s does not negotiate ABI %d.%d", kName, path,
                           DEVALLOC_ABI_VERSION_MAJOR, DEVALLOC_ABI_VERSION_MINOR)};
    }
    host_ = static_cast<const devalloc_plugin_api_v1*>(n.api);

    table_.struct_size = kVariant == Variant::abi_1_0 ? DEVALLOC_PLUGIN_API_V1_MIN_SIZE
                                                      : sizeof(devalloc_plugin_api_v1);
    table_.abi_major = DEVALLOC_ABI_VERSION_MAJOR;
    table_.abi_minor = DEVALLOC_ABI_VERSION_MINOR;
    table_.plugin_name = kName;
    table_.plugin_version = host_->plugin_version;
    table_.create = create;
    table_.destroy = destroy;
    table_.get_capabilities = get_capabilities;
    table_.get_device_count = get_device_count;
    table_.get_device_properties = get_device_properties;
    table_.allocate = allocate;
    table_.deallocate = deallocate;
    table_.copy_host_to_device = copy_host_to_device;
    table_.copy_device_to_host = copy_device_to_host;
    table_.synchronize = synchronize;
    table_.allocate_host = allocate_host;
    table_.free_host = free_host;
    // The optional functions where the host has them. host_abi_1_0's table
    // still holds them past its struct_size, which no host may read.
    table_.get_memory_info = host_->get_memory_info != nullptr ? get_memory_info : nullptr;
    const bool maps = host_->map_to_host != nullptr && host_->unmap_from_host != nullptr;
    table_.map_to_host = maps ? map_to_host : nullptr;
    table_.unmap_from_host = maps ? unmap_from_host : nullptr;
  }
  ~Library() { dlclose(handle_); }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  const devalloc_plugin_api_v1& host() const { return *host_; }
  const devalloc_plugin_api_v1& table() const { return table_; }

 private:
  void* handle_ = nullptr;
  const devalloc_plugin_api_v1* host_ = nullptr;
  devalloc_plugin_api_v1 table_{};
};

// Built at the first negotiation (tried again after a failure); closed when
// this library is unloaded.
const Library& library() {
  static const Library opened;
  return opened;
}

const devalloc_plugin_api_v1& host_api() { return library().host(); }

}  // namespace

extern "C" DEVALLOC_PLUGIN_EXPORT devalloc_status devalloc_plugin_negotiate(
    devalloc_negotiation* negotiation, devalloc_error* error) {
  const devalloc_plugin_api_v1* table = nullptr;
  const devalloc_status opened = guard(error, [&] {
    table = &library().table();
    return DEVALLOC_STATUS_OK;
  });
  if (opened != DEVALLOC_STATUS_OK) return opened;
  return devalloc::plugin::negotiate_v1(negotiation, error, table);
}
