#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>
#include <devalloc/plugin.hpp>

#include "capability_flags.hpp"
#include "guarded_call.hpp"
#include "plugin_status.hpp"
#include "plugin_layer.hpp"
#include "release_tracker.hpp"
#include "staging_registry.hpp"

#include <devalloc/address_text.hpp>

#include <cstring>

namespace devalloc {

namespace {

devalloc_error make_error() {
  devalloc_error error{};
  error.struct_size = sizeof error;
  return error;
}

std::string text_of(const char* chars, size_t capacity) {
  return std::string(chars, strnlen(chars, capacity));
}

// A plugin's error message as it goes into a Status: escaped for the
// terminal like any other text that did not come from devalloc.
std::string message_text(const devalloc_error& error) {
  return escaped(text_of(error.message, sizeof error.message), sizeof error.message);
}

// An output struct handed to a plugin, followed by slack: a plugin that
// writes past the struct_size it was given (PLUGIN-4) scribbles into the
// slack instead of the loader's stack. The validation layer reports it.
template <class Struct>
struct WithSlack {
  Struct value{};
  unsigned char slack[512]{};
};

}  // namespace

Plugin::Plugin(std::shared_ptr<const PluginLibrary> library,
               devalloc_instance* instance)
    : library_(std::move(library)),
      releases_(std::make_unique<detail::ReleaseTracker>(library_->name())),
      api_(&library_->api()),
      instance_(instance) {}

Plugin::~Plugin() {
  // Destroy before the library reference goes: the instance's code lives in
  // the library. A layer destroys the plugin's instance, then itself.
  if (instance_ != nullptr) {
    // destroy returns nothing; an exception out of it (PLUGIN-7) is dropped.
    detail::guarded_call("destroy", nullptr, [&] {
      api_->destroy(instance_);
      return DEVALLOC_STATUS_OK;
    });
  }
  // The staging the host kept (a load a breach ended) went with the
  // instance (PLUGIN-9): no longer held.
  detail::let_go_of_staging_of(this);
}

std::optional<LayerCounters> Plugin::layer_counters() const {
  if (layer_ == nullptr) return std::nullopt;
  return layer_->counters();
}

std::optional<LayerSettings> Plugin::layer_settings() const {
  if (layer_ == nullptr) return std::nullopt;
  return layer_->settings();
}

const std::string& Plugin::name() const { return library_->name(); }
const std::string& Plugin::version() const { return library_->version(); }
const std::filesystem::path& Plugin::path() const { return library_->path(); }
uint32_t Plugin::abi_major() const { return library_->abi_major(); }
uint32_t Plugin::abi_minor() const { return library_->abi_minor(); }

Status Plugin::check(devalloc_status status, const devalloc_error& error,
                     const char* call) const {
  if (status == DEVALLOC_STATUS_OK) return Status();
  std::string message = message_text(error);
  if (!detail::abi_defines(status)) {
    // PLUGIN-5: a status the header does not define becomes internal; the
    // caller learns which call gave it and what it was.
    message = detail::undefined_status_text(call, status, message);
  } else if (message.empty()) {
    // PLUGIN rule: every failure carries a message. Say who broke it.
    message = std::string(call) + " failed with " +
              to_string(status_code_from_abi(status)) +
              " and gave no message";
  }
  return Status(status_code_from_abi(status),
                "plugin " + name() + ": " + message);
}

template <class Call>
Status Plugin::call_checked(const char* function, Call&& call) const {
  devalloc_error error = make_error();
  const devalloc_status status =
      detail::guarded_call(function, &error, [&] { return call(&error); });
  // Wording a failure allocates; if that fails, the failure keeps its code.
  try {
    return check(status, error, function);
  } catch (...) {
    return Status(status_code_from_abi(status), std::string());
  }
}

std::pair<std::shared_ptr<Plugin>, PluginError> Plugin::create(
    std::shared_ptr<const PluginLibrary> library,
    const PluginOptions& options, const LayerSettings& layers) {
  const devalloc_plugin_api_v1* api_in_use = &library->api();
  std::vector<const char*> keys, values;
  keys.reserve(options.size());
  values.reserve(options.size());
  for (const auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  devalloc_create_args args{};
  args.struct_size = sizeof args;
  args.option_keys = keys.data();
  args.option_values = values.data();
  args.option_count = options.size();
  devalloc_error error = make_error();
  const devalloc_status status =
      detail::guarded_call("create", &error, [&] { return api_in_use->create(&args, &error); });

  const auto who_text = [&] {
    return "plugin " + library->name() + " (" + path_for_message(library->path().string()) + ")";
  };
  if (status != DEVALLOC_STATUS_OK || args.instance == nullptr) {
    std::string message = message_text(error);
    if (status == DEVALLOC_STATUS_OK) {
      message = "create returned no instance";
    } else if (!detail::abi_defines(status)) {
      message = detail::undefined_status_text("create", status, message);
    }
    if (message.empty()) message = "(no message)";
    return {nullptr,
            {PluginOutcome::create_failed,
             Status(status == DEVALLOC_STATUS_OK ? StatusCode::internal
                                                 : status_code_from_abi(status),
                    who_text() + ": create failed: " + message)}};
  }
  // The instance is the Plugin's from here (its destructor destroys it):
  // an allocation that fails before then must not leave it behind.
  Plugin* raw = nullptr;
  try {
    raw = new Plugin(library, args.instance);
  } catch (...) {
    detail::guarded_call("destroy", nullptr, [&] {
      api_in_use->destroy(args.instance);
      return DEVALLOC_STATUS_OK;
    });
    throw;
  }
  std::shared_ptr<Plugin> plugin(raw);  // deletes raw if this throws
  const std::string who = who_text();
  if (const LayerSettings settings = layers.with_environment(); settings.active()) {
    PluginLayer* layer =
        PluginLayer::wrap(*api_in_use, args.instance, library->abi_minor(), who, settings,
                         *plugin->releases_);
    plugin->layer_ = layer;
    plugin->api_ = &layer->table();
    plugin->instance_ = layer->instance();
  }
  const devalloc_plugin_api_v1& api = plugin->api();

  auto create_failed = [&](const Status& s) {
    return std::pair<std::shared_ptr<Plugin>, PluginError>{
        nullptr, {PluginOutcome::create_failed, s.with_context(who)}};
  };

  WithSlack<devalloc_capabilities> caps_buffer;
  devalloc_capabilities& caps = caps_buffer.value;
  caps.struct_size = sizeof caps;
  if (Status s = plugin->call_checked("get_capabilities",
                                      [&](devalloc_error* e) {
                                        return api.get_capabilities(plugin->instance_, &caps, e);
                                      });
      !s.ok()) {
    return create_failed(s);
  }
  // Only the flags the negotiated minor defines: a 1.0 plugin's bit 2 is no
  // HOST_ADDRESSABLE (it would have the host write through its addresses).
  const uint64_t flags = caps.flags & detail::capability_flags_of_minor(library->abi_minor());
  plugin->capabilities_.async_copy =
      (flags & DEVALLOC_CAPABILITY_ASYNC_COPY) != 0;
  plugin->capabilities_.host_staging =
      (flags & DEVALLOC_CAPABILITY_HOST_STAGING) != 0 &&
      api.struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_plugin_api_v1,
                                              free_host) &&
      api.allocate_host != nullptr && api.free_host != nullptr;
  plugin->capabilities_.host_addressable =
      (flags & DEVALLOC_CAPABILITY_HOST_ADDRESSABLE) != 0;
  plugin->capabilities_.host_mappable =
      (flags & DEVALLOC_CAPABILITY_HOST_MAPPABLE) != 0 &&
      api.struct_size >= DEVALLOC_PLUGIN_API_V1_2_SIZE && api.map_to_host != nullptr &&
      api.unmap_from_host != nullptr;
  plugin->capabilities_.max_alignment = caps.max_alignment;
  if (library->abi_minor() >= 2) {
    // A constraint that is no power of two cannot be met: read as none.
    const auto power_of_two = [](uint64_t v) { return v != 0 && (v & (v - 1)) == 0; };
    plugin->capabilities_.copy_src_alignment =
        power_of_two(caps.copy_src_alignment) ? caps.copy_src_alignment : 0;
    plugin->capabilities_.copy_preferred_bytes = caps.copy_preferred_bytes;
    plugin->capabilities_.copy_max_bytes = caps.copy_max_bytes;
  }

  uint32_t count = 0;
  if (Status s = plugin->call_checked("get_device_count",
                                      [&](devalloc_error* e) {
                                        return api.get_device_count(plugin->instance_, &count, e);
                                      });
      !s.ok()) {
    return create_failed(s);
  }
  // A count from a broken plugin must not make the host ask 4 billion times
  // and keep every answer (found by tests/fuzz/fuzz_plugin_answers).
  if (count > kMaxPluginDevices) {
    return create_failed(Status(StatusCode::internal,
                                "plugin " + plugin->name() + ": get_device_count reported " +
                                    std::to_string(count) + " devices, more than the " +
                                    std::to_string(kMaxPluginDevices) + " a host accepts"));
  }
  plugin->devices_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    WithSlack<devalloc_device_properties> p_buffer;
    devalloc_device_properties& p = p_buffer.value;
    p.struct_size = sizeof p;
    if (Status s = plugin->call_checked("get_device_properties",
                                        [&](devalloc_error* e) {
                                          return api.get_device_properties(plugin->instance_, i,
                                                                           &p, e);
                                        });
        !s.ok()) {
      return create_failed(s);
    }
    DeviceInfo info;
    info.index = i;
    info.name = text_of(p.name, sizeof p.name);
    info.total_memory_bytes = p.total_memory_bytes;
    std::memcpy(info.uuid.data(), p.uuid, sizeof p.uuid);
    info.pci_bus_id = text_of(p.pci_bus_id, sizeof p.pci_bus_id);
    info.dlpack_device_type = p.dlpack_device_type;
    info.dlpack_device_id = p.dlpack_device_id;
    if (library->abi_minor() >= 2) info.memory_kind = text_of(p.memory_kind, sizeof p.memory_kind);
    plugin->devices_.push_back(std::move(info));
  }
  plugin->synchronizes_.resize(plugin->devices_.size());
  plugin->live_allocations_.resize(plugin->devices_.size());
  return {std::move(plugin), {PluginOutcome::loaded, Status()}};
}

Result<uint64_t> Plugin::allocate(uint32_t device, uint64_t nbytes,
                                  uint64_t alignment) {
  WithSlack<devalloc_allocate_args> args_buffer;
  devalloc_allocate_args& args = args_buffer.value;
  args.struct_size = sizeof args;
  args.device = device;
  args.nbytes = nbytes;
  args.alignment = alignment;
  Status s = call_checked(
      "allocate", [&](devalloc_error* e) { return api().allocate(instance_, &args, e); });
  if (!s.ok()) return s;
  const uint64_t base = args.address;
  if (nbytes == 0 || device >= live_allocations_.size()) return base;
  try {
    return checked_allocation(device, base, nbytes, alignment);
  } catch (const std::bad_alloc&) {
    // No host memory to word a breach or record the allocation: handed
    // back, never handed out unchecked.
    static_cast<void>(call_checked("deallocate", [&](devalloc_error* e) {
      return api().deallocate(instance_, device, base, e);
    }));
    return Status(StatusCode::out_of_host_memory, std::string());
  }
}

Result<uint64_t> Plugin::checked_allocation(uint32_t device, uint64_t base, uint64_t nbytes,
                                            uint64_t alignment) {
  // PLUGIN-11, on every call (the validation layer checks more): a tensor
  // placed from a misaligned, null or wrapping base would be silently
  // misplaced, and a host-addressable device's base is written through as
  // a pointer.
  const uint64_t need = alignment == 0 ? kNaturalAlignment : alignment;
  std::string wrong;
  if (base == 0) {
    wrong = "returned address 0";
  } else if (base % need != 0) {
    wrong = "returned address " + detail::hex_address(base) + ", not aligned to " +
            std::to_string(need);
  } else if (base > UINT64_MAX - (nbytes - 1)) {
    wrong = "returned address " + detail::hex_address(base) + ", whose " +
            std::to_string(nbytes) + " bytes run past the end of the address space";
  }
  if (!wrong.empty()) {
    // Handed back as the plugin gave it; 0 is a no-op (PLUGIN-12). When
    // that fails too, the error says so.
    const Status handed_back = call_checked("deallocate", [&](devalloc_error* e) {
      return api().deallocate(instance_, device, base, e);
    });
    return Status(StatusCode::device_error,
                  "plugin " + name() + " broke PLUGIN-11: allocate " + wrong +
                      (handed_back.ok() ? std::string()
                                        : "; handing it back failed too (" +
                                              handed_back.message() +
                                              "): the memory stays allocated until the plugin "
                                              "is destroyed"));
  }
  // PLUGIN-11/12: live allocations of a device never overlap, whoever made
  // them; overlapping ones would take each other's bytes, silently.
  std::lock_guard lock(allocations_mutex_);
  auto& live = live_allocations_[device];
  const uint64_t end = base + nbytes;  // no wrap: checked above (end 0 is 2^64)
  const auto ends_after = [](uint64_t a_end, uint64_t b) { return a_end == 0 || a_end > b; };
  auto next = live.lower_bound(base);
  auto overlapping = live.end();
  if (next != live.end() && (end == 0 || next->first < end)) {
    overlapping = next;
  } else if (next != live.begin() && ends_after(std::prev(next)->second, base)) {
    overlapping = std::prev(next);
  }
  if (overlapping != live.end()) {
    // Not handed back: this plugin could free the allocation it overlaps.
    return Status(StatusCode::device_error,
                  "plugin " + name() + " broke PLUGIN-11: allocate returned " +
                      detail::address_range(base, end) + ", which overlaps " +
                      detail::address_range(overlapping->first, overlapping->second) +
                      ", allocated earlier on device " + std::to_string(device) +
                      " and not freed; it is not handed back (that could free the other) "
                      "and stays allocated until the plugin is destroyed");
  }
  live.emplace(base, end);  // throws with nothing recorded
  return base;
}

Status Plugin::deallocate(uint32_t device, uint64_t address) {
  // Let go of first: once the plugin freed it, another thread's allocate
  // may get the same memory. Back in when the plugin refused to free it.
  std::optional<uint64_t> end;
  if (device < live_allocations_.size()) {
    std::lock_guard lock(allocations_mutex_);
    auto& live = live_allocations_[device];
    if (const auto it = live.find(address); it != live.end()) {
      end = it->second;
      live.erase(it);
    }
  }
  Status status = call_checked("deallocate", [&](devalloc_error* e) {
    return api().deallocate(instance_, device, address, e);
  });
  if (!status.ok() && end) {
    std::lock_guard lock(allocations_mutex_);
    try {
      live_allocations_[device].emplace(address, *end);
    } catch (const std::bad_alloc&) {
      // Still allocated, no longer checked against: a later allocation
      // that overlaps it goes unnoticed, no more.
    }
  }
  return status;
}

Status Plugin::copy_to_device(uint32_t device, uint64_t dst, const void* src,
                              uint64_t nbytes) {
  devalloc_copy_to_device_args args{};
  args.struct_size = sizeof args;
  args.device = device;
  args.src_lifetime = DEVALLOC_SRC_DURING_CALL;
  args.dst = dst;
  args.src = src;
  args.nbytes = nbytes;
  return call_checked("copy_host_to_device", [&](devalloc_error* e) {
    return api().copy_host_to_device(instance_, &args, e);
  });
}

Status Plugin::copy_to_device_until_released(uint32_t device, uint64_t dst,
                                             const void* src, uint64_t nbytes,
                                             devalloc_release_fn on_release,
                                             void* user_data) {
  devalloc_copy_to_device_args args{};
  args.struct_size = sizeof args;
  args.device = device;
  args.src_lifetime = DEVALLOC_SRC_UNTIL_RELEASED;
  args.dst = dst;
  args.src = src;
  args.nbytes = nbytes;
  args.on_release = on_release;
  args.user_data = user_data;
  return call_checked("copy_host_to_device", [&](devalloc_error* e) {
    return api().copy_host_to_device(instance_, &args, e);
  });
}

Status Plugin::copy_to_device_until_released(uint32_t device, uint64_t dst, const void* src,
                                             uint64_t nbytes, CopyCompletion done,
                                             const void* owner) {
  void* token = nullptr;
  try {
    token = releases_->issue(device, dst, src, nbytes, owner, std::move(done));
  } catch (const std::bad_alloc&) {
    // Not issued: the completion is still run, once, with the failure
    // (worded only if there is memory to word it).
    Status result(StatusCode::out_of_host_memory, std::string());
    try {
      result = Status(StatusCode::out_of_host_memory,
                      "plugin " + name() + ": copy_host_to_device: no host memory to account "
                                           "the copy; it was not issued");
    } catch (const std::bad_alloc&) {
    }
    CopyOutcome outcome;
    outcome.call = Status(StatusCode::out_of_host_memory, std::string());
    if (done) done(std::move(outcome));
    return result;
  }
  Status status = copy_to_device_until_released(device, dst, src, nbytes,
                                                detail::tracked_release_callback(), token);
  releases_->returned(token, status);
  return status;
}

ReleaseWait Plugin::wait_released(uint32_t device, std::chrono::milliseconds timeout,
                                  const void* owner, const std::atomic<bool>* stop) {
  return releases_->wait_owed(device, timeout, owner, stop);
}

uint64_t Plugin::release_breach_count() const { return releases_->breach_count(); }

std::vector<ReleaseBreach> Plugin::release_breaches_since(uint64_t mark) const {
  return releases_->breaches_since(mark);
}

Status Plugin::copy_to_host(uint32_t device, void* dst, uint64_t src,
                            uint64_t nbytes) {
  devalloc_copy_to_host_args args{};
  args.struct_size = sizeof args;
  args.device = device;
  args.src = src;
  args.dst = dst;
  args.nbytes = nbytes;
  return call_checked("copy_device_to_host", [&](devalloc_error* e) {
    return api().copy_device_to_host(instance_, &args, e);
  });
}

Status Plugin::synchronize(uint32_t device) {
  return detail::catch_as_status([&] { return synchronize_or_throw(device); },
                                 [&](StatusCode code, std::string_view what) {
                                   return "plugin " + name() + ": synchronize: " +
                                          detail::failure_text(code, what);
                                 });
}

Status Plugin::synchronize_or_throw(uint32_t device) {
  const auto call = [&] {
    return call_checked("synchronize",
                        [&](devalloc_error* e) { return api().synchronize(instance_, device, e); });
  };
  if (device >= synchronizes_.size()) return call();  // the plugin refuses it
  SynchronizeRecord& record = synchronizes_[device];
  // The tracked copies whose calls returned before it began: owed a
  // release once it returned (PLUGIN-20).
  const uint64_t covered = releases_->returned_calls();
  uint64_t number = 0;
  {
    std::lock_guard lock(sync_mutex_);
    // If this throws, nothing changed and the plugin is not called: a
    // synchronize that ran unrecorded could take another caller's failure
    // (PLUGIN-17) where no one would see it.
    record.running.insert(record.began);
    number = record.began++;
  }
  Status status = call();
  releases_->synchronized(device, covered);
  {
    std::lock_guard lock(sync_mutex_);
    record.running.erase(number);
    if (!status.ok()) {
      ++record.failures;
      try {
        record.last_failure = status;
      } catch (...) {
        record.last_failure = Status(status.code(), std::string());
      }
    }
  }
  sync_returned_.notify_all();
  return status;
}

uint64_t Plugin::synchronize_failures(uint32_t device) const {
  if (device >= synchronizes_.size()) return 0;
  std::lock_guard lock(sync_mutex_);
  return synchronizes_[device].failures;
}

Status Plugin::synchronize_failure_since(uint32_t device, uint64_t mark) const {
  if (device >= synchronizes_.size()) return Status();
  const SynchronizeRecord& record = synchronizes_[device];
  std::unique_lock lock(sync_mutex_);
  // A synchronize still running may be the one a failure is reported to.
  const uint64_t begun = record.began;
  sync_returned_.wait(lock, [&] {
    return record.running.empty() || *record.running.begin() >= begun;
  });
  return record.failures > mark ? record.last_failure : Status();
}

Result<std::optional<MemoryInfo>> Plugin::memory_info(uint32_t device) {
  const auto& table = api();
  if (table.struct_size < DEVALLOC_PLUGIN_API_V1_1_SIZE ||
      table.get_memory_info == nullptr) {
    return std::optional<MemoryInfo>();
  }
  MemoryInfo info;
  Status s = call_checked("get_memory_info", [&](devalloc_error* e) {
    return table.get_memory_info(instance_, device, &info.free_bytes, &info.total_bytes, e);
  });
  if (!s.ok()) return s;
  return std::optional<MemoryInfo>(info);
}

Result<void*> Plugin::map_to_host(uint32_t device, uint64_t address, uint64_t nbytes) {
  if (!capabilities_.host_mappable) {
    return Status(StatusCode::unsupported,
                  "plugin " + name() + " cannot map device memory into the host");
  }
  WithSlack<devalloc_map_args> args_buffer;
  devalloc_map_args& args = args_buffer.value;
  args.struct_size = sizeof args;
  args.device = device;
  args.address = address;
  args.nbytes = nbytes;
  Status s = call_checked("map_to_host",
                          [&](devalloc_error* e) { return api().map_to_host(instance_, &args, e); });
  if (!s.ok()) return s;
  // The host would write through it.
  if (args.host == nullptr) {
    return Status(StatusCode::internal,
                  "plugin " + name() + ": map_to_host(device " + std::to_string(device) +
                      ", nbytes " + std::to_string(nbytes) +
                      ") returned OK without memory (a null pointer), which PLUGIN-22 forbids");
  }
  return args.host;
}

Status Plugin::unmap_from_host(uint32_t device, void* host) {
  if (!capabilities_.host_mappable) {
    return Status(StatusCode::unsupported,
                  "plugin " + name() + " cannot map device memory into the host");
  }
  return call_checked("unmap_from_host", [&](devalloc_error* e) {
    return api().unmap_from_host(instance_, device, host, e);
  });
}

Result<void*> Plugin::allocate_host(uint64_t nbytes) {
  if (!capabilities_.host_staging) {
    return Status(StatusCode::unsupported,
                  "plugin " + name() + " has no host staging memory");
  }
  void* host = nullptr;
  Status s = call_checked("allocate_host", [&](devalloc_error* e) {
    return api().allocate_host(instance_, nbytes, &host, e);
  });
  if (!s.ok()) return s;
  // Only 0 bytes give NULL (plugin_abi.h); the host would write through it.
  if (host == nullptr && nbytes != 0) {
    return Status(StatusCode::internal,
                  "plugin " + name() + ": allocate_host(nbytes " + std::to_string(nbytes) +
                      ") returned OK without memory (a null pointer)");
  }
  if (host == nullptr) return host;
  std::string overlaps;
  try {
    overlaps = detail::hold_staging(host, nbytes, this);
  } catch (const std::bad_alloc&) {
    // Unrecorded, it would escape the PLUGIN-18 check: handed back.
    static_cast<void>(free_host_unheld(host));
    return Status(StatusCode::out_of_host_memory, std::string());
  }
  if (!overlaps.empty()) {
    // Not handed back: freeing it could free the buffer it overlaps, which
    // a copy may still read. The plugin frees it at destroy (PLUGIN-9).
    const auto at = reinterpret_cast<uintptr_t>(host);
    return Status(StatusCode::internal,
                  "plugin " + name() + " broke PLUGIN-18: allocate_host(nbytes " +
                      std::to_string(nbytes) + ") returned " +
                      detail::address_range(at, at + nbytes) +
                      ", which overlaps staging memory still in use: " + overlaps +
                      " earlier and the host has not freed; a copy would read one "
                      "buffer's bytes over another's");
  }
  return host;
}

Status Plugin::free_host(void* host) {
  if (!capabilities_.host_staging) {
    return Status(StatusCode::unsupported,
                  "plugin " + name() + " has no host staging memory");
  }
  // Let go of first: the plugin may hand the buffer out again as soon as
  // free_host freed it, to another caller.
  detail::let_go_of_staging(host);
  return free_host_unheld(host);
}

Status Plugin::free_host_unheld(void* host) {
  return call_checked("free_host",
                      [&](devalloc_error* e) { return api().free_host(instance_, host, e); });
}

}  // namespace devalloc
