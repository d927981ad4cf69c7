// The load's own memory is bounded by the staging budget plus a term in
// the tensor count, whatever the model's size and the slot's
// (docs/config.md, [load] staging): no record per piece or per copy.
// Measured as the peak of the live bytes this program's operator new
// handed out during a load, for two models of one tensor that differ only
// in size, under the smallest staging ring (pieces of 4 KiB).
#include <devalloc/core/config.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/core/safetensors.hpp>

#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "scratch_dir.hpp"

namespace {

std::atomic<long long> g_live{0};
std::atomic<long long> g_peak{0};

void* counted(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  const long long now = g_live += static_cast<long long>(malloc_usable_size(p));
  long long peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void uncounted(void* p) noexcept {
  if (p == nullptr) return;
  g_live -= static_cast<long long>(malloc_usable_size(p));
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void operator delete(void* p) noexcept { uncounted(p); }
void operator delete[](void* p) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t) noexcept { uncounted(p); }

namespace devalloc {
namespace {

// The most live bytes during a load of one u8 tensor of `nbytes` through
// the host plugin, staged in one 4 KiB slot, above the live bytes before.
long long load_peak(const std::filesystem::path& dir, uint64_t nbytes) {
  const std::filesystem::path file = dir / ("m" + std::to_string(nbytes) + ".safetensors");
  {
    std::vector<std::byte> data(nbytes, std::byte{7});
    const std::vector<SafetensorsWriteTensor> tensors = {{"w", DType::u8, {nbytes}, data}};
    EXPECT_TRUE(write_safetensors(file, tensors).ok());
  }
  Plan plan;
  plan.path = dir / "plan.json";
  plan.buffers = {{0, "host", nbytes, 4096, std::nullopt}};
  plan.tensors = {{"w", DType::u8, {nbytes}, 0, 0,
                   PlanSource{file.filename().string(), "w", std::nullopt}}};
  plan.methods = {{"main", {0}, {"w"}}};
  auto config = parse_config("[load]\nstaging = \"4KiB\"\ndirect = false\nthreads = 1\n",
                             (dir / "devalloc.toml").string());
  EXPECT_TRUE(config.ok()) << config.status().message();
  auto runtime = Runtime::create(*config);
  const long long before = g_live.load();
  g_peak = before;
  LoadReport report;
  auto program = runtime->load(plan, {.report = &report});
  EXPECT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(report.pipeline.slot_bytes, 4096u);
  EXPECT_EQ(report.copies, nbytes / 4096);
  return g_peak.load() - before;
}

TEST(LoadBookkeeping, GivenAModelEightTimesLarger_ThenTheLoadTakesNoMoreOfItsOwnMemory) {
  test::ScratchDir dir("bookkeeping");
  const long long small = load_peak(dir.path(), uint64_t{1} << 20);  // 256 pieces
  const long long large = load_peak(dir.path(), uint64_t{8} << 20);  // 2048 pieces
  // A record per piece (or per copy) of even 16 bytes would add 28 KiB.
  EXPECT_LT(large - small, 16 << 10) << "1 MiB model: " << small << " bytes, 8 MiB: " << large;
}

}  // namespace
}  // namespace devalloc
