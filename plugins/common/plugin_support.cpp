#include "plugin_support.hpp"

#include <cstdio>
#include <cstring>

namespace devalloc::plugin {

devalloc_status fail(devalloc_error* error, devalloc_status status,
                     const char* format, ...) {
  if (error != nullptr &&
      error->struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_error, message)) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(error->message, sizeof error->message, format, args);
    va_end(args);
  }
  return status;
}

std::string vformat(const char* format, va_list args) {
  va_list measure;
  va_copy(measure, args);
  const int length = std::vsnprintf(nullptr, 0, format, measure);
  va_end(measure);
  if (length <= 0) return {};
  std::string text(static_cast<size_t>(length), '\0');
  std::vsnprintf(text.data(), text.size() + 1, format, args);
  return text;
}

std::string format(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::string text = vformat(format, args);
  va_end(args);
  return text;
}

devalloc_status negotiate_v1(devalloc_negotiation* n, devalloc_error* error,
                             const devalloc_plugin_api_v1* api) {
  if (!has_size(n, n ? n->struct_size : 0,
                DEVALLOC_STRUCT_SIZE(devalloc_negotiation, api))) {
    return fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                "devalloc_plugin_negotiate: negotiation struct is NULL or "
                "smaller than %zu bytes",
                DEVALLOC_STRUCT_SIZE(devalloc_negotiation, api));
  }
  n->plugin_major = DEVALLOC_ABI_VERSION_MAJOR;
  n->plugin_minor = DEVALLOC_ABI_VERSION_MINOR;
  n->plugin_min_major = DEVALLOC_ABI_VERSION_MAJOR;
  n->api = nullptr;
  if (n->host_min_major > DEVALLOC_ABI_VERSION_MAJOR ||
      n->host_max_major < DEVALLOC_ABI_VERSION_MAJOR) {
    return fail(error, DEVALLOC_STATUS_UNSUPPORTED,
                "plugin %s speaks ABI major %u only; host speaks %u..%u",
                api->plugin_name, DEVALLOC_ABI_VERSION_MAJOR,
                n->host_min_major, n->host_max_major);
  }
  n->api = api;
  return DEVALLOC_STATUS_OK;
}

Options::Options(const devalloc_create_args& args) {
  if (args.option_count > 0 &&
      (args.option_keys == nullptr || args.option_values == nullptr)) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "create: option_count > 0 with NULL option arrays"};
  }
  for (size_t i = 0; i < args.option_count; ++i) {
    if (args.option_keys[i] == nullptr || args.option_values[i] == nullptr) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                    "create: option " + std::to_string(i) + " is NULL"};
    }
    entries_.emplace_back(args.option_keys[i], args.option_values[i]);
  }
}

bool Options::take(std::string_view key, std::string& value) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->first == key) {
      value = std::move(it->second);
      entries_.erase(it);
      return true;
    }
  }
  return false;
}

bool Options::take_bool(std::string_view key, bool fallback) {
  std::string v;
  if (!take(key, v)) return fallback;
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                "option " + std::string(key) + " = \"" + v +
                    "\": expected true or false"};
}

uint64_t Options::take_u64(std::string_view key, uint64_t fallback) {
  std::string v;
  if (!take(key, v)) return fallback;
  uint64_t result = 0;
  bool ok = !v.empty() && v.size() <= 20;
  for (char c : v) {
    if (c < '0' || c > '9' || result > (UINT64_MAX - 9) / 10) {
      ok = false;
      break;
    }
    result = result * 10 + static_cast<uint64_t>(c - '0');
  }
  if (!ok) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "option " + std::string(key) + " = \"" + v +
                      "\": expected a non-negative integer"};
  }
  return result;
}

void Options::reject_unknown(const char* plugin_name,
                             const char* accepted) const {
  if (entries_.empty()) return;
  std::string keys;
  for (const auto& [k, v] : entries_) {
    if (!keys.empty()) keys += ", ";
    keys += "\"" + k + "\"";
  }
  throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                std::string("plugin ") + plugin_name + ": unknown option " +
                    keys + " (accepted: " + accepted + ")"};
}

void AllocationTable::insert(uint64_t address, uint64_t nbytes) {
  std::lock_guard lock(mutex_);
  live_[address] = nbytes;
}

bool AllocationTable::erase(uint64_t address, uint64_t* nbytes) {
  std::lock_guard lock(mutex_);
  auto it = live_.find(address);
  if (it == live_.end()) return false;
  if (nbytes != nullptr) *nbytes = it->second;
  live_.erase(it);
  return true;
}

bool AllocationTable::contains(uint64_t address, uint64_t nbytes) const {
  std::lock_guard lock(mutex_);
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) return false;
  --it;
  const uint64_t base = it->first, size = it->second;
  if (address - base > size) return false;
  return nbytes <= size - (address - base);
}

std::vector<std::pair<uint64_t, uint64_t>> AllocationTable::all() const {
  std::lock_guard lock(mutex_);
  return {live_.begin(), live_.end()};
}

size_t AllocationTable::size() const {
  std::lock_guard lock(mutex_);
  return live_.size();
}

}  // namespace devalloc::plugin
