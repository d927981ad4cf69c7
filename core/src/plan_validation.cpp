#include <devalloc/core/config.hpp>
#include <devalloc/core/name_index.hpp>
#include <devalloc/core/job_rank.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "file_check.hpp"
#include "plan_checks.hpp"
#include "plan_errors.hpp"
#include "source_files.hpp"
#include "tensors_by_name.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace devalloc {

namespace {

using detail::named_place;

std::string at_index(const char* section, size_t index) {
  return "/" + std::string(section) + "/" + std::to_string(index);
}

bool is_power_of_two(uint64_t value) { return value != 0 && (value & (value - 1)) == 0; }

class Validator {
 public:
  Validator(const Plan& plan, const PlanValidationOptions& options)
      : plan_(plan), options_(options) {}

  Status run() {
    for (auto step : {&Validator::check_limits, &Validator::check_buffers, &Validator::check_tensors,
                       &Validator::check_overlaps, &Validator::check_methods}) {
      if (Status status = (this->*step)(); !status.ok()) return status;
    }
    return options_.check_sources ? check_sources() : Status();
  }

 private:
  Status error(const std::string& place, const std::string& reason) const {
    return detail::plan_error(plan_, place, reason);
  }
  std::string tensor_place(size_t i) const {
    return named_place("tensors", i, plan_.tensors[i].name);
  }

  // The first kShownIds ids and the count: a plan may have a million
  // buffers, and a message must not repeat them all.
  std::string known_memory_ids() const {
    std::string ids;
    size_t shown = 0;
    for (const auto& [id, unused] : buffer_index_) {
      if (shown == detail::kShownIds) {
        return ids + ", ... (" + std::to_string(buffer_index_.size()) + " in all)";
      }
      ids += (ids.empty() ? "" : ", ") + std::to_string(id);
      ++shown;
    }
    return ids.empty() ? "none" : ids;
  }

  Status check_buffers() {
    for (size_t i = 0; i < plan_.buffers.size(); ++i) {
      const PlanBuffer& buffer = plan_.buffers[i];
      const std::string place = at_index("buffers", i);
      const std::string id = std::to_string(buffer.memory_id);
      const auto [it, inserted] = buffer_index_.emplace(buffer.memory_id, i);
      if (!inserted) {
        return error(place, "memory id " + id + " is also used by " +
                                at_index("buffers", it->second));
      }
      if (!is_power_of_two(buffer.alignment)) {
        return error(place, "alignment " + std::to_string(buffer.alignment) +
                                " of memory id " + id + " is not a power of two");
      }
      if (!parse_device_tag(buffer.device) && !(plan_.world_size != 0 && is_local_tag(buffer.device))) {
        return error(place, "device " + quote(buffer.device) + " of memory id " + id +
                                " is not a device tag (\"name\" or \"name:index\", "
                                "e.g. \"cuda:0\" or \"host\")");
      }
    }
    return Status();
  }

  // Places in messages are made only for the message: a plan of 100 000
  // tensors that is fine builds none of them.
  Status check_tensors() {
    // Names in ascending order in a plan without ranks (as write_plan
    // writes them) are unique: the name index waits for a method that
    // lists its tensors out of plan order.
    names_unique_ =
        std::none_of(plan_.buffers.begin(), plan_.buffers.end(),
                     [](const PlanBuffer& b) { return b.rank.has_value(); }) &&
        std::adjacent_find(plan_.tensors.begin(), plan_.tensors.end(),
                           [](const PlanTensor& a, const PlanTensor& b) {
                             return !(a.name < b.name);
                           }) == plan_.tensors.end();
    if (!names_unique_) tensor_index_.reserve(plan_.tensors.size());
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const PlanTensor& tensor = plan_.tensors[i];
      if (!names_unique_) {
        if (Status s = index_name(i); !s.ok()) return s;
      }
      Result<uint64_t> nbytes = byte_size(tensor.dtype, tensor.shape);
      if (!nbytes.ok()) return error(tensor_place(i), nbytes.status().message());
      const auto buffer = buffer_index_.find(tensor.memory_id);
      if (buffer == buffer_index_.end()) {
        return error(tensor_place(i), "memory id " + std::to_string(tensor.memory_id) +
                                          " has no buffer (memory ids: " + known_memory_ids() +
                                          ")");
      }
      const PlanBuffer& target = plan_.buffers[buffer->second];
      uint64_t end = 0;
      if (__builtin_add_overflow(tensor.offset, *nbytes, &end)) {
        return error(tensor_place(i), "offset " + std::to_string(tensor.offset) + " + " +
                                          std::to_string(*nbytes) + " bytes overflows 64 bits");
      }
      if (end > target.size) {
        return error(tensor_place(i), "ends at byte " + std::to_string(end) + " of buffer " +
                                          std::to_string(target.memory_id) + ", which has " +
                                          std::to_string(target.size) + " bytes");
      }
    }
    return Status();
  }

  Status check_limits() { return detail::check_plan_limits(plan_); }
  Status check_overlaps() { return detail::check_constant_overlaps(plan_); }

  Status check_methods() {
    std::unordered_map<std::string_view, size_t> method_index;
    // The last method that listed each tensor: one array for all methods,
    // so a method listing a tensor twice is found without a set of names.
    std::vector<size_t> listed_by(plan_.tensors.size(), SIZE_MAX);
    for (size_t m = 0; m < plan_.methods.size(); ++m) {
      const PlanMethod& method = plan_.methods[m];
      const std::string place = named_place("methods", m, method.name);
      const auto [it, inserted] = method_index.emplace(method.name, m);
      if (!inserted) {
        return error(place, "name also used by " + at_index("methods", it->second));
      }
      const std::string prefix = at_index("methods", m);
      const std::string who = "method " + quote(method.name);
      std::set<uint32_t> ids;
      std::unordered_set<std::string_view> ranked_listed;
      for (size_t k = 0; k < method.memory_ids.size(); ++k) {
        const uint32_t id = method.memory_ids[k];
        const std::string at = prefix + "/memory_ids/" + std::to_string(k);
        if (buffer_index_.count(id) == 0) {
          return error(at, who + " uses memory id " + std::to_string(id) +
                               ", which has no buffer (memory ids: " + known_memory_ids() +
                               ")");
        }
        if (!ids.insert(id).second) {
          return error(at, who + " lists memory id " + std::to_string(id) + " twice");
        }
      }
      size_t guess = 0;
      for (size_t k = 0; k < method.tensors.size(); ++k) {
        const std::string& name = method.tensors[k];
        const auto at = [&] { return prefix + "/tensors/" + std::to_string(k); };
        const std::optional<size_t> tensor = find_tensor(name, guess);
        if (tensor) guess = *tensor + 1;
        if (!tensor) {
          // A tensor of ranks (a slice or an expert): one per rank that has
          // it, each in one of the method's buffers.
          const auto ranked = ranked_tensors_.find(name);
          if (ranked != ranked_tensors_.end()) {
            if (!ranked_listed.insert(name).second) {
              return error(at(), who + " lists tensor " + quote(name) + " twice");
            }
            for (size_t i : ranked->second) {
              const uint32_t id = plan_.tensors[i].memory_id;
              if (ids.count(id) == 0) {
                return error(at(), who + " uses tensor " + quote(name) + " in memory id " +
                                       std::to_string(id) + ", which is not in its memory_ids");
              }
            }
            continue;
          }
          return error(at(), who + " lists tensor " + quote(name) +
                                 ", which is not in the plan");
        }
        if (listed_by[*tensor] == m) {
          return error(at(), who + " lists tensor " + quote(name) + " twice");
        }
        listed_by[*tensor] = m;
        const uint32_t id = plan_.tensors[*tensor].memory_id;
        if (ids.count(id) == 0) {
          return error(at(), who + " uses tensor " + quote(name) + " in memory id " +
                                 std::to_string(id) + ", which is not in its memory_ids");
        }
      }
    }
    return Status();
  }

  Status check_sources() {
    SafetensorsCache own_cache;
    SafetensorsCache& cache = options_.cache != nullptr ? *options_.cache : own_cache;
    detail::SourceFiles sources(plan_, options_.external_files);
    std::vector<std::shared_ptr<const SafetensorsFile>> opened;  // by source file number
    // A file the plan's check still holds for (file_check.hpp) has its rows
    // as planned from its very header: nothing to compare, no header read.
    std::vector<bool> planned;
    std::optional<detail::RowsByFile> rows;  // made for the first file with a check
    std::vector<uint64_t> offsets;            // planned_offsets' output, unused here
    size_t last_id = 0;
    size_t next_in_file = 0;  // plans mostly list a file's tensors in its order
    for (size_t i = 0; i < plan_.tensors.size(); ++i) {
      const PlanTensor& tensor = plan_.tensors[i];
      if (!tensor.is_constant()) continue;
      const Result<size_t> id = sources.id_of(*tensor.source, [&] { return tensor_place(i); });
      if (!id.ok()) return id.status();
      if (*id == opened.size()) {
        planned.push_back(detail::open_planned(plan_, tensor.source->file, sources.paths()[*id],
                                               sources.beneath(), rows, offsets)
                              .mapping != nullptr);
        if (planned.back()) {
          opened.push_back(nullptr);
        } else {
          Result<std::shared_ptr<const SafetensorsFile>> file =
              cache.open(sources.paths()[*id], sources.beneath());
          if (!file.ok()) {
            return detail::plan_error(plan_, tensor_place(i),
                                      "source file: " + file.status().message(),
                                      file.status().code());
          }
          opened.push_back(std::move(*file));
        }
      }
      if (planned[*id]) continue;
      if (*id != last_id) next_in_file = 0;
      last_id = *id;
      const SafetensorsFile& file = *opened[*id];
      const auto in_file = [&] { return " in " + quote(tensor.source->file); };
      const SafetensorsTensor* source = file.find(tensor.source->key, next_in_file);
      if (source == nullptr) {
        return error(tensor_place(i), "source key " + quote(tensor.source->key) +
                                          " is not" + in_file());
      }
      next_in_file = static_cast<size_t>(source - file.tensors().data()) + 1;
      const auto of_source = [&] { return " of " + quote(source->name) + in_file(); };
      if (source->dtype != tensor.dtype) {
        return error(tensor_place(i), "dtype " + std::string(to_string(tensor.dtype)) +
                                          " differs from " +
                                          std::string(to_string(source->dtype)) + of_source());
      }
      if (const std::optional<PlanSlice>& slice = tensor.source->slice) {
        std::vector<uint64_t> sliced;
        const Result<SliceLayout> layout =
            slice_layout(*slice, source->dtype, source->shape, &sliced);
        if (!layout.ok()) {
          return error(tensor_place(i), "source " + quote(source->name) + in_file() + ": " +
                                            layout.status().message());
        }
        if (sliced != tensor.shape) {
          return error(tensor_place(i), "shape " + shape_to_string(tensor.shape) +
                                            " differs from " + shape_to_string(sliced) +
                                            ", the shape of its slice (" +
                                            slice_to_string(*slice) + ")" + of_source());
        }
      } else if (source->shape != tensor.shape) {
        return error(tensor_place(i), "shape " + shape_to_string(tensor.shape) +
                                          " differs from " + shape_to_string(source->shape) +
                                          of_source());
      }
    }
    return Status();
  }

  // The tensor of that name among the replicated ones.
  std::optional<size_t> find_tensor(const std::string& name, size_t guess) {
    return names_unique_ ? by_name_.find(name, guess) : tensor_index_.find(name);
  }

  // In a plan for several ranks a name is unique within each rank's view:
  // once among the replicated tensors (buffers without a rank), or once per
  // rank among the others, never both.
  Status index_name(size_t i) {
    const PlanTensor& tensor = plan_.tensors[i];
    const auto buffer = buffer_index_.find(tensor.memory_id);
    const std::optional<uint32_t> rank =
        buffer == buffer_index_.end() ? std::nullopt : plan_.buffers[buffer->second].rank;
    const auto also = [&](size_t other) {
      return error(tensor_place(i), "name also used by " + at_index("tensors", other) +
                                        (plan_.world_size != 0 ? " in the same rank's view" : ""));
    };
    if (!rank) {
      if (!tensor_index_.insert(tensor.name, i)) return also(*tensor_index_.find(tensor.name));
      const auto ranked = ranked_tensors_.find(tensor.name);
      if (ranked != ranked_tensors_.end()) return also(ranked->second.front());
      return Status();
    }
    if (const std::optional<size_t> replicated = tensor_index_.find(tensor.name)) {
      return also(*replicated);
    }
    // The rank's 4 bytes, then the name: one key, never ambiguous.
    std::string key(reinterpret_cast<const char*>(&*rank), sizeof(uint32_t));
    key += tensor.name;
    const auto [seen, fresh] = ranked_keys_.emplace(std::move(key), i);
    if (!fresh) return also(seen->second);
    ranked_tensors_[tensor.name].push_back(i);
    return Status();
  }

  static bool is_local_tag(std::string_view device) {
    constexpr std::string_view kLocal = ":local";
    return device.size() > kLocal.size() &&
           device.substr(device.size() - kLocal.size()) == kLocal &&
           parse_device_tag(device.substr(0, device.size() - kLocal.size())).has_value();
  }

  const Plan& plan_;
  const PlanValidationOptions& options_;
  std::map<uint32_t, size_t> buffer_index_;                  // memory id -> buffers index
  bool names_unique_ = false;  // no ranks, names ascending: index_name was not needed
  detail::TensorsByName by_name_{plan_};  // with names_unique_
  NameIndex tensor_index_;                // name -> tensors index (replicated), without
  // The tensors of ranks by name (slices and experts), in plan order.
  std::unordered_map<std::string_view, std::vector<size_t>> ranked_tensors_;
  std::unordered_map<std::string, size_t> ranked_keys_;  // rank bytes + name -> tensors index
};

// A constant's bytes inside its buffer.
struct Extent {
  uint32_t memory_id;
  uint64_t begin;
  uint64_t end;
  size_t tensor;
};

bool before(const Extent& a, const Extent& b) {
  return std::tie(a.memory_id, a.begin, a.tensor) < std::tie(b.memory_id, b.begin, b.tensor);
}

}  // namespace

Status detail::check_constant_overlaps(const Plan& plan) {
  std::vector<Extent> constants;
  constants.reserve(plan.tensors.size());
  bool sorted = true;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlanTensor& tensor = plan.tensors[i];
    if (!tensor.is_constant()) continue;
    // A tensor without a byte count is the load's or validate_plan's error
    // to report; an end past 64 bits overlaps whatever follows it.
    const Result<uint64_t> nbytes = byte_size(tensor.dtype, tensor.shape);
    if (!nbytes.ok() || *nbytes == 0) continue;
    uint64_t end = 0;
    if (__builtin_add_overflow(tensor.offset, *nbytes, &end)) end = UINT64_MAX;
    const Extent extent{tensor.memory_id, tensor.offset, end, i};
    if (!constants.empty() && !before(constants.back(), extent)) sorted = false;
    constants.push_back(extent);
  }
  // Plans mostly list each buffer's constants in offset order: no sort then.
  if (!sorted) std::sort(constants.begin(), constants.end(), before);
  // Sorted by start and without an overlap so far, each extent ends before
  // the next one starts: comparing neighbours finds the first overlap.
  for (size_t k = 1; k < constants.size(); ++k) {
    const Extent& prior = constants[k - 1];
    const Extent& extent = constants[k];
    if (prior.memory_id == extent.memory_id && extent.begin < prior.end) {
      const auto range = [](const Extent& e) {
        return "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
      };
      const auto place = [&](size_t i) {
        return named_place("tensors", i, plan.tensors[i].name);
      };
      return plan_error(plan, place(extent.tensor),
                        "bytes " + range(extent) + " of buffer " +
                            std::to_string(extent.memory_id) + " overlap " +
                            place(prior.tensor) + " at " + range(prior));
    }
  }
  return Status();
}

Status detail::check_plan_limits(const Plan& plan) {
  // "device \"...\" (N bytes) is longer than a device tag may be (256 bytes)";
  // quote() cuts the value and gives its length. Only a value over its
  // limit builds a message: a plan of 100 000 tensors that is fine builds
  // none.
  const auto too_long = [](const std::string& what, const std::string& value, size_t limit,
                           const char* kind) {
    return what + " " + quote(value) + " is longer than " + kind + " may be (" +
           std::to_string(limit) + " bytes)";
  };
  const auto fail = [&](const std::string& place, const std::string& reason) {
    return plan_error(plan, place, reason);
  };
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const PlanBuffer& buffer = plan.buffers[i];
    if (buffer.device.size() > kMaxDeviceTagBytes) {
      return fail(at_index("buffers", i),
                  too_long("device", buffer.device, kMaxDeviceTagBytes, "a device tag"));
    }
  }
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlanTensor& tensor = plan.tensors[i];
    if (tensor.name.size() > kMaxPlanNameBytes) {
      return fail(at_index("tensors", i),
                  too_long("name", tensor.name, kMaxPlanNameBytes, "a name"));
    }
    if (!tensor.source) continue;
    if (tensor.source->file.size() > kMaxPlanPathBytes) {
      return fail(named_place("tensors", i, tensor.name),
                  too_long("source file", tensor.source->file, kMaxPlanPathBytes, "a path"));
    }
    if (tensor.source->key.size() > kMaxPlanNameBytes) {
      return fail(named_place("tensors", i, tensor.name),
                  too_long("source key", tensor.source->key, kMaxPlanNameBytes, "a name"));
    }
  }
  for (size_t m = 0; m < plan.methods.size(); ++m) {
    const PlanMethod& method = plan.methods[m];
    if (method.name.size() > kMaxPlanNameBytes) {
      return fail(at_index("methods", m),
                  too_long("name", method.name, kMaxPlanNameBytes, "a name"));
    }
    for (size_t k = 0; k < method.tensors.size(); ++k) {
      if (method.tensors[k].size() > kMaxPlanNameBytes) {
        return fail(at_index("methods", m) + "/tensors/" + std::to_string(k),
                    too_long("tensor", method.tensors[k], kMaxPlanNameBytes, "a name"));
      }
    }
  }
  return Status();
}

namespace {

// A plan for several ranks: each buffer's rank below its world size, then
// the plan as a whole.
Status validate_ranks(const Plan& plan, const PlanValidationOptions& options) {
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const PlanBuffer& b = plan.buffers[i];
    if (!b.rank) continue;
    if (plan.world_size == 0) {
      return detail::plan_error(plan, at_index("buffers", i),
                                "buffer " + std::to_string(b.memory_id) + " names rank " +
                                    std::to_string(*b.rank) +
                                    ", but the plan has no \"world_size\"");
    }
    if (*b.rank >= plan.world_size) {
      return detail::plan_error(plan, at_index("buffers", i),
                                "buffer " + std::to_string(b.memory_id) + " names rank " +
                                    std::to_string(*b.rank) + ", not below the plan's " +
                                    "world_size " + std::to_string(plan.world_size));
    }
  }
  // One pass over the whole plan, names unique within each rank's view
  // (Validator::index_name): the cost of its entries, not of its ranks.
  return Validator(plan, options).run();
}

}  // namespace

Status validate_plan(const Plan& plan, const PlanValidationOptions& options) {
  return detail::catch_as_status([&] { return validate_ranks(plan, options); },
                                 detail::file_failure(plan.path, "validating the plan"));
}

}  // namespace devalloc
