// Each plugin of the zoo is broken in exactly the way the loader's tests
// expect; checked here with dlopen alone, so that a loader test failing
// points at the loader and not at its fixture.
#include "opened_plugin.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace devalloc::zoo_test {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

struct Negotiated {
  devalloc_status status;
  devalloc_negotiation negotiation;
  std::string message;
};

Negotiated negotiate(const Library& library) {
  Negotiated result{DEVALLOC_STATUS_INTERNAL, v1_request(), ""};
  auto error = empty_error();
  const auto entry = library.entry();
  EXPECT_NE(entry, nullptr);
  if (entry == nullptr) return result;
  result.status = entry(&result.negotiation, &error);
  result.message = error.message;
  return result;
}

TEST(ZooVariants, GivenNoEntry_ThenItOpensButLacksTheEntryPoint) {
  Library library(zoo_file("libdevalloc_zoo_no_entry.so"));
  ASSERT_NE(library.handle, nullptr) << library.open_error;
  EXPECT_EQ(library.entry(), nullptr);
  EXPECT_NE(dlsym(library.handle, "devalloc_zoo_not_the_entry_point"), nullptr);
}

TEST(ZooVariants, GivenRefuses_ThenEntryFailsWithInternalAndNoTable) {
  Library library(zoo_file("libdevalloc_zoo_refuses.so"));
  ASSERT_NE(library.handle, nullptr) << library.open_error;
  const auto n = negotiate(library);
  EXPECT_EQ(n.status, DEVALLOC_STATUS_INTERNAL);
  EXPECT_EQ(n.negotiation.api, nullptr);
  EXPECT_THAT(n.message, HasSubstr("refusing"));
}

TEST(ZooVariants, GivenMajor2_ThenEntryRefusesAndSaysItSpeaksMajor2Only) {
  Library library(zoo_file("libdevalloc_zoo_major2.so"));
  ASSERT_NE(library.handle, nullptr) << library.open_error;
  const auto n = negotiate(library);
  EXPECT_EQ(n.status, DEVALLOC_STATUS_UNSUPPORTED);
  EXPECT_EQ(n.negotiation.plugin_major, 2u);
  EXPECT_EQ(n.negotiation.plugin_minor, 0u);
  EXPECT_EQ(n.negotiation.plugin_min_major, 2u);
  EXPECT_EQ(n.negotiation.api, nullptr);
}

TEST(ZooVariants, GivenLiesMajor2_ThenEntryAnswersOkWithMajor2AndATable) {
  Library library(zoo_file("libdevalloc_zoo_lies_major2.so"));
  ASSERT_NE(library.handle, nullptr) << library.open_error;
  const auto n = negotiate(library);
  EXPECT_EQ(n.status, DEVALLOC_STATUS_OK);
  EXPECT_EQ(n.negotiation.plugin_major, 2u);
  EXPECT_NE(n.negotiation.api, nullptr);
}

TEST(ZooVariants, GivenSmallTable_ThenTheTableIs16Bytes) {
  Library library(zoo_file("libdevalloc_zoo_small_table.so"));
  ASSERT_NE(library.handle, nullptr) << library.open_error;
  const auto n = negotiate(library);
  ASSERT_EQ(n.status, DEVALLOC_STATUS_OK);
  ASSERT_NE(n.negotiation.api, nullptr);
  EXPECT_EQ(static_cast<const devalloc_plugin_api_v1*>(n.negotiation.api)->struct_size, 16u);
}

TEST(ZooVariants, GivenCreateFails_ThenCreateSaysTheVendorRuntimeIsMissing) {
  devalloc_status status = DEVALLOC_STATUS_OK;
  auto error = empty_error();
  EXPECT_FALSE(Instance::open(zoo_file("libdevalloc_zoo_create_fails.so"), {}, &status, &error));
  EXPECT_EQ(status, DEVALLOC_STATUS_RUNTIME_UNAVAILABLE);
  EXPECT_STREQ(error.message, "zoo: vendor runtime libzoo.so.3 not found");
}

TEST(ZooVariants, GivenMissingDep_ThenDlopenFailsNamingTheDependency) {
  Library library(zoo_file("libdevalloc_zoo_missing_dep.so"));
  EXPECT_EQ(library.handle, nullptr);
  EXPECT_THAT(library.open_error, HasSubstr("libdevalloc_zoo_dependency.so"));
}

TEST(ZooVariants, GivenMissingDepWithItsDependencyLoaded_ThenItOpens) {
  // Proves that the dependency is the only thing the plugin lacks: once a
  // library of that soname is loaded, the dynamic linker reuses it.
  Library dependency(std::string(DEVALLOC_PLUGIN_ZOO_DIR) + "_deps/libdevalloc_zoo_dependency.so");
  ASSERT_NE(dependency.handle, nullptr) << dependency.open_error;
  Library library(zoo_file("libdevalloc_zoo_missing_dep.so"));
  EXPECT_NE(library.handle, nullptr) << library.open_error;
}

TEST(ZooVariants, GivenNotALibrary_ThenDlopenFails) {
  Library library(zoo_file("libdevalloc_zoo_not_a_library.so"));
  EXPECT_EQ(library.handle, nullptr);
  EXPECT_THAT(library.open_error, Not(IsEmpty()));
}

}  // namespace
}  // namespace devalloc::zoo_test
