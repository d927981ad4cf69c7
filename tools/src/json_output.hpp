// The commands' --json output.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace devalloc::cli {

// Indented JSON that is valid UTF-8 whatever its strings hold: a plugin's
// device name or version may carry any bytes, and a byte that is not UTF-8
// becomes U+FFFD instead of failing the whole output. Control characters
// are written as \u00XX escapes, so nothing reaches a terminal raw.
inline std::string json_text(const nlohmann::json& value) {
  return value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace devalloc::cli
