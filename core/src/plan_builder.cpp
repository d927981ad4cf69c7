#include <devalloc/core/config.hpp>
#include <devalloc/core/name_index.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include <fnmatch.h>

#include <algorithm>
#include <charconv>
#include <optional>

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

// A plan for several ranks may name a rank's local device: "cuda:local".
Status check_device(std::string_view device, const std::string& context,
                    bool local_allowed = false) {
  if (parse_device_tag(device)) return Status();
  constexpr std::string_view kLocal = ":local";
  if (local_allowed && device.size() > kLocal.size() &&
      device.substr(device.size() - kLocal.size()) == kLocal &&
      parse_device_tag(device.substr(0, device.size() - kLocal.size()))) {
    return Status();
  }
  return invalid(context + ": " + quote(device) +
                 " is not a device tag (\"name\" or \"name:index\" of at most " +
                 std::to_string(kMaxDeviceTagBytes) + " bytes, e.g. \"cuda:0\")");
}

Status check_options(const PlanBuildOptions& options) {
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return invalid("alignment " + std::to_string(options.alignment) +
                   " is not a power of two");
  }
  const bool local = options.world_size != 0;
  if (Status status = check_device(options.default_device, "default device", local);
      !status.ok()) {
    return status;
  }
  for (const PlacementRule& rule : options.rules) {
    const std::string context = rule_text(rule);
    if (rule.pattern.empty()) return invalid(context + ": empty glob");
    if (Status status = check_device(rule.device, context, local); !status.ok()) return status;
  }
  if ((!options.shards.empty() || !options.experts.empty()) && options.world_size == 0) {
    return invalid("shard and expert rules need a world size (--world-size)");
  }
  for (const ShardRule& rule : options.shards) {
    if (!rule.sizes.empty() && rule.sizes.size() != options.world_size) {
      return invalid("shard rule " + quote(rule.pattern) + " states " +
                     std::to_string(rule.sizes.size()) + " sizes for " +
                     std::to_string(options.world_size) + " ranks");
    }
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

// How a tensor is split among ranks: none (every rank places it whole),
// whole to one rank (an expert), or a slice per rank.
struct Split {
  std::optional<uint32_t> owner;           // an expert's rank
  const ShardRule* shard = nullptr;         // a shard rule
};

Split split_for(const std::string& name, const PlanBuildOptions& options) {
  Split split;
  for (const ShardRule& rule : options.shards) {
    if (::fnmatch(rule.pattern.c_str(), name.c_str(), 0) == 0) {
      split.shard = &rule;
      return split;
    }
  }
  for (const std::string& glob : options.experts) {
    if (::fnmatch(glob.c_str(), name.c_str(), 0) != 0) continue;
    // The first number after the glob's fixed prefix: "experts.*" takes 5
    // from "experts.5.w1".
    const size_t prefix = std::min(glob.find_first_of("*?["), name.size());
    const size_t digits = name.find_first_of("0123456789", prefix);
    uint64_t number = 0;
    for (size_t i = digits; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
      number = (number * 10 + static_cast<uint64_t>(name[i] - '0')) % options.world_size;
    }
    split.owner = static_cast<uint32_t>(number % options.world_size);
    return split;
  }
  return split;
}

// The element ranges of each rank along the rule's dimension, or why the
// tensor cannot be split so.
Result<std::vector<PlanSlice>> slices_for(const SafetensorsTensor& tensor, const ShardRule& rule,
                                          uint32_t world_size, const std::string& file) {
  const auto refuse = [&](const std::string& why) -> Result<std::vector<PlanSlice>> {
    return invalid("tensor " + quote(tensor.name) + " in " + path_for_message(file) + " (shape " +
                   shape_to_string(tensor.shape) + "): shard rule " +
                   quote(rule.pattern + "=dim:" + std::to_string(rule.dim)) + ": " + why);
  };
  if (rule.dim >= tensor.shape.size()) {
    return refuse("the tensor has " + std::to_string(tensor.shape.size()) + " dimensions");
  }
  const uint64_t extent = tensor.shape[rule.dim];
  std::vector<PlanSlice> slices;
  uint64_t start = 0;
  for (uint32_t r = 0; r < world_size; ++r) {
    uint64_t length = 0;
    if (rule.sizes.empty()) {
      if (extent % world_size != 0) {
        return refuse("dimension " + std::to_string(rule.dim) + " has " + std::to_string(extent) +
                      " elements, not a multiple of " + std::to_string(world_size) +
                      " ranks; state the split (GLOB=dim:D:S0,S1,...)");
      }
      length = extent / world_size;
    } else {
      length = rule.sizes[r];
    }
    if (length > extent - start) {
      return refuse("the stated sizes exceed the dimension's " + std::to_string(extent) +
                    " elements");
    }
    slices.push_back(PlanSlice{rule.dim, start, length});
    start += length;
  }
  if (start != extent) {
    return refuse("the stated sizes sum to " + std::to_string(start) + ", the dimension has " +
                  std::to_string(extent));
  }
  for (const PlanSlice& s : slices) {
    Result<SliceLayout> layout = slice_layout(s, tensor.dtype, tensor.shape);
    if (!layout.ok()) return refuse(layout.status().message());
  }
  return slices;
}

}  // namespace

Result<ShardRule> parse_shard_rule(std::string_view text) {
  const std::string context = "shard rule " + quote(text);
  const size_t equals = text.rfind('=');
  if (equals == std::string_view::npos || text.substr(equals + 1, 4) != "dim:") {
    return invalid(context + ": expected GLOB=dim:D or GLOB=dim:D:S0,S1,..., e.g. "
                             "'*.q_proj.weight=dim:0'");
  }
  ShardRule rule;
  rule.pattern = std::string(text.substr(0, equals));
  if (rule.pattern.empty()) return invalid(context + ": empty glob");
  std::string_view rest = text.substr(equals + 5);
  const size_t colon = rest.find(':');
  const std::string_view dim = rest.substr(0, colon);
  const auto [dim_end, dim_error] = std::from_chars(dim.data(), dim.data() + dim.size(), rule.dim);
  if (dim.empty() || dim_error != std::errc() || dim_end != dim.data() + dim.size()) {
    return invalid(context + ": the dimension " + quote(dim) + " is not a number");
  }
  if (colon != std::string_view::npos) {
    std::string_view sizes = rest.substr(colon + 1);
    for (;;) {
      const size_t comma = sizes.find(',');
      const std::string_view one = sizes.substr(0, comma);
      uint64_t n = 0;
      const auto [end, error] = std::from_chars(one.data(), one.data() + one.size(), n);
      if (one.empty() || error != std::errc() || end != one.data() + one.size()) {
        return invalid(context + ": size " + quote(one) + " is not a number");
      }
      rule.sizes.push_back(n);
      if (comma == std::string_view::npos) break;
      sizes = sizes.substr(comma + 1);
    }
  }
  return rule;
}

Result<PlacementRule> parse_placement_rule(std::string_view text) {
  const size_t equals = text.rfind('=');
  const std::string context = "placement rule " + quote(text);
  if (equals == std::string_view::npos) {
    return invalid(context + ": expected GLOB=DEVICE, e.g. 'blk.*=cuda:0'");
  }
  PlacementRule rule{std::string(text.substr(0, equals)), std::string(text.substr(equals + 1))};
  if (rule.pattern.empty()) return invalid(context + ": empty glob");
  if (Status status = check_device(rule.device, context, true); !status.ok()) return status;
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
  // "device" or "device#rank" -> buffers index
  std::map<std::string, size_t, std::less<>> buffer_of;
  plan.world_size = options.world_size;
  uint64_t sharded = 0;  // tensors a shard rule cut
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
    reserve_on_huge_pages(plan.tensors, plan.tensors.size() + (*file)->tensors().size());
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
      // Appends a tensor of `nbytes` to the buffer of (device, rank).
      const auto append = [&](std::optional<uint32_t> rank, std::vector<uint64_t> shape,
                              uint64_t nbytes, std::optional<PlanSlice> slice) -> Status {
        const std::string key = device + (rank ? "#" + std::to_string(*rank) : std::string());
        auto [slot, added] = buffer_of.try_emplace(key, plan.buffers.size());
        if (added) {
          plan.buffers.push_back(PlanBuffer{static_cast<uint32_t>(plan.buffers.size()), device,
                                            0, options.alignment, rank});
        }
        PlanBuffer& buffer = plan.buffers[slot->second];
        // Round up to the alignment, then append; both can overflow only
        // for sizes no machine has, but the plan must not wrap silently.
        uint64_t offset = 0;
        uint64_t end = 0;
        if (__builtin_add_overflow(buffer.size, options.alignment - 1, &offset) ||
            __builtin_add_overflow(offset & ~(options.alignment - 1), nbytes, &end)) {
          return invalid("buffer for " + quote(device) + " would exceed 2^64 bytes at tensor " +
                         quote(tensor.name));
        }
        offset &= ~(options.alignment - 1);
        buffer.size = end;
        plan.tensors.push_back(PlanTensor{tensor.name, tensor.dtype, std::move(shape),
                                          buffer.memory_id, offset,
                                          PlanSource{source_file, tensor.name, slice}});
        return Status();
      };
      const Split split =
          options.world_size == 0 ? Split{} : split_for(tensor.name, options);
      if (split.shard != nullptr) {
        // Each rank's slice is an entry of the plan file, which read_plan
        // takes up to kMaxPlanBytes; an entry is at least 100 bytes of text
        // (write_plan refuses a plan past the limit).
        constexpr uint64_t kMostEntries = kMaxPlanBytes / 100;
        if (plan.tensors.size() + uint64_t{options.world_size} > kMostEntries) {
          return invalid("tensor " + quote(tensor.name) + ": cut for " +
                         std::to_string(options.world_size) + " ranks, the plan would hold more "
                         "than " + std::to_string(kMostEntries) +
                         " tensors, more than a plan file may (" +
                         std::to_string(kMaxPlanBytes >> 20) + " MiB)");
        }
        Result<std::vector<PlanSlice>> slices =
            slices_for(tensor, *split.shard, options.world_size, files[f].string());
        if (!slices.ok()) return slices.status();
        for (uint32_t r = 0; r < options.world_size; ++r) {
          std::vector<uint64_t> shape;
          Result<SliceLayout> layout =
              slice_layout((*slices)[r], tensor.dtype, tensor.shape, &shape);
          if (!layout.ok()) return layout.status();
          if (Status s = append(r, std::move(shape), layout->rows * layout->run_bytes,
                                (*slices)[r]);
              !s.ok()) {
            return s;
          }
        }
        ++sharded;
      } else if (Status s = append(split.owner, tensor.shape, tensor.nbytes, std::nullopt);
                 !s.ok()) {
        return s;
      }
    }
  }

  for (const std::string& name : options.methods) {
    PlanMethod method;
    method.name = name;
    for (const PlanBuffer& buffer : plan.buffers) method.memory_ids.push_back(buffer.memory_id);
    method.tensors.reserve(plan.tensors.size());
    // A sharded tensor is in the plan once per rank, and in a method once.
    std::set<std::string_view> listed;
    for (const PlanTensor& tensor : plan.tensors) {
      if (tensor.source && tensor.source->slice && !listed.insert(tensor.name).second) continue;
      method.tensors.push_back(tensor.name);
    }
    plan.methods.push_back(std::move(method));
  }
  if (report != nullptr) {
    report->unused_rules = unused_rules(plan, options, placed);
    if (!options.shards.empty() && sharded == 0) {
      report->unused_shard_rules.push_back("shard rules cut no tensor: they match none of the " +
                                     std::to_string(plan.tensors.size()) + " tensors");
    }
  }
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
