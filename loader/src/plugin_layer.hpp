// The layer itself: an instance of it stands in for the plugin's instance,
// and its table for the plugin's table (see devalloc/plugin_layer.hpp).
#pragma once

#include <devalloc/plugin_abi.h>
#include <devalloc/plugin_layer.hpp>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace devalloc {

class PluginLayer {
 public:
  // Wraps a created instance. The layer owns it from now on: the layer's
  // destroy destroys it, then frees the layer. abi_minor: the minor that
  // negotiation agreed on; the layer's get_capabilities hands on only the
  // flags it defines.
  static PluginLayer* wrap(const devalloc_plugin_api_v1& real,
                           devalloc_instance* real_instance, uint32_t abi_minor,
                           std::string plugin, LayerSettings settings);

  const devalloc_plugin_api_v1& table() const { return table_; }
  devalloc_instance* instance() {
    return reinterpret_cast<devalloc_instance*>(this);
  }
  LayerCounters counters() const;

 private:
  struct Ticket;  // one until-released copy, handed to the plugin as user_data
  struct Call;    // one call in progress: its text, status and error

  PluginLayer(const devalloc_plugin_api_v1& real, devalloc_instance* real_instance,
              uint32_t abi_minor, std::string plugin, LayerSettings settings);
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
  static void on_release(void* ticket);
  // An on_release whose user_data is no live ticket (PLUGIN-14).
  static void stray_release(const void* user_data);

  // Reports a breach (log, stderr) and returns its text without the plugin:
  // "PLUGIN-15: copy_host_to_device(...): ...".
  std::string breach(const char* rule, const std::string& call, const std::string& detail);
  // The next counted call; true when it is the one to fail.
  bool count_call();
  bool device_exists(uint32_t device) const { return device < device_count_; }
  bool inside_allocation(uint32_t device, uint64_t address, uint64_t nbytes) const;
  // Checks the plugin's error and status (PLUGIN-5, PLUGIN-6) and hands the
  // result to the caller's error.
  devalloc_status finish(Call& call);
  static devalloc_status fail(Call& call, devalloc_status status, const std::string& message);
  devalloc_status fail_breach(Call& call, const char* rule, const std::string& detail);
  // Breaches found in callbacks, reported by the next call on the device.
  bool take_owed(uint32_t device, std::string* text);

  devalloc_plugin_api_v1 table_{};
  const devalloc_plugin_api_v1& real_;
  devalloc_instance* real_instance_;
  const uint64_t known_flags_;  // the capability flags of the negotiated minor
  const std::string plugin_;
  const LayerSettings settings_;
  std::atomic<uint64_t> breaches_{0};
  bool has_host_staging_ = false;
  bool has_memory_info_ = false;
  uint32_t device_count_ = 0;

  mutable std::mutex mutex_;
  uint64_t calls_ = 0;
  uint64_t faults_injected_ = 0;
  uint64_t live_bytes_ = 0;
  std::map<uint32_t, std::map<uint64_t, uint64_t>> allocations_;  // device -> base -> size
  // The copies the layer remembers, by the token the plugin got as their
  // user_data: every unreleased one, and the last kReleasedKept released
  // (a second release of one of those is named as such; of an older one,
  // it is a stray). Changed only with g_tickets_mutex held too, as the
  // owners of the tokens are.
  std::unordered_map<const void*, Ticket> tickets_;
  std::deque<const void*> released_;        // oldest first
  uint64_t last_id_ = 0;
  std::map<uint64_t, Ticket*> pending_;     // by ticket id
  std::map<uint32_t, std::vector<std::string>> owed_;  // device -> breach texts
  std::set<uint32_t> failed_devices_;       // injected asynchronous failures
};

}  // namespace devalloc
