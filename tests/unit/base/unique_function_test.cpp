// UniqueFunction: a move-only callable, small ones held in place. What the
// plugin handle keeps per until-released copy (CopyCompletion).
#include <devalloc/unique_function.hpp>

#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <string>
#include <utility>

namespace devalloc {
namespace {

// Counts its live copies, so a test sees every construction destroyed once.
struct Tracked {
  explicit Tracked(int* counter) : live(counter) { ++*live; }
  Tracked(const Tracked& other) : live(other.live) { ++*live; }
  Tracked(Tracked&& other) noexcept : live(other.live) { ++*live; }
  ~Tracked() { --*live; }
  int* live;
};

TEST(UniqueFunction, GivenAMoveOnlyCapture_ThenItIsCalledWithItsArgumentsAndOwnsTheCapture) {
  auto owned = std::make_unique<int>(40);
  UniqueFunction<int(int)> f = [p = std::move(owned)](int add) { return *p + add; };
  ASSERT_TRUE(f);
  EXPECT_EQ(f(2), 42);
  UniqueFunction<int(int)> moved = std::move(f);
  EXPECT_FALSE(f);  // NOLINT(bugprone-use-after-move): a moved-from one is empty
  EXPECT_EQ(moved(3), 43);
}

TEST(UniqueFunction, GivenSmallAndLargeCaptures_ThenEachIsDestroyedOnceThroughMovesAndReset) {
  int live = 0;
  {
    UniqueFunction<void()> small = [t = Tracked(&live)] { (void)t; };
    std::array<char, 200> padding{};
    UniqueFunction<void()> large = [t = Tracked(&live), padding] { (void)t, (void)padding; };
    EXPECT_EQ(live, 2);
    UniqueFunction<void()> small2 = std::move(small);
    UniqueFunction<void()> large2 = std::move(large);
    EXPECT_EQ(live, 2) << "a move leaves no copy behind";
    small2();
    large2();
    large2.reset();
    EXPECT_EQ(live, 1);
    small2 = std::move(large2);  // the small one's capture goes
    EXPECT_EQ(live, 0);
    EXPECT_FALSE(small2);
  }
  EXPECT_EQ(live, 0);
}

TEST(UniqueFunction, GivenAnArgumentByRvalueReference_ThenTheCallableMayTakeIt) {
  std::string taken;
  UniqueFunction<void(std::string&&)> f = [&](std::string&& s) { taken = std::move(s); };
  f(std::string("outcome"));
  EXPECT_EQ(taken, "outcome");
}

}  // namespace
}  // namespace devalloc
