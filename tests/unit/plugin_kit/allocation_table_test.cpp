// The kit's allocation bookkeeping: alignment, ranges, and frees that never
// lose a runtime allocation.
#include <devalloc/plugin_kit/allocation_table.hpp>

#include <gtest/gtest.h>

#include <new>
#include <string>
#include <utility>
#include <vector>

namespace devalloc::plugin {
namespace {

TEST(AllocationTable, AlignedAddressInsideTheOverAllocation_RangesCheckedAgainstIt) {
  AllocationTable table;
  const uint64_t request = over_allocation(100, 4096, 256);
  EXPECT_EQ(request, 100u + 4096u - 256u);
  const uint64_t base = 0x10100;  // 256-aligned, not 4096-aligned
  const uint64_t address = table.adopt(base, 100, 4096, [](uint64_t) {});
  EXPECT_EQ(address % 4096, 0u);
  EXPECT_LE(address + 100, base + request);
  EXPECT_TRUE(table.contains(address, 100));
  EXPECT_FALSE(table.contains(address + 1, 100));
  EXPECT_THROW(table.require_range(address + 50, 51, "destination"), Failure);
}

TEST(AllocationTable, FreeThatFails_KeepsTheAllocationForAnotherTry) {
  AllocationTable table;
  const uint64_t address = table.adopt(0x1000, 64, 256, [](uint64_t) {});
  std::vector<uint64_t> freed;
  EXPECT_THROW(table.free(address, [](uint64_t) { throw Failure{DEVALLOC_STATUS_DEVICE_ERROR, "no"}; }),
               Failure);
  EXPECT_EQ(table.size(), 1u);
  table.free(address, [&](uint64_t base) { freed.push_back(base); });
  EXPECT_EQ(freed, std::vector<uint64_t>{0x1000});
  EXPECT_EQ(table.size(), 0u);
  EXPECT_THROW(table.free(address, [](uint64_t) {}), Failure);
}

// Two threads freeing one address: the second must be refused while the
// first is inside the runtime's free, or the runtime frees it twice. Here
// the second free runs from inside the first one's free_base, which the
// table calls without its lock held.
TEST(AllocationTable, FreeWhileAnotherFreeOfTheAddressRuns_IsRefusedAndTheRuntimeFreesOnce) {
  AllocationTable table;
  const uint64_t address = table.adopt(0x1000, 64, 256, [](uint64_t) {});
  int runtime_frees = 0;
  std::string second;
  table.free(address, [&](uint64_t) {
    ++runtime_frees;
    try {
      table.free(address, [&](uint64_t) { ++runtime_frees; });
    } catch (const Failure& f) {
      second = f.message;
    }
  });
  EXPECT_EQ(runtime_frees, 1);
  EXPECT_NE(second.find("is not a live allocation of this device (PLUGIN-12)"), std::string::npos)
      << second;
  EXPECT_EQ(table.size(), 0u);
}

// A runtime free may report a failure and still have freed the memory (a
// CUDA call may return an error of earlier asynchronous work); the entry
// stays, and the runtime may give the same memory out again. Handing it
// out twice would let two buffers share it, and a later free of either
// free the other's (PLUGIN-12): the second allocation is refused, naming
// the runtime call, and not freed (the live entry frees that memory).
TEST(AllocationTable, RuntimeGivesMemoryThatOverlapsALiveAllocation_RefusedNotFreedNotCounted) {
  AllocationTable table;
  const uint64_t live = table.adopt(0x10000, 4096, 256, [](uint64_t) {});
  for (const uint64_t base : {uint64_t{0x10000}, uint64_t{0x10800}, uint64_t{0xff00}}) {
    int frees = 0;
    try {
      const uint64_t address =
          table.adopt(base, 512, 256, [&](uint64_t) { ++frees; }, "cuMemAlloc_v2(bytesize = 512)");
      ADD_FAILURE() << "0x" << std::hex << base << " handed out again as 0x" << address;
    } catch (const Failure& f) {
      EXPECT_EQ(f.status, DEVALLOC_STATUS_DEVICE_ERROR);
      EXPECT_NE(f.message.find("cuMemAlloc_v2(bytesize = 512) returned 0x"), std::string::npos)
          << f.message;
      EXPECT_NE(f.message.find("overlaps the live allocation [0x10000, +4096)"), std::string::npos)
          << f.message;
    }
    EXPECT_EQ(frees, 0) << "0x" << std::hex << base;
  }
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.live_bytes(), 4096u);
  // Memory next to it is no overlap.
  EXPECT_EQ(table.adopt(0x11000, 64, 256, [](uint64_t) {}, "cuMemAlloc_v2(bytesize = 64)"),
            0x11000u);
  (void)live;
}

TEST(AllocationTable, LiveBytes_CountWhatWasAskedForUntilFreedAndSurviveAFailedFree) {
  AllocationTable table;
  const uint64_t a = table.adopt(0x1000, 100, 256, [](uint64_t) {});
  const uint64_t b = table.adopt(0x9000, 28, 256, [](uint64_t) {});
  EXPECT_EQ(table.live_bytes(), 128u);
  EXPECT_THROW(table.free(a, [](uint64_t) { throw Failure{DEVALLOC_STATUS_DEVICE_ERROR, "no"}; }),
               Failure);
  EXPECT_EQ(table.live_bytes(), 128u) << "a failed free keeps its bytes";
  table.free(a, [](uint64_t) {});
  EXPECT_EQ(table.live_bytes(), 28u);
  table.clear();
  EXPECT_EQ(table.live_bytes(), 0u);
  (void)b;
}

TEST(StagingTable, GivenALiveBuffer_WhenFreed_ThenTheFreeGetsTheBufferAndItsSize) {
  StagingTable table;
  alignas(64) static char buffers[2][4096];
  table.adopt(buffers[0], 4096, [](void*, uint64_t) {});
  table.adopt(buffers[1], 100, [](void*) {});
  std::vector<std::pair<void*, uint64_t>> freed;
  table.free(buffers[1], [&](void* p, uint64_t nbytes) { freed.emplace_back(p, nbytes); });
  table.free(buffers[0], [&](void* p, uint64_t nbytes) { freed.emplace_back(p, nbytes); });
  const std::vector<std::pair<void*, uint64_t>> expected = {{buffers[1], 100},
                                                            {buffers[0], 4096}};
  EXPECT_EQ(freed, expected);
  EXPECT_EQ(table.size(), 0u);
}

TEST(StagingTable, GivenAFreeThatTakesThePointerAlone_WhenFreed_ThenItIsCalledWithThePointer) {
  StagingTable table;
  static char buffer[64];
  table.adopt(buffer, sizeof buffer, [](void*) {});
  void* freed = nullptr;
  table.free(buffer, [&](void* p) { freed = p; });
  EXPECT_EQ(freed, buffer);
  EXPECT_THROW(table.free(buffer, [](void*, uint64_t) {}), Failure);
}

TEST(AllocationTable, GivenAFreeThatTakesTheSize_WhenFreed_ThenItGetsTheBaseAndTheBytesAskedFor) {
  AllocationTable table;
  const uint64_t address = table.adopt(0x10100, 100, 4096, [](uint64_t, uint64_t) {});
  uint64_t base = 0, nbytes = 0;
  table.free(address, [&](uint64_t b, uint64_t n) {
    base = b;
    nbytes = n;
  });
  EXPECT_EQ(base, 0x10100u);
  EXPECT_EQ(nbytes, 100u);
}

TEST(AllocationTable, OverflowingAlignedSize_IsOutOfDeviceMemory) {
  try {
    over_allocation(UINT64_MAX - 10, 4096, 256);
    FAIL() << "no failure";
  } catch (const Failure& f) {
    EXPECT_EQ(f.status, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY);
    EXPECT_NE(f.message.find("PLUGIN-11"), std::string::npos) << f.message;
  }
}

}  // namespace
}  // namespace devalloc::plugin
