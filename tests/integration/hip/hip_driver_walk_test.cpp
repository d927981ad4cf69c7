// The driver-failure walk (../common/driver_walk.hpp) of the HIP plugin on
// the fake HIP runtime: every runtime call of one representative workload
// fails once, in its own run; each run reports the failure naming the call,
// releases the until-released copy exactly once, and leaves nothing live.
#include "hip_fixture.hpp"

#include <driver_walk.hpp>

#include <gtest/gtest.h>

namespace devalloc::hip_test {
namespace {

TEST(HipDriverWalk, EachRuntimeCallOfAWorkloadFailsOnce_ReportedNamedAndNothingLeaks) {
  // Loaded by the first instance; the handle below keeps the fake (and its
  // record) loaded between the walk's instances.
  auto [warm_up, error] = load_hip(kFake);
  ASSERT_TRUE(warm_up) << error.status.message();
  const FakeHip fake(kFake);
  ASSERT_TRUE(fake.loaded());
  warm_up.reset();

  fake_test::WalkTarget target;
  target.fake = &fake;
  target.load = [] { return load_hip(kFake); };
  // hipGetErrorName and hipGetErrorString cannot fail.
  target.entry_points = {
      "hipGetDeviceCount",  "hipGetDevice",         "hipSetDevice",
      "hipDeviceGetName",   "hipDeviceTotalMem",    "hipDeviceGetUuid",
      "hipDeviceGetPCIBusId", "hipMemGetInfo",      "hipStreamCreateWithFlags",
      "hipStreamDestroy",   "hipStreamSynchronize", "hipStreamQuery",
      "hipStreamAddCallback", "hipMalloc",          "hipFree",
      "hipMemcpyHtoDAsync", "hipMemcpyDtoHAsync",   "hipHostMalloc",
      "hipHostFree"};
  target.failure = hipErrorUnknown;
  target.recoverable = {
      {"hipSetDevice", "the call that restores the caller's device is retried"}};
  // The walk's thread keeps device 0 current; the plugin works on device 1.
  const auto current = fake.control<devalloc_fake_hip_current_device_fn>("current_device");
  target.thread = [current] {
    const int device = current();
    return device == 0 ? std::string()
                       : "device " + std::to_string(device) + " current instead of device 0";
  };
  // Not the device current on a new thread.
  target.device = 1;
  fake_test::DriverWalk(std::move(target)).walk_all();
}

}  // namespace
}  // namespace devalloc::hip_test
