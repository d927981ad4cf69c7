// Which plugin and which of its devices back a device tag, resolved against
// the plugins that are really there. Plugins are loaded on first use, once
// per registry; a plugin that failed to load is tried again at its next use.
#pragma once

#include <devalloc/core/config.hpp>
#include <devalloc/core/device.hpp>
#include <devalloc/plugin_loader.hpp>
#include <devalloc/status.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace devalloc {

// The search path and trusted paths of a config: plugin_path as the
// config's folders, [security] trust_paths.
PluginSearchOptions plugin_search_options(const RuntimeConfig& config);

class DeviceRegistry {
 public:
  explicit DeviceRegistry(RuntimeConfig config);

  const RuntimeConfig& config() const { return config_; }
  const PluginLoader& loader() const { return loader_; }

  // The plugin configured (or found) under name, loading it on first use.
  // Fails with the loader's reason, naming the config place if configured.
  Result<std::shared_ptr<Plugin>> plugin(std::string_view name);

  // Forgets the instance loaded under name, so that its next use creates a
  // fresh one: how a caller recovers from an instance whose device faulted
  // (docs/plugins/cuda.md). Buffers and programs that hold the old instance
  // keep it alive until they are gone; it is destroyed with the last of
  // them. False when no instance was loaded under name.
  bool drop_plugin(std::string_view name);
  // Changes each time drop_plugin forgets an instance: a caller that keeps a
  // ResolvedDevice resolves again when it changed, and so follows the
  // recovery to the fresh instance.
  uint64_t generation() const { return generation_.load(); }

  // The device backing tag; memory_id only appears in errors. A tag without
  // a resolvable device is an error that lists every candidate tried.
  Result<ResolvedDevice> resolve(std::string_view tag,
                                 std::optional<uint32_t> memory_id);

 private:
  // plugin() and resolve(), which may throw (an allocation that fails); the
  // public ones turn an exception into a Status.
  Result<std::shared_ptr<Plugin>> plugin_or_throw(std::string_view name);
  Result<ResolvedDevice> resolve_or_throw(std::string_view tag, std::optional<uint32_t> memory_id);

  RuntimeConfig config_;
  PluginLoader loader_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Plugin>, std::less<>> plugins_;
  std::atomic<uint64_t> generation_{0};
};

}  // namespace devalloc
