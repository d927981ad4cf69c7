#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>

#include "plan_errors.hpp"
#include "tensors_by_name.hpp"

#include <algorithm>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <unordered_map>

namespace devalloc {

namespace {

using detail::plan_error;

// True when `path` is `folder` or lies below it; both absolute and normal.
bool is_within(const std::filesystem::path& path, const std::filesystem::path& folder) {
  const std::filesystem::path relative = path.lexically_relative(folder);
  return !relative.empty() && *relative.begin() != "..";
}

}  // namespace

std::filesystem::path Plan::directory() const {
  const std::filesystem::path parent = path.parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

Result<std::filesystem::path> Plan::source_path(const PlanSource& source) const {
  return detail::resolve_source(*this, source, "");
}

Result<std::filesystem::path> detail::resolve_source(const Plan& plan, const PlanSource& source,
                                                     const std::string& place,
                                                     bool external_files,
                                                     std::filesystem::path* beneath) {
  const std::string& name = source.file;
  const std::string quoted = quote(name);
  if (name.empty()) return plan_error(plan, place, "source file is empty");
  const std::filesystem::path file(name);
  const bool external = plan.allow_external_files && external_files;
  // The plan asks for files outside its folder, and the caller refuses it.
  const std::string refused =
      plan.allow_external_files && !external_files
          ? "; the plan sets \"allow_external_files\", which this runtime does not honour "
            "([load] external_files = false)"
          : "";
  if (file.is_absolute() && !external) {
    return plan_error(plan, place,
                      "source file " + quoted +
                          " is absolute; source files are relative to the plan's folder" +
                          (refused.empty() ? " unless \"allow_external_files\" is true"
                                           : refused));
  }
  std::error_code error;
  std::filesystem::path folder = std::filesystem::absolute(plan.directory(), error);
  if (!error) folder = std::filesystem::weakly_canonical(folder, error);
  if (error) {
    return plan_error(plan, place, "cannot resolve the plan's folder: " + error.message(),
                      path_error_code(error));
  }
  const std::filesystem::path resolved =
      std::filesystem::weakly_canonical(file.is_absolute() ? file : folder / file, error);
  if (error) {
    return plan_error(plan, place, "cannot resolve source file " + quoted + ": " + error.message(),
                      path_error_code(error));
  }
  if (!external && !is_within(resolved, folder)) {
    return plan_error(plan, place,
                      "source file " + quoted + " resolves to " +
                          path_for_message(resolved.string()) + ", outside the plan's folder " +
                          path_for_message(folder.string()) +
                          (refused.empty() ? " (set \"allow_external_files\": true to allow this)"
                                           : refused));
  }
  if (beneath != nullptr) *beneath = external ? std::filesystem::path() : folder;
  return resolved;
}

Result<PlanSelection> Plan::tensors_for_methods(
    std::span<const std::string> method_names) const {
  // Methods mostly list the plan's tensors in plan order (a repeated name,
  // which validate_plan refuses, may select a later tensor of that name as
  // well as the first; nothing else depends on it).
  detail::TensorsByName by_name(*this);
  std::set<uint32_t> known_ids;
  for (const PlanBuffer& buffer : buffers) known_ids.insert(buffer.memory_id);

  // Methods by name, the first of each (as a scan would find it): a load
  // of every method names them all, and a scan per name took time squared
  // in the methods (minutes for a plan of 200 000).
  std::unordered_map<std::string_view, const PlanMethod*> method_index;
  method_index.reserve(methods.size());
  for (const PlanMethod& m : methods) method_index.emplace(m.name, &m);

  std::set<uint32_t> memory_ids;
  std::vector<char> selected(tensors.size(), 0);
  for (const std::string& name : method_names) {
    const auto listed = method_index.find(name);
    if (listed == method_index.end()) {
      // The first few and the count: a plan may have a million methods.
      std::string known;
      for (size_t k = 0; k < methods.size() && k < detail::kShownIds; ++k) {
        known += (known.empty() ? "" : ", ") + quote(methods[k].name);
      }
      if (methods.size() > detail::kShownIds) {
        known += ", ... (" + std::to_string(methods.size()) + " in all)";
      }
      return plan_error(*this, "", "no method " + quote(name) + " (methods: " +
                                   (known.empty() ? "none" : known) + ")");
    }
    const PlanMethod* method = listed->second;
    for (uint32_t id : method->memory_ids) {
      if (known_ids.count(id) == 0) {
        return plan_error(*this, "", "method " + quote(name) + " uses memory id " +
                                     std::to_string(id) + ", which has no buffer");
      }
      memory_ids.insert(id);
    }
    size_t guess = 0;
    for (const std::string& tensor : method->tensors) {
      const std::optional<size_t> found = by_name.find(tensor, guess);
      if (!found) {
        return plan_error(*this, "", "method " + quote(name) + " lists tensor " + quote(tensor) +
                                     ", which is not in the plan");
      }
      selected[*found] = 1;
      guess = *found + 1;
    }
  }

  PlanSelection selection;
  selection.memory_ids.assign(memory_ids.begin(), memory_ids.end());
  const size_t count = static_cast<size_t>(std::count(selected.begin(), selected.end(), 1));
  selection.tensors.reserve(count);
  selection.constants.reserve(count);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (selected[i] == 0) continue;
    selection.tensors.push_back(i);
    if (tensors[i].is_constant()) selection.constants.push_back(i);
  }
  return selection;
}

}  // namespace devalloc
