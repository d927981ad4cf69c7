// The fake driver's strict verdict at exit, which every strict test relies
// on to see a misuse no test examined: with DEVALLOC_FAKE_CUDA_STRICT=1 it
// counts what the process left behind too; with "calls" only the misuse of
// calls (the ExecuTorch tests, whose registry keeps a plugin instance and
// its primary contexts to the end).
#include "cuda_fixture.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace devalloc::cuda_test {
namespace {

// In a death test's child: the fake opened afresh, device 0's primary
// context retained and never released, and with `misuse`, a free with no
// context current (a violation). Then an ordinary exit.
[[noreturn]] void run_child(const char* strict, bool misuse) {
  ::setenv("DEVALLOC_FAKE_CUDA_STRICT", strict, 1);
  void* driver = ::dlopen(kFakeDriver.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) std::_Exit(10);
  const auto symbol = [&](const char* name) {
    void* fn = ::dlsym(driver, name);
    if (fn == nullptr) std::_Exit(11);
    return fn;
  };
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(symbol("cuInit"));
  auto retain =
      reinterpret_cast<CUresult (*)(CUcontext*, CUdevice)>(symbol("cuDevicePrimaryCtxRetain"));
  auto free = reinterpret_cast<CUresult (*)(CUdeviceptr)>(symbol("cuMemFree_v2"));
  CUcontext context = nullptr;
  if (init(0) != CUDA_SUCCESS || retain(&context, 0) != CUDA_SUCCESS) std::_Exit(12);
  if (misuse && free(CUdeviceptr{0x1000}) == CUDA_SUCCESS) std::_Exit(13);
  std::exit(0);
}

class CudaFakeStrictDeathTest : public ::testing::Test {
 protected:
  CudaFakeStrictDeathTest() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CudaFakeStrictDeathTest, GivenStrictOne_WhenAContextIsLeftRetained_ThenTheExitIsStatus3) {
  EXPECT_EXIT(run_child("1", false), ::testing::ExitedWithCode(3),
              "1 violation\\(s\\):\n  device 0's primary context is still retained 1 time");
}

TEST_F(CudaFakeStrictDeathTest, GivenStrictCalls_WhenOnlyAContextIsLeftRetained_ThenTheExitIsClean) {
  EXPECT_EXIT(run_child("calls", false), ::testing::ExitedWithCode(0), "");
}

TEST_F(CudaFakeStrictDeathTest, GivenStrictCalls_WhenACallIsMisused_ThenOnlyThatMisuseEndsTheProcess) {
  EXPECT_EXIT(run_child("calls", true), ::testing::ExitedWithCode(3),
              "fake libcuda: 1 violation\\(s\\):\n  cuMemFree_v2");
}

}  // namespace
}  // namespace devalloc::cuda_test
