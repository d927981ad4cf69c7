// What every conformance test shares: the target under test, a fixture that
// loads it afresh, status assertions, byte patterns, and probes that stand in
// for the caller of a copy.
#pragma once

#include <devalloc/conformance.hpp>
#include <devalloc/plugin.hpp>
#include <devalloc/status.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace devalloc::conformance {

// Set by run() before any test starts.
void set_target(const Target& target);
const Target& target();

// The device most tests work on; the fixture fails when there is none.
inline constexpr uint32_t kDevice = 0;
inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;

// Assertions on the handle's Status. The handle fills in a message when the
// plugin gives none, so the plugin's own text is checked through the raw
// table instead (RawFailure).
::testing::AssertionResult IsOk(const char* expr, const Status& status);
template <class T>
::testing::AssertionResult IsOk(const char* expr, const Result<T>& result) {
  return IsOk(expr, result.status());
}
::testing::AssertionResult HasCode(const char* expr, const char* code_expr,
                                   const Status& status, StatusCode code);
template <class T>
::testing::AssertionResult HasCode(const char* expr, const char* code_expr,
                                   const Result<T>& result, StatusCode code) {
  return HasCode(expr, code_expr, result.status(), code);
}

#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::devalloc::conformance::IsOk, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::devalloc::conformance::IsOk, expr)
#define EXPECT_STATUS(expr, code) \
  EXPECT_PRED_FORMAT2(::devalloc::conformance::HasCode, expr, code)
#define ASSERT_STATUS(expr, code) \
  ASSERT_PRED_FORMAT2(::devalloc::conformance::HasCode, expr, code)

// Deterministic pseudo-random bytes: the same seed gives the same bytes, and
// neighbouring seeds share no structure, so a copy landing at the wrong place
// or from the wrong source is seen.
void fill_pattern(std::span<uint8_t> bytes, uint64_t seed);
std::vector<uint8_t> pattern(size_t nbytes, uint64_t seed);
// Names the first differing offset and how many bytes differ.
::testing::AssertionResult BytesEqual(std::span<const uint8_t> expected,
                                      std::span<const uint8_t> actual);
uint64_t digest(std::span<const uint8_t> bytes);

// Room after every struct the suite hands to a plugin to write into. A plugin
// built against a header whose struct grew writes past the struct_size it
// was given (PLUGIN-4); with the slack that lands here instead of on the
// suite's stack or heap, so only the tests that look for such writes (the
// "...Tail..." tests, with canaries) report it, and every other test still
// sees sane values.
inline constexpr size_t kSlackBytes = 512;

// An output (or input) struct followed by kSlackBytes of slack; pass
// get() to the plugin.
template <class Struct>
struct WithSlack {
  Struct value{};
  unsigned char slack[kSlackBytes]{};

  Struct* get() { return &value; }
  Struct& operator*() { return value; }
  Struct* operator->() { return &value; }
  const Struct* operator->() const { return &value; }
};

// A devalloc_error whose message starts without any NUL, so that a plugin
// that fails without writing a terminated message is caught; followed by
// slack like WithSlack.
struct RawError {
  RawError();
  devalloc_error* get() { return &error; }
  bool untouched() const;
  bool terminated() const;
  std::string text() const;

  devalloc_error error;
  unsigned char slack[kSlackBytes]{};
};

// PLUGIN-6 seen through the raw table: the expected status, and a non-empty
// NUL-terminated message.
::testing::AssertionResult RawFailure(devalloc_status got, devalloc_status want,
                                      const RawError& error);

// Stands for the caller of one until-released copy: counts the releases and
// checks that src still held the bytes the copy was issued with when its
// release came. Every probe is registered while it lives, and on_release is
// the only release function the suite hands to a plugin: a user_data that is
// no live probe (made up, off by some bytes, or of a probe already gone) is
// looked up, never followed, and recorded as a stray release (PLUGIN-14),
// which fails the test that is running (PluginTest::TearDown).
struct ReleaseProbe {
  ReleaseProbe();
  ~ReleaseProbe();
  ReleaseProbe(const ReleaseProbe&) = delete;
  ReleaseProbe& operator=(const ReleaseProbe&) = delete;

  // Records src as it is now. With reuse_after_release the release callback
  // overwrites src, as a caller that refills its staging buffer at once does.
  void arm(std::span<uint8_t> src, bool reuse_after_release = false);
  static void on_release(void* probe);

  std::span<uint8_t> source;
  uint64_t source_digest = 0;
  bool reuse = false;
  std::atomic<int> releases{0};
  std::atomic<bool> source_intact{true};
};

// When a probe's release is checked, with the rule that makes it due.
inline constexpr const char* kBySynchronize =
    "when synchronize returned (PLUGIN-17, PLUGIN-20)";
inline constexpr const char* kByDestroy = "when destroy returned (PLUGIN-9)";
// A copy call that returned an error: its source is released too, by the
// same deadlines.
inline constexpr const char* kFailedBySynchronize =
    "when synchronize returned, though its copy call failed (PLUGIN-14: a failed copy is "
    "released too; PLUGIN-20)";
inline constexpr const char* kFailedByDestroy =
    "when destroy returned, though its copy call failed (PLUGIN-14: a failed copy is "
    "released too; PLUGIN-9)";

// PLUGIN-14 seen through a probe: exactly one release by `when`. A missing
// release and a second one are told apart, each with the rule it breaks.
::testing::AssertionResult ReleasedExactlyOnce(const ReleaseProbe& probe,
                                               std::string_view when);

// The stray releases (user_data values that were no live probe) recorded
// since the last call, oldest first; at most a few values are kept, all are
// counted.
struct StrayReleases {
  uint64_t count = 0;
  std::vector<uintptr_t> first;
};
StrayReleases take_stray_releases();

// The PLUGIN rules a test group checks, declared once per group next to its
// fixture: a failure that names no rule of its own is shown with them.
bool declare_rules(const char* group, const char* rules);
// "" for a group that declared none.
std::string rules_of(std::string_view group);
#define DEVALLOC_CONFORMANCE_RULES(group, rules)                \
  [[maybe_unused]] const bool devalloc_rules_of_##group =       \
      ::devalloc::conformance::declare_rules(#group, rules)

// Shows failures without the suite's file names and lines, which a vendor
// does not have, and with the rule each checks. Call after InitGoogleTest.
void install_printer();

class PluginTest : public ::testing::Test {
 protected:
  void SetUp() override;
  // Destroys the instance (its pending releases come), then fails the test
  // for every stray release that came while it ran.
  void TearDown() override;

  Plugin& plugin() { return *plugin_; }
  const devalloc_plugin_api_v1& api() const { return plugin_->api(); }
  devalloc_instance* instance() const { return plugin_->instance(); }
  uint32_t device_count() const {
    return static_cast<uint32_t>(plugin_->devices().size());
  }
  // destroy(): what the loader does when the last handle goes.
  void destroy_plugin() { plugin_.reset(); }

  // Reads nbytes at a device address back into fresh host memory
  // (copy_device_to_host); a failure names that call.
  Result<std::vector<uint8_t>> read_device(uint32_t device, uint64_t address,
                                           uint64_t nbytes);
  // What a caller does before freeing: synchronize, then deallocate; a
  // failure names the one of the two that failed.
  Status synchronize_and_deallocate(uint32_t device, uint64_t address);

  // An object that outlives the plugin instance, also when an assertion ends
  // the test early: copy sources and release probes, so that a plugin that
  // reads or releases late touches live memory and the test reports it.
  template <class T, class... Args>
  T& keep_past_destroy(Args&&... args) {
    auto object = std::make_shared<T>(std::forward<Args>(args)...);
    kept_.push_back(object);
    return *object;
  }

 private:
  // Declared before plugin_, so destroyed after it.
  std::vector<std::shared_ptr<void>> kept_;
  std::shared_ptr<Plugin> plugin_;
};

// For tests that need a device to work on.
class DeviceTest : public PluginTest {
 protected:
  void SetUp() override;
};

}  // namespace devalloc::conformance
