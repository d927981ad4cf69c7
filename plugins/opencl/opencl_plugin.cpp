// The OpenCL plugin as a kit plugin: the ICD loader opened at run time, every
// device of every platform (narrowed by the options platform and
// device_type), each with its own context and in-order queue; host staging
// from CL_MEM_ALLOC_HOST_PTR buffers; host mapping of device buffers
// (ABI 1.2, PLUGIN-22).
#include <CL/cl_ext.h>
#include <dlfcn.h>

#include <cinttypes>
#include <devalloc/plugin_kit/device_instance.hpp>
#include <devalloc/plugin_kit/give_back.hpp>
#include <devalloc/plugin_kit/plugin_entry.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cl_device.hpp"
#include "cl_runtime.hpp"

#ifndef DEVALLOC_OPENCL_PLUGIN_VERSION
#error "DEVALLOC_OPENCL_PLUGIN_VERSION must be defined by the build"
#endif

namespace devalloc::opencl {
namespace {

using plugin::CallKind;
using plugin::Failure;

constexpr const char* kPluginName = "opencl";

// The options of create (PLUGIN-8).
struct Config {
  std::string library = "libOpenCL.so.1";
  // A substring of CL_PLATFORM_NAME; "" takes every platform.
  std::string platform;
  std::string device_type_name = "all";
  cl_device_type device_type = CL_DEVICE_TYPE_ALL;
};

Config take_config(plugin::Options& options) {
  Config config;
  std::string value;
  if (options.take("runtime_library", value)) {
    if (value.empty()) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, "opencl: option runtime_library is empty"};
    }
    config.library = value;
  }
  options.take("platform", config.platform);
  if (options.take("device_type", value)) {
    static const std::pair<const char*, cl_device_type> kTypes[] = {
        {"all", CL_DEVICE_TYPE_ALL},
        {"cpu", CL_DEVICE_TYPE_CPU},
        {"gpu", CL_DEVICE_TYPE_GPU},
        {"accelerator", CL_DEVICE_TYPE_ACCELERATOR}};
    bool known = false;
    for (const auto& [name, type] : kTypes) {
      if (value == name) {
        config.device_type_name = name;
        config.device_type = type;
        known = true;
      }
    }
    if (!known) {
      throw Failure{
          DEVALLOC_STATUS_INVALID_ARGUMENT,
          "opencl: option device_type = \"" + value + "\": expected all, cpu, gpu or accelerator"};
    }
  }
  options.reject_unknown(kPluginName, "runtime_library, platform, device_type");
  return config;
}

// Event callbacks run plugin code on the driver's threads, and the last
// instructions of one may still run after destroy has seen it done: the
// plugin library stays loaded for the life of the process (as the ICD
// loader and its drivers do), so that no such thread runs unmapped code.
void keep_plugin_loaded() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&keep_plugin_loaded), &info) == 0 ||
      info.dli_fname == nullptr ||
      ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == nullptr) {
    const char* reason = ::dlerror();
    throw Failure{DEVALLOC_STATUS_INTERNAL,
                  std::string("cannot keep the plugin library loaded for the driver's event "
                              "callbacks (dladdr/dlopen RTLD_NODELETE): ") +
                      (reason != nullptr ? reason : "unknown reason")};
  }
}

// A base before the devices, so that the runtime is open before them and
// closed after them, also when a constructor throws.
class Runtimes {
 protected:
  explicit Runtimes(const Config& config) : cl_(config.library) { keep_plugin_loaded(); }

  // Every device of every platform the options leave, in the ICD loader's
  // platform order, each platform's devices in its order.
  std::vector<std::unique_ptr<ClDevice>> open_devices(const Config& config) const;

  Runtime cl_;
};

std::string platform_name(const Runtime& cl, cl_platform_id platform, size_t p) {
  size_t size = 0;
  cl.check(cl.clGetPlatformInfo(platform, CL_PLATFORM_NAME, 0, nullptr, &size), CallKind::work,
           "clGetPlatformInfo(platform %zu, CL_PLATFORM_NAME, size)", p);
  std::string name(size, '\0');
  cl.check(cl.clGetPlatformInfo(platform, CL_PLATFORM_NAME, size, name.data(), nullptr),
           CallKind::work, "clGetPlatformInfo(platform %zu, CL_PLATFORM_NAME)", p);
  name.resize(std::char_traits<char>::length(name.c_str()));
  return name;
}

std::vector<std::unique_ptr<ClDevice>> Runtimes::open_devices(const Config& config) const {
  cl_uint count = 0;
  const cl_int r = cl_.clGetPlatformIDs(0, nullptr, &count);
  if (r == CL_PLATFORM_NOT_FOUND_KHR) {
    throw Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                  "clGetPlatformIDs(count) failed: CL_PLATFORM_NOT_FOUND_KHR (the ICD loader "
                  "found no OpenCL driver: no .icd file in /etc/OpenCL/vendors, or none that "
                  "loads)"};
  }
  cl_.check(r, CallKind::work, "clGetPlatformIDs(count)");
  std::vector<cl_platform_id> platforms(count);
  if (count > 0) {
    cl_.check(cl_.clGetPlatformIDs(count, platforms.data(), &count), CallKind::work,
              "clGetPlatformIDs(%u)", count);
    platforms.resize(count);
  }
  std::vector<std::unique_ptr<ClDevice>> devices;
  for (size_t p = 0; p < platforms.size(); ++p) {
    if (platform_name(cl_, platforms[p], p).find(config.platform) == std::string::npos) continue;
    cl_uint n = 0;
    const cl_int found = cl_.clGetDeviceIDs(platforms[p], config.device_type, 0, nullptr, &n);
    if (found == CL_DEVICE_NOT_FOUND || (found == CL_SUCCESS && n == 0)) continue;
    cl_.check(found, CallKind::work, "clGetDeviceIDs(platform %zu, device_type %s, count)", p,
              config.device_type_name.c_str());
    std::vector<cl_device_id> ids(n);
    cl_.check(cl_.clGetDeviceIDs(platforms[p], config.device_type, n, ids.data(), &n),
              CallKind::work, "clGetDeviceIDs(platform %zu, device_type %s, %u)", p,
              config.device_type_name.c_str(), n);
    ids.resize(n);
    for (cl_device_id id : ids) {
      devices.push_back(std::make_unique<ClDevice>(cl_, id, static_cast<uint32_t>(devices.size())));
    }
  }
  return devices;
}

class OpenClInstance final : private Runtimes, public plugin::DeviceInstance<ClDevice> {
 public:
  explicit OpenClInstance(const Config& config)
      : Runtimes(config), DeviceInstance(open_devices(config)) {}

  ~OpenClInstance() override {
    // Staging memory may be the source of copies still in flight.
    quiesce_devices();
    for (const auto& [host, buffer] : staging_) {
      devices_.front()->give_back_host_buffer(ClDevice::HostBuffer{buffer, host});
    }
    staging_.clear();
    devices_.clear();
  }

  uint64_t capability_flags() const override {
    uint64_t flags = DEVALLOC_CAPABILITY_ASYNC_COPY | DEVALLOC_CAPABILITY_HOST_MAPPABLE;
    if (!devices_.empty()) flags |= DEVALLOC_CAPABILITY_HOST_STAGING;
    return flags;
  }

  void* map_to_host(uint32_t device, uint64_t address, uint64_t nbytes) override {
    return devices_[device]->map(address, nbytes);
  }
  void unmap_from_host(uint32_t device, void* host) override { devices_[device]->unmap(host); }

  // Staging buffers belong to the first device's context. Any host memory
  // may be the source of a write to any device's buffer, so they serve
  // every device (PLUGIN-18); pinned they are for the first one's driver.
  void* allocate_host(uint64_t nbytes) override {
    if (devices_.empty()) {
      throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                    "host memory needs an OpenCL context, and this instance has no device"};
    }
    const ClDevice::HostBuffer staging = devices_.front()->create_host_buffer(nbytes);
    try {
      std::lock_guard lock(staging_mutex_);
      staging_.emplace(staging.host, staging.buffer);
    } catch (...) {
      devices_.front()->give_back_host_buffer(staging);
      throw;
    }
    return staging.host;
  }

  void free_host(void* host) override {
    cl_mem buffer = nullptr;
    {
      std::lock_guard lock(staging_mutex_);
      auto it = staging_.find(host);
      if (it == staging_.end()) {
        throw Failure{
            DEVALLOC_STATUS_INVALID_ARGUMENT,
            plugin::format("%p is not a live buffer from allocate_host (PLUGIN-18)", host)};
      }
      buffer = it->second;
      staging_.erase(it);
    }
    bool ended = false;
    try {
      devices_.front()->destroy_host_buffer(ClDevice::HostBuffer{buffer, host}, &ended);
    } catch (...) {
      // Still mapped and held only when its unmap was never enqueued.
      if (!ended) {
        std::lock_guard lock(staging_mutex_);
        staging_.emplace(host, buffer);
      }
      throw;
    }
  }

 private:
  std::mutex staging_mutex_;
  // Mapped pointer -> its CL_MEM_ALLOC_HOST_PTR buffer.
  std::map<void*, cl_mem> staging_;
};

struct OpenClPlugin {
  static constexpr const char* name = kPluginName;
  static constexpr const char* version = DEVALLOC_OPENCL_PLUGIN_VERSION;
  static constexpr bool offers_host_mapping = true;

  static std::unique_ptr<plugin::Instance> create(plugin::Options& options) {
    const Config config = take_config(options);
    return plugin::detail::create_unavailable_on_failure<OpenClInstance>(name, config);
  }
};

}  // namespace
}  // namespace devalloc::opencl

DEVALLOC_PLUGIN_KIT_ENTRY_POINT(devalloc::opencl::OpenClPlugin)
