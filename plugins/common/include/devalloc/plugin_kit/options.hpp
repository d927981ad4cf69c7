// The key/value options handed to create(), taken one by one; whatever is
// left over is an unknown option (PLUGIN-8).
#pragma once

#include <devalloc/plugin_abi.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace devalloc::plugin {

class Options {
 public:
  // Throws Failure(INVALID_ARGUMENT) on NULL arrays with a non-zero count.
  explicit Options(const devalloc_create_args& args);

  // Removes and returns the value of key, if present.
  bool take(std::string_view key, std::string& value);
  // "true"/"false"/"1"/"0"; throws Failure on anything else.
  bool take_bool(std::string_view key, bool fallback);
  // Decimal unsigned; throws Failure on anything else.
  uint64_t take_u64(std::string_view key, uint64_t fallback);
  // Throws Failure(INVALID_ARGUMENT) naming every key not taken and the
  // accepted ones (PLUGIN-8).
  void reject_unknown(const char* plugin_name, const char* accepted) const;

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

}  // namespace devalloc::plugin
