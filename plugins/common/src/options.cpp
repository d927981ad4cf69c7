#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/options.hpp>

namespace devalloc::plugin {

Options::Options(const devalloc_create_args& args) {
  if (args.option_count > 0 &&
      (args.option_keys == nullptr || args.option_values == nullptr)) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "create: option_count > 0 with NULL option arrays (PLUGIN-8)"};
  }
  for (size_t i = 0; i < args.option_count; ++i) {
    if (args.option_keys[i] == nullptr || args.option_values[i] == nullptr) {
      throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                    "create: option " + std::to_string(i) + " is NULL (PLUGIN-8)"};
    }
    // Which of two values would count is a guess: refused.
    for (const auto& [key, value] : entries_) {
      if (key == args.option_keys[i]) {
        throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                      "create: option \"" + key + "\" is given twice (PLUGIN-8)"};
      }
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
                "option " + std::string(key) + " = \"" + v + "\": expected true or false"};
}

uint64_t Options::take_u64(std::string_view key, uint64_t fallback) {
  std::string v;
  if (!take(key, v)) return fallback;
  uint64_t result = 0;
  bool ok = !v.empty() && v.size() <= 20;
  for (char c : v) {
    const auto digit = static_cast<uint64_t>(c - '0');
    if (c < '0' || c > '9' || result > (UINT64_MAX - digit) / 10) {
      ok = false;  // not a digit, or above 2^64 - 1
      break;
    }
    result = result * 10 + digit;
  }
  if (!ok) {
    throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                  "option " + std::string(key) + " = \"" + v +
                      "\": expected a non-negative integer"};
  }
  return result;
}

void Options::reject_unknown(const char* plugin_name, const char* accepted) const {
  if (entries_.empty()) return;
  std::string keys;
  for (const auto& [k, v] : entries_) {
    if (!keys.empty()) keys += ", ";
    keys += "\"" + k + "\"";
  }
  throw Failure{DEVALLOC_STATUS_INVALID_ARGUMENT,
                std::string("plugin ") + plugin_name + ": unknown option " + keys +
                    " (accepted: " + accepted + ")"};
}

}  // namespace devalloc::plugin
