// devalloc's load against the two figures that judge it, measured in the
// same run on the same files:
//   (a) devalloc: Runtime::load through the host plugin;
//   (b) per-tensor: for every constant allocate a host buffer of its size,
//       pread the tensor into it, copy it "during call", synchronize, free
//       (the strategy of the original runtime);
//   (c) the limit: the same bytes read from the same file into memory that
//       is already touched, by the same number of threads, no devalloc code
//       in between; pread and mmap+memcpy, each with one static share per
//       thread and with 8 MiB claims from a shared offset, all measured;
//       the fastest by median is the limit.
// Runs are interleaved (every strategy once per repeat, the order rotated
// by one each repeat) and repeated; it prints min/median/max and the ratios
// (a)/(c) and (a)/(b) per repeat (median, min, max). The peak anonymous
// memory of each strategy is measured apart, before the timed runs: one
// load in a fresh child process per strategy and size, above the memory it
// loads into (peak_anon_in_child); no timed run samples memory. The models
// are written by the program into a temp folder (and synced to disk) before
// anything is measured and deleted afterwards. It asserts nothing about
// speed.
//
// The model of many small tensors (--tensors N of 64 bytes) is timed
// through build_plan and the load, apart and together with one
// SafetensorsCache (the header read once), against the same copies in a
// bare loop, and against one bare pass over its header (scan_header): the
// least any loader of the format reads before it copies.
//
// Destination memory is kept warm: the host plugin pools freed buffers
// (option pool), so a load writes into the pages the previous load of the
// model touched, and malloc never returns memory to the system (mallopt), so
// the per-tensor strategy's host buffers are warm too. The cold figure (the
// first load of a model, fresh memory) is reported apart.
//
//   devalloc_bench [--quick] [--json FILE] [--repeats N] [--sizes MiB,MiB,...]
//                  [--tensors N] [--staging-sweep] [--dir DIR]
//                  [--config FILE --device TAG]
// With --config and --device (tests/gpu/run_cuda.sh: cuda:0) the models are
// planned on that device and (a) and (b) go through its plugin; (c) stays
// the read into touched host memory.
#include <devalloc/core/device_registry.hpp>
#include <devalloc/core/mapped_file.hpp>
#include <devalloc/core/name_index.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/core/safetensors.hpp>
#include <devalloc/huge_pages.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef DEVALLOC_BENCH_BUILD_TYPE
#define DEVALLOC_BENCH_BUILD_TYPE "unknown"  // bench/CMakeLists.txt sets it
#endif

namespace {

using namespace devalloc;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  bool quick = false;
  std::string json;
  int repeats = 5;
  std::vector<uint64_t> sizes_mib = {256, 1024, 4096};
  uint64_t small_tensors = 100000;
  bool staging_sweep = false;
  fs::path dir = fs::temp_directory_path();
  std::string config;          // a runtime config file; default: none
  std::string device = "host";  // the tag every buffer is planned on
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "devalloc_bench: %s\n", what.c_str());
  std::exit(1);
}

void check(const Status& s, const char* what) {
  if (!s.ok()) die(std::string(what) + ": " + s.message());
}

// Keeps the compiler from proving a copy unused.
void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

uint64_t rss_anon_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

// Samples RssAnon every millisecond while alive; peak() minus the value at
// construction is what the measured code added. Only in the processes of
// peak_anon_in_child: on a machine of few cores a thread waking every
// millisecond competes with the loading threads, so no timed run has one.
class RssSampler {
 public:
  RssSampler() : base_(rss_anon_bytes()), peak_(base_) {
    thread_ = std::thread([this] {
      while (!stop_) {
        const uint64_t now = rss_anon_bytes();
        uint64_t seen = peak_.load();
        while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  ~RssSampler() { stop(); }
  uint64_t stop() {
    if (thread_.joinable()) {
      stop_ = true;
      thread_.join();
      const uint64_t now = rss_anon_bytes();
      if (now > peak_) peak_ = now;
    }
    return peak_ - base_;
  }

 private:
  uint64_t base_;
  std::atomic<uint64_t> peak_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The peak anonymous memory of one run, in a fresh child process, above the
// `destination` bytes the run writes into: setup builds what the run needs
// (a runtime, a plugin, nothing of the run itself) and returns the run. The
// child measures RssAnon from after setup to the end of the run, reports
// the peak less that baseline and less `destination` through a pipe, and
// exits. In one long process the figure would be measured against the
// high-water mark of the heap (malloc keeps freed memory, see main), so a
// row would hide what it needs behind what earlier rows left free; each
// child starts from the parent's heap with its free pages given back.
// Called before the parent creates a runtime (no other thread is running;
// a GPU plugin is never initialized before a fork).
int64_t peak_anon_in_child(const std::function<std::function<void()>()>& setup,
                           uint64_t destination) {
  int fds[2];
  if (::pipe(fds) != 0) die("pipe");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    ::close(fds[0]);
    malloc_trim(0);  // the parent's free heap pages are not this run's
    const std::function<void()> run = setup();
    RssSampler rss;
    run();
    const int64_t added =
        static_cast<int64_t>(rss.stop()) - static_cast<int64_t>(destination);
    const bool sent = ::write(fds[1], &added, sizeof added) == sizeof added;
    ::_exit(sent ? 0 : 1);
  }
  ::close(fds[1]);
  int64_t added = 0;
  const ssize_t got = ::read(fds[0], &added, sizeof added);
  ::close(fds[0]);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      got != sizeof added) {
    die("the child process measuring memory failed");
  }
  return added;
}

double mib_of(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Values of the repeats in their order: seconds, or ratios per repeat.
struct Spread {
  std::vector<double> values;
  double min() const { return *std::min_element(values.begin(), values.end()); }
  double max() const { return *std::max_element(values.begin(), values.end()); }
  double median() const {
    std::vector<double> s = values;
    std::sort(s.begin(), s.end());
    return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
  }
};
using Figure = Spread;  // seconds of each repeat

// Times body once.
void measure(Figure& f, const std::function<void()>& body) {
  const auto start = Clock::now();
  body();
  f.values.push_back(std::chrono::duration<double>(Clock::now() - start).count());
}

// numerator[i] / denominator[i] for each repeat i (both ran in repeat i).
Spread per_repeat(const Figure& numerator, const Figure& denominator) {
  Spread out;
  for (size_t i = 0; i < numerator.values.size(); ++i) {
    out.values.push_back(numerator.values[i] / denominator.values[i]);
  }
  return out;
}

// ---- Models, written as safetensors by streaming (a 4 GiB model is never
// whole in memory).

struct ModelTensor {
  std::string name;
  uint64_t nbytes;
};

struct Model {
  fs::path file;
  Plan plan;
  // The same plan, shared with the programs (a server that loads a model
  // many times keeps its plan once; Runtime::load does not copy it).
  std::shared_ptr<const Plan> shared_plan;
  uint64_t bytes = 0;
  uint64_t data_start = 0;  // file offset of the first tensor's bytes
  std::vector<ModelTensor> tensors;
  std::vector<uint64_t> offsets;  // in the data section
};

std::string g_device = "host";

void write_model(Model& m, uint64_t tensors_per_buffer) {
  std::string header = "{";
  uint64_t at = 0;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (i != 0) header += ",";
    header += "\"" + m.tensors[i].name + "\":{\"dtype\":\"U8\",\"shape\":[" +
              std::to_string(m.tensors[i].nbytes) + "],\"data_offsets\":[" +
              std::to_string(at) + "," + std::to_string(at + m.tensors[i].nbytes) + "]}";
    m.offsets.push_back(at);
    at += m.tensors[i].nbytes;
  }
  header += "}";
  while ((header.size() + 8) % 4096 != 0) header += ' ';  // data page-aligned
  m.bytes = at;
  m.data_start = 8 + header.size();
  std::FILE* f = std::fopen(m.file.c_str(), "wb");
  if (f == nullptr) die("cannot write " + m.file.string());
  uint64_t n = header.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  std::fwrite(len, 1, 8, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::vector<unsigned char> chunk(8 << 20);
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  for (uint64_t done = 0; done < at;) {
    const uint64_t step = std::min<uint64_t>(chunk.size(), at - done);
    chunk[0] = static_cast<unsigned char>(done >> 20);
    if (std::fwrite(chunk.data(), 1, step, f) != step) die("writing " + m.file.string());
    done += step;
  }
  // On disk before any run is timed: the writeback of a 4 GiB model would
  // otherwise compete with the first runs for the disk and the cores.
  if (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0) die("writing " + m.file.string());
  if (std::fclose(f) != 0) die("writing " + m.file.string());

  // The plan: buffers of tensors_per_buffer tensors each, packed.
  m.plan.path = m.file.parent_path() / "plan.json";
  PlanMethod method{"main", {}, {}};
  uint64_t offset = 0;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (i % tensors_per_buffer == 0) {
      if (i != 0) m.plan.buffers.back().size = offset;
      m.plan.buffers.push_back({static_cast<uint32_t>(m.plan.buffers.size()), g_device, 0, 256, std::nullopt});
      method.memory_ids.push_back(m.plan.buffers.back().memory_id);
      offset = 0;
    }
    m.plan.tensors.push_back(PlanTensor{m.tensors[i].name, DType::u8, {m.tensors[i].nbytes},
                                        m.plan.buffers.back().memory_id, offset,
                                        PlanSource{m.file.filename().string(), m.tensors[i].name, std::nullopt}});
    method.tensors.push_back(m.tensors[i].name);
    offset += (m.tensors[i].nbytes + 255) / 256 * 256;
  }
  m.plan.buffers.back().size = offset;
  m.plan.methods = {method};
  m.shared_plan = std::make_shared<const Plan>(m.plan);
}

// Mixed large and small tensors, as in a transformer's layer: per "layer"
// 16 MiB, 2 x 4 MiB, 1 MiB, 4 x 256 KiB, 16 x 16 KiB, 32 x 1 KiB (27.3 MiB),
// repeated up to `bytes`; one buffer per layer.
Model mixed_model(const fs::path& dir, uint64_t bytes) {
  Model m;
  m.file = dir / ("mixed-" + std::to_string(bytes >> 20) + "MiB.safetensors");
  const std::vector<std::pair<uint64_t, int>> layer = {
      {16 << 20, 1}, {4 << 20, 2}, {1 << 20, 1}, {256 << 10, 4}, {16 << 10, 16}, {1 << 10, 32}};
  uint64_t total = 0;
  int per_layer = 0;
  for (const auto& [size, count] : layer) per_layer += count;
  for (int l = 0; total < bytes; ++l) {
    int k = 0;
    for (const auto& [size, count] : layer) {
      for (int c = 0; c < count && total < bytes; ++c, ++k) {
        const uint64_t n = std::min<uint64_t>(size, bytes - total);
        m.tensors.push_back({"layers." + std::to_string(l) + ".t" + std::to_string(k), n});
        total += n;
      }
    }
  }
  write_model(m, static_cast<uint64_t>(per_layer));
  return m;
}

Model small_model(const fs::path& dir, uint64_t count) {
  Model m;
  m.file = dir / "small.safetensors";
  for (uint64_t i = 0; i < count; ++i) m.tensors.push_back({"s." + std::to_string(i), 64});
  write_model(m, count);
  return m;
}

// One bare pass over a safetensors header: calls entry(name, first, last)
// for each tensor, in file order, until it returns false; returns the
// number of entries it accepted. It checks nothing and reads only the form
// write_model writes.
template <typename Entry>
size_t scan_entries(const MappedFile& file, Entry&& entry) {
  const auto* bytes = reinterpret_cast<const char*>(file.data());
  uint64_t length = 0;
  std::memcpy(&length, bytes, 8);  // little-endian, as the machines here
  const std::string_view header(bytes + 8, length);
  size_t count = 0;
  for (size_t at = header.find('"'); at != std::string_view::npos;
       at = header.find('"', header.find('}', at) + 1)) {
    const size_t end = header.find('"', at + 1);
    // {"dtype":"U8","shape":[N],"data_offsets":[FIRST,LAST]}
    const size_t numbers = header.find('[', header.find('[', end) + 1) + 1;
    uint64_t first = 0;
    uint64_t last = 0;
    const char* p = std::from_chars(bytes + 8 + numbers, bytes + 8 + length, first).ptr;
    std::from_chars(p + 1, bytes + 8 + length, last);
    if (!entry(header.substr(at + 1, end - at - 1), first, last)) break;
    ++count;
    at = numbers;
  }
  return count;
}

// The floors of a load besides its copies. Indexed: the bare pass that
// also puts every name into a NameIndex, as a loader that looks tensors up
// by name needs. In file order: the same pass matching each name against
// the tensor expected at its position, no index, as a loader whose plan
// lists the tensors in file order could (a name out of order ends the
// pass). A plan and a load each read the header, so a plan + load that
// reads it twice cannot go below twice a pass plus the copies.
size_t scan_header(const MappedFile& file, NameIndex& names,
                   std::vector<std::pair<uint64_t, uint64_t>>& offsets) {
  names.clear();
  offsets.clear();
  return scan_entries(file, [&](std::string_view name, uint64_t first, uint64_t last) {
    names.insert(name, offsets.size());
    offsets.emplace_back(first, last);
    return true;
  });
}

size_t scan_header_in_order(const MappedFile& file, const std::vector<ModelTensor>& expected,
                            std::vector<std::pair<uint64_t, uint64_t>>& offsets) {
  offsets.clear();
  return scan_entries(file, [&](std::string_view name, uint64_t first, uint64_t last) {
    if (offsets.size() >= expected.size() || name != expected[offsets.size()].name) return false;
    offsets.emplace_back(first, last);
    return true;
  });
}

// ---- The three strategies.

RuntimeConfig g_base_config = default_config();

RuntimeConfig host_config(uint64_t staging, bool direct, ReadMode read) {
  RuntimeConfig c = g_base_config;
  if (g_device == "host" && c.plugins.count("host") == 0) {
    // Warm destination: the host plugin keeps freed buffers and hands them
    // to the next load of the same model (docs/plugins/host.md).
    PluginConfig pool;
    pool.name = "host";
    pool.options = {{"pool", "true"}};
    c.plugins.emplace("host", pool);
  }
  c.load.staging_bytes = staging;
  c.load.direct = direct;
  c.load.read = read;
  return c;
}

// A runtime for a memory child's setup, its plugin already opened: (b)'s
// setup opens its own, so neither figure holds the plugin's loading (for
// a GPU, the driver's initialization and context), only the load's memory.
std::shared_ptr<Runtime> runtime_with_plugin(const RuntimeConfig& config) {
  auto runtime = Runtime::create(config);
  auto device = runtime->registry().resolve(g_device, std::nullopt);
  if (!device.ok()) die(device.status().message());
  return runtime;
}

// (a), through a runtime that already opened its plugin (as a server
// loading several models would).
LoadReport devalloc_load(const Model& m, Runtime& runtime) {
  LoadReport report;
  auto program = runtime.load(m.shared_plan, {.report = &report});
  if (!program.ok()) die(program.status().message());
  return report;  // the program goes: its buffers return to the warm heap
}

// (b)
void per_tensor_load(const Model& m, const ResolvedDevice& device) {
  Plugin* plugin = device.plugin.get();
  const uint32_t index = device.device;
  auto file = MappedFile::open(m.file);
  if (!file.ok()) die(file.status().message());
  std::vector<uint64_t> buffers;
  for (const PlanBuffer& b : m.plan.buffers) {
    auto address = plugin->allocate(index, b.size, b.alignment);
    if (!address.ok()) die(address.status().message());
    buffers.push_back(*address);
  }
  for (size_t i = 0; i < m.plan.tensors.size(); ++i) {
    const PlanTensor& t = m.plan.tensors[i];
    const uint64_t n = m.tensors[i].nbytes;
    void* host = std::malloc(n);
    uint64_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread((*file)->fd(), static_cast<char*>(host) + done, n - done,
                                static_cast<off_t>(m.data_start + m.offsets[i] + done));
      if (r <= 0) die("pread " + m.file.string());
      done += static_cast<uint64_t>(r);
    }
    check(plugin->copy_to_device(index, buffers[t.memory_id] + t.offset, host, n), "copy");
    check(plugin->synchronize(index), "synchronize");
    std::free(host);
  }
  for (uint64_t address : buffers) check(plugin->deallocate(index, address), "deallocate");
}

// (c): how the limit reads. Static: the file cut into one share per thread.
// Claims: each thread claims the next 8 MiB from a shared offset, as (a)'s
// threads claim pieces; with other work on the cores a static share
// finishes as late as its slowest thread. Every variant runs in every
// repeat; the fastest by median is the limit.
struct LimitVariant {
  const char* name;
  bool use_pread;  // else memcpy out of the file's mapping
  bool claims;
};
constexpr LimitVariant kLimitVariants[] = {
    {"pread, static shares", true, false},
    {"mmap+memcpy, static shares", false, false},
    {"pread, 8 MiB claims", true, true},
    {"mmap+memcpy, 8 MiB claims", false, true},
};
constexpr size_t kLimitVariantCount = std::size(kLimitVariants);

// (c): the data section into `dst` (touched), by `threads` threads, the
// calling one included (as the load's pipeline does).
void limit_read(const Model& m, std::byte* dst, uint32_t threads, const LimitVariant& variant) {
  auto file = MappedFile::open(m.file);
  if (!file.ok()) die(file.status().message());
  const std::byte* src = (*file)->data() + m.data_start;
  const int fd = (*file)->fd();
  constexpr uint64_t kPiece = 8 << 20;
  auto read_range = [&](uint64_t at, uint64_t n) {
    if (!variant.use_pread) {
      std::memcpy(dst + at, src + at, n);
      return;
    }
    for (uint64_t done = 0; done < n;) {
      const ssize_t r = ::pread(fd, dst + at + done, n - done,
                                static_cast<off_t>(m.data_start + at + done));
      if (r <= 0) die("pread");
      done += static_cast<uint64_t>(r);
    }
  };
  const uint64_t share = (m.bytes + threads - 1) / threads;
  std::atomic<uint64_t> next{0};
  auto work = [&](uint32_t t) {
    if (variant.claims) {
      for (uint64_t at = next.fetch_add(kPiece); at < m.bytes; at = next.fetch_add(kPiece)) {
        read_range(at, std::min<uint64_t>(kPiece, m.bytes - at));
      }
      return;
    }
    const uint64_t from = std::min<uint64_t>(m.bytes, t * share);
    const uint64_t to = std::min<uint64_t>(m.bytes, from + share);
    for (uint64_t at = from; at < to; at += kPiece) {
      read_range(at, std::min<uint64_t>(to - at, kPiece));
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& t : pool) t.join();
  escape(dst);
}

std::string json_figure(const Figure& f) {
  std::ostringstream o;
  o << "{\"min_s\":" << f.min() << ",\"median_s\":" << f.median() << ",\"max_s\":" << f.max()
    << ",\"seconds\":[";
  for (size_t i = 0; i < f.values.size(); ++i) o << (i ? "," : "") << f.values[i];
  o << "]}";
  return o.str();
}

// A JSON string: text quoted, with quotes, backslashes and controls escaped.
std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", ch);
      out += escaped;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// Now, as ISO 8601 in UTC: 2026-12-03T08:05:00Z.
std::string iso_utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// The config of a load as the bench used it: the config file (null: none),
// the device tag, the plugins' options, and [load].
std::string json_config(const RuntimeConfig& c, const std::string& file) {
  std::ostringstream o;
  o << std::boolalpha << "{\"file\":" << (file.empty() ? "null" : json_string(file))
    << ",\"device\":" << json_string(g_device) << ",\"plugins\":{";
  bool first = true;
  for (const auto& [name, plugin] : c.plugins) {
    o << (first ? "" : ",") << json_string(name) << ":{";
    for (size_t i = 0; i < plugin.options.size(); ++i) {
      o << (i ? "," : "") << json_string(plugin.options[i].first) << ":"
        << json_string(plugin.options[i].second);
    }
    o << "}";
    first = false;
  }
  o << "},\"load\":{\"staging_bytes\":" << c.load.staging_bytes
    << ",\"threads\":" << c.load.threads << ",\"read\":\"" << to_string(c.load.read)
    << "\",\"direct\":" << c.load.direct << ",\"verify\":" << c.load.verify << "}}";
  return o.str();
}

std::string json_ratios(const Spread& r) {
  std::ostringstream o;
  o << "{\"min\":" << r.min() << ",\"median\":" << r.median() << ",\"max\":" << r.max()
    << ",\"per_repeat\":[";
  for (size_t i = 0; i < r.values.size(); ++i) o << (i ? "," : "") << r.values[i];
  o << "]}";
  return o.str();
}

// nlohmann's SAX interface with a handler that only counts: what a reader
// built on it would pay at least, before any check or value; the baseline
// for devalloc's reader (json_cursor.hpp) on the same texts.
struct CountingSax : nlohmann::json_sax<nlohmann::json> {
  uint64_t events = 0;
  bool null() override { return ++events, true; }
  bool boolean(bool) override { return ++events, true; }
  bool number_integer(number_integer_t) override { return ++events, true; }
  bool number_unsigned(number_unsigned_t) override { return ++events, true; }
  bool number_float(number_float_t, const string_t&) override { return ++events, true; }
  bool string(string_t&) override { return ++events, true; }
  bool binary(binary_t&) override { return ++events, true; }
  bool start_object(std::size_t) override { return ++events, true; }
  bool key(string_t&) override { return ++events, true; }
  bool end_object() override { return ++events, true; }
  bool start_array(std::size_t) override { return ++events, true; }
  bool end_array() override { return ++events, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

uint64_t sax_events(const std::string& text) {
  CountingSax sax;
  if (!nlohmann::json::sax_parse(text, &sax)) die("nlohmann SAX refused the text");
  return sax.events;
}

std::string read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void row(const char* what, const Figure& f, uint64_t bytes) {
  std::printf("  %-38s %8.4f %8.4f %8.4f s  %7.2f GB/s\n", what, f.min(), f.median(), f.max(),
              static_cast<double>(bytes) / f.median() / 1e9);
}

// What a load's buffers take in anonymous host memory: the destination a
// strategy writes into, when the device is the host plugin's (a GPU's
// buffers are not in RssAnon, so none is subtracted).
uint64_t destination_bytes(const Model& m) {
  if (g_device != "host" && g_device.rfind("host:", 0) != 0) return 0;
  uint64_t total = 0;
  for (const PlanBuffer& b : m.plan.buffers) total += b.size;
  return total;
}

// The loading threads of a load on one device with [load] threads = 0:
// max(devices, min(cores, 4)) (core/src/load/pipeline.cpp).
uint32_t default_load_threads() {
  return std::max(1u, std::min(std::thread::hardware_concurrency(), 4u));
}

// Peak anonymous memory above the destination of one load of a mixed model
// in a fresh process (peak_anon_in_child), per strategy; staged: per
// staging size of the sweep.
struct PeakAnon {
  int64_t devalloc = 0;
  int64_t per_tensor = 0;
  int64_t limit = 0;
  std::vector<int64_t> staged;
};

std::vector<uint64_t> parse_list(const std::string& text) {
  std::vector<uint64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoull(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool sizes_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--quick") {
      o.quick = true;
    } else if (flag == "--staging-sweep") {
      o.staging_sweep = true;
    } else if (flag == "--json" && has_value) {
      o.json = argv[++i];
    } else if (flag == "--repeats" && has_value) {
      o.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (flag == "--sizes" && has_value) {
      o.sizes_mib = parse_list(argv[++i]);
      sizes_given = true;
    } else if (flag == "--tensors" && has_value) {
      o.small_tensors = std::stoull(argv[++i]);
    } else if (flag == "--dir" && has_value) {
      o.dir = argv[++i];
    } else if (flag == "--config" && has_value) {
      o.config = argv[++i];
    } else if (flag == "--device" && has_value) {
      o.device = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--json FILE] [--repeats N] [--sizes MiB,...]\n"
                   "          [--tensors N] [--staging-sweep] [--dir DIR]\n"
                   "          [--config FILE --device TAG]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.quick) {
    if (!sizes_given) o.sizes_mib = {16};
    o.repeats = std::min(o.repeats, 2);
    o.small_tensors = std::min<uint64_t>(o.small_tensors, 2000);
  }
  g_device = o.device;
  if (!o.config.empty()) {
    auto config = read_config(o.config);
    if (!config.ok()) die(config.status().message());
    g_base_config = *config;
  }
  // Warm destination memory: freed memory stays in the process and the next
  // run reuses its pages (no mmap per allocation, no trimming).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  mallopt(M_TOP_PAD, 64 << 20);

  const fs::path dir = o.dir / ("devalloc-bench-" + std::to_string(getpid()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() { std::error_code ec; fs::remove_all(dir, ec); }
  } cleanup{dir};

  std::ostringstream json;
  json << std::boolalpha;
  // The config of (a) and of the memory children; the sweep's rows change
  // only [load] staging, direct and read, as each row says.
  json << "{\"date\":\"" << iso_utc_now() << "\",\"build_type\":\"" << DEVALLOC_BENCH_BUILD_TYPE
       << "\",\"cores\":" << std::thread::hardware_concurrency() << ",\"repeats\":" << o.repeats
       << ",\"config\":"
       << json_config(host_config(64 << 20, true, ReadMode::automatic), o.config)
       << ",\"models\":[";

  std::printf("devalloc_bench: %s build, %u cores, %d repeats, interleaved; min / median / max\n",
              DEVALLOC_BENCH_BUILD_TYPE, std::thread::hardware_concurrency(), o.repeats);
  // Every model on disk (write_model syncs each file) before anything is
  // measured, and every memory figure measured before the parent process
  // creates a runtime (peak_anon_in_child).
  std::vector<Model> models;
  for (uint64_t mib : o.sizes_mib) models.push_back(mixed_model(dir, mib << 20));
  std::optional<Model> small;
  if (o.small_tensors > 0) small = small_model(dir, o.small_tensors);

  const std::vector<uint64_t> sweep_staging_mib = {1, 4, 16, 64, 256};
  std::vector<PeakAnon> peaks(models.size());
  for (size_t i = 0; i < models.size(); ++i) {
    const Model& m = models[i];
    PeakAnon& p = peaks[i];
    p.devalloc = peak_anon_in_child(
        [&m] {
          auto runtime = runtime_with_plugin(host_config(64 << 20, true, ReadMode::automatic));
          return std::function<void()>([&m, runtime] { devalloc_load(m, *runtime); });
        },
        destination_bytes(m));
    p.per_tensor = peak_anon_in_child(
        [&m] {
          auto registry = std::make_shared<DeviceRegistry>(
              host_config(64 << 20, true, ReadMode::automatic));
          auto device = registry->resolve(g_device, std::nullopt);
          if (!device.ok()) die(device.status().message());
          auto resolved = std::make_shared<ResolvedDevice>(*device);
          return std::function<void()>(
              [&m, registry, resolved] { per_tensor_load(m, *resolved); });
        },
        destination_bytes(m));
    // The destination is written by the read itself, so it is touched
    // within the run; (c) holds no memory but its destination.
    p.limit = peak_anon_in_child(
        [&m] {
          return std::function<void()>([&m] {
            auto* dst = static_cast<std::byte*>(std::malloc(m.bytes));
            limit_read(m, dst, default_load_threads(), kLimitVariants[3]);
            std::free(dst);
          });
        },
        m.bytes);
    if (o.staging_sweep) {
      for (uint64_t staging_mib : sweep_staging_mib) {
        p.staged.push_back(peak_anon_in_child(
            [&m, staging_mib] {
              auto runtime =
                  runtime_with_plugin(host_config(staging_mib << 20, false, ReadMode::automatic));
              return std::function<void()>([&m, runtime] { devalloc_load(m, *runtime); });
            },
            destination_bytes(m)));
      }
    }
  }
  int64_t small_plan_anon = 0;
  int64_t small_load_anon = 0;
  if (small) {
    const Model& m = *small;
    small_plan_anon = peak_anon_in_child(
        [&m, &dir] {
          return std::function<void()>([&m, &dir] {
            const std::vector<fs::path> files = {m.file};
            auto plan = build_plan(files, dir / "plan.json");
            if (!plan.ok()) die(plan.status().message());
          });
        },
        0);
    small_load_anon = peak_anon_in_child(
        [&m] {
          auto runtime = runtime_with_plugin(host_config(64 << 20, true, ReadMode::automatic));
          return std::function<void()>([&m, runtime] { devalloc_load(m, *runtime); });
        },
        destination_bytes(m));
  }

  bool first_model = true;
  for (size_t i = 0; i < models.size(); ++i) {
    const Model& m = models[i];
    const PeakAnon& p = peaks[i];
    const uint64_t mib = m.bytes >> 20;
    const RuntimeConfig config = host_config(64 << 20, true, ReadMode::automatic);
    auto runtime = Runtime::create(config);
    // The plugin for (b), from a registry like the load's.
    DeviceRegistry registry(config);
    auto device = registry.resolve(g_device, std::nullopt);
    if (!device.ok()) die(device.status().message());

    // Cold: the first load into memory never touched before.
    Figure cold;
    LoadReport report;
    measure(cold, [&] { report = devalloc_load(m, *runtime); });
    const uint32_t threads = std::max<uint32_t>(1, report.pipeline.threads);
    // (b) writes into warm memory too: its first run, untimed, fills the
    // pool of its plugin instance.
    per_tensor_load(m, *device);

    // Touched before the clock starts: the limit does not pay first touch.
    // One destination for every (c) run, as (a) and (b) reuse theirs, in
    // memory of the kind the host plugin hands out (huge pages where the
    // kernel gives them), so that (c) stays the limit of (a)'s copies.
    auto* dst = static_cast<std::byte*>(std::aligned_alloc(
        size_t{2} << 20, (m.bytes + (size_t{2} << 20) - 1) & ~((size_t{2} << 20) - 1)));
    advise_huge_pages(dst, m.bytes);
    std::memset(dst, 1, m.bytes);

    // Every strategy once per repeat, in an order rotated by one each
    // repeat, so that none always runs right after the same other one.
    Figure a, b;
    std::vector<Figure> c(kLimitVariantCount);
    std::vector<std::pair<Figure*, std::function<void()>>> runs = {
        {&a, [&] { report = devalloc_load(m, *runtime); }},
        {&b, [&] { per_tensor_load(m, *device); }}};
    for (size_t v = 0; v < kLimitVariantCount; ++v) {
      runs.emplace_back(&c[v], [&, v] { limit_read(m, dst, threads, kLimitVariants[v]); });
    }
    for (int r = 0; r < o.repeats; ++r) {
      for (size_t k = 0; k < runs.size(); ++k) {
        auto& [figure, run] = runs[(k + static_cast<size_t>(r)) % runs.size()];
        measure(*figure, run);
      }
    }
    std::free(dst);
    size_t won = 0;
    for (size_t v = 1; v < kLimitVariantCount; ++v) {
      if (c[v].median() < c[won].median()) won = v;
    }
    const Figure& limit = c[won];
    // Throughput ratio (a)/(c) = c_i / a_i in seconds; (b)/(a) = b_i / a_i.
    const Spread a_over_c = per_repeat(limit, a);
    const Spread b_over_a = per_repeat(b, a);
    std::printf("\n%llu MiB, %zu tensors in %zu buffers (%s: %llu copies, %llu direct reads, "
                "%u threads, read = %s%s)\n",
                static_cast<unsigned long long>(mib), m.tensors.size(), m.plan.buffers.size(),
                report.direct_reads ? "direct" : "staged",
                static_cast<unsigned long long>(report.copies),
                static_cast<unsigned long long>(report.direct_reads), threads,
                to_string(report.pipeline.read),
                report.pipeline.read_measured ? ", measured" : "");
    row("(a) devalloc load", a, m.bytes);
    row("(b) per-tensor strategy", b, m.bytes);
    for (size_t v = 0; v < kLimitVariantCount; ++v) {
      row(("(c) limit, " + std::string(kLimitVariants[v].name)).c_str(), c[v], m.bytes);
    }
    row("(a) cold: first load, fresh memory", cold, m.bytes);
    std::printf("  limit: the fastest (c) by median, %s\n", kLimitVariants[won].name);
    std::printf("  (a)/(c) throughput, per repeat: median %.3f  min %.3f  max %.3f\n",
                a_over_c.median(), a_over_c.min(), a_over_c.max());
    std::printf("  (a) vs (b), per repeat: median %.2fx  min %.2fx  max %.2fx faster\n",
                b_over_a.median(), b_over_a.min(), b_over_a.max());
    std::printf("  peak anonymous memory above the destination, one load in a fresh process:\n"
                "    (a) %+.1f MiB   (b) %+.1f MiB   (c) %+.1f MiB\n",
                mib_of(p.devalloc), mib_of(p.per_tensor), mib_of(p.limit));

    std::ostringstream sweep;
    sweep << std::boolalpha;
    if (o.staging_sweep) {
      // Throughput of the staged path by staging size (direct reads off).
      std::printf("  staged (direct = false), by staging size (memory: one load in a fresh "
                  "process, above the destination):\n");
      for (size_t k = 0; k < sweep_staging_mib.size(); ++k) {
        const uint64_t staging_mib = sweep_staging_mib[k];
        Figure s;
        auto staged = Runtime::create(host_config(staging_mib << 20, false, ReadMode::automatic));
        devalloc_load(m, *staged);
        for (int r = 0; r < o.repeats; ++r) measure(s, [&] { devalloc_load(m, *staged); });
        std::printf("    staging %4llu MiB: %7.2f GB/s  %+7.1f MiB anon\n",
                    static_cast<unsigned long long>(staging_mib),
                    static_cast<double>(m.bytes) / s.median() / 1e9, mib_of(p.staged[k]));
        sweep << (k == 0 ? "" : ",") << "{\"staging_bytes\":" << (staging_mib << 20)
              << ",\"figure\":" << json_figure(s)
              << ",\"peak_anon_above_destination\":" << p.staged[k] << "}";
      }
      for (ReadMode mode : {ReadMode::mmap, ReadMode::pread}) {
        for (bool direct : {true, false}) {
          Figure s;
          auto rc = Runtime::create(host_config(64 << 20, direct, mode));
          devalloc_load(m, *rc);
          for (int r = 0; r < o.repeats; ++r) measure(s, [&] { devalloc_load(m, *rc); });
          std::printf("    read = %-5s direct = %-5s: %7.2f GB/s\n", to_string(mode),
                      direct ? "true" : "false", static_cast<double>(m.bytes) / s.median() / 1e9);
          sweep << ",{\"read\":\"" << to_string(mode) << "\",\"direct\":" << direct
                << ",\"figure\":" << json_figure(s) << "}";
        }
      }
    }
    json << (first_model ? "" : ",") << "{\"kind\":\"mixed\",\"bytes\":" << m.bytes
         << ",\"tensors\":" << m.tensors.size() << ",\"buffers\":" << m.plan.buffers.size()
         << ",\"threads\":" << threads << ",\"read\":\"" << to_string(report.pipeline.read)
         << "\",\"read_measured\":" << report.pipeline.read_measured
         << ",\"direct\":" << (report.direct_reads != 0) << ",\"copies\":" << report.copies
         << ",\"direct_reads\":" << report.direct_reads << ",\"devalloc\":" << json_figure(a)
         << ",\"per_tensor\":" << json_figure(b) << ",\"limit\":" << json_figure(limit)
         << ",\"limit_variant\":" << json_string(kLimitVariants[won].name)
         << ",\"limit_variants\":{";
    for (size_t v = 0; v < kLimitVariantCount; ++v) {
      json << (v ? "," : "") << json_string(kLimitVariants[v].name) << ":" << json_figure(c[v]);
    }
    json << "},\"ratios\":{\"devalloc_over_limit_throughput\":" << json_ratios(a_over_c)
         << ",\"devalloc_over_per_tensor_speedup\":" << json_ratios(b_over_a) << "}"
         << ",\"cold\":" << json_figure(cold)
         << ",\"peak_anon_above_destination\":{\"devalloc\":" << p.devalloc
         << ",\"per_tensor\":" << p.per_tensor << ",\"limit\":" << p.limit << "}"
         << ",\"sweep\":[" << sweep.str() << "]}";
    first_model = false;
    std::error_code ec;
    fs::remove(m.file, ec);
  }

  if (small) {
    const Model& m = *small;
    auto runtime = Runtime::create(host_config(64 << 20, true, ReadMode::automatic));
    devalloc_load(m, *runtime);  // opens the plugin
    Figure plan_fig, load_fig, together_fig, bare, scan_fig, ordered_fig, write_fig, read_fig;
    // Each format through devalloc's reader and nlohmann's SAX parser, on
    // the same text.
    Figure header_reader, header_sax, plan_reader, plan_sax;
    if (Status s = write_plan(m.plan, dir / "plan.json"); !s.ok()) die(s.message());
    const std::string plan_text = read_whole(dir / "plan.json");
    std::string header_text;
    {
      const std::string whole = read_whole(m.file);
      uint64_t n = 0;
      std::memcpy(&n, whole.data(), 8);
      header_text = whole.substr(8, n);
    }
    NameIndex scanned_names;
    std::vector<std::pair<uint64_t, uint64_t>> scanned_offsets;
    auto file = MappedFile::open(m.file);
    if (!file.ok()) die(file.status().message());
    std::vector<std::byte> dst(m.plan.buffers[0].size);
    for (int r = 0; r < o.repeats; ++r) {
      measure(plan_fig, [&] {
        const std::vector<fs::path> files = {m.file};
        auto plan = build_plan(files, dir / "plan.json");
        if (!plan.ok()) die(plan.status().message());
      });
      measure(load_fig, [&] { devalloc_load(m, *runtime); });
      // What a runtime that plans in the same process does: one
      // SafetensorsCache from build_plan to the load, so the header is read
      // once.
      measure(together_fig, [&] {
        SafetensorsCache cache;
        PlanBuildOptions options;
        options.cache = &cache;
        const std::vector<fs::path> files = {m.file};
        auto plan = build_plan(files, dir / "plan.json", options);
        if (!plan.ok()) die(plan.status().message());
        auto program = runtime->load(std::move(*plan), {.files = &cache});
        if (!program.ok()) die(program.status().message());
      });
      // The plan file as `devalloc plan` writes it and `devalloc load`
      // reads and checks it (its sources included) before loading.
      measure(write_fig, [&] {
        if (Status s = write_plan(m.plan, dir / "plan.json"); !s.ok()) die(s.message());
      });
      measure(read_fig, [&] {
        auto plan = read_plan(dir / "plan.json");
        if (!plan.ok()) die(plan.status().message());
        if (Status s = validate_plan(*plan); !s.ok()) die(s.message());
      });
      measure(bare, [&] {
        const std::byte* src = (*file)->data() + m.data_start;
        for (size_t i = 0; i < m.tensors.size(); ++i) {
          std::memcpy(dst.data() + m.plan.tensors[i].offset, src + m.offsets[i], 64);
        }
        escape(dst.data());
      });
      measure(scan_fig, [&] {
        if (scan_header(**file, scanned_names, scanned_offsets) != m.tensors.size()) {
          die("scan_header found " + std::to_string(scanned_offsets.size()) + " tensors");
        }
      });
      measure(header_reader, [&] {
        auto f = SafetensorsFile::open(m.file);
        if (!f.ok()) die(f.status().message());
      });
      measure(header_sax, [&] { escape(reinterpret_cast<void*>(sax_events(header_text))); });
      measure(plan_reader, [&] {
        auto plan = read_plan(dir / "plan.json");
        if (!plan.ok()) die(plan.status().message());
      });
      measure(plan_sax, [&] { escape(reinterpret_cast<void*>(sax_events(plan_text))); });
      measure(ordered_fig, [&] {
        if (scan_header_in_order(**file, m.tensors, scanned_offsets) != m.tensors.size()) {
          die("scan_header_in_order matched " + std::to_string(scanned_offsets.size()) +
              " tensors");
        }
      });
    }
    std::printf("\n%llu tensors of 64 bytes\n", static_cast<unsigned long long>(m.tensors.size()));
    row("plan (build_plan from the file)", plan_fig, m.bytes);
    row("load", load_fig, m.bytes);
    row("build_plan + load, one cache", together_fig, m.bytes);
    row("bare loop: the same copies", bare, m.bytes);
    row("header: one pass + NameIndex", scan_fig, m.bytes);
    row("header: one pass, names in file order", ordered_fig, m.bytes);
    row("plan file: write_plan", write_fig, m.bytes);
    row("plan file: read_plan + validate_plan", read_fig, m.bytes);
    std::printf("  readers, the %.1f MB header and the %.1f MB plan:\n",
                header_text.size() / 1e6, plan_text.size() / 1e6);
    row("header: devalloc's reader (SafetensorsFile::open)", header_reader, m.bytes);
    row("header: nlohmann SAX, count only", header_sax, m.bytes);
    row("plan: devalloc's reader (read_plan)", plan_reader, m.bytes);
    row("plan: nlohmann SAX, count only", plan_sax, m.bytes);
    std::printf("  devalloc's reader / nlohmann SAX (medians): header %.2f, plan %.2f\n",
                header_reader.median() / header_sax.median(),
                plan_reader.median() / plan_sax.median());
    std::printf("  peak anonymous memory, once in a fresh process: build_plan %+.1f MiB, "
                "load %+.1f MiB above its destination\n",
                mib_of(small_plan_anon), mib_of(small_load_anon));
    // Medians; each floor against the bare loop, and devalloc against it.
    const double plan_and_load = plan_fig.median() + load_fig.median();
    const double one_cache = together_fig.median();
    struct Floor {
      const char* what;
      int passes;
      const Figure& pass;
      double devalloc;  // plan + load with as many header reads
      double seconds() const { return passes * pass.median(); }
    };
    const Floor floors[] = {{"two passes + NameIndex", 2, scan_fig, plan_and_load},
                            {"two passes in file order", 2, ordered_fig, plan_and_load},
                            {"one pass + NameIndex", 1, scan_fig, one_cache},
                            {"one pass in file order", 1, ordered_fig, one_cache}};
    std::printf("  plan + load = %.4f s, %.1fx the bare loop\n", plan_and_load,
                plan_and_load / bare.median());
    std::printf("  build_plan + load, one cache = %.4f s, %.1fx the bare loop\n", one_cache,
                one_cache / bare.median());
    std::ostringstream floors_json;
    for (const Floor& f : floors) {
      const double floor = f.seconds() + bare.median();
      std::printf("  floor, %-26s + the copies = %.4f s, %.1fx the bare loop; devalloc "
                  "(%s) %.1fx this floor\n",
                  f.what, floor, floor / bare.median(),
                  f.passes == 2 ? "plan + load" : "one cache", f.devalloc / floor);
      floors_json << (&f == floors ? "" : ",") << "{\"floor\":\"" << f.what
                  << " + the copies\",\"median_s\":" << floor
                  << ",\"over_bare\":" << floor / bare.median()
                  << ",\"devalloc_over_floor\":" << f.devalloc / floor << "}";
    }
    json << "],\"small\":{\"tensors\":" << m.tensors.size() << ",\"plan\":" << json_figure(plan_fig)
         << ",\"load\":" << json_figure(load_fig)
         << ",\"plan_and_load_one_cache\":" << json_figure(together_fig)
         << ",\"bare\":" << json_figure(bare)
         << ",\"header_pass\":" << json_figure(scan_fig)
         << ",\"header_pass_file_order\":" << json_figure(ordered_fig)
         << ",\"plan_and_load_over_bare\":" << plan_and_load / bare.median()
         << ",\"one_cache_over_bare\":" << one_cache / bare.median()
         << ",\"floors\":[" << floors_json.str() << "]"
         << ",\"readers\":{\"header_devalloc\":" << json_figure(header_reader)
         << ",\"header_nlohmann_sax\":" << json_figure(header_sax)
         << ",\"plan_devalloc\":" << json_figure(plan_reader)
         << ",\"plan_nlohmann_sax\":" << json_figure(plan_sax) << "}"
         << ",\"write_plan\":" << json_figure(write_fig)
         << ",\"read_plan\":" << json_figure(read_fig)
         << ",\"peak_anon\":{\"plan\":" << small_plan_anon
         << ",\"load_above_destination\":" << small_load_anon << "}}}";
  } else {
    json << "]}";
  }
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << json.str() << "\n";
    if (!out) die("cannot write " + o.json);
  }
  return 0;
}
