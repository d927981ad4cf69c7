// The CUDA plugin loaded through the real loader, driven against the fake
// CUDA driver, with the fake's own view (violations, device memory, fault
// injection) at hand.
#pragma once

#include <devalloc/plugin_loader.hpp>

#include <cuda.h>
#include <fake_cuda_control.h>
#include <fake_runtime.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace devalloc::cuda_test {

inline const std::string kPlugin = DEVALLOC_CUDA_PLUGIN;
inline const std::string kFakeDir = DEVALLOC_FAKE_CUDA_DIR;
inline const std::string kFakeDriver = kFakeDir + "/libcuda.so.1";

inline std::pair<std::shared_ptr<Plugin>, PluginError> load_cuda_plugin(
    const std::string& driver, PluginOptions extra = {}) {
  extra.emplace_back("runtime_library", driver);
  return PluginLoader().load(kPlugin, extra);
}

// The fake driver the plugin has loaded, found by its path, with the
// controls only the CUDA fake has.
class FakeCuda : public fake_test::FakeRuntime {
 public:
  explicit FakeCuda(const std::string& path) : FakeRuntime(path, "devalloc_fake_cuda_") {}

  void fault_next_copy(int result) const {
    control<devalloc_fake_cuda_fault_next_copy_fn>("fault_next_copy")(result);
  }
  void after_next(const char* entry_point, void (*hook)()) const {
    control<devalloc_fake_cuda_after_next_fn>("after_next")(entry_point, hook);
  }
};

using fake_test::pattern;
using fake_test::ReleaseCounter;

// The CUDA plugin on two fake devices.
class CudaPluginTest : public fake_test::PluginWithFake<FakeCuda> {
 protected:
  CudaPluginTest() : PluginWithFake(kPlugin, kFakeDriver) {}
};

}  // namespace devalloc::cuda_test
