// The kit's create() options: taken one by one, checked, the rest unknown.
#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/options.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace devalloc::plugin {
namespace {

using ::testing::HasSubstr;

struct Args {
  std::vector<const char*> keys;
  std::vector<const char*> values;
  devalloc_create_args args{};

  Args(std::vector<const char*> k, std::vector<const char*> v) : keys(std::move(k)), values(std::move(v)) {
    args.struct_size = sizeof args;
    args.option_count = keys.size();
    args.option_keys = keys.data();
    args.option_values = values.data();
  }
};

std::string failure_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Failure& failure) {
    EXPECT_EQ(failure.status, DEVALLOC_STATUS_INVALID_ARGUMENT);
    return failure.message;
  }
  return "(no failure)";
}

TEST(Options, UnsignedValuesUpToTheLargestAreTakenAndOneAboveIsRefused) {
  for (const char* text : {"0", "18446744073709551609", "18446744073709551610",
                           "18446744073709551615"}) {
    Args a({"n"}, {text});
    Options options(a.args);
    EXPECT_EQ(options.take_u64("n", 7), std::stoull(text)) << text;
  }
  for (const char* text : {"18446744073709551616", "99999999999999999999", "", "-1", "1 "}) {
    Args a({"n"}, {text});
    Options options(a.args);
    EXPECT_THAT(failure_of([&] { options.take_u64("n", 7); }),
                HasSubstr("expected a non-negative integer"))
        << text;
  }
}

TEST(Options, AKeyGivenTwiceIsRefusedNotCalledUnknown) {
  Args a({"async", "pool", "async"}, {"true", "1", "false"});
  EXPECT_EQ(failure_of([&] { Options options(a.args); }),
            "create: option \"async\" is given twice (PLUGIN-8)");
}

TEST(Options, WhatIsNotTakenIsUnknownAndNamed) {
  Args a({"async", "asink"}, {"true", "1"});
  Options options(a.args);
  EXPECT_TRUE(options.take_bool("async", false));
  EXPECT_EQ(failure_of([&] { options.reject_unknown("host", "async, pool"); }),
            "plugin host: unknown option \"asink\" (accepted: async, pool)");
}

TEST(Options, BooleansAreTrueOrOneAndFalseOrZero_AnythingElseIsRefused) {
  Args a({"a", "b", "c", "d", "e"}, {"true", "1", "false", "0", "yes"});
  Options options(a.args);
  EXPECT_TRUE(options.take_bool("a", false));
  EXPECT_TRUE(options.take_bool("b", false));
  EXPECT_FALSE(options.take_bool("c", true));
  EXPECT_FALSE(options.take_bool("d", true));
  EXPECT_THAT(failure_of([&] { options.take_bool("e", false); }),
              HasSubstr("expected true or false"));
  EXPECT_TRUE(options.take_bool("absent", true));
}

TEST(Options, ACountWithNullArrays_IsRefusedBeforeAnyIsRead) {
  const char* key = "async";
  for (int which = 0; which < 3; ++which) {
    devalloc_create_args args{};
    args.struct_size = sizeof args;
    args.option_count = 1;
    args.option_keys = which == 1 ? &key : nullptr;
    args.option_values = which == 2 ? &key : nullptr;
    EXPECT_EQ(failure_of([&] { Options options(args); }),
              "create: option_count > 0 with NULL option arrays (PLUGIN-8)")
        << which;
  }
}

}  // namespace
}  // namespace devalloc::plugin
