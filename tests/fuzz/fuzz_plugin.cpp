// A plugin whose every answer comes from the fuzz input: negotiation fields,
// the function table's size, version and names, every status, error message
// (terminated or not), capability, device count and device property. The
// input is the fuzz target's devalloc_fuzz_answers, read front to back; an
// input that runs out answers zeros.
#include <devalloc/plugin_abi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

extern "C" const uint8_t* devalloc_fuzz_answers;
extern "C" size_t devalloc_fuzz_answers_size;

namespace {

size_t g_pos = 0;

template <class T>
T take() {
  T value{};
  const size_t n = devalloc_fuzz_answers_size - g_pos < sizeof value
                       ? devalloc_fuzz_answers_size - g_pos
                       : sizeof value;
  std::memcpy(&value, devalloc_fuzz_answers + g_pos, n);
  g_pos += n;
  return value;
}

// Up to `capacity` bytes of the input, not necessarily NUL-terminated.
void take_text(char* out, size_t capacity) {
  const size_t wanted = take<uint16_t>() % (capacity + 1);
  const size_t n = wanted < devalloc_fuzz_answers_size - g_pos ? wanted
                                                                : devalloc_fuzz_answers_size - g_pos;
  std::memset(out, 0, capacity);
  std::memcpy(out, devalloc_fuzz_answers + g_pos, n);
  g_pos += n;
}

// Mostly OK, so that the loader gets past each step.
devalloc_status take_status() {
  const uint8_t pick = take<uint8_t>();
  if (pick < 200) return DEVALLOC_STATUS_OK;
  if (pick < 250) return static_cast<devalloc_status>(pick % 9);
  return take<int32_t>();
}

devalloc_status answer(devalloc_error* error) {
  const devalloc_status status = take_status();
  if (status != DEVALLOC_STATUS_OK && error != nullptr) {
    take_text(error->message, sizeof error->message);
  }
  return status;
}

char g_name[64];
char g_version[64];
devalloc_plugin_api_v1 g_api;
int g_instance;

devalloc_status create(devalloc_create_args* args, devalloc_error* error) {
  const devalloc_status status = answer(error);
  args->instance = take<uint8_t>() < 240 ? reinterpret_cast<devalloc_instance*>(&g_instance)
                                         : nullptr;
  return status;
}

void destroy(devalloc_instance*) {}

devalloc_status get_capabilities(devalloc_instance*, devalloc_capabilities* caps,
                                 devalloc_error* error) {
  caps->flags = take<uint64_t>();
  caps->max_alignment = take<uint64_t>();
  return answer(error);
}

devalloc_status get_device_count(devalloc_instance*, uint32_t* count, devalloc_error* error) {
  *count = take<uint32_t>();
  return answer(error);
}

devalloc_status get_device_properties(devalloc_instance*, uint32_t,
                                      devalloc_device_properties* p, devalloc_error* error) {
  take_text(p->name, sizeof p->name);
  p->total_memory_bytes = take<uint64_t>();
  for (uint8_t& byte : p->uuid) byte = take<uint8_t>();
  take_text(p->pci_bus_id, sizeof p->pci_bus_id);
  p->dlpack_device_type = take<int32_t>();
  p->dlpack_device_id = take<int32_t>();
  return answer(error);
}

devalloc_status allocate(devalloc_instance*, devalloc_allocate_args*, devalloc_error* error) {
  return answer(error);
}
devalloc_status deallocate(devalloc_instance*, uint32_t, devalloc_device_address,
                           devalloc_error* error) {
  return answer(error);
}
devalloc_status copy_host_to_device(devalloc_instance*, const devalloc_copy_to_device_args*,
                                    devalloc_error* error) {
  return answer(error);
}
devalloc_status copy_device_to_host(devalloc_instance*, const devalloc_copy_to_host_args*,
                                    devalloc_error* error) {
  return answer(error);
}
devalloc_status synchronize(devalloc_instance*, uint32_t, devalloc_error* error) {
  return answer(error);
}

}  // namespace

extern "C" DEVALLOC_PLUGIN_EXPORT devalloc_status devalloc_plugin_negotiate(
    devalloc_negotiation* n, devalloc_error* error) {
  g_pos = 0;
  n->plugin_major = take<uint8_t>() < 200 ? DEVALLOC_ABI_VERSION_MAJOR : take<uint32_t>();
  n->plugin_minor = take<uint32_t>();
  n->plugin_min_major = take<uint8_t>() < 200 ? DEVALLOC_ABI_VERSION_MAJOR : take<uint32_t>();

  g_api = devalloc_plugin_api_v1{};
  const uint8_t size_pick = take<uint8_t>();
  g_api.struct_size = size_pick < 200   ? sizeof g_api
                      : size_pick < 230 ? DEVALLOC_PLUGIN_API_V1_MIN_SIZE
                                        : take<uint16_t>();
  g_api.abi_major = take<uint8_t>() < 230 ? DEVALLOC_ABI_VERSION_MAJOR : take<uint32_t>();
  g_api.abi_minor = take<uint32_t>();
  take_text(g_name, sizeof g_name - 1);
  take_text(g_version, sizeof g_version - 1);
  g_api.plugin_name = take<uint8_t>() < 240 ? g_name : nullptr;
  g_api.plugin_version = take<uint8_t>() < 240 ? g_version : nullptr;
  // Each required function may be missing.
  const uint16_t missing = take<uint8_t>() < 230 ? 0 : take<uint16_t>();
  const auto keep = [&](int bit) { return (missing & (1u << bit)) == 0; };
  if (keep(0)) g_api.create = create;
  if (keep(1)) g_api.destroy = destroy;
  if (keep(2)) g_api.get_capabilities = get_capabilities;
  if (keep(3)) g_api.get_device_count = get_device_count;
  if (keep(4)) g_api.get_device_properties = get_device_properties;
  if (keep(5)) g_api.allocate = allocate;
  if (keep(6)) g_api.deallocate = deallocate;
  if (keep(7)) g_api.copy_host_to_device = copy_host_to_device;
  if (keep(8)) g_api.copy_device_to_host = copy_device_to_host;
  if (keep(9)) g_api.synchronize = synchronize;
  n->api = take<uint8_t>() < 240 ? &g_api : nullptr;
  return answer(error);
}
