// The driver-failure walk of a vendor plugin: one representative workload
// through the plugin's C ABI (create; allocate on a device; allocate_host;
// an until-released copy from that staging memory; a during-call copy from
// pageable memory; a copy back to the host; synchronize; free_host;
// deallocate; destroy), first without faults, to learn which entry points of
// the fake runtime it calls and how often, then again for every call k of
// every entry point E with exactly that call failing (the fake's
// fail_calls_after(E, k - 1, failure, 1)).
//
// Every run must keep these rules:
//  - the first ABI call that fails does so after the fault was hit, and its
//    message names E (PLUGIN-6); every call before it succeeded;
//  - a fault no call reports is allowed only for an entry point the plugin
//    is known to ride out (WalkTarget::recoverable, with the reason), and
//    then the copies still land;
//  - the release of the until-released copy comes exactly once, never
//    before the copy read its source (the release overwrites the source, so
//    that the fake's source-lifetime check sees an early one), and by the
//    time synchronize returned OK (PLUGIN-14, PLUGIN-20);
//  - after destroy the fake recorded no violation and holds nothing live
//    that it did not hold before the run (allocations, pinned blocks,
//    streams, events, ...: live_objects());
//  - after every ABI call the calling thread's runtime state (current
//    context, current device) is what the host had (WalkTarget::thread).
// A run that fails stops at its first failing call and destroys the
// instance, as a host that gives up would: destroy must then finish the
// work, release and free everything (PLUGIN-9). Each run has a thread of its
// own, which starts with the runtime's per-thread defaults (no context
// pushed, device 0 current), so that no run inherits what another left.
#pragma once

#include <devalloc/plugin_loader.hpp>

#include <fake_runtime.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace devalloc::fake_test {

struct WalkTarget {
  // The fake the plugin runs on, loaded for the whole walk.
  const FakeRuntime* fake = nullptr;
  // Loads (creates) a new plugin instance over the fake.
  std::function<std::pair<std::shared_ptr<Plugin>, PluginError>()> load;
  // Every runtime entry point the plugin may call, as the fake counts them.
  std::vector<std::string> entry_points;
  // What an injected failure returns: the runtime's generic error.
  int failure = 0;
  uint32_t device = 0;
  // Entry points one failure of which the plugin rides out without an error
  // (a retried wait, say), each with the reason.
  std::map<std::string, std::string> recoverable;
  // The calling thread's runtime state as the host should find it after
  // every ABI call: "" when it is as before the run, else what changed.
  // Must not call the runtime (the walk counts calls). Optional.
  std::function<std::string()> thread;
};

// The k-th call (from 1) of an entry point fails.
struct WalkFault {
  std::string entry_point;
  uint64_t nth = 0;
};

struct WalkRun {
  // Broken rules, one a line; empty when the run kept them all.
  std::vector<std::string> problems;
  // Calls per entry point (of WalkTarget::entry_points, those called).
  std::map<std::string, uint64_t> calls;
  // The ABI call that failed first and its message; "" when none did.
  std::string failed_step;
  std::string message;
};

class DriverWalk {
 public:
  static constexpr size_t kChunk = 64 * 1024;

  explicit DriverWalk(WalkTarget target) : t_(std::move(target)) {}

  // One run on a new thread.
  WalkRun run(const WalkFault* fault) const {
    WalkRun out;
    std::thread([&] { out = run_here(fault); }).join();
    return out;
  }

 private:
  WalkRun run_here(const WalkFault* fault) const {
    const FakeRuntime& fake = *t_.fake;
    WalkRun out;
    fake.reset();
    if (fault != nullptr) {
      fake.fail_calls_after(fault->entry_point.c_str(), static_cast<int>(fault->nth - 1),
                            t_.failure, 1);
    }
    const auto hit = [&] {
      return fault != nullptr && fake.calls(fault->entry_point.c_str()) >= fault->nth;
    };
    const auto problem = [&](const std::string& text) { out.problems.push_back(text); };
    const std::string live_before = fake.live_objects();

    // Declared before the plugin, so that they outlive it: a copy that
    // still ran after its call returned finds its memory there.
    const std::vector<uint8_t> staged = pattern(kChunk, 1);
    const std::vector<uint8_t> expected_pageable = pattern(kChunk, 2);
    std::vector<uint8_t> pageable = expected_pageable;
    std::vector<uint8_t> back(2 * kChunk);
    SourceRelease release;
    void* staging = nullptr;
    uint64_t base = 0;
    bool copy_issued = false;
    std::shared_ptr<Plugin> plugin;
    bool hit_before_failure = false;

    // Runs one ABI call; false when it failed (the walk then stops).
    const auto step = [&](const char* name, const std::function<Status()>& call) {
      const Status status = call();
      check_thread(name, problem);
      if (status.ok()) return true;
      out.failed_step = name;
      out.message = status.message();
      hit_before_failure = hit();
      return false;
    };

    const uint32_t dev = t_.device;
    bool ok = step("create", [&] {
      auto [loaded, error] = t_.load();
      plugin = std::move(loaded);
      return plugin ? Status() : error.status;
    });
    ok = ok && step("allocate", [&] {
      Result<uint64_t> r = plugin->allocate(dev, 2 * kChunk, 0);
      if (r.ok()) base = *r;
      return r.ok() ? Status() : r.status();
    });
    ok = ok && step("allocate_host", [&] {
      Result<void*> r = plugin->allocate_host(kChunk);
      if (!r.ok()) return r.status();
      staging = *r;
      std::memcpy(staging, staged.data(), kChunk);
      return Status();
    });
    ok = ok && step("copy_host_to_device (until released, from staging)", [&] {
      release.source = staging;
      release.nbytes = kChunk;
      copy_issued = true;
      return plugin->copy_to_device_until_released(dev, base, staging, kChunk,
                                                   SourceRelease::on_release, &release);
    });
    ok = ok && step("copy_host_to_device (during call, from pageable memory)", [&] {
      const Status s = plugin->copy_to_device(dev, base + kChunk, pageable.data(), kChunk);
      // The caller may reuse its buffer at once (PLUGIN-13).
      std::fill(pageable.begin(), pageable.end(), uint8_t{0x5a});
      return s;
    });
    ok = ok && step("copy_device_to_host", [&] {
      const Status s = plugin->copy_to_host(dev, back.data(), base, 2 * kChunk);
      if (s.ok() && (!std::equal(staged.begin(), staged.end(), back.begin()) ||
                     !std::equal(expected_pageable.begin(), expected_pageable.end(),
                                 back.begin() + kChunk))) {
        problem("copy_device_to_host returned OK, but the bytes read back are not the ones "
                "copied to the device");
      }
      return s;
    });
    ok = ok && step("synchronize", [&] {
      const Status s = plugin->synchronize(dev);
      if (s.ok() && release.releases != 1) {
        problem("synchronize returned OK with " + std::to_string(release.releases.load()) +
                " release(s) of the until-released copy, not 1 (PLUGIN-20)");
      }
      return s;
    });
    // A host frees staging memory only once the copies reading it are
    // released.
    ok = ok && release.releases == 1 && step("free_host", [&] {
      const Status s = plugin->free_host(staging);
      if (s.ok()) staging = nullptr;
      return s;
    });
    ok = ok && step("deallocate", [&] { return plugin->deallocate(dev, base); });

    const bool hit_before_destroy = hit();
    plugin.reset();  // destroy
    check_thread("destroy", problem);

    // Which call reported the fault, and how.
    if (!out.failed_step.empty()) {
      if (!hit_before_failure) {
        problem(out.failed_step + " failed although no driver call had failed yet: " +
                out.message);
      } else if (out.message.find(fault->entry_point) == std::string::npos) {
        problem(out.failed_step + " failed without naming " + fault->entry_point +
                " (PLUGIN-6): " + out.message);
      }
    } else if (hit_before_destroy && t_.recoverable.count(fault->entry_point) == 0) {
      problem("every ABI call returned OK: the failed call of " + fault->entry_point +
              " went unreported");
    }
    const int releases = release.releases;
    if (releases != (copy_issued ? 1 : 0)) {
      problem("the until-released copy was " + std::string(copy_issued ? "" : "not ") +
              "issued and released " + std::to_string(releases) +
              " time(s) by the end of destroy (PLUGIN-14)");
    }
    if (const std::string v = fake.violations(); !v.empty()) {
      problem("the fake recorded violations:\n" + v);
    }
    if (const std::string live = fake.live_objects(); live != live_before) {
      problem("left live after destroy (PLUGIN-9):\n" + live + "where before the run:\n" +
              (live_before.empty() ? "nothing\n" : live_before));
    }
    for (const std::string& e : t_.entry_points) {
      if (const uint64_t n = fake.calls(e.c_str())) out.calls[e] = n;
    }
    // Injected failures not reached and violations already reported end
    // with the run.
    fake.reset();
    return out;
  }

 public:
  // The fault-free run, then one run per call of each entry point it made;
  // each run that breaks a rule is a test failure naming its fault.
  void walk_all() const {
    const WalkRun clean = run(nullptr);
    ASSERT_TRUE(clean.problems.empty() && clean.failed_step.empty())
        << "the workload fails without faults: " << clean.failed_step << ": " << clean.message
        << "\n" << join(clean.problems);
    std::ostringstream calls;
    uint64_t runs = 0;
    for (const auto& [entry_point, n] : clean.calls) {
      calls << " " << entry_point << " x" << n;
      runs += n;
    }
    std::printf("driver walk: %llu faulted run(s) over the workload's calls:%s\n",
                static_cast<unsigned long long>(runs), calls.str().c_str());
    for (const auto& [entry_point, n] : clean.calls) {
      for (uint64_t k = 1; k <= n; ++k) {
        const WalkFault fault{entry_point, k};
        const WalkRun faulted = run(&fault);
        EXPECT_TRUE(faulted.problems.empty())
            << "call " << k << " of " << n << " of " << entry_point << " failing (first failed "
            << "ABI call: " << (faulted.failed_step.empty() ? "none" : faulted.failed_step)
            << "):\n"
            << join(faulted.problems);
      }
    }
  }

 private:
  // The release of the until-released copy: counts, and overwrites the
  // source, which the host may reuse from now on; a copy that reads it
  // later trips the fake's source-lifetime check.
  struct SourceRelease {
    void* source = nullptr;
    size_t nbytes = 0;
    std::atomic<int> releases{0};
    static void on_release(void* self) {
      auto* me = static_cast<SourceRelease*>(self);
      if (me->releases.fetch_add(1) == 0) std::memset(me->source, 0xa5, me->nbytes);
    }
  };

  template <class Problem>
  void check_thread(const char* call, const Problem& problem) const {
    if (!t_.thread) return;
    if (const std::string changed = t_.thread(); !changed.empty()) {
      problem(std::string(call) + " left the calling thread changed: " + changed);
    }
  }

  static std::string join(const std::vector<std::string>& lines) {
    std::string text;
    for (const auto& line : lines) text += "  " + line + "\n";
    return text;
  }

  WalkTarget t_;
};

}  // namespace devalloc::fake_test
