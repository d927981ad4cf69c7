// A plugin for a card with DMA constraints, as a vendor would write it on
// the kit: a card with two memories, "hbm" and "sram" (two devices sharing
// the card's uuid, PLUGIN-24), both host memory here, whose copy engine reads
// sources only on a 64-byte boundary and at most 256 KiB per transfer
// (ABI 1.2, PLUGIN-23).
// With strict = true (the default) a copy that breaks either constraint
// fails, naming it, where a real plugin would bounce it: a load through it
// succeeds only when the host cut and placed every copy as the capabilities
// asked. With strict = false it bounces such copies, as the ABI asks
// (PLUGIN-23: a constraint is a preference), and passes the conformance
// suite.
//
// Options (all optional):
//   strict = true|false    refuse copies that break a constraint
//   declare = true|false   state the constraints in get_capabilities
//                          (false: a plugin that keeps them to itself, for
//                          the test that shows a load then fails)
//   staging = true|false   offer allocate_host, whose buffers start 16 bytes
//                          past a 64-byte boundary (no alignment is promised
//                          for staging memory: the host aligns within it)
#include <devalloc/plugin_kit/allocation_table.hpp>
#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/plugin_entry.hpp>

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace {

using devalloc::plugin::Failure;

constexpr uint64_t kSourceAlignment = 64;
constexpr uint64_t kMaxTransfer = uint64_t{256} << 10;
constexpr uint64_t kStagingOffset = 16;

class DmaInstance final : public devalloc::plugin::Instance {
 public:
  DmaInstance(bool declare, bool staging, bool strict)
      : declare_(declare), staging_(staging), strict_(strict) {}
  ~DmaInstance() override {
    for (const auto& table : allocations_) {
      table.for_each([](const devalloc::plugin::AllocationTable::Allocation& a) {
        std::free(reinterpret_cast<void*>(static_cast<uintptr_t>(a.base)));
      });
    }
    staging_table_.for_each([](void* buffer, auto&&...) {
      std::free(static_cast<std::byte*>(buffer) - kStagingOffset);
    });
  }

  uint64_t capability_flags() const override {
    return staging_ ? DEVALLOC_CAPABILITY_HOST_STAGING : 0;
  }
  uint64_t max_alignment() const override { return 4096; }
  devalloc::plugin::CopyConstraints copy_constraints() const override {
    if (!declare_) return {};
    return {kSourceAlignment, 0, kMaxTransfer};
  }
  uint32_t device_count() const override { return 2; }
  devalloc::plugin::DeviceDescription describe(uint32_t device) override {
    devalloc::plugin::DeviceDescription d;
    d.name = "DMA-constrained card";
    d.total_memory_bytes = device == 0 ? uint64_t{1} << 30 : uint64_t{64} << 20;
    d.uuid = {0xd3, 0xa0, 0x00, 0x01, 0x00, 0x00, 0x40, 0x00,
              0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a};
    d.pci_bus_id = "0000:2a:00.0";
    d.dlpack_device_type = DEVALLOC_DLPACK_EXT_DEV;
    d.memory_kind = device == 0 ? "hbm" : "sram";
    return d;
  }

  uint64_t allocate(uint32_t device, uint64_t nbytes, uint64_t alignment) override {
    if (nbytes > describe(device).total_memory_bytes) {
      throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                    "more than the memory's " + std::to_string(describe(device).total_memory_bytes) +
                        " bytes"};
    }
    const uint64_t size = devalloc::plugin::over_allocation(nbytes, alignment, 16);
    void* base = std::malloc(size);
    if (base == nullptr) {
      throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "malloc failed"};
    }
    return allocations_[device].adopt(reinterpret_cast<uintptr_t>(base), nbytes, alignment,
                              [](uint64_t b) { std::free(reinterpret_cast<void*>(b)); });
  }
  void deallocate(uint32_t device, uint64_t address) override {
    allocations_[device].free(address, [](uint64_t b) { std::free(reinterpret_cast<void*>(b)); });
  }

  void copy_during_call(uint32_t device, uint64_t dst, const void* src,
                        uint64_t nbytes) override {
    transfer(device, dst, src, nbytes);
  }
  void copy_until_released(uint32_t device, uint64_t dst, const void* src, uint64_t nbytes,
                           devalloc::plugin::Release release) override {
    transfer(device, dst, src, nbytes);
    release.fire();
  }
  void copy_to_host(uint32_t device, void* dst, uint64_t src, uint64_t nbytes) override {
    allocations_[device].require_range(src, nbytes, "the source");
    std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), nbytes);
  }
  void synchronize(uint32_t) override {}

  void* allocate_host(uint64_t nbytes) override {
    if (!staging_) return devalloc::plugin::Instance::allocate_host(nbytes);
    auto* block = static_cast<std::byte*>(std::aligned_alloc(kSourceAlignment,
        devalloc::plugin::align_up(nbytes + kStagingOffset, kSourceAlignment)));
    if (block == nullptr) throw Failure{DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "out of memory"};
    void* buffer = block + kStagingOffset;
    staging_table_.adopt(buffer, nbytes, [&](auto&&...) { std::free(block); });
    return buffer;
  }
  void free_host(void* host) override {
    if (!staging_) return devalloc::plugin::Instance::free_host(host);
    staging_table_.free(host, [](void* buffer, auto&&...) {
      std::free(static_cast<std::byte*>(buffer) - kStagingOffset);
    });
  }

 private:
  // The engine: one transfer, from an aligned source, of at most
  // kMaxTransfer bytes.
  void transfer(uint32_t device, uint64_t dst, const void* src, uint64_t nbytes) {
    allocations_[device].require_range(dst, nbytes, "the destination");
    if (!strict_) {
      // The bounce a real plugin does: aligned chunks of at most one
      // transfer, each copied into memory of its own first.
      alignas(kSourceAlignment) static thread_local std::byte bounce[kMaxTransfer];
      for (uint64_t done = 0; done < nbytes; done += kMaxTransfer) {
        const uint64_t n = std::min(kMaxTransfer, nbytes - done);
        std::memcpy(bounce, static_cast<const std::byte*>(src) + done, n);
        std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst + done)), bounce, n);
      }
      return;
    }
    if (reinterpret_cast<uintptr_t>(src) % kSourceAlignment != 0) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                    "src " + std::to_string(reinterpret_cast<uintptr_t>(src)) +
                        " is not on the engine's 64-byte boundary (unaligned source)"};
    }
    if (nbytes > kMaxTransfer) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                    std::to_string(nbytes) + " bytes exceed the engine's 262144-byte transfer"};
    }
    std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), src, nbytes);
  }

  const bool declare_;
  const bool staging_;
  const bool strict_;
  std::array<devalloc::plugin::AllocationTable, 2> allocations_;  // per memory
  devalloc::plugin::StagingTable staging_table_;
};

struct DmaPlugin {
  static constexpr const char* name = "dma";
  static constexpr const char* version = "1.0.0";
  static std::unique_ptr<devalloc_instance> create(devalloc::plugin::Options& options) {
    const bool declare = options.take_bool("declare", true);
    const bool staging = options.take_bool("staging", true);
    const bool strict = options.take_bool("strict", true);
    options.reject_unknown(name, "declare, staging, strict");
    return std::make_unique<DmaInstance>(declare, staging, strict);
  }
};

}  // namespace

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(DmaPlugin)
