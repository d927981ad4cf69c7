// The fault-injection walk: a two-device, two-method load with verify, run
// again and again with the N-th plugin call failing (N = 1, 2, ... until a
// run no longer reaches the fault), and with every device memory budget
// that cuts the load short. Each failed run must end with an error that says
// what failed, leave no buffer, no live allocation and no pending release
// behind, and leave an already loaded method as it was. Under ASan (the
// asan stage runs every ctest) it also shows that no failure path touches
// freed memory. Nothing here waits on time: a hang would fail the test by
// its ctest timeout.
#include "load_fixture.hpp"

#include <devalloc/core/device_buffer.hpp>
#include <devalloc/core/device_registry.hpp>

#include <gmock/gmock.h>

#include <cstdio>
#include <regex>

namespace devalloc::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr uint64_t kMaxWalk = 400;  // far above the calls of this load

class FaultWalk : public LoadFixture {
 protected:
  void SetUp() override {
    LoadFixture::SetUp();
    plan().buffers[1].device = "second:0";  // head on the second device
  }

  // Both devices under the layer: "host" (sync copies) and "second" (the
  // same plugin file with asynchronous copies).
  RuntimeConfig walk_config(const std::string& faulty, const FaultInjection& faults) {
    RuntimeConfig c = config(
        "[plugins.host]\nvalidate = true\n"
        "[plugins.second]\nlibrary = \"" + (std::filesystem::path(DEVALLOC_PLUGIN_BUILD_DIR) / "libdevalloc_host.so").string() +
        "\"\noptions = { async = \"true\" }\nvalidate = true\n"
        "[devices.\"second:0\"]\nuse = [\"second\", { index = 0 }]\n"
        // Staged copies: host memory is host-addressable (ABI 1.1), and a
        // direct read would skip the copy and release calls the walk covers.
        "[load]\nverify = true\nstaging = \"64KiB\"\ndirect = false\n");
    c.plugins[faulty].layers.faults = faults;
    return c;
  }

  static LayerCounters counters(Runtime& runtime, const char* plugin) {
    auto p = runtime.registry().plugin(plugin);
    EXPECT_TRUE(p.ok()) << p.status().message();
    auto c = p.ok() ? (*p)->layer_counters() : std::nullopt;
    EXPECT_TRUE(c) << plugin << " has no layer";
    return c.value_or(LayerCounters{});
  }

  // Loads prefill, then decode, as an application that loads methods one
  // by one would. Returns false once a run no longer reached the fault.
  bool run_once(const std::string& faulty, const FaultInjection& faults, const std::string& label) {
    SCOPED_TRACE(label);
    const uint64_t before = DeviceBuffer::live_count();
    auto runtime = Runtime::create(walk_config(faulty, faults));
    auto program = runtime->load(plan(), {.methods = {"prefill"}});
    Status failure = program.status();
    bool prefill_loaded = program.ok();
    if (program.ok()) failure = (*program)->load_methods({.methods = {"decode"}});

    const LayerCounters host = counters(*runtime, "host");
    const LayerCounters second = counters(*runtime, "second");
    const LayerCounters& at_fault = faulty == "host" ? host : second;
    if (at_fault.faults_injected == 0) {
      EXPECT_TRUE(failure.ok()) << failure.message();
      return false;
    }
    EXPECT_FALSE(failure.ok());
    // The error says what failed (the tensor, the buffer or the device it
    // was copying to) and why.
    EXPECT_THAT(failure.message(), HasSubstr("fault injection"));
    static const std::regex what("tensor \"[^\"]+\"|buffer [0-9]|synchronizing (host|second:0)");
    EXPECT_TRUE(std::regex_search(failure.message(), what)) << failure.message();
    for (const LayerCounters* c : {&host, &second}) {
      EXPECT_EQ(c->breaches, 0u) << "the core broke a rule of the ABI";
      EXPECT_EQ(c->pending_releases, 0u);
    }
    if (prefill_loaded) {
      // The first method stays loaded and whole; decode left nothing.
      EXPECT_EQ((*program)->methods(), std::vector<std::string>{"prefill"});
      EXPECT_FALSE((*program)->find("head"));
      EXPECT_EQ(read_back(*(*program)->find("w.b")), source("w.b"));
      EXPECT_EQ(counters(*runtime, "second").live_allocations, 0u);
      program = Status(StatusCode::internal, "dropped");
    }
    EXPECT_EQ(counters(*runtime, "host").live_allocations, 0u);
    EXPECT_EQ(counters(*runtime, "second").live_allocations, 0u);
    EXPECT_EQ(DeviceBuffer::live_count(), before);
    return true;
  }
};

TEST_F(FaultWalk, GivenTheNthCallOfEitherPluginFailing_ForEveryN_ThenEachLoadFailsCleanlyAndTheLastRunSucceeds) {
  for (const char* faulty : {"host", "second"}) {
    uint64_t n = 1;
    while (n <= kMaxWalk && run_once(faulty, FaultInjection{.fail_call = n},
                                     std::string(faulty) + " call #" + std::to_string(n))) {
      ++n;
    }
    EXPECT_LE(n, kMaxWalk) << "the walk did not end";
    std::printf("[ WALK     ] %s: %llu calls, each failed in turn\n", faulty,
                static_cast<unsigned long long>(n - 1));
    // Every call of a load is covered: allocate, two copies, synchronize,
    // releases and the verify read-backs, on both devices.
    EXPECT_GE(n, 6u) << faulty;
  }
}

TEST_F(FaultWalk, GivenADeviceMemoryBudget_ForEveryBudgetBelowThePlan_ThenTheLoadFailsNamingTheBufferAndLeavesNothing) {
  // Buffers 0 (768 B) and 2 (1024 B) are on host; 1 (256 B) on second.
  for (uint64_t budget = 128; budget <= 2048; budget += 128) {
    run_once("host", FaultInjection{.device_bytes = budget}, "host budget " + std::to_string(budget));
  }
  for (uint64_t budget = 64; budget <= 256; budget += 64) {
    run_once("second", FaultInjection{.device_bytes = budget}, "second budget " + std::to_string(budget));
  }
}


// PLUGIN-17 reports a copy that failed asynchronously to the next
// synchronize of its device, whoever calls it. Here another caller (as
// another load of the runtime, or an allocator, would) synchronizes the
// device after the load issued its copies and is told of the load's failed
// copy; the load's own synchronize then finds nothing. The load must still
// fail, not hand out bytes that may be wrong.
TEST_F(FaultWalk, GivenACopyWhoseFailureIsReportedToAnotherCallersSynchronize_ThenTheLoadFailsToo) {
  // One loading thread and "host" (copies within the call, releases inside
  // it): the plugin's calls come in the same order every run. The first
  // call of "host" whose fault makes a copy fail asynchronously (the layer
  // fails its release and reports it at the next synchronize).
  const auto one_thread = [&](const FaultInjection& faults) {
    RuntimeConfig c = walk_config("host", faults);
    c.load.threads = 1;
    return c;
  };
  uint64_t n = 0;
  for (uint64_t i = 1; i <= kMaxWalk && n == 0; ++i) {
    auto runtime = Runtime::create(one_thread(FaultInjection{.fail_call = i}));
    auto program = runtime->load(plan());
    if (counters(*runtime, "host").faults_injected == 0) break;
    if (!program.ok() &&
        program.status().message().find("failed asynchronously") != std::string::npos) {
      n = i;
    }
  }
  ASSERT_NE(n, 0u) << "no fault of host made a copy fail asynchronously";

  const uint64_t before = DeviceBuffer::live_count();
  auto runtime = Runtime::create(one_thread(FaultInjection{.fail_call = n}));
  Status others;
  bool synchronized = false;
  runtime->set_progress([&](uint64_t done, uint64_t total) {
    if (done != total || synchronized) return;  // every copy issued
    synchronized = true;
    auto host = runtime->registry().plugin("host");
    others = host.ok() ? (*host)->synchronize(0) : host.status();
  });
  auto program = runtime->load(plan());
  ASSERT_TRUE(synchronized);
  ASSERT_FALSE(others.ok()) << "the other caller's synchronize was not told of the failed copy";
  EXPECT_THAT(others.message(), HasSubstr("failed asynchronously"));
  ASSERT_FALSE(program.ok()) << "the load succeeded though one of its copies failed";
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("synchronizing host"), HasSubstr("by another caller failed"),
                    HasSubstr("failed asynchronously"), HasSubstr("PLUGIN-17")));
  EXPECT_EQ(counters(*runtime, "host").pending_releases, 0u);
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

}  // namespace
}  // namespace devalloc::testing
