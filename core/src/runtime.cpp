#include <devalloc/core/runtime.hpp>

#include <devalloc/core/safetensors.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "address_text.hpp"
#include "load/copy_schedule.hpp"
#include "load/verify.hpp"
#include "plan_checks.hpp"
#include "plan_errors.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <tuple>
#include <utility>

namespace devalloc {

namespace {

std::string where(const PlanTensor& t) {
  return "tensor " + quote(t.name) + " (buffer " + std::to_string(t.memory_id) +
         ", offset " + std::to_string(t.offset) + ")";
}

// PLUGIN-11/12, checked on every load (cheaply: a sort): the buffers this
// load allocated overlap neither each other nor the program's live buffers
// on their device. Overlapping allocations take each other's constants,
// silently. Buffers of other programs are the validation layer's to check.
Status check_no_overlap(const std::map<uint32_t, std::shared_ptr<DeviceBuffer>>& fresh,
                        const std::map<uint32_t, std::shared_ptr<DeviceBuffer>>& live,
                        uint32_t* blamed_id) {
  struct Extent {
    const Plugin* plugin;
    uint32_t device;
    uint64_t begin;
    uint64_t nbytes;
    const DeviceBuffer* buffer;
    bool fresh;
  };
  std::vector<Extent> extents;
  for (const auto* buffers : {&fresh, &live}) {
    for (const auto& [id, b] : *buffers) {
      if (b->nbytes() == 0) continue;
      extents.push_back(Extent{b->device().plugin.get(), b->device().device, b->address(),
                               b->nbytes(), b.get(), buffers == &fresh});
    }
  }
  if (extents.empty()) return Status();
  const auto key = [](const Extent& e) {
    return std::tie(e.plugin, e.device, e.begin, e.buffer);
  };
  std::sort(extents.begin(), extents.end(),
            [&](const Extent& a, const Extent& b) { return key(a) < key(b); });
  // Sorted by start: if any two overlap, two neighbours do.
  for (size_t k = 1; k < extents.size(); ++k) {
    const Extent& prior = extents[k - 1];
    const Extent& next = extents[k];
    if (prior.plugin != next.plugin || prior.device != next.device) continue;
    if (!prior.fresh && !next.fresh) continue;  // both checked when allocated
    if (next.begin - prior.begin >= prior.nbytes) continue;
    // Blame a buffer of this load: the later one when both are.
    const Extent& blamed = next.fresh ? next : prior;
    const Extent& other = next.fresh ? prior : next;
    const ResolvedDevice& d = blamed.buffer->device();
    *blamed_id = blamed.buffer->memory_id();
    return Status(StatusCode::device_error,
                  "allocating buffer " + std::to_string(blamed.buffer->memory_id()) + " (" +
                      std::to_string(blamed.nbytes) + " bytes) on " + d.describe() +
                      ": plugin " + d.plugin_name + " broke PLUGIN-11: allocate returned " +
                      detail::address_range(blamed.begin, blamed.begin + blamed.nbytes) +
                      ", which overlaps buffer " + std::to_string(other.buffer->memory_id()) +
                      " at " + detail::address_range(other.begin, other.begin + other.nbytes) +
                      " on the same device");
  }
  return Status();
}

}  // namespace

std::vector<std::string> load_warnings(const LoadReport& report) {
  std::vector<std::string> out;
  for (const DeviceLoadStats& d : report.devices) {
    if (d.late_releases == 0) continue;
    char waited[64];
    std::snprintf(waited, sizeof waited, "%.3f", d.late_release_seconds);
    out.push_back("plugin " + d.device.plugin_name + " released " +
                  std::to_string(d.late_releases) +
                  (d.late_releases == 1 ? " copy to " : " copies to ") + d.device.device_label() +
                  " after synchronize returned (PLUGIN-20); the load waited " + waited + " s for " +
                  (d.late_releases == 1 ? "it" : "them") +
                  " (a release may be that late up to [load] release_timeout after each "
                  "synchronize)");
  }
  return out;
}

std::shared_ptr<Runtime> Runtime::create(RuntimeConfig config) {
  return std::shared_ptr<Runtime>(new Runtime(std::move(config)));
}

void Runtime::set_progress(LoadProgress progress) {
  LoadProgress old;  // destroyed outside the lock: it may hold anything
  std::lock_guard lock(progress_mutex_);
  old = std::exchange(progress_, std::move(progress));
}

LoadProgress Runtime::progress() const {
  std::lock_guard lock(progress_mutex_);
  return progress_;
}

Result<std::shared_ptr<LoadedProgram>> Runtime::load(
    const Plan& plan, const std::vector<std::string>& methods,
    LoadReport* report, SafetensorsCache* files, std::optional<bool> verify,
    const LoadProgress& progress) {
  return detail::catch_as_status(
      [&]() -> Result<std::shared_ptr<LoadedProgram>> {
        return load(std::make_shared<const Plan>(plan), methods, report, files, verify,
                    progress);
      },
      detail::file_failure(plan.path, "loading"));
}

Result<std::shared_ptr<LoadedProgram>> Runtime::load(
    Plan&& plan, const std::vector<std::string>& methods,
    LoadReport* report, SafetensorsCache* files, std::optional<bool> verify,
    const LoadProgress& progress) {
  return detail::catch_as_status(
      [&]() -> Result<std::shared_ptr<LoadedProgram>> {
        return load(std::make_shared<const Plan>(std::move(plan)), methods, report, files,
                    verify, progress);
      },
      detail::file_failure(plan.path, "loading"));
}

Result<std::shared_ptr<LoadedProgram>> Runtime::load(
    std::shared_ptr<const Plan> plan, const std::vector<std::string>& methods,
    LoadReport* report, SafetensorsCache* files, std::optional<bool> verify,
    const LoadProgress& progress) {
  if (plan == nullptr) {
    // The message is an allocation too: it must not throw out of here.
    return detail::without_exceptions("load", []() -> Result<std::shared_ptr<LoadedProgram>> {
      return Status(StatusCode::invalid_argument, "load: no plan (a null pointer)");
    });
  }
  const Plan& planned = *plan;
  return detail::catch_as_status(
      [&]() -> Result<std::shared_ptr<LoadedProgram>> {
        // Shared, not moved: `planned` must outlive a constructor that throws.
        std::shared_ptr<LoadedProgram> program(new LoadedProgram(shared_from_this(), plan));
        std::vector<std::string> names = methods;
        if (names.empty()) {
          for (const auto& m : program->plan().methods) names.push_back(m.name);
        }
        Status s = program->load_methods(names, report, files, verify, progress);
        if (!s.ok()) return s;
        return program;
      },
      detail::file_failure(planned.path, "loading"));
}

LoadedProgram::LoadedProgram(std::shared_ptr<Runtime> runtime, std::shared_ptr<const Plan> plan)
    : runtime_(std::move(runtime)), plan_(std::move(plan)), tensors_(plan_->tensors.size()) {}

Status LoadedProgram::load_methods(const std::vector<std::string>& methods,
                                   LoadReport* report,
                                   SafetensorsCache* files,
                                   std::optional<bool> verify,
                                   const LoadProgress& progress) {
  return detail::catch_as_status(
      [&] { return load_methods_or_throw(methods, report, files, verify, progress); },
      detail::file_failure(plan_->path, "loading methods"));
}

Status LoadedProgram::load_methods_or_throw(const std::vector<std::string>& methods,
                                            LoadReport* report, SafetensorsCache* files,
                                            std::optional<bool> verify,
                                            const LoadProgress& progress) {
  // Loads and unloads of this program run one at a time, so the members
  // below change only under load_mutex_: this thread may read them without
  // mutex_ until the commit, which writes them under both locks. Lookups
  // (mutex_ only) never wait for the copies.
  std::lock_guard load_lock(load_mutex_);
  const auto start = std::chrono::steady_clock::now();
  const LoadOptions& options = runtime_->config().load;

  // Once per program, over all its methods: constants that overlap would
  // take each other's bytes, at once or at a later load_methods.
  // Names and paths past the plan format's limits are refused first, before
  // a path is resolved or a tag looked up (read_plan refuses them too, but a
  // plan may be built in code).
  if (!constants_checked_) {
    if (Status s = detail::check_plan_limits(*plan_); !s.ok()) return s;
    if (Status s = detail::check_constant_overlaps(*plan_); !s.ok()) return s;
    constants_checked_ = true;
  }
  auto needs = needs_of(*plan_, methods, options.external_files);
  if (!needs.ok()) return needs.status();
  // validate_plan checks these too; a caller that skipped it must still get
  // an error before anything is allocated, never an exception, never an
  // address past its buffer.
  std::map<uint32_t, const PlannedBuffer*> buffer_by_id;  // not T x B lookups
  for (const PlannedBuffer& pb : needs->buffers) buffer_by_id.emplace(pb.memory_id, &pb);
  for (const NeededTensor& n : needs->tensors) {
    const PlanTensor& t = plan_->tensors[n.index];
    const auto found = buffer_by_id.find(t.memory_id);
    const PlannedBuffer* b = found == buffer_by_id.end() ? nullptr : found->second;
    if (b == nullptr) {
      // A safety check, not validate_plan's: the ids of all the methods of
      // this call are allowed, which keeps every address in its buffer.
      // At most kShownIds of them: a plan may have thousands of buffers.
      using detail::kShownIds;
      std::string ids;
      for (size_t k = 0; k < needs->buffers.size() && k < kShownIds; ++k) {
        ids += (k == 0 ? "" : ", ") + std::to_string(needs->buffers[k].memory_id);
      }
      if (needs->buffers.size() > kShownIds) {
        ids += ", ... (" + std::to_string(needs->buffers.size()) + " in all)";
      }
      return Status(StatusCode::invalid_argument,
                    where(t) + ": memory id " + std::to_string(t.memory_id) +
                        " is not among the memory ids of the methods this call loads (" +
                        (ids.empty() ? "none" : ids) + ")");
    }
    if (t.offset > b->nbytes || n.nbytes > b->nbytes - t.offset) {
      return Status(StatusCode::invalid_argument,
                    where(t) + ": " + std::to_string(n.nbytes) +
                        " bytes do not fit in buffer " +
                        std::to_string(b->memory_id) + " of " +
                        std::to_string(b->nbytes) + " bytes");
    }
  }

  // Placement of the buffers not yet live, then the fit check: a load that
  // cannot fit fails here, before anything is allocated.
  std::vector<BufferPlacement> placements;
  for (const PlannedBuffer& b : needs->buffers) {
    if (buffers_.count(b.memory_id) != 0) continue;
    auto placed = place_buffer(b, runtime_->registry());
    if (!placed.ok()) return placed.status().with_context(buffer_place(*plan_, b));
    placements.push_back(std::move(*placed));
  }
  if (options.check_free_memory) {
    if (Status s = check_fit(device_demands(placements)); !s.ok()) {
      return s.with_context(detail::plan_name(*plan_));
    }
  }

  // Allocation. Until the commit below the buffers are owned here only, so
  // any failure frees them on return.
  std::map<uint32_t, std::shared_ptr<DeviceBuffer>> fresh;
  for (const BufferPlacement& p : placements) {
    const PlannedBuffer& b = p.buffer;
    auto buffer = DeviceBuffer::allocate(p.device, b.memory_id, b.nbytes, b.alignment);
    if (!buffer.ok()) return buffer.status().with_context(buffer_place(*plan_, b));
    fresh.emplace(b.memory_id, std::move(*buffer));
  }
  uint32_t blamed_id = 0;
  if (Status s = check_no_overlap(fresh, buffers_, &blamed_id); !s.ok()) {
    for (const BufferPlacement& p : placements) {
      if (p.buffer.memory_id == blamed_id) return s.with_context(buffer_place(*plan_, p.buffer));
    }
    return s;
  }
  // Consecutive tensors mostly share a buffer: look it up once per run.
  uint32_t last_id = 0;
  const std::shared_ptr<DeviceBuffer>* last_buffer = nullptr;
  auto buffer_of = [&](uint32_t id) -> const std::shared_ptr<DeviceBuffer>& {
    if (last_buffer == nullptr || last_id != id) {
      auto it = fresh.find(id);
      last_buffer = it != fresh.end() ? &it->second : &buffers_.find(id)->second;
      last_id = id;
    }
    return *last_buffer;
  };

  // Copy requests: constants not yet on their device; request_tensor[k] is
  // the plan index of requests[k].
  SafetensorsCache own_files;
  SafetensorsCache& sources = files != nullptr ? *files : own_files;
  std::vector<CopyRequest> requests;
  std::vector<size_t> request_tensor;
  requests.reserve(needs->tensors.size());
  request_tensor.reserve(needs->tensors.size());
  // Each file is opened once by this load, whatever order the plan lists
  // its tensors in: every tensor of a file is checked against the one
  // header the copies take their offsets from (a cache may open a file
  // modified in place again, into a new entry, at each open).
  std::vector<std::shared_ptr<const SafetensorsFile>> opened_files(needs->files.size());
  // Consecutive tensors mostly share a file: look it up once per run of
  // them, not once per tensor.
  size_t last_file_id = NeededTensor::kNoFile;
  const SafetensorsFile* last_file = nullptr;
  size_t next_in_file = 0;  // plans mostly list a file's tensors in its order
  for (const NeededTensor& n : needs->tensors) {
    if (n.file == NeededTensor::kNoFile || tensors_[n.index].filled) continue;
    const PlanTensor& t = plan_->tensors[n.index];
    const std::filesystem::path& path = needs->files[n.file];
    if (n.file != last_file_id) {
      std::shared_ptr<const SafetensorsFile>& file = opened_files[n.file];
      if (file == nullptr) {
        auto opened = sources.open(path, needs->files_beneath);
        if (!opened.ok()) return opened.status().with_context(where(t));
        file = std::move(*opened);
      }
      last_file = file.get();
      last_file_id = n.file;
      next_in_file = 0;
    }
    const std::string& key = t.source->key;
    const SafetensorsTensor* source = last_file->find(key, next_in_file);
    if (source == nullptr) {
      return Status(StatusCode::invalid_argument,
                    where(t) + ": " + path_for_message(path.string()) + " has no tensor " +
                        quote(key));
    }
    next_in_file = static_cast<size_t>(source - last_file->tensors().data()) + 1;
    if (source->nbytes != n.nbytes) {
      return Status(StatusCode::invalid_argument,
                    where(t) + ": the plan says " + std::to_string(n.nbytes) +
                        " bytes, " + path_for_message(path.string()) + " has " +
                        std::to_string(source->nbytes) + " for " + quote(key));
    }
    // What validate_plan checked, checked again against the header this
    // load copies by: the file the plan was validated with may have been
    // modified in place since, and opened again (SafetensorsCache).
    if (source->dtype != t.dtype || source->shape != t.shape) {
      return Status(StatusCode::invalid_argument,
                    where(t) + ": the plan says " + std::string(to_string(t.dtype)) + " " +
                        shape_to_string(t.shape) + ", " + path_for_message(path.string()) +
                        " has " + std::string(to_string(source->dtype)) + " " +
                        shape_to_string(source->shape) + " for " + quote(key));
    }
    requests.push_back(CopyRequest{buffer_of(t.memory_id), t.offset, last_file->mapping(),
                                   source->offset, source->nbytes, t.name});
    request_tensor.push_back(n.index);
  }

  const CopySchedule schedule = CopySchedule::build(std::move(requests));
  std::vector<DeviceLoadStats> stats;
  PipelineStats pipeline;
  // The runtime-wide callback as set now: set_progress may replace it
  // while this load runs.
  const LoadProgress runtime_wide = progress ? LoadProgress() : runtime_->progress();
  if (Status s = schedule.execute(PipelineOptions::from(options), &stats, &pipeline,
                                  progress ? progress : runtime_wide);
      !s.ok()) {
    return s;
  }
  const bool verifying = verify.value_or(options.verify);
  if (verifying) {
    if (Status s = verify_copies(schedule.requests(), std::min<uint64_t>(
                                               options.staging_bytes, 8 << 20));
        !s.ok()) {
      return s;
    }
  }
  // A device that got buffers of this load but no constant (scratch only)
  // has a row too, with nothing copied: the report covers every device the
  // load allocated on. Before the commit, which must not allocate.
  for (const auto& [id, buffer] : fresh) {
    const ResolvedDevice& device = buffer->device();
    const bool listed = std::any_of(stats.begin(), stats.end(), [&](const DeviceLoadStats& d) {
      return d.device.same_device(device);
    });
    if (!listed) stats.push_back(DeviceLoadStats{device});
  }

  // Commit, all at once for the lookups: nothing below can fail (every
  // tensor's buffer was checked above). What it needs to allocate is made
  // first, so that the commit itself cannot throw: an allocation that fails
  // leaves the program as it was.
  const uint64_t allocated = fresh.size();
  std::set<std::string, std::less<>> new_methods(methods.begin(), methods.end());
  // needs->files[k] is new_files[file_id[k]]; files_ changes only under
  // load_mutex_, held.
  std::vector<std::filesystem::path> new_files = files_;
  std::vector<size_t> file_id;
  file_id.reserve(needs->files.size());
  for (std::filesystem::path& path : needs->files) {
    auto known = std::find(new_files.begin(), new_files.end(), path);
    if (known == new_files.end()) known = new_files.insert(new_files.end(), std::move(path));
    file_id.push_back(static_cast<size_t>(known - new_files.begin()));
  }
  {
    std::lock_guard lock(mutex_);
    buffers_.merge(fresh);        // ids not in buffers_: moves every node
    methods_.merge(new_methods);  // a method loaded already stays behind
    files_.swap(new_files);
    for (size_t i : request_tensor) tensors_[i].filled = true;
    for (const NeededTensor& n : needs->tensors) {
      TensorState& state = tensors_[n.index];
      state.loaded = true;
      state.nbytes = n.nbytes;
      state.file = n.file == NeededTensor::kNoFile ? NeededTensor::kNoFile : file_id[n.file];
    }
  }

  if (report != nullptr) {
    *report = LoadReport{};
    report->allocations = allocated;
    for (const DeviceLoadStats& d : stats) {
      report->copies += d.copies;
      report->direct_reads += d.direct_reads;
    }
    report->pipeline = pipeline;
    report->devices = std::move(stats);
    for (const CopyRequest& r : schedule.requests()) {
      // An empty tensor is in place without a copy.
      if (r.nbytes > 0) ++report->constants;
      report->bytes += r.nbytes;
    }
    report->verified = verifying;
    report->seconds = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  }
  return Status();
}

Status LoadedProgram::unload_method(std::string_view method) {
  return detail::catch_as_status([&] { return unload_method_or_throw(method); },
                                 detail::file_failure(plan_->path, "unloading a method"));
}

Status LoadedProgram::unload_method_or_throw(std::string_view method) {
  std::lock_guard load_lock(load_mutex_);
  // Buffers dropped here are freed (through their plugin) after the lookup
  // lock is let go.
  std::vector<std::shared_ptr<DeviceBuffer>> dropped;
  std::lock_guard lock(mutex_);
  auto it = methods_.find(method);
  if (it == methods_.end()) {
    return Status(StatusCode::invalid_argument,
                  "method " + quote(method) + " is not loaded");
  }
  // What the methods that stay loaded use. They were loaded from this
  // plan, so this cannot fail; if it did, nothing has changed yet.
  std::vector<std::string> staying;
  for (const std::string& m : methods_) {
    if (m != method) staying.push_back(m);
  }
  auto used = plan_->tensors_for_methods(staying);
  if (!used.ok()) return used.status();
  // Everything allocated before anything changes: from the erase on,
  // nothing throws.
  std::vector<char> still_used(tensors_.size(), 0);
  for (size_t i : used->tensors) still_used[i] = 1;
  // A buffer lives on while a staying method lists its memory id, or holds
  // a tensor a staying method lists (a plan that skipped validate_plan may
  // put a tensor outside its own method's memory ids).
  std::set<uint32_t> live_ids(used->memory_ids.begin(), used->memory_ids.end());
  for (size_t i : used->tensors) live_ids.insert(plan_->tensors[i].memory_id);
  dropped.reserve(buffers_.size());

  methods_.erase(it);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    // A constant no loaded method lists may be overwritten from now on by
    // the scratch of a method that overlaps it: copy it again when needed.
    if (still_used[i] == 0) tensors_[i] = TensorState{};
  }
  for (auto b = buffers_.begin(); b != buffers_.end();) {
    if (live_ids.count(b->first) == 0) {
      dropped.push_back(std::move(b->second));
      b = buffers_.erase(b);
    } else {
      ++b;
    }
  }
  return Status();
}

std::vector<std::string> LoadedProgram::methods() const {
  std::lock_guard lock(mutex_);
  return std::vector<std::string>(methods_.begin(), methods_.end());
}

LoadedTensor LoadedProgram::loaded_tensor(size_t i) const {
  const TensorState& state = tensors_[i];
  const std::filesystem::path* file =
      state.file == NeededTensor::kNoFile ? nullptr : &files_[state.file];
  return LoadedTensor{planned_tensor(*plan_, i, state.nbytes, file),
                      buffers_.find(plan_->tensors[i].memory_id)->second};
}

std::optional<LoadedTensor> LoadedProgram::find(std::string_view name) const {
  std::lock_guard lock(mutex_);
  if (by_name_.empty()) {
    by_name_.reserve(plan_->tensors.size());
    for (size_t i = 0; i < plan_->tensors.size(); ++i) {
      by_name_.insert(plan_->tensors[i].name, i);
    }
  }
  const std::optional<size_t> found = by_name_.find(name);
  if (!found || !tensors_[*found].loaded) return std::nullopt;
  return loaded_tensor(*found);
}

std::vector<LoadedTensor> LoadedProgram::tensors() const {
  std::lock_guard lock(mutex_);
  std::vector<LoadedTensor> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].loaded) out.push_back(loaded_tensor(i));
  }
  std::sort(out.begin(), out.end(), [](const LoadedTensor& a, const LoadedTensor& b) {
    return a.name() < b.name();
  });
  return out;
}

std::vector<std::shared_ptr<DeviceBuffer>> LoadedProgram::buffers() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<DeviceBuffer>> out;
  for (const auto& [id, buffer] : buffers_) out.push_back(buffer);
  return out;
}

namespace {

struct DlpackExport {
  std::shared_ptr<LoadedProgram> program;
  std::shared_ptr<DeviceBuffer> buffer;
  std::vector<int64_t> shape;
  DLManagedTensor managed{};
};

extern "C" void delete_dlpack_export(DLManagedTensor* managed) {
  delete static_cast<DlpackExport*>(managed->manager_ctx);
}

}  // namespace

Result<DLManagedTensor*> LoadedProgram::export_dlpack(std::string_view name) {
  return detail::catch_as_status([&] { return export_dlpack_or_throw(name); },
                                 detail::file_failure(plan_->path, "exporting a tensor"));
}

Result<DLManagedTensor*> LoadedProgram::export_dlpack_or_throw(std::string_view name) {
  const std::optional<LoadedTensor> found = find(name);
  if (!found) {
    return Status(StatusCode::invalid_argument,
                  "export_dlpack: no tensor " + quote(name) + " in the loaded methods");
  }
  const LoadedTensor& t = *found;
  const DeviceInfo& info = t.device().info();
  auto ctx = std::make_unique<DlpackExport>();
  ctx->program = shared_from_this();
  ctx->buffer = t.buffer;
  for (uint64_t d : t.planned.shape) ctx->shape.push_back(static_cast<int64_t>(d));
  DLTensor& dl = ctx->managed.dl_tensor;
  // Zero-size tensors may sit at address 0; DLPack allows data == NULL then.
  dl.data = reinterpret_cast<void*>(static_cast<uintptr_t>(t.address()));
  dl.device.device_type = static_cast<DLDeviceType>(info.dlpack_device_type);
  dl.device.device_id = info.dlpack_device_id;
  dl.ndim = static_cast<int32_t>(ctx->shape.size());
  dl.dtype = to_dlpack(t.planned.dtype);
  dl.shape = ctx->shape.data();
  dl.strides = nullptr;  // compact, row-major
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = delete_dlpack_export;
  return &ctx.release()->managed;
}

}  // namespace devalloc
