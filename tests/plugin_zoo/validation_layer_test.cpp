// The validation layer (loader/, devalloc/plugin_layer.hpp) against the
// zoo: each broken plugin is caught with the number of the rule it breaks,
// the well-behaved one is not, and the caller's own breaches are named too.
#include <devalloc/plugin_layer.hpp>
#include <devalloc/plugin_loader.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
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
// kLayerReleasedKept released ones, so its memory does not grow with the
// number of copies made; every release still reaches the caller once.
TEST_F(ValidationLayer, GivenManyMoreCopiesThanTheLayerRemembers_WhenReleased_ThenItsMemoryStaysBounded) {
  auto plugin = open("well_behaved");
  ASSERT_TRUE(plugin);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok());
  std::vector<uint8_t> bytes(64, 3);
  std::atomic<int> releases{0};
  constexpr int kCopies = static_cast<int>(kLayerReleasedKept) * 2 + 100;
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
  EXPECT_EQ(counters->remembered_copies, kLayerReleasedKept);
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
  // The zoo calls on_release with an address no copy was given: the layer
  // must look it up, not follow it as one of its tickets.
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

}  // namespace
}  // namespace devalloc
