// Allocations that fail, one at a time, at every allocation a call makes:
// the calls that return a Status return one (no exception leaves them), a
// load that fails leaves nothing allocated on the device, and one that
// succeeds is whole. This program replaces the global operator new, so
// that the N-th allocation of a call can be made to fail; it is inert
// until a test arms it.
#include "load_fixture.hpp"

#include <devalloc/core/device_buffer.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <optional>
#include <type_traits>
#include <string>
#include <vector>

namespace {

// Allocations left before the one that fails; negative: none fails.
std::atomic<long> g_countdown{-1};

}  // namespace

// GCC sees the malloc below through the inlined operator delete's free and
// calls them mismatched; they are the pair this program defines.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t size) {
  if (g_countdown.load(std::memory_order_relaxed) >= 0 && g_countdown.fetch_sub(1) == 0) {
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace devalloc::testing {
namespace {

// One call of api() whose n-th allocation fails (counting from 0; only the
// call's own allocations are counted: what the test does around it is not).
template <class Api>
struct Armed {
  std::optional<std::invoke_result_t<Api&>> result;  // empty if it threw
  bool threw = false;
  bool none_failed = false;  // n was past the call's last allocation
};

template <class Api>
Armed<Api> call_failing(long n, Api& api) {
  Armed<Api> out;
  g_countdown = n;
  try {
    out.result.emplace(api());
  } catch (...) {
    out.threw = true;
  }
  out.none_failed = g_countdown.exchange(-1) >= 0;
  return out;
}

// Calls api() with its allocation n failing for n = 0, 1, ... until one run
// in which none failed, and check(n, armed) after each run. Returns the
// number of runs.
template <class Api, class Check>
long sweep(Api&& api, Check&& check) {
  for (long n = 0;; ++n) {
    Armed<Api> armed = call_failing(n, api);
    EXPECT_FALSE(armed.threw) << "an exception left the call when allocation " << n << " failed";
    check(n, armed);
    if (armed.none_failed) return n + 1;
    if (n > 100000) {
      ADD_FAILURE() << "the sweep does not end";
      return n;
    }
  }
}

Status status_of(const Status& status) { return status; }
template <class T>
Status status_of(const Result<T>& result) {
  return result.status();
}

class OutOfMemory : public LoadFixture {};

// The whole load in a fresh runtime: loading the plugin, reading the
// header, planning the copies, the loading threads, verify, the commit.
TEST_F(OutOfMemory, GivenEachAllocationOfALoadFailingInTurn_ThenItFailsWithAStatusLeavingNothingOrLoadsWhole) {
  const uint64_t before = DeviceBuffer::live_count();
  RuntimeConfig c = config("[plugins.host]\noptions = { async = true }\n[load]\nthreads = 2\n");
  c.load.verify = true;
  const std::shared_ptr<const Plan> shared = std::make_shared<const Plan>(plan());
  const LoadRequest request;  // every method
  std::shared_ptr<Runtime> runtime = Runtime::create(c);
  long failures = 0;
  const long runs = sweep(
      [&] { return runtime->load(shared, request); },
      [&](long n, auto& armed) {
        if (armed.result && !armed.result->ok()) {
          ++failures;
        } else if (armed.result) {
          for (const char* name : {"w.a", "w.b", "head"}) {
            const std::optional<LoadedTensor> t = (**armed.result)->find(name);
            ASSERT_TRUE(t) << name << " after allocation " << n;
            EXPECT_EQ(read_back(*t), source(name)) << name << " after allocation " << n;
          }
        }
        armed.result.reset();
        runtime = Runtime::create(c);  // the next run loads the plugin again
        EXPECT_EQ(DeviceBuffer::live_count(), before) << "after allocation " << n;
      });
  EXPECT_GT(runs, 100);
  EXPECT_GT(failures, 0);
  // Nothing of it lasts: among the failed allocations were those of opening
  // the plugin (around dlopen, not in the plugin's code), which must not
  // have left the process unable to open plugins.
  auto again = Runtime::create(c)->load(shared, request);
  EXPECT_TRUE(again.ok()) << again.status().message();
}

// A null plan is refused with a Status: the message is an allocation too,
// and when it fails, no exception leaves Runtime::load either.
TEST_F(OutOfMemory, GivenANullPlanAndEachAllocationFailingInTurn_ThenLoadRefusesWithAStatus) {
  std::shared_ptr<Runtime> runtime = Runtime::create(default_config());
  const std::shared_ptr<const Plan> none;

  const LoadRequest request;
  const long runs = sweep([&] { return runtime->load(none, request); },
                          [&](long n, auto& armed) {
                            if (!armed.result) return;
                            EXPECT_FALSE(armed.result->ok()) << "after allocation " << n;
                          });
  EXPECT_GT(runs, 1);
}

// A program's own calls: loading a method more, unloading one, exporting.
TEST_F(OutOfMemory, GivenEachAllocationOfAProgramsCallsFailingInTurn_ThenEachReturnsAStatusAndTheProgramStaysWhole) {
  auto runtime = Runtime::create(config("[plugins.host]\noptions = { async = false }\n"));
  auto loaded = runtime->load(plan(), {.methods = {"prefill"}});
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  std::shared_ptr<LoadedProgram> program = *loaded;
  // What is loaded is all there and right: "decode" (which adds head) is
  // loaded or not, and whole either way.
  const auto whole = [&](bool decode, long n) {
    const std::vector<std::string> methods = program->methods();
    EXPECT_EQ(std::find(methods.begin(), methods.end(), "decode") != methods.end(), decode)
        << "after allocation " << n;
    EXPECT_EQ(program->find("head").has_value(), decode) << "after allocation " << n;
    for (const char* name : {"w.a", "w.b", "head"}) {
      if (!decode && std::string(name) == "head") continue;
      const std::optional<LoadedTensor> t = program->find(name);
      ASSERT_TRUE(t) << name << " after allocation " << n;
      EXPECT_EQ(read_back(*t), source(name)) << name << " after allocation " << n;
    }
  };
  // Made here: an allocation of the request itself is the test's, not the
  // call's.
  const LoadRequest decode{.methods = {"decode"}};
  sweep([&] { return program->load_methods(decode); },
        [&](long n, auto& armed) {
          const bool loaded_it = armed.result && armed.result->ok();
          whole(loaded_it, n);
          if (loaded_it) {
            ASSERT_TRUE(program->unload_method("decode").ok());
          }
        });
  ASSERT_TRUE(program->load_methods(decode).ok());
  sweep([&] { return program->unload_method("decode"); },
        [&](long n, auto& armed) {
          const bool unloaded = armed.result && armed.result->ok();
          whole(!unloaded, n);
          if (unloaded) {
            ASSERT_TRUE(program->load_methods(decode).ok());
          }
        });
  sweep([&] { return program->export_dlpack("w.a"); },
        [&](long n, auto& armed) {
          if (armed.result && armed.result->ok()) (**armed.result)->deleter(**armed.result);
          whole(true, n);
        });
}

// Dropping a program whose plugin refuses to free its buffers: each
// buffer's destructor says so on stderr, and an allocation that fails
// while it words that does not end the process (destructors are noexcept).
TEST_F(OutOfMemory, GivenAPluginThatRefusesToFree_WhenAProgramIsDroppedWhileAllocationsFail_ThenNothingEscapes) {
  const uint64_t before = DeviceBuffer::live_count();
  const RuntimeConfig c = config("[plugins.zoo]\nlibrary = \"" +
                                 (kZooDir / "libdevalloc_zoo_refuses_free.so").string() +
                                 "\"\n[devices.host]\nuse = [\"zoo\", { index = 0 }]\n");
  std::shared_ptr<Runtime> runtime = Runtime::create(c);
  const std::shared_ptr<const Plan> shared = std::make_shared<const Plan>(plan());
  std::shared_ptr<LoadedProgram> program;
  const auto load = [&] {
    auto loaded = runtime->load(shared);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    program = *loaded;
  };
  load();
  ASSERT_GT(DeviceBuffer::live_count(), before);
  const long runs = sweep(
      [&] {
        program.reset();
        return 0;
      },
      [&](long n, auto&) {
        EXPECT_EQ(DeviceBuffer::live_count(), before) << "after allocation " << n;
        load();
      });
  EXPECT_GT(runs, 1);
}

// Planning: building, writing, reading and validating a plan.
TEST_F(OutOfMemory, GivenEachAllocationOfPlanningFailingInTurn_ThenEachCallReturnsAStatus) {
  const std::vector<std::filesystem::path> files = {dir() / "model.safetensors"};
  const std::filesystem::path written = dir() / "built.json";
  const auto no_temporary_left = [&](long n) {
    for (const auto& entry : std::filesystem::directory_iterator(dir())) {
      EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
          << entry.path() << " after allocation " << n;
    }
  };
  const PlanBuildOptions options;  // a default argument would allocate in the test's part
  // The inputs are good: a failure can only be the allocation, and says so
  // (not invalid_argument, which the program reports as bad input).
  const auto out_of_memory_only = [](long n, auto& armed) {
    if (!armed.result) return;
    const Status status = status_of(*armed.result);
    EXPECT_TRUE(status.ok() || status.code() == StatusCode::out_of_host_memory)
        << "allocation " << n << ": " << status.message();
  };
  sweep([&] { return build_plan(files, written, options); }, out_of_memory_only);
  auto built = build_plan(files, written, options);
  ASSERT_TRUE(built.ok()) << built.status().message();
  sweep([&] { return write_plan(*built, written); },
        [&](long n, auto&) { no_temporary_left(n); });
  sweep([&] { return read_plan(written); }, out_of_memory_only);
  auto read = read_plan(written);
  ASSERT_TRUE(read.ok()) << read.status().message();
  sweep([&] { return validate_plan(*read); }, out_of_memory_only);
  const std::filesystem::path copy = dir() / "copy.safetensors";
  sweep([&] { return write_safetensors(copy, {}); },
        [&](long n, auto&) { no_temporary_left(n); });
}

}  // namespace
}  // namespace devalloc::testing
