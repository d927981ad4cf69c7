// Placement: which device each planned buffer goes to, and which constants
// fill it. The first stage after the plan: it reads the plan and the runtime
// config, allocates nothing and copies nothing.
#pragma once

#include <devalloc/core/device_registry.hpp>
#include <devalloc/core/dtype.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/status.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace devalloc {

struct Plan;

struct PlannedBuffer {
  uint32_t memory_id = 0;
  uint64_t nbytes = 0;
  uint64_t alignment = 0;
  std::string planned_tag;
  size_t plan_index = SIZE_MAX;  // into Plan::buffers, for messages ("/buffers/N")
};


// What a set of methods needs: each buffer and each tensor once, however
// many of the methods use it, with each tensor's size computed and each
// source file resolved. Tensors are indices into the plan, not copies: a
// plan of 100 000 tensors is not copied to load it. Fails for an unknown
// method name, a size that overflows, or a source file that cannot be
// resolved.
struct NeededTensor {
  static constexpr size_t kNoFile = SIZE_MAX;
  size_t index = 0;  // into Plan::tensors
  uint64_t nbytes = 0;
  size_t file = kNoFile;  // into MethodNeeds::files; kNoFile for scratch memory
};
struct MethodNeeds {
  std::vector<PlannedBuffer> buffers;        // by memory id
  std::vector<NeededTensor> tensors;         // in plan order
  std::vector<std::filesystem::path> files;  // absolute, each once
  // The plan's folder when its files must lie in it: open them beneath it
  // (SafetensorsCache::open), never by path alone. Empty otherwise.
  std::filesystem::path files_beneath;
};
// external_files false: the plan's "allow_external_files" is not honoured
// ([load] external_files).
Result<MethodNeeds> needs_of(const Plan& plan,
                             const std::vector<std::string>& methods,
                             bool external_files = true);

// Plan tensor `index` with its size and resolved source file (nullptr for
// scratch memory), as a PlannedTensor.
PlannedTensor planned_tensor(const Plan& plan, size_t index, uint64_t nbytes,
                             const std::filesystem::path* file);

// A buffer and the device that backs it: the [memory] override, else the
// plan's tag, resolved through the config (with fallbacks).
struct BufferPlacement {
  PlannedBuffer buffer;
  std::string tag;  // after the [memory] override
  ResolvedDevice device;
};
// Fails (no_such_device) when no candidate yields a device, and when only a
// fallback does and the config's [load] fallback is "error": the message
// names the memory id, the tag, the fallback refused and why each earlier
// candidate failed.
Result<BufferPlacement> place_buffer(const PlannedBuffer& buffer,
                                     DeviceRegistry& registry);

// One line on why a buffer's device is a fallback, for `devalloc load` and
// `inspect`: 'memory id 0: device "cuda:0" falls back to host device 0
// "host memory" (via "host"): cdua index 0: plugin cdua is unavailable: ...'.
std::string fallback_line(uint32_t memory_id, const ResolvedDevice& device);

// One line per [devices] entry of the config that no buffer of the plan
// reaches (as its tag after [memory], or through that tag's fallbacks),
// in the config's order: 'devalloc.toml:3:1: [devices."cuda0"] is used by
// no buffer of plan.json (its device tags: "cuda:0", "host")'. Such an
// entry is mostly a typo of a tag the plan uses.
std::vector<std::string> unused_device_entries(const RuntimeConfig& config, const Plan& plan);

// What a set of placed buffers asks of one physical device, and what its
// plugin says is free there (get_memory_info, ABI 1.1).
struct DeviceDemand {
  ResolvedDevice device;  // as the first of its buffers resolved it
  // The same physical device as other buffers reached it (another plugin
  // entry, same UUID): "cuda12 device 0 \"...\"", once each.
  std::vector<std::string> also_as;
  uint64_t bytes = 0;     // the buffers' sizes, summed
  size_t buffers = 0;
  // The buffers, each as (PlannedBuffer::plan_index, memory id).
  std::vector<std::pair<size_t, uint32_t>> planned;
  // nullopt when the plugin does not offer the query or the query failed
  // (unknown_reason says which); the load then goes ahead and the plugin's
  // allocate has the last word.
  std::optional<MemoryInfo> memory;
  std::string unknown_reason;

  bool fits() const { return !memory || bytes <= memory->free_bytes; }
  // "plan needs 96.0 MiB, 64.0 MiB free of 64.0 MiB" (or "free memory
  // unknown: ...").
  std::string summary() const;
  // The device's label, with the other ways the buffers reached it:
  // "cuda device 0 \"X\" (also as cuda12 device 0 \"X\")".
  std::string label() const;
};

// One entry per physical device the placements use (in order of first
// use), each with the device's free memory asked for once. Devices that
// report one non-zero UUID are one physical device, whichever plugin entry
// reached them: their buffers share its free memory.
std::vector<DeviceDemand> device_demands(const std::vector<BufferPlacement>& placements);

// out_of_device_memory naming every device whose share does not fit in
// what its plugin reports free, and its buffers ("/buffers/N (memory id
// M)", the first few); ok when each fits or cannot tell.
Status check_fit(const std::vector<DeviceDemand>& demands);

// "plan.json: /buffers/3", the buffer's place in its plan for messages.
std::string buffer_place(const Plan& plan, const PlannedBuffer& buffer);

}  // namespace devalloc
