// A complete devalloc plugin on the plugin kit: one "device" whose memory is
// ordinary host memory and whose until-released copies run later on the
// kit's completion thread. A vendor replaces malloc and memcpy with its
// runtime's calls; the argument checks, messages, allocation tracking and
// releases are the kit's.
#include <devalloc/plugin_kit.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <shared_mutex>

namespace {

using devalloc::plugin::AllocationTable;
using devalloc::plugin::Failure;

void* pointer(uint64_t address) { return reinterpret_cast<void*>(address); }

class ExampleInstance final : public devalloc::plugin::Instance {
 public:
  ~ExampleInstance() override {
    worker_.reset();  // completes and releases every queued copy
    memory_.for_each([](const AllocationTable::Allocation& a) { std::free(pointer(a.base)); });
  }

  uint64_t capability_flags() const override { return DEVALLOC_CAPABILITY_ASYNC_COPY; }
  uint64_t max_alignment() const override { return 4096; }
  uint32_t device_count() const override { return 1; }

  devalloc::plugin::DeviceDescription describe(uint32_t) override {
    devalloc::plugin::DeviceDescription d;
    d.name = "example kit device";
    d.total_memory_bytes = uint64_t{1} << 30;
    d.dlpack_device_type = DEVALLOC_DLPACK_CPU;
    return d;
  }

  uint64_t allocate(uint32_t, uint64_t nbytes, uint64_t alignment) override {
    if (nbytes > (uint64_t{1} << 30)) {
      throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "malloc: more than the device's 1 GiB"};
    }
    const uint64_t request = devalloc::plugin::over_allocation(nbytes, alignment, 16);
    void* base = std::malloc(request);
    if (base == nullptr) throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "malloc failed"};
    return memory_.adopt(reinterpret_cast<uint64_t>(base), nbytes, alignment,
                         [](uint64_t b) { std::free(pointer(b)); });
  }

  void deallocate(uint32_t, uint64_t address) override {
    std::unique_lock lock(lifetime_);
    memory_.free(address, [](uint64_t base) { std::free(pointer(base)); });
  }

  void copy_during_call(uint32_t, uint64_t dst, const void* src, uint64_t nbytes) override {
    worker_->wait_for_earlier();
    std::shared_lock lock(lifetime_);
    memory_.require_range(dst, nbytes, "destination");
    std::memcpy(pointer(dst), src, nbytes);
  }

  void copy_until_released(uint32_t, uint64_t dst, const void* src, uint64_t nbytes,
                           devalloc::plugin::Release release) override {
    memory_.require_range(dst, nbytes, "destination");
    worker_->push(
        [this, dst, src, nbytes] {
          std::shared_lock lock(lifetime_);
          memory_.require_range(dst, nbytes, "destination of a queued copy");
          std::memcpy(pointer(dst), src, nbytes);
        },
        std::move(release));
  }

  void copy_to_host(uint32_t, void* dst, uint64_t src, uint64_t nbytes) override {
    worker_->wait_for_earlier();
    std::shared_lock lock(lifetime_);
    memory_.require_range(src, nbytes, "source");
    std::memcpy(dst, pointer(src), nbytes);
  }

  void synchronize(uint32_t) override {
    worker_->wait_for_earlier();
    if (auto failure = worker_->take_error()) {
      throw Failure{DEVALLOC_STATUS_DEVICE_ERROR, "an earlier copy failed: " + *failure};
    }
  }

 private:
  AllocationTable memory_;
  std::shared_mutex lifetime_;  // copies shared, frees exclusive
  std::unique_ptr<devalloc::plugin::CompletionThread> worker_ =
      std::make_unique<devalloc::plugin::CompletionThread>();
};

struct ExampleKitPlugin {
  static constexpr const char* name = "example_kit";
  static constexpr const char* version = "1.0.0";
  static std::unique_ptr<devalloc::plugin::Instance> create(devalloc::plugin::Options& options) {
    options.reject_unknown(name, "none");
    return std::make_unique<ExampleInstance>();
  }
};

}  // namespace

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(ExampleKitPlugin)
