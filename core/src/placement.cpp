#include <devalloc/core/placement.hpp>
#include <devalloc/input_text.hpp>

#include <devalloc/core/device_selection.hpp>
#include <devalloc/core/plan.hpp>

#include "plan_errors.hpp"
#include "source_files.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string_view>

namespace devalloc {

Result<MethodNeeds> needs_of(const Plan& plan,
                             const std::vector<std::string>& methods,
                             bool external_files) {
  auto selection = plan.tensors_for_methods(methods);
  if (!selection.ok()) return selection.status();

  MethodNeeds needs;
  std::map<uint32_t, const PlanBuffer*> by_id;  // linear in buffers, not squared
  for (const PlanBuffer& b : plan.buffers) by_id.emplace(b.memory_id, &b);
  for (uint32_t id : selection->memory_ids) {
    const auto it = by_id.find(id);
    if (it == by_id.end()) continue;
    const PlanBuffer& b = *it->second;
    needs.buffers.push_back(PlannedBuffer{b.memory_id, b.size, b.alignment, b.device,
                                          static_cast<size_t>(&b - plan.buffers.data())});
  }
  detail::SourceFiles sources(plan, external_files);
  needs.tensors.reserve(selection->tensors.size());
  for (size_t index : selection->tensors) {
    const PlanTensor& t = plan.tensors[index];
    NeededTensor n;
    n.index = index;
    auto nbytes = byte_size(t.dtype, t.shape);
    if (!nbytes.ok()) {
      return nbytes.status().with_context(detail::plan_name(plan) + ": tensor " +
                                          quote(t.name));
    }
    n.nbytes = *nbytes;
    if (t.source) {
      const Result<size_t> file =
          sources.id_of(*t.source, [&] { return detail::named_place("tensors", index, t.name); });
      if (!file.ok()) return file.status();
      n.file = *file;
    }
    needs.tensors.push_back(n);
  }
  needs.files = sources.take_paths();
  needs.files_beneath = sources.beneath();
  return needs;
}

PlannedTensor planned_tensor(const Plan& plan, size_t index, uint64_t nbytes,
                             const std::filesystem::path* file) {
  const PlanTensor& t = plan.tensors[index];
  PlannedTensor p;
  p.name = t.name;
  p.dtype = t.dtype;
  p.shape = t.shape;
  p.memory_id = t.memory_id;
  p.offset = t.offset;
  p.nbytes = nbytes;
  if (file != nullptr && t.source) {
    p.file = *file;
    p.key = t.source->key;
  }
  return p;
}

Result<BufferPlacement> place_buffer(const PlannedBuffer& buffer,
                                     DeviceRegistry& registry) {
  BufferPlacement placement;
  placement.buffer = buffer;
  placement.tag = tag_for_memory(registry.config(), buffer.memory_id,
                                 buffer.planned_tag);
  auto device = registry.resolve(placement.tag, buffer.memory_id);
  if (!device.ok()) return device.status();
  placement.device = std::move(*device);
  if (placement.device.is_fallback &&
      registry.config().load.fallback == FallbackPolicy::error) {
    return Status(StatusCode::no_such_device,
                  "memory id " + std::to_string(buffer.memory_id) + ": device " +
                      quote(placement.tag) + " would fall back to " +
                      placement.device.device_label() +
                      ", which [load] fallback = \"error\" forbids: " +
                      placement.device.fallback_reason);
  }
  return placement;
}

std::string fallback_line(uint32_t memory_id, const ResolvedDevice& device) {
  std::string line = "memory id " + std::to_string(memory_id) + ": device " + quote(device.tag) +
                     " falls back to " + device.device_label();
  if (device.via_tag != device.tag) line += " (via " + quote(device.via_tag) + ")";
  return line + ": " + device.fallback_reason;
}

std::vector<std::string> unused_device_entries(const RuntimeConfig& config, const Plan& plan) {
  if (config.devices.empty()) return {};
  // The plan's tags after [memory], in order of first use, then every tag
  // their fallbacks reach: a walk with a stack, each tag once.
  std::vector<std::string_view> planned;
  std::set<std::string_view> reached;
  for (const PlanBuffer& buffer : plan.buffers) {
    const auto moved = config.memory_overrides.find(buffer.memory_id);
    const std::string_view tag =
        moved != config.memory_overrides.end() ? moved->second : buffer.device;
    if (reached.insert(tag).second) planned.push_back(tag);
  }
  std::vector<std::string_view> stack(planned.begin(), planned.end());
  while (!stack.empty()) {
    const auto device = config.devices.find(stack.back());
    stack.pop_back();
    if (device == config.devices.end()) continue;
    for (const DeviceFallback& fallback : device->second.fallbacks) {
      const auto* tag = std::get_if<std::string>(&fallback.target);
      if (tag != nullptr && reached.insert(*tag).second) stack.push_back(*tag);
    }
  }
  std::string tags;
  for (size_t i = 0; i < planned.size() && i < detail::kShownIds; ++i) {
    tags += (i == 0 ? "" : ", ") + quote(planned[i]);
  }
  if (planned.size() > detail::kShownIds) {
    tags += ", ... (" + std::to_string(planned.size()) + " in all)";
  }
  std::vector<const DeviceTagConfig*> unused;
  for (const auto& [tag, device] : config.devices) {
    if (reached.count(tag) == 0) unused.push_back(&device);
  }
  // In the config's order: the order a reader of the file meets them.
  std::stable_sort(unused.begin(), unused.end(), [](const auto* a, const auto* b) {
    return std::pair(a->where.line, a->where.column) < std::pair(b->where.line, b->where.column);
  });
  std::vector<std::string> lines;
  for (const DeviceTagConfig* device : unused) {
    const std::string where = device->where.file.empty() ? "" : device->where.to_string() + ": ";
    lines.push_back(where + "[devices." + quote(device->tag) + "] is used by no buffer of " +
                    detail::plan_name(plan) + " (its device tags: " +
                    (tags.empty() ? "none" : tags) + ")");
  }
  return lines;
}

std::string buffer_place(const Plan& plan, const PlannedBuffer& buffer) {
  return detail::plan_name(plan) + ": /buffers/" +
         (buffer.plan_index == SIZE_MAX ? std::string("?") : std::to_string(buffer.plan_index));
}

std::string DeviceDemand::summary() const {
  std::string text = "plan needs " + human_bytes(bytes) + " in " + std::to_string(buffers) +
                     (buffers == 1 ? " buffer" : " buffers") + ", ";
  if (!memory) return text + "free memory unknown (" + unknown_reason + ")";
  return text + human_bytes(memory->free_bytes) + " free of " +
         human_bytes(memory->total_bytes);
}

std::string DeviceDemand::label() const {
  std::string text = device.device_label();
  for (size_t k = 0; k < also_as.size(); ++k) {
    text += (k == 0 ? " (also as " : ", ") + also_as[k];
  }
  return also_as.empty() ? text : text + ")";
}

std::vector<DeviceDemand> device_demands(const std::vector<BufferPlacement>& placements) {
  std::vector<DeviceDemand> demands;
  for (const BufferPlacement& p : placements) {
    auto it = std::find_if(demands.begin(), demands.end(), [&](const DeviceDemand& d) {
      return d.device.same_physical_device(p.device);
    });
    if (it == demands.end()) {
      DeviceDemand fresh;
      fresh.device = p.device;
      demands.push_back(std::move(fresh));
      it = demands.end() - 1;
    } else if (!it->device.same_device(p.device)) {
      std::string other = p.device.device_label();
      if (other != it->device.device_label() &&
          std::find(it->also_as.begin(), it->also_as.end(), other) == it->also_as.end()) {
        it->also_as.push_back(std::move(other));
      }
    }
    // Saturating: a hostile plan's sizes must not wrap into "fits".
    it->bytes = p.buffer.nbytes > UINT64_MAX - it->bytes ? UINT64_MAX
                                                         : it->bytes + p.buffer.nbytes;
    ++it->buffers;
    it->planned.emplace_back(p.buffer.plan_index, p.buffer.memory_id);
  }
  for (DeviceDemand& d : demands) {
    auto info = d.device.plugin->memory_info(d.device.device);
    if (!info.ok()) {
      d.unknown_reason = "get_memory_info failed: " + info.status().message();
    } else if (!info->has_value()) {
      d.unknown_reason = "plugin " + d.device.plugin_name + " does not report free memory";
    } else {
      d.memory = **info;
    }
  }
  return demands;
}

Status check_fit(const std::vector<DeviceDemand>& demands) {
  std::string message;
  for (const DeviceDemand& d : demands) {
    if (d.fits()) continue;
    if (!message.empty()) message += "; ";
    message += d.label() + ": " + d.summary() + " (";
    constexpr size_t kShown = 8;  // a plan may have thousands of buffers
    for (size_t k = 0; k < d.planned.size() && k < kShown; ++k) {
      const auto [index, memory_id] = d.planned[k];
      message += (k == 0 ? "" : ", ") + std::string("/buffers/") +
                 (index == SIZE_MAX ? std::string("?") : std::to_string(index)) +
                 " (memory id " + std::to_string(memory_id) + ")";
    }
    if (d.planned.size() > kShown) {
      message += ", ... " + std::to_string(d.planned.size()) + " in all";
    }
    message += ")";
  }
  if (message.empty()) return Status();
  return Status(StatusCode::out_of_device_memory,
                "the load does not fit, nothing was allocated: " + message);
}

}  // namespace devalloc
