// The source files of a plan, each resolved once: resolving walks the file
// system, and a plan of 100 000 tensors names a handful of files. Tensors
// mostly name the file of the tensor before, so that one is compared first.
// Used by needs_of (to resolved paths) and validate_plan (to opened files);
// both open the files beneath() the plan's folder when they must lie in it.
#pragma once

#include <devalloc/core/plan.hpp>

#include "plan_errors.hpp"

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc::detail {

class SourceFiles {
 public:
  // `plan` must outlive this, unchanged: names are kept as views into it.
  // external_files: as resolve_source's.
  explicit SourceFiles(const Plan& plan, bool external_files = true)
      : plan_(plan), external_files_(external_files) {}

  // The number of `source`'s file: 0, 1, ... in order of first use, so a
  // number equal to the count before the call is a file seen first now. It
  // is resolved then (Plan::source_path), with errors placed at place(),
  // which is called only for an error.
  template <class Place>
  Result<size_t> id_of(const PlanSource& source, const Place& place) {
    if (!paths_.empty() && source.file == last_name_) return last_id_;
    auto known = ids_.find(source.file);
    if (known == ids_.end()) {
      Result<std::filesystem::path> path =
          resolve_source(plan_, source, place(), external_files_, &beneath_);
      if (!path.ok()) return path.status();
      paths_.push_back(std::move(*path));
      known = ids_.emplace(source.file, paths_.size() - 1).first;
    }
    last_name_ = source.file;
    last_id_ = known->second;
    return last_id_;
  }

  // Resolved paths, by number.
  const std::vector<std::filesystem::path>& paths() const { return paths_; }
  std::vector<std::filesystem::path> take_paths() { return std::move(paths_); }
  // The folder to open them beneath (MappedFile::open), once one is
  // resolved: the plan's, or empty when files outside it are allowed.
  const std::filesystem::path& beneath() const { return beneath_; }

 private:
  const Plan& plan_;
  const bool external_files_;
  std::map<std::string_view, size_t> ids_;
  std::string_view last_name_;
  size_t last_id_ = 0;
  std::vector<std::filesystem::path> paths_;
  std::filesystem::path beneath_;
};

}  // namespace devalloc::detail
