// The runtime: a config, the plugins it loads, and programs loaded through
// it. The C++ entry point of the core:
//
//   auto runtime = Runtime::create(read_config(path).value());
//   auto program = runtime->load(plan, {"forward"});
//   std::optional<LoadedTensor> w = (*program)->find("lm_head.weight");
//
// A load is all-or-nothing: on any failure every buffer it allocated is
// freed and the error names the tensor, buffer, device and plugin.
//
// Threading (docs/loading.md): every method of LoadedProgram may be called
// from several threads at once. load_methods and unload_method of one
// program run one at a time; lookups and exports never wait for the copies
// of a load, and see a method either not at all or wholly loaded.
#pragma once

#include <devalloc/core/config.hpp>
#include <devalloc/core/device_buffer.hpp>
#include <devalloc/core/job_rank.hpp>
#include <devalloc/core/load_report.hpp>
#include <devalloc/core/name_index.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/safetensors.hpp>
#include <devalloc/status.hpp>

#include <dlpack/dlpack.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc {

// A tensor of a loaded method, at its place in device memory.
struct LoadedTensor {
  PlannedTensor planned;
  std::shared_ptr<DeviceBuffer> buffer;

  const std::string& name() const { return planned.name; }
  uint64_t address() const { return buffer->address() + planned.offset; }
  uint64_t nbytes() const { return planned.nbytes; }
  const ResolvedDevice& device() const { return buffer->device(); }
};

class DeviceRegistry;
class Runtime;

// What one load asks for. Every field may be left out:
//   runtime->load(plan);                                  // every method
//   runtime->load(plan, {.methods = {"forward"}, .report = &report});
struct LoadRequest {
  // Runtime::load: the methods to load, every one when empty.
  // LoadedProgram::load_methods: the ones named (empty loads nothing).
  std::vector<std::string> methods;
  // Filled when the load succeeds; left as it was when it fails.
  LoadReport* report = nullptr;
  // Where source files are opened: a caller that validated the plan with a
  // cache passes it to reuse those mappings; else a cache of this load.
  SafetensorsCache* files = nullptr;
  // Overrides the config's [load] verify for this load.
  std::optional<bool> verify;
  // This load's own progress callback, called for it alone (one call at a
  // time, `done` rising, as LoadProgress says) instead of the runtime's
  // (Runtime::set_progress).
  LoadProgress progress;
  // For a plan made for several ranks (docs/distributed.md): this
  // process's rank; none takes the launcher's (rank_from_environment).
  // Ignored for a plan without ranks.
  std::optional<JobRank> rank;
};

class LoadedProgram : public std::enable_shared_from_this<LoadedProgram> {
 public:
  LoadedProgram(const LoadedProgram&) = delete;
  LoadedProgram& operator=(const LoadedProgram&) = delete;

  // Loads more methods: request.methods (an empty list loads nothing,
  // unlike Runtime::load, whose empty list means every method). Buffers
  // already live are reused, constants already copied are not copied again.
  // All-or-nothing: the methods, their tensors and buffers become visible
  // together once every copy (and the verify pass) succeeded. The copies run
  // without the program's lookup lock, so a progress callback may call the
  // lookups and export_dlpack (but not load_methods or unload_method of the
  // same program, nor of another one whose own load's callback may call back
  // into this one: two loads waiting for each other; docs/loading.md).
  // request.rank is not used: the program's plan is one rank's already.
  Status load_methods(const LoadRequest& request);
  // Unloads a loaded method; a buffer lives on while a loaded method (or a
  // DLPack export, or a LoadedTensor a caller holds) uses it. A constant no
  // loaded method lists is forgotten: loading it again copies it again, as
  // another method's scratch may have overwritten it meanwhile.
  Status unload_method(std::string_view method);

  std::vector<std::string> methods() const;
  // A tensor of a loaded method, by value; nullopt otherwise. The value
  // holds its buffer, so it stays valid after a concurrent unload_method.
  std::optional<LoadedTensor> find(std::string_view name) const;
  std::vector<LoadedTensor> tensors() const;  // of loaded methods, by name
  // Live buffers by memory id.
  std::vector<std::shared_ptr<DeviceBuffer>> buffers() const;

  // A DLPack view of a loaded tensor. The caller owns it and calls its
  // deleter exactly once (it frees the DLManagedTensor), from any thread;
  // until then the tensor's buffer (and this program) stay alive.
  Result<DLManagedTensor*> export_dlpack(std::string_view name);

  const Plan& plan() const { return *plan_; }

 private:
  friend class Runtime;
  LoadedProgram(std::shared_ptr<Runtime> runtime, std::shared_ptr<const Plan> plan);

  // What this program holds of plan tensor i, at tensors_[i]. The plan is
  // not copied per tensor: a LoadedTensor is made when a caller asks.
  struct TensorState {
    uint64_t nbytes = 0;
    static constexpr size_t kNoFile = static_cast<size_t>(-1);
    size_t file = kNoFile;  // into files_
    bool loaded = false;  // a loaded method lists it
    bool filled = false;  // its constant is on the device
  };
  // Plan tensor i as a LoadedTensor; mutex_ held, tensors_[i].loaded.
  LoadedTensor loaded_tensor(size_t i) const;
  // The calls above, which may throw (an allocation that fails); each
  // public one turns an exception into a Status, with nothing changed.
  Status load_methods_or_throw(const LoadRequest& request);
  Status unload_method_or_throw(std::string_view method);
  Result<DLManagedTensor*> export_dlpack_or_throw(std::string_view name);

  std::shared_ptr<Runtime> runtime_;
  const std::shared_ptr<const Plan> plan_;  // never null
  // Serializes load_methods and unload_method; held through the copies.
  std::mutex load_mutex_;
  // The plan's names and paths were found within the format's limits and
  // its constants not to overlap (load_mutex_ held).
  bool constants_checked_ = false;
  // Guards the members below; never held while a plugin is called.
  mutable std::mutex mutex_;
  std::set<std::string, std::less<>> methods_;
  std::map<uint32_t, std::shared_ptr<DeviceBuffer>> buffers_;
  std::vector<TensorState> tensors_;          // indexed like plan_.tensors
  std::vector<std::filesystem::path> files_;  // resolved source files
  // Tensor name -> plan_.tensors index (the first of equal names), built by
  // the first lookup by name: a load does not need it.
  mutable NameIndex by_name_;
};

class Runtime : public std::enable_shared_from_this<Runtime> {
 public:
  static std::shared_ptr<Runtime> create(RuntimeConfig config);

  ~Runtime();
  DeviceRegistry& registry() { return *registry_; }
  // The runtime-wide progress callback, for every load that gives none of
  // its own. Each load calls it one call at a time with its own done and
  // total, but loads that run at once call it at once, each with its own
  // bytes (`done` rises per load, not across loads): it must be thread-safe
  // then, and it cannot tell the loads apart. A load that needs its own
  // progress passes its own callback to load(). It may be set at any time,
  // from any thread: a load takes the callback set when its copies start
  // and keeps calling that one (a copy of it) to its end.
  void set_progress(LoadProgress progress);
  LoadProgress progress() const;  // a copy of the current one
  const RuntimeConfig& config() const;

  // Loads request.methods of the plan (every method when empty), as
  // LoadRequest says. The program keeps the plan: a plan passed by value is
  // moved in (std::move it to spare a copy), a shared one is shared, so that
  // programs loaded from one plan hold it once (a null one is refused). A
  // plan made for several ranks loads this rank's share (plan_for_rank).
  Result<std::shared_ptr<LoadedProgram>> load(Plan plan, const LoadRequest& request = {});
  Result<std::shared_ptr<LoadedProgram>> load(std::shared_ptr<const Plan> plan,
                                              const LoadRequest& request = {});

 private:
  explicit Runtime(RuntimeConfig config);
  std::unique_ptr<DeviceRegistry> registry_;  // never null
  mutable std::mutex progress_mutex_;
  LoadProgress progress_;  // guarded by progress_mutex_
};

}  // namespace devalloc
