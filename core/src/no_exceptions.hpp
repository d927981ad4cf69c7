// The readers' promise that no exception leaves them: whatever a hostile file
// makes the code below throw (an allocation that fails, a library's own
// exception) becomes a Status that names the file.
#pragma once

#include <devalloc/input_text.hpp>
#include <devalloc/status.hpp>

#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <utility>

namespace devalloc::detail {

// Runs read(), a callable returning Result<T>. `what` names what was being
// read: "the header", "the plan", "the config".
template <class Read>
auto without_exceptions(std::string_view file, std::string_view what, Read&& read)
    -> decltype(read()) {
  try {
    return std::forward<Read>(read)();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_host_memory, path_for_message(file) +
                                                      ": out of host memory while reading " +
                                                      std::string(what));
  } catch (const std::exception& error) {
    return Status(StatusCode::internal, path_for_message(file) + ": internal error while reading " +
                                            std::string(what) + ": " + escaped(error.what()));
  }
}

}  // namespace devalloc::detail
