#include "json_parse.hpp"

#include <set>
#include <vector>

namespace devalloc::detail {

namespace {

// Where the parser is: one frame per open object or array.
struct Frame {
  std::string pointer;
  bool is_array = false;
  size_t next_index = 0;       // arrays: index of the next element
  std::string key;             // objects: the key being read
  std::set<std::string> keys;  // objects: keys seen so far
};

std::string child_pointer(const Frame& parent) {
  return parent.pointer + "/" +
         (parent.is_array ? std::to_string(parent.next_index)
                          : json_pointer_token(parent.key));
}

JsonSyntaxError describe(const nlohmann::json::parse_error& error) {
  // what() is "[json.exception.parse_error.101] parse error at line 1,
  // column 2: <reason>".
  std::string text = error.what();
  JsonSyntaxError out;
  out.byte = error.byte;
  const std::string marker = "parse error at ";
  const size_t at = text.find(marker);
  const size_t colon = text.find(": ", at == std::string::npos ? 0 : at);
  if (at != std::string::npos && colon != std::string::npos) {
    out.position = text.substr(at + marker.size(), colon - at - marker.size());
    out.reason = text.substr(colon + 2);
  } else {
    out.position = "byte " + std::to_string(error.byte);
    out.reason = text;
  }
  return out;
}

}  // namespace

std::string json_pointer_token(std::string_view key) {
  std::string token;
  for (char c : key) {
    if (c == '~') {
      token += "~0";
    } else if (c == '/') {
      token += "~1";
    } else {
      token += c;
    }
  }
  return token;
}

std::variant<ParsedJson, JsonSyntaxError> parse_json(std::string_view text) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<Frame> frames;
  std::optional<DuplicateKey> duplicate;

  const auto element_done = [&] {
    if (!frames.empty() && frames.back().is_array) ++frames.back().next_index;
  };
  auto callback = [&](int /*depth*/, Event event, nlohmann::json& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start: {
        Frame frame;
        frame.pointer = frames.empty() ? std::string() : child_pointer(frames.back());
        frame.is_array = event == Event::array_start;
        frames.push_back(std::move(frame));
        break;
      }
      case Event::object_end:
      case Event::array_end:
        frames.pop_back();
        element_done();
        break;
      case Event::key: {
        Frame& frame = frames.back();
        frame.key = parsed.get<std::string>();
        if (!frame.keys.insert(frame.key).second && !duplicate) {
          duplicate = DuplicateKey{frame.pointer, frame.key};
        }
        break;
      }
      case Event::value:
        element_done();
        break;
    }
    return true;
  };

  try {
    ParsedJson parsed;
    parsed.value = nlohmann::json::parse(text.begin(), text.end(), callback);
    parsed.duplicate = std::move(duplicate);
    return parsed;
  } catch (const nlohmann::json::parse_error& error) {
    return describe(error);
  }
}

}  // namespace devalloc::detail
