#include <devalloc/core/runtime.hpp>

#include <devalloc/core/device_registry.hpp>
#include <devalloc/core/job_rank.hpp>
#include <devalloc/core/placement.hpp>
#include <devalloc/core/safetensors.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include <devalloc/address_text.hpp>
#include "load/load_transaction.hpp"
#include "plan_checks.hpp"
#include "plan_errors.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <tuple>
#include <utility>

namespace devalloc {

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

Runtime::Runtime(RuntimeConfig config)
    : registry_(std::make_unique<DeviceRegistry>(std::move(config))) {}

Runtime::~Runtime() = default;

const RuntimeConfig& Runtime::config() const { return registry_->config(); }

Result<std::shared_ptr<LoadedProgram>> Runtime::load(Plan plan, const LoadRequest& request) {
  const std::filesystem::path& path = plan.path;
  return detail::catch_as_status(
      [&]() -> Result<std::shared_ptr<LoadedProgram>> {
        return load(std::make_shared<const Plan>(std::move(plan)), request);
      },
      detail::file_failure(path, "loading"));
}

Result<std::shared_ptr<LoadedProgram>> Runtime::load(std::shared_ptr<const Plan> plan,
                                                     const LoadRequest& request) {
  if (plan == nullptr) {
    // The message is an allocation too: it must not throw out of here.
    return detail::without_exceptions("load", []() -> Result<std::shared_ptr<LoadedProgram>> {
      return Status(StatusCode::invalid_argument, "load: no plan (a null pointer)");
    });
  }
  const Plan& planned = *plan;
  return detail::catch_as_status(
      [&]() -> Result<std::shared_ptr<LoadedProgram>> {
        // A plan for several ranks loads this rank's view: the rank asked
        // for, else the launcher's.
        if (plan->world_size != 0) {
          std::optional<JobRank> rank = request.rank;
          if (!rank) {
            Result<std::optional<JobRank>> launched = rank_from_environment();
            if (!launched.ok()) return launched.status().with_context(detail::plan_name(*plan));
            rank = *launched;
          }
          if (!rank) {
            return Status(StatusCode::invalid_argument,
                          detail::plan_name(*plan) + ": the plan is for a job of " +
                              std::to_string(plan->world_size) +
                              " ranks, and no launcher set this process's rank (RANK and "
                              "WORLD_SIZE, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID); "
                              "give the rank explicitly (--rank, rank=, LoadRequest::rank)");
          }
          Result<Plan> view = plan_for_rank(*plan, *rank);
          if (!view.ok()) return view.status();
          plan = std::make_shared<const Plan>(std::move(*view));
        }
        // Shared, not moved: `planned` must outlive a constructor that throws.
        std::shared_ptr<LoadedProgram> program(new LoadedProgram(shared_from_this(), plan));
        LoadRequest all = request;
        if (all.methods.empty()) {
          for (const auto& m : program->plan().methods) all.methods.push_back(m.name);
        }
        Status s = program->load_methods(all);
        if (!s.ok()) return s;
        return program;
      },
      detail::file_failure(planned.path, "loading"));
}

LoadedProgram::LoadedProgram(std::shared_ptr<Runtime> runtime, std::shared_ptr<const Plan> plan)
    : runtime_(std::move(runtime)), plan_(std::move(plan)), tensors_(plan_->tensors.size()) {}

Status LoadedProgram::load_methods(const LoadRequest& request) {
  return detail::catch_as_status([&] { return load_methods_or_throw(request); },
                                 detail::file_failure(plan_->path, "loading methods"));
}

Status LoadedProgram::load_methods_or_throw(const LoadRequest& request) {
  const std::vector<std::string>& methods = request.methods;
  LoadReport* report = request.report;
  SafetensorsCache* files = request.files;
  const LoadProgress& progress = request.progress;
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
  load::LoadTransaction load(*plan_, options, runtime_->registry(), buffers_,
                             [this](size_t i) { return tensors_[i].filled; });
  SafetensorsCache own_files;
  if (Status s = load.resolve(methods); !s.ok()) return s;
  if (Status s = load.place(); !s.ok()) return s;
  if (Status s = load.allocate(); !s.ok()) return s;
  if (Status s = load.gather(files != nullptr ? *files : own_files); !s.ok()) return s;
  // The runtime-wide callback as set now: set_progress may replace it
  // while this load runs.
  const LoadProgress runtime_wide = progress ? LoadProgress() : runtime_->progress();
  if (Status s = load.execute(progress ? progress : runtime_wide, request.verify.value_or(options.verify));
      !s.ok()) {
    return s;
  }
  MethodNeeds& needs = load.needs();
  std::map<uint32_t, std::shared_ptr<DeviceBuffer>>& fresh = load.fresh();
  LoadReport summary = report != nullptr ? load.report() : LoadReport{};

  // Commit, all at once for the lookups: nothing below can fail (every
  // tensor's buffer was checked above). What it needs to allocate is made
  // first, so that the commit itself cannot throw: an allocation that fails
  // leaves the program as it was.
  const uint64_t allocated = fresh.size();
  std::set<std::string, std::less<>> new_methods(methods.begin(), methods.end());
  // needs.files[k] is new_files[file_id[k]]; files_ changes only under
  // load_mutex_, held.
  std::vector<std::filesystem::path> new_files = files_;
  std::vector<size_t> file_id;
  file_id.reserve(needs.files.size());
  for (std::filesystem::path& path : needs.files) {
    auto known = std::find(new_files.begin(), new_files.end(), path);
    if (known == new_files.end()) known = new_files.insert(new_files.end(), std::move(path));
    file_id.push_back(static_cast<size_t>(known - new_files.begin()));
  }
  {
    std::lock_guard lock(mutex_);
    buffers_.merge(fresh);        // ids not in buffers_: moves every node
    methods_.merge(new_methods);  // a method loaded already stays behind
    files_.swap(new_files);
    for (size_t i : load.copied_tensors()) tensors_[i].filled = true;
    for (const NeededTensor& n : needs.tensors) {
      TensorState& state = tensors_[n.index];
      state.loaded = true;
      state.nbytes = n.nbytes;
      state.file = n.file == NeededTensor::kNoFile ? TensorState::kNoFile : file_id[n.file];
    }
  }

  if (report != nullptr) {
    *report = std::move(summary);
    report->allocations = allocated;
    report->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
      state.file == TensorState::kNoFile ? nullptr : &files_[state.file];
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
