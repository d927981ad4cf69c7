// The promise of every call that returns a Status or a Result: no exception
// leaves it. What the code under such a call may throw (an allocation that
// fails, std::system_error, a library's own exception) becomes a Status.
#pragma once

#include <devalloc/input_text.hpp>
#include <devalloc/status.hpp>

#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace devalloc::detail {

// Runs work(), a callable returning Status or Result<T>. An exception out of
// it becomes the Status that describe(code, what) words: code is
// out_of_host_memory for std::bad_alloc, else internal; `what` is the
// exception's what() (empty for std::bad_alloc and for what is no
// std::exception). If wording the message fails too, the Status has the
// code alone.
template <class Work, class Describe>
auto catch_as_status(Work&& work, Describe&& describe) -> decltype(std::forward<Work>(work)()) {
  StatusCode code = StatusCode::internal;
  std::string what;
  try {
    return std::forward<Work>(work)();
  } catch (const std::bad_alloc&) {
    code = StatusCode::out_of_host_memory;
  } catch (const std::exception& error) {
    try {
      what = error.what();
    } catch (...) {
    }
  } catch (...) {
  }
  try {
    return Status(code, describe(code, std::string_view(what)));
  } catch (...) {
    return Status(code, std::string());
  }
}

// "out of host memory", or "internal error: <what>" (without ": <what>"
// when what is empty): the end of the messages below.
inline std::string failure_text(StatusCode code, std::string_view what) {
  if (code == StatusCode::out_of_host_memory) return "out of host memory";
  return "internal error" + (what.empty() ? std::string() : ": " + escaped(what));
}

// catch_as_status for a call that does something: "<doing>: out of host
// memory" or "<doing>: internal error: <what>".
template <class Work>
auto without_exceptions(std::string_view doing, Work&& work) -> decltype(std::forward<Work>(work)()) {
  return catch_as_status(std::forward<Work>(work), [&](StatusCode code, std::string_view what) {
    return std::string(doing) + ": " + failure_text(code, what);
  });
}

// A describe for catch_as_status of a call about a file: "<file>: <doing>:
// out of host memory" or "<file>: <doing>: internal error: <what>". Keeps a
// reference to file.
inline auto file_failure(const std::filesystem::path& file, const char* doing) {
  return [&file, doing](StatusCode code, std::string_view what) {
    return path_for_message(file.string()) + ": " + doing + ": " + failure_text(code, what);
  };
}

// catch_as_status for a reader of a file: "<file>: out of host memory while
// reading <what>" ("the header", "the plan", "the config"). `file` is a
// std::filesystem::path or text, turned into a message only on failure.
template <class File, class Read>
auto without_exceptions(const File& file, std::string_view what_is_read, Read&& read)
    -> decltype(std::forward<Read>(read)()) {
  return catch_as_status(std::forward<Read>(read), [&](StatusCode code, std::string_view what) {
    std::string text;
    if constexpr (std::is_same_v<File, std::filesystem::path>) {
      text = path_for_message(file.string());
    } else {
      text = path_for_message(std::string_view(file));
    }
    if (code == StatusCode::out_of_host_memory) {
      return text + ": out of host memory while reading " + std::string(what_is_read);
    }
    return text + ": internal error while reading " + std::string(what_is_read) +
           (what.empty() ? std::string() : ": " + escaped(what));
  });
}

}  // namespace devalloc::detail
