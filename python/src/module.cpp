// devalloc._native: the core's C++ API for Python. devalloc/__init__.py is
// the public face; this file binds plans, runtimes, loaded programs and
// their tensors, whose DLPack export goes through nanobind's ndarray.
#include <devalloc/core/config.hpp>
#include <devalloc/core/job_rank.hpp>
#include <devalloc/core/placement.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/plugin_loader.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace nb = nanobind;
namespace fs = std::filesystem;

namespace devalloc::python {

namespace {

// Text for Python: a message, or a name a plugin reported. Either may hold
// bytes that are not UTF-8 (a path repeated as the system gave it, a
// device name in a vendor's encoding), which nanobind's std::string
// conversion refuses with a UnicodeDecodeError: such a byte becomes \xNN,
// as devalloc's escaped() writes it.
nb::str text(std::string_view s) {
  PyObject* out = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()),
                                       "backslashreplace");
  if (out == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(out);
}

// A path as a str, as os.fsdecode gives it: a byte that is not UTF-8
// becomes a lone surrogate, which os.fsencode turns back into the byte.
nb::str path_text(const fs::path& path) {
  const std::string& s = path.native();
  PyObject* out = PyUnicode_DecodeFSDefaultAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
  if (out == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(out);
}

// A str as UTF-8, or nullopt for one that no UTF-8 spells (a lone
// surrogate such as "\ud800", which nanobind's std::string conversion
// refuses with std::bad_cast): a name the plan cannot hold.
std::optional<std::string_view> utf8(nb::handle str) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(str.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  return std::string_view(data, static_cast<size_t>(size));
}

// Raises devalloc.Error (defined in Python, so that it can parse the
// file:line a message starts with) carrying the message and the code.
[[noreturn]] void raise(const Status& status) {
  nb::object error_type = nb::module_::import_("devalloc._errors").attr("Error");
  nb::object error = error_type(text(status.message()), to_string(status.code()));
  PyErr_SetObject(error_type.ptr(), error.ptr());
  throw nb::python_error();
}

// At interpreter exit a thread that takes the GIL (back) is ended by
// pthread_exit, whose unwinding aborts the process when it meets a noexcept
// frame (a destructor, a loading thread of the core). So a thread of this
// module announces that it is about to take the GIL; an atexit hook, which
// runs before the interpreter starts ending threads, stops new ones (they
// are parked: the process is exiting) and lets those already on their way
// take the GIL and give it back first. A progress callback counts as on its
// way until it returned: the hook waits for it, and so for what it waits
// for, a load from inside it.
std::mutex g_exit_mutex;
std::condition_variable g_exit_changed;
bool g_exiting = false;  // under g_exit_mutex
int g_taking_gil = 0;    // under g_exit_mutex
// The thread that ran the hook (under g_exit_mutex). It goes on running
// Python after it: the atexit handlers registered before this module was
// imported run after its hook, and may load. Neither it nor the loading
// threads of its loads are parked, or the exit would wait for them forever.
std::thread::id g_exit_thread;
std::atomic<int> g_loads_running{0};
// This thread's part of g_taking_gil: above 0 inside a progress callback.
thread_local int t_taking_gil = 0;

// Before a thread takes the GIL; parks it for good when exiting, unless the
// exit waits for it: it is inside a progress callback, it ran the hook, or
// `awaited` (a loading thread of a load started inside a callback or by the
// thread that ran the hook). Parking those would keep the callback from
// returning, and the hook (or the atexit handlers after it) from ending.
// Whether a thread would be parked taking the GIL now. g_exit_mutex held.
bool parks_now(bool awaited) {
  return g_exiting && !awaited && t_taking_gil == 0 &&
         std::this_thread::get_id() != g_exit_thread;
}

void start_taking_gil(bool awaited = false) {
  std::unique_lock lock(g_exit_mutex);
  if (parks_now(awaited)) {
    lock.unlock();
    for (;;) pause();
  }
  ++g_taking_gil;
  ++t_taking_gil;
}

// The same for a progress callback, which may be skipped instead: false
// (and nothing counted) where start_taking_gil would park the thread. A
// loading thread parked would keep its load from ending; skipped, the load
// ends, and the exit waits for that (g_core_loads).
bool start_taking_gil_unless_exiting(bool awaited) {
  std::lock_guard lock(g_exit_mutex);
  if (parks_now(awaited)) return false;
  ++g_taking_gil;
  ++t_taking_gil;
  return true;
}

// Loads running in the core (the GIL let go): at exit they must end before
// the process runs its static destructors, which their threads would
// otherwise use (a loading thread waiting for a slot calls the plugin every
// 15 ms). Under g_exit_mutex.
int g_core_loads = 0;
// The longest the exit waits for them: a load held up by a plugin that
// never releases would otherwise hold the exit for its release_timeout.
constexpr auto kExitWaitForLoads = std::chrono::seconds(10);

// Around a load in the core. A load that starts once the exit began (a
// thread the hook let run) is not counted: the exit does not wait for it.
class CoreLoad {
 public:
  CoreLoad() {
    std::lock_guard lock(g_exit_mutex);
    counted_ = !g_exiting;
    if (counted_) ++g_core_loads;
  }
  ~CoreLoad() {
    if (!counted_) return;
    std::lock_guard lock(g_exit_mutex);
    --g_core_loads;
    g_exit_changed.notify_all();
  }
  CoreLoad(const CoreLoad&) = delete;
  CoreLoad& operator=(const CoreLoad&) = delete;

 private:
  bool counted_ = false;
};

// Whether this thread ran the atexit hook (so the exit waits for it).
bool is_exit_thread() {
  std::lock_guard lock(g_exit_mutex);
  return g_exiting && std::this_thread::get_id() == g_exit_thread;
}

// Once it has taken the GIL (it runs Python code from here, which the
// interpreter may end cleanly) or has given it back.
void done_taking_gil() {
  std::lock_guard lock(g_exit_mutex);
  --g_taking_gil;
  --t_taking_gil;
  g_exit_changed.notify_all();
}

// Registered with atexit; called with the GIL held.
void stop_taking_gil_at_exit() {
  {
    std::lock_guard lock(g_exit_mutex);
    g_exiting = true;
    g_exit_thread = std::this_thread::get_id();
  }
  // A thread parked inside a load keeps its objects: nanobind would call
  // them leaks when the module goes.
  if (g_loads_running > 0) nb::set_leak_warnings(false);
  nb::gil_scoped_release no_gil;  // those on their way need it
  std::unique_lock lock(g_exit_mutex);
  g_exit_changed.wait(lock, [] { return g_taking_gil == 0; });
  // Then the loads still running in the core, whose progress callbacks are
  // skipped from here: they end, and their threads with them.
  g_exit_changed.wait_for(lock, kExitWaitForLoads, [] { return g_core_loads == 0; });
}

// The GIL let go for a blocking call and taken back after it.
class GilReleased {
 public:
  GilReleased() : state_(PyEval_SaveThread()) {}
  ~GilReleased() {
    start_taking_gil();
    PyEval_RestoreThread(state_);
    done_taking_gil();
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* state_;
};

// Whether this is Python's main thread, where signal handlers run.
bool on_main_thread() {
  nb::module_ threading = nb::module_::import_("threading");
  return threading.attr("get_ident")().equal(threading.attr("main_thread")().attr("ident"));
}

// How often a waiting main thread checks for signals: a load into
// huge-page memory copies several GB/s, and at 20 ms it copied half of a
// 256 MiB model after Ctrl-C.
constexpr std::chrono::milliseconds kSignalCheck{5};

// Runs work(stop) on a thread of its own, the GIL let go, while this thread
// checks for signals every kSignalCheck: if a handler raises
// (KeyboardInterrupt), sets stop, waits for work to return and gives back
// what was raised. Without a thread to spare, runs work here.

template <class Work>
std::optional<nb::python_error> wait_checking_signals(Work&& work) {
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable finished_changed;
  bool finished = false;  // under mutex
  std::exception_ptr failure;
  std::optional<std::thread> worker;
  try {
    worker.emplace([&] {
      try {
        work(stop);
      } catch (...) {
        failure = std::current_exception();
      }
      std::lock_guard lock(mutex);
      finished = true;
      finished_changed.notify_all();
    });
  } catch (const std::system_error&) {
    GilReleased no_gil;
    work(stop);
    return std::nullopt;
  }
  std::optional<nb::python_error> raised;
  for (;;) {
    {
      GilReleased no_gil;
      std::unique_lock lock(mutex);
      if (finished_changed.wait_for(lock, kSignalCheck,
                                    [&] { return finished; })) {
        break;
      }
    }
    if (!raised && PyErr_CheckSignals() != 0) {
      raised.emplace();  // takes the raised exception out of the interpreter
      stop = true;
    }
  }
  worker->join();
  if (failure) std::rethrow_exception(failure);
  return raised;
}

template <class T>
T value_or_raise(Result<T> result) {
  if (!result.ok()) raise(result.status());
  return std::move(result).value();
}

nb::dict device_dict(const DeviceInfo& d) {
  nb::dict out;
  out["index"] = d.index;
  out["name"] = text(d.name);
  out["total_memory_bytes"] = d.total_memory_bytes;
  out["uuid"] = d.has_uuid() ? d.uuid_string() : std::string();
  out["pci_bus_id"] = text(d.pci_bus_id);
  out["dlpack_device"] = nb::make_tuple(d.dlpack_device_type, d.dlpack_device_id);
  return out;
}

// How a Python user trusts a plugin folder (the keyword argument of Runtime
// and plugins(), the CLI's --trust-plugin-path), named where one is refused.
constexpr const char* kTrustPathOption = "trust_plugin_path=FOLDER";

// The user's trusted paths, absolute (relative ones to the current folder,
// as the CLI's --trust-plugin-path), then the package's own plugin folders:
// the package's plugins are trusted exactly as much as its Python code,
// which Python already runs from the folder above them. So an install made
// with umask 002 (group-writable files and folders) loads its own host
// plugin, while a group-writable folder of the user's is still refused.
std::vector<fs::path> trusted_paths(const std::vector<fs::path>& user_paths,
                                    const std::vector<fs::path>& package_dirs) {
  std::vector<fs::path> out;
  for (const fs::path& p : user_paths) out.push_back(fs::absolute(p).lexically_normal());
  out.insert(out.end(), package_dirs.begin(), package_dirs.end());
  return out;
}

// `dirs` first (the caller's), `package_dirs` after DEVALLOC_PLUGIN_PATH.
nb::list plugins(const std::vector<fs::path>& dirs, const std::vector<fs::path>& trust_paths,
                 const std::vector<fs::path>& package_dirs) {
  nb::list out;
  PluginSearchOptions search;
  search.command_line_dirs = dirs;
  search.fallback_dirs = package_dirs;
  search.trusted_paths = trusted_paths(trust_paths, package_dirs);
  search.trust_path_option = kTrustPathOption;
  for (const PluginCandidate& c : PluginLoader(search).discover()) {
    nb::dict entry;
    entry["name"] = text(c.name);
    entry["path"] = path_text(c.path);
    entry["outcome"] = std::string(to_string(c.outcome));
    entry["reason"] = text(c.reason);
    nb::list devices;
    if (c.plugin) {
      entry["version"] = text(c.plugin->version());
      entry["abi"] = nb::make_tuple(c.plugin->abi_major(), c.plugin->abi_minor());
      for (const DeviceInfo& d : c.plugin->devices()) devices.append(device_dict(d));
    }
    entry["devices"] = devices;
    out.append(entry);
  }
  return out;
}

// A tensor of a loaded program. Holds the program, and so its buffers and
// plugins, for as long as it (or a DLPack export of it) lives.
struct Tensor {
  std::shared_ptr<LoadedProgram> program;
  LoadedTensor tensor;

  // nanobind's ndarray takes at most this many dimensions, and ends the
  // process on more; a tensor of the file may have any number.
  static constexpr size_t kMaxDims = 128;

  // A view of the device memory as a nanobind ndarray, owned by `self`.
  nb::ndarray<nb::array_api> ndarray(nb::handle self) const {
    if (tensor.planned.shape.size() > kMaxDims) {
      throw nb::buffer_error(("tensor " + quote(tensor.name()) + " has " +
                              std::to_string(tensor.planned.shape.size()) +
                              " dimensions; a DLPack export here takes at most " +
                              std::to_string(kMaxDims))
                                 .c_str());
    }
    std::vector<size_t> shape(tensor.planned.shape.begin(), tensor.planned.shape.end());
    const DLDataType t = to_dlpack(tensor.planned.dtype);
    const DeviceInfo& d = tensor.device().info();
    void* data = reinterpret_cast<void*>(static_cast<uintptr_t>(tensor.address()));
    return nb::ndarray<nb::array_api>(data, shape.size(), shape.data(), self, nullptr,
                         nb::dlpack::dtype{t.code, t.bits, t.lanes},
                         d.dlpack_device_type, d.dlpack_device_id);
  }
};

// __dlpack__'s arguments, each refused by name: nanobind's ndarray took a
// str as the stream and copy="y" as a flag, and a positional stream gave
// "incompatible function arguments" naming none. A positional stream is
// moved into kwargs (the array API lets stream be given so).
void check_dlpack_arguments(const nb::args& args, nb::kwargs& kwargs) {
  if (args.size() > 1) {
    throw nb::type_error(("__dlpack__() takes at most one positional argument (stream), got " +
                          std::to_string(args.size()))
                             .c_str());
  }
  if (args.size() == 1) {
    if (kwargs.contains("stream")) {
      throw nb::type_error("__dlpack__() got stream both by position and by keyword");
    }
    kwargs["stream"] = args[0];
  }
  const auto type_of = [](nb::handle value) {
    return nb::cast<std::string>(nb::type_name(value.type()));
  };
  if (kwargs.contains("stream")) {
    nb::handle stream = kwargs["stream"];
    if (!stream.is_none() && (!PyLong_Check(stream.ptr()) || PyBool_Check(stream.ptr()))) {
      throw nb::type_error(("__dlpack__(): stream: None or an int (a stream or queue handle), "
                            "not " + type_of(stream))
                               .c_str());
    }
  }
  if (kwargs.contains("copy")) {
    nb::handle copy = kwargs["copy"];
    if (!copy.is_none() && !PyBool_Check(copy.ptr())) {
      throw nb::type_error(("__dlpack__(): copy: True, False or None, not " + type_of(copy)).c_str());
    }
  }
}

// A load's progress callback, on the loading threads. What it raises stops
// the load, and is raised from load() once the load returned.
struct ProgressRelay {
  nb::object callback;
  // The exit waits for the load: it was started inside a progress callback,
  // or by the thread that ran the atexit hook.
  bool awaited = false;
  std::mutex mutex;
  std::optional<nb::python_error> error;

  void operator()(uint64_t done, uint64_t total) {
    // Once the process exits the callback is skipped, not waited for: the
    // load goes on to its end (the exit waits for that).
    if (!start_taking_gil_unless_exiting(awaited)) return;
    struct TakingGil {
      ~TakingGil() { done_taking_gil(); }  // after the GIL is given back
    } taking;
    nb::gil_scoped_acquire gil;
    {
      std::lock_guard lock(mutex);
      if (error) return;
    }
    try {
      callback(done, total);
    } catch (nb::python_error& e) {
      {
        std::lock_guard lock(mutex);
        error.emplace(std::move(e));
      }
      // The core stops a load whose progress callback throws (and frees
      // what it allocated); load() then raises the callback's exception.
      throw std::runtime_error("the progress callback raised");
    }
  }
};

// The report of the calling thread's last successful load
// (Runtime.last_load_report).
thread_local LoadReport t_last_report;

class PyRuntime {
 public:
  PyRuntime(std::optional<fs::path> config_path, const std::vector<fs::path>& trust_paths,
            const std::vector<fs::path>& package_dirs) {
    config_ = config_path ? value_or_raise(read_config(*config_path)) : default_config();
    // The package's own plugins come after the config's folders and
    // DEVALLOC_PLUGIN_PATH, which may replace them.
    config_.fallback_plugin_path = package_dirs;
    for (fs::path& p : trusted_paths(trust_paths, package_dirs)) {
      config_.trust_paths.push_back(std::move(p));
    }
    config_.trust_path_option = kTrustPathOption;
  }

  std::shared_ptr<LoadedProgram> load(const fs::path& plan_path,
                                      const std::vector<std::string>& methods,
                                      std::optional<bool> verify, nb::object progress,
                                      std::optional<uint32_t> rank,
                                      std::optional<uint32_t> world_size) {
    ++g_loads_running;
    struct Running {
      ~Running() { --g_loads_running; }
    } running;
    Plan plan = value_or_raise(read_plan(plan_path));
    SafetensorsCache files;
    PlanValidationOptions checks;
    checks.cache = &files;
    checks.external_files = config_.load.external_files;
    if (Status s = validate_plan(plan, checks); !s.ok()) raise(s);
    // A plan for several ranks: the rank given, else the launcher's (the
    // core's Runtime::load reads it from the environment).
    std::optional<JobRank> job;
    if (rank || world_size) {
      if (!rank) raise(Status(StatusCode::invalid_argument, "world_size needs rank"));
      job.emplace();
      job->rank = *rank;
      job->world_size = world_size.value_or(plan.world_size == 0 ? 1 : plan.world_size);
      job->local_rank = job->rank;
      job->source = "rank=" + std::to_string(job->rank);
      if (Status s = check_rank(*job); !s.ok()) raise(s);
    }

    // The callback is this load's own, not the core runtime's: loads of one
    // Runtime run side by side, each calling back only its own callback,
    // and nothing of the Runtime is held while it runs.
    ProgressRelay relay;
    LoadProgress own_progress;
    if (!progress.is_none()) {
      relay.callback = progress;
      relay.awaited = t_taking_gil > 0 || is_exit_thread();
      own_progress = std::ref(relay);
    }
    Result<std::shared_ptr<LoadedProgram>> program = Status();
    LoadReport report;
    const auto run = [&](const LoadProgress& with_progress) {
      const CoreLoad counted;
      program = shared_runtime()->load(std::move(plan), {.methods = methods,
                                                         .report = &report,
                                                         .files = &files,
                                                         .verify = verify,
                                                         .progress = with_progress,
                                                         .rank = job});
    };
    if (on_main_thread()) {
      // Python runs signal handlers (Ctrl-C's KeyboardInterrupt) on the main
      // thread only, and only when it runs Python: the load runs on a thread
      // of its own while this one waits and checks for signals; what a
      // handler raises stops the load and is raised once it returned.
      std::optional<nb::python_error> interrupted = wait_checking_signals(
          [&](const std::atomic<bool>& stop) {
            run([&](uint64_t done, uint64_t total) {
              if (stop.load()) throw std::runtime_error("interrupted by a signal");
              if (own_progress) own_progress(done, total);
            });
          });
      if (interrupted) throw std::move(*interrupted);
    } else {
      GilReleased no_gil;
      run(own_progress);
    }
    if (relay.error) throw std::move(*relay.error);
    std::shared_ptr<LoadedProgram> loaded = value_or_raise(std::move(program));
    t_last_report = report;
    // What the load tolerated but the user should know (late releases), and
    // under [load] fallback = "warn" each buffer on a fallback, with why.
    std::vector<std::string> warnings = load_warnings(report);
    if (config_.load.fallback == FallbackPolicy::warn) {
      for (const auto& buffer : loaded->buffers()) {
        if (buffer->device().is_fallback) {
          warnings.push_back("fallback: " + fallback_line(buffer->memory_id(), buffer->device()));
        }
      }
    }
    for (const std::string& w : warnings) {
      if (PyErr_WarnEx(PyExc_RuntimeWarning, w.c_str(), 1) != 0) throw nb::python_error();
    }
    return loaded;
  }

  const RuntimeConfig& config() const { return config_; }

  // What the calling thread's last successful load did.
  nb::dict last_load_report() const {
    nb::dict out;
    nb::dict files;
    for (const FileReadStats& f : t_last_report.files) files[nb::str(f.path.c_str())] = f.bytes;
    out["files"] = files;
    out["bytes"] = t_last_report.bytes;
    out["constants"] = t_last_report.constants;
    out["seconds"] = t_last_report.seconds;
    return out;
  }

 private:
  // The core runtime, created by the first load; called without the GIL.
  std::shared_ptr<Runtime> shared_runtime() {
    std::lock_guard lock(runtime_mutex_);
    if (!runtime_) runtime_ = Runtime::create(config_);
    return runtime_;
  }

  RuntimeConfig config_;
  // Guards runtime_ only; never held through a load.
  std::mutex runtime_mutex_;
  // One for every load, so each plugin is created once; load(verify=...)
  // overrides [load] verify per call.
  std::shared_ptr<Runtime> runtime_;
};

void write_plan_for(const std::vector<fs::path>& files, const fs::path& out,
                    const std::vector<std::pair<std::string, std::string>>& place,
                    const std::string& default_device, uint64_t alignment,
                    const std::vector<std::string>& methods) {
  PlanBuildOptions options;
  // Pattern and tag as given: joined as "PATTERN=TAG" and split again, a
  // '=' in either would move the split (build_plan checks both).
  for (const auto& [pattern, device] : place) options.rules.push_back({pattern, device});
  options.default_device = default_device;
  options.alignment = alignment;
  options.methods = methods;
  PlanBuildReport built;
  value_or_raise(build_and_write_plan(files, out, options, &built));
  // As `devalloc plan` warns on stderr: a glob that placed nothing.
  for (const std::string& line : built.unused_rules) {
    if (PyErr_WarnEx(PyExc_UserWarning, ("place: " + line).c_str(), 2) != 0) {
      throw nb::python_error();
    }
  }
}

}  // namespace

NB_MODULE(_native, m) {
  nb::module_::import_("atexit").attr("register")(
      nb::cpp_function(&stop_taking_gil_at_exit));
  m.attr("__version__") = DEVALLOC_PYTHON_VERSION;
  m.def("plugins", &plugins, nb::arg("dirs"), nb::arg("trust_paths"), nb::arg("package_dirs"));
  m.def("write_plan", &write_plan_for, nb::arg("files"), nb::arg("out"), nb::arg("place"),
        nb::arg("default_device"), nb::arg("alignment"), nb::arg("methods"));

  nb::class_<Tensor>(m, "Tensor",
                     "A tensor of a loaded Program, in its device's memory.\n\n"
                     "It holds its program, and so the device buffers and the plugin, "
                     "for as long as it or an array made from it lives. Exported "
                     "through DLPack without a copy: numpy.from_dlpack(t) or t.numpy() "
                     "for host memory, torch.from_dlpack(t) for a device's.")
      .def_prop_ro("name", [](const Tensor& t) { return t.tensor.name(); },
                   "The tensor's name in the plan and the safetensors file.")
      .def_prop_ro("dtype", [](const Tensor& t) {
        return std::string(to_string(t.tensor.planned.dtype));
      }, "The safetensors dtype name: \"F32\", \"BF16\", \"I64\", ...")
      .def_prop_ro("shape", [](const Tensor& t) {
        nb::list shape;
        for (uint64_t n : t.tensor.planned.shape) shape.append(n);
        return nb::tuple(shape);
      }, "The shape, a tuple of ints.")
      .def_prop_ro("nbytes", [](const Tensor& t) { return t.tensor.nbytes(); },
                   "Its size in bytes.")
      .def_prop_ro("address", [](const Tensor& t) { return t.tensor.address(); },
                   "Its address in the device's memory, an int.")
      .def_prop_ro("device", [](const Tensor& t) { return t.tensor.device().describe(); },
                   "The device it is on, in words: "
                   "'cuda:0 (plugin cuda, device 1 \"...\")'.")
      .def_prop_ro("plugin", [](const Tensor& t) { return text(t.tensor.device().plugin_name); },
                   "The name of the plugin that holds its memory (\"host\", \"cuda\", ...).")
      .def_prop_ro("device_index", [](const Tensor& t) { return t.tensor.device().device; },
                   "The index of its device among the plugin's devices.")
      .def_prop_ro("is_fallback", [](const Tensor& t) { return t.tensor.device().is_fallback; },
                   "True when its device is a fallback of the planned device tag.")
      .def_prop_ro("fallback_reason",
                   [](const Tensor& t) { return text(t.tensor.device().fallback_reason); },
                   "Why each device tried before its fallback failed, as a load error "
                   "would say it (\"cdua index 0: plugin cdua is unavailable: ...\"); "
                   "\"\" when it is on its planned device.")
      .def("__dlpack_device__", [](const Tensor& t) {
        const DeviceInfo& d = t.tensor.device().info();
        return nb::make_tuple(d.dlpack_device_type, d.dlpack_device_id);
      }, "(DLPack device type, device id): CPU 1, CUDA 2, ROCm 10, oneAPI 14.")
      // stream, max_version, dl_device and copy are handled by nanobind's
      // ndarray, which makes the (versioned or legacy) capsule.
      .def("__dlpack__", [](nb::handle self, nb::args args, nb::kwargs kwargs) {
        check_dlpack_arguments(args, kwargs);
        const Tensor& t = nb::cast<const Tensor&>(self);
        nb::object array = nb::cast(t.ndarray(self));
        return array.attr("__dlpack__")(**kwargs);
      }, "__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)\n\n"
         "A DLPack capsule viewing the tensor's memory, versioned when max_version "
         "is 1.x. copy=True and another dl_device raise BufferError.");

  nb::class_<LoadedProgram>(m, "Program",
                            "The tensors of the methods a Runtime.load loaded: "
                            "program[name] is a Tensor (KeyError for a name of no loaded "
                            "method), `name in program`, len(program).\n\n"
                            "Its device memory is freed when the program and the last of "
                            "its tensors are gone.")
      .def("names", [](const LoadedProgram& p) {
        std::vector<std::string> names;
        for (const LoadedTensor& t : p.tensors()) names.push_back(t.name());
        return names;
      }, "The names of the loaded tensors, a list.")
      .def("methods", &LoadedProgram::methods, "The names of the loaded methods, a list.")
      // A name is a str; anything else is in no program (as a key of the
      // wrong type is in no dict), never a TypeError.
      .def("__contains__", [](const LoadedProgram& p, nb::handle key) {
        if (!nb::isinstance<nb::str>(key)) return false;
        const std::optional<std::string_view> name = utf8(key);
        return name && p.find(*name).has_value();
      }, nb::sig("def __contains__(self, name: object, /) -> bool"), nb::arg("name").none())
      .def("__len__", [](const LoadedProgram& p) { return p.tensors().size(); })
      .def("__getitem__", [](std::shared_ptr<LoadedProgram> p, nb::handle key) {
        if (!nb::isinstance<nb::str>(key)) {
          throw nb::key_error(("a tensor name is a str, not " +
                               nb::cast<std::string>(nb::type_name(key.type())))
                                  .c_str());
        }
        const std::optional<std::string_view> name = utf8(key);
        if (!name) {
          // Python's own repr escapes the surrogate; at most 200 characters of it.
          const size_t length = nb::len(key);
          const std::string shown = nb::cast<std::string>(
              nb::repr(key.attr("__getitem__")(nb::slice(0, 200))));
          throw nb::key_error(("no tensor " + shown +
                               (length > 200 ? "... (" + std::to_string(length) + " characters)"
                                             : std::string()) +
                               ": a name with a lone surrogate is in no plan")
                                  .c_str());
        }
        std::optional<LoadedTensor> t = p->find(*name);
        if (!t) {
          throw nb::key_error(("no tensor " + quote(*name) + " in the loaded methods").c_str());
        }
        return Tensor{p, *t};
      }, nb::sig("def __getitem__(self, name: str, /) -> Tensor"), nb::arg("name").none());

  nb::class_<PyRuntime>(m, "Runtime")
      .def(nb::init<std::optional<fs::path>, const std::vector<fs::path>&,
                    const std::vector<fs::path>&>(),
           nb::arg("config").none(), nb::arg("trust_paths"), nb::arg("package_dirs"))
      .def("load", &PyRuntime::load, nb::arg("plan"), nb::arg("methods"),
           nb::arg("verify").none(), nb::arg("progress").none(), nb::arg("rank").none(),
           nb::arg("world_size").none())
      .def("last_load_report", &PyRuntime::last_load_report)
      .def_prop_ro("plugin_path", [](const PyRuntime& r) {
        nb::list out;
        for (const auto& p : r.config().plugin_path) out.append(path_text(p));
        for (const auto& p : r.config().fallback_plugin_path) out.append(path_text(p));
        return out;
      });
}

}  // namespace devalloc::python
