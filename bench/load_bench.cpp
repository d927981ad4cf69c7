// devalloc load against plain memcpy of the same bytes, measured in the same
// run on the same file. Prints GB/s and the ratio to the baseline; asserts
// nothing about speed.
//
//   devalloc_load_bench [--size-mib N] [--repeats N] [--dir DIR]
#include <devalloc/core/mapped_file.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/core/safetensors.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace devalloc;
namespace fs = std::filesystem;

struct Options {
  uint64_t size_mib = 256;
  int repeats = 5;
  fs::path dir = fs::temp_directory_path();
};

// Keeps the compiler from proving a copy unused.
void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

// Median seconds of `repeats` runs of body, after one warm-up run.
double median_seconds(int repeats, const std::function<void()>& body) {
  body();
  std::vector<double> runs;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// A model of `tensors` F16 tensors of equal size, and a plan placing all of
// them in one host buffer.
Plan make_model(const fs::path& dir, uint64_t total_bytes) {
  const uint64_t tensors = 64;
  const uint64_t each = total_bytes / tensors / 256 * 256;
  std::vector<std::vector<std::byte>> data(tensors, std::vector<std::byte>(each));
  std::vector<SafetensorsWriteTensor> out;
  Plan plan;
  plan.path = dir / "bench_plan.json";
  plan.buffers = {{0, "host", each * tensors, 256}};
  PlanMethod method{"main", {0}, {}};
  for (uint64_t i = 0; i < tensors; ++i) {
    for (uint64_t b = 0; b < each; b += 4096) data[i][b] = std::byte(i + b);
    const std::string name = "layers." + std::to_string(i) + ".weight";
    out.push_back({name, DType::f16, {each / 2}, data[i]});
    plan.tensors.push_back({name, DType::f16, {each / 2}, 0, i * each,
                            PlanSource{"bench_model.safetensors", name}});
    method.tensors.push_back(name);
  }
  plan.methods = {method};
  Status s = write_safetensors(dir / "bench_model.safetensors", out);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    std::exit(1);
  }
  return plan;
}

double load_seconds(const Plan& plan, int repeats, const char* async) {
  RuntimeConfig config = default_config();
  config.plugins["host"] = PluginConfig{"host", std::nullopt, {{"async", async}}, {}};
  auto runtime = Runtime::create(config);
  return median_seconds(repeats, [&] {
    auto program = runtime->load(plan, {}, nullptr);
    if (!program.ok()) {
      std::fprintf(stderr, "%s\n", program.status().message().c_str());
      std::exit(1);
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--size-mib") o.size_mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--repeats") o.repeats = std::atoi(argv[i + 1]);
    else if (flag == "--dir") o.dir = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--size-mib N] [--repeats N] [--dir DIR]\n", argv[0]);
      return 2;
    }
  }
  const fs::path dir = o.dir / ("devalloc-bench-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const Plan plan = make_model(dir, o.size_mib << 20);
  auto file = MappedFile::open(dir / "bench_model.safetensors");
  if (!file.ok()) return 1;
  const uint64_t bytes = plan.buffers[0].size;
  const std::byte* src = (*file)->data() + (*file)->size() - bytes;

  // Baselines. "fresh" pays for new memory as a load does: the host plugin
  // allocates each buffer anew. "warm" is the copy alone.
  const double fresh = median_seconds(o.repeats, [&] {
    void* dst = std::aligned_alloc(256, bytes);
    std::memcpy(dst, src, bytes);
    escape(dst);
    std::free(dst);
  });
  std::vector<std::byte> warm_buffer(bytes);
  const double warm = median_seconds(o.repeats, [&] {
    std::memcpy(warm_buffer.data(), src, bytes);
    escape(warm_buffer.data());
  });
  const double load_sync = load_seconds(plan, o.repeats, "false");
  const double load_async = load_seconds(plan, o.repeats, "true");

  auto row = [&](const char* what, double s) {
    std::printf("%-44s %8.4f s %8.2f GB/s %8.2fx\n", what, s, bytes / s / 1e9, fresh / s);
  };
  std::printf("%llu MiB in 64 tensors, median of %d runs (ratio: baseline time / time)\n",
              static_cast<unsigned long long>(bytes >> 20), o.repeats);
  row("baseline: memcpy into fresh aligned memory", fresh);
  row("memcpy into reused memory (copy alone)", warm);
  row("devalloc load, host plugin (sync)", load_sync);
  row("devalloc load, host plugin (async)", load_async);
  fs::remove_all(dir);
  return 0;
}
