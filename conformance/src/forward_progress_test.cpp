// PLUGIN-20 (forward progress) and PLUGIN-21 (release accounting), from the
// host's side: a host that needs a release calls synchronize and then has
// it; no copy is ever released twice.
#include "suite.hpp"

#include <vector>

namespace devalloc::conformance {
namespace {

using ForwardProgress = DeviceTest;
using ReleaseAccounting = DeviceTest;
DEVALLOC_CONFORMANCE_RULES(ForwardProgress, "PLUGIN-20");
DEVALLOC_CONFORMANCE_RULES(ReleaseAccounting, "PLUGIN-14, PLUGIN-21");

// What the core does with its staging ring: each slot is refilled as soon as
// the copy that read it was released, and a host waiting for a release calls
// synchronize instead of waiting for nothing. A plugin that releases only
// inside synchronize passes; one whose synchronize returns with a release
// still owed fails.
TEST_F(ForwardProgress, StagingRingRefilledAfterEachRelease_SynchronizeAlwaysHandsBackTheSlot) {
  constexpr int kSlots = 2;
  constexpr int kCopies = 32;
  constexpr uint64_t kChunk = 64 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_OK(base);
  auto& slots = keep_past_destroy<std::vector<std::vector<uint8_t>>>(
      kSlots, std::vector<uint8_t>(kChunk));
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    const int slot = i % kSlots;
    if (i >= kSlots) {
      ReleaseProbe& previous = probes[i - kSlots];
      if (previous.releases == 0) {
        ASSERT_OK(plugin().synchronize(kDevice));
      }
      ASSERT_TRUE(ReleasedExactlyOnce(
          previous, "when synchronize returned (PLUGIN-20: a plugin may defer a "
                    "release until synchronize, but no later)"))
          << "copy " << i - kSlots << ", staging slot " << slot;
    }
    fill_pattern(slots[slot], i);
    probes[i].arm(slots[slot]);
    ASSERT_OK(plugin().copy_to_device_until_released(
        kDevice, *base + i * kChunk, slots[slot].data(), kChunk,
        ReleaseProbe::on_release, &probes[i]));
  }
  ASSERT_OK(plugin().synchronize(kDevice));
  Result<std::vector<uint8_t>> read = read_device(kDevice, *base, kCopies * kChunk);
  ASSERT_OK(read);
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], "when synchronize returned"))
        << "copy " << i;
    EXPECT_TRUE(probes[i].source_intact) << "copy " << i << ": the plugin wrote to src";
    EXPECT_TRUE(BytesEqual(pattern(kChunk, i),
                           std::span<const uint8_t>(*read).subspan(i * kChunk, kChunk)))
        << "copy " << i << " did not land as its slot was when issued: its release came "
        << "before the copy had read the slot, which the test then refilled (PLUGIN-14)";
  }
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

// A release may come late, but once it came it never comes again: counts
// taken after synchronize do not change through a second synchronize,
// reads, frees and destroy.
TEST_F(ReleaseAccounting, ReleasesCountedAtSynchronize_StayAtOneThroughDestroy) {
  constexpr int kCopies = 16;
  constexpr uint64_t kChunk = 32 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kCopies * kChunk, 0);
  ASSERT_OK(base);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCopies);
  auto& probes = keep_past_destroy<std::vector<ReleaseProbe>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    sources[i] = pattern(kChunk, 100 + i);
    probes[i].arm(sources[i]);
    ASSERT_OK(plugin().copy_to_device_until_released(
        kDevice, *base + i * kChunk, sources[i].data(), kChunk,
        ReleaseProbe::on_release, &probes[i]));
  }
  ASSERT_OK(plugin().synchronize(kDevice));
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], "when synchronize returned"))
        << "copy " << i;
  }
  ASSERT_OK(plugin().synchronize(kDevice));
  Result<std::vector<uint8_t>> read = read_device(kDevice, *base, kCopies * kChunk);
  EXPECT_OK(read);
  EXPECT_OK(plugin().deallocate(kDevice, *base));
  destroy_plugin();
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(ReleasedExactlyOnce(probes[i], "after a second synchronize and destroy"))
        << "copy " << i;
  }
}

}  // namespace
}  // namespace devalloc::conformance
