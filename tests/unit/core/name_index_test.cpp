#include <devalloc/core/name_index.hpp>

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>

#include <string>
#include <vector>

namespace devalloc {
namespace {

TEST(NameIndex, GivenEmpty_ThenFindsNothing) {
  NameIndex index;
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.find("a"), std::nullopt);
  EXPECT_EQ(index.find(""), std::nullopt);
}

TEST(NameIndex, GivenManyNames_ThenEachIsFoundWithItsValueThroughEveryGrowth) {
  std::vector<std::string> names;
  for (int i = 0; i < 5000; ++i) names.push_back("layers." + std::to_string(i) + ".weight");
  NameIndex index;  // no reserve: grows from 16 slots
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(index.insert(names[i], i * 7));
    // What was there before the growth is still found.
    ASSERT_EQ(index.find(names[i / 2]), (i / 2) * 7);
  }
  EXPECT_EQ(index.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(index.find(names[i]), i * 7);
  EXPECT_EQ(index.find("layers.5000.weight"), std::nullopt);
  EXPECT_EQ(index.find("layers.1.weigh"), std::nullopt);
}

// The table stays at most half full, so a missing name always meets an
// empty slot. 16 names are as many as its first 16 slots: a table let
// fill up would probe for ever (the alarm ends the child then).
TEST(NameIndex, GivenAsManyNamesAsItsFirstSlots_WhenLookingUpAMissingName_ThenNothingIsFound) {
  EXPECT_EXIT(
      {
        ::alarm(10);
        std::vector<std::string> names;
        for (int i = 0; i < 16; ++i) names.push_back("w" + std::to_string(i));
        NameIndex index;
        for (size_t i = 0; i < names.size(); ++i) {
          if (!index.insert(names[i], i)) std::_Exit(2);
        }
        std::_Exit(index.find("missing") == std::nullopt && index.find("w15") == 15u ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(NameIndex, GivenANameTwice_ThenTheFirstStaysAndInsertSaysSo) {
  const std::string a = "w";
  const std::string again = "w";
  NameIndex index;
  index.reserve(2);
  EXPECT_TRUE(index.insert(a, 1));
  EXPECT_FALSE(index.insert(again, 2));
  EXPECT_EQ(index.find("w"), 1u);
  EXPECT_EQ(index.size(), 1u);
}

TEST(NameIndex, GivenEmptyAndBinaryNames_ThenTheyAreNamesLikeAnyOther) {
  const std::string empty;
  const std::string nul("a\0b", 3);
  NameIndex index;
  EXPECT_TRUE(index.insert(empty, 0));
  EXPECT_TRUE(index.insert(nul, 1));
  EXPECT_EQ(index.find(""), 0u);
  EXPECT_EQ(index.find(std::string_view("a\0b", 3)), 1u);
  EXPECT_EQ(index.find("a"), std::nullopt);
}

TEST(NameIndex, GivenCleared_ThenEmptyAndReusable) {
  NameIndex index;
  EXPECT_TRUE(index.insert("x", 3));
  index.clear();
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.find("x"), std::nullopt);
  EXPECT_TRUE(index.insert("x", 4));
  EXPECT_EQ(index.find("x"), 4u);
}

}  // namespace
}  // namespace devalloc
