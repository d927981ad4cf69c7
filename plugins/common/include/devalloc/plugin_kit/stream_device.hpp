// One device of a runtime whose streams run a completion callback after each
// queued copy (CUDA, HIP): its live allocations, the releases of its stream
// (StreamReleases) and every per-device call of DeviceInstance, over the
// runtime calls of a vendor's Stream class. Stream is a CallbackStream over
// the device's one stream and provides:
// - Stream(DeviceDescription&, args...): reads the properties into the
//   description and creates the stream; throws Failure.
// - kNaturalAlignment, kMaxAlignment (as DeviceInstance asks of a device),
//   kCallbacksPerWait (StreamReleases' bound, 0 for none): GpuStream's,
//   unless it declares its own.
// - enter() and enter(std::nothrow): a RuntimeScope in which the runtime's
//   calls reach this device (its context current, or it the current
//   device); the nothrow one, for destroy paths, never throws.
// - runtime(): its CheckedRuntime; call_text(RuntimeCall, CallArguments):
//   a failed call's text (runtime_calls.hpp).
// - int memory_info(size_t& free, size_t& total), allocate(nbytes,
//   uint64_t& base), free(base), enqueue_copy_to_host(dst, src, nbytes):
//   the runtime's result, 0 for success; none throws.
// Its destructor need not destroy the stream: quiesce() has.
// DEVALLOC_KIT_STREAM_CALLS(Scope, Runtime) declares these calls and the
// CallbackStream overrides in the vendor's class; the vendor defines them.
#pragma once

#include <devalloc/plugin_kit/allocation_table.hpp>
#include <devalloc/plugin_kit/give_back.hpp>
#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/runtime_calls.hpp>
#include <devalloc/plugin_kit/stream_releases.hpp>

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <utility>

#define DEVALLOC_KIT_STREAM_CALLS(Scope, Runtime)                                          \
  Scope enter() const;                                                                     \
  Scope enter(std::nothrow_t) const noexcept;                                              \
  const Runtime& runtime() const;                                                          \
  std::string call_text(::devalloc::plugin::RuntimeCall call,                              \
                        const ::devalloc::plugin::CallArguments& args) const;              \
  int memory_info(size_t& free_bytes, size_t& total_bytes) const noexcept;                 \
  int allocate(uint64_t nbytes, uint64_t& base) noexcept;                                  \
  int free(uint64_t base) noexcept;                                                        \
  int enqueue_copy_to_host(void* dst, uint64_t src, uint64_t nbytes) noexcept;             \
  int enqueue_copy(uint64_t dst, const void* src, uint64_t nbytes) noexcept override;      \
  int enqueue_release(::devalloc::plugin::ReleaseQueue& releases) noexcept override;       \
  int wait() noexcept override;                                                            \
  State query() noexcept override;                                                         \
  void destroy() noexcept override;

namespace devalloc::plugin {

// The base of a vendor's Stream: a CallbackStream whose runtime allocates
// as cuMemAlloc and hipMalloc do, 256-byte aligned, and is not bounded in
// how many callbacks it queues.
class GpuStream : public CallbackStream {
 public:
  static constexpr uint64_t kNaturalAlignment = 256;
  // A large page: larger alignments are over-allocated, which costs
  // alignment - 256 bytes.
  static constexpr uint64_t kMaxAlignment = uint64_t{2} << 20;
  static constexpr uint64_t kCallbacksPerWait = 0;
};

// What a stream's query result (cuStreamQuery, hipStreamQuery) says: 0 is
// idle, `not_ready` busy, any other error lost (a sticky error of the
// context or device, answered to every call: nothing queued runs anymore).
inline CallbackStream::State stream_state(int query_result, int not_ready) noexcept {
  if (query_result == 0) return CallbackStream::State::idle;
  return query_result == not_ready ? CallbackStream::State::busy : CallbackStream::State::lost;
}

template <class Stream>
class StreamDevice {
 public:
  static constexpr uint64_t kNaturalAlignment = Stream::kNaturalAlignment;
  static constexpr uint64_t kMaxAlignment = Stream::kMaxAlignment;

  template <class... Args>
  explicit StreamDevice(Args&&... args) : stream_(description_, std::forward<Args>(args)...) {}
  // quiesce(), then frees every live allocation. Allocates nothing and never
  // throws.
  ~StreamDevice() {
    quiesce();
    {
      const auto scope = stream_.enter(std::nothrow);
      // Without the scope nothing can be freed; the vendor's teardown (a
      // context released) lets the runtime reclaim it.
      if (scope.active()) {
        allocations_.for_each([&](const AllocationTable::Allocation& a) {
          give_back([&] { return stream_.free(a.base); });
        });
      }
    }
    allocations_.clear();
  }
  StreamDevice(const StreamDevice&) = delete;
  StreamDevice& operator=(const StreamDevice&) = delete;

  const Stream& stream() const { return stream_; }
  const DeviceDescription& description() const { return description_; }

  MemoryInfo memory_info() const {
    [[maybe_unused]] const auto scope = stream_.enter();
    size_t free_bytes = 0, total_bytes = 0;
    check(stream_.memory_info(free_bytes, total_bytes), CallKind::work, RuntimeCall::memory_info,
          {});
    return {free_bytes, total_bytes};
  }

  // nbytes > 0; alignment a power of two, at most kMaxAlignment.
  uint64_t allocate(uint64_t nbytes, uint64_t alignment) {
    const uint64_t request = over_allocation(nbytes, alignment, kNaturalAlignment);
    [[maybe_unused]] const auto scope = stream_.enter();
    const std::string call = stream_.call_text(RuntimeCall::allocate, {0, nullptr, request});
    uint64_t base = 0;
    if (const int result = stream_.allocate(request, base); result != 0) {
      stream_.runtime().raise(result, CallKind::device_allocation, call);
    }
    require_memory(base != 0, call, stream_.runtime().success_name());
    // In the scope still if recording fails and base is freed.
    return allocations_.adopt(
        base, nbytes, alignment, [this](uint64_t b) { give_back([&] { return stream_.free(b); }); },
        call);
  }
  void deallocate(uint64_t address) {
    [[maybe_unused]] const auto scope = stream_.enter();
    allocations_.free(address, [this](uint64_t base) {
      check(stream_.free(base), CallKind::work, RuntimeCall::free, {base});
    });
  }

  // nbytes > 0 in the three copies. src has been read when this returns: a
  // runtime's own synchronous copy may run on another stream (which
  // synchronize() does not cover) or return before a pageable copy landed;
  // queued on the device's stream and waited for, the copy has read src,
  // pageable or pinned, once the stream is over.
  void copy_during_call(uint64_t dst, const void* src, uint64_t nbytes) {
    allocations_.require_range(dst, nbytes, "destination");
    [[maybe_unused]] const auto scope = stream_.enter();
    const CallArguments copy{dst, src, nbytes};
    check(releases_.submit([&] { return stream_.enqueue_copy(dst, src, nbytes); }), CallKind::work,
          RuntimeCall::copy_to_device, copy);
    check(releases_.wait_until_over(), CallKind::work, RuntimeCall::wait_for_copy_to_device, copy);
  }
  // Queues the copy and, behind it, the callback that fires release.
  void copy_until_released(uint64_t dst, const void* src, uint64_t nbytes, Release release) {
    allocations_.require_range(dst, nbytes, "destination");
    [[maybe_unused]] const auto scope = stream_.enter();
    const auto submitted = releases_.copy_until_released(dst, src, nbytes, std::move(release));
    const CallArguments copy{dst, src, nbytes};
    check(submitted.waited, CallKind::work, RuntimeCall::bounded_wait, copy);
    check(submitted.copied, CallKind::work, RuntimeCall::copy_to_device, copy);
    check(submitted.released, CallKind::work, RuntimeCall::release, copy);
  }
  // On the device's stream, so that it reads after every earlier copy.
  void copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
    allocations_.require_range(src, nbytes, "source");
    [[maybe_unused]] const auto scope = stream_.enter();
    const CallArguments copy{src, dst, nbytes};
    check(releases_.submit([&] { return stream_.enqueue_copy_to_host(dst, src, nbytes); }),
          CallKind::work, RuntimeCall::copy_to_host, copy);
    check(releases_.wait_until_over(), CallKind::work, RuntimeCall::wait_for_copy_to_host, copy);
  }

  // Waits for the stream; every release queued before has fired when it
  // returns or throws (a failed wait is waited out until the stream is idle
  // or lost).
  void synchronize() {
    [[maybe_unused]] const auto scope = stream_.enter();
    check(releases_.wait_until_over(), CallKind::work, RuntimeCall::synchronize, {});
  }
  // For destroy: waits for the stream, destroys it whatever happens, fires
  // every release still owed. Never throws; idempotent.
  void quiesce() noexcept {
    const auto scope = stream_.enter(std::nothrow);
    releases_.quiesce(scope.active());
  }

 private:
  // The call's text is written only when it failed.
  void check(int result, CallKind kind, RuntimeCall call, const CallArguments& arguments) const {
    if (result != 0) stream_.runtime().raise(result, kind, stream_.call_text(call, arguments));
  }

  DeviceDescription description_;  // filled in by stream_'s constructor
  Stream stream_;
  AllocationTable allocations_;
  StreamReleases releases_{stream_, Stream::kCallbacksPerWait};
};

}  // namespace devalloc::plugin
