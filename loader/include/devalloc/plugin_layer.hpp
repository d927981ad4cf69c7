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

// Faults the layer injects. Calls are counted per instance from 1: each
// allocate, copy_host_to_device, copy_device_to_host, synchronize, and each
// on_release the plugin calls.
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

  bool any() const { return fail_call != 0 || device_bytes != 0; }
};

struct LayerSettings {
  bool validate = false;
  // With validate: hash the source of each until-released copy when it is
  // issued and again when it is released; a difference is a breach by the
  // caller. Costs a pass over every source byte.
  bool check_sources = false;
  FaultInjection faults;

  bool active() const { return validate || faults.any(); }
  // DEVALLOC_VALIDATE (read with secure_getenv): unset, "", "0" or "false"
  // change nothing; "sources" turns on validate and check_sources; any
  // other value turns on validate.
  LayerSettings with_environment() const;
};

// What the layer of one instance has seen so far.
struct LayerCounters {
  uint64_t calls = 0;             // counted calls, as for FaultInjection
  uint64_t faults_injected = 0;
  uint64_t live_allocations = 0;  // allocate minus deallocate
  uint64_t live_bytes = 0;
  uint64_t pending_releases = 0;  // until-released copies not released yet
  uint64_t breaches = 0;
  // Until-released copies the layer remembers: the pending ones and at most
  // kLayerReleasedKept released ones (whose second release it can name).
  uint64_t remembered_copies = 0;
};

// Released copies a layer remembers, at most, to name a second release of
// one (an older one's is reported as a stray release): the layer's memory
// stays bounded however many copies a long run makes.
inline constexpr size_t kLayerReleasedKept = 4096;

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
