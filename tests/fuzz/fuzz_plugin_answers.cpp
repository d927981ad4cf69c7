// The loader's handling of what a plugin answers: negotiation, the function
// table, create, capabilities, the device count and each device's properties,
// all taken from the fuzz input by a fake plugin (fuzz_plugin.cpp).
#include <devalloc/input_text.hpp>
#include <devalloc/plugin.hpp>

#include <dlfcn.h>

#include <cstdlib>

// Read by the plugin; exported by this executable (ENABLE_EXPORTS).
extern "C" {
__attribute__((visibility("default"))) const uint8_t* devalloc_fuzz_answers = nullptr;
__attribute__((visibility("default"))) size_t devalloc_fuzz_answers_size = 0;
}

namespace {

// A failure names what failed, and what the plugin said is escaped: no byte
// of it can drive the terminal.
void check_message(const devalloc::Status& status) {
  if (status.ok() || status.message().empty()) std::abort();
  for (const char c : status.message()) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // libFuzzer keeps counting coverage in the plugin's code after each run:
  // it must never be unmapped, so the plugin stays open (RTLD_NODELETE) and
  // the loader's dlclose only drops a reference.
  static void* const keep_loaded = ::dlopen(DEVALLOC_FUZZ_PLUGIN, RTLD_NOW | RTLD_NODELETE);
  if (keep_loaded == nullptr) std::abort();
  devalloc_fuzz_answers = data;
  devalloc_fuzz_answers_size = size;
  auto [library, error] = devalloc::PluginLibrary::open(DEVALLOC_FUZZ_PLUGIN);
  if (library == nullptr) {
    check_message(error.status);
    return 0;
  }
  auto [plugin, create_error] = devalloc::Plugin::create(library, {});
  if (plugin == nullptr) {
    check_message(create_error.status);
    return 0;
  }
  // What a listing prints of each device.
  for (const devalloc::DeviceInfo& device : plugin->devices()) {
    (void)devalloc::quote(device.name);
    (void)devalloc::quote(device.pci_bus_id);
    (void)device.uuid_string();
  }
  return 0;
}
