// The kit's runtime library: the first of several sonames that opens, and a
// message that lists every one tried when none does.
#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace devalloc::plugin {
namespace {

using ::testing::HasSubstr;

TEST(RuntimeLibrary, NoneOfSeveralOpens_MessageListsEachTriedWithItsReason) {
  const std::vector<std::string> tried = {"libdevalloc_absent_runtime.so.7",
                                          "libdevalloc_absent_runtime.so.6"};
  try {
    RuntimeLibrary library(tried, "the test runtime");
    FAIL() << "opened " << library.path();
  } catch (const Failure& failure) {
    EXPECT_EQ(failure.status, DEVALLOC_STATUS_RUNTIME_UNAVAILABLE);
    EXPECT_THAT(failure.message, HasSubstr("cannot open the test runtime, tried "
                                           "\"libdevalloc_absent_runtime.so.7\": "));
    EXPECT_THAT(failure.message, HasSubstr("; \"libdevalloc_absent_runtime.so.6\": "));
    EXPECT_THAT(failure.message, HasSubstr("No such file or directory"));
  }
}

TEST(RuntimeLibrary, FirstMissingSecondPresent_OpensTheSecond) {
  // The C library is loaded in every process; its soname opens anywhere.
  const std::vector<std::string> paths = {"libdevalloc_absent_runtime.so.7", "libc.so.6"};
  RuntimeLibrary library(paths, "the test runtime");
  EXPECT_EQ(library.path(), "libc.so.6");
  EXPECT_NE(library.symbol("malloc"), nullptr);
}

TEST(RuntimeLibrary, OnePath_MessageNamesItAlone) {
  try {
    RuntimeLibrary library("/nonexistent/libdevalloc_absent_runtime.so.1", "the test runtime");
    FAIL() << "opened " << library.path();
  } catch (const Failure& failure) {
    EXPECT_THAT(failure.message, HasSubstr("cannot open the test runtime "
                                           "\"/nonexistent/libdevalloc_absent_runtime.so.1\": "));
  }
}

}  // namespace
}  // namespace devalloc::plugin
