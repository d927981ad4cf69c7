// Strict JSON parsing shared by the safetensors and plan readers:
// nlohmann::json keeps the last of two equal keys, which would let a file say
// two things at once; this parser reports the first duplicate instead.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace devalloc::detail {

struct JsonSyntaxError {
  uint64_t byte = 0;     // 1-based index of the last byte read
  std::string position;  // "line 3, column 14"
  std::string reason;    // "syntax error while parsing value - ..."
};

struct DuplicateKey {
  std::string object_pointer;  // JSON pointer of the object: "/tensors/3"
  std::string key;
};

struct ParsedJson {
  nlohmann::json value;
  std::optional<DuplicateKey> duplicate;  // the first one in document order
};

std::variant<ParsedJson, JsonSyntaxError> parse_json(std::string_view text);

// A key as one JSON pointer reference token ("~" -> "~0", "/" -> "~1").
std::string json_pointer_token(std::string_view key);

}  // namespace devalloc::detail
