// The Level Zero plugin loaded through devalloc's loader, driving Debian's
// real Level Zero loader, which runs the fake driver (ZE_ENABLE_ALT_DRIVERS,
// set by the test's environment); with the fake's own view (violations,
// device memory, fault injection) at hand.
#pragma once

#include <devalloc/plugin_loader.hpp>

#include <fake_runtime.hpp>
#include <fake_ze_control.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace devalloc::level_zero_test {

using fake_test::pattern;
using fake_test::ReleaseCounter;

inline const std::string kPlugin = DEVALLOC_LEVEL_ZERO_PLUGIN;
inline const std::string kFakeDriver = DEVALLOC_FAKE_ZE_DRIVER;

// The fake driver, loaded by the Level Zero loader, found by its path.
class FakeZe : public fake_test::FakeRuntime {
 public:
  explicit FakeZe(const std::string& driver = kFakeDriver)
      : FakeRuntime(driver, "devalloc_fake_ze_") {}
  void ignore_alignment_next(const char* api) const {
    control<devalloc_fake_ze_ignore_alignment_next_fn>("ignore_alignment_next")(api);
  }
  void lose_device_on_next_copy() const {
    control<devalloc_fake_ze_lose_device_on_next_copy_fn>("lose_device_on_next_copy")();
  }
};

// Waits (at most a minute, so that a plugin that never releases fails
// instead of hanging) until `count` releases came.
inline bool wait_for_releases(const ReleaseCounter& counter, int count) {
  for (int i = 0; i < 60000 && counter.releases.load() < count; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return counter.releases.load() >= count;
}

// The plugin on the fake's devices. The kit's PluginWithFake cannot serve:
// the plugin's runtime_library is the loader, not the fake, which the
// loader finds itself. Every test ends with no violation left unexamined.
class LevelZeroPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [plugin, error] = PluginLoader().load(kPlugin, {{"runtime_library", "libze_loader.so.1"}});
    ASSERT_TRUE(plugin) << error.status.message();
    plugin_ = std::move(plugin);
    fake_ = std::make_unique<FakeZe>();
    ASSERT_TRUE(fake_->loaded()) << "the loader did not load " << kFakeDriver;
    fake_->reset();
  }
  void TearDown() override {
    if (!fake_) return;  // SetUp failed
    fake_->pause(false);
    plugin_.reset();
    EXPECT_EQ(fake_->violations(), "");
  }

  Plugin& plugin() { return *plugin_; }
  const FakeZe& fake() const { return *fake_; }
  void destroy_plugin() { plugin_.reset(); }

 private:
  std::shared_ptr<Plugin> plugin_;
  std::unique_ptr<FakeZe> fake_;
};

}  // namespace devalloc::level_zero_test
