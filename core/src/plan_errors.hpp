// How plan errors name their place: "<plan file>: <JSON pointer> ...: <reason>".
#pragma once

#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>

#include <string>
#include <system_error>

namespace devalloc::detail {

// How many items of a list from the plan (memory ids, method names) a
// message shows before it gives only their count: a plan may hold a
// million of them.
inline constexpr size_t kShownIds = 16;

// "/tensors/4 \"blk.0.attn.weight\"", "/methods/1 \"decode\"".
inline std::string named_place(const char* section, size_t index, const std::string& name) {
  return "/" + std::string(section) + "/" + std::to_string(index) + " " + quote(name);
}

// The plan's file as messages name it; a plan built in code may have none.
inline std::string plan_name(const Plan& plan) {
  return plan.path.empty() ? "plan (no file)" : path_for_message(plan.path.string());
}

// invalid_argument unless the reason is another's failure that keeps its
// own code (a source file that could not be read for want of memory is no
// bad input).
inline Status plan_error(const Plan& plan, const std::string& place, const std::string& reason,
                         StatusCode code = StatusCode::invalid_argument) {
  return Status(code, plan_name(plan) + ": " + (place.empty() ? "" : place + ": ") + reason);
}

// What a failed filesystem call on a plan's paths is: out_of_host_memory
// for ENOMEM, else invalid_argument.
inline StatusCode path_error_code(const std::error_code& error) {
  return error == std::errc::not_enough_memory ? StatusCode::out_of_host_memory
                                               : StatusCode::invalid_argument;
}

// Plan::source_path with errors placed at `place` (may be empty).
// external_files false: the plan's "allow_external_files" is not honoured
// ([load] external_files = false, PlanValidationOptions::external_files).
// *beneath (when not null) is set to the plan's folder (absolute, links
// resolved) when the file must lie in it, else cleared: the file is then
// to be opened beneath it (MappedFile::open), which a link swapped in after
// this check cannot lead out of.
Result<std::filesystem::path> resolve_source(const Plan& plan, const PlanSource& source,
                                             const std::string& place,
                                             bool external_files = true,
                                             std::filesystem::path* beneath = nullptr);

}  // namespace devalloc::detail
