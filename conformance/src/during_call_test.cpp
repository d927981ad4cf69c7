// PLUGIN-13: with DEVALLOC_SRC_DURING_CALL the caller owns src again the
// moment the call returns. Each test changes src right then; a plugin that
// reads it later copies the changed bytes and is caught when the device
// memory is read back.
#include "suite.hpp"

#include <cstring>
#include <vector>

namespace devalloc::conformance {
namespace {

using DuringCall = DeviceTest;
DEVALLOC_CONFORMANCE_RULES(DuringCall, "PLUGIN-13");

constexpr uint8_t kOverwritten = 0xee;
constexpr const char* kOverwrittenHint =
    "0xee, or the next chunk's bytes, on the device mean that src was read "
    "after the call returned (PLUGIN-13)";

TEST_F(DuringCall, SourceOverwrittenRightAfterReturn_DeviceHoldsOriginalBytes) {
  // 64 KiB .. 4 MiB, so both small copies and ones that a plugin would
  // rather hand to a DMA engine are covered; enough of them that a plugin
  // that reads src late on another thread loses the race every time.
  constexpr int kCopies = 16;
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (int i = 0; i < kCopies; ++i) {
    sizes.push_back((64 * kKiB) << (i % 7));
    offsets.push_back(total);
    total += sizes.back();
  }
  Result<uint64_t> base = plugin().allocate(kDevice, total, 0);
  ASSERT_OK(base);
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>(kCopies);
  for (int i = 0; i < kCopies; ++i) {
    sources[i] = pattern(sizes[i], i);
    ASSERT_OK(plugin().copy_to_device(kDevice, *base + offsets[i],
                                      sources[i].data(), sizes[i]));
    std::memset(sources[i].data(), kOverwritten, sizes[i]);
  }
  ASSERT_OK(plugin().synchronize(kDevice));
  Result<std::vector<uint8_t>> read = read_device(kDevice, *base, total);
  ASSERT_OK(read);
  for (int i = 0; i < kCopies; ++i) {
    EXPECT_TRUE(BytesEqual(pattern(sizes[i], i),
                           std::span<const uint8_t>(*read).subspan(
                               offsets[i], sizes[i])))
        << "copy " << i << " (" << sizes[i] << " bytes at offset "
        << offsets[i] << ") did not land as src was when the call returned; "
        << kOverwrittenHint;
  }
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

TEST_F(DuringCall, OneStagingBufferRefilledAfterEveryCall_EveryChunkLandsAsWritten) {
  // How a loader streams a file through a small buffer.
  constexpr int kChunks = 32;
  constexpr uint64_t kChunk = 64 * kKiB;
  Result<uint64_t> base = plugin().allocate(kDevice, kChunks * kChunk, 0);
  ASSERT_OK(base);
  auto& staging = keep_past_destroy<std::vector<uint8_t>>(kChunk);
  for (int i = 0; i < kChunks; ++i) {
    fill_pattern(staging, i);
    ASSERT_OK(plugin().copy_to_device(kDevice, *base + i * kChunk,
                                      staging.data(), kChunk));
  }
  std::memset(staging.data(), kOverwritten, kChunk);
  ASSERT_OK(plugin().synchronize(kDevice));
  Result<std::vector<uint8_t>> read =
      read_device(kDevice, *base, kChunks * kChunk);
  ASSERT_OK(read);
  for (int i = 0; i < kChunks; ++i) {
    EXPECT_TRUE(BytesEqual(pattern(kChunk, i),
                           std::span<const uint8_t>(*read).subspan(
                               i * kChunk, kChunk)))
        << "chunk " << i << "; " << kOverwrittenHint;
  }
  EXPECT_OK(plugin().deallocate(kDevice, *base));
}

}  // namespace
}  // namespace devalloc::conformance
