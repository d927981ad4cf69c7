// The layer itself: an instance of it stands in for the plugin's instance,
// and its table for the plugin's table (see devalloc/plugin_layer.hpp).
// Its table's entries are the one dispatch: each checks its call's
// parameters and result here (PLUGIN-4, -5, -6, -10, -15, ...) and hands
// what it learned to the checkers: LayerAllocations (live allocations and
// mappings), the handle's ReleaseTracker (releases), LayerSourceChecks
// (check_sources). Fault injection (LayerSettings::faults) is counted
// here, in count_call.
#pragma once

#include "layer_allocations.hpp"
#include "layer_source_checks.hpp"
#include "release_tracker.hpp"

#include <devalloc/plugin_abi.h>
#include <devalloc/plugin_layer.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace devalloc {

// Until-released copies are accounted by the plugin handle's tracker, the
// one ledger of them: copies the handle made pass through with its token;
// a caller of the table who hands its own on_release (the conformance
// suite) gets a copy of the tracker's that runs that on_release as its
// completion. The layer watches the releases (ReleaseObserver) and asks
// the tracker which copies are unreleased.
class PluginLayer final : private detail::ReleaseObserver {
 public:
  // Wraps a created instance. The layer owns it from now on: the layer's
  // destroy destroys it, then frees the layer. abi_minor: the minor that
  // negotiation agreed on; the layer's get_capabilities hands on only the
  // flags it defines. `releases`: the handle's tracker, which outlives the
  // layer.
  static PluginLayer* wrap(const devalloc_plugin_api_v1& real,
                           devalloc_instance* real_instance, uint32_t abi_minor,
                           std::string plugin, LayerSettings settings,
                           detail::ReleaseTracker& releases);

  const devalloc_plugin_api_v1& table() const { return table_; }
  devalloc_instance* instance() {
    return reinterpret_cast<devalloc_instance*>(this);
  }
  LayerCounters counters() const;
  const LayerSettings& settings() const { return settings_; }

 private:
  struct Call;  // one call in progress: its text, status and error

  PluginLayer(const devalloc_plugin_api_v1& real, devalloc_instance* real_instance,
              uint32_t abi_minor, std::string plugin, LayerSettings settings,
              detail::ReleaseTracker& releases);
  static PluginLayer* self(devalloc_instance* instance) {
    return reinterpret_cast<PluginLayer*>(instance);
  }

  // The table's entries.
  static void destroy(devalloc_instance* instance);
  static devalloc_status get_capabilities(devalloc_instance*, devalloc_capabilities*,
                                          devalloc_error*);
  static devalloc_status get_device_count(devalloc_instance*, uint32_t*, devalloc_error*);
  static devalloc_status get_device_properties(devalloc_instance*, uint32_t,
                                               devalloc_device_properties*,
                                               devalloc_error*);
  static devalloc_status allocate(devalloc_instance*, devalloc_allocate_args*,
                                  devalloc_error*);
  static devalloc_status deallocate(devalloc_instance*, uint32_t, devalloc_device_address,
                                    devalloc_error*);
  static devalloc_status copy_host_to_device(devalloc_instance*,
                                             const devalloc_copy_to_device_args*,
                                             devalloc_error*);
  static devalloc_status copy_device_to_host(devalloc_instance*,
                                             const devalloc_copy_to_host_args*,
                                             devalloc_error*);
  static devalloc_status synchronize(devalloc_instance*, uint32_t, devalloc_error*);
  static devalloc_status allocate_host(devalloc_instance*, uint64_t, void**,
                                       devalloc_error*);
  static devalloc_status free_host(devalloc_instance*, void*, devalloc_error*);
  static devalloc_status get_memory_info(devalloc_instance*, uint32_t, uint64_t*, uint64_t*,
                                         devalloc_error*);
  static devalloc_status map_to_host(devalloc_instance*, devalloc_map_args*, devalloc_error*);
  static devalloc_status unmap_from_host(devalloc_instance*, uint32_t, void*, devalloc_error*);
  // ReleaseObserver: a copy's first release (PLUGIN-14's checks, fault
  // injection), and a second release or one for no copy.
  void released(const detail::ReleasedCopy& copy) noexcept override;
  void stray(const detail::StrayRelease& release) noexcept override;

  // Reports a breach (log, stderr) and returns its text without the plugin:
  // "PLUGIN-15: copy_host_to_device(...): ...".
  std::string breach(const char* rule, const std::string& call, const std::string& detail);
  // The next counted call; true when it is the one to fail.
  bool count_call();
  bool device_exists(uint32_t device) const { return device < device_count_; }
  bool checks_sources() const { return settings_.validate && settings_.check_sources; }
  // Checks the plugin's error and status (PLUGIN-5, PLUGIN-6) and hands the
  // result to the caller's error.
  devalloc_status finish(Call& call);
  static devalloc_status fail(Call& call, devalloc_status status, const std::string& message);
  devalloc_status fail_breach(Call& call, const char* rule, const std::string& detail);
  // Breaches found in callbacks, reported by the next call on the device.
  bool take_owed(uint32_t device, std::string* text);

  // The source check (check_sources).
  // Mutex held: whether the layer may overwrite the released source of
  // copy: it lies in staging memory from this instance's allocate_host
  // (the host's transit memory, writable) and no unreleased copy reads any
  // of its bytes.
  bool may_poison(const detail::ReleasedCopy& copy) const;
  // Reads back the destinations of the checks `ids` that are still
  // remembered and released (their device synchronized since), forgets
  // them, and returns a breach text for each whose bytes differ.
  std::vector<std::string> read_back_sources(const std::vector<uint64_t>& ids);
  // Before a new check is remembered: with kLayerSourceChecksKept already
  // remembered, synchronizes the device of the oldest and reads its checks
  // back (breaches owed to that device); if still full, forgets the oldest.
  void make_room_for_source_check();

  devalloc_plugin_api_v1 table_{};
  const devalloc_plugin_api_v1& real_;
  devalloc_instance* real_instance_;
  const uint32_t abi_minor_;
  const uint64_t known_flags_;  // the capability flags of the negotiated minor
  const std::string plugin_;
  const LayerSettings settings_;
  detail::ReleaseTracker& releases_;
  std::atomic<uint64_t> breaches_{0};
  bool has_host_staging_ = false;
  bool has_memory_info_ = false;
  bool has_host_mapping_ = false;
  uint32_t device_count_ = 0;

  mutable std::mutex mutex_;
  uint64_t calls_ = 0;
  uint64_t allocations_made_ = 0;  // allocates of device memory (fail_allocate_at)
  uint64_t copies_made_ = 0;       // copies of bytes (fail_copy_at)
  uint64_t faults_injected_ = 0;
  detail::LayerAllocations allocations_;
  std::map<uint32_t, std::vector<std::string>> owed_;  // device -> breach texts
  std::set<uint32_t> failed_devices_;       // injected asynchronous failures
  detail::LayerSourceChecks sources_;  // with check_sources
  // device -> a failure of the layer's own synchronize (status, message),
  // which the caller's next synchronize of the device reports.
  std::map<uint32_t, std::pair<devalloc_status, std::string>> unreported_failures_;
};

}  // namespace devalloc
