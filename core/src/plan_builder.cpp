#include <devalloc/core/config.hpp>
#include <devalloc/core/name_index.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include <fnmatch.h>

#include <map>
#include <set>
#include <system_error>
#include <vector>

namespace devalloc {

namespace {

Status invalid(const std::string& message) {
  return Status(StatusCode::invalid_argument, message);
}

std::string rule_text(const PlacementRule& rule) {
  return "placement rule " + quote(rule.pattern + "=" + rule.device);
}

Status check_device(std::string_view device, const std::string& context) {
  if (parse_device_tag(device)) return Status();
  return invalid(context + ": " + quote(device) +
                 " is not a device tag (\"name\" or \"name:index\" of at most " +
                 std::to_string(kMaxDeviceTagBytes) + " bytes, e.g. \"cuda:0\")");
}

Status check_options(const PlanBuildOptions& options) {
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return invalid("alignment " + std::to_string(options.alignment) +
                   " is not a power of two");
  }
  if (Status status = check_device(options.default_device, "default device"); !status.ok()) {
    return status;
  }
  for (const PlacementRule& rule : options.rules) {
    const std::string context = rule_text(rule);
    if (rule.pattern.empty()) return invalid(context + ": empty glob");
    if (Status status = check_device(rule.device, context); !status.ok()) return status;
  }
  if (options.methods.empty()) return invalid("a plan needs at least one method");
  std::set<std::string_view> methods;
  for (const std::string& method : options.methods) {
    if (method.empty()) return invalid("empty method name");
    if (const auto why = check_text(method)) {
      return invalid("method name " + quote(method) + " " + *why);
    }
    if (method.size() > kMaxPlanNameBytes) {
      return invalid("method name " + quote(method) + " is longer than a name may be (" +
                     std::to_string(kMaxPlanNameBytes) + " bytes)");
    }
    if (!methods.insert(method).second) {
      return invalid("method " + quote(method) + " given twice");
    }
  }
  return Status();
}

bool matches(const PlacementRule& rule, const std::string& tensor) {
  return ::fnmatch(rule.pattern.c_str(), tensor.c_str(), 0) == 0;
}

// The index of the first rule that matches, or rules.size() for the default.
size_t rule_for(const std::string& tensor, const PlanBuildOptions& options) {
  for (size_t r = 0; r < options.rules.size(); ++r) {
    if (matches(options.rules[r], tensor)) return r;
  }
  return options.rules.size();
}

// A rule that placed nothing is mostly a glob that misses (a prefix the
// file does not use): its tensors went to the default device unannounced.
std::vector<std::string> unused_rules(const Plan& plan, const PlanBuildOptions& options,
                                      const std::vector<size_t>& placed) {
  std::vector<std::string> lines;
  for (size_t r = 0; r < options.rules.size(); ++r) {
    if (placed[r] != 0) continue;
    const PlacementRule& rule = options.rules[r];
    bool matched = false;
    for (size_t t = 0; t < plan.tensors.size() && !matched; ++t) {
      matched = matches(rule, plan.tensors[t].name);
    }
    lines.push_back(rule_text(rule) + " placed no tensor: " +
                    (matched ? "every tensor it matches was placed by an earlier rule"
                             : "it matches none of the " + std::to_string(plan.tensors.size()) +
                                   " tensors"));
  }
  return lines;
}

Result<std::filesystem::path> resolved(const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::path out = std::filesystem::absolute(path, error);
  if (!error) out = std::filesystem::weakly_canonical(out, error);
  if (error) {
    return invalid(path_for_message(path.string()) + ": cannot resolve: " + error.message());
  }
  return out;
}

}  // namespace

Result<PlacementRule> parse_placement_rule(std::string_view text) {
  const size_t equals = text.rfind('=');
  const std::string context = "placement rule " + quote(text);
  if (equals == std::string_view::npos) {
    return invalid(context + ": expected GLOB=DEVICE, e.g. 'blk.*=cuda:0'");
  }
  PlacementRule rule{std::string(text.substr(0, equals)), std::string(text.substr(equals + 1))};
  if (rule.pattern.empty()) return invalid(context + ": empty glob");
  if (Status status = check_device(rule.device, context); !status.ok()) return status;
  return rule;
}

static Result<Plan> build_plan_or_throw(std::span<const std::filesystem::path> files,
                                        const std::filesystem::path& plan_path,
                                        const PlanBuildOptions& options,
                                        PlanBuildReport* report) {
  if (Status status = check_options(options); !status.ok()) return status;
  Plan plan;
  plan.path = plan_path;
  Result<std::filesystem::path> folder = resolved(plan.directory());
  if (!folder.ok()) return folder.status();

  std::map<std::filesystem::path, size_t> seen_files;     // resolved -> files index
  // Tensor -> files index, for names in two files; the names are those of
  // the opened files, which stay open until the plan is built. A file's own
  // names are unique (SafetensorsFile::open checks), so one file needs none.
  std::vector<std::shared_ptr<const SafetensorsFile>> opened;
  NameIndex owner;
  const bool several_files = files.size() > 1;
  std::map<std::string, size_t, std::less<>> buffer_of;   // device -> buffers index
  std::vector<size_t> placed(options.rules.size());      // tensors per rule
  for (size_t f = 0; f < files.size(); ++f) {
    Result<std::filesystem::path> absolute = resolved(files[f]);
    if (!absolute.ok()) return absolute.status();
    if (const auto [it, inserted] = seen_files.emplace(*absolute, f); !inserted) {
      return invalid(path_for_message(files[f].string()) + ": given twice (also as " +
                     path_for_message(files[it->second].string()) + ")");
    }
    Result<std::shared_ptr<const SafetensorsFile>> file =
        options.cache != nullptr ? options.cache->open(*absolute)
                                 : SafetensorsFile::open(files[f]);
    if (!file.ok()) return file.status();
    opened.push_back(*file);

    std::filesystem::path relative = absolute->lexically_relative(*folder);
    if (relative.empty()) relative = *absolute;
    if (*relative.begin() == "..") plan.allow_external_files = true;
    const std::string source_file = relative.string();

    if (several_files) owner.reserve(owner.size() + (*file)->tensors().size());
    plan.tensors.reserve(plan.tensors.size() + (*file)->tensors().size());
    for (const SafetensorsTensor& tensor : (*file)->tensors()) {
      if (several_files && !owner.insert(tensor.name, f)) {
        return invalid("tensor " + quote(tensor.name) + " is in both " +
                       path_for_message(files[*owner.find(tensor.name)].string()) + " and " +
                       path_for_message(files[f].string()));
      }
      const size_t rule = rule_for(tensor.name, options);
      if (rule < placed.size()) ++placed[rule];
      const std::string& device =
          rule < placed.size() ? options.rules[rule].device : options.default_device;
      auto [slot, added] = buffer_of.try_emplace(device, plan.buffers.size());
      if (added) {
        plan.buffers.push_back(PlanBuffer{static_cast<uint32_t>(plan.buffers.size()), device,
                                          0, options.alignment});
      }
      PlanBuffer& buffer = plan.buffers[slot->second];
      // Round up to the alignment, then append; both can overflow only for
      // sizes no machine has, but the plan must not wrap around silently.
      uint64_t offset = 0;
      uint64_t end = 0;
      if (__builtin_add_overflow(buffer.size, options.alignment - 1, &offset) ||
          __builtin_add_overflow(offset & ~(options.alignment - 1), tensor.nbytes, &end)) {
        return invalid("buffer for " + quote(device) + " would exceed 2^64 bytes at tensor " +
                       quote(tensor.name));
      }
      offset &= ~(options.alignment - 1);
      buffer.size = end;
      plan.tensors.push_back(PlanTensor{tensor.name, tensor.dtype, tensor.shape,
                                        buffer.memory_id, offset,
                                        PlanSource{source_file, tensor.name}});
    }
  }

  for (const std::string& name : options.methods) {
    PlanMethod method;
    method.name = name;
    for (const PlanBuffer& buffer : plan.buffers) method.memory_ids.push_back(buffer.memory_id);
    method.tensors.reserve(plan.tensors.size());
    for (const PlanTensor& tensor : plan.tensors) method.tensors.push_back(tensor.name);
    plan.methods.push_back(std::move(method));
  }
  if (report != nullptr) report->unused_rules = unused_rules(plan, options, placed);
  return plan;
}

Result<Plan> build_plan(std::span<const std::filesystem::path> files,
                        const std::filesystem::path& plan_path,
                        const PlanBuildOptions& options, PlanBuildReport* report) {
  return detail::catch_as_status(
      [&] { return build_plan_or_throw(files, plan_path, options, report); },
      detail::file_failure(plan_path, "building the plan"));
}

}  // namespace devalloc
