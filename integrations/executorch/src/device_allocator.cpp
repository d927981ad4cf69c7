#include <devalloc/executorch/device_allocator.hpp>

#include <devalloc/core/config.hpp>
#include <devalloc/core/device_registry.hpp>
#include <devalloc/input_text.hpp>

#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <string_view>
#include <vector>
#include <utility>

namespace devalloc::executorch {

namespace {

const char* type_name(DeviceType type) {
  switch (type) {
    case DeviceType::CPU: return "CPU";
    case DeviceType::CUDA: return "CUDA";
  }
  return "unknown";
}

uint64_t address_of(const void* ptr) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr));
}

std::string hex(uint64_t address) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

}  // namespace

std::vector<std::string_view> log_parts(std::string_view message) {
  std::vector<std::string_view> parts;
  while (message.size() > kLogPartBytes) {
    // After a space in the part's second half, so that words stay whole;
    // else before the first byte of a UTF-8 sequence (continuation bytes
    // are 10xxxxxx); else anywhere (not UTF-8).
    size_t cut = message.rfind(' ', kLogPartBytes - 1) + 1;  // 0 when none
    if (cut <= kLogPartBytes / 2) {
      cut = kLogPartBytes;
      while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
      if (cut == 0) cut = kLogPartBytes;
    }
    parts.push_back(message.substr(0, cut));
    message.remove_prefix(cut);
  }
  parts.push_back(message);
  return parts;
}

et::Error to_executorch_error(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return et::Error::Ok;
    case StatusCode::invalid_argument: return et::Error::InvalidArgument;
    case StatusCode::out_of_device_memory:
    case StatusCode::out_of_host_memory: return et::Error::MemoryAllocationFailed;
    case StatusCode::no_such_device: return et::Error::NotFound;
    case StatusCode::runtime_unavailable:
    case StatusCode::unsupported: return et::Error::NotSupported;
    case StatusCode::device_error: return et::Error::AccessFailed;
    case StatusCode::internal: return et::Error::Internal;
    case StatusCode::not_found: return et::Error::NotFound;
    case StatusCode::permission_denied:
    case StatusCode::io_error:
    case StatusCode::data_loss: return et::Error::AccessFailed;
  }
  return et::Error::Internal;
}

DevallocDeviceAllocator::DevallocDeviceAllocator(std::shared_ptr<Runtime> runtime,
                                                 DeviceType type,
                                                 std::string tag_name)
    : runtime_(std::move(runtime)), type_(type), tag_name_(std::move(tag_name)) {}

DevallocDeviceAllocator::~DevallocDeviceAllocator() {
  for (const auto& [address, allocation] : allocations_) {
    Status s = allocation.device.plugin->deallocate(allocation.device.device, address);
    if (!s.ok()) fail("deallocate", s);
  }
}

std::string DevallocDeviceAllocator::tag(DeviceIndex index) const {
  return tag_name_ + ":" + std::to_string(index);
}

et::Error DevallocDeviceAllocator::fail(const char* call, const Status& status) const {
  // ExecuTorch's log keeps 255 bytes of a message and drops the rest, and
  // the reason is at the end of devalloc's messages: a long one is logged in
  // parts, each cut before a UTF-8 sequence starts.
  const std::vector<std::string_view> parts = log_parts(status.message());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts.size() == 1) {
      ET_LOG(Error, "devalloc %s allocator: %s: %.*s", type_name(type_), call,
             static_cast<int>(parts[i].size()), parts[i].data());
    } else {
      ET_LOG(Error, "devalloc %s allocator: %s (%zu/%zu): %.*s", type_name(type_), call,
             i + 1, parts.size(), static_cast<int>(parts[i].size()), parts[i].data());
    }
  }
  return to_executorch_error(status.code());
}

devalloc::Result<ResolvedDevice> DevallocDeviceAllocator::device(DeviceIndex index) {
  if (index < 0) {
    return Status(StatusCode::invalid_argument,
                  "device index " + std::to_string(index) + " of " +
                      type_name(type_) + " is negative");
  }
  // Read before resolving: a drop_plugin while this resolves makes the
  // next call resolve again.
  const uint64_t generation = runtime_->registry().generation();
  {
    std::lock_guard lock(mutex_);
    if (auto found = devices_.find(index);
        found != devices_.end() && found->second.generation == generation) {
      return found->second.device;
    }
  }
  // Outside the lock: resolving may load a plugin.
  auto resolved = runtime_->registry().resolve(tag(index), std::nullopt);
  if (!resolved.ok()) return resolved.status();
  std::lock_guard lock(mutex_);
  devices_.insert_or_assign(index, Resolved{generation, *resolved});
  return *resolved;
}

devalloc::Result<ResolvedDevice> DevallocDeviceAllocator::check_range(
    DeviceIndex index, uint64_t address, uint64_t nbytes, const char* what) const {
  std::lock_guard lock(mutex_);
  auto it = allocations_.upper_bound(address);
  if (it != allocations_.begin()) {
    --it;
    // address >= it->first here; past the end of the allocation the offset
    // is above nbytes (nbytes - offset would wrap and let anything through).
    const uint64_t offset = address - it->first;
    if (it->second.index == index && offset <= it->second.nbytes &&
        nbytes <= it->second.nbytes - offset) {
      return it->second.device;
    }
  }
  return Status(StatusCode::invalid_argument,
                std::string(what) + " [" + hex(address) + ", +" +
                    std::to_string(nbytes) + ") is not inside a live allocation of " +
                    tag(index) + " made by this allocator");
}

et::Result<void*> DevallocDeviceAllocator::allocate(size_t nbytes, DeviceIndex index,
                                                     size_t alignment) {
  auto dev = device(index);
  if (!dev.ok()) return fail("allocate", dev.status());
  // 0 bytes are address 0 (PLUGIN-11): nothing to track or free.
  if (nbytes == 0) return nullptr;
  auto address = dev->plugin->allocate(dev->device, nbytes, alignment);
  if (!address.ok()) {
    return fail("allocate",
                address.status().with_context(
                    "allocating " + std::to_string(nbytes) + " bytes (alignment " +
                    std::to_string(alignment) + ") on " + dev->describe()));
  }
  std::lock_guard lock(mutex_);
  allocations_[*address] = {index, nbytes, *dev};
  return reinterpret_cast<void*>(static_cast<uintptr_t>(*address));
}

void DevallocDeviceAllocator::deallocate(void* ptr, DeviceIndex index) {
  if (ptr == nullptr) return;  // what a 0-byte allocate gave
  const uint64_t address = address_of(ptr);
  std::optional<ResolvedDevice> dev;
  {
    std::lock_guard lock(mutex_);
    auto it = allocations_.find(address);
    if (it == allocations_.end() || it->second.index != index) {
      fail("deallocate",
           Status(StatusCode::invalid_argument,
                  hex(address) + " on " + tag(index) +
                      " was not allocated by this allocator"));
      return;
    }
    dev = std::move(it->second.device);
    allocations_.erase(it);
  }
  Status s = dev->plugin->deallocate(dev->device, address);
  if (!s.ok()) fail("deallocate", s);
}

et::Error DevallocDeviceAllocator::copy_host_to_device(void* dst, const void* src,
                                                       size_t nbytes,
                                                       DeviceIndex index) {
  // 0 bytes copy nothing (PLUGIN-15): the buffer of a tensor with no
  // elements is the nullptr a 0-byte allocate gave, in no allocation.
  if (nbytes == 0) return et::Error::Ok;
  // The range first: an index this allocator never allocated on has no
  // range, whether or not it has a device.
  auto dev = check_range(index, address_of(dst), nbytes, "destination");
  if (!dev.ok()) return fail("copy_host_to_device", dev.status());
  Status s = dev->plugin->copy_to_device(dev->device, address_of(dst), src, nbytes);
  return s.ok() ? et::Error::Ok : fail("copy_host_to_device", s);
}

et::Error DevallocDeviceAllocator::copy_device_to_host(void* dst, const void* src,
                                                       size_t nbytes,
                                                       DeviceIndex index) {
  if (nbytes == 0) return et::Error::Ok;  // as copy_host_to_device
  // The range first: an index this allocator never allocated on has no
  // range, whether or not it has a device.
  auto dev = check_range(index, address_of(src), nbytes, "source");
  if (!dev.ok()) return fail("copy_device_to_host", dev.status());
  Status s = dev->plugin->copy_to_host(dev->device, dst, address_of(src), nbytes);
  return s.ok() ? et::Error::Ok : fail("copy_device_to_host", s);
}

et::Error DevallocDeviceAllocator::synchronize(DeviceIndex index) {
  auto dev = device(index);
  if (!dev.ok()) return fail("synchronize", dev.status());
  // The current instance, then each dropped one that still holds memory of
  // this index (copies to that memory went there).
  std::vector<ResolvedDevice> devices = {*dev};
  {
    std::lock_guard lock(mutex_);
    for (const auto& [address, allocation] : allocations_) {
      if (allocation.index != index) continue;
      const auto same = [&](const ResolvedDevice& d) { return d.same_device(allocation.device); };
      if (std::none_of(devices.begin(), devices.end(), same)) devices.push_back(allocation.device);
    }
  }
  et::Error result = et::Error::Ok;
  for (const ResolvedDevice& d : devices) {
    Status s = d.plugin->synchronize(d.device);
    if (!s.ok() && result == et::Error::Ok) result = fail("synchronize", s);
  }
  return result;
}

uint64_t DevallocDeviceAllocator::live_allocations() const {
  std::lock_guard lock(mutex_);
  return allocations_.size();
}

devalloc::Result<DevallocDeviceAllocator*> register_allocator(
    std::shared_ptr<Runtime> runtime, DeviceType type, std::string tag_name) {
  // The registry keeps a raw pointer for the rest of the process, and a
  // DeviceMemoryBuffer may be destroyed during exit: the allocators are
  // never destroyed (they stay reachable from here).
  static std::mutex mutex;
  static std::array<DevallocDeviceAllocator*, et::etensor::kNumDeviceTypes> registered{};
  // Checked now: a registration cannot be taken back, so a runtime or a
  // tag name that could never serve would hold the type for good.
  if (runtime == nullptr) {
    return Status(StatusCode::invalid_argument, "register_allocator: no runtime (a null pointer)");
  }
  const std::optional<DeviceTag> parsed = parse_device_tag(tag_name);
  if (!parsed || parsed->index || parsed->name != tag_name) {
    return Status(StatusCode::invalid_argument,
                  "register_allocator: " + quote(tag_name) +
                      " is not a device tag name (letters, digits, _ and -, no index): "
                      "device index i of the type is the tag \"NAME:i\"");
  }
  const auto slot = static_cast<size_t>(type);
  if (slot >= registered.size()) {
    return Status(StatusCode::invalid_argument, "unknown ExecuTorch device type " +
                                                    std::to_string(slot));
  }
  std::lock_guard lock(mutex);
  auto& registry = et::DeviceAllocatorRegistry::instance();
  if (registry.get_allocator(type) != nullptr) {
    return Status(StatusCode::invalid_argument,
                  std::string("ExecuTorch already has a device allocator for ") +
                      type_name(type) + " (a type can be registered only once)");
  }
  registered[slot] = new DevallocDeviceAllocator(std::move(runtime), type, std::move(tag_name));
  registry.register_allocator(registered[slot]);
  return registered[slot];
}

}  // namespace devalloc::executorch
