// The driver-failure walk (../common/driver_walk.hpp) of the Level Zero
// plugin on the fake driver, through the real loader: every driver call of
// one representative workload fails once, in its own run; each run reports
// the failure naming the call, releases the until-released copy exactly
// once, and leaves nothing live.
#include "level_zero_fixture.hpp"

#include <driver_walk.hpp>

#include <level_zero/ze_api.h>

namespace devalloc::level_zero_test {
namespace {

std::pair<std::shared_ptr<Plugin>, PluginError> load_level_zero() {
  return PluginLoader().load(kPlugin, {{"runtime_library", "libze_loader.so.1"}});
}

TEST(LevelZeroDriverWalk, EachDriverCallOfAWorkloadFailsOnce_ReportedNamedAndNothingLeaks) {
  // The loader loads the fake at the first zeInit; the handle below keeps
  // it (and its record) between the walk's instances.
  auto [warm_up, error] = load_level_zero();
  ASSERT_TRUE(warm_up) << error.status.message();
  const FakeZe fake;
  ASSERT_TRUE(fake.loaded()) << "the loader did not load " << kFakeDriver;
  warm_up.reset();

  fake_test::WalkTarget target;
  target.fake = &fake;
  target.load = load_level_zero;
  target.entry_points = {
      "zeInit",
      "zeDriverGet",
      "zeDeviceGet",
      "zeDeviceGetProperties",
      "zeDeviceGetStatus",
      "zeDeviceGetMemoryProperties",
      "zeDeviceGetCommandQueueGroupProperties",
      "zeDevicePciGetPropertiesExt",
      "zeContextCreate",
      "zeContextDestroy",
      "zeCommandListCreateImmediate",
      "zeCommandListDestroy",
      "zeCommandListAppendMemoryCopy",
      "zeCommandListAppendBarrier",
      "zeEventPoolCreate",
      "zeEventPoolDestroy",
      "zeEventCreate",
      "zeEventDestroy",
      "zeEventHostSynchronize",
      "zeEventQueryStatus",
      "zeEventHostReset",
      "zeMemAllocDevice",
      "zeMemAllocHost",
      "zeMemFree"};
  target.failure = ZE_RESULT_ERROR_UNKNOWN;
  target.recoverable = {
      {"zeEventHostSynchronize",
       "a failed wait for a copy's event is followed by polling the event until the copy is "
       "over"},
      {"zeEventHostReset", "an event is reset again before it goes back to the pool"}};
  target.device = 1;
  fake_test::DriverWalk(std::move(target)).walk_all();
}

}  // namespace
}  // namespace devalloc::level_zero_test
