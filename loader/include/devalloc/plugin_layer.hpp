// Layers between the host and a plugin's function table, in the spirit of
// the Vulkan and Level Zero validation layers: a wrapper table that checks
// every call and every on_release against the numbered rules of
// docs/abi.md (validation), and that can make calls fail on purpose (fault
// injection, for tests). Plugin::create puts the layer in place when asked,
// so the core, the CLI and the conformance suite use it without knowing.
// docs/reliability.md lists the checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace devalloc {

// Faults the layer injects, for tests of what a caller does when a plugin
// fails: the one place devalloc injects faults at the ABI (the fake vendor
// runtimes inject driver faults beneath the plugins). Calls are counted per
// instance from 1: for fail_call each allocate, copy_host_to_device,
// copy_device_to_host, synchronize, and each on_release the plugin calls.
struct FaultInjection {
  // The counted call that fails: allocate with OUT_OF_DEVICE_MEMORY; a copy
  // with DEVICE_ERROR without reaching the plugin (its on_release fired);
  // synchronize with DEVICE_ERROR after the plugin's synchronize ran; a
  // release is passed on, and the next synchronize of its device reports
  // DEVICE_ERROR, as for a copy that failed asynchronously. 0: none.
  uint64_t fail_call = 0;
  // allocate fails with OUT_OF_DEVICE_MEMORY when the live bytes of the
  // instance would exceed this. 0: no budget.
  uint64_t device_bytes = 0;
  // The N-th allocate of device memory (nbytes > 0) fails with
  // OUT_OF_DEVICE_MEMORY without reaching the plugin. 0: none.
  uint64_t fail_allocate_at = 0;
  // The N-th copy_host_to_device of bytes (nbytes > 0, a source) fails with
  // DEVICE_ERROR without reaching the plugin; its on_release fires. 0: none.
  uint64_t fail_copy_at = 0;
  // Every synchronize fails with DEVICE_ERROR after the plugin's ran.
  bool fail_synchronize = false;

  bool any() const {
    return fail_call != 0 || device_bytes != 0 || fail_allocate_at != 0 || fail_copy_at != 0 ||
           fail_synchronize;
  }
};

struct LayerSettings {
  bool validate = false;
  // With validate, for each until-released copy: its source must hold the
  // bytes it held at issue until its release (a breach by the caller), and
  // the plugin must have read them before it released them (PLUGIN-14): a
  // released source in the plugin's staging memory is overwritten with a
  // poison pattern at once, and the next synchronize of the device reads
  // the destination back and compares it with the source's hash at issue.
  // Costs two passes over every source byte and a read-back of every
  // destination; docs/reliability.md.
  bool check_sources = false;
  FaultInjection faults;

  bool active() const { return validate || faults.any(); }
  // DEVALLOC_VALIDATE (read with secure_getenv, case-insensitive): unset,
  // "", "0", "false", "no" or "off" change nothing; "1", "true", "yes" or
  // "on" turn on validate; "sources" turns on validate and check_sources;
  // any other value turns on validate and says so on stderr, once.
  LayerSettings with_environment() const;
  // The checks these settings turn on, in the words `devalloc plugins` and
  // the layer's announcement use: "calls" and "releases" with validate,
  // then "sources" with check_sources; "faults" when faults are injected.
  // Empty when no layer is active.
  std::vector<std::string> check_names() const;
};

// What the layer of one instance has seen so far.
struct LayerCounters {
  uint64_t calls = 0;             // counted calls, as for FaultInjection
  uint64_t faults_injected = 0;
  uint64_t live_allocations = 0;  // allocate minus deallocate
  uint64_t live_bytes = 0;
  uint64_t pending_releases = 0;  // until-released copies not released yet
  uint64_t breaches = 0;
  // Until-released copies the plugin handle's release accounting, which
  // the layer checks against, remembers: those in flight and at most
  // kReleasedCopiesKept released ones (devalloc/plugin.hpp).
  uint64_t remembered_copies = 0;
  // With check_sources: released copies whose destination the next
  // synchronize of their device reads back (at most kLayerSourceChecksKept),
  // and how many were read back so far.
  uint64_t pending_source_checks = 0;
  uint64_t source_checks_done = 0;
};

// Until-released copies whose destination a layer with check_sources
// remembers to read back, at most (each: device, range, a 64-bit hash and
// the call's text). When a new copy finds that many, the layer synchronizes
// the device of the oldest and reads its checks back at once.
inline constexpr size_t kLayerSourceChecksKept = 1024;

// A broken rule: "PLUGIN-15", the plugin ("plugin NAME (PATH)"), the call
// with its arguments, and what was wrong.
struct ValidationBreach {
  std::string rule;
  std::string plugin;
  std::string call;
  std::string detail;

  // "PLUGIN-15: plugin x (/p/libdevalloc_x.so): copy_host_to_device(...): ..."
  std::string text() const;
};

// Every breach reported in this process, oldest first. Each is also
// printed to stderr as "devalloc validation: " + text() when it happens.
std::vector<ValidationBreach> validation_breaches();
void clear_validation_breaches();

}  // namespace devalloc
