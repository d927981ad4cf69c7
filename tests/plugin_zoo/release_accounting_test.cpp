// The plugin handle's release accounting (PLUGIN-14, PLUGIN-20, PLUGIN-21):
// a copy made with a completion gets its user_data from the handle, and
// its completion runs once, with the outcome, when the plugin released it
// and its call returned; a second release or one for no copy is a breach
// the handle keeps; a synchronize makes the copies it covered owed, and
// wait_released waits for them. Against the host plugin and its variants,
// without the validation layer: the accounting is always on.
#include <devalloc/plugin_loader.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace devalloc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::shared_ptr<Plugin> open_plugin(const std::string& file, const PluginOptions& options = {}) {
  auto [plugin, error] = PluginLoader().load(file, options, LayerSettings{});
  EXPECT_TRUE(plugin) << error.status.message();
  return plugin;
}

// A plugin of the zoo's folder (the host plugin's variants and the zoo's
// own), or the host plugin of this build.
std::string variant(const std::string& name) {
  if (name == "host") return std::string(DEVALLOC_PLUGIN_BUILD_DIR) + "/libdevalloc_host.so";
  return std::string(DEVALLOC_PLUGIN_ZOO_DIR) + "/libdevalloc_" + name + ".so";
}

// What the completions of a series of copies saw.
struct Outcomes {
  std::atomic<int> done{0};
  std::atomic<int> late{0};
  std::atomic<int> twice{0};
  std::atomic<int> failed{0};

  CopyCompletion completion(std::shared_ptr<int> alive = nullptr) {
    return [this, alive = std::move(alive)](CopyOutcome&& o) {
      late += o.late ? 1 : 0;
      twice += o.released_twice ? 1 : 0;
      failed += o.call.ok() ? 0 : 1;
      ++done;
    };
  }
};

class ReleaseAccounting : public ::testing::Test {
 protected:
  void copy_n(Plugin& plugin, int n, Outcomes& outcomes, const void* owner = nullptr) {
    auto base = plugin.allocate(0, 4096, 0);
    ASSERT_TRUE(base.ok()) << base.status().message();
    base_ = *base;
    for (int i = 0; i < n; ++i) {
      (void)plugin.copy_to_device_until_released(0, base_, bytes_.data(), bytes_.size(),
                                                 outcomes.completion(), owner);
    }
  }
  std::vector<uint8_t> bytes_ = std::vector<uint8_t>(4096, 7);
  uint64_t base_ = 0;
};

TEST_F(ReleaseAccounting, GivenAWellBehavedPlugin_ThenEachCompletionRunsOnceAndNothingIsABreach) {
  for (const char* async : {"false", "true"}) {
    auto plugin = open_plugin(variant("host"), {{"async", async}});
    Outcomes outcomes;
    copy_n(*plugin, 50, outcomes);
    ASSERT_TRUE(plugin->synchronize(0).ok());
    const ReleaseWait wait = plugin->wait_released(0, std::chrono::seconds(5));
    EXPECT_FALSE(wait.owed.has_value());
    EXPECT_EQ(outcomes.done, 50) << async;
    EXPECT_EQ(outcomes.twice, 0);
    EXPECT_EQ(plugin->release_breach_count(), 0u);
    ASSERT_TRUE(plugin->deallocate(0, base_).ok());
  }
}

// The completion holds what it captured until it ran, then lets it go.
TEST_F(ReleaseAccounting, GivenACompletionHoldingState_WhenItRan_ThenTheStateIsLetGo) {
  auto plugin = open_plugin(variant("host"), {{"async", "true"}});
  auto base = plugin->allocate(0, 4096, 0);
  ASSERT_TRUE(base.ok());
  auto alive = std::make_shared<int>(1);
  const std::weak_ptr<int> watch = alive;
  Outcomes outcomes;
  ASSERT_TRUE(plugin
                  ->copy_to_device_until_released(0, *base, bytes_.data(), bytes_.size(),
                                                  outcomes.completion(std::move(alive)))
                  .ok());
  ASSERT_TRUE(plugin->synchronize(0).ok());
  plugin->wait_released(0, std::chrono::seconds(5));
  EXPECT_EQ(outcomes.done, 1);
  EXPECT_TRUE(watch.expired());
  ASSERT_TRUE(plugin->deallocate(0, *base).ok());
}

// host_double_release releases every copy twice: the completion runs once,
// the second release is a breach naming the copy.
TEST_F(ReleaseAccounting, GivenAPluginReleasingTwice_ThenTheCompletionRunsOnceAndTheSecondIsABreach) {
  auto plugin = open_plugin(variant("host_double_release"), {{"async", "true"}});
  Outcomes outcomes;
  int owner = 0;
  copy_n(*plugin, 3, outcomes, &owner);
  ASSERT_TRUE(plugin->synchronize(0).ok());
  plugin->wait_released(0, std::chrono::seconds(5));
  EXPECT_EQ(outcomes.done, 3);
  // Each second release came during its call, or after: told either way.
  const uint64_t breaches = plugin->release_breach_count();
  EXPECT_EQ(static_cast<uint64_t>(outcomes.twice) + breaches, 3u);
  if (breaches != 0) {
    const auto told = plugin->release_breaches_since(0);
    ASSERT_FALSE(told.empty());
    EXPECT_TRUE(told[0].copy);
    EXPECT_EQ(told[0].dst, base_);
    EXPECT_EQ(told[0].owner, &owner) << "the breach names whose copy it was";
    EXPECT_THAT(told[0].text, AllOf(HasSubstr("plugin host_double_release broke PLUGIN-14"),
                                    HasSubstr("was released twice")));
  }
}

// user_data + 1 names no copy: a stray release, never a second release of
// the copy it is next to.
TEST_F(ReleaseAccounting, GivenAReleaseWithUserDataPlusOne_ThenItIsAStrayBreach) {
  auto plugin = open_plugin(variant("host_stray_release"));
  Outcomes outcomes;
  copy_n(*plugin, 2, outcomes);
  EXPECT_EQ(outcomes.done, 2);
  EXPECT_EQ(outcomes.twice, 0);
  ASSERT_EQ(plugin->release_breach_count(), 2u);
  const auto told = plugin->release_breaches_since(1);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_FALSE(told[0].copy);
  EXPECT_THAT(told[0].text, AllOf(HasSubstr("broke PLUGIN-14"), HasSubstr("which no copy was given")));
}

// A plugin that releases only in synchronize (PLUGIN-20 allows it): nothing
// is late, nothing owed after the synchronize.
TEST_F(ReleaseAccounting, GivenReleasesInsideSynchronize_ThenNoneIsLateOrOwed) {
  auto plugin = open_plugin(variant("host_release_on_sync"));
  Outcomes outcomes;
  copy_n(*plugin, 4, outcomes);
  EXPECT_EQ(outcomes.done, 0);
  ASSERT_TRUE(plugin->synchronize(0).ok());
  const ReleaseWait wait = plugin->wait_released(0, std::chrono::milliseconds(100));
  EXPECT_FALSE(wait.waited);
  EXPECT_FALSE(wait.owed.has_value());
  EXPECT_EQ(outcomes.done, 4);
  EXPECT_EQ(outcomes.late, 0);
}

// Many copies in flight at once (all released only at synchronize): each
// is found by its token and completed once, however many there are.
TEST_F(ReleaseAccounting, GivenTwentyThousandCopiesInFlight_ThenEachCompletesOnceAtSynchronize) {
  auto plugin = open_plugin(variant("host_release_on_sync"));
  Outcomes outcomes;
  copy_n(*plugin, 20000, outcomes);
  EXPECT_EQ(outcomes.done, 0);
  ASSERT_TRUE(plugin->synchronize(0).ok());
  EXPECT_EQ(outcomes.done, 20000);
  EXPECT_EQ(outcomes.twice, 0);
  EXPECT_EQ(plugin->release_breach_count(), 0u);
  // A second round, through the records of the first.
  copy_n(*plugin, 20000, outcomes);
  ASSERT_TRUE(plugin->synchronize(0).ok());
  EXPECT_EQ(outcomes.done, 40000);
}

// Releases that come after the synchronize covering them returned are late;
// wait_released waits for them, and only for those of the owner asked.
TEST_F(ReleaseAccounting, GivenLateReleases_ThenTheWaitWaitsForThemAndTheyAreLate) {
  // A second of margin: the synchronize returns before the releases come
  // even on a loaded machine.
  auto plugin = open_plugin(variant("host_faulty"), {{"release_late_ms", "1000"}});
  Outcomes outcomes;
  int owner = 0;
  copy_n(*plugin, 3, outcomes, &owner);
  ASSERT_TRUE(plugin->synchronize(0).ok());
  const ReleaseWait other = plugin->wait_released(0, std::chrono::seconds(5), &outcomes);
  EXPECT_FALSE(other.waited) << "another owner's copies are not waited for";
  const ReleaseWait wait = plugin->wait_released(0, std::chrono::seconds(5), &owner);
  EXPECT_TRUE(wait.waited);
  EXPECT_FALSE(wait.owed.has_value());
  EXPECT_EQ(outcomes.done, 3);
  EXPECT_GE(outcomes.late, 1);
}

// A copy never released: the wait gives up after its timeout and names the
// oldest owed copy; `stop` ends it at once.
TEST_F(ReleaseAccounting, GivenACopyNeverReleased_ThenTheWaitGivesUpNamingIt) {
  auto plugin = open_plugin(variant("zoo_never_releases"));
  Outcomes outcomes;
  copy_n(*plugin, 2, outcomes);
  ASSERT_TRUE(plugin->synchronize(0).ok());
  const auto start = std::chrono::steady_clock::now();
  const ReleaseWait wait = plugin->wait_released(0, std::chrono::milliseconds(100));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  ASSERT_TRUE(wait.owed.has_value());
  EXPECT_EQ(wait.owed->dst, base_);
  EXPECT_EQ(wait.owed->nbytes, bytes_.size());
  EXPECT_FALSE(wait.owed->call_failed);
  EXPECT_EQ(outcomes.done, 0);

  std::atomic<bool> stop{true};
  const ReleaseWait stopped = plugin->wait_released(0, std::chrono::hours(1), nullptr, &stop);
  EXPECT_TRUE(stopped.owed.has_value());
}

// A copy whose release never comes, not even when its instance is
// destroyed (zoo_stray_release): closing the handle drops its completion,
// unrun, and what the completion held with it.
TEST_F(ReleaseAccounting, GivenTheHandleClosed_ThenAPendingCompletionIsDroppedNotRun) {
  Outcomes outcomes;
  auto alive = std::make_shared<int>(1);
  const std::weak_ptr<int> watch = alive;
  {
    auto plugin = open_plugin(variant("zoo_stray_release"));
    auto base = plugin->allocate(0, 4096, 0);
    ASSERT_TRUE(base.ok());
    ASSERT_TRUE(plugin
                    ->copy_to_device_until_released(0, *base, bytes_.data(), bytes_.size(),
                                                    outcomes.completion(std::move(alive)))
                    .ok());
  }
  EXPECT_EQ(outcomes.done, 0);
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace devalloc
