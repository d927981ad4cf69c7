// One program used from several threads at once, as docs/loading.md allows:
// loads, unloads, lookups and DLPack exports; and several loads of one
// runtime at once, with their progress callbacks. Meant to run under
// ThreadSanitizer (ctest label "concurrent"); without it, the checks on what
// each thread sees still hold.
#include "load_fixture.hpp"

#include <devalloc/core/device_buffer.hpp>

#include <gmock/gmock.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace devalloc::testing {
namespace {

constexpr int kRounds = 60;

class ConcurrentProgram : public LoadFixture, public ::testing::WithParamInterface<bool> {
 protected:
  std::shared_ptr<Runtime> runtime() {
    RuntimeConfig c = config(std::string("[plugins.host]\noptions = { async = ") +
                             (GetParam() ? "true" : "false") + " }\n");
    c.load.verify = true;
    return Runtime::create(c);
  }
};

// What a lookup sees is whole: a tensor that is found has every byte of its
// source in place (a load commits only after its copies and verify pass),
// and stays readable however the program changes meanwhile.
TEST_P(ConcurrentProgram, GivenLoadsUnloadsLookupsAndExportsFromSeveralThreads_ThenEveryThreadSeesWholeTensorsAndNothingLeaks) {
  const uint64_t before = DeviceBuffer::live_count();
  {
    auto program = runtime()->load(plan(), {"prefill"}, nullptr);
    ASSERT_TRUE(program.ok()) << program.status().message();
    std::shared_ptr<LoadedProgram> p = *program;
    std::atomic<int> loaders_done{0};
    std::atomic<int> heads_seen{0};

    auto loader = [&] {
      for (int i = 0; i < kRounds; ++i) {
        Status s = p->load_methods({"decode"});
        EXPECT_TRUE(s.ok()) << s.message();
        s = p->unload_method("decode");
        // The other loader may have unloaded it first.
        EXPECT_TRUE(s.ok() || s.code() == StatusCode::invalid_argument) << s.message();
      }
      ++loaders_done;
    };
    auto looker = [&] {
      while (loaders_done.load() < 2) {
        if (std::optional<LoadedTensor> head = p->find("head")) {
          ++heads_seen;
          EXPECT_EQ(read_back(*head), source("head"));
        }
        const std::optional<LoadedTensor> w_b = p->find("w.b");
        EXPECT_TRUE(w_b);  // prefill stays loaded throughout
        for (const LoadedTensor& t : p->tensors()) EXPECT_EQ(t.planned.memory_id == 1, t.name() == "head");
        for (const auto& b : p->buffers()) EXPECT_NE(b, nullptr);
        const std::vector<std::string> methods = p->methods();
        EXPECT_FALSE(methods.empty());
      }
    };
    auto exporter = [&] {
      while (loaders_done.load() < 2) {
        auto exported = p->export_dlpack("head");
        if (!exported.ok()) {
          EXPECT_EQ(exported.status().code(), StatusCode::invalid_argument);
          continue;
        }
        DLManagedTensor* managed = *exported;
        // Host memory: the export's bytes are readable in place, whatever
        // the loaders do meanwhile.
        EXPECT_EQ(std::memcmp(managed->dl_tensor.data, source("head").data(), source("head").size()), 0);
        managed->deleter(managed);
      }
    };

    std::vector<std::thread> threads;
    threads.emplace_back(loader);
    threads.emplace_back(loader);
    threads.emplace_back(looker);
    threads.emplace_back(looker);
    threads.emplace_back(exporter);
    for (auto& t : threads) t.join();
    EXPECT_EQ(p->methods(), std::vector<std::string>{"prefill"});
  }
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// Several programs of one runtime load and unload at once: they share the
// registry and its plugin instance.
TEST_P(ConcurrentProgram, GivenSeveralProgramsOfOneRuntime_WhenLoadedAndDroppedFromSeveralThreads_ThenEachIsWholeAndNothingLeaks) {
  const uint64_t before = DeviceBuffer::live_count();
  auto rt = runtime();
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds / 3; ++i) {
        auto program = rt->load(plan(), {}, nullptr);
        ASSERT_TRUE(program.ok()) << program.status().message();
        EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// Two loads of one runtime, the totals of their methods.
constexpr uint64_t kPrefillBytes = 256 + 512;         // w.a, w.b (and empty)
constexpr uint64_t kDecodeBytes = kPrefillBytes + 256;  // and head

// Holds the first progress call of each of two loads until the other load
// made its first call too: both loads are then surely in a callback at
// once. Gives up after a while (and says so), so that a runtime that
// serialized the callbacks of different loads fails the test instead of
// hanging it.
class BothInACallback {
 public:
  // Called by load `i` (0 or 1) from its callback.
  void arrive(int i) {
    std::unique_lock lock(mutex_);
    if (arrived_[i]) return;
    arrived_[i] = true;
    changed_.notify_all();
    if (!changed_.wait_for(lock, std::chrono::seconds(10), [&] { return arrived_[1 - i]; })) {
      gave_up_ = true;
    }
  }
  bool both() const { return arrived_[0] && arrived_[1] && !gave_up_; }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool arrived_[2] = {false, false};
  bool gave_up_ = false;
};

// What one load's callback saw.
struct ProgressCalls {
  std::vector<std::pair<uint64_t, uint64_t>> calls;  // (done, total)
  std::atomic<int> inside{0};
  bool overlapped = false;

  void check(uint64_t total) const {
    EXPECT_FALSE(overlapped) << "total " << total;
    ASSERT_FALSE(calls.empty()) << "total " << total;
    for (size_t k = 0; k < calls.size(); ++k) {
      EXPECT_EQ(calls[k].second, total) << "call " << k;
    }
    for (size_t k = 1; k < calls.size(); ++k) {
      EXPECT_GT(calls[k].first, calls[k - 1].first) << "call " << k;
    }
    EXPECT_EQ(calls.back().first, total);
  }
};

// Each load passes its own callback: it is called for that load alone, one
// call at a time, `done` rising to that load's total, while the other
// load's callback runs too; the runtime's callback is not called.
TEST_P(ConcurrentProgram, GivenTwoLoadsOfOneRuntimeWithTheirOwnCallbacks_WhenRunAtOnce_ThenEachCallbackSeesOnlyItsOwnLoadRisingToItsTotal) {
  auto rt = runtime();
  std::atomic<int> runtime_calls{0};
  rt->set_progress([&](uint64_t, uint64_t) { ++runtime_calls; });
  for (int round = 0; round < kRounds / 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    BothInACallback meet;
    ProgressCalls seen[2];
    const std::vector<std::string> methods[2] = {{"prefill"}, {"decode"}};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        ProgressCalls& mine = seen[i];
        auto program = rt->load(plan(), methods[i], nullptr, nullptr, std::nullopt,
                                [&](uint64_t done, uint64_t total) {
                                  if (++mine.inside > 1) mine.overlapped = true;
                                  mine.calls.emplace_back(done, total);
                                  meet.arrive(i);
                                  std::this_thread::yield();
                                  --mine.inside;
                                });
        ASSERT_TRUE(program.ok()) << program.status().message();
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(meet.both()) << "the two loads were never inside their callbacks at once";
    seen[0].check(kPrefillBytes);
    seen[1].check(kDecodeBytes);
  }
  EXPECT_EQ(runtime_calls.load(), 0);
}

// Loads that give no callback of their own share the runtime's: loads that
// run at once call it at once (it must be thread-safe), each call with its
// own load's done and total, rising per load; a call that waits for the
// other load does not stop that load.
TEST_P(ConcurrentProgram, GivenTwoLoadsOfOneRuntimeWithoutTheirOwnCallbacks_WhenRunAtOnce_ThenTheRuntimeCallbackSeesEachLoadsOwnBytes) {
  auto rt = runtime();
  for (int round = 0; round < kRounds / 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    BothInACallback meet;
    ProgressCalls seen[2];  // by total: [0] prefill's, [1] decode's
    rt->set_progress([&](uint64_t done, uint64_t total) {
      const int i = total == kDecodeBytes ? 1 : 0;
      ProgressCalls& load = seen[i];
      if (++load.inside > 1) load.overlapped = true;
      load.calls.emplace_back(done, total);  // one load's calls come one at a time
      meet.arrive(i);
      --load.inside;
    });
    const std::vector<std::string> methods[2] = {{"prefill"}, {"decode"}};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        auto program = rt->load(plan(), methods[i], nullptr);
        ASSERT_TRUE(program.ok()) << program.status().message();
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(meet.both()) << "the two loads were never inside their callbacks at once";
    seen[0].check(kPrefillBytes);
    seen[1].check(kDecodeBytes);
  }
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, ConcurrentProgram, ::testing::Bool(),
                         [](const auto& param_info) { return param_info.param ? "async" : "sync"; });

}  // namespace
}  // namespace devalloc::testing
