// What a vendor plugin implements: the plugin instance, as an abstract C++
// class. The kit's ABI glue (plugin_entry.hpp) checks every argument, turns
// failures into statuses and messages, and then calls these with arguments
// already validated; each throws Failure (or bad_alloc) on failure, with the
// reason alone: the glue puts the call and its arguments in front.
#pragma once

#include <devalloc/plugin_abi.h>
#include <devalloc/plugin_kit/release.hpp>

#include <array>
#include <cstdint>
#include <string>

namespace devalloc::plugin {

struct DeviceDescription {
  std::string name;
  uint64_t total_memory_bytes = 0;
  std::array<uint8_t, 16> uuid{};  // all zero if unknown
  std::string pci_bus_id;          // "dddd:bb:dd.f", lower-case, or ""
  int32_t dlpack_device_type = 0;
  int32_t dlpack_device_id = 0;
  std::string memory_kind;         // ABI 1.2: "" for a card with one memory
};

// ABI 1.2 DMA constraints of copy_host_to_device (PLUGIN-23); 0: none.
struct CopyConstraints {
  uint64_t src_alignment = 0;
  uint64_t preferred_bytes = 0;
  uint64_t max_bytes = 0;
};

struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

}  // namespace devalloc::plugin

// The ABI's opaque instance type, defined here as the base class of every
// kit plugin's instance.
struct devalloc_instance {
  // destroy(): waits for all work, fires every pending release, frees every
  // allocation and staging buffer (PLUGIN-9). Must not throw.
  virtual ~devalloc_instance() = default;

  // DEVALLOC_CAPABILITY_* and the largest alignment allocate() honours.
  virtual uint64_t capability_flags() const = 0;
  virtual uint64_t max_alignment() const = 0;
  // What alignment 0 means; at least 256 (PLUGIN-11).
  virtual uint64_t natural_alignment() const { return 256; }
  // ABI 1.2: what copy sources and sizes the device reads best.
  virtual devalloc::plugin::CopyConstraints copy_constraints() const { return {}; }

  virtual uint32_t device_count() const = 0;
  // device < device_count() in all that take one.
  virtual devalloc::plugin::DeviceDescription describe(uint32_t device) = 0;
  // Free and total device memory (ABI 1.1); called only for a plugin that
  // declares offers_memory_info (plugin_entry.hpp).
  virtual devalloc::plugin::MemoryInfo memory_info(uint32_t device);

  // nbytes > 0; alignment a power of two, at most max_alignment().
  virtual uint64_t allocate(uint32_t device, uint64_t nbytes, uint64_t alignment) = 0;
  // address != 0.
  virtual void deallocate(uint32_t device, uint64_t address) = 0;

  // nbytes > 0 and src non-NULL in the three copies. src has been read
  // when this returns (PLUGIN-13).
  virtual void copy_during_call(uint32_t device, uint64_t dst, const void* src,
                                uint64_t nbytes) = 0;
  // The release fires once src has been read, or once the copy failed: it
  // may fire before this returns; if this throws, it has fired or been
  // handed on (PLUGIN-14). It is empty when the caller passed no
  // on_release; src must still stay unread after the copy is over.
  virtual void copy_until_released(uint32_t device, uint64_t dst, const void* src,
                                   uint64_t nbytes, devalloc::plugin::Release release) = 0;
  // dst has been written when this returns (PLUGIN-16).
  virtual void copy_to_host(uint32_t device, void* dst, uint64_t src, uint64_t nbytes) = 0;
  // PLUGIN-17: every copy issued before has landed and been released.
  virtual void synchronize(uint32_t device) = 0;

  // Only with DEVALLOC_CAPABILITY_HOST_STAGING; nbytes > 0, host non-NULL.
  // The defaults throw UNSUPPORTED: the table still has allocate_host and
  // free_host, and a host that calls them without the flag gets that.
  virtual void* allocate_host(uint64_t nbytes);
  virtual void free_host(void* host);

  // ABI 1.2, only for a plugin that declares offers_host_mapping
  // (plugin_entry.hpp) and sets DEVALLOC_CAPABILITY_HOST_MAPPABLE
  // (PLUGIN-22). nbytes > 0. The range is not yet checked to lie in one live
  // allocation: the plugin checks it. The host's writes through the pointer
  // are on the device once unmap_from_host returns.
  virtual void* map_to_host(uint32_t device, uint64_t address, uint64_t nbytes);
  // host non-NULL; the plugin checks that it is a live mapping of device.
  virtual void unmap_from_host(uint32_t device, void* host);
};

namespace devalloc::plugin {
using Instance = ::devalloc_instance;
}
