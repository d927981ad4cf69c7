#include "plugin_layer.hpp"

#include "capability_flags.hpp"
#include "guarded_call.hpp"

#include <devalloc/status.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <unordered_map>

namespace devalloc {

namespace {

std::mutex g_log_mutex;
std::vector<ValidationBreach> g_log;

// Set while the host's on_release runs on this thread: a call into the
// plugin from there breaks PLUGIN-14.
thread_local bool t_in_release = false;

// The tickets of every live layer, by token, and the live layers: an
// on_release looks its user_data up here before following it, so a made-up
// one, or one of a destroyed layer, is a breach and not a crash. Taken
// before a layer's mutex or after it is let go, never while it is held.
std::mutex g_tickets_mutex;
std::unordered_map<const void*, PluginLayer*>& ticket_owners() {
  static auto* owners = new std::unordered_map<const void*, PluginLayer*>();
  return *owners;
}
// The user_data a plugin gets for an until-released copy: a token, never a
// pointer, unique in the process and never used again. Tokens are
// 64 apart in the upper half of the address space, where no user-space
// pointer lies (x86-64, AArch64), so neither a pointer from elsewhere nor a
// token off by a few bytes is taken for one.
std::atomic<uint64_t> g_last_token{0};
const void* next_token() {
  constexpr uint64_t kTokenBase = 0xda1a000000000000ull;
  return reinterpret_cast<const void*>(
      static_cast<uintptr_t>(kTokenBase + (g_last_token.fetch_add(1) + 1) * 64));
}

std::vector<PluginLayer*>& live_layers() {
  static auto* layers = new std::vector<PluginLayer*>();
  return *layers;
}

std::string printed(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string printed(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  return text;
}

// 64-bit FNV-1a: the source check only needs to see a change.
uint64_t hash_of(const void* data, uint64_t nbytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < nbytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

bool known_status(devalloc_status s) {
  return s >= DEVALLOC_STATUS_OK && s <= DEVALLOC_STATUS_INTERNAL;
}

const char* status_name(devalloc_status s) {
  return known_status(s) ? to_string(status_code_from_abi(s)) : "an unknown status";
}

bool known_dlpack_type(int32_t type) {
  // DLPack 1.x device types.
  switch (type) {
    case 1: case 2: case 3: case 4: case 7: case 8: case 9: case 10: case 11:
    case 12: case 13: case 14: case 15: case 16: case 17: case 18:
      return true;
    default:
      return false;
  }
}

constexpr size_t kErrorTextOffset = offsetof(devalloc_error, message);
constexpr unsigned char kUntouched = 0x5a;
constexpr size_t kCanaryBytes = 64;
constexpr unsigned char kCanary = 0xa5;
// Larger claimed sizes are passed on unguarded (no struct of the ABI is
// anywhere near this; a caller that claims more is lying, not the plugin).
constexpr size_t kLargestGuardedStruct = 64 * 1024;

// A copy of a caller's struct of `struct_size` bytes followed by canary
// bytes: a plugin that writes past struct_size (PLUGIN-4) changes them.
class Guarded {
 public:
  Guarded(const void* original, size_t struct_size)
      : size_(struct_size), words_((struct_size + kCanaryBytes + 7) / 8) {
    std::memset(words_.data(), kCanary, words_.size() * 8);
    std::memcpy(words_.data(), original, struct_size);
  }
  template <class T>
  T* as() { return reinterpret_cast<T*>(words_.data()); }
  bool canary_intact() const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(words_.data());
    for (size_t i = size_; i < size_ + kCanaryBytes; ++i) {
      if (bytes[i] != kCanary) return false;
    }
    return true;
  }
  void copy_to(void* original) const { std::memcpy(original, words_.data(), size_); }

 private:
  size_t size_;
  std::vector<uint64_t> words_;
};

// A NUL-terminated field of a struct the plugin filled.
bool terminated(const char* chars, size_t capacity) {
  return std::memchr(chars, '\0', capacity) != nullptr;
}

}  // namespace

std::string ValidationBreach::text() const {
  return rule + ": " + plugin + ": " + call + ": " + detail;
}

std::vector<ValidationBreach> validation_breaches() {
  std::lock_guard lock(g_log_mutex);
  return g_log;
}

void clear_validation_breaches() {
  std::lock_guard lock(g_log_mutex);
  g_log.clear();
}

LayerSettings LayerSettings::with_environment() const {
  LayerSettings s = *this;
  const char* env = secure_getenv("DEVALLOC_VALIDATE");
  if (env == nullptr) return s;
  const std::string_view value(env);
  if (value.empty() || value == "0" || value == "false") return s;
  s.validate = true;
  if (value == "sources") s.check_sources = true;
  return s;
}

struct PluginLayer::Ticket {
  uint64_t id = 0;
  uint32_t device = 0;
  std::string call;
  const void* src = nullptr;
  uint64_t nbytes = 0;
  uint64_t source_hash = 0;
  devalloc_release_fn release = nullptr;
  void* user_data = nullptr;
  int releases = 0;  // under the layer's mutex
  // Set (under the mutex) when the plugin's copy call returned: only then
  // must a later synchronize cover the copy. One in flight on another
  // thread when synchronize starts is concurrent with it, not before it.
  bool issued = false;
  // Set (under the mutex) when a synchronize reported this copy's release
  // missing (PLUGIN-20): a later synchronize still fails for it, but does
  // not print or log the same breach again.
  bool missing_reported = false;
};

struct PluginLayer::Call {
  Call(std::string what, devalloc_error* caller) : text(std::move(what)), caller_error(caller) {
    mine.struct_size = sizeof mine;
    std::memset(mine.message, kUntouched, sizeof mine.message);
  }
  std::string text;
  devalloc_error* caller_error;
  devalloc_error mine{};
  devalloc_status status = DEVALLOC_STATUS_OK;
};

PluginLayer::PluginLayer(const devalloc_plugin_api_v1& real, devalloc_instance* real_instance,
                         uint32_t abi_minor, std::string plugin, LayerSettings settings)
    : real_(real),
      real_instance_(real_instance),
      known_flags_(detail::capability_flags_of_minor(abi_minor)),
      plugin_(std::move(plugin)),
      settings_(settings) {
  table_.struct_size = sizeof table_;
  table_.abi_major = real.abi_major;
  table_.abi_minor = real.abi_minor;
  table_.plugin_name = real.plugin_name;
  table_.plugin_version = real.plugin_version;
  table_.create = real.create;
  table_.destroy = &PluginLayer::destroy;
  table_.get_capabilities = &PluginLayer::get_capabilities;
  table_.get_device_count = &PluginLayer::get_device_count;
  table_.get_device_properties = &PluginLayer::get_device_properties;
  table_.allocate = &PluginLayer::allocate;
  table_.deallocate = &PluginLayer::deallocate;
  table_.copy_host_to_device = &PluginLayer::copy_host_to_device;
  table_.copy_device_to_host = &PluginLayer::copy_device_to_host;
  table_.synchronize = &PluginLayer::synchronize;
  has_host_staging_ =
      real.struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_plugin_api_v1, free_host) &&
      real.allocate_host != nullptr && real.free_host != nullptr;
  if (has_host_staging_) {
    table_.allocate_host = &PluginLayer::allocate_host;
    table_.free_host = &PluginLayer::free_host;
  }
  // ABI 1.1: forwarded only when the plugin's table has it, so that the
  // layer never offers what the plugin does not.
  has_memory_info_ =
      real.struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_plugin_api_v1, get_memory_info) &&
      real.get_memory_info != nullptr;
  if (has_memory_info_) table_.get_memory_info = &PluginLayer::get_memory_info;
  std::lock_guard owners(g_tickets_mutex);
  live_layers().push_back(this);
}

PluginLayer* PluginLayer::wrap(const devalloc_plugin_api_v1& real,
                               devalloc_instance* real_instance, uint32_t abi_minor,
                               std::string plugin, LayerSettings settings) {
  // The device count bounds the device checks; a plugin that cannot say
  // (or throws, PLUGIN-7: guarded, so that nothing leaves here with the
  // layer half made) fails Plugin::create through the layer anyway.
  devalloc_error error{};
  error.struct_size = sizeof error;
  uint32_t count = 0;
  const bool counted =
      detail::guarded_call("get_device_count", &error, [&] {
        return real.get_device_count(real_instance, &count, &error);
      }) == DEVALLOC_STATUS_OK;
  auto* layer = new PluginLayer(real, real_instance, abi_minor, std::move(plugin), settings);
  if (counted) layer->device_count_ = count;
  return layer;
}

LayerCounters PluginLayer::counters() const {
  std::lock_guard lock(mutex_);
  LayerCounters c;
  c.calls = calls_;
  c.faults_injected = faults_injected_;
  for (const auto& [device, allocations] : allocations_) c.live_allocations += allocations.size();
  c.live_bytes = live_bytes_;
  c.pending_releases = pending_.size();
  c.breaches = breaches_;
  c.remembered_copies = tickets_.size();
  return c;
}

std::string PluginLayer::breach(const char* rule, const std::string& call,
                                const std::string& detail) {
  ValidationBreach b{rule, plugin_, call, detail};
  ++breaches_;
  std::fprintf(stderr, "devalloc validation: %s\n", b.text().c_str());
  std::lock_guard lock(g_log_mutex);
  g_log.push_back(std::move(b));
  // The caller's status already names the plugin.
  return std::string(rule) + ": " + call + ": " + detail;
}

bool PluginLayer::count_call() {
  ++calls_;
  if (settings_.faults.fail_call != 0 && calls_ == settings_.faults.fail_call) {
    ++faults_injected_;
    return true;
  }
  return false;
}

bool PluginLayer::inside_allocation(uint32_t device, uint64_t address, uint64_t nbytes) const {
  auto d = allocations_.find(device);
  if (d == allocations_.end()) return false;
  auto it = d->second.upper_bound(address);
  if (it == d->second.begin()) return false;
  --it;
  const uint64_t offset = address - it->first;
  return offset < it->second && nbytes <= it->second - offset;
}

devalloc_status PluginLayer::fail(Call& call, devalloc_status status,
                                  const std::string& message) {
  call.status = status;
  devalloc_error* e = call.caller_error;
  if (e != nullptr && e->struct_size > kErrorTextOffset) {
    const size_t capacity =
        std::min(e->struct_size - kErrorTextOffset, sizeof e->message);
    const size_t n = std::min(message.size(), capacity - 1);
    std::memcpy(e->message, message.data(), n);
    e->message[n] = '\0';
  }
  return status;
}

devalloc_status PluginLayer::fail_breach(Call& call, const char* rule,
                                         const std::string& detail) {
  if (!settings_.validate) return call.status;
  return fail(call, DEVALLOC_STATUS_INTERNAL,
              "validation: " + breach(rule, call.text, detail));
}

devalloc_status PluginLayer::finish(Call& call) {
  if (!settings_.validate) {
    if (call.status != DEVALLOC_STATUS_OK) {
      const char* text = call.mine.message;
      fail(call, call.status,
           terminated(text, sizeof call.mine.message) ? std::string(text) : std::string());
    }
    return call.status;
  }
  if (!known_status(call.status)) {
    return fail(call, DEVALLOC_STATUS_INTERNAL,
                "validation: " + breach("PLUGIN-5", call.text,
                                        "returned status " + std::to_string(call.status) +
                                            ", which the ABI does not define"));
  }
  const char* text = call.mine.message;
  bool untouched = true;
  for (unsigned char c : call.mine.message) untouched = untouched && c == kUntouched;
  if (call.status == DEVALLOC_STATUS_OK) {
    if (!untouched) {
      return fail_breach(call, "PLUGIN-6", "wrote an error message although it succeeded");
    }
    return call.status;
  }
  if (untouched || text[0] == '\0') {
    return fail(call, call.status,
                "validation: " + breach("PLUGIN-6", call.text,
                                        std::string("failed with ") + status_name(call.status) +
                                            " and gave no message"));
  }
  if (!terminated(text, sizeof call.mine.message)) {
    return fail(call, call.status,
                "validation: " + breach("PLUGIN-6", call.text,
                                        std::string("failed with ") + status_name(call.status) +
                                            " and left its message unterminated"));
  }
  return fail(call, call.status, text);
}

bool PluginLayer::take_owed(uint32_t device, std::string* text) {
  auto it = owed_.find(device);
  if (it == owed_.end() || it->second.empty()) return false;
  // Every breach found since the last synchronize, in the order found.
  *text = it->second.front();
  for (size_t i = 1; i < it->second.size(); ++i) *text += "; then " + it->second[i];
  owed_.erase(it);
  return true;
}

// ---------------------------------------------------------------------------

#define DEVALLOC_LAYER_ENTRY(call)                                                       \
  if (instance == nullptr) {                                                             \
    return fail(call, DEVALLOC_STATUS_INVALID_ARGUMENT, call.text + ": NULL instance");   \
  }                                                                                      \
  PluginLayer& layer = *self(instance);                                                  \
  if (t_in_release && layer.settings_.validate) {                                        \
    return layer.fail(call, DEVALLOC_STATUS_INTERNAL,                                    \
                      "validation: " +                                                   \
                          layer.breach("PLUGIN-14", call.text,                           \
                                       "called from inside an on_release; a release "    \
                                       "must not call into the plugin"));                \
  }

void PluginLayer::destroy(devalloc_instance* instance) {
  PluginLayer* layer = self(instance);
  // An exception out of the plugin's destroy (PLUGIN-7) is dropped, as
  // Plugin drops it without a layer, but only once the layer has ended:
  // left among the live layers, it would take a share of every later stray
  // release (logged under its plugin's name, owed to no live plugin), its
  // tickets would stay followable and its memory would leak.
  detail::guarded_call("destroy", nullptr, [&] {
    layer->real_.destroy(layer->real_instance_);
    return DEVALLOC_STATUS_OK;
  });
  {
    // Releases after destroy are strays from here on.
    std::lock_guard owners(g_tickets_mutex);
    for (const auto& [token, ticket] : layer->tickets_) ticket_owners().erase(token);
    auto& layers = live_layers();
    layers.erase(std::remove(layers.begin(), layers.end(), layer), layers.end());
  }
  {
    std::lock_guard lock(layer->mutex_);
    if (layer->settings_.validate && !layer->pending_.empty()) {
      const Ticket& first = *layer->pending_.begin()->second;
      layer->breach("PLUGIN-9", "destroy()",
                    std::to_string(layer->pending_.size()) +
                        " until-released copies were never released (first: " + first.call +
                        "); destroy must call every pending on_release");
    }
  }
  delete layer;
}

devalloc_status PluginLayer::get_capabilities(devalloc_instance* instance,
                                              devalloc_capabilities* capabilities,
                                              devalloc_error* error) {
  Call call("get_capabilities()", error);
  DEVALLOC_LAYER_ENTRY(call)
  if (capabilities == nullptr || capabilities->struct_size < sizeof(size_t) ||
      capabilities->struct_size > kLargestGuardedStruct) {
    call.status = layer.real_.get_capabilities(layer.real_instance_, capabilities, &call.mine);
    layer.finish(call);
    if (call.status == DEVALLOC_STATUS_OK &&
        (capabilities == nullptr || capabilities->struct_size < sizeof(size_t))) {
      return layer.fail_breach(call, "PLUGIN-4", "accepted a NULL or size-less struct");
    }
    if (call.status == DEVALLOC_STATUS_OK) capabilities->flags &= layer.known_flags_;
    return call.status;
  }
  Guarded guarded(capabilities, capabilities->struct_size);
  call.status = layer.real_.get_capabilities(layer.real_instance_,
                                             guarded.as<devalloc_capabilities>(), &call.mine);
  if (!guarded.canary_intact()) {
    return layer.fail_breach(call, "PLUGIN-4",
                             "wrote past the struct_size of " +
                                 std::to_string(capabilities->struct_size) + " bytes it was given");
  }
  guarded.copy_to(capabilities);
  // Flags beyond the negotiated minor are ignored (docs/abi.md): the caller
  // sees what Plugin::create keeps.
  if (call.status == DEVALLOC_STATUS_OK &&
      capabilities->struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_capabilities, flags)) {
    capabilities->flags &= layer.known_flags_;
  }
  return layer.finish(call);
}

devalloc_status PluginLayer::get_device_count(devalloc_instance* instance, uint32_t* count,
                                              devalloc_error* error) {
  Call call("get_device_count()", error);
  DEVALLOC_LAYER_ENTRY(call)
  call.status = layer.real_.get_device_count(layer.real_instance_, count, &call.mine);
  layer.finish(call);
  if (call.status == DEVALLOC_STATUS_OK && count == nullptr) {
    return layer.fail_breach(call, "PLUGIN-10", "accepted a NULL count");
  }
  if (call.status == DEVALLOC_STATUS_OK && *count != layer.device_count_) {
    return layer.fail_breach(call, "PLUGIN-10",
                             "said " + std::to_string(*count) + " devices, earlier " +
                                 std::to_string(layer.device_count_));
  }
  return call.status;
}

devalloc_status PluginLayer::get_device_properties(devalloc_instance* instance, uint32_t device,
                                                   devalloc_device_properties* properties,
                                                   devalloc_error* error) {
  Call call(printed("get_device_properties(device %" PRIu32 ")", device), error);
  DEVALLOC_LAYER_ENTRY(call)
  if (properties == nullptr || properties->struct_size < sizeof(size_t) ||
      properties->struct_size > kLargestGuardedStruct) {
    call.status = layer.real_.get_device_properties(layer.real_instance_, device, properties,
                                                    &call.mine);
    layer.finish(call);
    if (call.status == DEVALLOC_STATUS_OK &&
        (properties == nullptr || properties->struct_size < sizeof(size_t))) {
      return layer.fail_breach(call, "PLUGIN-4", "accepted a NULL or size-less struct");
    }
    return call.status;
  }
  const size_t size = properties->struct_size;
  Guarded guarded(properties, size);
  auto* p = guarded.as<devalloc_device_properties>();
  call.status = layer.real_.get_device_properties(layer.real_instance_, device, p, &call.mine);
  if (!guarded.canary_intact()) {
    return layer.fail_breach(call, "PLUGIN-4",
                             "wrote past the struct_size of " + std::to_string(size) +
                                 " bytes it was given");
  }
  guarded.copy_to(properties);
  layer.finish(call);
  if (call.status != DEVALLOC_STATUS_OK) {
    if (!layer.device_exists(device) && call.status != DEVALLOC_STATUS_NO_SUCH_DEVICE) {
      return layer.fail_breach(call, "PLUGIN-10",
                               std::string("answered ") + status_name(call.status) +
                                   " for a device index at or above the count, not "
                                   "NO_SUCH_DEVICE");
    }
    return call.status;
  }
  if (!layer.device_exists(device)) {
    return layer.fail_breach(call, "PLUGIN-10",
                             "succeeded for a device index at or above the count of " +
                                 std::to_string(layer.device_count_));
  }
  if (size >= DEVALLOC_STRUCT_SIZE(devalloc_device_properties, name) &&
      !terminated(p->name, sizeof p->name)) {
    return layer.fail_breach(call, "PLUGIN-10", "the device name is not NUL-terminated");
  }
  if (size >= DEVALLOC_STRUCT_SIZE(devalloc_device_properties, pci_bus_id) &&
      !terminated(p->pci_bus_id, sizeof p->pci_bus_id)) {
    return layer.fail_breach(call, "PLUGIN-10", "the PCI bus id is not NUL-terminated");
  }
  if (size >= DEVALLOC_STRUCT_SIZE(devalloc_device_properties, dlpack_device_type) &&
      !known_dlpack_type(p->dlpack_device_type)) {
    return layer.fail_breach(call, "PLUGIN-10",
                             "DLPack device type " + std::to_string(p->dlpack_device_type) +
                                 " is no DLPack 1.x code");
  }
  return call.status;
}

devalloc_status PluginLayer::allocate(devalloc_instance* instance, devalloc_allocate_args* args,
                                      devalloc_error* error) {
  Call call(args == nullptr
                ? std::string("allocate(NULL)")
                : printed("allocate(device %" PRIu32 ", nbytes %" PRIu64 ", alignment %" PRIu64 ")",
                          args->device, args->nbytes, args->alignment),
            error);
  DEVALLOC_LAYER_ENTRY(call)
  if (args == nullptr) {
    call.status = layer.real_.allocate(layer.real_instance_, args, &call.mine);
    layer.finish(call);
    if (call.status == DEVALLOC_STATUS_OK) {
      return layer.fail_breach(call, "PLUGIN-11", "accepted NULL arguments");
    }
    return call.status;
  }
  {
    std::lock_guard lock(layer.mutex_);
    if (layer.count_call()) {
      return layer.fail(call, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                        printed("fault injection: %s is call #%" PRIu64 " and fails",
                                call.text.c_str(), layer.calls_));
    }
    const uint64_t budget = layer.settings_.faults.device_bytes;
    if (budget != 0 && args->nbytes > budget - std::min(budget, layer.live_bytes_)) {
      ++layer.faults_injected_;
      return layer.fail(call, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                        printed("fault injection: %s exceeds the device memory budget of %" PRIu64
                                " bytes (%" PRIu64 " live)",
                                call.text.c_str(), budget, layer.live_bytes_));
    }
  }
  call.status = layer.real_.allocate(layer.real_instance_, args, &call.mine);
  layer.finish(call);
  if (call.status != DEVALLOC_STATUS_OK) return call.status;

  const uint64_t nbytes = args->nbytes;
  const uint64_t address = args->address;
  const uint64_t alignment = args->alignment == 0 ? 256 : args->alignment;
  std::string wrong;
  std::unique_lock lock(layer.mutex_);
  if (!layer.device_exists(args->device)) {
    wrong = "succeeded for a device index at or above the count";
  } else if ((args->alignment & (args->alignment - 1)) != 0) {
    wrong = "accepted an alignment that is not a power of two";
  } else if (nbytes == 0 && address != 0) {
    wrong = printed("returned address 0x%" PRIx64 " for 0 bytes; it must be 0", address);
  } else if (nbytes != 0 && address == 0) {
    wrong = "returned address 0 for a non-zero size";
  } else if (nbytes != 0 && address % alignment != 0) {
    wrong = printed("returned address 0x%" PRIx64 ", not aligned to %" PRIu64, address, alignment);
  } else if (nbytes != 0 && nbytes - 1 > UINT64_MAX - address) {
    // A range may end exactly at 2^64 (its last byte is 2^64 - 1), not past it.
    wrong = printed("returned address 0x%" PRIx64 ", whose %" PRIu64
                    " bytes run past the end of the address space",
                    address, nbytes);
  } else if (nbytes != 0) {
    auto& live = layer.allocations_[args->device];
    auto next = live.lower_bound(address);
    const bool overlaps_next = next != live.end() && next->first - address < nbytes;
    const bool overlaps_prev =
        next != live.begin() && address - std::prev(next)->first < std::prev(next)->second;
    if (overlaps_next || overlaps_prev) {
      wrong = printed("returned [0x%" PRIx64 ", +%" PRIu64 "), which overlaps a live allocation",
                      address, nbytes);
    } else {
      live.emplace(address, nbytes);
      layer.live_bytes_ += nbytes;
    }
  }
  lock.unlock();
  if (wrong.empty() || !layer.settings_.validate) return call.status;
  if (nbytes != 0 && address != 0 && layer.device_exists(args->device)) {
    devalloc_error ignored{};
    ignored.struct_size = sizeof ignored;
    layer.real_.deallocate(layer.real_instance_, args->device, address, &ignored);
  }
  args->address = 0;
  return layer.fail_breach(call, "PLUGIN-11", wrong);
}

devalloc_status PluginLayer::deallocate(devalloc_instance* instance, uint32_t device,
                                        devalloc_device_address address, devalloc_error* error) {
  Call call(printed("deallocate(device %" PRIu32 ", address 0x%" PRIx64 ")", device, address),
            error);
  DEVALLOC_LAYER_ENTRY(call)
  bool known = false;
  {
    std::lock_guard lock(layer.mutex_);
    auto d = layer.allocations_.find(device);
    known = d != layer.allocations_.end() && d->second.count(address) != 0;
  }
  call.status = layer.real_.deallocate(layer.real_instance_, device, address, &call.mine);
  layer.finish(call);
  if (call.status != DEVALLOC_STATUS_OK || address == 0) return call.status;
  if (!known) {
    return layer.fail_breach(call, "PLUGIN-12",
                             "accepted an address that allocate did not return on this device "
                             "or that was freed already");
  }
  std::lock_guard lock(layer.mutex_);
  auto& live = layer.allocations_[device];
  auto it = live.find(address);
  if (it != live.end()) {
    layer.live_bytes_ -= it->second;
    live.erase(it);
  }
  return call.status;
}

devalloc_status PluginLayer::copy_host_to_device(devalloc_instance* instance,
                                                 const devalloc_copy_to_device_args* args,
                                                 devalloc_error* error) {
  Call call(args == nullptr
                ? std::string("copy_host_to_device(NULL)")
                : printed("copy_host_to_device(device %" PRIu32 ", dst 0x%" PRIx64
                          ", src %p, nbytes %" PRIu64 ", %s)",
                          args->device, args->dst, args->src, args->nbytes,
                          args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED ? "until released"
                                                                           : "during call"),
            error);
  DEVALLOC_LAYER_ENTRY(call)
  if (args == nullptr) {
    call.status = layer.real_.copy_host_to_device(layer.real_instance_, args, &call.mine);
    layer.finish(call);
    if (call.status == DEVALLOC_STATUS_OK) {
      return layer.fail_breach(call, "PLUGIN-15", "accepted NULL arguments");
    }
    return call.status;
  }
  const bool releases =
      args->src_lifetime == DEVALLOC_SRC_UNTIL_RELEASED && args->on_release != nullptr;
  const uint64_t source_hash = layer.settings_.check_sources && releases && args->src != nullptr
                                   ? hash_of(args->src, args->nbytes)
                                   : 0;
  devalloc_copy_to_device_args forwarded = *args;
  bool valid = true;
  {
    std::unique_lock lock(layer.mutex_);
    valid = args->nbytes == 0 ||
            (args->src != nullptr && layer.device_exists(args->device) &&
             layer.inside_allocation(args->device, args->dst, args->nbytes) &&
             args->src_lifetime <= DEVALLOC_SRC_UNTIL_RELEASED);
    if (layer.count_call()) {
      const std::string message = printed("fault injection: %s is call #%" PRIu64 " and fails",
                                          call.text.c_str(), layer.calls_);
      lock.unlock();
      if (releases) {
        t_in_release = true;
        args->on_release(args->user_data);
        t_in_release = false;
      }
      return layer.fail(call, DEVALLOC_STATUS_DEVICE_ERROR, message);
    }
    if (releases) {
      const void* token = next_token();
      Ticket& t = layer.tickets_[token];
      t.id = ++layer.last_id_;
      t.device = args->device;
      t.call = call.text;
      t.src = args->src;
      t.nbytes = args->nbytes;
      t.source_hash = source_hash;
      t.release = args->on_release;
      t.user_data = args->user_data;
      layer.pending_.emplace(t.id, &t);
      forwarded.on_release = &PluginLayer::on_release;
      forwarded.user_data = const_cast<void*>(token);
    }
  }
  if (releases) {
    std::lock_guard owners(g_tickets_mutex);
    ticket_owners().emplace(forwarded.user_data, &layer);
  }
  call.status = layer.real_.copy_host_to_device(layer.real_instance_, &forwarded, &call.mine);
  if (releases) {
    // Released during the call and forgotten since (kLayerReleasedKept
    // later releases): nothing to mark.
    std::lock_guard lock(layer.mutex_);
    const auto it = layer.tickets_.find(forwarded.user_data);
    if (it != layer.tickets_.end()) it->second.issued = true;
  }
  layer.finish(call);
  if (call.status == DEVALLOC_STATUS_OK && !valid) {
    return layer.fail_breach(call, "PLUGIN-15",
                             "accepted a copy outside every live allocation of the device "
                             "(or with a NULL source or an unknown source lifetime)");
  }
  return call.status;
}

devalloc_status PluginLayer::copy_device_to_host(devalloc_instance* instance,
                                                 const devalloc_copy_to_host_args* args,
                                                 devalloc_error* error) {
  Call call(args == nullptr
                ? std::string("copy_device_to_host(NULL)")
                : printed("copy_device_to_host(device %" PRIu32 ", src 0x%" PRIx64
                          ", dst %p, nbytes %" PRIu64 ")",
                          args->device, args->src, args->dst, args->nbytes),
            error);
  DEVALLOC_LAYER_ENTRY(call)
  bool valid = true;
  if (args != nullptr) {
    std::lock_guard lock(layer.mutex_);
    valid = args->nbytes == 0 ||
            (args->dst != nullptr && layer.device_exists(args->device) &&
             layer.inside_allocation(args->device, args->src, args->nbytes));
    if (layer.count_call()) {
      return layer.fail(call, DEVALLOC_STATUS_DEVICE_ERROR,
                        printed("fault injection: %s is call #%" PRIu64 " and fails",
                                call.text.c_str(), layer.calls_));
    }
  }
  call.status = layer.real_.copy_device_to_host(layer.real_instance_, args, &call.mine);
  layer.finish(call);
  if (call.status == DEVALLOC_STATUS_OK && (args == nullptr || !valid)) {
    return layer.fail_breach(call, "PLUGIN-15",
                             "accepted a copy outside every live allocation of the device "
                             "(or NULL arguments)");
  }
  return call.status;
}

devalloc_status PluginLayer::synchronize(devalloc_instance* instance, uint32_t device,
                                         devalloc_error* error) {
  Call call(printed("synchronize(device %" PRIu32 ")", device), error);
  DEVALLOC_LAYER_ENTRY(call)
  bool fail_now = false;
  uint64_t fault_call = 0;
  std::vector<uint64_t> before;  // copies issued before the call, not released yet
  {
    std::lock_guard lock(layer.mutex_);
    fail_now = layer.count_call();
    fault_call = layer.calls_;
    for (const auto& [id, ticket] : layer.pending_) {
      if (ticket->device == device && ticket->issued) before.push_back(id);
    }
  }
  call.status = layer.real_.synchronize(layer.real_instance_, device, &call.mine);
  layer.finish(call);

  std::string owed;
  std::string missing;       // the first copy still unreleased
  std::string newly_missing; // the first one no synchronize reported before
  size_t missing_count = 0;
  size_t newly_missing_count = 0;
  bool failed_async = false;
  {
    std::lock_guard lock(layer.mutex_);
    for (uint64_t id : before) {
      auto it = layer.pending_.find(id);
      if (it == layer.pending_.end()) continue;
      Ticket& ticket = *it->second;
      if (missing_count++ == 0) missing = ticket.call;
      if (!ticket.missing_reported) {
        if (newly_missing_count++ == 0) newly_missing = ticket.call;
        ticket.missing_reported = true;
      }
    }
    layer.take_owed(device, &owed);
    failed_async = layer.failed_devices_.erase(device) != 0;
  }
  if (layer.settings_.validate && call.status == DEVALLOC_STATUS_OK &&
      !layer.device_exists(device)) {
    return layer.fail_breach(call, "PLUGIN-10",
                             "succeeded for a device index at or above the count");
  }
  // The breaches seen in callbacks since the last synchronize were taken
  // above and are this call's to report, before a missing release found
  // now (in the order found): a stray release, say, is often why a copy's
  // own release never came.
  const auto after_owed = [&](const std::string& text) {
    return "validation: " + (owed.empty() ? text : owed + "; then " + text);
  };
  // Each copy's missing release is one breach, printed and logged by the
  // first synchronize that finds it; every synchronize that returns without
  // the release still fails.
  if (newly_missing_count != 0 && layer.settings_.validate) {
    const size_t earlier = missing_count - newly_missing_count;
    return layer.fail(
        call, DEVALLOC_STATUS_INTERNAL,
        after_owed(layer.breach(
            "PLUGIN-20", call.text,
            "returned while " + std::to_string(newly_missing_count) +
                " copies issued before it were not released (first: " + newly_missing + ")" +
                (earlier == 0 ? std::string()
                              : "; " + std::to_string(earlier) +
                                    " more were reported by an earlier synchronize"))));
  }
  if (missing_count != 0 && layer.settings_.validate) {
    return layer.fail(call, DEVALLOC_STATUS_INTERNAL,
                      after_owed("PLUGIN-20: " + call.text + ": returned while " +
                                 std::to_string(missing_count) +
                                 " copies issued before it were not released, as an earlier "
                                 "synchronize reported (first: " +
                                 missing + ")"));
  }
  if (!owed.empty() && layer.settings_.validate) {
    return layer.fail(call, DEVALLOC_STATUS_INTERNAL, "validation: " + owed);
  }
  if (call.status != DEVALLOC_STATUS_OK) return call.status;
  if (failed_async) {
    return layer.fail(call, DEVALLOC_STATUS_DEVICE_ERROR,
                      printed("fault injection: a copy to device %" PRIu32
                              " failed asynchronously (its release was the failing call)",
                              device));
  }
  if (fail_now) {
    return layer.fail(call, DEVALLOC_STATUS_DEVICE_ERROR,
                      printed("fault injection: %s is call #%" PRIu64 " and fails",
                              call.text.c_str(), fault_call));
  }
  return call.status;
}

devalloc_status PluginLayer::allocate_host(devalloc_instance* instance, uint64_t nbytes,
                                           void** host, devalloc_error* error) {
  Call call(printed("allocate_host(nbytes %" PRIu64 ")", nbytes), error);
  DEVALLOC_LAYER_ENTRY(call)
  call.status = layer.real_.allocate_host(layer.real_instance_, nbytes, host, &call.mine);
  return layer.finish(call);
}

devalloc_status PluginLayer::free_host(devalloc_instance* instance, void* host,
                                       devalloc_error* error) {
  Call call(printed("free_host(%p)", host), error);
  DEVALLOC_LAYER_ENTRY(call)
  call.status = layer.real_.free_host(layer.real_instance_, host, &call.mine);
  return layer.finish(call);
}

devalloc_status PluginLayer::get_memory_info(devalloc_instance* instance, uint32_t device,
                                             uint64_t* free_bytes, uint64_t* total_bytes,
                                             devalloc_error* error) {
  Call call(printed("get_memory_info(device %" PRIu32 ")", device), error);
  DEVALLOC_LAYER_ENTRY(call)
  call.status = layer.real_.get_memory_info(layer.real_instance_, device, free_bytes,
                                            total_bytes, &call.mine);
  layer.finish(call);
  if (call.status != DEVALLOC_STATUS_OK || !layer.settings_.validate) return call.status;
  if (!layer.device_exists(device)) {
    return layer.fail_breach(call, "PLUGIN-10",
                             "answered OK for a device at or above the count of " +
                                 std::to_string(layer.device_count_));
  }
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return layer.fail_breach(call, "PLUGIN-10", "accepted a NULL output");
  }
  if (*free_bytes > *total_bytes) {
    return layer.fail_breach(call, "PLUGIN-10",
                             "said " + std::to_string(*free_bytes) + " bytes free of " +
                                 std::to_string(*total_bytes) + " in total");
  }
  return call.status;
}

void PluginLayer::on_release(void* user_data) {
  // What the release needs of its ticket, copied under the locks: the ticket
  // may be forgotten once they are let go. Its text only for the source
  // check, the one use after the locks: nothing else here allocates, and
  // the caller's release fires whatever the host's memory.
  struct Released {
    uint32_t device = 0;
    const void* src = nullptr;
    uint64_t nbytes = 0;
    uint64_t source_hash = 0;
    devalloc_release_fn release = nullptr;
    void* user_data = nullptr;
    std::string call;
  };
  PluginLayer* layer = nullptr;
  Released released;
  {
    std::lock_guard owners(g_tickets_mutex);
    const auto owner = ticket_owners().find(user_data);
    if (owner == ticket_owners().end()) {
      stray_release(user_data);
      return;
    }
    layer = owner->second;
    std::lock_guard lock(layer->mutex_);
    // Owners and tickets_ lose a token together, under both mutexes.
    const auto found = layer->tickets_.find(user_data);
    if (found == layer->tickets_.end()) return;
    Ticket& ticket = found->second;
    if (++ticket.releases > 1) {
      // Swallowed: the caller may already reuse the source, and its own
      // accounting must not count one copy twice.
      if (layer->settings_.validate) {
        layer->owed_[ticket.device].push_back(
            layer->breach("PLUGIN-14", ticket.call, "on_release was called a second time"));
      }
      return;
    }
    layer->pending_.erase(ticket.id);
    if (layer->count_call()) layer->failed_devices_.insert(ticket.device);
    released = {ticket.device, ticket.src, ticket.nbytes, ticket.source_hash, ticket.release,
                ticket.user_data, {}};
    try {
      if (layer->settings_.check_sources) released.call = ticket.call;
      // Remembered for kLayerReleasedKept more releases, then forgotten: a
      // release of that token is a stray from then on.
      layer->released_.push_back(user_data);
      if (layer->released_.size() > kLayerReleasedKept) {
        const void* oldest = layer->released_.front();
        layer->released_.pop_front();
        layer->tickets_.erase(oldest);
        ticket_owners().erase(oldest);
      }
    } catch (const std::bad_alloc&) {
      // Out of host memory: this ticket is simply never forgotten, and a
      // changed source is reported without its call's text.
    }
  }
  if (layer->settings_.check_sources && layer->settings_.validate && released.src != nullptr &&
      hash_of(released.src, released.nbytes) != released.source_hash) {
    const std::string text =
        layer->breach("PLUGIN-14", released.call,
                      "the caller changed the source before its release (the bytes differ "
                      "from those at issue)");
    std::lock_guard lock(layer->mutex_);
    layer->owed_[released.device].push_back(text);
  }
  t_in_release = true;
  released.release(released.user_data);
  t_in_release = false;
}

// g_tickets_mutex held. Whose plugin sent it cannot be known: with one live
// layer it is that one's, reported on the next call on each of its devices;
// with several, each logs it.
void PluginLayer::stray_release(const void* user_data) {
  for (PluginLayer* layer : live_layers()) {
    if (!layer->settings_.validate) continue;
    const std::string text = layer->breach(
        "PLUGIN-14", "on_release(" + printed("%p", user_data) + ")",
        live_layers().size() == 1
            ? "on_release came with a user_data that no copy was given (from this "
              "plugin, or from an instance destroyed before); it is ignored"
            : "an on_release came with a user_data that no copy of any plugin was given "
              "(this plugin or another); it is ignored");
    if (live_layers().size() != 1) continue;
    std::lock_guard lock(layer->mutex_);
    for (uint32_t device = 0; device < layer->device_count_; ++device) {
      layer->owed_[device].push_back(text);
    }
  }
}

}  // namespace devalloc
