// Strict, bounded JSON parsing shared by the safetensors and plan readers.
//
// A purpose-written reader rather than nlohmann's own parser, because input
// files come from strangers: time and memory are linear in the text, nesting
// is capped before it is entered (no recursion anywhere), the first key that
// appears twice in an object is an error (nlohmann keeps the last, which would
// let a file say two things at once), a number that is not a finite double is
// an error, not an exception, and every error carries line:column. The result
// is an nlohmann::json value, which the readers walk.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace devalloc::detail {

struct DuplicateKey {
  std::string object_pointer;  // JSON pointer of the object: "/tensors/3"
  std::string key;
};

struct JsonError {
  uint64_t byte = 0;    // 0-based offset in the text of the byte at fault
  uint64_t line = 1;    // 1-based
  uint64_t column = 1;  // 1-based, in bytes
  std::string reason;   // "expected ',' or '}' after an object member"
  // Set when the error is a key that appears twice in one object.
  std::optional<DuplicateKey> duplicate;

  // "line 3, column 14"
  std::string position() const;
};

// Parses one JSON value followed by nothing but whitespace. Containers may
// nest at most max_depth deep (the root object or array is depth 1; scalars
// add none). Strings must be valid UTF-8 without NUL (raw or "\u0000").
std::variant<nlohmann::json, JsonError> parse_json(std::string_view text,
                                                   size_t max_depth);

// Called with each member of a streamed root object, in text order; returns
// false to stop reading.
using MemberHandler = std::function<bool(const std::string& key, nlohmann::json&& value)>;

// parse_json for a text whose root is an object of many members (a
// safetensors header of 100 000 tensors): each member's value is built on
// its own, handed to on_member as soon as it is complete, and dropped, so
// the whole is never one document and never one map. The rules and errors
// are parse_json's, a root key that appears twice included (reported before
// its value is read). Returns monostate when the object was read to the end
// of the text or on_member stopped it; the root value itself when it is not
// an object; a JsonError otherwise, also for an error after members were
// handed over.
std::variant<std::monostate, nlohmann::json, JsonError> parse_json_members(
    std::string_view text, size_t max_depth, const MemberHandler& on_member);

// `value` as compact JSON for a message: ASCII only (anything else is a \u
// escape, so it is safe on a terminal) and cut after kMaxQuotedBytes bytes,
// saying how long it was: [1,2,3,...] (10000001 bytes).
std::string json_excerpt(const nlohmann::json& value);

// A key as one JSON pointer reference token ("~" -> "~0", "/" -> "~1").
std::string json_pointer_token(std::string_view key);

}  // namespace devalloc::detail
