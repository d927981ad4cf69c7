// C++ handles over a plugin: the open library (PluginLibrary) and a created
// instance (Plugin). Every call returns a Status; nothing throws.
//
// Lifetime: a Plugin holds its PluginLibrary; the library is closed only when
// the last Plugin made from it and the last PluginLibrary handle are gone, and
// always after the instance was destroyed.
#pragma once

#include <devalloc/plugin_abi.h>
#include <devalloc/plugin_layer.hpp>
#include <devalloc/status.hpp>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace devalloc {

// Why a plugin file was refused. `loaded` means it was accepted.
enum class PluginOutcome {
  loaded,
  not_found,           // no such file, or no file of that name on the path
  open_failed,         // dlopen failed (dlerror text in the message)
  no_entry_point,      // devalloc_plugin_negotiate is not exported, or not a function
  negotiation_failed,  // the entry point refused or returned garbage
  version_mismatch,    // no ABI major in common
  table_too_small,     // struct_size of the function table is too small
  create_failed,       // create() returned an error
  shadowed,            // a plugin of the same name was found earlier on the path
  untrusted,           // refused by the trust checks; never opened
};
const char* to_string(PluginOutcome outcome);

class PluginLibrary;
class PluginLayer;
class RegularFile;

// The failure of opening or creating a plugin: its outcome and a message that
// names the file and the precise reason.
struct PluginError {
  PluginOutcome outcome = PluginOutcome::not_found;
  Status status;
};

struct DeviceInfo {
  uint32_t index = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  std::array<uint8_t, 16> uuid{};
  std::string pci_bus_id;  // "" when none
  int32_t dlpack_device_type = 0;
  int32_t dlpack_device_id = 0;
  // ABI 1.2: which memory of its card this device is ("hbm", "sram"), or
  // "" for a card with one memory (PLUGIN-24).
  std::string memory_kind;

  bool has_uuid() const;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" style, lower-case hex,
  // without prefix: "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
  std::string uuid_string() const;
};

struct Capabilities {
  bool async_copy = false;
  bool host_staging = false;
  // ABI 1.1: allocate() returns host pointers the host may write directly
  // while no copy into the range is in flight.
  bool host_addressable = false;
  // ABI 1.2: map_to_host / unmap_from_host (PLUGIN-22).
  bool host_mappable = false;
  uint64_t max_alignment = 0;
  // ABI 1.2 DMA constraints of copies to the device (PLUGIN-23), as the
  // plugin stated them; 0 (and 1 for the alignment): none.
  uint64_t copy_src_alignment = 0;
  uint64_t copy_preferred_bytes = 0;
  uint64_t copy_max_bytes = 0;
};

// A device's memory as get_memory_info (ABI 1.1) reports it.
struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

using PluginOptions = std::vector<std::pair<std::string, std::string>>;

// Plugin::create refuses a plugin that reports more devices than this.
inline constexpr uint32_t kMaxPluginDevices = 4096;

// A created plugin instance. Not copyable; share it with shared_ptr.
class Plugin {
 public:
  ~Plugin();  // destroy(instance), then drop the library reference
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  // Creates an instance of an open library with the given options. With
  // layers active (after DEVALLOC_VALIDATE is applied to them), every call,
  // from the first get_capabilities on, goes through the layer
  // (devalloc/plugin_layer.hpp); api() and instance() are then the layer's.
  static std::pair<std::shared_ptr<Plugin>, PluginError> create(
      std::shared_ptr<const PluginLibrary> library,
      const PluginOptions& options, const LayerSettings& layers = {});

  const std::string& name() const;  // plugin_name from the table
  const std::string& version() const;
  const std::filesystem::path& path() const;
  uint32_t abi_major() const;
  uint32_t abi_minor() const;
  const PluginLibrary& library() const { return *library_; }

  const Capabilities& capabilities() const { return capabilities_; }
  const std::vector<DeviceInfo>& devices() const { return devices_; }

  Result<uint64_t> allocate(uint32_t device, uint64_t nbytes,
                            uint64_t alignment);
  Status deallocate(uint32_t device, uint64_t address);
  // src may be reused as soon as the call returns.
  Status copy_to_device(uint32_t device, uint64_t dst, const void* src,
                        uint64_t nbytes);
  // src stays readable until on_release(user_data) ran (exactly once, also
  // when this returns an error).
  Status copy_to_device_until_released(uint32_t device, uint64_t dst,
                                       const void* src, uint64_t nbytes,
                                       devalloc_release_fn on_release,
                                       void* user_data);
  Status copy_to_host(uint32_t device, void* dst, uint64_t src,
                      uint64_t nbytes);
  Status synchronize(uint32_t device);
  // An asynchronous failure is reported by the next synchronize of its
  // device, whoever calls it (PLUGIN-17): with several callers at once (two
  // loads of one runtime, an allocator), one caller's failed copy may be
  // reported to another. A caller that needs to know whether a failure may
  // have been its own takes a mark before its first copy and asks after its
  // last synchronize.
  // The number of synchronize calls of `device` that failed so far.
  uint64_t synchronize_failures(uint32_t device) const;
  // Waits until every synchronize of `device` that began before this call
  // returned; then the error of the last synchronize of the device that
  // failed after synchronize_failures(device) said `mark`, or ok when none
  // did.
  Status synchronize_failure_since(uint32_t device, uint64_t mark) const;
  // Free and total memory of device, or nullopt when the plugin does not
  // offer get_memory_info (a 1.0 table, or the function is NULL).
  Result<std::optional<MemoryInfo>> memory_info(uint32_t device);
  // ABI 1.2 (PLUGIN-22): [address, address + nbytes) of a live allocation
  // in the host; unsupported unless capabilities().host_mappable. Writes
  // through it are on the device once unmap_from_host returned.
  Result<void*> map_to_host(uint32_t device, uint64_t address, uint64_t nbytes);
  Status unmap_from_host(uint32_t device, void* host);
  // unsupported when the plugin has no host staging.
  Result<void*> allocate_host(uint64_t nbytes);
  Status free_host(void* host);

  // The table and instance every call goes through, for tests and
  // wrappers: the plugin's own, or its layer's.
  const devalloc_plugin_api_v1& api() const { return *api_; }
  devalloc_instance* instance() const { return instance_; }

  // What the layer saw so far; nullopt without a layer.
  std::optional<LayerCounters> layer_counters() const;
  // The layer's settings (DEVALLOC_VALIDATE applied); nullopt without a
  // layer. check_names() says which checks are on.
  std::optional<LayerSettings> layer_settings() const;

 private:
  Plugin(std::shared_ptr<const PluginLibrary> library,
         devalloc_instance* instance);
  // "plugin NAME: " + context + message from the plugin.
  Status check(devalloc_status status, const devalloc_error& error,
               const char* call) const;
  // Runs call(&error), one function of the table, so that no C++ exception
  // leaves it (PLUGIN-7; loader/src/guarded_call.hpp), then check()s it.
  template <class Call>
  Status call_checked(const char* function, Call&& call) const;

  std::shared_ptr<const PluginLibrary> library_;
  const devalloc_plugin_api_v1* api_ = nullptr;
  devalloc_instance* instance_ = nullptr;
  PluginLayer* layer_ = nullptr;  // owned by instance_ when set
  Capabilities capabilities_;
  std::vector<DeviceInfo> devices_;
  // synchronize(), which may throw (an allocation that fails).
  Status synchronize_or_throw(uint32_t device);

  // Per device (indexed like devices_), under sync_mutex_: the synchronize
  // calls running now (by number), how many failed, and the last failure.
  struct SynchronizeRecord {
    uint64_t began = 0;
    std::set<uint64_t> running;
    uint64_t failures = 0;
    Status last_failure;
  };
  mutable std::mutex sync_mutex_;
  mutable std::condition_variable sync_returned_;
  std::vector<SynchronizeRecord> synchronizes_;
};

// An opened and negotiated plugin library.
class PluginLibrary {
 public:
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  // Opens path (absolute, resolved by the caller) with RTLD_NOW|RTLD_LOCAL,
  // negotiates the ABI version and checks the table size. Before dlopen the
  // file is read as an ELF shared object of this machine (class, byte
  // order, e_machine, ET_DYN, every segment inside the file): a truncated
  // copy or another architecture's file is refused as open_failed, never
  // mapped (a truncated file mapped by dlopen raises SIGBUS). A library
  // whose static initializer throws out of dlopen ends the process
  // (std::terminate): nothing survives that (docs/abi.md, PLUGIN-7).
  static std::pair<std::shared_ptr<PluginLibrary>, PluginError> open(
      const std::filesystem::path& path);
  // The same, with path already open as `file` (check_plugin_file's
  // descriptor): the ELF checks read through it.
  static std::pair<std::shared_ptr<PluginLibrary>, PluginError> open(
      const std::filesystem::path& path, const RegularFile& file);

  const std::filesystem::path& path() const { return path_; }
  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  uint32_t abi_major() const { return abi_major_; }
  uint32_t abi_minor() const { return abi_minor_; }
  // The loader's copy of the plugin's function table, taken and checked at
  // negotiation (PLUGIN-3: the table is read once): what the plugin's table
  // held then, up to the smaller of its struct_size and this header's
  // (struct_size says which), the rest zero. Every call goes through it.
  const devalloc_plugin_api_v1& api() const { return api_; }

 private:
  struct Impl;
  explicit PluginLibrary(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::filesystem::path path_;
  std::string name_;
  std::string version_;
  uint32_t abi_major_ = 0;
  uint32_t abi_minor_ = 0;
  devalloc_plugin_api_v1 api_{};
};

}  // namespace devalloc
