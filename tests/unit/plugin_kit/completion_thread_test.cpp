// The kit's completion thread with move-only work: a completion may own
// what cannot be copied (a Release, a promise), runs once, and what it owns
// is gone before wait_for_earlier returns.
#include <devalloc/plugin_kit/completion_thread.hpp>
#include <devalloc/plugin_kit/unique_function.hpp>

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <utility>

namespace devalloc::plugin {
namespace {

void count(void* fired) { ++*static_cast<int*>(fired); }

TEST(CompletionThread,
     GivenACompletionThatOwnsARelease_WhenItRuns_ThenItRunsOnceAndTheReleaseFiresOnce) {
  int fired = 0;
  int ran = 0;
  {
    CompletionThread thread;
    thread.push(
        [&ran, owned = Release(&count, &fired)]() mutable {
          ++ran;
          owned.fire();
        },
        Release());
    thread.wait_for_earlier();
    EXPECT_EQ(ran, 1);
    EXPECT_EQ(fired, 1);
    EXPECT_FALSE(thread.take_error().has_value());
  }
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(fired, 1) << "the owned release fired again when the completion was destroyed";
}

TEST(CompletionThread,
     GivenAnOwnedReleaseItDoesNotFire_WhenItHasRun_ThenItFiredBeforeTheWaitReturned) {
  int fired = 0;
  CompletionThread thread;
  // The worker waits in the first job, so that the second is queued first.
  std::promise<void> go;
  thread.push([started = go.get_future()]() mutable { started.wait(); }, Release());
  thread.push([owned = Release(&count, &fired)] {}, Release());
  EXPECT_EQ(fired, 0) << "fired while the completion was still queued";
  go.set_value();
  thread.wait_for_earlier();
  EXPECT_EQ(fired, 1);
}

TEST(UniqueFunction, GivenAMoveOnlyTarget_WhenMoved_ThenTheTargetMovesAndRunsFromItsNewOwner) {
  auto value = std::make_unique<int>(7);
  UniqueFunction<int(int)> add([v = std::move(value)](int x) { return *v + x; });
  UniqueFunction<int(int)> moved = std::move(add);
  EXPECT_FALSE(add);  // NOLINT(bugprone-use-after-move): moved-from is empty
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved(5), 12);
}

TEST(UniqueFunction, GivenATargetThatOwnsARelease_WhenSetToNull_ThenTheReleaseFiresThenOnce) {
  int fired = 0;
  UniqueFunction<void()> work([owned = Release(&count, &fired)] {});
  EXPECT_EQ(fired, 0);
  work = nullptr;
  EXPECT_FALSE(work);
  EXPECT_EQ(fired, 1);
}

}  // namespace
}  // namespace devalloc::plugin
