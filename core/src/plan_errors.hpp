// How plan errors name their place: "<plan file>: <JSON pointer> ...: <reason>".
#pragma once

#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>

#include <string>

namespace devalloc::detail {

// "/tensors/4 \"blk.0.attn.weight\"", "/methods/1 \"decode\"".
inline std::string named_place(const char* section, size_t index, const std::string& name) {
  return "/" + std::string(section) + "/" + std::to_string(index) + " " + quote(name);
}

// The plan's file as messages name it; a plan built in code may have none.
inline std::string plan_name(const Plan& plan) {
  return plan.path.empty() ? "plan (no file)" : path_for_message(plan.path.string());
}

inline Status plan_error(const Plan& plan, const std::string& place, const std::string& reason) {
  return Status(StatusCode::invalid_argument,
                plan_name(plan) + ": " + (place.empty() ? "" : place + ": ") + reason);
}

// Plan::source_path with errors placed at `place` (may be empty).
Result<std::filesystem::path> resolve_source(const Plan& plan, const PlanSource& source,
                                             const std::string& place);

}  // namespace devalloc::detail
