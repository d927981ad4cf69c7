// What tests of a vendor plugin share: the fake runtime the plugin has
// loaded, reached through its control functions (devalloc_fake_<vendor>_*,
// see tests/fakes/<vendor>/*_control.h), a release counter and test bytes.
#pragma once

#include <devalloc/plugin_loader.hpp>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace devalloc::fake_test {

class FakeRuntime {
 public:
  // path: the fake library the plugin opened; prefix: its control
  // functions' prefix, e.g. "devalloc_fake_hip_".
  FakeRuntime(const std::string& path, std::string prefix)
      : handle_(::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)), prefix_(std::move(prefix)) {}
  ~FakeRuntime() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  FakeRuntime(const FakeRuntime&) = delete;
  FakeRuntime& operator=(const FakeRuntime&) = delete;

  bool loaded() const { return handle_ != nullptr; }

  // A function of the fake by name, cast to its type.
  template <class Fn>
  Fn get(const std::string& name) const {
    void* symbol = ::dlsym(handle_, name.c_str());
    EXPECT_NE(symbol, nullptr) << "the fake lacks " << name;
    return reinterpret_cast<Fn>(symbol);
  }
  // A control function: prefix + name.
  template <class Fn>
  Fn control(const char* name) const {
    return get<Fn>(prefix_ + name);
  }

  std::string violations() const {
    std::string text(64 * 1024, '\0');
    control<int (*)(char*, size_t)>("violations")(text.data(), text.size());
    text.resize(std::char_traits<char>::length(text.c_str()));
    return text;
  }
  void reset() const { control<void (*)()>("reset")(); }
  void fail_calls(const char* entry_point, int result, int count) const {
    control<void (*)(const char*, int, int)>("fail_calls")(entry_point, result, count);
  }
  void fail_next(const char* entry_point, int result) const { fail_calls(entry_point, result, 1); }
  // The next `skip` calls of entry_point run as usual, the `count` after
  // them return result.
  void fail_calls_after(const char* entry_point, int skip, int result, int count) const {
    control<void (*)(const char*, int, int, int)>("fail_calls_after")(entry_point, skip, result,
                                                                      count);
  }
  // The next call of entry_point (an allocation) that would succeed
  // answers success with a null result and allocates nothing.
  void null_result_next(const char* entry_point) const {
    control<void (*)(const char*)>("null_result_next")(entry_point);
  }
  void pause(bool paused) const { control<void (*)(int)>("pause")(paused ? 1 : 0); }
  uint64_t calls(const char* entry_point) const {
    return control<uint64_t (*)(const char*)>("calls")(entry_point);
  }
  uint64_t live_allocations(int device) const {
    return control<uint64_t (*)(int)>("live_allocations")(device);
  }
  // What is live in the fake that a user must give back ("1 stream(s)",
  // one kind a line); "" when nothing is.
  std::string live_objects() const {
    std::string text(4096, '\0');
    control<int (*)(char*, size_t)>("live_objects")(text.data(), text.size());
    text.resize(std::char_traits<char>::length(text.c_str()));
    return text;
  }
  // Device memory as the fake holds it, read without the plugin.
  std::vector<uint8_t> read(uint64_t address, size_t nbytes) const {
    std::vector<uint8_t> bytes(nbytes);
    const int result =
        control<int (*)(uint64_t, void*, size_t)>("read")(address, bytes.data(), nbytes);
    EXPECT_EQ(result, 0) << "0x" << std::hex << address << " is not live";
    return bytes;
  }

 private:
  void* handle_;
  std::string prefix_;
};

// A vendor plugin loaded through the real loader with its fake runtime
// (runtime_library = fake_path), and the fake's controls (Fake: FakeRuntime
// or a vendor's subclass). Every test ends with no violation left
// unexamined: those a test plants it checks and clears itself.
template <class Fake>
class PluginWithFake : public ::testing::Test {
 protected:
  PluginWithFake(std::string plugin_path, std::string fake_path)
      : plugin_path_(std::move(plugin_path)), fake_path_(std::move(fake_path)) {}

  void SetUp() override {
    auto [plugin, error] = PluginLoader().load(plugin_path_, {{"runtime_library", fake_path_}});
    ASSERT_TRUE(plugin) << error.status.message();
    plugin_ = std::move(plugin);
    fake_ = std::make_unique<Fake>(fake_path_);
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
  const Fake& fake() const { return *fake_; }
  void destroy_plugin() { plugin_.reset(); }

 private:
  std::string plugin_path_;
  std::string fake_path_;
  std::shared_ptr<Plugin> plugin_;
  std::unique_ptr<Fake> fake_;
};

// Counts on_release calls.
struct ReleaseCounter {
  std::atomic<int> releases{0};
  static void on_release(void* self) { static_cast<ReleaseCounter*>(self)->releases.fetch_add(1); }
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

}  // namespace devalloc::fake_test
