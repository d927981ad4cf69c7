// One program used from several threads at once, as docs/loading.md allows:
// loads, unloads, lookups and DLPack exports. Meant to run under
// ThreadSanitizer (ctest label "concurrent"); without it, the checks on what
// each thread sees still hold.
#include "load_fixture.hpp"

#include <devalloc/core/device_buffer.hpp>

#include <gmock/gmock.h>

#include <atomic>
#include <cstring>
#include <thread>
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

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, ConcurrentProgram, ::testing::Bool(),
                         [](const auto& param_info) { return param_info.param ? "async" : "sync"; });

}  // namespace
}  // namespace devalloc::testing
