#include <devalloc/plugin_kit/abi_glue.hpp>
#include <devalloc/plugin_kit/allocation_table.hpp>

#include <cinttypes>
#include <cstdio>

namespace devalloc::plugin {

void require(bool condition, const char* call, const char* rule, const char* what) {
  if (!condition) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT, format("%s: %s (%s)", call, what, rule)};
  }
}

void require_device(uint32_t device, uint32_t count, const char* call) {
  if (device < count) return;
  throw Failure{DEVALLOC_STATUS_NO_SUCH_DEVICE,
                format("%s: device %u does not exist (this instance has %u device%s) "
                       "(PLUGIN-10)",
                       call, device, count, count == 1 ? "" : "s")};
}

uint64_t checked_alignment(uint64_t alignment, uint64_t natural, uint64_t max) {
  if (alignment == 0) return natural;
  if (!is_power_of_two(alignment)) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  format("alignment %" PRIu64 " is not a power of two (PLUGIN-11)", alignment)};
  }
  if (alignment > max) {
    throw Failure{DEVALLOC_STATUS_UNSUPPORTED,
                  format("alignment %" PRIu64 " is above the largest supported, %" PRIu64
                         " (PLUGIN-11)",
                         alignment, max)};
  }
  return alignment;
}

std::string normalize_pci_bus_id(const char* text) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  int consumed = 0;
  if (std::sscanf(text, "%x:%x:%x.%x%n", &domain, &bus, &device, &function, &consumed) != 4 ||
      text[consumed] != '\0') {
    return {};
  }
  return format("%04x:%02x:%02x.%x", domain, bus, device, function);
}

const char* lifetime_name(devalloc_src_lifetime lifetime) {
  switch (lifetime) {
    case DEVALLOC_SRC_DURING_CALL: return "during_call";
    case DEVALLOC_SRC_UNTIL_RELEASED: return "until_released";
    default: return "unknown";
  }
}

devalloc_status negotiate_v1(devalloc_negotiation* n, devalloc_error* error,
                             const devalloc_plugin_api_v1* api) {
  const size_t needed = DEVALLOC_STRUCT_SIZE(devalloc_negotiation, api);
  if (n == nullptr || n->struct_size < needed) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                "devalloc_plugin_negotiate: negotiation struct is NULL or smaller than %zu "
                "bytes (PLUGIN-2)",
                needed);
  }
  n->plugin_major = DEVALLOC_ABI_VERSION_MAJOR;
  n->plugin_minor = DEVALLOC_ABI_VERSION_MINOR;
  n->plugin_min_major = DEVALLOC_ABI_VERSION_MAJOR;
  n->api = nullptr;
  if (n->host_min_major > DEVALLOC_ABI_VERSION_MAJOR ||
      n->host_max_major < DEVALLOC_ABI_VERSION_MAJOR) {
    return fail(error, DEVALLOC_STATUS_UNSUPPORTED,
                "plugin %s speaks ABI major %u only; host speaks %u..%u (PLUGIN-2)",
                api->plugin_name, DEVALLOC_ABI_VERSION_MAJOR, n->host_min_major,
                n->host_max_major);
  }
  n->api = api;
  return DEVALLOC_STATUS_OK;
}

}  // namespace devalloc::plugin
