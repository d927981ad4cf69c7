#include "device_heap.hpp"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>

namespace devalloc::fake {
namespace {

using ull = unsigned long long;

constexpr uint64_t kAddressBase = uint64_t{1} << 47;
constexpr uint64_t kDeviceSpan = uint64_t{1} << 40;

// What the heap's live objects are called in FakeRecord::live_objects.
constexpr const char* kDeviceAllocation = "device allocation";
constexpr const char* kPinnedBlock = "pinned host block";

}  // namespace

void DeviceHeap::reset_devices(size_t count, uint64_t bytes_each) {
  std::lock_guard lock(mutex_);
  devices_.assign(count, Device{});
  for (size_t d = 0; d < count; ++d) {
    devices_[d].total = bytes_each;
    devices_[d].next_address = kAddressBase + d * kDeviceSpan;
  }
}

size_t DeviceHeap::device_count() const {
  std::lock_guard lock(mutex_);
  return devices_.size();
}

uint64_t DeviceHeap::total(int device) const {
  std::lock_guard lock(mutex_);
  return devices_.at(static_cast<size_t>(device)).total;
}

uint64_t DeviceHeap::used(int device) const {
  std::lock_guard lock(mutex_);
  return devices_.at(static_cast<size_t>(device)).used;
}

uint64_t DeviceHeap::allocate(int device, uint64_t nbytes) {
  std::lock_guard lock(mutex_);
  Device& d = devices_.at(static_cast<size_t>(device));
  if (nbytes > d.total - d.used) return 0;
  auto allocation = std::make_shared<Allocation>();
  allocation->bytes.reset(new (std::nothrow) std::byte[nbytes]);
  if (!allocation->bytes) return 0;
  // Exactly 256-aligned, never 512: a user that needs more must round up.
  // A gap of a page after each allocation keeps overruns out of the next.
  const uint64_t base = ((d.next_address + 511) & ~uint64_t{511}) + 256;
  d.next_address = base + ((nbytes + 255) & ~uint64_t{255}) + 4096;
  d.used += nbytes;
  allocation->device = device;
  allocation->base = base;
  allocation->size = nbytes;
  allocations_.emplace(base, std::move(allocation));
  record_.created(kDeviceAllocation);
  return base;
}

DeviceHeap::FreeResult DeviceHeap::free(int device, uint64_t address) {
  std::lock_guard lock(mutex_);
  auto it = allocations_.find(address);
  if (it == allocations_.end()) {
    record_.violation("%s(0x%llx): not an address the allocator returned", free_name_,
                      static_cast<ull>(address));
    return FreeResult::unknown;
  }
  Allocation& a = *it->second;
  if (a.freed) {
    record_.violation("%s(0x%llx): double free", free_name_, static_cast<ull>(address));
    return FreeResult::double_free;
  }
  if (a.device != device) {
    record_.violation("%s(0x%llx): memory of device %d freed with device %d current", free_name_,
                      static_cast<ull>(address), a.device, device);
  }
  a.freed = true;
  a.bytes.reset();
  devices_[static_cast<size_t>(a.device)].used -= a.size;
  record_.gone(kDeviceAllocation);
  return FreeResult::ok;
}

std::shared_ptr<Allocation> DeviceHeap::range(const char* call, int device, uint64_t address,
                                              uint64_t n) const {
  std::lock_guard lock(mutex_);
  auto it = allocations_.upper_bound(address);
  if (it != allocations_.begin()) {
    const auto& a = std::prev(it)->second;
    const bool inside = address - a->base < a->size && n <= a->size - (address - a->base);
    if (inside && a->freed) {
      record_.violation(
          "%s: [0x%llx, +%llu) lies in freed device memory (allocation 0x%llx of %llu bytes)",
          call, static_cast<ull>(address), static_cast<ull>(n), static_cast<ull>(a->base),
          static_cast<ull>(a->size));
      return nullptr;
    }
    if (inside && a->device != device) {
      record_.violation("%s: [0x%llx, +%llu) is memory of device %d, the stream's is device %d",
                        call, static_cast<ull>(address), static_cast<ull>(n), a->device, device);
      return nullptr;
    }
    if (inside) return a;
  }
  record_.violation("%s: [0x%llx, +%llu) is outside every live allocation", call,
                    static_cast<ull>(address), static_cast<ull>(n));
  return nullptr;
}

bool DeviceHeap::still_live(const Allocation& allocation) const {
  std::lock_guard lock(mutex_);
  return !allocation.freed;
}

uint64_t DeviceHeap::drop_device(int device) {
  std::lock_guard lock(mutex_);
  uint64_t live = 0;
  for (auto& [base, a] : allocations_) {
    if (a->device == device && !a->freed) {
      ++live;
      a->freed = true;
      a->bytes.reset();
    }
  }
  devices_.at(static_cast<size_t>(device)).used = 0;
  record_.gone(kDeviceAllocation, live);
  return live;
}

uint64_t DeviceHeap::live(int device) const {
  std::lock_guard lock(mutex_);
  uint64_t live = 0;
  for (const auto& [base, a] : allocations_) {
    if (!a->freed && (device < 0 || a->device == device)) ++live;
  }
  return live;
}

int DeviceHeap::read(uint64_t address, void* dst, size_t nbytes) const {
  std::lock_guard lock(mutex_);
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return -1;
  const Allocation& a = *std::prev(it)->second;
  if (a.freed || address - a.base >= a.size || nbytes > a.size - (address - a.base)) return -1;
  std::memcpy(dst, a.bytes.get() + (address - a.base), nbytes);
  return 0;
}

void* DeviceHeap::pin_allocate(size_t nbytes) {
  const size_t rounded = (nbytes + 4095) & ~size_t{4095};
  void* memory = std::aligned_alloc(4096, rounded);
  if (memory == nullptr) return nullptr;
  std::lock_guard lock(mutex_);
  PinnedBlock block;
  block.memory = memory;
  block.size = nbytes;
  pinned_.emplace(reinterpret_cast<uintptr_t>(memory), block);
  record_.created(kPinnedBlock);
  return memory;
}

bool DeviceHeap::pin_free(const char* call, void* p) {
  std::lock_guard lock(mutex_);
  auto it = pinned_.find(reinterpret_cast<uintptr_t>(p));
  if (it == pinned_.end() || it->second.freed) {
    record_.violation("%s(%p): not pinned memory from this runtime, or already freed", call, p);
    return false;
  }
  record_.gone(kPinnedBlock);
  if (it->second.copies_in_flight > 0) {
    record_.violation("%s(%p): freed while %d async copy(ies) still use it", call, p,
                      it->second.copies_in_flight);
    it->second.freed = true;
    return true;
  }
  std::free(it->second.memory);
  pinned_.erase(it);
  return true;
}

uintptr_t DeviceHeap::pin_for_copy(const void* p, size_t n) {
  std::lock_guard lock(mutex_);
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = pinned_.upper_bound(address);
  if (it == pinned_.begin()) return 0;
  --it;
  PinnedBlock& block = it->second;
  if (block.freed || address - it->first >= block.size || n > block.size - (address - it->first)) {
    return 0;
  }
  ++block.copies_in_flight;
  return it->first;
}

void DeviceHeap::unpin(uintptr_t key) {
  if (key == 0) return;
  std::lock_guard lock(mutex_);
  auto it = pinned_.find(key);
  PinnedBlock& block = it->second;
  if (--block.copies_in_flight == 0 && block.freed) {
    std::free(block.memory);
    pinned_.erase(it);
  }
}

void DeviceHeap::report_unfreed_pins() {
  std::lock_guard lock(mutex_);
  for (const auto& [address, block] : pinned_) {
    if (!block.freed) {
      record_.violation("pinned host memory %p (%zu bytes) never freed", block.memory, block.size);
    }
  }
}

}  // namespace devalloc::fake
