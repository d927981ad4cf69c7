// A device as a load sees it: a device tag resolved to a plugin and one of
// its devices (DeviceRegistry, device_registry.hpp, resolves them).
#pragma once

#include <devalloc/plugin.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace devalloc {

// A device tag resolved to a physical device.
struct ResolvedDevice {
  std::string tag;                 // the tag that was asked for
  std::shared_ptr<Plugin> plugin;
  std::string plugin_name;         // the config name ("cuda", an alias, ...)
  uint32_t device = 0;             // index among the plugin's devices
  bool is_fallback = false;
  std::string via_tag;             // the tag whose entry gave the binding
  // For a fallback, why each candidate before it failed (attempts_text):
  // "cdua index 0: plugin cdua is unavailable: ...". Empty otherwise.
  std::string fallback_reason;

  const DeviceInfo& info() const { return plugin->devices().at(device); }
  // "host:0 (plugin host, device 0 \"host memory\")"
  std::string describe() const;
  // The physical device alone, whatever tag led to it:
  // "host device 0 \"host memory\"". Several tags may share one.
  std::string device_label() const;
  bool same_device(const ResolvedDevice& other) const {
    return plugin == other.plugin && device == other.device;
  }
  // The same device, or one that reports the same non-zero UUID through
  // another plugin instance or plugin (two [plugins.*] entries with one
  // library, say): one physical device, whose memory both share.
  bool same_physical_device(const ResolvedDevice& other) const;
};

}  // namespace devalloc
