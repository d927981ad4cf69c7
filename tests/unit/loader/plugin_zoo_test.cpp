// Every bad plugin of the zoo is refused with its own reason, and good
// plugins beside them still load.
#include <devalloc/plugin_loader.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
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

// PLUGIN-7 broken in a static initializer: an exception out of it would
// unwind through glibc's dlopen and leave the dynamic linker locked for
// ever, which nothing can repair; it ends the process at once
// (std::terminate), in every build, whatever catch the caller has.
TEST(PluginZooDeathTest,
     GivenPluginWhoseStaticInitializerThrows_WhenOpening_ThenTheProcessEndsWithTheExceptionsText) {
  const std::filesystem::path throwing =
      DEVALLOC_BINARY_DIR "/tests/plugin_zoo_initializer/libdevalloc_zoo_throwing_initializer.so";
  ASSERT_TRUE(std::filesystem::exists(throwing));
  // What the child says if it comes back, which it must not.
  const auto open_and_return = [&] {
    try {
      const PluginError error = PluginLibrary::open(throwing).second;
      std::fprintf(stderr, "open returned: %s\n", error.status.message().c_str());
    } catch (...) {
      std::fprintf(stderr, "an exception reached the caller\n");
    }
    std::_Exit(0);
  };
  EXPECT_EXIT(open_and_return(), ::testing::KilledBySignal(SIGABRT),
              "zoo_throws: static initializer threw");
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

// HOST_ADDRESSABLE is bit 2 of ABI 1.1: a plugin that negotiated 1.0 cannot
// mean it, and the host that believed it would write straight into its
// device addresses. Flags beyond the negotiated minor are ignored, by the
// loader and by the validation layer alike; those of 1.0 are kept.
TEST(PluginZoo, GivenPluginOfAbi1_0SettingTheHostAddressableFlagOf1_1_WhenLoading_ThenTheFlagIsIgnored) {
  for (const bool validate : {false, true}) {
    SCOPED_TRACE(validate ? "with the validation layer" : "without a layer");
    LayerSettings layers;
    layers.validate = validate;
    auto [plugin, error] =
        PluginLoader().load(zoo("v1_0_host_addressable").string(), {}, layers);
    ASSERT_TRUE(plugin) << error.status.message();
    EXPECT_EQ(plugin->abi_minor(), 0u);
    EXPECT_FALSE(plugin->capabilities().host_addressable);
    EXPECT_TRUE(plugin->capabilities().async_copy);
    if (validate) {
      devalloc_capabilities c{};
      c.struct_size = sizeof c;
      devalloc_error e{};
      e.struct_size = sizeof e;
      ASSERT_EQ(plugin->api().get_capabilities(plugin->instance(), &c, &e), DEVALLOC_STATUS_OK)
          << e.message;
      EXPECT_EQ(c.flags, DEVALLOC_CAPABILITY_ASYNC_COPY);
    }
  }
}

// PLUGIN-3: the function table is read once, at negotiation. A plugin whose
// table lies in writable memory and that changes it afterwards (create
// clears copy_host_to_device; allocate clears copy_device_to_host,
// synchronize and deallocate) changes nothing: the loader, and the
// validation layer over it, call through the loader's checked copy.
TEST(PluginZoo, GivenPluginThatClearsEntriesOfItsTableAfterTheChecks_WhenCalled_ThenTheLoadersCopyIsCalled) {
  for (const bool validate : {false, true}) {
    SCOPED_TRACE(validate ? "with the validation layer" : "without a layer");
    LayerSettings layers;
    layers.validate = validate;
    // Each plugin is closed before the next open, which maps a fresh table.
    auto [plugin, error] = PluginLoader().load(zoo("mutable_table").string(), {}, layers);
    ASSERT_TRUE(plugin) << error.status.message();
    EXPECT_NE(plugin->library().api().copy_host_to_device, nullptr);
    auto address = plugin->allocate(0, 64, 0);
    ASSERT_TRUE(address.ok()) << address.status().message();
    std::vector<uint8_t> bytes(64, 7), back(64, 0);
    EXPECT_TRUE(plugin->copy_to_device(0, *address, bytes.data(), bytes.size()).ok());
    EXPECT_TRUE(plugin->synchronize(0).ok());
    EXPECT_TRUE(plugin->copy_to_host(0, back.data(), *address, back.size()).ok());
    EXPECT_EQ(back, bytes);
    EXPECT_TRUE(plugin->deallocate(0, *address).ok());
  }
}

// PLUGIN-5 broken by the entry point and by create: they are worded as for
// every other call (synchronize above), with the value and the rule.
TEST(PluginZoo, GivenEntryPointReturningAnUnknownStatus_WhenOpening_ThenInternalNamingTheValueAndPlugin5) {
  PluginError e = open_error("negotiate_status42");
  EXPECT_EQ(e.outcome, PluginOutcome::negotiation_failed);
  EXPECT_EQ(e.status.code(), StatusCode::internal);
  EXPECT_EQ(e.status.message(),
            "plugin " + zoo("negotiate_status42").string() +
                ": devalloc_plugin_negotiate returned status 42, which the ABI does not define "
                "(PLUGIN-5), taken as internal: zoo: negotiation answers a status of its own");
}

TEST(PluginZoo, GivenCreateReturningAnUnknownStatus_WhenLoading_ThenInternalNamingTheValueAndPlugin5) {
  auto [plugin, e] = PluginLoader().load(zoo("create_status42").string());
  EXPECT_EQ(plugin, nullptr);
  EXPECT_EQ(e.outcome, PluginOutcome::create_failed);
  EXPECT_EQ(e.status.code(), StatusCode::internal);
  EXPECT_EQ(e.status.message(),
            "plugin zoo (" + zoo("create_status42").string() +
                "): create failed: create returned status 42, which the ABI does not define "
                "(PLUGIN-5), taken as internal: zoo: create answers a status of its own");
}

TEST(PluginZoo, GivenFileWithoutEntryPoint_WhenOpening_ThenRefusedAsNoEntryPoint) {
  PluginError e = open_error("no_entry");
  EXPECT_EQ(e.outcome, PluginOutcome::no_entry_point);
  EXPECT_THAT(e.status.message(),
              AllOf(HasSubstr(zoo("no_entry").string()),
                    HasSubstr("does not export devalloc_plugin_negotiate")));
}

// dlsym finds a data object by the entry point's name as well as a
// function: calling it jumped into data (a crash that `devalloc plugins`
// died of without a word).
TEST(PluginZoo, GivenEntryPointThatIsADataObject_WhenOpening_ThenRefusedAsNotAFunction) {
  PluginError e = open_error("entry_is_data");
  EXPECT_EQ(e.outcome, PluginOutcome::no_entry_point);
  EXPECT_EQ(e.status.code(), StatusCode::unsupported);
  EXPECT_EQ(e.status.message(),
            "plugin " + zoo("entry_is_data").string() +
                ": devalloc_plugin_negotiate is not a function: its dynamic symbol is a data "
                "object (STT_OBJECT); the entry point must be a function (PLUGIN-1)");
}

// A GNU indirect function is a function: dlsym returns what its resolver
// picked, a hidden function that no dynamic symbol names.
TEST(PluginZoo, GivenEntryPointThatIsAnIndirectFunction_WhenLoading_ThenItLoads) {
  auto [plugin, error] = PluginLoader().load(zoo("ifunc_entry").string());
  ASSERT_TRUE(plugin) << error.status.message();
  EXPECT_EQ(plugin->devices().size(), 1u);
}

TEST(PluginZoo, GivenEntryPointThatFails_WhenOpening_ThenRefusedWithPluginsMessage) {
  PluginError e = open_error("refuses");
  EXPECT_EQ(e.outcome, PluginOutcome::negotiation_failed);
  EXPECT_EQ(e.status.code(), StatusCode::internal);
  EXPECT_THAT(e.status.message(), HasSubstr("refused with internal"));
}

// PLUGIN-4 broken in negotiation, as by a plugin built against a header
// whose negotiation struct grew: it writes past the struct_size it was
// handed. The struct is followed by slack, as every output struct the
// loader hands out, so the loader's stack is safe; the plugin is refused.
TEST(PluginZoo, GivenEntryPointWritingPastTheNegotiationStruct_WhenOpening_ThenRefusedWithPlugin4) {
  PluginError e = open_error("negotiation_scribble");
  EXPECT_EQ(e.outcome, PluginOutcome::negotiation_failed);
  EXPECT_EQ(e.status.code(), StatusCode::internal);
  EXPECT_EQ(e.status.message(),
            "plugin " + zoo("negotiation_scribble").string() +
                ": devalloc_plugin_negotiate wrote past the struct_size of " +
                std::to_string(sizeof(devalloc_negotiation)) +
                " bytes it was handed (byte " + std::to_string(sizeof(devalloc_negotiation)) +
                " changed), which PLUGIN-4 forbids (built against another header?)");
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

// PLUGIN-3: a table names its plugin. Without a name every message would
// read `plugin ""`.
TEST(PluginZoo, GivenTableWithoutPluginName_WhenOpening_ThenRefusedNamingPlugin3) {
  PluginError e = open_error("null_name");
  EXPECT_EQ(e.outcome, PluginOutcome::negotiation_failed);
  EXPECT_EQ(e.status.code(), StatusCode::unsupported);
  EXPECT_EQ(e.status.message(), "plugin " + zoo("null_name").string() +
                                    ": function table has no plugin_name (NULL), which "
                                    "PLUGIN-3 requires");
  e = open_error("empty_name");
  EXPECT_EQ(e.outcome, PluginOutcome::negotiation_failed);
  EXPECT_EQ(e.status.code(), StatusCode::unsupported);
  EXPECT_EQ(e.status.message(), "plugin " + zoo("empty_name").string() +
                                    ": function table has an empty plugin_name, which "
                                    "PLUGIN-3 forbids");
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
      {"zoo_entry_is_data", PluginOutcome::no_entry_point},  // never called
      {"zoo_negotiation_scribble", PluginOutcome::negotiation_failed},
      {"zoo_null_name", PluginOutcome::negotiation_failed},
      {"zoo_empty_name", PluginOutcome::negotiation_failed},
      {"zoo_negotiate_status42", PluginOutcome::negotiation_failed},
      {"zoo_create_status42", PluginOutcome::create_failed},
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
