// (a) and (b) on OpenCL: the first device of the first platform that has
// one, through the ICD loader libOpenCL.so.1 (on these machines PoCL),
// opened at run time; one in-order queue.
//   (a) non-blocking clEnqueueWriteBuffer from staging memory (a
//       CL_MEM_ALLOC_HOST_PTR buffer, mapped once: OpenCL's pinned memory)
//       into a device buffer, one event per chunk in flight;
//   (b) clEnqueueMapBuffer(CL_MAP_WRITE_INVALIDATE_REGION) of a device
//       buffer, a memcpy into it, clEnqueueUnmapMemObject, clFinish.
#include "driver_bench.hpp"

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <dlfcn.h>

#include <cstring>
#include <vector>

namespace devalloc::bench {
namespace {

#define DEVALLOC_CL_FUNCTIONS(X)          \
  X(clGetPlatformIDs)                     \
  X(clGetPlatformInfo)                    \
  X(clGetDeviceIDs)                       \
  X(clGetDeviceInfo)                      \
  X(clCreateContext)                      \
  X(clReleaseContext)                     \
  X(clCreateCommandQueueWithProperties)   \
  X(clReleaseCommandQueue)                \
  X(clCreateBuffer)                       \
  X(clReleaseMemObject)                   \
  X(clEnqueueMapBuffer)                   \
  X(clEnqueueUnmapMemObject)              \
  X(clEnqueueWriteBuffer)                 \
  X(clEnqueueReadBuffer)                  \
  X(clWaitForEvents)                      \
  X(clReleaseEvent)                       \
  X(clFlush)                              \
  X(clFinish)

struct Cl {
#define DEVALLOC_CL_MEMBER(name) decltype(&::name) name = nullptr;
  DEVALLOC_CL_FUNCTIONS(DEVALLOC_CL_MEMBER)
#undef DEVALLOC_CL_MEMBER
};

void cl_check(cl_int r, const std::string& call) {
  if (r != CL_SUCCESS) throw DriverError(call + " returned " + std::to_string(r));
}

class OpenclPaths final : public DriverPaths {
 public:
  OpenclPaths(void* library, uint64_t nbytes, uint64_t chunk)
      : library_(library), nbytes_(nbytes), chunk_(chunk) {}
  ~OpenclPaths() override;

  // False (the reason in *skipped) when libOpenCL.so.1 has no usable device.
  bool open(const std::byte* src, std::string* skipped);

  std::string device_name() const override { return name_; }
  void copy_through_staging() override;
  void copy_into_mapping(const std::byte* src) override;
  std::string check_copied(const std::byte* expected) override {
    return read_back(copied_, expected);
  }
  std::string check_mapped(const std::byte* expected) override {
    return read_back(mapped_, expected);
  }

 private:
  cl_mem buffer(cl_mem_flags flags, const char* what);
  void wait(int slot);
  std::string read_back(cl_mem buffer, const std::byte* expected);

  void* library_;
  const uint64_t nbytes_;
  const uint64_t chunk_;
  Cl cl_;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  cl_mem staging_ = nullptr;
  cl_mem copied_ = nullptr;
  cl_mem mapped_ = nullptr;
  std::byte* staging_host_ = nullptr;
  cl_event events_[2] = {nullptr, nullptr};
  std::string name_;
};

OpenclPaths::~OpenclPaths() {
  if (queue_ != nullptr) {
    cl_.clFinish(queue_);
    for (cl_event& e : events_) {
      if (e != nullptr) cl_.clReleaseEvent(e);
    }
    if (staging_host_ != nullptr) {
      cl_.clEnqueueUnmapMemObject(queue_, staging_, staging_host_, 0, nullptr, nullptr);
      cl_.clFinish(queue_);
    }
    for (cl_mem m : {staging_, copied_, mapped_}) {
      if (m != nullptr) cl_.clReleaseMemObject(m);
    }
    cl_.clReleaseCommandQueue(queue_);
  }
  if (context_ != nullptr) cl_.clReleaseContext(context_);
  ::dlclose(library_);
}

bool OpenclPaths::open(const std::byte* src, std::string* skipped) {
#define DEVALLOC_CL_LOAD(name)                                                    \
  cl_.name = reinterpret_cast<decltype(&::name)>(::dlsym(library_, #name));       \
  if (cl_.name == nullptr) {                                                      \
    *skipped = "libOpenCL.so.1 has no " #name " (an OpenCL 2.0 loader is needed)"; \
    return false;                                                                 \
  }
  DEVALLOC_CL_FUNCTIONS(DEVALLOC_CL_LOAD)
#undef DEVALLOC_CL_LOAD
  cl_uint platforms = 0;
  // The ICD loader answers CL_PLATFORM_NOT_FOUND_KHR (-1001) when no driver
  // is installed.
  if (cl_int r = cl_.clGetPlatformIDs(0, nullptr, &platforms); r != CL_SUCCESS || platforms == 0) {
    *skipped = "clGetPlatformIDs found no platform (returned " + std::to_string(r) + ")";
    return false;
  }
  std::vector<cl_platform_id> platform(platforms);
  cl_check(cl_.clGetPlatformIDs(platforms, platform.data(), nullptr), "clGetPlatformIDs");
  cl_device_id device = nullptr;
  cl_platform_id chosen = nullptr;
  for (cl_platform_id p : platform) {
    cl_uint count = 0;
    if (cl_.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &device, &count) == CL_SUCCESS && count > 0) {
      chosen = p;
      break;
    }
  }
  if (chosen == nullptr) {
    *skipped = "no OpenCL platform has a device (clGetDeviceIDs, CL_DEVICE_TYPE_ALL)";
    return false;
  }
  char text[256] = {};
  cl_.clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof text - 1, text, nullptr);
  name_ = text;
  std::memset(text, 0, sizeof text);
  cl_.clGetPlatformInfo(chosen, CL_PLATFORM_NAME, sizeof text - 1, text, nullptr);
  name_ += std::string(" (") + text + ")";

  cl_int r = CL_SUCCESS;
  context_ = cl_.clCreateContext(nullptr, 1, &device, nullptr, nullptr, &r);
  cl_check(r, "clCreateContext(" + name_ + ")");
  queue_ = cl_.clCreateCommandQueueWithProperties(context_, device, nullptr, &r);
  cl_check(r, "clCreateCommandQueueWithProperties(" + name_ + ", in order)");

  staging_ = buffer(CL_MEM_READ_ONLY | CL_MEM_ALLOC_HOST_PTR, "staging");
  staging_host_ = static_cast<std::byte*>(cl_.clEnqueueMapBuffer(
      queue_, staging_, CL_TRUE, CL_MAP_WRITE, 0, nbytes_, 0, nullptr, nullptr, &r));
  cl_check(r, "clEnqueueMapBuffer(staging, CL_MAP_WRITE, " + std::to_string(nbytes_) + " bytes)");
  std::memcpy(staging_host_, src, nbytes_);
  copied_ = buffer(CL_MEM_READ_WRITE, "device buffer of (a)");
  mapped_ = buffer(CL_MEM_READ_WRITE, "mapped buffer of (b)");
  // Touched once: (b) measures the steady state, not first-touch faults.
  void* host = cl_.clEnqueueMapBuffer(queue_, mapped_, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0,
                                      nbytes_, 0, nullptr, nullptr, &r);
  cl_check(r, "clEnqueueMapBuffer(mapped buffer, " + std::to_string(nbytes_) + " bytes)");
  std::memset(host, 0, nbytes_);
  cl_check(cl_.clEnqueueUnmapMemObject(queue_, mapped_, host, 0, nullptr, nullptr),
        "clEnqueueUnmapMemObject(mapped buffer)");
  cl_check(cl_.clFinish(queue_), "clFinish");
  return true;
}

cl_mem OpenclPaths::buffer(cl_mem_flags flags, const char* what) {
  cl_int r = CL_SUCCESS;
  cl_mem m = cl_.clCreateBuffer(context_, flags, nbytes_, nullptr, &r);
  cl_check(r, std::string("clCreateBuffer(") + what + ", size = " + std::to_string(nbytes_) + ")");
  return m;
}

void OpenclPaths::wait(int slot) {
  if (events_[slot] == nullptr) return;
  cl_check(cl_.clWaitForEvents(1, &events_[slot]),
        "clWaitForEvents(copy slot " + std::to_string(slot) + ")");
  cl_.clReleaseEvent(events_[slot]);
  events_[slot] = nullptr;
}

void OpenclPaths::copy_through_staging() {
  int slot = 0;
  for (uint64_t at = 0; at < nbytes_; at += chunk_, slot ^= 1) {
    wait(slot);
    const uint64_t n = std::min(chunk_, nbytes_ - at);
    cl_check(cl_.clEnqueueWriteBuffer(queue_, copied_, CL_FALSE, at, n, staging_host_ + at, 0,
                                   nullptr, &events_[slot]),
          "clEnqueueWriteBuffer(non-blocking, offset = " + std::to_string(at) +
              ", size = " + std::to_string(n) + ")");
    cl_check(cl_.clFlush(queue_), "clFlush");
  }
  wait(0);
  wait(1);
}

void OpenclPaths::copy_into_mapping(const std::byte* src) {
  cl_int r = CL_SUCCESS;
  void* host = cl_.clEnqueueMapBuffer(queue_, mapped_, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0,
                                      nbytes_, 0, nullptr, nullptr, &r);
  cl_check(r, "clEnqueueMapBuffer(mapped buffer, CL_MAP_WRITE_INVALIDATE_REGION, " +
               std::to_string(nbytes_) + " bytes)");
  two_thread_copy(static_cast<std::byte*>(host), src, nbytes_);
  cl_check(cl_.clEnqueueUnmapMemObject(queue_, mapped_, host, 0, nullptr, nullptr),
        "clEnqueueUnmapMemObject(mapped buffer)");
  cl_check(cl_.clFinish(queue_), "clFinish");
}

// Read back chunk by chunk into host memory cleared first.
std::string OpenclPaths::read_back(cl_mem buffer, const std::byte* expected) {
  std::vector<std::byte> back(std::min(chunk_, nbytes_));
  for (uint64_t at = 0; at < nbytes_; at += back.size()) {
    const uint64_t n = std::min<uint64_t>(back.size(), nbytes_ - at);
    std::memset(back.data(), 0, n);
    cl_check(cl_.clEnqueueReadBuffer(queue_, buffer, CL_TRUE, at, n, back.data(), 0, nullptr,
                                  nullptr),
          "clEnqueueReadBuffer(blocking, offset = " + std::to_string(at) +
              ", size = " + std::to_string(n) + ")");
    std::string wrong = first_difference(back.data(), expected + at, n, at, nbytes_);
    if (!wrong.empty()) return wrong;
  }
  return {};
}

}  // namespace

std::unique_ptr<DriverPaths> open_opencl(const std::byte* src, uint64_t nbytes, uint64_t chunk,
                                         std::string* skipped) {
  void* library = ::dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    *skipped = std::string("dlopen(\"libOpenCL.so.1\"): ") + (why ? why : "failed");
    return nullptr;
  }
  auto paths = std::make_unique<OpenclPaths>(library, nbytes, chunk);
  if (!paths->open(src, skipped)) return nullptr;
  return paths;
}

}  // namespace devalloc::bench
