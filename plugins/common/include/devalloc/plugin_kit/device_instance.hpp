// An instance whose devices are objects of one vendor class, each doing its
// own work: every per-device call of the ABI goes to devices_[device]
// (already checked to exist). Device must provide description(),
// memory_info(), allocate, deallocate, copy_during_call,
// copy_until_released, copy_to_host, synchronize, quiesce() noexcept, and
// the constants kNaturalAlignment and kMaxAlignment.
#pragma once

#include <devalloc/plugin_kit/instance.hpp>

#include <memory>
#include <utility>
#include <vector>

namespace devalloc::plugin {

template <class Device>
class DeviceInstance : public Instance {
 public:
  uint64_t max_alignment() const override { return Device::kMaxAlignment; }
  uint64_t natural_alignment() const override { return Device::kNaturalAlignment; }
  uint32_t device_count() const override { return static_cast<uint32_t>(devices_.size()); }

  DeviceDescription describe(uint32_t device) override { return devices_[device]->description(); }
  MemoryInfo memory_info(uint32_t device) override { return devices_[device]->memory_info(); }
  uint64_t allocate(uint32_t device, uint64_t nbytes, uint64_t alignment) override {
    return devices_[device]->allocate(nbytes, alignment);
  }
  void deallocate(uint32_t device, uint64_t address) override {
    devices_[device]->deallocate(address);
  }
  void copy_during_call(uint32_t device, uint64_t dst, const void* src,
                        uint64_t nbytes) override {
    devices_[device]->copy_during_call(dst, src, nbytes);
  }
  void copy_until_released(uint32_t device, uint64_t dst, const void* src, uint64_t nbytes,
                           Release release) override {
    devices_[device]->copy_until_released(dst, src, nbytes, std::move(release));
  }
  void copy_to_host(uint32_t device, void* dst, uint64_t src, uint64_t nbytes) override {
    devices_[device]->copy_to_host(dst, src, nbytes);
  }
  void synchronize(uint32_t device) override { devices_[device]->synchronize(); }

 protected:
  explicit DeviceInstance(std::vector<std::unique_ptr<Device>> devices)
      : devices_(std::move(devices)) {}
  // For the derived destructor: every device's work is over and released
  // before staging memory (a possible source of that work) is freed.
  void quiesce_devices() noexcept {
    for (auto& device : devices_) device->quiesce();
  }

  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace devalloc::plugin
