#include "plugin_layer.hpp"

#include "capability_flags.hpp"
#include "guarded_call.hpp"

#include <devalloc/input_text.hpp>
#include <devalloc/status.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cinttypes>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <string_view>

namespace devalloc {

namespace {

std::mutex g_log_mutex;
std::vector<ValidationBreach> g_log;

// Set while the host's on_release runs on this thread: a call into the
// plugin from there breaks PLUGIN-14.
thread_local bool t_in_release = false;
// Set while the layer releases a copy whose call it fails on purpose: no
// counted call of the plugin's.
thread_local bool t_injecting = false;

std::string printed(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string printed(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  return text;
}

// The destination of a checked copy is read back in pieces of this size.
constexpr uint64_t kReadBackBytes = uint64_t{1} << 20;

// Once per process and plugin: the layer is on, and with which checks.
void announce(const std::string& plugin, const LayerSettings& settings) {
  static std::mutex mutex;
  static auto* announced = new std::set<std::string>();
  std::string checks;
  for (const std::string& name : settings.check_names()) {
    checks += (checks.empty() ? "" : ", ") + name;
  }
  const std::string line = "devalloc: validation layer on for " + plugin + "; checks: " + checks;
  std::lock_guard lock(mutex);
  if (!announced->insert(line).second) return;
  std::fprintf(stderr, "%s\n", line.c_str());
}

// The function table a caller of the layer sees is as large as the
// negotiated minor's, and never larger than the plugin's own: a plugin that
// negotiated 1.1 is not offered the 1.2 functions through its layer.
size_t table_size_for(uint32_t abi_minor, size_t plugin_table_size) {
  const size_t of_minor = abi_minor >= 2   ? DEVALLOC_PLUGIN_API_V1_2_SIZE
                          : abi_minor == 1 ? DEVALLOC_PLUGIN_API_V1_1_SIZE
                                           : DEVALLOC_PLUGIN_API_V1_MIN_SIZE;
  return std::max<size_t>(DEVALLOC_PLUGIN_API_V1_MIN_SIZE,
                          std::min(of_minor, plugin_table_size));
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
  std::string value(env, strnlen(env, 64));
  for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (value.empty() || value == "0" || value == "false" || value == "no" || value == "off") {
    return s;
  }
  s.validate = true;
  if (value == "sources") s.check_sources = true;
  if (value != "1" && value != "true" && value != "yes" && value != "on" && value != "sources") {
    // A typo of a safety switch turns it on, and says so, once.
    static std::once_flag said;
    std::call_once(said, [&] {
      std::fprintf(stderr,
                   "devalloc: DEVALLOC_VALIDATE=%s is none of 0, false, no, off (layer off), 1, "
                   "true, yes, on (layer on) or sources (layer on, sources checked); the "
                   "validation layer is on\n",
                   quote(std::string_view(env, strnlen(env, 256))).c_str());
    });
  }
  return s;
}

std::vector<std::string> LayerSettings::check_names() const {
  std::vector<std::string> names;
  if (validate) {
    names = {"calls", "releases"};
    if (check_sources) names.emplace_back("sources");
  }
  if (faults.any()) names.emplace_back("faults");
  return names;
}

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
                         uint32_t abi_minor, std::string plugin, LayerSettings settings,
                         detail::ReleaseTracker& releases)
    : real_(real),
      real_instance_(real_instance),
      abi_minor_(abi_minor),
      known_flags_(detail::capability_flags_of_minor(abi_minor)),
      plugin_(std::move(plugin)),
      settings_(settings),
      releases_(releases) {
  table_.struct_size = table_size_for(abi_minor, real.struct_size);
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
  // ABI 1.2: likewise, and only for a plugin that negotiated 1.2.
  has_host_mapping_ = abi_minor >= 2 && real.struct_size >= DEVALLOC_PLUGIN_API_V1_2_SIZE &&
                      real.map_to_host != nullptr && real.unmap_from_host != nullptr;
  if (has_host_mapping_) {
    table_.map_to_host = &PluginLayer::map_to_host;
    table_.unmap_from_host = &PluginLayer::unmap_from_host;
  }
}

PluginLayer* PluginLayer::wrap(const devalloc_plugin_api_v1& real,
                               devalloc_instance* real_instance, uint32_t abi_minor,
                               std::string plugin, LayerSettings settings,
                               detail::ReleaseTracker& releases) {
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
  if (settings.validate) announce(plugin, settings);
  auto* layer =
      new PluginLayer(real, real_instance, abi_minor, std::move(plugin), settings, releases);
  if (counted) layer->device_count_ = count;
  releases.observe(layer);
  return layer;
}

LayerCounters PluginLayer::counters() const {
  std::lock_guard lock(mutex_);
  LayerCounters c;
  c.calls = calls_;
  c.faults_injected = faults_injected_;
  c.live_allocations = allocations_.count();
  c.live_bytes = allocations_.bytes();
  c.pending_releases = releases_.unreleased_count();
  c.breaches = breaches_;
  c.remembered_copies = releases_.remembered();
  c.pending_source_checks = sources_.size();
  c.source_checks_done = sources_.done();
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
  if ((t_in_release || detail::ReleaseTracker::in_release()) && layer.settings_.validate) { \
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
  // its releases are no longer watched and its memory goes.
  detail::guarded_call("destroy", nullptr, [&] {
    layer->real_.destroy(layer->real_instance_);
    return DEVALLOC_STATUS_OK;
  });
  // Releases after destroy are the tracker's alone.
  layer->releases_.observe(nullptr);
  if (layer->settings_.validate) {
    const detail::Unreleased left =
        layer->releases_.unreleased(detail::ReleaseTracker::kAnyDevice, UINT64_MAX, false);
    if (left.count != 0) {
      layer->breach("PLUGIN-9", "destroy()",
                    std::to_string(left.count) +
                        " until-released copies were never released (first: " + left.first +
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
  layer.finish(call);
  // ABI 1.2's DMA constraints are handed on as they are; an alignment that
  // no address can meet is the plugin's breach.
  if (call.status == DEVALLOC_STATUS_OK && layer.abi_minor_ >= 2 &&
      capabilities->struct_size >= DEVALLOC_CAPABILITIES_V1_2_SIZE) {
    const uint64_t alignment = capabilities->copy_src_alignment;
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) {
      return layer.fail_breach(call, "PLUGIN-23",
                               "copy_src_alignment " + std::to_string(alignment) +
                                   " is neither 0 (none) nor a power of two");
    }
  }
  return call.status;
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
  if (layer.abi_minor_ >= 2 && size >= DEVALLOC_DEVICE_PROPERTIES_V1_2_SIZE &&
      !terminated(p->memory_kind, sizeof p->memory_kind)) {
    return layer.fail_breach(call, "PLUGIN-24", "the memory kind is not NUL-terminated");
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
    // An allocation of device memory: not one of 0 bytes.
    const uint64_t fail_at = layer.settings_.faults.fail_allocate_at;
    if (args->nbytes != 0 && ++layer.allocations_made_ == fail_at) {
      ++layer.faults_injected_;
      return layer.fail(call, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                        printed("fault injection (fail_allocate_at = %" PRIu64 "): %s fails",
                                fail_at, call.text.c_str()));
    }
    const uint64_t budget = layer.settings_.faults.device_bytes;
    const uint64_t live_bytes = layer.allocations_.bytes();
    if (budget != 0 && args->nbytes > budget - std::min(budget, live_bytes)) {
      ++layer.faults_injected_;
      return layer.fail(call, DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                        printed("fault injection: %s exceeds the device memory budget of %" PRIu64
                                " bytes (%" PRIu64 " live)",
                                call.text.c_str(), budget, live_bytes));
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
  } else if (nbytes != 0 && !layer.allocations_.add(args->device, address, nbytes)) {
    wrong = printed("returned [0x%" PRIx64 ", +%" PRIu64 "), which overlaps a live allocation",
                    address, nbytes);
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
  std::optional<uint64_t> known;
  {
    std::unique_lock lock(layer.mutex_);
    // No longer live from here: once the plugin freed it, another thread's
    // allocate may get the same range, which must not look like an overlap
    // (PLUGIN-11). Back in below if the plugin refuses to free it.
    known = layer.allocations_.take(device, address);
    // Before the plugin frees it: it may hand the range out again at once,
    // to another thread whose bytes a read-back would then see.
    if (known && layer.checks_sources()) {
      const uint64_t nbytes = *known;
      layer.sources_.forget_range(device, address, nbytes);
      // A read-back of the range still running on another thread ends
      // before the plugin frees it.
      layer.sources_.read_back_ended().wait(
          lock, [&] { return !layer.sources_.reading(device, address, nbytes); });
    }
  }
  call.status = layer.real_.deallocate(layer.real_instance_, device, address, &call.mine);
  layer.finish(call);
  if (call.status != DEVALLOC_STATUS_OK || address == 0) {
    if (known) {
      std::lock_guard lock(layer.mutex_);
      try {
        layer.allocations_.put_back(device, address, *known);
      } catch (const std::bad_alloc&) {
        // Still allocated, no longer checked: an overlap with it goes unseen.
      }
    }
    return call.status;
  }
  if (!known) {
    return layer.fail_breach(call, "PLUGIN-12",
                             "accepted an address that allocate did not return on this device "
                             "or that was freed already");
  }
  std::lock_guard lock(layer.mutex_);
  // Its mappings end with it (PLUGIN-22).
  layer.allocations_.freed(device, address, *known);
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
  // A copy the plugin handle made, with its tracker's token; any other is
  // made one of the tracker's here.
  const bool tracked = releases && args->on_release == detail::tracked_release_callback();
  const uint64_t source_hash = layer.settings_.check_sources && releases && args->src != nullptr
                                   ? detail::source_hash(args->src, args->nbytes)
                                   : 0;
  const bool checked = layer.checks_sources() && releases && args->src != nullptr &&
                       args->nbytes != 0;
  if (checked) layer.make_room_for_source_check();
  devalloc_copy_to_device_args forwarded = *args;
  bool valid = true;
  bool into_mapping = false;
  {
    std::unique_lock lock(layer.mutex_);
    valid = args->nbytes == 0 ||
            (args->src != nullptr && layer.device_exists(args->device) &&
             layer.allocations_.inside(args->device, args->dst, args->nbytes) &&
             args->src_lifetime <= DEVALLOC_SRC_UNTIL_RELEASED);
    if (args->nbytes != 0) {
      into_mapping = layer.settings_.validate &&
                     layer.allocations_.overlaps_mapping(args->device, args->dst, args->nbytes);
      // What an earlier copy put there is written over: not read back.
      if (layer.checks_sources()) layer.sources_.forget_range(args->device, args->dst, args->nbytes);
    }
    std::string injected;
    if (layer.count_call()) {
      injected = printed("fault injection: %s is call #%" PRIu64 " and fails", call.text.c_str(),
                         layer.calls_);
    } else if (args->nbytes != 0 && args->src != nullptr &&
               ++layer.copies_made_ == layer.settings_.faults.fail_copy_at) {
      // A copy of bytes: not one of 0 bytes or from no source.
      ++layer.faults_injected_;
      injected = printed("fault injection (fail_copy_at = %" PRIu64 "): %s fails",
                         layer.settings_.faults.fail_copy_at, call.text.c_str());
    }
    if (!injected.empty()) {
      lock.unlock();
      // Released as a plugin releases a copy that fails: through the
      // tracker for its own copies (not counted as a call), else at once.
      if (tracked) {
        t_injecting = true;
        args->on_release(args->user_data);
        t_injecting = false;
      } else if (releases) {
        t_in_release = true;
        args->on_release(args->user_data);
        t_in_release = false;
      }
      return layer.fail(call, DEVALLOC_STATUS_DEVICE_ERROR, injected);
    }
  }
  void* token = nullptr;
  uint64_t copy = 0;
  if (releases) {
    token = args->user_data;
    if (!tracked) {
      try {
        token = layer.releases_.issue(
            args->device, args->dst, args->src, args->nbytes, &layer,
            [release = args->on_release, user_data = args->user_data](CopyOutcome&&) {
              t_in_release = true;
              release(user_data);
              t_in_release = false;
            });
      } catch (const std::bad_alloc&) {
        // Not issued: the source goes back at once, as for any failed copy
        // (PLUGIN-14), and the copy fails without reaching the plugin.
        t_in_release = true;
        args->on_release(args->user_data);
        t_in_release = false;
        return layer.fail(call, DEVALLOC_STATUS_OUT_OF_HOST_MEMORY,
                          "validation layer: no host memory to account the copy");
      }
      forwarded.on_release = detail::tracked_release_callback();
      forwarded.user_data = token;
    }
    if (layer.settings_.check_sources) {
      copy = layer.releases_.copy_of(token);
      layer.releases_.note_check(copy, source_hash);
    }
    if (checked && valid && copy != 0) {
      detail::SourceCheck check;
      check.device = args->device;
      check.dst = args->dst;
      check.nbytes = args->nbytes;
      check.source_hash = source_hash;
      check.call = call.text;
      std::lock_guard lock(layer.mutex_);
      layer.sources_.remember(copy, std::move(check));
    }
  }
  try {
    call.status = layer.real_.copy_host_to_device(layer.real_instance_, &forwarded, &call.mine);
  } catch (...) {
    // The plugin threw (PLUGIN-7, which the handle's guard reports): the
    // layer's own copy ends as a failed call, so that a release that
    // comes still reaches the caller.
    if (releases && !tracked) {
      layer.releases_.returned(token, Status(StatusCode::internal, std::string()));
    }
    throw;
  }
  if (copy != 0) {
    // A failed copy lands nothing to read back.
    std::lock_guard lock(layer.mutex_);
    layer.sources_.call_returned(copy, call.status == DEVALLOC_STATUS_OK);
  }
  // The handle says its own copies' calls returned; this one is the layer's.
  if (releases && !tracked) {
    layer.releases_.returned(token, call.status == DEVALLOC_STATUS_OK
                                         ? Status()
                                         : Status(StatusCode::device_error, call.text));
  }
  if (into_mapping) {
    const std::string text =
        layer.breach("PLUGIN-22", call.text,
                     "the caller copies into a range that is mapped into the host "
                     "(map_to_host); the host issues no copy into a mapped range before it "
                     "unmapped it");
    std::lock_guard lock(layer.mutex_);
    layer.owed_[args->device].push_back(text);
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
             layer.allocations_.inside(args->device, args->src, args->nbytes));
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
  // The copies whose calls returned before this call: owed a release once
  // it returned (PLUGIN-20).
  const uint64_t covered = layer.releases_.returned_calls();
  std::vector<uint64_t> checks_before;  // source checks of copies issued before it
  {
    std::lock_guard lock(layer.mutex_);
    fail_now = layer.count_call();
    fault_call = layer.calls_;
    checks_before = layer.sources_.issued_on(device);
  }
  call.status = layer.real_.synchronize(layer.real_instance_, device, &call.mine);
  layer.finish(call);
  if (call.status != DEVALLOC_STATUS_OK && !checks_before.empty()) {
    // A failed copy's destination holds whatever it holds: not a breach of
    // PLUGIN-14 to report at the next read-back.
    std::lock_guard lock(layer.mutex_);
    layer.sources_.forget(checks_before);
  }
  // Those copies have landed: their destinations hold what they read.
  if (!checks_before.empty() && call.status == DEVALLOC_STATUS_OK) {
    std::vector<std::string> texts = layer.read_back_sources(checks_before);
    if (!texts.empty()) {
      std::lock_guard lock(layer.mutex_);
      auto& owed = layer.owed_[device];
      owed.insert(owed.end(), texts.begin(), texts.end());
    }
  }

  std::string owed;
  const detail::Unreleased missing =
      layer.releases_.unreleased(device, covered, layer.settings_.validate);
  bool failed_async = false;
  std::pair<devalloc_status, std::string> unreported{DEVALLOC_STATUS_OK, {}};
  {
    std::lock_guard lock(layer.mutex_);
    layer.take_owed(device, &owed);
    failed_async = layer.failed_devices_.erase(device) != 0;
    if (const auto it = layer.unreported_failures_.find(device);
        it != layer.unreported_failures_.end()) {
      unreported = std::move(it->second);
      layer.unreported_failures_.erase(it);
    }
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
  if (missing.newly != 0 && layer.settings_.validate) {
    const size_t earlier = missing.count - missing.newly;
    return layer.fail(
        call, DEVALLOC_STATUS_INTERNAL,
        after_owed(layer.breach(
            "PLUGIN-20", call.text,
            "returned while " + std::to_string(missing.newly) +
                " copies issued before it were not released (first: " + missing.first_new + ")" +
                (earlier == 0 ? std::string()
                              : "; " + std::to_string(earlier) +
                                    " more were reported by an earlier synchronize"))));
  }
  if (missing.count != 0 && layer.settings_.validate) {
    return layer.fail(call, DEVALLOC_STATUS_INTERNAL,
                      after_owed("PLUGIN-20: " + call.text + ": returned while " +
                                 std::to_string(missing.count) +
                                 " copies issued before it were not released, as an earlier "
                                 "synchronize reported (first: " +
                                 missing.first + ")"));
  }
  if (!owed.empty() && layer.settings_.validate) {
    return layer.fail(call, DEVALLOC_STATUS_INTERNAL, "validation: " + owed);
  }
  if (call.status != DEVALLOC_STATUS_OK) return call.status;
  if (unreported.first != DEVALLOC_STATUS_OK) {
    return layer.fail(call, unreported.first, unreported.second);
  }
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
  if (layer.settings_.faults.fail_synchronize) {
    {
      std::lock_guard lock(layer.mutex_);
      ++layer.faults_injected_;
    }
    return layer.fail(call, DEVALLOC_STATUS_DEVICE_ERROR,
                      "fault injection (fail_synchronize): " + call.text + " fails");
  }
  return call.status;
}

devalloc_status PluginLayer::allocate_host(devalloc_instance* instance, uint64_t nbytes,
                                           void** host, devalloc_error* error) {
  Call call(printed("allocate_host(nbytes %" PRIu64 ")", nbytes), error);
  DEVALLOC_LAYER_ENTRY(call)
  call.status = layer.real_.allocate_host(layer.real_instance_, nbytes, host, &call.mine);
  layer.finish(call);
  if (call.status == DEVALLOC_STATUS_OK && layer.checks_sources() && host != nullptr &&
      *host != nullptr && nbytes != 0) {
    std::lock_guard lock(layer.mutex_);
    layer.sources_.add_staging(*host, nbytes);
  }
  return call.status;
}

devalloc_status PluginLayer::free_host(devalloc_instance* instance, void* host,
                                       devalloc_error* error) {
  Call call(printed("free_host(%p)", host), error);
  DEVALLOC_LAYER_ENTRY(call)
  call.status = layer.real_.free_host(layer.real_instance_, host, &call.mine);
  layer.finish(call);
  if (call.status == DEVALLOC_STATUS_OK && layer.checks_sources()) {
    std::lock_guard lock(layer.mutex_);
    layer.sources_.remove_staging(host);
  }
  return call.status;
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

devalloc_status PluginLayer::map_to_host(devalloc_instance* instance, devalloc_map_args* args,
                                         devalloc_error* error) {
  Call call(args == nullptr
                ? std::string("map_to_host(NULL)")
                : printed("map_to_host(device %" PRIu32 ", address 0x%" PRIx64 ", nbytes %" PRIu64
                          ")",
                          args->device, args->address, args->nbytes),
            error);
  DEVALLOC_LAYER_ENTRY(call)
  bool valid = false;
  if (args != nullptr) {
    std::lock_guard lock(layer.mutex_);
    valid = args->nbytes != 0 && layer.device_exists(args->device) &&
            layer.allocations_.inside(args->device, args->address, args->nbytes);
  }
  const devalloc_status mapped = layer.real_.map_to_host(layer.real_instance_, args, &call.mine);
  call.status = mapped;
  layer.finish(call);
  if (call.status != DEVALLOC_STATUS_OK) {
    // The plugin mapped and the layer failed the call (a message written
    // on success, say): the caller will not unmap what it never got.
    if (mapped == DEVALLOC_STATUS_OK && args != nullptr && args->host != nullptr) {
      devalloc_error ignored{};
      ignored.struct_size = sizeof ignored;
      detail::guarded_call("unmap_from_host", &ignored, [&] {
        return layer.real_.unmap_from_host(layer.real_instance_, args->device, args->host,
                                           &ignored);
      });
      args->host = nullptr;
    }
    return call.status;
  }
  if (args == nullptr) return layer.fail_breach(call, "PLUGIN-22", "accepted NULL arguments");
  if (args->host == nullptr) {
    return layer.fail_breach(call, "PLUGIN-22", "answered OK without a host pointer");
  }
  if (!valid && layer.settings_.validate) {
    // Not the caller's: it sees a failure and will not unmap it.
    devalloc_error ignored{};
    ignored.struct_size = sizeof ignored;
    detail::guarded_call("unmap_from_host", &ignored, [&] {
      return layer.real_.unmap_from_host(layer.real_instance_, args->device, args->host,
                                         &ignored);
    });
    args->host = nullptr;
    return layer.fail_breach(call, "PLUGIN-22",
                             "mapped a range that is not inside one live allocation of the "
                             "device (or of 0 bytes)");
  }
  std::lock_guard lock(layer.mutex_);
  layer.allocations_.add_mapping(args->device, args->host, args->address, args->nbytes);
  // The host writes through the mapping: an earlier copy's bytes there are
  // not what a read-back must find.
  if (layer.checks_sources()) layer.sources_.forget_range(args->device, args->address, args->nbytes);
  return call.status;
}

devalloc_status PluginLayer::unmap_from_host(devalloc_instance* instance, uint32_t device,
                                             void* host, devalloc_error* error) {
  Call call(printed("unmap_from_host(device %" PRIu32 ", host %p)", device, host), error);
  DEVALLOC_LAYER_ENTRY(call)
  bool live = false;
  {
    std::lock_guard lock(layer.mutex_);
    live = layer.allocations_.is_mapped(device, host);
  }
  call.status = layer.real_.unmap_from_host(layer.real_instance_, device, host, &call.mine);
  layer.finish(call);
  if (call.status != DEVALLOC_STATUS_OK) return call.status;
  if (!live) {
    return layer.fail_breach(call, "PLUGIN-22",
                             host == nullptr
                                 ? "accepted a NULL host pointer"
                                 : "accepted a host pointer that is no live mapping of the "
                                   "device (never mapped, unmapped already, or its allocation "
                                   "freed)");
  }
  std::lock_guard lock(layer.mutex_);
  layer.allocations_.remove_mapping(device, host);
  return call.status;
}

bool PluginLayer::may_poison(const detail::ReleasedCopy& copy) const {
  return sources_.in_staging(copy.src, copy.nbytes) &&
         !releases_.unreleased_reads(copy.src, copy.nbytes);
}

std::vector<std::string> PluginLayer::read_back_sources(const std::vector<uint64_t>& ids) {
  std::vector<std::string> breaches;
  std::vector<unsigned char> chunk;
  for (uint64_t id : ids) {
    std::optional<detail::SourceCheck> begun;
    {
      std::lock_guard lock(mutex_);
      begun = sources_.begin_read(id);
    }
    if (!begun) continue;
    const detail::SourceCheck& check = *begun;
    try {
      chunk.resize(std::min(check.nbytes, kReadBackBytes));
    } catch (...) {
      // Not read: dropped, so that no deallocate waits for it for ever.
      std::lock_guard lock(mutex_);
      sources_.end_read(id, /*abandoned=*/true);
      throw;
    }
    uint64_t hash = detail::kSourceHashStart;
    bool read = true;
    for (uint64_t done = 0; done < check.nbytes && read;) {
      devalloc_copy_to_host_args args{};
      args.struct_size = sizeof args;
      args.device = check.device;
      args.src = check.dst + done;
      args.dst = chunk.data();
      args.nbytes = std::min<uint64_t>(chunk.size(), check.nbytes - done);
      devalloc_error error{};
      error.struct_size = sizeof error;
      read = detail::guarded_call("copy_device_to_host", &error, [&] {
               return real_.copy_device_to_host(real_instance_, &args, &error);
             }) == DEVALLOC_STATUS_OK;
      hash = detail::source_hash_more(hash, chunk.data(), args.nbytes);
      done += args.nbytes;
    }
    {
      // Another thread may have freed the range (and the plugin handed it
      // out again) or written it while it was read: then it proves nothing.
      std::lock_guard lock(mutex_);
      if (!sources_.end_read(id)) continue;
    }
    // A read-back that fails checks nothing; the plugin's own failure
    // reaches the caller on its next call of the device.
    if (!read || hash == check.source_hash) continue;
    breaches.push_back(breach(
        "PLUGIN-14", check.call,
        check.poisoned
            ? "released the source of this copy before reading it: the device holds bytes that "
              "were written into src after its release (the validation layer overwrote the "
              "released source, so a copy that reads it late lands other bytes)"
            : "the device holds other bytes than src held when the copy was issued: the plugin "
              "released src before reading it (and read it after the caller reused it), or "
              "wrote the copy wrong"));
  }
  return breaches;
}

void PluginLayer::make_room_for_source_check() {
  uint32_t device = 0;
  std::vector<uint64_t> ids;
  {
    std::lock_guard lock(mutex_);
    if (!sources_.full()) return;
    device = sources_.oldest_device();
    ids = sources_.issued_on(device);
  }
  devalloc_error error{};
  error.struct_size = sizeof error;
  const devalloc_status status = detail::guarded_call("synchronize", &error, [&] {
    return real_.synchronize(real_instance_, device, &error);
  });
  std::vector<std::string> texts;
  if (status == DEVALLOC_STATUS_OK) texts = read_back_sources(ids);
  std::lock_guard lock(mutex_);
  // The failure of a copy is the caller's to see (PLUGIN-17): its next
  // synchronize of the device reports it.
  if (status != DEVALLOC_STATUS_OK && unreported_failures_.count(device) == 0) {
    unreported_failures_[device] = {
        status, "synchronize(device " + std::to_string(device) +
                    "), called by the validation layer to read back sources, failed: " +
                    (terminated(error.message, sizeof error.message) ? std::string(error.message)
                                                                     : std::string())};
  }
  auto& owed = owed_[device];
  owed.insert(owed.end(), texts.begin(), texts.end());
  // A device whose synchronize failed may hold wrong bytes for copies that
  // failed, not for copies released early: its checks are forgotten, or
  // the next read-back would blame PLUGIN-14 for the device's error.
  if (status != DEVALLOC_STATUS_OK) sources_.forget(ids);
  // Then the oldest others until there is room, unchecked.
  sources_.make_room();
}

void PluginLayer::released(const detail::ReleasedCopy& copy) noexcept {
  if (t_injecting) return;  // the layer's own release of a copy it failed
  bool poison_source = false;
  std::string call;  // the copy's text, for the source check
  try {
    {
      std::lock_guard lock(mutex_);
      if (count_call()) failed_devices_.insert(copy.device);
      if (checks_sources()) {
        // Due for a read-back at the next synchronize of its device.
        if (detail::SourceCheck* check = sources_.find(copy.id)) {
          check->released = true;
          poison_source = check->poisoned = may_poison(copy);
          call = check->call;
        }
      }
    }
    // The caller's side: its source unchanged until now (hashed with no
    // lock held).
    if (checks_sources() && copy.src != nullptr &&
        detail::source_hash(copy.src, copy.nbytes) != copy.check) {
      const std::string text = breach(
          "PLUGIN-14",
          call.empty() ? printed("copy_host_to_device(device %" PRIu32 ", dst 0x%" PRIx64
                                 ", src %p, nbytes %" PRIu64 ", until released)",
                                 copy.device, copy.dst, copy.src, copy.nbytes)
                       : call,
          "the caller changed the source before its release (the bytes differ from those at "
          "issue)");
      std::lock_guard lock(mutex_);
      owed_[copy.device].push_back(text);
    }
  } catch (...) {
    // Out of host memory: the breach goes unworded; the release still
    // reaches the caller.
  }
  // Only now, once the caller's side is checked, and before the caller has
  // the source back: a plugin that reads it from here on lands the poison.
  if (poison_source) detail::poison_source(copy.src, copy.nbytes);
}

// Whose plugin sent a release for no copy cannot be known; the tracker
// tells the one it holds likely (ReleaseTracker::release), which reports it
// on the next synchronize of each of its devices.
void PluginLayer::stray(const detail::StrayRelease& release) noexcept {
  if (!settings_.validate) return;
  try {
    if (release.second) {
      const std::string text = breach(
          "PLUGIN-14",
          printed("copy_host_to_device(device %" PRIu32 ", dst 0x%" PRIx64 ", nbytes %" PRIu64
                  ", until released)",
                  release.device, release.dst, release.nbytes),
          "on_release was called a second time");
      std::lock_guard lock(mutex_);
      owed_[release.device].push_back(text);
      return;
    }
    const std::string text = breach(
        "PLUGIN-14", "on_release(" + printed("%p", release.user_data) + ")",
        "on_release came with a user_data that no copy was given (from this plugin, or from "
        "an instance destroyed before); it is ignored");
    std::lock_guard lock(mutex_);
    for (uint32_t device = 0; device < device_count_; ++device) owed_[device].push_back(text);
  } catch (...) {
    // Out of host memory: the tracker still counts the breach.
  }
}

}  // namespace devalloc
