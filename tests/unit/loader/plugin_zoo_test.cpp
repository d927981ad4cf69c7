// Every bad plugin of the zoo is refused with its own reason, and good
// plugins beside them still load.
#include <devalloc/plugin_loader.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <vector>

namespace devalloc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::filesystem::path kZoo = DEVALLOC_BINARY_DIR "/tests/plugin_zoo";

std::filesystem::path zoo(const std::string& variant) {
  return kZoo / ("libdevalloc_zoo_" + variant + ".so");
}

PluginError open_error(const std::string& variant) {
  auto [library, error] = PluginLibrary::open(zoo(variant));
  EXPECT_EQ(library, nullptr) << variant << " was accepted";
  return error;
}

// PLUGIN-7 broken: what a plugin throws through the C ABI becomes the
// call's failure, never an exception in the host or the end of the process.
TEST(PluginZoo, GivenPluginThatThrowsThroughTheCAbi_WhenCalled_ThenEachThrowIsThatCallsFailure) {
  std::vector<uint8_t> bytes(64, 7);
  {
    auto [plugin, error] = PluginLoader().load(zoo("throws").string(), {}, {});
    ASSERT_TRUE(plugin) << error.status.message();
    auto thrown = plugin->allocate(0, 13, 0);
    ASSERT_FALSE(thrown.ok());
    EXPECT_EQ(thrown.status().code(), StatusCode::internal);
    EXPECT_EQ(thrown.status().message(),
              "plugin zoo_throws: allocate threw a C++ exception across the C ABI (PLUGIN-7): "
              "allocate exploded");
    auto address = plugin->allocate(0, 64, 0);  // the plugin still works
    ASSERT_TRUE(address.ok()) << address.status().message();
    Status copy = plugin->copy_to_device(0, *address, bytes.data(), 13);
    EXPECT_EQ(copy.code(), StatusCode::internal);
    EXPECT_EQ(copy.message(),
              "plugin zoo_throws: copy_host_to_device threw a C++ exception across the C ABI "
              "(PLUGIN-7)");
    EXPECT_TRUE(plugin->copy_to_device(0, *address, bytes.data(), 64).ok());
    EXPECT_TRUE(plugin->deallocate(0, *address).ok());
  }  // destroy throws as well: dropped
  SUCCEED();
}

// PLUGIN-5 broken: a status the header does not define becomes internal, and
// the message says which call returned which value, and the rule.
TEST(PluginZoo, GivenPluginReturningAnUnknownStatus_WhenCalled_ThenInternalNamingTheCallTheValueAndPlugin5) {
  auto [plugin, error] = PluginLoader().load(zoo("unknown_status").string(), {}, {});
  ASSERT_TRUE(plugin) << error.status.message();
  Status s = plugin->synchronize(0);
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_EQ(s.message(),
            "plugin zoo: synchronize returned status 42, which the ABI does not define "
            "(PLUGIN-5), taken as internal, and gave no message");
}

TEST(PluginZoo, GivenFileWithoutEntryPoint_WhenOpening_ThenRefusedAsNoEntryPoint) {
  PluginError e = open_error("no_entry");
  EXPECT_EQ(e.outcome, PluginOutcome::no_entry_point);
  EXPECT_THAT(e.status.message(),
              AllOf(HasSubstr(zoo("no_entry").string()),
                    HasSubstr("does not export devalloc_plugin_negotiate")));
}

TEST(PluginZoo, GivenEntryPointThatFails_WhenOpening_ThenRefusedWithPluginsMessage) {
  PluginError e = open_error("refuses");
  EXPECT_EQ(e.outcome, PluginOutcome::negotiation_failed);
  EXPECT_EQ(e.status.code(), StatusCode::internal);
  EXPECT_THAT(e.status.message(), HasSubstr("refused with internal"));
}

TEST(PluginZoo, GivenPluginWithMajor2_WhenOpening_ThenRejectedWithBothVersions) {
  PluginError e = open_error("major2");
  EXPECT_EQ(e.outcome, PluginOutcome::version_mismatch);
  EXPECT_THAT(e.status.message(),
              AllOf(HasSubstr("ABI 2."), HasSubstr("offered"),
                    HasSubstr("this loader speaks 1.x")));
}

TEST(PluginZoo, GivenPluginThatAnswersMajor2AsOk_WhenOpening_ThenRejectedWithBothVersions) {
  PluginError e = open_error("lies_major2");
  EXPECT_EQ(e.outcome, PluginOutcome::version_mismatch);
  EXPECT_THAT(e.status.message(),
              AllOf(HasSubstr("ABI 2."), HasSubstr("this loader speaks 1.x")));
}

TEST(PluginZoo, GivenTableSmallerThanV1_WhenOpening_ThenRefusedWithBothSizes) {
  PluginError e = open_error("small_table");
  EXPECT_EQ(e.outcome, PluginOutcome::table_too_small);
  EXPECT_THAT(e.status.message(),
              AllOf(HasSubstr("function table is 16 bytes"),
                    HasSubstr(std::to_string(DEVALLOC_PLUGIN_API_V1_MIN_SIZE))));
}

// The function table's own abi_major must be the negotiated one: a table
// of another major is laid out differently and is never called.
TEST(PluginZoo, GivenTableOfAnotherMajorThanNegotiated_WhenOpening_ThenRefusedNamingBoth) {
  PluginError e = open_error("table_major2");
  EXPECT_EQ(e.outcome, PluginOutcome::version_mismatch);
  EXPECT_EQ(e.status.code(), StatusCode::unsupported);
  EXPECT_THAT(e.status.message(),
              AllOf(HasSubstr("function table says ABI 2"), HasSubstr("negotiated 1")));
}

TEST(PluginZoo, GivenCreateThatFails_WhenLoading_ThenRefusedWithPluginsOwnMessage) {
  PluginLoader loader;
  auto [plugin, e] = loader.load(zoo("create_fails").string());
  EXPECT_EQ(plugin, nullptr);
  EXPECT_EQ(e.outcome, PluginOutcome::create_failed);
  EXPECT_EQ(e.status.code(), StatusCode::runtime_unavailable);
  EXPECT_THAT(e.status.message(),
              AllOf(HasSubstr("create failed"),
                    HasSubstr("zoo: vendor runtime libzoo.so.3 not found")));
}

// dlerror's words alone (boost's error used to add a stale errno text,
// ": Bad file descriptor", after them).
TEST(PluginZoo, GivenMissingDependency_WhenOpening_ThenTheReasonIsDlerrorsTextAlone) {
  PluginError e = open_error("missing_dep");
  EXPECT_EQ(e.outcome, PluginOutcome::open_failed);
  EXPECT_EQ(e.status.message(),
            "plugin " + zoo("missing_dep").string() +
                ": cannot be opened: libdevalloc_zoo_dependency.so: cannot open shared object "
                "file: No such file or directory");
}

TEST(PluginZoo, GivenTextFileNamedLikeAPlugin_WhenOpening_ThenOpenFails) {
  PluginError e = open_error("not_a_library");
  EXPECT_EQ(e.outcome, PluginOutcome::open_failed);
  EXPECT_EQ(e.status.message(),
            "plugin " + zoo("not_a_library").string() + ": cannot be opened: not an ELF file");
}

TEST(PluginZoo, GivenZooOnSearchPath_WhenDiscovering_ThenEachBadOneHasItsReasonAndHostLoads) {
  PluginLoader loader({kZoo, DEVALLOC_PLUGIN_BUILD_DIR});
  std::map<std::string, PluginCandidate> by_name;
  for (auto& c : loader.discover()) {
    if (c.outcome != PluginOutcome::shadowed) by_name[c.name] = c;
  }
  ASSERT_TRUE(by_name.count("host"));
  EXPECT_EQ(by_name["host"].outcome, PluginOutcome::loaded);
  ASSERT_NE(by_name["host"].plugin, nullptr);
  EXPECT_FALSE(by_name["host"].plugin->devices().empty());

  const std::map<std::string, PluginOutcome> expected = {
      {"zoo_no_entry", PluginOutcome::no_entry_point},
      {"zoo_refuses", PluginOutcome::negotiation_failed},
      {"zoo_major2", PluginOutcome::version_mismatch},
      {"zoo_lies_major2", PluginOutcome::version_mismatch},
      {"zoo_small_table", PluginOutcome::table_too_small},
      {"zoo_table_major2", PluginOutcome::version_mismatch},
      {"zoo_create_fails", PluginOutcome::create_failed},
      {"zoo_missing_dep", PluginOutcome::open_failed},
      {"zoo_not_a_library", PluginOutcome::open_failed},
      {"zoo_truncated", PluginOutcome::open_failed},  // never mapped: no SIGBUS
  };
  for (const auto& [name, outcome] : expected) {
    ASSERT_TRUE(by_name.count(name)) << name << " was not listed";
    EXPECT_EQ(by_name[name].outcome, outcome) << name;
    EXPECT_FALSE(by_name[name].reason.empty()) << name;
    EXPECT_EQ(by_name[name].plugin, nullptr) << name;
  }
}

}  // namespace
}  // namespace devalloc
