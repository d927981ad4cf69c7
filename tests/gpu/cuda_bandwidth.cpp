// Host-to-device bandwidth on CUDA device 0: raw driver copies
// (cuMemcpyHtoDAsync on a stream, then cuStreamSynchronize), and the same
// bytes through the CUDA plugin in both source-lifetime modes, measured in
// one process so that the figures compare. Built by tests/gpu/run_cuda.sh
// and linked against libcuda.so.1: the real driver, or the fake of
// tests/fakes/cuda found first on LD_LIBRARY_PATH (run_cuda.sh does that
// when DEVALLOC_GPU_DRIVER names the fake; its figures mean nothing).
//
//   devalloc_cuda_bandwidth PLUGIN.so [MIB]
//
// Prints Markdown table rows "| what | MiB | GB/s |", the best of five runs
// after a warm-up.
#include <cuda.h>
#include <devalloc/plugin_abi.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr size_t kMiB = size_t{1} << 20;
// What one plugin call copies: a staging-buffer-sized piece, as a loader
// streaming a model would.
constexpr size_t kChunk = 64 * kMiB;
constexpr int kRuns = 5;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "devalloc_cuda_bandwidth: %s\n", message.c_str());
  std::exit(1);
}

void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = "?";
  cuGetErrorName(result, &name);
  die(std::string(call) + " failed: " + name);
}

void check(devalloc_status status, const devalloc_error& error,
           const char* call) {
  if (status != DEVALLOC_STATUS_OK) {
    die(std::string(call) + " failed: " + error.message);
  }
}

// Best of kRuns timed runs of `copy`, after one untimed run, in GB/s.
double best_gb_per_s(size_t bytes, const std::function<void()>& copy) {
  copy();
  double best = 0;
  for (int run = 0; run < kRuns; ++run) {
    const auto start = std::chrono::steady_clock::now();
    copy();
    const std::chrono::duration<double> seconds =
        std::chrono::steady_clock::now() - start;
    best = std::max(best, static_cast<double>(bytes) / seconds.count() / 1e9);
  }
  return best;
}

void row(const char* what, size_t bytes, double gb_per_s) {
  std::printf("| %s | %zu | %.2f |\n", what, bytes / kMiB, gb_per_s);
  std::fflush(stdout);
}

// The plugin, opened and created as the loader would, reduced to what the
// measurement needs.
class Plugin {
 public:
  explicit Plugin(const char* path) {
    library_ = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library_ == nullptr) die(::dlerror());
    auto negotiate = reinterpret_cast<devalloc_plugin_negotiate_fn>(
        ::dlsym(library_, DEVALLOC_PLUGIN_ENTRY_POINT_NAME));
    if (negotiate == nullptr) die(std::string(path) + ": no entry point");
    devalloc_negotiation n{};
    n.struct_size = sizeof n;
    n.host_min_major = n.host_max_major = DEVALLOC_ABI_VERSION_MAJOR;
    n.host_max_minor = DEVALLOC_ABI_VERSION_MINOR;
    devalloc_error error = fresh_error();
    check(negotiate(&n, &error), error, "devalloc_plugin_negotiate");
    api_ = static_cast<const devalloc_plugin_api_v1*>(n.api);
    devalloc_create_args args{};
    args.struct_size = sizeof args;
    check(api_->create(&args, &error), error, "create");
    instance_ = args.instance;
  }
  ~Plugin() {
    api_->destroy(instance_);
    ::dlclose(library_);
  }

  uint64_t allocate(uint64_t nbytes) {
    devalloc_allocate_args args{};
    args.struct_size = sizeof args;
    args.nbytes = nbytes;
    devalloc_error error = fresh_error();
    check(api_->allocate(instance_, &args, &error), error, "allocate");
    return args.address;
  }
  void deallocate(uint64_t address) {
    devalloc_error error = fresh_error();
    check(api_->deallocate(instance_, 0, address, &error), error, "deallocate");
  }
  void* allocate_host(uint64_t nbytes) {
    void* host = nullptr;
    devalloc_error error = fresh_error();
    check(api_->allocate_host(instance_, nbytes, &host, &error), error,
          "allocate_host");
    return host;
  }
  void free_host(void* host) {
    devalloc_error error = fresh_error();
    check(api_->free_host(instance_, host, &error), error, "free_host");
  }
  void copy(uint64_t dst, const void* src, uint64_t nbytes,
            devalloc_src_lifetime lifetime) {
    devalloc_copy_to_device_args args{};
    args.struct_size = sizeof args;
    args.src_lifetime = lifetime;
    args.dst = dst;
    args.src = src;
    args.nbytes = nbytes;
    if (lifetime == DEVALLOC_SRC_UNTIL_RELEASED) {
      args.on_release = [](void* released) {
        static_cast<std::atomic<uint64_t>*>(released)->fetch_add(1);
      };
      args.user_data = &released_;
    }
    devalloc_error error = fresh_error();
    check(api_->copy_host_to_device(instance_, &args, &error), error,
          "copy_host_to_device");
  }
  void synchronize() {
    devalloc_error error = fresh_error();
    check(api_->synchronize(instance_, 0, &error), error, "synchronize");
  }
  uint64_t released() const { return released_; }

 private:
  static devalloc_error fresh_error() {
    devalloc_error error{};
    error.struct_size = sizeof error;
    return error;
  }

  void* library_ = nullptr;
  const devalloc_plugin_api_v1* api_ = nullptr;
  devalloc_instance* instance_ = nullptr;
  std::atomic<uint64_t> released_{0};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: devalloc_cuda_bandwidth PLUGIN.so [MIB]\n");
    return 2;
  }
  const size_t bytes =
      (argc == 3 ? std::strtoull(argv[2], nullptr, 10) : 1024) * kMiB;
  if (bytes < kChunk || bytes % kChunk != 0)
    die("MIB must be a multiple of 64");

  check(cuInit(0), "cuInit");
  CUdevice device = 0;
  check(cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext context = nullptr;
  check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxPushCurrent(context), "cuCtxPushCurrent");

  // Pageable memory is touched first, so that no copy pays for page faults.
  std::vector<unsigned char> pageable(bytes, 0x5a);
  void* pinned = nullptr;
  check(cuMemHostAlloc(&pinned, bytes, 0), "cuMemHostAlloc");
  std::memset(pinned, 0x5a, bytes);
  CUdeviceptr raw_dst = 0;
  check(cuMemAlloc(&raw_dst, bytes), "cuMemAlloc");

  // Raw copies as the plugin issues its own: cuMemcpyHtoDAsync on a stream,
  // then the stream synchronized; the pinned buffer is warm (touched above).
  CUstream stream = nullptr;
  check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  auto raw_copy = [&](const void* src) {
    check(cuMemcpyHtoDAsync(raw_dst, src, bytes, stream), "cuMemcpyHtoDAsync");
    check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  };
  row("raw cuMemcpyHtoDAsync, pinned source", bytes,
      best_gb_per_s(bytes, [&] { raw_copy(pinned); }));
  row("raw cuMemcpyHtoDAsync, pageable source", bytes,
      best_gb_per_s(bytes, [&] { raw_copy(pageable.data()); }));
  check(cuStreamDestroy(stream), "cuStreamDestroy");
  check(cuMemFree(raw_dst), "cuMemFree");
  check(cuMemFreeHost(pinned), "cuMemFreeHost");

  {
    Plugin plugin(argv[1]);
    const uint64_t dst = plugin.allocate(bytes);
    row("plugin, during call, pageable source (64 MiB calls)", bytes,
        best_gb_per_s(bytes, [&] {
          for (size_t offset = 0; offset < bytes; offset += kChunk) {
            plugin.copy(dst + offset, pageable.data() + offset, kChunk,
                        DEVALLOC_SRC_DURING_CALL);
          }
          plugin.synchronize();
        }));
    void* staging = plugin.allocate_host(bytes);
    std::memset(staging, 0x5a, bytes);
    row("plugin, until released, allocate_host source (64 MiB calls)", bytes,
        best_gb_per_s(bytes, [&] {
          for (size_t offset = 0; offset < bytes; offset += kChunk) {
            plugin.copy(dst + offset,
                        static_cast<unsigned char*>(staging) + offset, kChunk,
                        DEVALLOC_SRC_UNTIL_RELEASED);
          }
          plugin.synchronize();
        }));
    if (plugin.released() !=
        static_cast<uint64_t>(kRuns + 1) * (bytes / kChunk)) {
      die("releases missing after synchronize");
    }
    plugin.free_host(staging);
    plugin.deallocate(dst);
  }

  CUcontext popped = nullptr;
  check(cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
  check(cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease");
  return 0;
}
