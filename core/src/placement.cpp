#include <devalloc/core/placement.hpp>
#include <devalloc/input_text.hpp>

#include <devalloc/core/device_selection.hpp>
#include <devalloc/core/plan.hpp>

#include <map>

namespace devalloc {

Result<MethodNeeds> needs_of(const Plan& plan,
                             const std::vector<std::string>& methods) {
  auto selection = plan.tensors_for_methods(methods);
  if (!selection.ok()) return selection.status();

  MethodNeeds needs;
  std::map<uint32_t, const PlanBuffer*> by_id;  // linear in buffers, not squared
  for (const PlanBuffer& b : plan.buffers) by_id.emplace(b.memory_id, &b);
  for (uint32_t id : selection->memory_ids) {
    const auto it = by_id.find(id);
    if (it == by_id.end()) continue;
    const PlanBuffer& b = *it->second;
    needs.buffers.push_back(PlannedBuffer{b.memory_id, b.size, b.alignment, b.device});
  }
  std::map<std::string, std::filesystem::path, std::less<>> resolved;
  for (size_t index : selection->tensors) {
    const PlanTensor& t = plan.tensors[index];
    PlannedTensor p;
    p.name = t.name;
    p.dtype = t.dtype;
    p.shape = t.shape;
    p.memory_id = t.memory_id;
    p.offset = t.offset;
    auto nbytes = byte_size(t.dtype, t.shape);
    if (!nbytes.ok()) {
      return nbytes.status().with_context(path_for_message(plan.path.string()) + ": tensor " +
                                          quote(t.name));
    }
    p.nbytes = *nbytes;
    if (t.source) {
      // Resolving walks the file system; a plan of 100 000 tensors names a
      // handful of files.
      auto known = resolved.find(t.source->file);
      if (known == resolved.end()) {
        auto file = plan.source_path(*t.source);
        if (!file.ok()) return file.status();
        known = resolved.emplace(t.source->file, *file).first;
      }
      p.file = known->second;
      p.key = t.source->key;
    }
    needs.tensors.push_back(std::move(p));
  }
  return needs;
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
  return placement;
}

}  // namespace devalloc
