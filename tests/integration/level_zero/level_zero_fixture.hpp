// The Level Zero plugin loaded through devalloc's loader, driving Debian's
// real Level Zero loader, which runs the fake driver (ZE_ENABLE_ALT_DRIVERS,
// set by the test's environment); with the fake's own view (violations,
// device memory, fault injection) at hand.
#pragma once

#include <devalloc/plugin_loader.hpp>

#include <fake_ze_control.h>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace devalloc::level_zero_test {

inline const std::string kPlugin = DEVALLOC_LEVEL_ZERO_PLUGIN;
inline const std::string kFakeDriver = DEVALLOC_FAKE_ZE_DRIVER;

// The fake driver, loaded by the Level Zero loader, found by its path.
class FakeZe {
 public:
  FakeZe() : handle_(::dlopen(kFakeDriver.c_str(), RTLD_NOW | RTLD_NOLOAD)) {}
  ~FakeZe() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  FakeZe(const FakeZe&) = delete;
  FakeZe& operator=(const FakeZe&) = delete;

  bool loaded() const { return handle_ != nullptr; }

  template <class Fn>
  Fn get(const char* name) const {
    void* symbol = ::dlsym(handle_, name);
    EXPECT_NE(symbol, nullptr) << "the fake driver lacks " << name;
    return reinterpret_cast<Fn>(symbol);
  }

  std::string violations() const {
    std::string text(64 * 1024, '\0');
    get<devalloc_fake_ze_violations_fn>("devalloc_fake_ze_violations")(
        text.data(), text.size());
    text.resize(std::char_traits<char>::length(text.c_str()));
    return text;
  }
  void reset() const {
    get<devalloc_fake_ze_reset_fn>("devalloc_fake_ze_reset")();
  }
  void fail_next(const char* api, int result) const {
    get<devalloc_fake_ze_fail_next_fn>("devalloc_fake_ze_fail_next")(api,
                                                                     result);
  }
  void lose_device_on_next_copy() const {
    get<devalloc_fake_ze_lose_device_on_next_copy_fn>(
        "devalloc_fake_ze_lose_device_on_next_copy")();
  }
  void pause(bool paused) const {
    get<devalloc_fake_ze_pause_fn>("devalloc_fake_ze_pause")(paused ? 1 : 0);
  }
  uint64_t calls(const char* api) const {
    return get<devalloc_fake_ze_calls_fn>("devalloc_fake_ze_calls")(api);
  }
  uint64_t live_allocations(int device) const {
    return get<devalloc_fake_ze_live_allocations_fn>(
        "devalloc_fake_ze_live_allocations")(device);
  }
  std::vector<uint8_t> read(uint64_t address, size_t nbytes) const {
    std::vector<uint8_t> bytes(nbytes);
    const int result = get<devalloc_fake_ze_read_fn>("devalloc_fake_ze_read")(
        address, bytes.data(), nbytes);
    EXPECT_EQ(result, 0) << "0x" << std::hex << address << " is not live";
    return bytes;
  }

 private:
  void* handle_;
};

// Counts on_release calls.
struct ReleaseCounter {
  std::atomic<int> releases{0};
  static void on_release(void* self) {
    static_cast<ReleaseCounter*>(self)->releases.fetch_add(1);
  }
  // Waits (at most a minute, so that a plugin that never releases fails
  // instead of hanging) until `count` releases came.
  bool wait_for(int count) const {
    for (int i = 0; i < 60000 && releases.load() < count; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return releases.load() >= count;
  }
};

inline std::vector<uint8_t> pattern(size_t nbytes, int seed) {
  std::vector<uint8_t> bytes(nbytes);
  uint32_t x = 2463534242u + static_cast<uint32_t>(seed) * 7919u;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return bytes;
}

// The plugin on the fake's devices. Every test ends with no violation left
// unexamined: those a test plants it checks and clears itself.
class LevelZeroPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [plugin, error] = PluginLoader().load(
        kPlugin, {{"runtime_library", "libze_loader.so.1"}});
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

 private:
  std::shared_ptr<Plugin> plugin_;
  std::unique_ptr<FakeZe> fake_;
};

}  // namespace devalloc::level_zero_test
