// The OpenCL plugin loaded through devalloc's loader, driving the real ICD
// loader (libOpenCL.so.1) and the drivers it finds: on these machines PoCL,
// a conformant OpenCL 3.0 driver that runs on the CPU. No fake: what the
// tests see is what a real driver did.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <devalloc/plugin_loader.hpp>
#include <fake_runtime.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace devalloc::opencl_test {

using fake_test::pattern;
using fake_test::ReleaseCounter;

inline const std::string kPlugin = DEVALLOC_OPENCL_PLUGIN;

// Waits (at most a minute, so that a plugin that never releases fails
// instead of hanging) until `count` releases came, calling nothing of the
// plugin meanwhile.
inline bool wait_for_releases(const ReleaseCounter& counter, int count) {
  for (int i = 0; i < 60000 && counter.releases.load() < count; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return counter.releases.load() >= count;
}

inline std::pair<std::shared_ptr<Plugin>, PluginError> load_opencl(
    const PluginOptions& options = {}) {
  return PluginLoader().load(kPlugin, options);
}

// The plugin with its default options: every device of every platform.
class OpenClPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [plugin, error] = load_opencl();
    ASSERT_TRUE(plugin) << error.status.message();
    ASSERT_FALSE(plugin->devices().empty()) << "the ICD loader found no OpenCL device";
    plugin_ = std::move(plugin);
  }

  Plugin& plugin() { return *plugin_; }
  void destroy_plugin() { plugin_.reset(); }

  // `count` until-released copies to device 0, chunk i of `source` to
  // base + i * chunk, each released to `counter`; false when a call fails.
  bool copy_chunks_until_released(uint64_t base, const std::vector<uint8_t>& source,
                                  int count, uint64_t chunk, ReleaseCounter& counter) {
    for (int i = 0; i < count; ++i) {
      if (!plugin_
               ->copy_to_device_until_released(0, base + i * chunk, source.data() + i * chunk,
                                               chunk, ReleaseCounter::on_release, &counter)
               .ok()) {
        return false;
      }
    }
    return true;
  }

  // The bytes of [address, +nbytes) of device 0, read through the plugin.
  std::vector<uint8_t> read(uint64_t address, size_t nbytes) {
    std::vector<uint8_t> bytes(nbytes);
    const Status s = plugin_->copy_to_host(0, bytes.data(), address, nbytes);
    EXPECT_TRUE(s.ok()) << s.message();
    return bytes;
  }

 private:
  std::shared_ptr<Plugin> plugin_;
};

}  // namespace devalloc::opencl_test
