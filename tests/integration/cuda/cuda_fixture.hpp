// The CUDA plugin loaded through the real loader, driven against the fake
// CUDA driver, with the fake's own view (violations, device memory, fault
// injection) at hand.
#pragma once

#include <devalloc/plugin_loader.hpp>

#include <cuda.h>
#include <fake_cuda_control.h>

#include <gtest/gtest.h>

#include <dlfcn.h>

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

// The fake driver the plugin has loaded, found by its path.
class FakeCuda {
 public:
  explicit FakeCuda(const std::string& path)
      : handle_(::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {}
  ~FakeCuda() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  FakeCuda(const FakeCuda&) = delete;
  FakeCuda& operator=(const FakeCuda&) = delete;

  bool loaded() const { return handle_ != nullptr; }

  // A function of the fake by name, cast to its type.
  template <class Fn>
  Fn get(const char* name) const {
    void* symbol = ::dlsym(handle_, name);
    EXPECT_NE(symbol, nullptr) << "the fake driver lacks " << name;
    return reinterpret_cast<Fn>(symbol);
  }

  std::string violations() const {
    auto fn =
        get<devalloc_fake_cuda_violations_fn>("devalloc_fake_cuda_violations");
    std::string text(64 * 1024, '\0');
    fn(text.data(), text.size());
    text.resize(std::char_traits<char>::length(text.c_str()));
    return text;
  }
  void reset() const {
    get<devalloc_fake_cuda_reset_fn>("devalloc_fake_cuda_reset")();
  }
  void fail_next(const char* entry_point, int result) const {
    get<devalloc_fake_cuda_fail_next_fn>("devalloc_fake_cuda_fail_next")(
        entry_point, result);
  }
  void fault_next_copy(int result) const {
    get<devalloc_fake_cuda_fault_next_copy_fn>(
        "devalloc_fake_cuda_fault_next_copy")(result);
  }
  void pause(bool paused) const {
    get<devalloc_fake_cuda_pause_fn>("devalloc_fake_cuda_pause")(paused ? 1
                                                                        : 0);
  }
  uint64_t calls(const char* entry_point) const {
    return get<devalloc_fake_cuda_calls_fn>("devalloc_fake_cuda_calls")(
        entry_point);
  }
  uint64_t live_allocations(int device) const {
    return get<devalloc_fake_cuda_live_allocations_fn>(
        "devalloc_fake_cuda_live_allocations")(device);
  }
  // Device memory as the fake holds it, read without the plugin.
  std::vector<uint8_t> read(uint64_t address, size_t nbytes) const {
    std::vector<uint8_t> bytes(nbytes);
    const int result = get<devalloc_fake_cuda_read_fn>(
        "devalloc_fake_cuda_read")(address, bytes.data(), nbytes);
    EXPECT_EQ(result, 0) << "0x" << std::hex << address << " is not live";
    return bytes;
  }

 private:
  void* handle_;
};

// Counts on_release calls; the source must still be unchanged when it comes.
struct ReleaseCounter {
  std::atomic<int> releases{0};
  static void on_release(void* self) {
    static_cast<ReleaseCounter*>(self)->releases.fetch_add(1);
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

// A plugin on two fake devices. Every test ends with no violation left
// unexamined: those a test plants it checks and clears itself.
class CudaPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [plugin, error] = load_cuda_plugin(kFakeDriver);
    ASSERT_TRUE(plugin) << error.status.message();
    plugin_ = std::move(plugin);
    fake_ = std::make_unique<FakeCuda>(kFakeDriver);
    ASSERT_TRUE(fake_->loaded());
    fake_->reset();
  }
  void TearDown() override {
    // A test that failed while streams were paused would otherwise leave
    // destroy waiting for them.
    if (fake_) fake_->pause(false);
    plugin_.reset();
    if (fake_) {
      EXPECT_EQ(fake_->violations(), "");
    }
  }

  Plugin& plugin() { return *plugin_; }
  const FakeCuda& fake() const { return *fake_; }
  void destroy_plugin() { plugin_.reset(); }

 private:
  std::shared_ptr<Plugin> plugin_;
  std::unique_ptr<FakeCuda> fake_;
};

}  // namespace devalloc::cuda_test
