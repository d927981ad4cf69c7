#include <devalloc/core/device_selection.hpp>
#include <devalloc/input_text.hpp>

#include <algorithm>

namespace devalloc {

namespace {

std::string prefixed(const SourceLocation* where, const std::string& message) {
  if (where == nullptr || where->file.empty()) return message;
  return where->to_string() + ": " + message;
}

class CandidateExpander {
 public:
  explicit CandidateExpander(const RuntimeConfig& config) : config_(config) {}

  // referenced_at: the fallback entry that names tag; null for the tag asked
  // for.
  Status expand(const std::string& tag, const SourceLocation* referenced_at) {
    if (std::find(chain_.begin(), chain_.end(), tag) != chain_.end()) {
      std::string cycle;
      for (auto it = std::find(chain_.begin(), chain_.end(), tag);
           it != chain_.end(); ++it) {
        cycle += quote(*it) + " -> ";
      }
      return Status(StatusCode::invalid_argument,
                    prefixed(referenced_at,
                             "fallback cycle: " + cycle + quote(tag)));
    }
    const auto parsed = parse_device_tag(tag);
    if (!parsed) {
      return Status(StatusCode::invalid_argument,
                    prefixed(referenced_at,
                             "invalid device tag " + quote(tag) +
                                 ": expected \"name\" or \"name:index\""));
    }
    const auto device = config_.devices.find(tag);
    if (device == config_.devices.end()) {
      add(default_binding(*parsed), tag);
      return Status();
    }
    chain_.push_back(tag);
    add(device->second.primary, tag);
    for (const auto& fallback : device->second.fallbacks) {
      if (const auto* binding = std::get_if<DeviceBinding>(&fallback.target)) {
        add(*binding, tag);
        continue;
      }
      Status status =
          expand(std::get<std::string>(fallback.target), &fallback.where);
      if (!status.ok()) return status;
    }
    chain_.pop_back();
    return Status();
  }

  std::vector<DeviceCandidate> take() { return std::move(candidates_); }

 private:
  void add(const DeviceBinding& binding, const std::string& via_tag) {
    const bool seen = std::any_of(
        candidates_.begin(), candidates_.end(),
        [&](const DeviceCandidate& c) { return c.binding == binding; });
    if (seen) return;
    candidates_.push_back({binding, via_tag, !candidates_.empty()});
  }

  const RuntimeConfig& config_;
  std::vector<std::string> chain_;
  std::vector<DeviceCandidate> candidates_;
};

std::string device_list(const std::vector<DeviceInfo>& devices,
                        SelectorKind kind) {
  if (devices.empty()) return "the plugin reports no devices";
  std::string out = "devices:";
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceInfo& device = devices[i];
    out += i == 0 ? " " : ", ";
    switch (kind) {
      case SelectorKind::index:
        out += std::to_string(device.index);
        break;
      case SelectorKind::uuid:
        out += "#" + std::to_string(device.index) + " " +
               (device.has_uuid() ? device.uuid_string() : "no uuid");
        break;
      case SelectorKind::pci_bus_id:
        out += "#" + std::to_string(device.index) + " " +
               (device.pci_bus_id.empty() ? "no PCI bus id"
                                          : device.pci_bus_id);
        break;
    }
  }
  return out;
}

}  // namespace

DeviceBinding default_binding(const DeviceTag& tag) {
  return DeviceBinding{tag.name, DeviceSelector::by_index(tag.index.value_or(0))};
}

Result<std::vector<DeviceCandidate>> candidate_bindings(
    const RuntimeConfig& config, std::string_view tag) {
  CandidateExpander expander(config);
  Status status = expander.expand(std::string(tag), nullptr);
  if (!status.ok()) return status;
  return expander.take();
}

std::string tag_for_memory(const RuntimeConfig& config, uint32_t memory_id,
                           std::string_view planned_tag) {
  const auto it = config.memory_overrides.find(memory_id);
  return it != config.memory_overrides.end() ? it->second
                                              : std::string(planned_tag);
}

std::optional<uint32_t> select_device(const DeviceSelector& selector,
                                      const std::vector<DeviceInfo>& devices) {
  if (selector.kind == SelectorKind::index) {
    for (const auto& device : devices) {
      if (device.index == selector.index) return device.index;
    }
    return std::nullopt;
  }
  if (selector.kind == SelectorKind::uuid) {
    const auto wanted = normalize_uuid(selector.id);
    if (!wanted) return std::nullopt;
    for (const auto& device : devices) {
      if (device.has_uuid() && normalize_uuid(device.uuid_string()) == wanted) {
        return device.index;
      }
    }
    return std::nullopt;
  }
  const auto wanted = normalize_pci_bus_id(selector.id);
  if (!wanted) return std::nullopt;
  for (const auto& device : devices) {
    if (normalize_pci_bus_id(device.pci_bus_id) == wanted) return device.index;
  }
  return std::nullopt;
}

std::string no_match_reason(const DeviceSelector& selector,
                            const std::vector<DeviceInfo>& devices) {
  const char* what = selector.kind == SelectorKind::pci_bus_id
                         ? "PCI bus id"
                         : to_string(selector.kind);
  const std::string value = selector.kind == SelectorKind::index
                                ? std::to_string(selector.index)
                                : selector.id;
  return "no device with " + std::string(what) + " " + value + " (" +
         device_list(devices, selector.kind) + ")";
}

Status no_device_error(std::string_view tag, std::optional<uint32_t> memory_id,
                       const std::vector<SelectionAttempt>& attempts) {
  std::string message = "no device for " + quote(tag);
  if (memory_id) message += " (memory id " + std::to_string(*memory_id) + ")";
  message += ": ";
  if (attempts.empty()) message += "nothing was tried";
  for (size_t i = 0; i < attempts.size(); ++i) {
    const DeviceCandidate& candidate = attempts[i].candidate;
    if (i > 0) message += "; ";
    if (candidate.is_fallback) message += "fallback ";
    message += candidate.binding.to_string();
    if (candidate.via_tag != tag) {
      message += " (device " + quote(candidate.via_tag) + ")";
    }
    message += ": " + attempts[i].reason;
  }
  return Status(StatusCode::no_such_device, std::move(message));
}

}  // namespace devalloc
