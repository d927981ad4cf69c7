// devalloc's load onto a real driver against that driver's raw limits,
// measured in one run on the same bytes, for Vulkan (Mesa's lavapipe) and
// OpenCL (PoCL):
//   (a) the driver's copy path: host-visible staging -> device buffer,
//       --chunk copies (64 MiB), two in flight (driver_bench_vulkan.cpp,
//       driver_bench_opencl.cpp say which calls);
//   (b) two threads memcpy the file's mapping into mapped device memory
//       (map, copy, unmap);
//   (c) two threads memcpy the file's mapping into host memory: the
//       baseline;
//   (d) devalloc: Runtime::load of a safetensors file of one tensor per
//       --chunk bytes, each its own buffer, onto vulkan:0 / opencl:0 through
//       the plugins of this build tree ([load] direct = true, the default:
//       the report says whether it read into mapped device memory), and the
//       same with [load] direct = false (through the staging ring and the
//       plugin's copies).
// Everything is warm: (a) and (b) write into buffers allocated and touched
// before the clock starts, (c) into touched host memory, the file is in the
// page cache, (b) and (c) read one mapping of it made and read through
// before, and every path runs once untimed. (d) maps the file and
// allocates its buffers in every load, as a load does; malloc keeps freed
// memory (mallopt, as devalloc_bench), so a driver that allocates device
// memory with malloc (lavapipe, PoCL) gets warm pages back, and each load's
// program is freed before the next load. The first load is reported apart
// (cold), and each load row says how many minor page faults the process
// took during its loads (getrusage): a load that got fresh pages faults
// each 4 KiB of them in, which is what makes a cold load slow. Every path runs once per repeat, the order rotated by one each
// repeat; the figures are medians (min and max beside). Bytes are checked
// outside the clock: every load's through its plugin (copy_to_host) right
// after it, those of (a) and (b) through the driver after the timed runs.
//
// Exit status: 0 whatever the figures; 1 when a driver call, a load or a
// byte check fails; 2 for bad arguments. A driver that is absent is
// skipped; a plugin that is absent leaves (d) not run, unless
// --require-plugins (the ctest smoke run, where the plugins were built).
//
//   devalloc_driver_bench [--quick] [--size MiB] [--chunk MiB] [--repeats N]
//                         [--only vulkan,opencl] [--dir DIR] [--require-plugins]
#include "driver_bench.hpp"

#include <devalloc/core/config.hpp>
#include <devalloc/core/mapped_file.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/device_registry.hpp>
#include <devalloc/core/runtime.hpp>

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef DEVALLOC_BENCH_BUILD_TYPE
#define DEVALLOC_BENCH_BUILD_TYPE "unknown"  // bench/CMakeLists.txt sets it
#endif

namespace devalloc::bench {

void two_thread_copy(std::byte* dst, const std::byte* src, uint64_t n) {
  const uint64_t half = n / 2;
  std::thread other([=] { std::memcpy(dst + half, src + half, n - half); });
  std::memcpy(dst, src, half);
  other.join();
}

std::string first_difference(const std::byte* actual, const std::byte* expected, uint64_t n,
                             uint64_t base, uint64_t total) {
  if (std::memcmp(actual, expected, n) == 0) return {};
  uint64_t i = 0;
  while (actual[i] == expected[i]) ++i;
  char text[160];
  std::snprintf(text, sizeof text, "byte %llu of %llu is 0x%02x, expected 0x%02x",
                static_cast<unsigned long long>(base + i), static_cast<unsigned long long>(total),
                static_cast<unsigned>(actual[i]), static_cast<unsigned>(expected[i]));
  return text;
}

}  // namespace devalloc::bench

namespace {

using namespace devalloc;
using namespace devalloc::bench;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  bool quick = false;
  uint64_t size_mib = 1024;
  uint64_t chunk_mib = 64;
  int repeats = 5;
  std::vector<std::string> drivers = {"vulkan", "opencl"};
  fs::path dir = fs::temp_directory_path();
  bool require_plugins = false;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "devalloc_driver_bench: %s\n", what.c_str());
  std::exit(1);
}

// Seconds (or another count) of each repeat.
struct Figure {
  std::vector<double> values;
  bool empty() const { return values.empty(); }
  double at(double q) const {
    std::vector<double> s = values;
    std::sort(s.begin(), s.end());
    const double k = q * static_cast<double>(s.size() - 1);
    const size_t lo = static_cast<size_t>(k);
    const size_t hi = std::min(lo + 1, s.size() - 1);
    return s[lo] + (s[hi] - s[lo]) * (k - static_cast<double>(lo));
  }
  double median() const { return at(0.5); }
  double gbps(uint64_t bytes) const { return static_cast<double>(bytes) / median() / 1e9; }
};

void measure(Figure& f, const std::function<void()>& body) {
  const auto start = Clock::now();
  body();
  f.values.push_back(std::chrono::duration<double>(Clock::now() - start).count());
}

// ---- The model: --size bytes as tensors of --chunk bytes, data section
// page-aligned, one buffer per tensor on the driver's device.

struct Model {
  fs::path file;
  uint64_t bytes = 0;
  uint64_t chunk = 0;
  uint64_t data_start = 0;  // file offset of the first tensor's bytes

  size_t tensors() const { return static_cast<size_t>((bytes + chunk - 1) / chunk); }
  uint64_t tensor_bytes(size_t i) const { return std::min(chunk, bytes - i * chunk); }
  static std::string name(size_t i) { return "t." + std::to_string(i); }
};

void write_model(Model& m) {
  std::string header = "{";
  for (size_t i = 0; i < m.tensors(); ++i) {
    const uint64_t from = i * m.chunk;
    const uint64_t n = m.tensor_bytes(i);
    header += (i ? ",\"" : "\"") + Model::name(i) + "\":{\"dtype\":\"U8\",\"shape\":[" +
              std::to_string(n) + "],\"data_offsets\":[" + std::to_string(from) + "," +
              std::to_string(from + n) + "]}";
  }
  header += "}";
  while ((header.size() + 8) % 4096 != 0) header += ' ';
  m.data_start = 8 + header.size();
  std::FILE* f = std::fopen(m.file.c_str(), "wb");
  if (f == nullptr) die("cannot write " + m.file.string());
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  std::fwrite(length, 1, 8, f);
  std::fwrite(header.data(), 1, header.size(), f);
  // No two MiB alike, so that a copy to the wrong place is a wrong byte.
  std::vector<unsigned char> block(1 << 20);
  for (size_t i = 0; i < block.size(); ++i) {
    block[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  }
  for (uint64_t done = 0; done < m.bytes; done += block.size()) {
    const uint64_t n = std::min<uint64_t>(block.size(), m.bytes - done);
    block[0] = static_cast<unsigned char>(done >> 20);
    block[1] = static_cast<unsigned char>(done >> 28);
    if (std::fwrite(block.data(), 1, n, f) != n) die("writing " + m.file.string());
  }
  // On disk before anything is timed: writeback would compete for the cores.
  if (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0 || std::fclose(f) != 0) {
    die("writing " + m.file.string());
  }
}

std::shared_ptr<const Plan> plan_on(const Model& m, const std::string& tag) {
  Plan plan;
  plan.path = m.file.parent_path() / "plan.json";
  PlanMethod method{"main", {}, {}};
  for (size_t i = 0; i < m.tensors(); ++i) {
    const auto id = static_cast<uint32_t>(i);
    plan.buffers.push_back({id, tag, m.tensor_bytes(i), 256, std::nullopt});
    plan.tensors.push_back(PlanTensor{Model::name(i), DType::u8, {m.tensor_bytes(i)}, id, 0,
                                      PlanSource{m.file.filename().string(), Model::name(i), std::nullopt}});
    method.memory_ids.push_back(id);
    method.tensors.push_back(Model::name(i));
  }
  plan.methods = {method};
  return std::make_shared<const Plan>(std::move(plan));
}

// ---- (d)

struct Loader {
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<const Plan> plan;
  LoadReport report;  // of the last load
  uint64_t loads_checked = 0;
};

// A runtime whose plugin for `tag` is already open (found on the build
// tree's plugin folder, or DEVALLOC_PLUGIN_PATH), or the reason there is
// none.
std::optional<Loader> open_loader(const Model& m, const std::string& tag, bool direct,
                                  std::string* why) {
  RuntimeConfig config = default_config();
  config.load.direct = direct;
  auto runtime = Runtime::create(config);
  auto device = runtime->registry().resolve(tag, std::nullopt);
  if (!device.ok()) {
    *why = device.status().message();
    return std::nullopt;
  }
  return Loader{runtime, plan_on(m, tag), {}, 0};
}

// The program's tensors read back through their plugin and compared with
// the file.
std::string check_loaded(const LoadedProgram& program, const Model& m, const std::byte* expected) {
  std::vector<std::byte> back(m.chunk);
  for (size_t i = 0; i < m.tensors(); ++i) {
    std::optional<LoadedTensor> t = program.find(Model::name(i));
    if (!t) return "tensor " + Model::name(i) + " is not loaded";
    const uint64_t n = m.tensor_bytes(i);
    std::memset(back.data(), 0, n);
    Status s = t->device().plugin->copy_to_host(t->device().device, back.data(), t->address(), n);
    if (!s.ok()) return "copy_to_host(tensor " + Model::name(i) + "): " + s.message();
    std::string wrong = first_difference(back.data(), expected + i * m.chunk, n, i * m.chunk,
                                         m.bytes);
    if (!wrong.empty()) return "tensor " + Model::name(i) + ": " + wrong;
  }
  return {};
}

// Minor page faults of this process so far.
long minor_faults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// One timed load; then, outside the clock, its bytes checked and the
// program freed, so that no load's buffers outlive it and every load
// writes into memory the previous ones gave back. `faults`, when set,
// gets the minor page faults of the load: a warm load writes into pages
// the process has, a cold one faults each 4 KiB page in.
void load(Loader& l, Figure& f, const Model& m, const std::byte* expected,
          Figure* faults = nullptr) {
  LoadReport report;
  std::optional<Result<std::shared_ptr<LoadedProgram>>> program;
  const long faults_before = minor_faults();
  measure(f, [&] { program.emplace(l.runtime->load(l.plan, {.report = &report})); });
  if (faults != nullptr) {
    faults->values.push_back(static_cast<double>(minor_faults() - faults_before));
  }
  if (!program->ok()) throw std::runtime_error("the load failed: " + program->status().message());
  l.report = report;
  if (std::string wrong = check_loaded(***program, m, expected); !wrong.empty()) {
    throw std::runtime_error("the bytes of a load ([load] direct = " +
                             std::string(l.runtime->config().load.direct ? "true" : "false") +
                             "): " + wrong);
  }
  ++l.loads_checked;
}

std::string how_loaded(const LoadReport& r) {
  std::ostringstream o;
  o << (r.direct_reads != 0 && r.copies == 0 ? "direct" : r.direct_reads != 0 ? "mixed" : "staged")
    << ": " << r.direct_reads << " direct reads, " << r.copies << " copies, "
    << r.pipeline.threads << " threads";
  return o.str();
}

// ---- One driver.

// ", 5043 page faults (median; max 262271)"
std::string faults_text(const Figure& faults, bool alone = false) {
  char text[96];
  if (faults.values.size() > 1) {
    std::snprintf(text, sizeof text, "%s%.0f page faults (median; max %.0f)", alone ? "" : ", ",
                  faults.median(), faults.at(1));
  } else {
    std::snprintf(text, sizeof text, "%s%.0f page faults", alone ? "" : ", ", faults.median());
  }
  return text;
}

void print_row(const char* label, const Figure& f, uint64_t bytes, const std::string& note = {}) {
  if (f.empty()) {
    std::printf("  %-46s %s\n", label, note.c_str());
    return;
  }
  std::printf("  %-46s %7.4f %7.4f %7.4f s  %6.2f GB/s%s%s\n", label, f.at(0), f.median(),
              f.at(1), f.gbps(bytes), note.empty() ? "" : "  ", note.c_str());
}

// The driver's paths, or null with the reason in *skipped (a driver whose
// header was not found at build time is one).
std::unique_ptr<DriverPaths> open_driver(const std::string& driver,
                                         [[maybe_unused]] const std::byte* src,
                                         [[maybe_unused]] uint64_t nbytes,
                                         [[maybe_unused]] uint64_t chunk, std::string* skipped) {
  if (driver == "vulkan") {
#ifdef DEVALLOC_DRIVER_BENCH_VULKAN
    return open_vulkan(src, nbytes, chunk, skipped);
#else
    *skipped = "built without vulkan/vulkan_core.h (Debian: libvulkan-dev)";
    return nullptr;
#endif
  }
#ifdef DEVALLOC_DRIVER_BENCH_OPENCL
  return open_opencl(src, nbytes, chunk, skipped);
#else
  *skipped = "built without CL/cl.h (Debian: opencl-headers)";
  return nullptr;
#endif
}

// Returns false when a driver call, a load or a byte check failed (printed).
bool run_driver(const std::string& driver, const Options& o, const Model& m,
                const std::byte* src, std::byte* host_dst) {
  std::printf("\n%s\n", driver.c_str());
  std::string skipped;
  std::unique_ptr<DriverPaths> paths;
  try {
    paths = open_driver(driver, src, m.bytes, m.chunk, &skipped);
  } catch (const DriverError& e) {
    std::printf("  FAILED: %s\n", e.what());
    return false;
  }
  if (!paths) {
    std::printf("  skipped: %s\n", skipped.c_str());
    return true;
  }
  std::printf("  device: %s\n", paths->device_name().c_str());

  const std::string tag = driver + ":0";
  std::string no_plugin;
  std::optional<Loader> direct = open_loader(m, tag, true, &no_plugin);
  std::optional<Loader> staged;
  if (direct) {
    staged = open_loader(m, tag, false, &no_plugin);
    if (!staged) direct.reset();
  }
  if (!direct && o.require_plugins) {
    std::printf("  FAILED: (d) needs the plugin for %s: %s\n", tag.c_str(), no_plugin.c_str());
    return false;
  }

  Figure a, b, c, d, d_staged, cold, d_faults, staged_faults, cold_faults;
  bool ok = true;
  try {
    if (direct) load(*direct, cold, m, src, &cold_faults);  // the first load: fresh device memory
    // Once untimed each: the steady state is what is measured.
    paths->copy_through_staging();
    paths->copy_into_mapping(src);
    two_thread_copy(host_dst, src, m.bytes);
    Figure untimed;
    if (staged) load(*staged, untimed, m, src);

    std::vector<std::pair<Figure*, std::function<void()>>> runs = {
        {&a, [&] { paths->copy_through_staging(); }},
        {&b, [&] { paths->copy_into_mapping(src); }},
        {&c, [&] { two_thread_copy(host_dst, src, m.bytes); }}};
    for (int r = 0; r < o.repeats; ++r) {
      // A load is timed inside load(); the others here.
      const size_t count = runs.size() + (direct ? 2 : 0);
      for (size_t k = 0; k < count; ++k) {
        const size_t which = (k + static_cast<size_t>(r)) % count;
        if (which < runs.size()) {
          measure(*runs[which].first, runs[which].second);
        } else if (which == runs.size()) {
          load(*direct, d, m, src, &d_faults);
        } else {
          load(*staged, d_staged, m, src, &staged_faults);
        }
      }
    }

    std::printf("  %-46s %7s %7s %7s\n", "", "min", "median", "max");
    print_row("(a) driver copy: staging -> device buffer", a, m.bytes);
    print_row("(b) 2-thread memcpy into mapped device memory", b, m.bytes);
    print_row("(c) 2-thread host memcpy (baseline)", c, m.bytes);
    if (direct) {
      print_row("(d) devalloc load", d, m.bytes,
                "(" + how_loaded(direct->report) + faults_text(d_faults) + ")");
      print_row("    [load] direct = false", d_staged, m.bytes,
                "(" + how_loaded(staged->report) + faults_text(staged_faults) + ")");
      print_row("    cold: the first load", cold, m.bytes, "(" + faults_text(cold_faults, true) + ")");
    } else {
      print_row("(d) devalloc load", d, m.bytes, "not run: " + no_plugin);
    }
    const double ga = a.gbps(m.bytes), gb = b.gbps(m.bytes), gc = c.gbps(m.bytes);
    std::printf("  ratios (medians): a/c %.2f  b/c %.2f", ga / gc, gb / gc);
    if (direct) {
      const double gd = d.gbps(m.bytes);
      std::printf("  load/max(a,b) %.2f (%s is faster)  staged load/a %.2f", gd / std::max(ga, gb),
                  ga > gb ? "a" : "b", d_staged.gbps(m.bytes) / ga);
    }
    std::printf("\n");

    auto checked = [&](const char* what, const std::string& wrong) {
      if (wrong.empty()) return;
      std::printf("  FAILED: the bytes of %s: %s\n", what, wrong.c_str());
      ok = false;
    };
    checked("(a)", paths->check_copied(src));
    checked("(b)", paths->check_mapped(src));
    if (ok) {
      std::printf("  bytes: read back and right: (a), (b)");
      if (direct) {
        std::printf(", every load (%llu)",
                    static_cast<unsigned long long>(direct->loads_checked + staged->loads_checked));
      }
      std::printf("\n");
    }
  } catch (const std::exception& e) {  // a DriverError, a failed load
    std::printf("  FAILED: %s\n", e.what());
    return false;
  }
  return ok;
}

// The first three fields of /proc/loadavg ("1.02 0.87 0.60"): on a
// machine of 2 cores, figures taken while others run mean little.
std::string load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "unknown";
  char text[64] = {};
  const bool read = std::fgets(text, sizeof text, f) != nullptr;
  std::fclose(f);
  if (!read) return "unknown";
  std::string out(text);
  size_t end = 0;
  for (int field = 0; field < 3 && end != std::string::npos; ++field) end = out.find(' ', end + 1);
  return out.substr(0, end);
}

uint64_t parse_count(const std::string& flag, const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || v == 0) {
    std::fprintf(stderr, "devalloc_driver_bench: %s wants a positive integer, not \"%s\"\n",
                 flag.c_str(), text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool size_given = false, chunk_given = false, repeats_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--quick") {
      o.quick = true;
    } else if (flag == "--require-plugins") {
      o.require_plugins = true;
    } else if (flag == "--size" && has_value) {
      o.size_mib = parse_count(flag, argv[++i]);
      size_given = true;
    } else if (flag == "--chunk" && has_value) {
      o.chunk_mib = parse_count(flag, argv[++i]);
      chunk_given = true;
    } else if (flag == "--repeats" && has_value) {
      o.repeats = static_cast<int>(std::min<uint64_t>(parse_count(flag, argv[++i]), 1000));
      repeats_given = true;
    } else if (flag == "--only" && has_value) {
      o.drivers.clear();
      std::stringstream in(argv[++i]);
      for (std::string d; std::getline(in, d, ',');) {
        if (d != "vulkan" && d != "opencl") {
          std::fprintf(stderr, "devalloc_driver_bench: --only takes vulkan and opencl, not "
                               "\"%s\"\n", d.c_str());
          return 2;
        }
        o.drivers.push_back(d);
      }
    } else if (flag == "--dir" && has_value) {
      o.dir = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--size MiB] [--chunk MiB] [--repeats N]\n"
                   "          [--only vulkan,opencl] [--dir DIR] [--require-plugins]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.quick) {
    if (!size_given) o.size_mib = 16;
    if (!chunk_given) o.chunk_mib = 4;
    if (!repeats_given) o.repeats = 1;
  }
  // Freed memory stays in the process, so buffers a driver allocates with
  // malloc come back warm in the next load (as devalloc_bench).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows when piped
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);

  Model m;
  m.bytes = o.size_mib << 20;
  m.chunk = std::min(o.chunk_mib << 20, m.bytes);
  const fs::path dir = o.dir / ("devalloc-driver-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  m.file = dir / "model.safetensors";
  write_model(m);

  // The source of (a)-(c): one mapping, read through (page cache and page
  // tables warm) by the first copy into the touched baseline destination.
  auto file = MappedFile::open(m.file);
  if (!file.ok()) die(file.status().message());
  const std::byte* src = (*file)->data() + m.data_start;
  auto* host_dst = static_cast<std::byte*>(std::malloc(m.bytes));
  if (host_dst == nullptr) die("cannot allocate " + std::to_string(m.bytes) + " bytes");
  std::memset(host_dst, 0, m.bytes);
  two_thread_copy(host_dst, src, m.bytes);

  std::printf("devalloc_driver_bench: %s build, %u cores, %llu MiB in %zu tensors of %llu MiB, "
              "%d repeats (median, min, max)\n",
              DEVALLOC_BENCH_BUILD_TYPE, std::thread::hardware_concurrency(),
              static_cast<unsigned long long>(o.size_mib), m.tensors(),
              static_cast<unsigned long long>(m.chunk >> 20), o.repeats);
  std::printf("load average before: %s\n", load_average().c_str());
  bool ok = true;
  for (const std::string& driver : o.drivers) ok = run_driver(driver, o, m, src, host_dst) && ok;
  std::printf("\nload average after: %s\n", load_average().c_str());
  std::free(host_dst);
  return ok ? 0 : 1;
}
