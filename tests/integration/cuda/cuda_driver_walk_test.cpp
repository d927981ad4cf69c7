// The driver-failure walk (../common/driver_walk.hpp) of the CUDA plugin on
// the fake CUDA driver: every driver call of one representative workload
// fails once, in its own run; each run reports the failure naming the call,
// releases the until-released copy exactly once, and leaves nothing live.
#include "cuda_fixture.hpp"

#include <driver_walk.hpp>

namespace devalloc::cuda_test {
namespace {

TEST(CudaDriverWalk, EachDriverCallOfAWorkloadFailsOnce_ReportedNamedAndNothingLeaks) {
  // The fake is loaded by the first instance and stays (RTLD_NODELETE).
  auto [warm_up, error] = load_cuda_plugin(kFakeDriver);
  ASSERT_TRUE(warm_up) << error.status.message();
  const FakeCuda fake(kFakeDriver);
  ASSERT_TRUE(fake.loaded());
  warm_up.reset();

  fake_test::WalkTarget target;
  target.fake = &fake;
  target.load = [] { return load_cuda_plugin(kFakeDriver); };
  target.entry_points = {
      "cuGetErrorName",     "cuGetErrorString",     "cuInit",
      "cuDeviceGetCount",   "cuDeviceGet",          "cuDeviceGetName",
      "cuDeviceTotalMem_v2", "cuDeviceGetUuid_v2",  "cuDeviceGetPCIBusId",
      "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2", "cuCtxPushCurrent_v2",
      "cuCtxPopCurrent_v2", "cuMemGetInfo_v2",      "cuStreamCreate",
      "cuStreamDestroy_v2", "cuStreamSynchronize",  "cuStreamQuery",
      "cuLaunchHostFunc",   "cuMemAlloc_v2",        "cuMemFree_v2",
      "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemHostAlloc",
      "cuMemFreeHost"};
  target.failure = CUDA_ERROR_UNKNOWN;
  target.recoverable = {
      {"cuCtxPopCurrent_v2", "the pop that restores the caller's context is retried"}};
  const auto depth = fake.control<devalloc_fake_cuda_context_depth_fn>("context_depth");
  target.thread = [depth] {
    const int pushed = depth();
    return pushed == 0 ? std::string()
                       : std::to_string(pushed) + " context(s) left current (pushed, not popped)";
  };
  // The second device: its context is not the one pinned memory is
  // allocated with.
  target.device = 1;
  fake_test::DriverWalk(std::move(target)).walk_all();
}

}  // namespace
}  // namespace devalloc::cuda_test
