// The pinned host memory an instance hands out for staging (allocate_host,
// free_host: PLUGIN-18), over a vendor's HostMemory, which provides
// enter() and enter(std::nothrow) (a scope with active(), as StreamDevice's
// Stream; NoScope where none is needed), runtime(), call_text() for
// RuntimeCall::allocate_host and free_host, and
//   int allocate_host(nbytes, void*& host), free_host(void* host): the
//   runtime's result, 0 for success; never throw.
#pragma once

#include <devalloc/plugin_kit/allocation_table.hpp>
#include <devalloc/plugin_kit/give_back.hpp>
#include <devalloc/plugin_kit/runtime_calls.hpp>

#include <cstdint>
#include <new>
#include <string>
#include <utility>

namespace devalloc::plugin {

template <class HostMemory>
class PinnedStaging {
 public:
  explicit PinnedStaging(HostMemory memory) : memory_(std::move(memory)) {}
  // Frees whatever is still allocated; never throws.
  ~PinnedStaging() {
    if (buffers_.size() == 0) return;
    {
      const auto scope = memory_.enter(std::nothrow);
      // Without the scope, the vendor's teardown lets the runtime reclaim it.
      if (scope.active()) {
        buffers_.for_each(
            [&](void* host, uint64_t) { give_back([&] { return memory_.free_host(host); }); });
      }
    }
    buffers_.clear();
  }
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  void* allocate(uint64_t nbytes) {
    [[maybe_unused]] const auto scope = memory_.enter();
    const std::string call = memory_.call_text(RuntimeCall::allocate_host, {0, nullptr, nbytes});
    void* host = nullptr;
    if (const int result = memory_.allocate_host(nbytes, host); result != 0) {
      memory_.runtime().raise(result, CallKind::host_allocation, call);
    }
    require_memory(host != nullptr, call, memory_.runtime().success_name());
    buffers_.adopt(
        host, nbytes, [this](void* p) { give_back([&] { return memory_.free_host(p); }); }, call);
    return host;
  }
  // Throws Failure(INVALID_ARGUMENT) for a pointer not from allocate().
  void free(void* host) {
    [[maybe_unused]] const auto scope = memory_.enter();
    buffers_.free(host, [this](void* p) {
      if (const int result = memory_.free_host(p); result != 0) {
        memory_.runtime().raise(result, CallKind::work,
                                memory_.call_text(RuntimeCall::free_host, {0, p, 0}));
      }
    });
  }

 private:
  HostMemory memory_;
  StagingTable buffers_;
};

}  // namespace devalloc::plugin
