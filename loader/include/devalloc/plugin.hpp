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
#include <devalloc/unique_function.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
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
namespace detail {
class ReleaseTracker;
}
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

// The end of an until-released copy made with a completion
// (Plugin::copy_to_device_until_released): the plugin released it and its
// copy call returned.
struct CopyOutcome {
  Status call;  // what the copy call returned
  // Released after a synchronize that covered it had returned (PLUGIN-20
  // allows it; the caller may count it).
  bool late = false;
  // Released a second time before its call returned (PLUGIN-14): the
  // caller says so (a second release after this is a ReleaseBreach).
  bool released_twice = false;
};
// Runs once per copy, on the thread that came last: the caller's, before
// the copy call returns, or the plugin's, in its on_release. It must not
// throw nor call into the same plugin (PLUGIN-14 forbids that in an
// on_release). Small callables (up to 48 bytes) are held without an
// allocation.
using CopyCompletion = UniqueFunction<void(CopyOutcome&&)>;

// A release rule the plugin broke that no completion was told of: a copy
// released again after its completion ran, or a release for no copy.
struct ReleaseBreach {
  uint32_t device = 0;   // with `copy`: the copy's device, destination, size
  uint64_t dst = 0;      // and owner (copy_to_device_until_released's)
  uint64_t nbytes = 0;
  const void* owner = nullptr;
  bool copy = false;
  std::string text;  // "plugin x broke PLUGIN-14 (PLUGIN-21 release accounting): ..."
};
// Breaches a Plugin keeps, the last ones; older ones are counted only.
inline constexpr size_t kReleaseBreachesKept = 64;
// Released copies a Plugin remembers, the last ones, to name a second
// release of one (an older one's is reported as a release for no copy):
// its memory stays bounded however many copies a long run makes.
inline constexpr size_t kReleasedCopiesKept = 4096;

// A copy that a synchronize covered and whose release had not come when a
// wait gave up (PLUGIN-20; PLUGIN-14 when its call failed).
struct OwedRelease {
  uint32_t device = 0;
  uint64_t dst = 0;
  uint64_t nbytes = 0;
  bool call_failed = false;
};
struct ReleaseWait {
  bool waited = false;  // some covered copy was still unreleased when the wait began
  std::optional<OwedRelease> owed;  // set when one still is: the oldest
};

// What allocate's alignment 0 asks for at least (PLUGIN-11: the natural
// alignment, at least 256).
inline constexpr uint64_t kNaturalAlignment = 256;

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

  // An address that breaks PLUGIN-11 (0, not aligned to `alignment` or,
  // for 0, to kNaturalAlignment, wrapping past 2^64 within nbytes) is handed
  // back and refused as a device_error; so is one that overlaps a live
  // allocation of the device made through this handle (not handed back).
  Result<uint64_t> allocate(uint32_t device, uint64_t nbytes,
                            uint64_t alignment);
  Status deallocate(uint32_t device, uint64_t address);
  // src may be reused as soon as the call returns.
  Status copy_to_device(uint32_t device, uint64_t dst, const void* src,
                        uint64_t nbytes);
  // src stays readable until the plugin released the copy. The handle
  // gives the copy its user_data and accounts its release (PLUGIN-14,
  // PLUGIN-21): `done` runs exactly once, with the outcome, when the plugin
  // released the copy and the call returned, also when the call failed
  // (and at once when the copy could not be issued). A second release, or
  // one that names no copy, is kept as a ReleaseBreach. Returns what the
  // call returned.
  // `owner`, when given, names the caller's series of copies (a load) for
  // wait_released.
  Status copy_to_device_until_released(uint32_t device, uint64_t dst, const void* src,
                                       uint64_t nbytes, CopyCompletion done,
                                       const void* owner = nullptr);
  // The same with the caller's own on_release and user_data, passed to the
  // plugin untouched (under the validation layer, the layer makes the copy
  // one of the handle's, whose completion calls on_release): for the
  // conformance suite and the plugins' own tests, which watch what the
  // plugin itself does. src stays readable until on_release(user_data) ran
  // (exactly once, also when this returns an error).
  Status copy_to_device_until_released(uint32_t device, uint64_t dst,
                                       const void* src, uint64_t nbytes,
                                       devalloc_release_fn on_release,
                                       void* user_data);
  // Waits until every copy of `device` made with a completion that a
  // synchronize of the device covered (its call had returned when the
  // synchronize began, and the synchronize returned) is released: at most
  // `timeout`, or until *stop is set. Such a copy released late makes its
  // outcome's `late` true. Returns once those were released and their
  // completions ran. With `owner`, only that owner's copies.
  ReleaseWait wait_released(uint32_t device, std::chrono::milliseconds timeout,
                            const void* owner = nullptr,
                            const std::atomic<bool>* stop = nullptr);
  // Release breaches so far (ReleaseBreach), and the ones since a count
  // (the last kReleaseBreachesKept of them).
  uint64_t release_breach_count() const;
  std::vector<ReleaseBreach> release_breaches_since(uint64_t mark) const;
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
  // unsupported when the plugin has no host staging. Staging memory is the
  // host's from allocate_host to free_host (PLUGIN-18): a buffer that
  // overlaps one any plugin handed out and the host still holds, in this
  // process, is refused (never handed back: the plugin frees it at
  // destroy).
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
  // Declared before the instance's table: destroyed after ~Plugin destroyed
  // the instance, so no release of a live instance finds it gone.
  std::unique_ptr<detail::ReleaseTracker> releases_;
  const devalloc_plugin_api_v1* api_ = nullptr;
  devalloc_instance* instance_ = nullptr;
  PluginLayer* layer_ = nullptr;  // owned by instance_ when set
  Capabilities capabilities_;
  std::vector<DeviceInfo> devices_;
  // synchronize(), which may throw (an allocation that fails).
  Status synchronize_or_throw(uint32_t device);
  // allocate's checks of an address the plugin returned (PLUGIN-11);
  // throws bad_alloc with nothing recorded.
  Result<uint64_t> checked_allocation(uint32_t device, uint64_t base, uint64_t nbytes,
                                      uint64_t alignment);
  // free_host without letting go of the buffer in the staging registry.
  Status free_host_unheld(void* host);

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
  // Per device (indexed like devices_): live allocations, start -> end (0:
  // 2^64), under allocations_mutex_.
  std::mutex allocations_mutex_;
  std::vector<std::map<uint64_t, uint64_t>> live_allocations_;
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
