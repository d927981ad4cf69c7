#include <devalloc/core/device_selection.hpp>
#include <devalloc/input_text.hpp>

#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace devalloc {

namespace {

std::string prefixed(const SourceLocation* where, const std::string& message) {
  if (where == nullptr || where->file.empty()) return message;
  return where->to_string() + ": " + message;
}

// Walks the fallbacks of device tags depth first, in the order of
// candidate_bindings, with an explicit stack (no recursion, so a chain of
// 30 000 tags is not 30 000 stack frames). Each tag is expanded once per
// walk: a tag met again after its expansion finished adds nothing (all its
// bindings are on the list already), so a walk takes time linear in the
// tags and fallback entries it reaches, where expanding every path took
// 2^K steps for K levels of diamonds. A tag met again while it is still
// being expanded closes a fallback cycle.
class FallbackWalk {
 public:
  // collect: keep the candidates (candidate_bindings) or only check
  // (check_fallbacks).
  FallbackWalk(const RuntimeConfig& config, bool collect)
      : config_(config), collect_(collect) {}

  // Expands tag and what it falls back to. Tags expanded by an earlier
  // call of the same walk are not expanded again.
  Status expand(std::string_view tag) {
    if (states_.count(tag) != 0) return Status();
    Status status = enter(tag, nullptr);
    while (status.ok() && !stack_.empty()) {
      Frame& frame = stack_.back();
      if (frame.next == frame.device->fallbacks.size()) {
        states_[frame.tag] = State::done;
        stack_.pop_back();
        continue;
      }
      const DeviceFallback& fallback = frame.device->fallbacks[frame.next++];
      if (const auto* binding = std::get_if<DeviceBinding>(&fallback.target)) {
        add(*binding, frame.tag);
      } else {
        status = enter(std::get<std::string>(fallback.target), &fallback.where);
      }
    }
    return status;
  }

  std::vector<DeviceCandidate> take() { return std::move(candidates_); }

 private:
  enum class State { expanding, done };
  struct Frame {
    std::string_view tag;
    const DeviceTagConfig* device;
    size_t next = 0;  // the next fallback to look at
  };

  // referenced_at: the fallback entry that names tag; null for the tag asked
  // for.
  Status enter(std::string_view tag, const SourceLocation* referenced_at) {
    if (const auto it = states_.find(tag); it != states_.end()) {
      if (it->second == State::done) return Status();
      return Status(StatusCode::invalid_argument,
                    prefixed(referenced_at, "fallback cycle: " + cycle(tag)));
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
      states_[tag] = State::done;
      return Status();
    }
    states_[tag] = State::expanding;
    add(device->second.primary, tag);
    stack_.push_back(Frame{tag, &device->second});
    return Status();
  }

  // "a" -> "b" -> "a" for the cycle that closes at tag, which is being
  // expanded. A long cycle shows its first and last tags only.
  std::string cycle(std::string_view tag) const {
    size_t first = 0;
    while (stack_[first].tag != tag) ++first;
    const size_t length = stack_.size() - first;
    constexpr size_t kShown = 8;  // at each end
    std::string text;
    for (size_t i = first; i < stack_.size(); ++i) {
      const size_t position = i - first;
      if (length > 2 * kShown && position == kShown) {
        text += "... (" + std::to_string(length - 2 * kShown) + " more) -> ";
        i = stack_.size() - kShown - 1;
        continue;
      }
      text += quote(stack_[i].tag) + " -> ";
    }
    return text + quote(tag);
  }

  void add(const DeviceBinding& binding, std::string_view via_tag) {
    if (!collect_) return;
    std::string key = binding.plugin;
    key += '\0';
    key += binding.selector.to_string();
    if (!seen_.insert(std::move(key)).second) return;
    candidates_.push_back({binding, std::string(via_tag), !candidates_.empty()});
  }

  const RuntimeConfig& config_;
  const bool collect_;
  // Keyed by views of the config's strings and of the tag asked for, which
  // outlive the walk.
  std::unordered_map<std::string_view, State> states_;
  std::vector<Frame> stack_;
  std::unordered_set<std::string> seen_;  // bindings on the list
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
                                          : escaped(device.pci_bus_id));  // the plugin's words
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
  FallbackWalk walk(config, /*collect=*/true);
  Status status = walk.expand(tag);
  if (!status.ok()) return status;
  return walk.take();
}

Status check_fallbacks(const RuntimeConfig& config) {
  FallbackWalk walk(config, /*collect=*/false);
  for (const auto& [tag, device] : config.devices) {
    Status status = walk.expand(tag);
    if (!status.ok()) return status;
  }
  return Status();
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

std::string attempts_text(std::string_view tag, const std::vector<SelectionAttempt>& attempts) {
  if (attempts.empty()) return "nothing was tried";
  std::string text;
  for (size_t i = 0; i < attempts.size(); ++i) {
    const DeviceCandidate& candidate = attempts[i].candidate;
    if (i > 0) text += "; ";
    if (candidate.is_fallback) text += "fallback ";
    text += candidate.binding.to_string();
    if (candidate.via_tag != tag) {
      text += " (device " + quote(candidate.via_tag) + ")";
    }
    text += ": " + attempts[i].reason;
  }
  return text;
}

Status no_device_error(std::string_view tag, std::optional<uint32_t> memory_id,
                       const std::vector<SelectionAttempt>& attempts) {
  std::string message = "no device for " + quote(tag);
  if (memory_id) message += " (memory id " + std::to_string(*memory_id) + ")";
  message += ": " + attempts_text(tag, attempts);
  return Status(StatusCode::no_such_device, std::move(message));
}

}  // namespace devalloc
