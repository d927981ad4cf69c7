#include "suite.hpp"

#include <devalloc/plugin_loader.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_set>

namespace devalloc::conformance {
namespace {

std::optional<Target>& target_storage() {
  static std::optional<Target> stored;
  return stored;
}

// Not NUL: a message buffer the plugin left alone has no terminator.
constexpr char kUnwritten = 'X';

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The user_data values the suite can hand to a plugin: its live probes.
// Shared while a release is handled, exclusive while a probe comes or goes.
struct ProbeRegistry {
  std::shared_mutex mutex;
  std::unordered_set<const void*> live;
};

ProbeRegistry& probe_registry() {
  // Never destroyed: a plugin thread may still release during exit.
  static auto* registry = new ProbeRegistry;
  return *registry;
}

constexpr size_t kStraysKept = 4;

struct StrayLog {
  std::mutex mutex;
  StrayReleases strays;
};

StrayLog& stray_log() {
  static auto* log = new StrayLog;
  return *log;
}

void record_stray(const void* user_data) {
  StrayLog& log = stray_log();
  std::lock_guard lock(log.mutex);
  if (log.strays.first.size() < kStraysKept) {
    log.strays.first.push_back(reinterpret_cast<uintptr_t>(user_data));
  }
  ++log.strays.count;
}

// One failure for the stray releases in `strays`, which came `when`.
void report_strays(const StrayReleases& strays, const char* when) {
  if (strays.count == 0) return;
  ::testing::Message message;
  message << "on_release came " << strays.count << " time(s) " << when
          << " with a user_data that the suite gave to no copy (";
  for (size_t i = 0; i < strays.first.size(); ++i) {
    message << (i == 0 ? "" : ", ") << "0x" << std::hex << strays.first[i] << std::dec;
  }
  if (strays.count > strays.first.size()) message << ", ...";
  message << "): a stray release; each copy's on_release must come exactly once, with "
             "the user_data of that copy, which breaks PLUGIN-14 (a host ends its load "
             "on it, PLUGIN-21). The suite looked the value up and did not follow it.";
  ADD_FAILURE() << message;
}

// The ABI call a helper made, as the suite's messages name it:
// "deallocate(device 0, address 0x7f...)", with ", nbytes N" when given.
std::string call_text(const char* call, uint32_t device, const char* address_name,
                      uint64_t address, std::optional<uint64_t> nbytes = std::nullopt) {
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(address));
  std::string text = std::string(call) + "(device " + std::to_string(device) + ", " +
                     address_name + " " + hex;
  if (nbytes) text += ", nbytes " + std::to_string(*nbytes);
  return text + ")";
}

}  // namespace

StrayReleases take_stray_releases() {
  StrayLog& log = stray_log();
  std::lock_guard lock(log.mutex);
  return std::exchange(log.strays, StrayReleases{});
}

void set_target(const Target& target) { target_storage() = target; }

const Target& target() { return target_storage().value(); }

::testing::AssertionResult IsOk(const char* expr, const Status& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << expr << " failed with " << to_string(status.code()) << ": "
         << status.message();
}

::testing::AssertionResult HasCode(const char* expr, const char* code_expr,
                                   const Status& status, StatusCode code) {
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << expr << " gave " << to_string(status.code()) << " (\""
           << status.message() << "\"), expected " << code_expr;
  }
  if (status.message().empty()) {
    return ::testing::AssertionFailure()
           << expr << " gave " << to_string(code) << " with an empty message";
  }
  return ::testing::AssertionSuccess();
}

void fill_pattern(std::span<uint8_t> bytes, uint64_t seed) {
  const uint64_t key = splitmix64(seed);
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t word = splitmix64(key ^ (i / 8));
    std::memcpy(bytes.data() + i, &word, std::min<size_t>(8, bytes.size() - i));
  }
}

std::vector<uint8_t> pattern(size_t nbytes, uint64_t seed) {
  std::vector<uint8_t> bytes(nbytes);
  fill_pattern(bytes, seed);
  return bytes;
}

::testing::AssertionResult BytesEqual(std::span<const uint8_t> expected,
                                      std::span<const uint8_t> actual) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "expected " << expected.size() << " bytes, got " << actual.size();
  }
  // Empty spans may carry NULL, which memcmp must not see.
  if (expected.empty() ||
      std::memcmp(expected.data(), actual.data(), expected.size()) == 0) {
    return ::testing::AssertionSuccess();
  }
  size_t first = 0;
  size_t differing = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != actual[i] && differing++ == 0) first = i;
  }
  // One Message, because AssertionResult forgets std::hex between values.
  ::testing::Message message;
  message << differing << " of " << expected.size()
          << " bytes differ; the first at offset " << first << " (expected 0x"
          << std::hex << int{expected[first]} << ", got 0x"
          << int{actual[first]} << ")";
  return ::testing::AssertionFailure() << message;
}

uint64_t digest(std::span<const uint8_t> bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ULL;
  return h;
}

RawError::RawError() {
  error.struct_size = sizeof error;
  std::memset(error.message, kUnwritten, sizeof error.message);
}

bool RawError::untouched() const {
  return std::all_of(std::begin(error.message), std::end(error.message),
                     [](char c) { return c == kUnwritten; });
}

bool RawError::terminated() const {
  return std::memchr(error.message, '\0', sizeof error.message) != nullptr;
}

std::string RawError::text() const {
  return std::string(error.message,
                     strnlen(error.message, sizeof error.message));
}

::testing::AssertionResult RawFailure(devalloc_status got, devalloc_status want,
                                      const RawError& error) {
  if (got != want) {
    return ::testing::AssertionFailure()
           << "status " << to_string(status_code_from_abi(got)) << " (" << got
           << "), expected " << to_string(status_code_from_abi(want)) << " ("
           << want << ")";
  }
  if (!error.terminated()) {
    return ::testing::AssertionFailure()
           << "the failure left devalloc_error.message without a NUL "
              "terminator (PLUGIN-6)";
  }
  if (error.text().empty()) {
    return ::testing::AssertionFailure()
           << "the failure wrote an empty message (PLUGIN-6)";
  }
  return ::testing::AssertionSuccess() << "message: " << error.text();
}

void ReleaseProbe::arm(std::span<uint8_t> src, bool reuse_after_release) {
  source = src;
  source_digest = digest(src);
  reuse = reuse_after_release;
}

ReleaseProbe::ReleaseProbe() {
  ProbeRegistry& registry = probe_registry();
  std::unique_lock lock(registry.mutex);
  registry.live.insert(this);
}

ReleaseProbe::~ReleaseProbe() {
  ProbeRegistry& registry = probe_registry();
  std::unique_lock lock(registry.mutex);
  registry.live.erase(this);
}

void ReleaseProbe::on_release(void* probe) {
  // The plugin hands back whatever it holds: only a live probe is followed.
  ProbeRegistry& registry = probe_registry();
  std::shared_lock lock(registry.mutex);
  if (registry.live.count(probe) == 0) {
    record_stray(probe);
    return;
  }
  auto& self = *static_cast<ReleaseProbe*>(probe);
  if (digest(self.source) != self.source_digest) self.source_intact = false;
  if (self.reuse) std::memset(self.source.data(), 0xa5, self.source.size());
  self.releases.fetch_add(1);
}

::testing::AssertionResult ReleasedExactlyOnce(const ReleaseProbe& probe,
                                               std::string_view when) {
  const int releases = probe.releases.load();
  if (releases == 1) return ::testing::AssertionSuccess();
  if (releases == 0) {
    return ::testing::AssertionFailure()
           << "the copy was not released " << when;
  }
  return ::testing::AssertionFailure()
         << "on_release came " << releases << " times for one copy " << when
         << ": a release of the same copy came twice, which breaks PLUGIN-14 "
            "(exactly once) and PLUGIN-21 (a host ends its load on it)";
}

void PluginTest::SetUp() {
  report_strays(take_stray_releases(),
                "between tests, after the previous test destroyed its instance");
  PluginLoader loader;
  auto [plugin, error] = loader.load(target().plugin, target().options);
  ASSERT_TRUE(plugin) << "cannot load " << target().plugin << " ("
                      << to_string(error.outcome)
                      << "): " << error.status.message();
  plugin_ = std::move(plugin);
}

void PluginTest::TearDown() {
  plugin_.reset();
  report_strays(take_stray_releases(), "during this test");
}

Result<std::vector<uint8_t>> PluginTest::read_device(uint32_t device,
                                                     uint64_t address,
                                                     uint64_t nbytes) {
  std::vector<uint8_t> bytes(nbytes);
  Status status = plugin_->copy_to_host(device, bytes.data(), address, nbytes);
  if (!status.ok()) {
    return status.with_context(call_text("copy_device_to_host", device, "src", address, nbytes));
  }
  return bytes;
}

Status PluginTest::synchronize_and_deallocate(uint32_t device, uint64_t address) {
  Status status = plugin_->synchronize(device);
  if (!status.ok()) {
    return status.with_context("synchronize(device " + std::to_string(device) + ")");
  }
  return plugin_->deallocate(device, address)
      .with_context(call_text("deallocate", device, "address", address));
}

void DeviceTest::SetUp() {
  ASSERT_NO_FATAL_FAILURE(PluginTest::SetUp());
  ASSERT_GT(device_count(), 0u) << "plugin has no devices to test";
}

}  // namespace devalloc::conformance
