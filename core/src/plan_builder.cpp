#include <devalloc/core/config.hpp>
#include <devalloc/core/name_index.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "file_check.hpp"
#include "plan_text.hpp"

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

namespace {

// A tensor as build_plan places it.
struct Placed {
  const SafetensorsTensor& source;  // in file `file`
  size_t file;                      // index in the files given
  std::span<const uint64_t> shape;  // the source's, or its slice's
  uint32_t memory_id;
  uint64_t offset;
  const std::optional<PlanSlice>& slice;
};

// build_plan's placement: the files opened, then every tensor placed in
// order. place() is deterministic, so build_and_write_plan runs it twice
// (once for the buffers' sizes, which the file gives before the tensors,
// once to write the rows) instead of holding the tensors.
class Placer {
 public:
  Placer(std::span<const std::filesystem::path> files, const PlanBuildOptions& options,
         Plan& plan)
      : files_(files), options_(options), plan_(plan) {}

  // Opens the files (through options.cache if set), in order, refusing one
  // given twice; sets the plan's allow_external_files and world_size.
  Status open() {
    if (Status status = check_options(options_); !status.ok()) return status;
    Result<std::filesystem::path> folder = resolved(plan_.directory());
    if (!folder.ok()) return folder.status();
    std::map<std::filesystem::path, size_t> seen;  // resolved -> files index
    plan_.world_size = options_.world_size;
    for (size_t f = 0; f < files_.size(); ++f) {
      Result<std::filesystem::path> absolute = resolved(files_[f]);
      if (!absolute.ok()) return absolute.status();
      if (const auto [it, inserted] = seen.emplace(*absolute, f); !inserted) {
        return invalid(path_for_message(files_[f].string()) + ": given twice (also as " +
                       path_for_message(files_[it->second].string()) + ")");
      }
      Result<std::shared_ptr<const SafetensorsFile>> file =
          options_.cache != nullptr ? options_.cache->open(*absolute)
                                    : SafetensorsFile::open(files_[f]);
      if (!file.ok()) return file.status();
      opened_.push_back(*file);
      std::filesystem::path relative = absolute->lexically_relative(*folder);
      if (relative.empty()) relative = *absolute;
      if (*relative.begin() == "..") plan_.allow_external_files = true;
      source_files_.push_back(relative.string());
      tensors_in_files_ += (*file)->tensors().size();
    }
    return Status();
  }

  const std::vector<std::shared_ptr<const SafetensorsFile>>& opened() const { return opened_; }
  // File f as the plan's sources name it: relative to the plan's folder.
  const std::string& source_file(size_t f) const { return source_files_[f]; }
  size_t tensors_in_files() const { return tensors_in_files_; }

  // Places every tensor, calling on_tensor(const Placed&) for each in plan
  // order; the plan's buffers are made anew.
  template <typename OnTensor>
  Status place(OnTensor on_tensor) {
    plan_.buffers.clear();
    placed_.assign(options_.rules.size(), 0);
    sharded_ = 0;
    placed_tensors_ = 0;
    // A plan for one process lists each file's tensors whole, in data
    // order: the rows a load can take without reading the header again.
    digests_.clear();
    rows_in_file_.assign(files_.size(), 0);
    if (options_.world_size == 0) {
      for (size_t f = 0; f < files_.size(); ++f) digests_.emplace_back();
    }
    // "device" or "device#rank" -> buffers index
    std::map<std::string, size_t, std::less<>> buffer_of;
    // Tensor -> files index, for names in two files; the names are those
    // of the opened files. A file's own names are unique
    // (SafetensorsFile::open checks), so one file needs none.
    NameIndex owner;
    const bool several_files = files_.size() > 1;
    for (size_t f = 0; f < files_.size(); ++f) {
      const SafetensorsFile& file = *opened_[f];
      if (several_files) owner.reserve(owner.size() + file.tensors().size());
      for (const SafetensorsTensor& tensor : file.tensors()) {
        if (several_files && !owner.insert(tensor.name, f)) {
          return invalid("tensor " + quote(tensor.name) + " is in both " +
                         path_for_message(files_[*owner.find(tensor.name)].string()) + " and " +
                         path_for_message(files_[f].string()));
        }
        const size_t rule = rule_for(tensor.name, options_);
        if (rule < placed_.size()) ++placed_[rule];
        const std::string& device =
            rule < placed_.size() ? options_.rules[rule].device : options_.default_device;
        // Appends a tensor of `nbytes` to the buffer of (device, rank).
        const auto append = [&](std::optional<uint32_t> rank, std::span<const uint64_t> shape,
                                uint64_t nbytes, const std::optional<PlanSlice>& slice) -> Status {
          const std::string key = device + (rank ? "#" + std::to_string(*rank) : std::string());
          auto [slot, added] = buffer_of.try_emplace(key, plan_.buffers.size());
          if (added) {
            plan_.buffers.push_back(PlanBuffer{static_cast<uint32_t>(plan_.buffers.size()),
                                               device, 0, options_.alignment, rank});
          }
          PlanBuffer& buffer = plan_.buffers[slot->second];
          // Round up to the alignment, then append; both can overflow only
          // for sizes no machine has, but the plan must not wrap silently.
          uint64_t offset = 0;
          uint64_t end = 0;
          if (__builtin_add_overflow(buffer.size, options_.alignment - 1, &offset) ||
              __builtin_add_overflow(offset & ~(options_.alignment - 1), nbytes, &end)) {
            return invalid("buffer for " + quote(device) +
                           " would exceed 2^64 bytes at tensor " + quote(tensor.name));
          }
          offset &= ~(options_.alignment - 1);
          buffer.size = end;
          ++placed_tensors_;
          ++rows_in_file_[f];
          if (!digests_.empty()) digests_[f].add(tensor.name, tensor.dtype, shape);
          on_tensor(Placed{tensor, f, shape, buffer.memory_id, offset, slice});
          return Status();
        };
        const Split split =
            options_.world_size == 0 ? Split{} : split_for(tensor.name, options_);
        if (split.shard != nullptr) {
          // Each rank's slice is an entry of the plan file, which read_plan
          // takes up to kMaxPlanBytes; a slice's row and its place in the
          // methods are at least 100 bytes of text (write_plan refuses a
          // plan past the limit).
          constexpr uint64_t kMostEntries = kMaxPlanBytes / 100;
          if (placed_tensors_ + uint64_t{options_.world_size} > kMostEntries) {
            return invalid("tensor " + quote(tensor.name) + ": cut for " +
                           std::to_string(options_.world_size) +
                           " ranks, the plan would hold more than " +
                           std::to_string(kMostEntries) + " tensors, more than a plan file may (" +
                           std::to_string(kMaxPlanBytes >> 20) + " MiB)");
          }
          Result<std::vector<PlanSlice>> slices =
              slices_for(tensor, *split.shard, options_.world_size, files_[f].string());
          if (!slices.ok()) return slices.status();
          std::vector<uint64_t> shape;
          for (uint32_t r = 0; r < options_.world_size; ++r) {
            Result<SliceLayout> layout =
                slice_layout((*slices)[r], tensor.dtype, tensor.shape, &shape);
            if (!layout.ok()) return layout.status();
            const std::optional<PlanSlice> slice = (*slices)[r];
            if (Status s = append(r, shape, layout->rows * layout->run_bytes, slice); !s.ok()) {
              return s;
            }
          }
          ++sharded_;
        } else if (Status s = append(split.owner, tensor.shape, tensor.nbytes, std::nullopt);
                   !s.ok()) {
          return s;
        }
      }
    }
    return Status();
  }

  // The tensors placed by the last place(): one per rank for a sliced one.
  size_t placed_tensors() const { return placed_tensors_; }

  // After place(), in a plan for one process: each file's check (its
  // header and the digest of its rows), by source file.
  std::map<std::string, PlanFileCheck, std::less<>> file_checks() const {
    std::map<std::string, PlanFileCheck, std::less<>> checks;
    for (size_t f = 0; f < digests_.size(); ++f) {
      if (rows_in_file_[f] == 0) continue;
      const SafetensorsFile& file = *opened_[f];
      const uint64_t header_bytes = file.data_offset() - 8;
      const std::optional<uint64_t> hash = detail::header_hash(*file.mapping(), header_bytes);
      // The hash must be of the header the rows came from: a file cut or
      // rewritten in place since it was opened gets no check (its load
      // reads the header again).
      if (!hash || !file.mapping()->check_unchanged("since it was opened").ok()) continue;
      checks.emplace(source_files_[f], PlanFileCheck{header_bytes, *hash, digests_[f].value()});
    }
    return checks;
  }

  // Calls on_name(name) for each tensor name a method lists, in plan order:
  // a tensor sliced for the ranks is listed once.
  template <typename OnName>
  void method_names(OnName on_name) const {
    for (const auto& file : opened_) {
      for (const SafetensorsTensor& tensor : file->tensors()) on_name(tensor.name);
    }
  }

  void fill_report(PlanBuildReport* report) const {
    if (report == nullptr) return;
    report->unused_rules = unused_rules();
    if (!options_.shards.empty() && sharded_ == 0) {
      report->unused_shard_rules.push_back("shard rules cut no tensor: they match none of the " +
                                           std::to_string(placed_tensors_) + " tensors");
    }
  }

 private:
  // A rule that placed nothing is mostly a glob that misses (a prefix the
  // file does not use): its tensors went to the default device unannounced.
  std::vector<std::string> unused_rules() const {
    std::vector<std::string> lines;
    for (size_t r = 0; r < options_.rules.size(); ++r) {
      if (placed_[r] != 0) continue;
      const PlacementRule& rule = options_.rules[r];
      bool matched = false;
      method_names([&](const std::string& name) { matched = matched || matches(rule, name); });
      lines.push_back(rule_text(rule) + " placed no tensor: " +
                      (matched ? "every tensor it matches was placed by an earlier rule"
                               : "it matches none of the " + std::to_string(placed_tensors_) +
                                     " tensors"));
    }
    return lines;
  }

  std::span<const std::filesystem::path> files_;
  const PlanBuildOptions& options_;
  Plan& plan_;
  std::vector<std::shared_ptr<const SafetensorsFile>> opened_;
  std::vector<std::string> source_files_;
  size_t tensors_in_files_ = 0;
  std::vector<detail::RowsDigest> digests_;  // by file; none for ranks
  std::vector<size_t> rows_in_file_;
  std::vector<size_t> placed_;  // tensors per rule
  uint64_t sharded_ = 0;        // tensors a shard rule cut
  size_t placed_tensors_ = 0;
};

// Every method uses every buffer of the plan.
std::vector<uint32_t> all_memory_ids(const Plan& plan) {
  std::vector<uint32_t> ids;
  for (const PlanBuffer& buffer : plan.buffers) ids.push_back(buffer.memory_id);
  return ids;
}

}  // namespace

static Result<Plan> build_plan_or_throw(std::span<const std::filesystem::path> files,
                                        const std::filesystem::path& plan_path,
                                        const PlanBuildOptions& options,
                                        PlanBuildReport* report) {
  Plan plan;
  plan.path = plan_path;
  Placer placer(files, options, plan);
  if (Status s = placer.open(); !s.ok()) return s;
  reserve_on_huge_pages(plan.tensors, placer.tensors_in_files());
  if (Status s = placer.place([&](const Placed& t) {
        plan.tensors.push_back(PlanTensor{
            t.source.name, t.source.dtype, std::vector<uint64_t>(t.shape.begin(), t.shape.end()),
            t.memory_id, t.offset, PlanSource{placer.source_file(t.file), t.source.name, t.slice}});
      });
      !s.ok()) {
    return s;
  }
  for (const std::string& name : options.methods) {
    PlanMethod method{name, all_memory_ids(plan), {}};
    method.tensors.reserve(placer.tensors_in_files());
    placer.method_names([&](const std::string& tensor) { method.tensors.push_back(tensor); });
    plan.methods.push_back(std::move(method));
  }
  plan.file_checks = placer.file_checks();
  placer.fill_report(report);
  return plan;
}

static Result<PlanWritten> build_and_write_plan_or_throw(
    std::span<const std::filesystem::path> files, const std::filesystem::path& plan_path,
    const PlanBuildOptions& options, PlanBuildReport* report) {
  PlanWritten written;
  Plan& plan = written.plan;
  plan.path = plan_path;
  Placer placer(files, options, plan);
  if (Status s = placer.open(); !s.ok()) return s;
  // The first pass: the buffers' sizes and the files table (each file in
  // the order its first tensor is placed, as write_plan lists them).
  detail::PlanFiles table;
  if (Status s = placer.place([&](const Placed& t) {
        table.add(placer.source_file(t.file), t.source.name);
      });
      !s.ok()) {
    return s;
  }
  written.tensors = placer.placed_tensors();
  plan.file_checks = placer.file_checks();
  written.tensors_per_buffer.assign(plan.buffers.size(), 0);
  for (const std::string& name : options.methods) {
    plan.methods.push_back(PlanMethod{name, all_memory_ids(plan), {}});
  }
  // The second pass places as the first did, and writes each tensor.
  const std::vector<PlanBuffer> buffers = plan.buffers;
  Status s = detail::write_plan_text(
      plan_path, plan.allow_external_files, plan.world_size, table, plan.file_checks, buffers,
      [&](const auto& emit) {
        return placer.place([&](const Placed& t) {
          ++written.tensors_per_buffer[t.memory_id];
          emit(detail::PlanRow{t.source.name, t.source.dtype, t.shape, t.memory_id, t.offset,
                               detail::PlanRowSource{placer.source_file(t.file), t.source.name,
                                                     t.slice}});
        });
      },
      plan.methods.size(),
      [&](detail::JsonText& out, size_t i, const auto& flush) {
        const PlanMethod& method = plan.methods[i];
        detail::append_method_start(out, method.name, method.memory_ids);
        size_t k = 0;
        placer.method_names([&](const std::string& tensor) {
          detail::append_method_tensor(out, method.name, k, tensor);
          if (++k % 4096 == 0) flush();
        });
        detail::append_method_end(out);
      });
  if (!s.ok()) return s;
  placer.fill_report(report);
  return written;
}

Result<Plan> build_plan(std::span<const std::filesystem::path> files,
                        const std::filesystem::path& plan_path,
                        const PlanBuildOptions& options, PlanBuildReport* report) {
  return detail::catch_as_status(
      [&] { return build_plan_or_throw(files, plan_path, options, report); },
      detail::file_failure(plan_path, "building the plan"));
}

Result<PlanWritten> build_and_write_plan(std::span<const std::filesystem::path> files,
                                         const std::filesystem::path& plan_path,
                                         const PlanBuildOptions& options,
                                         PlanBuildReport* report) {
  return detail::catch_as_status(
      [&] { return build_and_write_plan_or_throw(files, plan_path, options, report); },
      detail::file_failure(plan_path, "writing the plan"));
}

}  // namespace devalloc
