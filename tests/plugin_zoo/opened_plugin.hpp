// Opens a plugin file with dlopen and negotiates by hand, without the
// loader, so that the zoo and the host plugin are tested on their own.
#pragma once

#include <devalloc/plugin_abi.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace devalloc::zoo_test {

inline std::string zoo_file(const std::string& name) {
  return std::string(DEVALLOC_PLUGIN_ZOO_DIR) + "/" + name;
}

inline std::string installed_plugin_file(const std::string& name) {
  return std::string(DEVALLOC_PLUGIN_BUILD_DIR) + "/" + name;
}

inline devalloc_error empty_error() {
  devalloc_error error{};
  error.struct_size = sizeof error;
  return error;
}

inline devalloc_negotiation v1_request() {
  devalloc_negotiation n{};
  n.struct_size = sizeof n;
  n.host_min_major = 1;
  n.host_max_major = 1;
  n.host_max_minor = DEVALLOC_ABI_VERSION_MINOR;
  return n;
}

struct Library {
  explicit Library(const std::string& path)
      : handle(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)),
        open_error(handle == nullptr ? dlerror() : "") {}
  ~Library() {
    if (handle != nullptr) dlclose(handle);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  devalloc_plugin_negotiate_fn entry() const {
    return reinterpret_cast<devalloc_plugin_negotiate_fn>(
        dlsym(handle, DEVALLOC_PLUGIN_ENTRY_POINT_NAME));
  }

  void* handle;
  std::string open_error;
};

// A created instance of a plugin that negotiated version 1; destroyed before
// its library is closed.
class Instance {
 public:
  using Options = std::vector<std::pair<std::string, std::string>>;

  // status and error say why when the result has no instance.
  static std::unique_ptr<Instance> open(const std::string& path, const Options& options,
                                        devalloc_status* status, devalloc_error* error) {
    auto result = std::unique_ptr<Instance>(new Instance(path));
    if (result->library_.handle == nullptr) {
      *status = DEVALLOC_STATUS_RUNTIME_UNAVAILABLE;
      std::snprintf(error->message, sizeof error->message, "%s",
                    result->library_.open_error.c_str());
      return nullptr;
    }
    auto negotiation = v1_request();
    *status = result->library_.entry()(&negotiation, error);
    if (*status != DEVALLOC_STATUS_OK) return nullptr;
    result->api_ = static_cast<const devalloc_plugin_api_v1*>(negotiation.api);

    std::vector<const char*> keys, values;
    for (const auto& [k, v] : options) {
      keys.push_back(k.c_str());
      values.push_back(v.c_str());
    }
    devalloc_create_args args{};
    args.struct_size = sizeof args;
    args.option_keys = keys.data();
    args.option_values = values.data();
    args.option_count = options.size();
    *status = result->api_->create(&args, error);
    if (*status != DEVALLOC_STATUS_OK) return nullptr;
    result->instance_ = args.instance;
    return result;
  }

  ~Instance() {
    if (instance_ != nullptr) api_->destroy(instance_);
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  const devalloc_plugin_api_v1& api() const { return *api_; }
  devalloc_instance* get() const { return instance_; }
  // The message of the last failed call below.
  std::string message() const { return error_.message; }

  devalloc_status allocate(uint64_t nbytes, uint64_t alignment, uint64_t* address) {
    devalloc_allocate_args args{};
    args.struct_size = sizeof args;
    args.nbytes = nbytes;
    args.alignment = alignment;
    const devalloc_status status = api_->allocate(instance_, &args, &error_);
    *address = args.address;
    return status;
  }

  devalloc_status deallocate(uint64_t address) {
    return api_->deallocate(instance_, 0, address, &error_);
  }

  devalloc_status copy(uint64_t dst, const void* src, uint64_t nbytes,
                       devalloc_src_lifetime lifetime,
                       devalloc_release_fn on_release = nullptr, void* user_data = nullptr) {
    devalloc_copy_to_device_args args{};
    args.struct_size = sizeof args;
    args.src_lifetime = lifetime;
    args.dst = dst;
    args.src = src;
    args.nbytes = nbytes;
    args.on_release = on_release;
    args.user_data = user_data;
    return api_->copy_host_to_device(instance_, &args, &error_);
  }

  devalloc_status read(void* dst, uint64_t src, uint64_t nbytes) {
    devalloc_copy_to_host_args args{};
    args.struct_size = sizeof args;
    args.src = src;
    args.dst = dst;
    args.nbytes = nbytes;
    return api_->copy_device_to_host(instance_, &args, &error_);
  }

  devalloc_status synchronize() { return api_->synchronize(instance_, 0, &error_); }

  // Destroys the instance now, keeping the library open.
  void destroy() {
    api_->destroy(instance_);
    instance_ = nullptr;
  }

 private:
  explicit Instance(const std::string& path) : library_(path) {}

  Library library_;
  const devalloc_plugin_api_v1* api_ = nullptr;
  devalloc_instance* instance_ = nullptr;
  devalloc_error error_ = empty_error();
};

}  // namespace devalloc::zoo_test
