#include <devalloc/core/device_registry.hpp>

#include <devalloc/core/device_selection.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

namespace devalloc {

std::string ResolvedDevice::describe() const {
  return tag + " (plugin " + plugin_name + ", device " +
         std::to_string(device) + " " + quote(info().name) + ")";
}

bool ResolvedDevice::same_physical_device(const ResolvedDevice& other) const {
  if (same_device(other)) return true;
  const DeviceInfo& mine = info();
  const DeviceInfo& theirs = other.info();
  // The memories of one card share its uuid and are told apart by their
  // kind (PLUGIN-24): two memories are not one device.
  return mine.has_uuid() && theirs.has_uuid() && mine.uuid == theirs.uuid &&
         mine.memory_kind == theirs.memory_kind;
}

std::string ResolvedDevice::device_label() const {
  return plugin_name + " device " + std::to_string(device) + " " + quote(info().name);
}

PluginSearchOptions plugin_search_options(const RuntimeConfig& config) {
  PluginSearchOptions options;
  options.config_dirs = config.plugin_path;
  options.fallback_dirs = config.fallback_plugin_path;
  options.trusted_paths = config.trust_paths;
  options.trust_path_option = config.trust_path_option;
  return options;
}

DeviceRegistry::DeviceRegistry(RuntimeConfig config)
    : config_(std::move(config)), loader_(plugin_search_options(config_)) {}

Result<std::shared_ptr<Plugin>> DeviceRegistry::plugin(std::string_view name) {
  return detail::catch_as_status([&] { return plugin_or_throw(name); },
                                 [&](StatusCode code, std::string_view what) {
                                   return "plugin " + escaped(name) + ": " +
                                          detail::failure_text(code, what);
                                 });
}

Result<std::shared_ptr<Plugin>> DeviceRegistry::plugin_or_throw(std::string_view name) {
  std::lock_guard lock(mutex_);
  if (auto it = plugins_.find(name); it != plugins_.end()) return it->second;
  const PluginConfig pc = config_.plugin(name);
  auto [plugin, error] = loader_.load(pc.load_spec(), pc.options, pc.layers, pc.trust);
  if (!plugin) {
    // Not remembered: the next use tries again, so that a plugin whose
    // runtime or device came back (or was installed meanwhile) is found.
    return pc.where.line == 0
               ? error.status
               : error.status.with_context(pc.where.to_string() +
                                           ": [plugins." + pc.name + "]");
  }
  plugins_.emplace(std::string(name), plugin);
  return plugin;
}

bool DeviceRegistry::drop_plugin(std::string_view name) {
  std::shared_ptr<Plugin> dropped;  // destroyed outside the lock
  std::lock_guard lock(mutex_);
  auto it = plugins_.find(name);
  if (it == plugins_.end()) return false;
  dropped = std::move(it->second);
  plugins_.erase(it);
  ++generation_;
  return true;
}

Result<ResolvedDevice> DeviceRegistry::resolve(
    std::string_view tag, std::optional<uint32_t> memory_id) {
  return detail::catch_as_status([&] { return resolve_or_throw(tag, memory_id); },
                                 [&](StatusCode code, std::string_view what) {
                                   return "device " + quote(tag) + ": " +
                                          detail::failure_text(code, what);
                                 });
}

Result<ResolvedDevice> DeviceRegistry::resolve_or_throw(std::string_view tag,
                                                        std::optional<uint32_t> memory_id) {
  auto candidates = candidate_bindings(config_, tag);
  if (!candidates.ok()) return candidates.status();
  std::vector<SelectionAttempt> attempts;
  for (const DeviceCandidate& c : *candidates) {
    auto p = plugin(c.binding.plugin);
    if (!p.ok()) {
      attempts.push_back({c, "plugin " + c.binding.plugin +
                                 " is unavailable: " + p.status().message()});
      continue;
    }
    const auto& devices = (*p)->devices();
    std::optional<uint32_t> index = select_device(c.binding.selector, devices);
    if (!index) {
      attempts.push_back({c, no_match_reason(c.binding.selector, devices)});
      continue;
    }
    ResolvedDevice r;
    r.tag = std::string(tag);
    r.plugin = *p;
    r.plugin_name = c.binding.plugin;
    r.device = *index;
    r.is_fallback = c.is_fallback;
    r.via_tag = c.via_tag;
    if (r.is_fallback) r.fallback_reason = attempts_text(tag, attempts);
    return r;
  }
  return no_device_error(tag, memory_id, attempts);
}

}  // namespace devalloc
