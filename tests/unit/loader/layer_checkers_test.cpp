// The validation layer's checkers on their own (loader/src/layer_*.hpp):
// the allocation checker's bookkeeping of live allocations and mappings,
// and the source checker's life of a check, from remembered to read back.
#include "layer_allocations.hpp"
#include "layer_source_checks.hpp"

#include <devalloc/plugin_layer.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace devalloc::detail {
namespace {

TEST(LayerAllocations, GivenLiveAllocations_ThenOverlapsAreRefusedAndRangesInsideOneAreKnown) {
  LayerAllocations a;
  EXPECT_TRUE(a.add(0, 0x1000, 0x100));
  EXPECT_TRUE(a.add(0, 0x1100, 0x100)) << "adjacent is no overlap";
  EXPECT_FALSE(a.add(0, 0x10ff, 2)) << "overlaps both";
  EXPECT_FALSE(a.add(0, 0x0f80, 0x81)) << "overlaps the first from below";
  EXPECT_TRUE(a.add(1, 0x1000, 0x100)) << "another device";
  EXPECT_EQ(a.count(), 3u);
  EXPECT_EQ(a.bytes(), 0x300u);
  EXPECT_TRUE(a.inside(0, 0x1000, 0x100));
  EXPECT_TRUE(a.inside(0, 0x10f0, 0x10));
  EXPECT_FALSE(a.inside(0, 0x10f0, 0x11)) << "runs into the next allocation";
  EXPECT_FALSE(a.inside(0, 0x0fff, 1));
  EXPECT_FALSE(a.inside(2, 0x1000, 1));
}

TEST(LayerAllocations, GivenADeallocate_ThenTheRangeIsFreeAtOnceItsBytesGoWhenFreedAndItsMappingsEnd) {
  LayerAllocations a;
  ASSERT_TRUE(a.add(0, 0x1000, 0x100));
  int host = 0;
  a.add_mapping(0, &host, 0x1010, 0x10);
  EXPECT_TRUE(a.overlaps_mapping(0, 0x1000, 0x11));
  EXPECT_FALSE(a.overlaps_mapping(0, 0x1000, 0x10));

  EXPECT_EQ(a.take(0, 0x1010), std::nullopt) << "no base";
  ASSERT_EQ(a.take(0, 0x1000), 0x100u);
  EXPECT_EQ(a.take(0, 0x1000), std::nullopt) << "taken already";
  EXPECT_EQ(a.bytes(), 0x100u) << "counted until freed";
  a.put_back(0, 0x1000, 0x100);  // the plugin refused to free it
  EXPECT_TRUE(a.inside(0, 0x1000, 0x100));

  ASSERT_EQ(a.take(0, 0x1000), 0x100u);
  a.freed(0, 0x1000, 0x100);
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_EQ(a.count(), 0u);
  EXPECT_FALSE(a.is_mapped(0, &host));
  EXPECT_TRUE(a.add(0, 0x1000, 0x100)) << "the range may be handed out again";
}

TEST(LayerAllocations, GivenARangeMappedTwice_ThenEachUnmapEndsOne) {
  LayerAllocations a;
  int host = 0;
  a.add_mapping(0, &host, 0x1000, 0x10);
  a.add_mapping(0, &host, 0x1000, 0x10);
  a.remove_mapping(0, &host);
  EXPECT_TRUE(a.is_mapped(0, &host));
  a.remove_mapping(0, &host);
  EXPECT_FALSE(a.is_mapped(0, &host));
}

SourceCheck check_of(uint32_t device, uint64_t dst, uint64_t nbytes) {
  SourceCheck c;
  c.device = device;
  c.dst = dst;
  c.nbytes = nbytes;
  return c;
}

TEST(LayerSourceChecks, GivenACheck_ThenItIsReadBackOnlyOnceIssuedAndReleasedAndCountsOnce) {
  LayerSourceChecks s;
  s.remember(7, check_of(0, 0x1000, 64));
  EXPECT_TRUE(s.issued_on(0).empty()) << "its call has not returned";
  s.call_returned(7, true);
  EXPECT_EQ(s.issued_on(0), std::vector<uint64_t>{7});
  EXPECT_TRUE(s.issued_on(1).empty());

  s.find(7)->released = true;
  const auto read = s.begin_read(7);
  ASSERT_TRUE(read);
  EXPECT_EQ(read->dst, 0x1000u);
  EXPECT_TRUE(s.reading(0, 0x1020, 1));
  EXPECT_FALSE(s.begin_read(7)) << "read by one reader at a time";
  EXPECT_TRUE(s.end_read(7));
  EXPECT_EQ(s.done(), 1u);
  EXPECT_EQ(s.size(), 0u);
  EXPECT_FALSE(s.reading(0, 0x1020, 1));
}

TEST(LayerSourceChecks, GivenAFailedCallOrAMissingRelease_ThenTheCheckIsForgottenUnread) {
  LayerSourceChecks s;
  s.remember(1, check_of(0, 0x1000, 64));
  s.call_returned(1, false);
  EXPECT_EQ(s.find(1), nullptr) << "a failed copy lands nothing";
  s.remember(2, check_of(0, 0x2000, 64));
  s.call_returned(2, true);
  EXPECT_FALSE(s.begin_read(2)) << "unreleased: PLUGIN-20's breach, not this one's";
  EXPECT_EQ(s.find(2), nullptr);
  EXPECT_EQ(s.done(), 0u);
}

TEST(LayerSourceChecks, GivenARangeWrittenAgain_ThenChecksInItAreForgottenOrMadeStaleWhileRead) {
  LayerSourceChecks s;
  for (uint64_t id : {1, 2, 3}) {
    s.remember(id, check_of(0, 0x1000 * id, 64));
    s.call_returned(id, true);
    s.find(id)->released = true;
  }
  ASSERT_TRUE(s.begin_read(2));
  s.forget_range(0, 0x1000, 0x1020);  // covers checks 1 and 2
  EXPECT_EQ(s.find(1), nullptr);
  ASSERT_NE(s.find(2), nullptr) << "its reader drops it";
  EXPECT_FALSE(s.end_read(2)) << "stale: its result proves nothing";
  EXPECT_EQ(s.done(), 0u);
  s.forget({3});
  EXPECT_EQ(s.size(), 0u);
}

TEST(LayerSourceChecks, GivenMoreChecksThanKept_WhenMakingRoom_ThenTheOldestNotBeingReadGo) {
  LayerSourceChecks s;
  for (uint64_t id = 1; id <= kLayerSourceChecksKept; ++id) {
    s.remember(id, check_of(static_cast<uint32_t>(id % 2), 64 * id, 64));
    s.call_returned(id, true);
    s.find(id)->released = true;
  }
  ASSERT_TRUE(s.full());
  EXPECT_EQ(s.oldest_device(), 1u);
  ASSERT_TRUE(s.begin_read(1));
  s.make_room();
  EXPECT_FALSE(s.full());
  EXPECT_NE(s.find(1), nullptr) << "being read";
  EXPECT_EQ(s.find(2), nullptr) << "the oldest not being read";
  EXPECT_NE(s.find(3), nullptr);
}

TEST(LayerSourceChecks, GivenStagingBuffers_ThenOnlySourcesInsideOneAreStaging) {
  LayerSourceChecks s;
  std::vector<unsigned char> staging(256);
  s.add_staging(staging.data(), staging.size());
  EXPECT_TRUE(s.in_staging(staging.data() + 16, 240));
  EXPECT_FALSE(s.in_staging(staging.data() + 16, 241));
  s.remove_staging(staging.data());
  EXPECT_FALSE(s.in_staging(staging.data(), 1));
}

TEST(LayerSourceChecks, GivenPoison_ThenTheHashOfTheSourceChanges) {
  std::vector<unsigned char> bytes(64, 7);
  const uint64_t before = source_hash(bytes.data(), bytes.size());
  EXPECT_EQ(source_hash_more(source_hash(bytes.data(), 32), bytes.data() + 32, 32), before);
  poison_source(bytes.data(), bytes.size());
  EXPECT_NE(source_hash(bytes.data(), bytes.size()), before);
  EXPECT_EQ(bytes[0], 0xde);
}

}  // namespace
}  // namespace devalloc::detail
