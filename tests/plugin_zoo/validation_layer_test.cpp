// The validation layer (loader/, devalloc/plugin_layer.hpp) against the
// zoo: each broken plugin is caught with the number of the rule it breaks,
// the well-behaved one is not, and the caller's own breaches are named too.
#include <devalloc/plugin_layer.hpp>
#include <devalloc/plugin_loader.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace devalloc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string zoo(const std::string& variant) {
  return std::string(DEVALLOC_PLUGIN_ZOO_DIR) + "/libdevalloc_zoo_" + variant + ".so";
}

LayerSettings validating(bool check_sources = false) {
  LayerSettings s;
  s.validate = true;
  s.check_sources = check_sources;
  return s;
}

class ValidationLayer : public ::testing::Test {
 protected:
  void SetUp() override { clear_validation_breaches(); }

  std::shared_ptr<Plugin> open(const std::string& variant, LayerSettings s = validating()) {
    auto [plugin, error] = PluginLoader().load(zoo(variant), {}, s);
    EXPECT_TRUE(plugin) << error.status.message();
    return plugin;
  }

  // The rules of every breach logged so far.
  std::vector<std::string> rules() {
    std::vector<std::string> out;
    for (const auto& b : validation_breaches()) out.push_back(b.rule);
    return out;
  }
};

void count(void* counter) { ++*static_cast<std::atomic<int>*>(counter); }

// A copy through zoo_stray_release, whose release comes with a made-up
// user_data: one PLUGIN-14 breach, that plugin's alone (no layer of a
// plugin opened before is left among the live ones to share it).
void expect_a_stray_release_blamed_on_zoo_alone() {
  auto [plugin, error] = PluginLoader().load(zoo("stray_release"), {}, validating());
  ASSERT_TRUE(plugin) << error.status.message();
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  const std::vector<ValidationBreach> breaches = validation_breaches();
  ASSERT_EQ(breaches.size(), 1u);
  EXPECT_EQ(breaches[0].rule, "PLUGIN-14");
  EXPECT_THAT(breaches[0].plugin, AllOf(HasSubstr("plugin zoo ("), Not(HasSubstr("zoo_throws"))));
  EXPECT_THAT(breaches[0].detail, HasSubstr("no copy was given"));
  EXPECT_FALSE(plugin->synchronize(0).ok());
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

// Drives one of everything through a plugin: what the core does in a load.
Status exercise(Plugin& plugin, std::atomic<int>& releases) {
  auto base = plugin.allocate(0, 4096, 256);
  if (!base.ok()) return base.status();
  std::vector<uint8_t> bytes(4096, 7), back(4096);
  Status s = plugin.copy_to_device(0, *base, bytes.data(), 4096);
  if (s.ok()) s = plugin.copy_to_device_until_released(0, *base, bytes.data(), 4096, count, &releases);
  if (s.ok()) s = plugin.synchronize(0);
  if (s.ok()) s = plugin.copy_to_host(0, back.data(), *base, 4096);
  if (s.ok() && back != bytes) s = Status(StatusCode::internal, "bytes differ");
  Status freed = plugin.deallocate(0, *base);
  return s.ok() ? freed : s;
}

TEST_F(ValidationLayer, GivenWellBehavedZoo_WhenEverythingIsCalled_ThenNoBreachAndTheLayerCountsEveryCall) {
  auto plugin = open("well_behaved");
  ASSERT_TRUE(plugin);
  std::atomic<int> releases{0};
  Status s = exercise(*plugin, releases);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(releases, 1);
  const auto counters = plugin->layer_counters();
  ASSERT_TRUE(counters);
  // allocate, two copies to the device, synchronize, its release, the read back.
  EXPECT_EQ(counters->calls, 6u);
  EXPECT_EQ(counters->live_allocations, 0u);
  EXPECT_EQ(counters->pending_releases, 0u);
  EXPECT_EQ(counters->breaches, 0u);
  plugin.reset();
  EXPECT_TRUE(rules().empty());
}

// A long run: the layer remembers every pending copy but only the last
// kReleasedCopiesKept released ones, so its memory does not grow with the
// number of copies made; every release still reaches the caller once.
TEST_F(ValidationLayer, GivenManyMoreCopiesThanTheLayerRemembers_WhenReleased_ThenItsMemoryStaysBounded) {
  auto plugin = open("well_behaved");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 3);
  std::atomic<int> releases{0};
  constexpr int kCopies = static_cast<int>(kReleasedCopiesKept) * 2 + 100;
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_TRUE(
        plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
    if (i % 100 == 99) {
      ASSERT_TRUE(plugin->synchronize(0).ok());
    }
  }
  ASSERT_TRUE(plugin->synchronize(0).ok());
  EXPECT_EQ(releases, kCopies);
  const auto counters = plugin->layer_counters();
  ASSERT_TRUE(counters);
  EXPECT_EQ(counters->pending_releases, 0u);
  EXPECT_EQ(counters->remembered_copies, kReleasedCopiesKept);
  EXPECT_EQ(counters->breaches, 0u);
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
  plugin.reset();
  EXPECT_TRUE(rules().empty());
}

TEST_F(ValidationLayer, GivenNoLayer_ThenTheHandleCallsThePluginsOwnTable) {
  auto [plugin, error] = PluginLoader().load(zoo("well_behaved"));
  ASSERT_TRUE(plugin) << error.status.message();
  if (std::getenv("DEVALLOC_VALIDATE") != nullptr) GTEST_SKIP() << "DEVALLOC_VALIDATE is set";
  EXPECT_EQ(&plugin->api(), &plugin->library().api());
  EXPECT_FALSE(plugin->layer_counters());
}

TEST_F(ValidationLayer, GivenPluginWritingPastStructSize_WhenCreated_ThenRefusedWithPlugin4) {
  auto [plugin, error] = PluginLoader().load(zoo("writes_past_struct"), {}, validating());
  ASSERT_FALSE(plugin);
  EXPECT_THAT(error.status.message(),
              AllOf(HasSubstr("PLUGIN-4"), HasSubstr("get_capabilities"), HasSubstr("past the struct_size")));
}

TEST_F(ValidationLayer, GivenPluginReturningAnUnknownStatus_WhenSynchronizing_ThenPlugin5) {
  auto plugin = open("unknown_status");
  ASSERT_TRUE(plugin);
  Status s = plugin->synchronize(0);
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("PLUGIN-5"), HasSubstr("synchronize(device 0)"), HasSubstr("42")));
}

TEST_F(ValidationLayer, GivenPluginFailingWithoutMessage_WhenAllocatingTooMuch_ThenPlugin6AndTheStatusIsKept) {
  auto plugin = open("no_message");
  ASSERT_TRUE(plugin);
  auto a = plugin->allocate(0, uint64_t{4} << 30, 0);
  EXPECT_EQ(a.status().code(), StatusCode::out_of_device_memory);
  EXPECT_THAT(a.status().message(), AllOf(HasSubstr("PLUGIN-6"), HasSubstr("gave no message")));
}

TEST_F(ValidationLayer, GivenPluginThatForgetsReleasesAtDestroy_WhenDestroyed_ThenPlugin9IsReported) {
  auto plugin = open("destroy_forgets");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  static std::vector<uint8_t> bytes(64, 1);  // outlives the plugin: the release never comes
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  plugin.reset();
  EXPECT_EQ(releases, 0);
  EXPECT_EQ(rules(), std::vector<std::string>{"PLUGIN-9"});
  EXPECT_THAT(validation_breaches().at(0).text(),
              AllOf(HasSubstr("destroy"), HasSubstr("1 until-released copies were never released")));
}

TEST_F(ValidationLayer, GivenPluginWithAnUnknownDlpackDeviceType_WhenCreated_ThenRefusedWithPlugin10) {
  auto [plugin, error] = PluginLoader().load(zoo("bad_device_type"), {}, validating());
  ASSERT_FALSE(plugin);
  EXPECT_THAT(error.status.message(), AllOf(HasSubstr("PLUGIN-10"), HasSubstr("DLPack device type 99")));
}

TEST_F(ValidationLayer, GivenPluginReturningMisalignedAddresses_WhenAllocating_ThenPlugin11AndNothingLeaks) {
  auto plugin = open("misaligned");
  ASSERT_TRUE(plugin);
  auto a = plugin->allocate(0, 64, 256);
  EXPECT_EQ(a.status().code(), StatusCode::internal);
  EXPECT_THAT(a.status().message(), AllOf(HasSubstr("PLUGIN-11"), HasSubstr("not aligned to 256")));
  EXPECT_EQ(plugin->layer_counters()->live_allocations, 0u);
}

TEST_F(ValidationLayer, GivenAnAllocationEndingExactlyAt2To64_WhenUsed_ThenNoBreach) {
  // Slot 0 of top_addresses starts at 2^64 - 1 MiB: 1 MiB ends exactly at
  // 2^64, the last byte addressable, which is no wrap and no overlap.
  auto plugin = open("top_addresses");
  ASSERT_TRUE(plugin);
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  auto top = plugin->allocate(0, kMiB, 256);
  ASSERT_TRUE(top.ok()) << top.status().message();
  EXPECT_EQ(*top, uint64_t{0} - kMiB);
  auto below = plugin->allocate(0, 4096, 256);  // slot 1, right under it
  ASSERT_TRUE(below.ok()) << below.status().message();
  std::vector<uint8_t> bytes(64, 9), back(64);
  ASSERT_TRUE(plugin->copy_to_device(0, *top + kMiB - 64, bytes.data(), 64).ok());
  ASSERT_TRUE(plugin->copy_to_host(0, back.data(), *top + kMiB - 64, 64).ok());
  EXPECT_EQ(back, bytes);
  EXPECT_TRUE(plugin->deallocate(0, *top).ok());
  EXPECT_TRUE(plugin->deallocate(0, *below).ok());
  EXPECT_TRUE(rules().empty()) << validation_breaches().at(0).text();
}

TEST_F(ValidationLayer, GivenAnAllocationRunningPast2To64_WhenAllocating_ThenPlugin11SaysSoAndNothingLeaks) {
  auto plugin = open("top_addresses");
  ASSERT_TRUE(plugin);
  auto past = plugin->allocate(0, 2 << 20, 256);  // slot 0: starts 1 MiB below 2^64
  EXPECT_EQ(past.status().code(), StatusCode::internal);
  EXPECT_THAT(past.status().message(),
              AllOf(HasSubstr("PLUGIN-11"), HasSubstr("0xfffffffffff00000"),
                    HasSubstr("2097152 bytes run past the end of the address space")));
  EXPECT_THAT(past.status().message(), Not(HasSubstr("overlap")));
  EXPECT_EQ(plugin->layer_counters()->live_allocations, 0u);
}

TEST_F(ValidationLayer, GivenPluginAcceptingAnyFree_WhenFreeingTwice_ThenPlugin12) {
  auto plugin = open("accepts_bad_free");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
  Status again = plugin->deallocate(0, *base);
  EXPECT_THAT(again.message(), AllOf(HasSubstr("PLUGIN-12"), HasSubstr("freed already")));
}

TEST_F(ValidationLayer, GivenPluginReleasingTwice_WhenSynchronizing_ThenPlugin14AndTheCallerSeesOneRelease) {
  auto plugin = open("double_release");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  Status s = plugin->synchronize(0);
  EXPECT_EQ(releases, 1);
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("PLUGIN-14"), HasSubstr("a second time"),
                                 HasSubstr("copy_host_to_device(device 0")));
}

// One ledger: a copy with the caller's own on_release is accounted by the
// handle's release tracker too (the layer makes it one of the tracker's),
// so the handle names the second release the layer reports.
TEST_F(ValidationLayer, GivenACallersOwnRelease_WhenThePluginReleasesItTwice_ThenTheHandlesAccountingNamesItToo) {
  auto plugin = open("double_release");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  EXPECT_EQ(plugin->layer_counters()->pending_releases, 0u);
  EXPECT_FALSE(plugin->synchronize(0).ok());
  EXPECT_EQ(releases, 1);
  ASSERT_EQ(plugin->release_breach_count(), 1u);
  const std::vector<ReleaseBreach> told = plugin->release_breaches_since(0);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_TRUE(told[0].copy);
  EXPECT_EQ(told[0].dst, *base);
  EXPECT_THAT(told[0].text, HasSubstr("was released twice"));
  EXPECT_EQ(rules(), std::vector<std::string>{"PLUGIN-14"});
}

// A copy whose call threw (PLUGIN-7) is a failed call, not one still
// running: the layer's accounting waits for its release like any other, so
// the next synchronize names the release that never came.
TEST_F(ValidationLayer, GivenACopyWhoseCallThrew_WhenSynchronizing_ThenItsMissingReleaseIsPlugin20) {
  auto plugin = open("throws");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(13, 1);  // the zoo throws on a copy of 13 bytes
  std::atomic<int> releases{0};
  const Status copy =
      plugin->copy_to_device_until_released(0, *base, bytes.data(), 13, count, &releases);
  ASSERT_FALSE(copy.ok());
  EXPECT_THAT(copy.message(), HasSubstr("PLUGIN-7"));
  const Status s = plugin->synchronize(0);
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("PLUGIN-20"),
                                 HasSubstr("1 copies issued before it were not released")));
  EXPECT_EQ(releases, 0);
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

// Two breaches found in callbacks before one synchronize: the caller's
// status carries both, not only the first.
TEST_F(ValidationLayer, GivenTwoCopiesReleasedTwice_WhenSynchronizing_ThenTheStatusNamesBoth) {
  auto plugin = open("double_release");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 128, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  ASSERT_TRUE(
      plugin->copy_to_device_until_released(0, *base + 64, bytes.data(), 64, count, &releases).ok());
  Status s = plugin->synchronize(0);
  EXPECT_EQ(releases, 2);
  EXPECT_EQ(s.code(), StatusCode::internal);
  const std::string& m = s.message();
  const size_t first = m.find("a second time");
  ASSERT_NE(first, std::string::npos) << m;
  EXPECT_NE(m.find("a second time", first + 1), std::string::npos) << m;
  EXPECT_NE(m.find("; then "), std::string::npos) << m;
}

TEST_F(ValidationLayer, GivenPluginAcceptingCopiesOutsideAllocations_WhenCopyingPastTheEnd_ThenPlugin15) {
  auto plugin = open("accepts_bad_copy");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(128, 1);
  Status s = plugin->copy_to_device(0, *base, bytes.data(), 128);
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("PLUGIN-15"), HasSubstr("nbytes 128"), HasSubstr("outside")));
}

TEST_F(ValidationLayer, GivenPluginThatNeverReleasesBeforeDestroy_WhenSynchronizing_ThenPlugin20InsteadOfAHang) {
  auto plugin = open("never_releases");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  Status s = plugin->synchronize(0);
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("PLUGIN-20"), HasSubstr("1 copies issued before it were not released")));
  EXPECT_EQ(plugin->layer_counters()->pending_releases, 1u);
  plugin.reset();  // destroy releases it after all
  EXPECT_EQ(releases, 1);
}

// docs/reliability.md: each breach is printed (and logged) once. A copy whose
// release is still missing fails every synchronize, but is one breach.
TEST_F(ValidationLayer, GivenACopyNeverReleased_WhenSynchronizingAgainAndAgain_ThenItsBreachIsLoggedOnce) {
  auto plugin = open("never_releases");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 128, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(128, 1);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  for (int i = 0; i < 3; ++i) {
    Status s = plugin->synchronize(0);
    EXPECT_EQ(s.code(), StatusCode::internal) << "synchronize " << i;
    EXPECT_THAT(s.message(), HasSubstr("PLUGIN-20")) << "synchronize " << i;
  }
  EXPECT_THAT(rules(), ::testing::ElementsAre("PLUGIN-20"));
  // A second copy is a breach of its own: logged once more, naming it alone.
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base + 64, bytes.data(), 64, count, &releases).ok());
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(plugin->synchronize(0).ok());
  const std::vector<ValidationBreach> breaches = validation_breaches();
  ASSERT_EQ(breaches.size(), 2u);
  EXPECT_EQ(breaches[1].rule, "PLUGIN-20");
  std::ostringstream second_dst;
  second_dst << "dst 0x" << std::hex << *base + 64 << ",";
  EXPECT_THAT(breaches[1].detail, AllOf(HasSubstr("1 copies issued before it"),
                                        HasSubstr(second_dst.str()), HasSubstr("1 more were reported")));
  plugin.reset();
  EXPECT_EQ(releases, 2);
}

TEST_F(ValidationLayer, GivenPluginReleasingWithAMadeUpUserData_ThenPlugin14AndTheReleaseIsNotFollowed) {
  auto plugin = open("stray_release");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  std::atomic<int> releases{0};
  // The zoo calls on_release with an address no copy was given: the
  // handle's tracker must look it up, not follow it as one of its copies.
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  EXPECT_EQ(releases, 0);
  const std::vector<ValidationBreach> breaches = validation_breaches();
  ASSERT_EQ(breaches.size(), 1u);
  EXPECT_EQ(breaches[0].rule, "PLUGIN-14");
  EXPECT_THAT(breaches[0].detail, HasSubstr("no copy was given"));
  // Reported again on the next call on the device, with PLUGIN-20 for the
  // copy whose own release never came.
  Status s = plugin->synchronize(0);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(rules(), ::testing::Contains("PLUGIN-20"));
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

// A breach seen in a callback is reported by the next synchronize of the
// device, also when that synchronize finds a release missing: the stray
// release is why this copy's own never came, and the status says both.
TEST_F(ValidationLayer, GivenAStrayReleaseAndACopyNeverReleased_WhenSynchronizing_ThenTheStatusNamesBothBreaches) {
  auto plugin = open("stray_release");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  Status s = plugin->synchronize(0);
  EXPECT_EQ(s.code(), StatusCode::internal);
  // In the order found: the stray release at the copy, then the missing one.
  EXPECT_THAT(s.message(), AllOf(HasSubstr("validation: PLUGIN-14: on_release(0x"),
                                 HasSubstr("no copy was given"),
                                 HasSubstr("; then PLUGIN-20: synchronize(device 0): returned "
                                           "while 1 copies issued before it were not released")));
  // Reported once: the next synchronize names the missing release only.
  s = plugin->synchronize(0);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), Not(HasSubstr("no copy was given")));
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

// PLUGIN-7: an exception out of the plugin's destroy is dropped, under the
// layer too, and the layer still ends. One left among the live layers
// would share the next stray release: logged under its plugin's name as
// well, and owed to no one.
TEST_F(ValidationLayer, GivenAPluginWhoseDestroyThrew_WhenAnotherReleasesWithAMadeUpUserData_ThenTheBreachIsThatPluginsAlone) {
  {
    auto throwing = open("throws");
    ASSERT_TRUE(throwing);
  }  // its destroy throws
  expect_a_stray_release_blamed_on_zoo_alone();
}

// PLUGIN-7 while the layer is put around a plugin: the layer asks the
// plugin for its device count, and that call throws. The open fails naming
// the call and the rule, nothing escapes, and no layer is left among the
// live ones (a later stray release is that plugin's breach alone).
TEST_F(ValidationLayer, GivenAPluginWhoseDeviceCountThrows_WhenOpenedUnderTheLayer_ThenTheOpenFailsSayingSoAndNoLayerIsLeft) {
  auto [throwing, error] =
      PluginLoader().load(zoo("throws"), {{"throw_in", "get_device_count"}}, validating());
  EXPECT_FALSE(throwing);
  EXPECT_THAT(error.status.message(),
              AllOf(HasSubstr("get_device_count threw a C++ exception across the C ABI (PLUGIN-7)"),
                    HasSubstr("get_device_count exploded")));
  expect_a_stray_release_blamed_on_zoo_alone();
}

// The caller's side of the rules, checked by the same layer.

struct Reentrant {
  Plugin* plugin;
  Status inner;
};

void call_back_in(void* r) {
  auto* self = static_cast<Reentrant*>(r);
  self->inner = self->plugin->synchronize(0);
}

TEST_F(ValidationLayer, GivenACallerWhoseReleaseCallsIntoThePlugin_ThenThatCallFailsWithPlugin14) {
  auto plugin = open("well_behaved");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  Reentrant r{plugin.get(), Status()};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, call_back_in, &r).ok());
  ASSERT_TRUE(plugin->synchronize(0).ok());
  EXPECT_THAT(r.inner.message(), AllOf(HasSubstr("PLUGIN-14"), HasSubstr("inside an on_release")));
}

TEST_F(ValidationLayer, GivenSourceChecksAndACallerThatChangesTheSourceBeforeRelease_ThenPlugin14NamesTheCaller) {
  auto plugin = open("well_behaved", validating(/*check_sources=*/true));
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 1);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  bytes[10] = 2;  // too early: the release has not come
  Status s = plugin->synchronize(0);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("PLUGIN-14"), HasSubstr("caller changed the source")));
}

TEST_F(ValidationLayer, GivenSourceChecksAndACallerThatWaitsForTheRelease_ThenNoBreach) {
  auto plugin = open("well_behaved", validating(/*check_sources=*/true));
  ASSERT_TRUE(plugin);
  std::atomic<int> releases{0};
  EXPECT_TRUE(exercise(*plugin, releases).ok());
  EXPECT_TRUE(rules().empty());
}

TEST_F(ValidationLayer, GivenValidationOff_WhenABrokenPluginAcceptsABadCopy_ThenNothingIsReported) {
  auto [plugin, error] = PluginLoader().load(zoo("accepts_bad_copy"), {}, LayerSettings{});
  ASSERT_TRUE(plugin) << error.status.message();
  if (std::getenv("DEVALLOC_VALIDATE") != nullptr) GTEST_SKIP() << "DEVALLOC_VALIDATE is set";
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(128, 1);
  EXPECT_TRUE(plugin->copy_to_device(0, *base, bytes.data(), 128).ok());
  EXPECT_TRUE(rules().empty());
}

// ---------------------------------------------------------------------------
// The source check (validate = "sources"): a plugin that releases a source
// before it has read it (PLUGIN-14) is caught by reading the destination
// back at the next synchronize.

namespace sources {

std::string host_variant(const std::string& name) {
  return std::string(DEVALLOC_PLUGIN_ZOO_DIR) + "/libdevalloc_" + name + ".so";
}
std::string host_plugin() { return std::string(DEVALLOC_PLUGIN_BUILD_DIR) + "/libdevalloc_host.so"; }

std::vector<uint8_t> pattern(size_t nbytes) {
  std::vector<uint8_t> bytes(nbytes);
  for (size_t i = 0; i < nbytes; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  return bytes;
}

// A caller that refills its buffer as soon as the release comes, as the
// core's staging ring does.
struct Refilling {
  std::span<uint8_t> source;
  std::atomic<int> releases{0};
};
void refill(void* r) {
  auto* self = static_cast<Refilling*>(r);
  std::memset(self->source.data(), 0xee, self->source.size());
  ++self->releases;
}

// One until-released copy of `bytes` from the plugin's own staging memory
// (as the core stages), then synchronize; the staging buffer is freed
// after.
Status staged_copy_then_synchronize(Plugin& plugin, uint64_t dst, const std::vector<uint8_t>& bytes,
                                    std::vector<uint8_t>* staging_after = nullptr) {
  auto staging = plugin.allocate_host(bytes.size());
  if (!staging.ok()) return staging.status();
  std::memcpy(*staging, bytes.data(), bytes.size());
  std::atomic<int> releases{0};
  Status s = plugin.copy_to_device_until_released(0, dst, *staging, bytes.size(), count, &releases);
  if (s.ok()) s = plugin.synchronize(0);
  if (staging_after != nullptr) {
    const auto* p = static_cast<const uint8_t*>(*staging);
    staging_after->assign(p, p + bytes.size());
  }
  Status freed = plugin.free_host(*staging);
  return s.ok() ? freed : s;
}

std::string hex(uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

TEST_F(ValidationLayer, GivenSourceChecksAndAPluginThatReleasesBeforeReading_WhenSynchronizing_ThenPlugin14NamesThePluginAndTheCopy) {
  auto [plugin, error] =
      PluginLoader().load(host_variant("host_early_release"), {}, validating(/*check_sources=*/true));
  ASSERT_TRUE(plugin) << error.status.message();
  auto base = plugin->allocate(0, 4096, 0);
  ASSERT_TRUE(base.ok());
  Status s = staged_copy_then_synchronize(*plugin, *base, pattern(4096));
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("PLUGIN-14"), HasSubstr("before reading it"),
                    HasSubstr("written into src after its release"),
                    HasSubstr("copy_host_to_device(device 0, dst " + hex(*base) + ","),
                    HasSubstr("nbytes 4096, until released")));
  const std::vector<ValidationBreach> breaches = validation_breaches();
  ASSERT_EQ(breaches.size(), 1u);
  EXPECT_EQ(breaches[0].rule, "PLUGIN-14");
  EXPECT_THAT(breaches[0].plugin, HasSubstr("plugin host_early_release ("));
  EXPECT_EQ(plugin->layer_counters()->source_checks_done, 1u);
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

// The same plugin without the source check: nothing is reported, and the
// device holds what the caller wrote into its buffer after the release.
// This is why the check exists.
TEST_F(ValidationLayer, GivenNoSourceCheckAndAPluginThatReleasesBeforeReading_WhenTheCallerRefillsItsBuffer_ThenTheWrongBytesLandUnreported) {
  auto [plugin, error] = PluginLoader().load(host_variant("host_early_release"), {}, validating());
  ASSERT_TRUE(plugin) << error.status.message();
  if (std::getenv("DEVALLOC_VALIDATE") != nullptr) GTEST_SKIP() << "DEVALLOC_VALIDATE is set";
  auto base = plugin->allocate(0, 4096, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes = pattern(4096);
  Refilling caller{bytes};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 4096, refill, &caller).ok());
  ASSERT_TRUE(plugin->synchronize(0).ok());
  std::vector<uint8_t> back(4096);
  ASSERT_TRUE(plugin->copy_to_host(0, back.data(), *base, 4096).ok());
  EXPECT_NE(back, pattern(4096));
  EXPECT_TRUE(rules().empty());
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

// A source outside staging memory is never overwritten by the layer (it
// may be read-only, or read again by the caller); the read-back still
// catches the late read once the caller has reused the buffer.
TEST_F(ValidationLayer, GivenSourceChecksAndAPluginThatReleasesBeforeReading_WhenTheCallerRefillsItsOwnBuffer_ThenPlugin14SaysTheDeviceHoldsOtherBytes) {
  auto [plugin, error] =
      PluginLoader().load(host_variant("host_early_release"), {}, validating(/*check_sources=*/true));
  ASSERT_TRUE(plugin) << error.status.message();
  auto base = plugin->allocate(0, 4096, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes = pattern(4096);
  Refilling caller{bytes};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 4096, refill, &caller).ok());
  Status s = plugin->synchronize(0);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("PLUGIN-14"), HasSubstr("other bytes than src held"),
                                 HasSubstr("dst " + hex(*base))));
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

// The host plugin reads each source before it releases it: no breach, the
// bytes land, and the released staging memory holds the layer's poison.
TEST_F(ValidationLayer, GivenSourceChecksAndTheHostPlugin_WhenAStagedCopyIsSynchronized_ThenNoBreachAndTheReleasedStagingWasOverwritten) {
  for (const char* async : {"false", "true"}) {
    clear_validation_breaches();
    auto [plugin, error] =
        PluginLoader().load(host_plugin(), {{"async", async}}, validating(/*check_sources=*/true));
    ASSERT_TRUE(plugin) << error.status.message();
    auto base = plugin->allocate(0, 4096, 0);
    ASSERT_TRUE(base.ok());
    std::vector<uint8_t> staging_after;
    Status s = staged_copy_then_synchronize(*plugin, *base, pattern(4096), &staging_after);
    EXPECT_TRUE(s.ok()) << "async " << async << ": " << s.message();
    std::vector<uint8_t> back(4096);
    ASSERT_TRUE(plugin->copy_to_host(0, back.data(), *base, 4096).ok());
    EXPECT_EQ(back, pattern(4096)) << "async " << async;
    EXPECT_NE(staging_after, pattern(4096)) << "async " << async << ": not overwritten";
    EXPECT_EQ(plugin->layer_counters()->source_checks_done, 1u) << "async " << async;
    EXPECT_TRUE(rules().empty()) << "async " << async;
    ASSERT_TRUE(plugin->deallocate(0, *base).ok());
  }
}

// Many copies before one synchronize: the layer keeps at most
// kLayerSourceChecksKept checks and reads the oldest back early.
TEST_F(ValidationLayer, GivenSourceChecksAndMoreCopiesThanItKeeps_WhenNoSynchronizeComes_ThenItChecksEarlyAndItsMemoryStaysBounded) {
  auto [plugin, error] = PluginLoader().load(host_plugin(), {}, validating(/*check_sources=*/true));
  ASSERT_TRUE(plugin) << error.status.message();
  constexpr uint64_t kCopies = kLayerSourceChecksKept + 10;
  auto base = plugin->allocate(0, kCopies * 64, 0);
  ASSERT_TRUE(base.ok());
  const std::vector<uint8_t> bytes = pattern(64);
  std::atomic<int> releases{0};
  uint64_t most_pending = 0;
  for (uint64_t i = 0; i < kCopies; ++i) {
    ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base + i * 64, bytes.data(), 64, count,
                                                      &releases)
                    .ok());
    most_pending = std::max(most_pending, plugin->layer_counters()->pending_source_checks);
  }
  EXPECT_LE(most_pending, kLayerSourceChecksKept);
  EXPECT_GE(plugin->layer_counters()->source_checks_done, kLayerSourceChecksKept);
  ASSERT_TRUE(plugin->synchronize(0).ok());
  EXPECT_EQ(plugin->layer_counters()->source_checks_done, kCopies);
  EXPECT_EQ(plugin->layer_counters()->pending_source_checks, 0u);
  EXPECT_TRUE(rules().empty());
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

}  // namespace sources

// ---------------------------------------------------------------------------
// The layer says that it is on, once per process and plugin.

TEST_F(ValidationLayer, GivenValidation_WhenThePluginIsOpenedTwice_ThenTheLayerAnnouncesItselfOnceWithItsChecks) {
  // Checks no other test of this program asks for, so that the line is
  // this test's to print.
  LayerSettings s = validating(/*check_sources=*/true);
  s.faults.device_bytes = uint64_t{1} << 40;
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 2; ++i) {
    auto [plugin, error] = PluginLoader().load(zoo("well_behaved"), {}, s);
    EXPECT_TRUE(plugin) << error.status.message();
  }
  const std::string printed = ::testing::internal::GetCapturedStderr();
  const std::string line = "devalloc: validation layer on for plugin zoo (";
  ASSERT_THAT(printed, HasSubstr(line));
  EXPECT_EQ(printed.find(line), printed.rfind(line)) << printed;
  EXPECT_THAT(printed, HasSubstr("libdevalloc_zoo_well_behaved.so); checks: calls, releases, "
                                 "sources, faults\n"));
}

// Fault injection, the one place plain failures are injected at the ABI.

LayerSettings injecting(const FaultInjection& faults) {
  LayerSettings s;
  s.faults = faults;
  return s;
}

TEST_F(ValidationLayer, GivenFailAllocateAt2_ThenOnlyTheSecondAllocationOfMemoryFailsAndNeverReachesThePlugin) {
  auto plugin = open("well_behaved", injecting({.fail_allocate_at = 2}));
  ASSERT_TRUE(plugin);
  auto a = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(plugin->allocate(0, 0, 0).ok()) << "0 bytes: not counted";
  auto b = plugin->allocate(0, 64, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::out_of_device_memory);
  EXPECT_THAT(b.status().message(),
              HasSubstr("fault injection (fail_allocate_at = 2): allocate(device 0, nbytes 64"));
  auto c = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(c.ok());
  const auto counters = plugin->layer_counters();
  EXPECT_EQ(counters->faults_injected, 1u);
  EXPECT_EQ(counters->live_allocations, 2u) << "the failed one never reached the plugin";
  ASSERT_TRUE(plugin->deallocate(0, *a).ok());
  ASSERT_TRUE(plugin->deallocate(0, *c).ok());
}

TEST_F(ValidationLayer, GivenFailCopyAt2_ThenTheSecondCopyFailsReleasedOnceAndTheNextSucceeds) {
  auto plugin = open("well_behaved", injecting({.fail_copy_at = 2}));
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 5);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device(0, *base, bytes.data(), 64).ok());
  const Status failed =
      plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases);
  EXPECT_EQ(failed.code(), StatusCode::device_error);
  EXPECT_THAT(failed.message(), HasSubstr("fault injection (fail_copy_at = 2)"));
  EXPECT_EQ(releases, 1) << "a failed copy is released too (PLUGIN-14)";
  ASSERT_TRUE(
      plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  ASSERT_TRUE(plugin->synchronize(0).ok());
  EXPECT_EQ(releases, 2);
  EXPECT_EQ(plugin->release_breach_count(), 0u);
  EXPECT_EQ(plugin->layer_counters()->faults_injected, 1u);
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

TEST_F(ValidationLayer, GivenFailSynchronize_ThenEverySynchronizeFailsAfterThePluginsRan) {
  auto plugin = open("well_behaved", injecting({.fail_synchronize = true}));
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 5);
  std::atomic<int> releases{0};
  ASSERT_TRUE(plugin->copy_to_device_until_released(0, *base, bytes.data(), 64, count, &releases).ok());
  for (int i = 0; i < 2; ++i) {
    const Status s = plugin->synchronize(0);
    EXPECT_EQ(s.code(), StatusCode::device_error);
    EXPECT_THAT(s.message(), HasSubstr("fault injection (fail_synchronize): synchronize(device 0)"));
  }
  EXPECT_EQ(releases, 1) << "the plugin's synchronize ran";
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

TEST(LayerSettingsTest, GivenEachSetting_ThenCheckNamesSayWhatIsOn) {
  EXPECT_THAT(LayerSettings{}.check_names(), ::testing::IsEmpty());
  EXPECT_THAT(validating().check_names(), ::testing::ElementsAre("calls", "releases"));
  EXPECT_THAT(validating(true).check_names(),
              ::testing::ElementsAre("calls", "releases", "sources"));
  LayerSettings faults_only;
  faults_only.faults.fail_call = 3;
  EXPECT_THAT(faults_only.check_names(), ::testing::ElementsAre("faults"));
}

// ---------------------------------------------------------------------------
// ABI 1.2 through the layer.

TEST_F(ValidationLayer, GivenPluginsOfEachMinor_WhenWrapped_ThenTheLayersTableIsAsLargeAsTheNegotiatedMinorsAndNoLarger) {
  auto v1_0 = open("v1_0_host_addressable");
  ASSERT_TRUE(v1_0);
  EXPECT_EQ(v1_0->api().struct_size, DEVALLOC_PLUGIN_API_V1_MIN_SIZE);
  auto v1_2 = open("well_behaved");
  ASSERT_TRUE(v1_2);
  ASSERT_EQ(v1_2->abi_minor(), 2u);
  EXPECT_EQ(v1_2->api().struct_size, DEVALLOC_PLUGIN_API_V1_2_SIZE);
  EXPECT_EQ(v1_2->api().map_to_host, nullptr) << "the plugin maps nothing";
  auto mapping = open("maps_carelessly");
  ASSERT_TRUE(mapping);
  EXPECT_NE(mapping->api().map_to_host, nullptr);
  EXPECT_NE(&mapping->api(), &mapping->library().api()) << "not through the layer";
  EXPECT_TRUE(mapping->capabilities().host_mappable);
}

TEST_F(ValidationLayer, GivenAMappingPlugin_WhenARangeIsMappedWrittenAndUnmapped_ThenNoBreachAndTheBytesLand) {
  auto plugin = open("maps_carelessly");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 4096, 0);
  ASSERT_TRUE(base.ok());
  auto host = plugin->map_to_host(0, *base + 1024, 1024);
  ASSERT_TRUE(host.ok()) << host.status().message();
  std::memset(*host, 0x42, 1024);
  ASSERT_TRUE(plugin->unmap_from_host(0, *host).ok());
  std::vector<uint8_t> back(1024);
  ASSERT_TRUE(plugin->copy_to_host(0, back.data(), *base + 1024, 1024).ok());
  EXPECT_EQ(back, std::vector<uint8_t>(1024, 0x42));
  // A range the plugin refuses is its own answer, not a breach.
  EXPECT_EQ(plugin->map_to_host(0, *base + 4000, 1024).status().code(),
            StatusCode::invalid_argument);
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
  EXPECT_TRUE(rules().empty());
}

TEST_F(ValidationLayer, GivenAPluginThatUnmapsAnythingSaidToIt_WhenUnmappingAPointerNeverMapped_ThenPlugin22) {
  auto plugin = open("maps_carelessly");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 4096, 0);
  ASSERT_TRUE(base.ok());
  auto host = plugin->map_to_host(0, *base, 4096);
  ASSERT_TRUE(host.ok());
  ASSERT_TRUE(plugin->unmap_from_host(0, *host).ok());
  Status again = plugin->unmap_from_host(0, *host);
  EXPECT_EQ(again.code(), StatusCode::internal);
  EXPECT_THAT(again.message(), AllOf(HasSubstr("PLUGIN-22"), HasSubstr("unmap_from_host(device 0"),
                                     HasSubstr("no live mapping")));
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

TEST_F(ValidationLayer, GivenACallerThatCopiesIntoAMappedRange_WhenSynchronizing_ThenPlugin22NamesTheCopy) {
  auto plugin = open("maps_carelessly");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 4096, 0);
  ASSERT_TRUE(base.ok());
  auto host = plugin->map_to_host(0, *base, 1024);
  ASSERT_TRUE(host.ok());
  std::vector<uint8_t> bytes(64, 1);
  // After the mapped range: allowed.
  ASSERT_TRUE(plugin->copy_to_device(0, *base + 1024, bytes.data(), 64).ok());
  ASSERT_TRUE(plugin->synchronize(0).ok());
  ASSERT_TRUE(plugin->copy_to_device(0, *base + 1000, bytes.data(), 64).ok());
  Status s = plugin->synchronize(0);
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("PLUGIN-22"), HasSubstr("mapped into the host"),
                                 HasSubstr("nbytes 64, during call")));
  ASSERT_TRUE(plugin->unmap_from_host(0, *host).ok());
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

TEST_F(ValidationLayer, GivenAPluginWhoseCopySourceAlignmentIsNoPowerOfTwo_WhenOpened_ThenPlugin23) {
  auto [plugin, error] = PluginLoader().load(zoo("odd_src_alignment"), {}, validating());
  ASSERT_FALSE(plugin);
  EXPECT_THAT(error.status.message(),
              AllOf(HasSubstr("PLUGIN-23"), HasSubstr("copy_src_alignment 24")));
  // Without the layer the loader reads it as no constraint.
  if (std::getenv("DEVALLOC_VALIDATE") != nullptr) return;
  auto [unchecked, unchecked_error] = PluginLoader().load(zoo("odd_src_alignment"));
  ASSERT_TRUE(unchecked) << unchecked_error.status.message();
  EXPECT_EQ(unchecked->capabilities().copy_src_alignment, 0u);
}

}  // namespace
}  // namespace devalloc

namespace devalloc {
namespace {

// DEVALLOC_VALIDATE: the words for "off" turn nothing on; a typo of the
// switch turns the layer on rather than off, and says so (once a process).
TEST(ValidationLayerEnvironment, GivenEachSpellingOfDevallocValidate_ThenTheLayerIsOnOnlyForTheOnes) {
  const char* saved = std::getenv("DEVALLOC_VALIDATE");
  const std::string restore = saved != nullptr ? saved : "";
  const auto settings_for = [](const char* value) {
    ::setenv("DEVALLOC_VALIDATE", value, 1);
    return LayerSettings{}.with_environment();
  };
  for (const char* off : {"", "0", "false", "no", "off", "OFF", "False"}) {
    EXPECT_FALSE(settings_for(off).active()) << "DEVALLOC_VALIDATE=\"" << off << "\"";
  }
  for (const char* on : {"1", "true", "yes", "on", "ON"}) {
    const LayerSettings s = settings_for(on);
    EXPECT_TRUE(s.validate) << "DEVALLOC_VALIDATE=\"" << on << "\"";
    EXPECT_FALSE(s.check_sources) << "DEVALLOC_VALIDATE=\"" << on << "\"";
  }
  EXPECT_TRUE(settings_for("sources").check_sources);
  ::testing::internal::CaptureStderr();
  const LayerSettings typo = settings_for("ture");
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(typo.validate);
  EXPECT_THAT(said, HasSubstr("DEVALLOC_VALIDATE=\"ture\" is none of"));
  if (saved != nullptr) {
    ::setenv("DEVALLOC_VALIDATE", restore.c_str(), 1);
  } else {
    ::unsetenv("DEVALLOC_VALIDATE");
  }
}

}  // namespace
}  // namespace devalloc
