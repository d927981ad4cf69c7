// One program used from several threads at once, as docs/loading.md allows:
// loads, unloads, lookups and DLPack exports; and several loads of one
// runtime at once, with their progress callbacks. Meant to run under
// ThreadSanitizer (ctest label "concurrent"); without it, the checks on what
// each thread sees still hold.
#include "load_fixture.hpp"

#include <devalloc/core/device_buffer.hpp>
#include <devalloc/core/device_registry.hpp>

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
    auto program = runtime()->load(plan(), {.methods = {"prefill"}});
    ASSERT_TRUE(program.ok()) << program.status().message();
    std::shared_ptr<LoadedProgram> p = *program;
    std::atomic<int> loaders_done{0};
    std::atomic<int> heads_seen{0};

    auto loader = [&] {
      for (int i = 0; i < kRounds; ++i) {
        Status s = p->load_methods({.methods = {"decode"}});
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
        auto program = rt->load(plan());
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
        auto program = rt->load(plan(), {.methods = methods[i], .progress = [&](uint64_t done, uint64_t total) {
                                  if (++mine.inside > 1) mine.overlapped = true;
                                  mine.calls.emplace_back(done, total);
                                  meet.arrive(i);
                                  std::this_thread::yield();
                                  --mine.inside;
                                }});
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
        auto program = rt->load(plan(), {.methods = methods[i]});
        ASSERT_TRUE(program.ok()) << program.status().message();
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(meet.both()) << "the two loads were never inside their callbacks at once";
    seen[0].check(kPrefillBytes);
    seen[1].check(kDecodeBytes);
  }
}


// A server's life: programs load, unload and export while another thread
// drops the plugin again and again (each next load gets a fresh instance,
// docs/loading.md "Recovering from a faulted device"); the exports are let
// go only after the runtime and every program are gone, from two threads.
// Each export still shows its bytes, and every buffer is freed at the end.
TEST_P(ConcurrentProgram, GivenThePluginDroppedWhileProgramsLoadAndExport_WhenExportsOutliveTheRuntime_ThenTheyStayWholeAndNothingLeaks) {
  const uint64_t before = DeviceBuffer::live_count();
  std::mutex late_mutex;
  std::vector<DLManagedTensor*> late;
  {
    auto rt = runtime();
    auto first = rt->load(plan(), {.methods = {"prefill"}});
    ASSERT_TRUE(first.ok()) << first.status().message();
    std::shared_ptr<LoadedProgram> p = *first;
    std::atomic<int> workers_done{0};
    auto loader = [&] {
      for (int i = 0; i < kRounds / 2; ++i) {
        Status s = p->load_methods({.methods = {"decode"}});
        EXPECT_TRUE(s.ok()) << s.message();
        if (auto e = p->export_dlpack("head"); e.ok()) {
          std::lock_guard lock(late_mutex);
          late.push_back(*e);
        }
        s = p->unload_method("decode");
        EXPECT_TRUE(s.ok()) << s.message();
      }
      ++workers_done;
    };
    auto fresh_loader = [&] {
      for (int i = 0; i < kRounds / 4; ++i) {
        auto q = rt->load(plan());
        ASSERT_TRUE(q.ok()) << q.status().message();
        EXPECT_EQ(read_back(*(*q)->find("head")), source("head"));
        auto e = (*q)->export_dlpack("w.b");
        ASSERT_TRUE(e.ok()) << e.status().message();
        std::lock_guard lock(late_mutex);
        late.push_back(*e);
      }
      ++workers_done;
    };
    auto dropper = [&] {
      while (workers_done.load() < 2) {
        rt->registry().drop_plugin("host");
        std::this_thread::yield();
      }
    };
    std::thread a(loader), b(fresh_loader), c(dropper);
    a.join();
    b.join();
    c.join();
  }
  for (DLManagedTensor* m : late) {
    const std::string name = m->dl_tensor.shape[0] == 128 ? "head" : "w.b";
    EXPECT_EQ(std::memcmp(m->dl_tensor.data, source(name).data(), source(name).size()), 0);
  }
  const auto delete_every_other = [&](size_t first) {
    for (size_t k = first; k < late.size(); k += 2) late[k]->deleter(late[k]);
  };
  std::thread d0(delete_every_other, 0), d1(delete_every_other, 1);
  d0.join();
  d1.join();
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// Loads that fail part way (buffer 1 on a plugin whose first copy the
// validation layer fails; the plugin is dropped after each, so the next
// instance fails again) beside
// loads of the same runtime that succeed: the good ones are whole, the bad
// ones hand out nothing, and nothing leaks.
TEST_P(ConcurrentProgram, GivenLoadsFailingPartWayBesideGoodOnes_ThenTheGoodAreWholeAndNothingLeaks) {
  const uint64_t before = DeviceBuffer::live_count();
  {
    RuntimeConfig c = config(std::string("[plugins.host]\noptions = { async = ") +
                             (GetParam() ? "true" : "false") + " }\n" +
                             "[plugins.faulty]\nlibrary = \"" +
                             (kZooDir / "libdevalloc_host_faulty.so").string() +
                             "\"\noptions = { async = \"true\" }\n"
                             "[devices.bad]\nuse = [\"faulty\", { index = 0 }]\n"
                             "[load]\ndirect = false\nverify = true\n");
    c.plugins["faulty"].layers.faults.fail_copy_at = 1;
    auto rt = Runtime::create(c);
    std::vector<std::thread> threads;
    std::atomic<int> good{0}, bad{0};
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kRounds / 3; ++i) {
          if (t == 0) {
            Plan p = plan();
            p.buffers[1].device = "bad";
            auto program = rt->load(p);
            if (program.ok()) {
              ++good;
              EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));
            } else {
              ++bad;
              EXPECT_THAT(program.status().message(),
                          ::testing::HasSubstr("fault injection (fail_copy_at = 1)"));
            }
            rt->registry().drop_plugin("faulty");
          } else {
            auto program = rt->load(plan());
            ASSERT_TRUE(program.ok()) << program.status().message();
            EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));
            EXPECT_EQ(read_back(*(*program)->find("w.b")), source("w.b"));
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_GT(bad.load(), 0);
  }
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

// Many pieces through small rings: programs of two runtimes load, load more,
// unload and export at once through one SafetensorsCache, staged (tickets,
// releases, forced synchronizes); one runtime verifies under the validation
// layer with its source checks, the other's plugin releases late and is
// dropped again and again.
TEST_P(ConcurrentProgram, GivenManyPiecesAndProgramsOfTwoRuntimes_WhenLoadedUnloadedAndExportedAtOnce_ThenEachIsWholeAndNothingLeaks) {
  constexpr uint64_t kCount = 48, kBytes = 4096;
  std::vector<std::vector<std::byte>> data(kCount);
  std::vector<SafetensorsWriteTensor> out;
  Plan big;
  big.path = dir() / "big.json";
  big.buffers = {{0, "host", kCount * kBytes, 4096, std::nullopt}, {1, "host", kCount * kBytes, 4096, std::nullopt}};
  PlanMethod a{"a", {0}, {}}, b{"b", {0, 1}, {}};
  for (uint64_t i = 0; i < kCount; ++i) {
    data[i].resize(kBytes);
    for (uint64_t k = 0; k < kBytes; ++k) data[i][k] = static_cast<std::byte>((k * 7 + i * 13) & 0xff);
    const std::string n = "t" + std::to_string(i);
    out.push_back({n, DType::u8, {kBytes}, data[i]});
    const bool in_b = i % 2 == 1;
    big.tensors.push_back(PlanTensor{n, DType::u8, {kBytes}, in_b ? 1u : 0u, i * kBytes,
                                     PlanSource{"big.safetensors", n, std::nullopt}});
    (in_b ? b : a).tensors.push_back(n);
    if (!in_b && i % 4 == 0) b.tensors.push_back(n);
  }
  big.methods = {a, b};
  ASSERT_TRUE(write_safetensors(dir() / "big.safetensors", out).ok());
  ASSERT_TRUE(validate_plan(big).ok()) << validate_plan(big).message();
  const auto plan_ptr = std::make_shared<const Plan>(big);

  const uint64_t before = DeviceBuffer::live_count();
  {
    const std::string lib = (kZooDir / "libdevalloc_host_faulty.so").string();
    auto rt1 = Runtime::create(config(std::string("[plugins.host]\noptions = { async = ") +
                                      (GetParam() ? "true" : "false") +
                                      " }\nvalidate = \"sources\"\n[load]\ndirect = false\nstaging = \"16KiB\"\n"
                                      "threads = 4\nverify = true\n"));
    auto rt2 = Runtime::create(config("[plugins.late]\nlibrary = \"" + lib +
                                      "\"\noptions = { async = \"true\", release_late_ms = \"1\" }\n"
                                      "[devices.host]\nuse = [\"late\", { index = 0 }]\n"
                                      "[load]\ndirect = false\nstaging = \"16KiB\"\nthreads = 3\n"));
    SafetensorsCache cache;
    std::atomic<int> running{4};
    std::vector<DLManagedTensor*> exports;
    std::mutex m;
    auto worker = [&](std::shared_ptr<Runtime> rt, int seed) {
      struct Done {
        std::atomic<int>& n;
        ~Done() { --n; }
      } done{running};
      for (int r = 0; r < 6; ++r) {
        auto p = rt->load(plan_ptr, {.methods = {seed % 2 ? "a" : "b"}, .files = &cache});
        ASSERT_TRUE(p.ok()) << p.status().message();
        Status s = (*p)->load_methods({.methods = {seed % 2 ? "b" : "a"}, .files = &cache});
        ASSERT_TRUE(s.ok()) << s.message();
        for (uint64_t i = 0; i < kCount; i += 5) {
          auto t = (*p)->find("t" + std::to_string(i));
          ASSERT_TRUE(t);
          std::vector<std::byte> back(kBytes);
          ASSERT_TRUE(t->device().plugin->copy_to_host(t->device().device, back.data(), t->address(), kBytes).ok());
          EXPECT_EQ(back, data[i]) << i;
        }
        auto e = (*p)->export_dlpack("t3");
        ASSERT_TRUE(e.ok());
        {
          std::lock_guard lock(m);
          exports.push_back(*e);
        }
        EXPECT_TRUE((*p)->unload_method("b").ok());
      }
    };
    std::thread w1(worker, rt1, 0), w2(worker, rt1, 1), w3(worker, rt2, 2), w4(worker, rt2, 3);
    std::thread dropper([&] {
      while (running.load() > 0) {
        rt2->registry().drop_plugin("late");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    w1.join(); w2.join(); w3.join(); w4.join(); dropper.join();
    for (DLManagedTensor* e : exports) {
      EXPECT_EQ(std::memcmp(e->dl_tensor.data, data[3].data(), kBytes), 0);
      e->deleter(e);
    }
  }
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}


// A callback may wait for another load of the runtime to finish (loads never
// wait for each other's callbacks), also through a plugin that releases
// only in synchronize, with one loading thread each: the waiting load holds
// unreleased copies that only the other load's synchronize releases.
TEST_P(ConcurrentProgram, GivenACallbackThatWaitsForAnotherLoadOfTheRuntime_ThenBothFinish) {
  const std::string lib = (kZooDir / "libdevalloc_host_release_on_sync.so").string();
  auto rt = Runtime::create(config("[plugins.s]\nlibrary = \"" + lib +
                                   "\"\noptions = { async = " + (GetParam() ? "true" : "false") +
                                   " }\n[devices.host]\nuse = [\"s\", { index = 0 }]\n"
                                   "[load]\ndirect = false\nstaging = \"4KiB\"\nthreads = 1\n"));
  for (int round = 0; round < 5; ++round) {
    std::mutex m;
    std::condition_variable cv;
    bool b_done = false;
    std::thread b;
    auto a = rt->load(plan(), {.progress = [&](uint64_t, uint64_t) {
      if (b.joinable()) return;
      b = std::thread([&] {
        auto q = rt->load(plan());
        EXPECT_TRUE(q.ok()) << q.status().message();
        std::lock_guard lock(m);
        b_done = true;
        cv.notify_all();
      });
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return b_done; });
    }});
    ASSERT_TRUE(a.ok()) << a.status().message();
    b.join();
  }
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, ConcurrentProgram, ::testing::Bool(),
                         [](const auto& param_info) { return param_info.param ? "async" : "sync"; });

}  // namespace
}  // namespace devalloc::testing
