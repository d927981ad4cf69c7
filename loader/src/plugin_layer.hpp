// The layer itself: an instance of it stands in for the plugin's instance,
// and its table for the plugin's table (see devalloc/plugin_layer.hpp).
#pragma once

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
  // With check_sources: an until-released copy whose destination is read
  // back once it is released and its device synchronized.
  struct SourceCheck {
    uint32_t device = 0;
    uint64_t dst = 0;
    uint64_t nbytes = 0;
    uint64_t source_hash = 0;  // of src at issue
    std::string call;
    bool issued = false;    // the plugin's copy call returned OK
    bool released = false;
    bool poisoned = false;  // the layer overwrote the released source
    // Being read back (outside the mutex); stale once the range was
    // written, mapped or freed meanwhile, and its result is dropped.
    bool reading = false;
    bool stale = false;
  };

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
  bool inside_allocation(uint32_t device, uint64_t address, uint64_t nbytes) const;
  // Checks the plugin's error and status (PLUGIN-5, PLUGIN-6) and hands the
  // result to the caller's error.
  devalloc_status finish(Call& call);
  static devalloc_status fail(Call& call, devalloc_status status, const std::string& message);
  devalloc_status fail_breach(Call& call, const char* rule, const std::string& detail);
  // Breaches found in callbacks, reported by the next call on the device.
  bool take_owed(uint32_t device, std::string* text);

  // The source check (check_sources). Mutex held: forgets the checks whose
  // destination overlaps [address, address + nbytes) of device (written
  // again, mapped, or about to be freed), or marks them stale while they
  // are read back. overlaps_mapping: true when the range overlaps a live
  // mapping.
  void forget_source_checks(uint32_t device, uint64_t address, uint64_t nbytes);
  bool overlaps_mapping(uint32_t device, uint64_t address, uint64_t nbytes) const;
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
  // Forgets the checks `ids` (of a device whose synchronize failed: a
  // failed copy is no early release) but those being read back; mutex_.
  void forget_source_checks(const std::vector<uint64_t>& ids) noexcept;

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
  uint64_t faults_injected_ = 0;
  uint64_t live_bytes_ = 0;
  std::map<uint32_t, std::map<uint64_t, uint64_t>> allocations_;  // device -> base -> size
  std::map<uint32_t, std::vector<std::string>> owed_;  // device -> breach texts
  std::set<uint32_t> failed_devices_;       // injected asynchronous failures
  // Live mappings (ABI 1.2): device -> host pointer -> mapped range
  // (address, nbytes); a range mapped twice is two entries.
  std::map<uint32_t, std::multimap<const void*, std::pair<uint64_t, uint64_t>>> mappings_;
  // With check_sources: live staging buffers from allocate_host (base ->
  // size), and the source checks by the tracker's copy number.
  std::map<uintptr_t, uint64_t> staging_;
  std::map<uint64_t, SourceCheck> source_checks_;
  uint64_t source_checks_done_ = 0;
  // Signalled when a read-back ends: a deallocate of its range waits for
  // it (the plugin must not free memory a copy still reads).
  std::condition_variable read_back_ended_;
  // device -> a failure of the layer's own synchronize (status, message),
  // which the caller's next synchronize of the device reports.
  std::map<uint32_t, std::pair<devalloc_status, std::string>> unreported_failures_;
};

}  // namespace devalloc
