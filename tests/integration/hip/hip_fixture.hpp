// The HIP plugin loaded through the real loader against the fake HIP
// runtime (tests/fakes/hip), with the fake's controls at hand.
#pragma once

#include <devalloc/plugin_loader.hpp>

#include <hip/hip_runtime_api.h>

#include <fake_hip_control.h>
#include <fake_runtime.hpp>

#include <memory>
#include <string>
#include <utility>

namespace devalloc::hip_test {

inline const std::string kPlugin = DEVALLOC_HIP_PLUGIN;
inline const std::string kFake = std::string(DEVALLOC_FAKE_HIP_DIR) + "/libamdhip64.so.5";

inline std::pair<std::shared_ptr<Plugin>, PluginError> load_hip(const std::string& runtime) {
  return PluginLoader().load(kPlugin, {{"runtime_library", runtime}});
}

class FakeHip : public fake_test::FakeRuntime {
 public:
  explicit FakeHip(const std::string& path) : FakeRuntime(path, "devalloc_fake_hip_") {}
};

}  // namespace devalloc::hip_test
