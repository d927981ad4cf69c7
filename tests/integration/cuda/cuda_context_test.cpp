// The plugin must not depend on, nor disturb, the CUDA context that the
// calling thread has current. The fake serves memory of the current
// context's device only and records any call on a stream whose context is
// not current, so a plugin that forgets to push its own context fails here.
#include "cuda_fixture.hpp"

#include <deque>

namespace devalloc::cuda_test {
namespace {

constexpr size_t kChunk = 64 * 1024;

using CudaContexts = CudaPluginTest;

// Device 1's primary context, current on the calling thread while alive, as
// an application that uses CUDA itself would have it.
class OtherContextCurrent {
 public:
  OtherContextCurrent(const FakeCuda& fake, CUdevice device)
      : fake_(fake), device_(device) {
    auto retain = fake.get<decltype(&::cuDevicePrimaryCtxRetain)>(
        "cuDevicePrimaryCtxRetain");
    auto push =
        fake.get<decltype(&::cuCtxPushCurrent_v2)>("cuCtxPushCurrent_v2");
    EXPECT_EQ(retain(&context_, device), CUDA_SUCCESS);
    pushed_ = push(context_) == CUDA_SUCCESS;
    EXPECT_TRUE(pushed_);
  }
  ~OtherContextCurrent() {
    if (pushed_) pop_is_ours();
    auto release = fake_.get<decltype(&::cuDevicePrimaryCtxRelease_v2)>(
        "cuDevicePrimaryCtxRelease_v2");
    EXPECT_EQ(release(device_), CUDA_SUCCESS);
  }
  // Pops the context and says whether it was still the thread's current one.
  bool pop_is_ours() {
    auto pop = fake_.get<decltype(&::cuCtxPopCurrent_v2)>("cuCtxPopCurrent_v2");
    CUcontext popped = nullptr;
    pushed_ = false;
    return pop(&popped) == CUDA_SUCCESS && popped == context_;
  }

 private:
  const FakeCuda& fake_;
  CUdevice device_;
  CUcontext context_ = nullptr;
  bool pushed_ = false;
};

TEST_F(CudaContexts,
       OtherDevicesContextCurrent_SynchronizeOfDevice0WaitsForDevice0sCopies) {
  constexpr int kCopies = 16;  // with the fake's 200 us a copy, milliseconds
  ASSERT_GE(plugin().devices().size(), 2u);
  Result<uint64_t> base = plugin().allocate(0, kCopies * kChunk, 0);
  ASSERT_TRUE(base.ok());
  std::vector<std::vector<uint8_t>> sources;
  std::deque<ReleaseCounter> counters(kCopies);
  {
    OtherContextCurrent other(fake(), 1);
    for (int i = 0; i < kCopies; ++i) {
      sources.push_back(pattern(kChunk, i));
      ASSERT_TRUE(plugin()
                      .copy_to_device_until_released(
                          0, *base + i * kChunk, sources[i].data(), kChunk,
                          ReleaseCounter::on_release, &counters[i])
                      .ok());
    }
    ASSERT_TRUE(plugin().synchronize(0).ok());
    for (int i = 0; i < kCopies; ++i) {
      EXPECT_EQ(counters[i].releases, 1)
          << "copy " << i << " not released when synchronize(0) returned";
      EXPECT_EQ(fake().read(*base + i * kChunk, kChunk), sources[i])
          << "copy " << i << " had not landed when synchronize(0) returned";
    }
    EXPECT_TRUE(other.pop_is_ours())
        << "the plugin left another context current on the calling thread";
  }
  EXPECT_TRUE(plugin().deallocate(0, *base).ok());
}

TEST_F(CudaContexts,
       OtherDevicesContextCurrent_AllocationsAndCopiesLandOnTheDeviceAsked) {
  ASSERT_GE(plugin().devices().size(), 2u);
  OtherContextCurrent other(fake(), 1);
  Result<uint64_t> on0 = plugin().allocate(0, kChunk, 0);
  Result<uint64_t> on1 = plugin().allocate(1, kChunk, 0);
  ASSERT_TRUE(on0.ok() && on1.ok());
  EXPECT_EQ(fake().live_allocations(0), 1u);
  EXPECT_EQ(fake().live_allocations(1), 1u);
  const std::vector<uint8_t> a = pattern(kChunk, 10), b = pattern(kChunk, 11);
  ASSERT_TRUE(plugin().copy_to_device(0, *on0, a.data(), kChunk).ok());
  ASSERT_TRUE(plugin().copy_to_device(1, *on1, b.data(), kChunk).ok());
  std::vector<uint8_t> back(kChunk);
  ASSERT_TRUE(plugin().copy_to_host(0, back.data(), *on0, kChunk).ok());
  EXPECT_EQ(back, a);
  ASSERT_TRUE(plugin().copy_to_host(1, back.data(), *on1, kChunk).ok());
  EXPECT_EQ(back, b);
  EXPECT_TRUE(plugin().deallocate(0, *on0).ok());
  EXPECT_TRUE(plugin().deallocate(1, *on1).ok());
  EXPECT_EQ(fake().live_allocations(-1), 0u);
  EXPECT_TRUE(other.pop_is_ours());
}

}  // namespace
}  // namespace devalloc::cuda_test
