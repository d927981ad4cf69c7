// Finding plugins by name and by path, and the lifetime of what was loaded.
#include <devalloc/plugin_loader.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "scratch_dir.hpp"

namespace devalloc {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

const fs::path kPlugins = DEVALLOC_PLUGIN_BUILD_DIR;
const fs::path kHost = kPlugins / "libdevalloc_host.so";

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

class ScopedCwd {
 public:
  explicit ScopedCwd(const fs::path& dir) : old_(fs::current_path()) {
    fs::current_path(dir);
  }
  ~ScopedCwd() { fs::current_path(old_); }

 private:
  fs::path old_;
};

bool library_is_loaded(const fs::path& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

TEST(PluginLoader, GivenBinaryInBuildTree_WhenAskingInstalledDir_ThenItIsThePluginOutputDir) {
  EXPECT_EQ(fs::weakly_canonical(PluginLoader::installed_plugin_dir()),
            fs::weakly_canonical(kPlugins));
}

TEST(PluginLoader, GivenName_WhenResolving_ThenFoundInInstalledDir) {
  ScopedEnv env("DEVALLOC_PLUGIN_PATH", "");
  PluginLoader loader;
  auto [path, error] = loader.resolve("host");
  EXPECT_TRUE(error.status.ok()) << error.status.message();
  EXPECT_EQ(fs::weakly_canonical(path), fs::weakly_canonical(kHost));
}

TEST(PluginLoader, GivenEverySource_WhenBuildingSearchPath_ThenCommandLineThenConfigThenEnvThenFallbackThenInstalled) {
  ScopedEnv env("DEVALLOC_PLUGIN_PATH", "/tmp/devalloc-a::/tmp/devalloc-b");
  PluginSearchOptions options;
  options.command_line_dirs = {"/tmp/devalloc-cli"};
  options.config_dirs = {"/tmp/devalloc-config"};
  options.fallback_dirs = {"/tmp/devalloc-package"};
  PluginLoader loader(options);
  const auto& dirs = loader.search_dirs();
  ASSERT_EQ(dirs.size(), 6u);
  EXPECT_EQ(dirs[0].dir, fs::path("/tmp/devalloc-cli"));
  EXPECT_EQ(dirs[0].source, PluginPathSource::command_line);
  EXPECT_EQ(dirs[1].dir, fs::path("/tmp/devalloc-config"));
  EXPECT_EQ(dirs[1].source, PluginPathSource::config);
  EXPECT_EQ(dirs[2].dir, fs::path("/tmp/devalloc-a"));
  EXPECT_EQ(dirs[2].source, PluginPathSource::environment);
  EXPECT_EQ(dirs[3].dir, fs::path("/tmp/devalloc-b"));
  // A program's own folder: the user's folders above may replace its plugins.
  EXPECT_EQ(dirs[4].dir, fs::path("/tmp/devalloc-package"));
  EXPECT_EQ(dirs[4].source, PluginPathSource::caller);
  EXPECT_EQ(fs::weakly_canonical(dirs[5].dir), fs::weakly_canonical(kPlugins));
  EXPECT_EQ(dirs[5].source, PluginPathSource::installed);
  EXPECT_EQ(loader.search_path().size(), 6u);
  EXPECT_TRUE(loader.notes().empty());
}

// An empty folder name would be the current directory: skipped and said,
// never an exception out of the constructor.
TEST(PluginLoader, GivenEmptyFolderName_WhenBuildingSearchPath_ThenSkippedWithANote) {
  ScopedEnv env("DEVALLOC_PLUGIN_PATH", "");
  PluginSearchOptions options;
  options.command_line_dirs = {"", "/tmp/devalloc-cli"};
  options.config_dirs = {""};
  PluginLoader loader(options);
  ASSERT_EQ(loader.search_dirs().size(), 2u);
  EXPECT_EQ(loader.search_dirs()[0].dir, fs::path("/tmp/devalloc-cli"));
  EXPECT_EQ(loader.search_dirs()[1].source, PluginPathSource::installed);
  EXPECT_THAT(loader.notes(),
              ::testing::ElementsAre(
                  "an empty folder name from --plugin-path is skipped (the current directory "
                  "is never searched implicitly)",
                  "an empty folder name from config is skipped (the current directory is "
                  "never searched implicitly)"));
}

// A name whose file a config gives ([plugins.NAME] library) is
// never taken from the path: the file there is shadowed, and not opened.
TEST(PluginLoader, GivenNameShadowedBySettings_WhenDiscovering_ThenItsFilesAreShadowedAndNotOpened) {
  ScopedEnv env("DEVALLOC_PLUGIN_PATH", "");
  PluginLoader loader;
  std::map<std::string, PluginLoadSettings, std::less<>> settings;
  settings["host"].shadowed_by = "the config's library is used instead";
  bool listed = false;
  for (const auto& c : loader.discover(settings)) {
    if (c.name != "host") continue;
    listed = true;
    EXPECT_EQ(c.outcome, PluginOutcome::shadowed);
    EXPECT_EQ(c.reason, "the config's library is used instead");
    EXPECT_EQ(c.plugin, nullptr);
  }
  EXPECT_TRUE(listed);
}

TEST(PluginLoader, GivenPluginOnlyInCurrentDirectory_WhenResolvingByName_ThenNotFound) {
  ScopedEnv env("DEVALLOC_PLUGIN_PATH", "");
  const test::ScratchDir scratch("cwd");
  const fs::path& dir = scratch.path();
  fs::copy_file(kHost, dir / "libdevalloc_onlyhere.so", fs::copy_options::overwrite_existing);
  {
    ScopedCwd cwd(dir);
    PluginLoader loader;
    auto [path, error] = loader.resolve("onlyhere");
    EXPECT_TRUE(path.empty());
    EXPECT_EQ(error.outcome, PluginOutcome::not_found);
    EXPECT_THAT(error.status.message(),
                AllOf(HasSubstr("\"onlyhere\" not found"),
                      HasSubstr("libdevalloc_onlyhere.so"),
                      HasSubstr(kPlugins.lexically_normal().string())));
  }
}

TEST(PluginLoader, GivenMissingExplicitPath_WhenLoading_ThenNotFoundNamesThePath) {
  PluginLoader loader;
  auto [plugin, error] = loader.load("/nonexistent/libdevalloc_x.so");
  EXPECT_EQ(plugin, nullptr);
  EXPECT_EQ(error.outcome, PluginOutcome::not_found);
  EXPECT_THAT(error.status.message(), HasSubstr("/nonexistent/libdevalloc_x.so: no such file"));
}

TEST(PluginLoader, GivenNameWithSlashesOrSpaces_WhenResolving_ThenRejectedAsNeitherNameNorPath) {
  PluginLoader loader;
  auto [path, error] = loader.resolve("bad name");
  EXPECT_TRUE(path.empty());
  EXPECT_EQ(error.status.code(), StatusCode::invalid_argument);
}

TEST(PluginLoader, GivenUnknownOption_WhenCreating_ThenCreateFailedWithPluginMessage) {
  PluginLoader loader;
  auto [plugin, error] = loader.load(kHost.string(), {{"no_such_option", "1"}});
  EXPECT_EQ(plugin, nullptr);
  EXPECT_EQ(error.outcome, PluginOutcome::create_failed);
  EXPECT_EQ(error.status.code(), StatusCode::invalid_argument);
  EXPECT_THAT(error.status.message(), HasSubstr("no_such_option"));
}

TEST(PluginLoader, GivenLivePlugin_WhenLibraryHandleDropped_ThenLibraryStaysUntilPluginGoes) {
  // A private copy, so no other test's handle keeps it loaded.
  const test::ScratchDir scratch("lifetime");
  const fs::path copy = scratch / "libdevalloc_lifetime.so";
  fs::copy_file(kHost, copy);
  {
    auto [library, open_error] = PluginLibrary::open(copy);
    ASSERT_NE(library, nullptr) << open_error.status.message();
    auto [plugin, create_error] = Plugin::create(library, {});
    ASSERT_NE(plugin, nullptr) << create_error.status.message();
    library.reset();
    EXPECT_TRUE(library_is_loaded(copy));
    auto address = plugin->allocate(0, 64, 64);
    ASSERT_TRUE(address.ok());
    EXPECT_TRUE(plugin->deallocate(0, *address).ok());
    plugin.reset();
    EXPECT_FALSE(library_is_loaded(copy));
  }
}

TEST(PluginLoader, GivenFileRenamedOverAPluginStillLoaded_WhenOpeningItsPath_ThenRefusedUntilTheOldOneIsReleased) {
  // The dynamic linker would hand out the loaded object for that name
  // without reading the new file: the old code, under the new file's checks.
  const test::ScratchDir scratch("replaced");
  const fs::path& dir = scratch.path();
  const fs::path path = dir / "libdevalloc_replaced.so";
  fs::copy_file(kHost, path, fs::copy_options::overwrite_existing);
  {
    auto [old_version, old_error] = PluginLibrary::open(path);
    ASSERT_NE(old_version, nullptr) << old_error.status.message();
    // Opening the same file again while it is loaded is fine.
    auto [again, again_error] = PluginLibrary::open(path);
    ASSERT_NE(again, nullptr) << again_error.status.message();
    again.reset();

    // An update the usual way: a new file renamed over the old one.
    fs::copy_file(kHost, dir / "update.tmp", fs::copy_options::overwrite_existing);
    fs::rename(dir / "update.tmp", path);
    auto [refused, refusal] = PluginLibrary::open(path);
    EXPECT_EQ(refused, nullptr);
    EXPECT_EQ(refusal.status.code(), StatusCode::runtime_unavailable);
    EXPECT_THAT(refusal.status.message(),
                AllOf(HasSubstr(path.string()), HasSubstr("replaced on disk"),
                      HasSubstr("earlier version is still loaded")));
    EXPECT_TRUE(library_is_loaded(path));
  }
  // The old version released: the new file is what opens.
  EXPECT_FALSE(library_is_loaded(path));
  auto [new_version, new_error] = PluginLibrary::open(path);
  EXPECT_NE(new_version, nullptr) << new_error.status.message();
  new_version.reset();
}

TEST(PluginHandle, GivenHostPlugin_WhenCopyingThroughIt_ThenStatusesAndBytesAreRight) {
  PluginLoader loader;
  auto [plugin, error] = loader.load(kHost.string(), {{"async", "true"}});
  ASSERT_NE(plugin, nullptr) << error.status.message();
  EXPECT_EQ(plugin->name(), "host");
  EXPECT_TRUE(plugin->capabilities().async_copy);
  auto address = plugin->allocate(0, 16, 16);
  ASSERT_TRUE(address.ok()) << address.status().message();
  const char src[16] = "fifteen chars..";
  ASSERT_TRUE(plugin->copy_to_device(0, *address, src, sizeof src).ok());
  ASSERT_TRUE(plugin->synchronize(0).ok());
  char back[16] = {};
  ASSERT_TRUE(plugin->copy_to_host(0, back, *address, sizeof back).ok());
  EXPECT_STREQ(back, src);

  Status out_of_range = plugin->copy_to_device(0, *address + 8, src, sizeof src);
  EXPECT_EQ(out_of_range.code(), StatusCode::invalid_argument);
  EXPECT_THAT(out_of_range.message(), HasSubstr("plugin host: "));
  EXPECT_EQ(plugin->allocate(7, 16, 16).status().code(), StatusCode::no_such_device);
  EXPECT_TRUE(plugin->deallocate(0, *address).ok());
}

TEST(PluginHandle, GivenHostPlugin_WhenAskingMemoryInfo_ThenFreeIsAtMostTotalAndTotalIsTheDevicesTotal) {
  PluginLoader loader;
  auto [plugin, error] = loader.load(kHost.string(), {});
  ASSERT_NE(plugin, nullptr) << error.status.message();
  EXPECT_TRUE(plugin->capabilities().host_addressable);
  auto info = plugin->memory_info(0);
  ASSERT_TRUE(info.ok()) << info.status().message();
  ASSERT_TRUE(info->has_value()) << "the host plugin offers get_memory_info";
  EXPECT_EQ((*info)->total_bytes, plugin->devices()[0].total_memory_bytes);
  EXPECT_GT((*info)->free_bytes, 0u);
  EXPECT_LE((*info)->free_bytes, (*info)->total_bytes);
  auto no_device = plugin->memory_info(1);
  EXPECT_EQ(no_device.status().code(), StatusCode::no_such_device);
  EXPECT_THAT(no_device.status().message(), HasSubstr("get_memory_info"));
}

TEST(PluginHandle, GivenHostPluginWithMemoryLimit_WhenAllocating_ThenFreeMemoryCountsDownAndTheLimitHolds) {
  auto [plugin, error] = PluginLoader().load(kHost.string(), {{"memory_limit", "4096"}});
  ASSERT_NE(plugin, nullptr) << error.status.message();
  EXPECT_EQ(plugin->devices()[0].total_memory_bytes, 4096u);
  auto free_bytes = [&] {
    auto info = plugin->memory_info(0);
    EXPECT_TRUE(info.ok() && info->has_value());
    return info.ok() && info->has_value() ? (*info)->free_bytes : 0;
  };
  EXPECT_EQ(free_bytes(), 4096u);
  auto a = plugin->allocate(0, 3000, 0);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(free_bytes(), 1096u);
  auto b = plugin->allocate(0, 1097, 0);
  EXPECT_EQ(b.status().code(), StatusCode::out_of_device_memory);
  EXPECT_THAT(b.status().message(), HasSubstr("memory_limit"));
  auto c = plugin->allocate(0, 1096, 0);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(free_bytes(), 0u);
  EXPECT_TRUE(plugin->deallocate(0, *a).ok());
  EXPECT_TRUE(plugin->deallocate(0, *c).ok());
  EXPECT_EQ(free_bytes(), 4096u);
}

TEST(PluginHandle, GivenHostPluginWithPool_WhenReallocatingTheSameShape_ThenTheFreedBlockIsReused) {
  auto [plugin, error] = PluginLoader().load(kHost.string(), {{"pool", "true"}});
  ASSERT_NE(plugin, nullptr) << error.status.message();
  auto first = plugin->allocate(0, 3000, 4096);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(plugin->deallocate(0, *first).ok());
  auto other_shape = plugin->allocate(0, 3000, 256);  // another alignment: not the pooled one
  ASSERT_TRUE(other_shape.ok()) << other_shape.status().message();
  EXPECT_NE(*other_shape, *first);
  auto again = plugin->allocate(0, 3000, 4096);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(*again, *first) << "the pooled block of the same size and alignment";
  EXPECT_EQ(*again % 4096, 0u);
  const std::vector<std::byte> bytes(3000, std::byte{0x5a});
  EXPECT_TRUE(plugin->copy_to_device(0, *again, bytes.data(), bytes.size()).ok());
  EXPECT_TRUE(plugin->deallocate(0, *again).ok());
  EXPECT_EQ(plugin->deallocate(0, *again).code(), StatusCode::invalid_argument)
      << "a pooled block is not live: freeing it twice is still PLUGIN-12";
  EXPECT_TRUE(plugin->deallocate(0, *other_shape).ok());
}

// The validation layer wraps the function table; a 1.1 query the plugin
// offers must pass through it, or the core's "does the plan fit" check is
// silently skipped for every validated plugin.
TEST(PluginHandle, GivenHostPluginUnderTheValidationLayer_WhenAskingMemoryInfo_ThenTheLayerForwardsIt) {
  LayerSettings validating;
  validating.validate = true;
  auto [plugin, error] = PluginLoader().load(kHost.string(), {}, validating);
  ASSERT_NE(plugin, nullptr) << error.status.message();
  ASSERT_TRUE(plugin->layer_counters()) << "the plugin runs under the layer";
  auto info = plugin->memory_info(0);
  ASSERT_TRUE(info.ok()) << info.status().message();
  ASSERT_TRUE(info->has_value()) << "the layer hid the plugin's get_memory_info";
  EXPECT_EQ((*info)->total_bytes, plugin->devices()[0].total_memory_bytes);
  EXPECT_LE((*info)->free_bytes, (*info)->total_bytes);
  EXPECT_EQ(plugin->memory_info(1).status().code(), StatusCode::no_such_device);
  EXPECT_EQ(plugin->layer_counters()->breaches, 0u);
}

// A failure reported to a synchronize is remembered per device, so that a
// caller can learn that another caller's synchronize was told of a failure
// (PLUGIN-17 reports an asynchronous failure to whichever comes next).
TEST(PluginHandle, GivenAFailingSynchronize_ThenItIsCountedPerDeviceAndItsErrorKept) {
  LayerSettings faults;
  faults.faults.fail_synchronize = true;
  auto [plugin, error] = PluginLoader().load(
      DEVALLOC_PLUGIN_BUILD_DIR "/libdevalloc_host.so", {}, faults);
  ASSERT_NE(plugin, nullptr) << error.status.message();
  const uint64_t mark = plugin->synchronize_failures(0);
  EXPECT_EQ(mark, 0u);
  EXPECT_TRUE(plugin->synchronize_failure_since(0, mark).ok());
  const Status failed = plugin->synchronize(0);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(plugin->synchronize_failures(0), 1u);
  const Status since = plugin->synchronize_failure_since(0, mark);
  EXPECT_EQ(since.code(), failed.code());
  EXPECT_EQ(since.message(), failed.message());
  EXPECT_TRUE(plugin->synchronize_failure_since(0, 1).ok());
  // A device the plugin does not have: refused by the plugin, not counted.
  EXPECT_FALSE(plugin->synchronize(7).ok());
  EXPECT_EQ(plugin->synchronize_failures(7), 0u);
  EXPECT_EQ(plugin->synchronize_failures(0), 1u);
}

// A synchronize of another caller still running when a load asks may be the
// one its failure is reported to: synchronize_failure_since waits for it.
// The zoo's unknown_status releases pending copies inside synchronize, on
// the caller's thread, and then fails it (status 42): a release that
// blocks holds that synchronize open for as long as the test wants.
TEST(PluginHandle, GivenAnotherCallersSynchronizeStillRunning_WhenAskingForFailuresSince_ThenItWaitsAndReportsThatOnesFailure) {
  auto [plugin, error] =
      PluginLoader().load(DEVALLOC_BINARY_DIR "/tests/plugin_zoo/libdevalloc_zoo_unknown_status.so", {});
  ASSERT_NE(plugin, nullptr) << error.status.message();
  const uint64_t mark = plugin->synchronize_failures(0);
  auto base = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(base.ok()) << base.status().message();
  struct Hold {
    std::mutex mutex;
    std::condition_variable changed;
    bool entered = false, let_go = false;
  } hold;
  static const std::vector<uint8_t> bytes(64, 3);
  ASSERT_TRUE(plugin
                  ->copy_to_device_until_released(
                      0, *base, bytes.data(), 64,
                      [](void* user_data) {
                        auto& h = *static_cast<Hold*>(user_data);
                        std::unique_lock lock(h.mutex);
                        h.entered = true;
                        h.changed.notify_all();
                        h.changed.wait(lock, [&] { return h.let_go; });
                      },
                      &hold)
                  .ok());
  Status other;
  std::thread synchronizing([&] { other = plugin->synchronize(0); });
  {
    std::unique_lock lock(hold.mutex);
    hold.changed.wait(lock, [&] { return hold.entered; });  // inside its synchronize now
  }
  std::atomic<bool> answered{false};
  Status since;
  std::thread asking([&] {
    since = plugin->synchronize_failure_since(0, mark);
    answered = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(answered) << "it answered while the other synchronize was still running";
  {
    std::lock_guard lock(hold.mutex);
    hold.let_go = true;
  }
  hold.changed.notify_all();
  synchronizing.join();
  asking.join();
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(since.code(), other.code());
  EXPECT_EQ(since.message(), other.message());
  EXPECT_TRUE(plugin->deallocate(0, *base).ok());
}

// A table of ABI 1.0's size still holds a get_memory_info pointer in memory
// (the variant is built from the 1.1 sources); the handle must not read it.
TEST(PluginHandle, GivenTableOfAbi10Size_WhenAskingMemoryInfo_ThenNotOfferedAndLoadStillWorks) {
  PluginLoader loader;
  auto [plugin, error] = loader.load(
      DEVALLOC_BINARY_DIR "/tests/plugin_zoo/libdevalloc_host_abi_1_0.so", {});
  ASSERT_NE(plugin, nullptr) << error.status.message();
  EXPECT_EQ(plugin->api().struct_size, DEVALLOC_PLUGIN_API_V1_MIN_SIZE);
  EXPECT_FALSE(plugin->capabilities().host_addressable);
  auto info = plugin->memory_info(0);
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_FALSE(info->has_value());
  auto address = plugin->allocate(0, 64, 0);
  ASSERT_TRUE(address.ok()) << address.status().message();
  EXPECT_TRUE(plugin->deallocate(0, *address).ok());
}

}  // namespace
}  // namespace devalloc
