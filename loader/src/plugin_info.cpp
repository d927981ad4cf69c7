// Texts and helpers of the plugin handle's public types (plugin.hpp).
#include <devalloc/plugin.hpp>

#include <cstdio>

namespace devalloc {

const char* to_string(PluginOutcome outcome) {
  switch (outcome) {
    case PluginOutcome::loaded: return "loaded";
    case PluginOutcome::not_found: return "not found";
    case PluginOutcome::open_failed: return "cannot be opened";
    case PluginOutcome::no_entry_point: return "no entry point";
    case PluginOutcome::negotiation_failed: return "negotiation failed";
    case PluginOutcome::version_mismatch: return "ABI version mismatch";
    case PluginOutcome::table_too_small: return "function table too small";
    case PluginOutcome::create_failed: return "create failed";
    case PluginOutcome::shadowed: return "shadowed";
    case PluginOutcome::untrusted: return "untrusted";
  }
  return "unknown";
}

bool DeviceInfo::has_uuid() const {
  for (uint8_t b : uuid) {
    if (b != 0) return true;
  }
  return false;
}

std::string DeviceInfo::uuid_string() const {
  char text[37];
  const uint8_t* u = uuid.data();
  std::snprintf(text, sizeof text,
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
                "%02x%02x%02x%02x%02x%02x",
                u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9],
                u[10], u[11], u[12], u[13], u[14], u[15]);
  return text;
}

}  // namespace devalloc
