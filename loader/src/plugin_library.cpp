#include <devalloc/input_text.hpp>
#include <devalloc/plugin.hpp>
#include <devalloc/regular_file.hpp>

#include "elf_check.hpp"
#include "guarded_call.hpp"
#include "loaded_libraries.hpp"
#include "plugin_status.hpp"

#include <boost/dll/shared_library.hpp>

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <string_view>
#include <system_error>

namespace devalloc {

struct PluginLibrary::Impl {
  boost::dll::shared_library library;  // closed last
};

PluginLibrary::PluginLibrary(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

PluginLibrary::~PluginLibrary() = default;

namespace {

PluginError refuse(PluginOutcome outcome, StatusCode code,
                   const std::filesystem::path& path,
                   const std::string& reason) {
  return {outcome, Status(code, "plugin " + path_for_message(path.string()) + ": " + reason)};
}

std::string message_of(const devalloc_error& error) {
  const size_t n = strnlen(error.message, sizeof error.message);
  return n == 0 ? std::string("(no message)")
                : escaped(std::string_view(error.message, n), sizeof error.message);
}

const char* symbol_type_name(unsigned type) {
  switch (type) {
    case STT_OBJECT: return "a data object (STT_OBJECT)";
    case STT_TLS: return "a thread-local variable (STT_TLS)";
    case STT_COMMON: return "a common block (STT_COMMON)";
    case STT_SECTION: return "a section (STT_SECTION)";
    case STT_FILE: return "a file name (STT_FILE)";
    default: return nullptr;
  }
}

// Whether address lies in a loaded segment that is executable: 1, in one
// that is not: 0, in none: -1.
int executable_at(const void* address) {
  struct Search {
    uintptr_t address;
    int answer = -1;
  } search{reinterpret_cast<uintptr_t>(address)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          if (segment.p_type != PT_LOAD) continue;
          const uintptr_t start = info->dlpi_addr + segment.p_vaddr;
          if (s->address >= start && s->address - start < segment.p_memsz) {
            s->answer = (segment.p_flags & PF_X) != 0 ? 1 : 0;
            return 1;
          }
        }
        return 0;
      },
      &search);
  return search.answer;
}

// Why what dlsym found by the entry point's name cannot be called, or
// nothing. dlsym finds a data object by that name as well as a function;
// calling it would jump into data. The dynamic symbol says what it is
// (STT_FUNC, or STT_GNU_IFUNC: then dlsym returned what its resolver
// picked, which no dynamic symbol may name); whatever it is, it must lie in
// executable code.
std::optional<std::string> entry_point_problem(const void* entry) {
  constexpr const char* kMust = "; the entry point must be a function (PLUGIN-1)";
  Dl_info info{};
  void* found = nullptr;
  if (dladdr1(entry, &info, &found, RTLD_DL_SYMENT) != 0 && found != nullptr &&
      info.dli_sname != nullptr &&
      std::strcmp(info.dli_sname, DEVALLOC_PLUGIN_ENTRY_POINT_NAME) == 0) {
    const auto* symbol = static_cast<const ElfW(Sym)*>(found);
#if __ELF_NATIVE_CLASS == 64
    const unsigned type = ELF64_ST_TYPE(symbol->st_info);
#else
    const unsigned type = ELF32_ST_TYPE(symbol->st_info);
#endif
    if (type == STT_FUNC || type == STT_GNU_IFUNC) return std::nullopt;
    if (const char* name = symbol_type_name(type)) {
      return std::string(DEVALLOC_PLUGIN_ENTRY_POINT_NAME
                         " is not a function: its dynamic symbol is ") +
             name + kMust;
    }
  }
  if (executable_at(entry) != 1) {
    return std::string(DEVALLOC_PLUGIN_ENTRY_POINT_NAME
                       " is not a function: it lies outside the executable code of the "
                       "loaded libraries") +
           kMust;
  }
  return std::nullopt;
}

// dlopen through a pointer the compiler cannot see through: glibc declares
// dlopen as not throwing, and a call it believes cannot throw is left out of
// this function's exception table, through which an exception out of a
// static initializer would then pass on to whatever catch lies above. A
// call through this pointer may throw as far as the compiler knows, so the
// noexcept below applies to it: std::terminate.
void* (*volatile g_dlopen)(const char*, int) = &::dlopen;

// Opens the library with RTLD_NOW | RTLD_LOCAL, which runs its static
// initializers; an exception out of them ends the process (PLUGIN-7).
void* run_static_initializers(const std::filesystem::path& path) noexcept {
  return g_dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
}

// Every v1 function a host needs; allocate_host/free_host are optional.
const char* first_missing_required(const devalloc_plugin_api_v1& api) {
  if (api.create == nullptr) return "create";
  if (api.destroy == nullptr) return "destroy";
  if (api.get_capabilities == nullptr) return "get_capabilities";
  if (api.get_device_count == nullptr) return "get_device_count";
  if (api.get_device_properties == nullptr) return "get_device_properties";
  if (api.allocate == nullptr) return "allocate";
  if (api.deallocate == nullptr) return "deallocate";
  if (api.copy_host_to_device == nullptr) return "copy_host_to_device";
  if (api.copy_device_to_host == nullptr) return "copy_device_to_host";
  if (api.synchronize == nullptr) return "synchronize";
  return nullptr;
}

}  // namespace

std::pair<std::shared_ptr<PluginLibrary>, PluginError> PluginLibrary::open(
    const std::filesystem::path& path) {
  Result<RegularFile> file = open_regular_file(path);
  if (!file.ok()) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      return {nullptr, refuse(PluginOutcome::not_found,
                              StatusCode::runtime_unavailable, path,
                              "no such file")};
    }
    return {nullptr, refuse(PluginOutcome::open_failed,
                            StatusCode::runtime_unavailable, path,
                            "cannot be opened: " + file.status().message())};
  }
  return open(path, *file);
}

std::pair<std::shared_ptr<PluginLibrary>, PluginError> PluginLibrary::open(
    const std::filesystem::path& path, const RegularFile& file) {
  // glibc's dlopen maps what the program headers say and dies of SIGBUS on
  // a page past the end of a truncated file: read them first.
  if (auto problem = detail::elf_shared_object_problem(file.fd(), file.size())) {
    return {nullptr, refuse(PluginOutcome::open_failed,
                            StatusCode::runtime_unavailable, path,
                            "cannot be opened: " + *problem)};
  }

  // The dynamic linker hands out an object already loaded under this name
  // without opening the file: a file renamed over the one still loaded
  // would be "opened" as the old code, every check above done on the new.
  if (auto replaced = detail::replaced_while_loaded(path, file)) {
    return {nullptr, refuse(PluginOutcome::open_failed, StatusCode::runtime_unavailable, path,
                            "not opened: " + *replaced)};
  }

  // The library's static initializers run here, inside dlopen. A C++
  // exception out of one (PLUGIN-7) would unwind through glibc's dlopen,
  // past the code that releases the dynamic linker's lock: nothing could
  // open, look up or close a library any more. And a catch above dlopen
  // does not reliably see it: glibc declares dlopen as not throwing, so an
  // optimized caller may have no handler for that call. No catch is tried:
  // the call below lets no exception out, and such a throw ends the process
  // at once (std::terminate), the same way in every build.
  void* const initialized = run_static_initializers(path);
  if (initialized == nullptr) {
    // dlerror's own words (they name a missing dependency), escaped: they
    // repeat the file name.
    const char* text = dlerror();
    return {nullptr, refuse(PluginOutcome::open_failed, StatusCode::runtime_unavailable, path,
                            "cannot be opened: " +
                                escaped(text != nullptr ? text : "dlopen failed", 8192))};
  }
  // Boost.DLL opens it again (the object loaded above, its initializers
  // run already) and holds it; the first handle goes when this returns.
  struct CloseFirstHandle {
    void* handle;
    ~CloseFirstHandle() { ::dlclose(handle); }
  } close_first{initialized};
  auto impl = std::make_unique<Impl>();
  std::error_code load_error;
  std::string thrown;
  bool threw = false;
  bool out_of_memory = false;
  try {
    // RTLD_LOCAL keeps one plugin's symbols from resolving another's;
    // RTLD_NOW reports a missing symbol here instead of at first call.
    impl->library.load(path,
                       boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local,
                       load_error);
  } catch (const std::exception& e) {
    // An allocation of Boost.DLL's own (a copy of the path): the plugin's
    // code ran above, not here.
    threw = true;
    out_of_memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
    try {
      thrown = ": " + escaped(e.what(), 8192);
    } catch (...) {
    }
  } catch (...) {
    threw = true;
  }
  if (threw) {
    return {nullptr,
            refuse(PluginOutcome::open_failed,
                   out_of_memory ? StatusCode::out_of_host_memory : StatusCode::internal, path,
                   "not opened: Boost.DLL failed around dlopen" + thrown +
                       "; the library is closed again, and a later try may succeed")};
  }
  if (load_error) {
    // Boost.DLL called nothing of the dynamic linker after the failed
    // dlopen, so dlerror's words are still this thread's.
    const char* text = dlerror();
    const std::string reason = text != nullptr ? std::string(text) : load_error.message();
    return {nullptr, refuse(PluginOutcome::open_failed,
                            StatusCode::runtime_unavailable, path,
                            "cannot be opened: " + escaped(reason, 8192))};
  }
  detail::remember_loaded(path, file);

  if (!impl->library.has(DEVALLOC_PLUGIN_ENTRY_POINT_NAME)) {
    return {nullptr,
            refuse(PluginOutcome::no_entry_point, StatusCode::unsupported,
                   path,
                   "does not export " DEVALLOC_PLUGIN_ENTRY_POINT_NAME
                   " (not a devalloc plugin, or built without "
                   "DEVALLOC_PLUGIN_EXPORT)")};
  }
  auto& negotiate = impl->library.get<std::remove_pointer_t<
      devalloc_plugin_negotiate_fn>>(DEVALLOC_PLUGIN_ENTRY_POINT_NAME);
  if (auto problem = entry_point_problem(reinterpret_cast<const void*>(&negotiate))) {
    return {nullptr, refuse(PluginOutcome::no_entry_point, StatusCode::unsupported, path,
                            *problem)};
  }

  // The struct is followed by slack, as every output struct the loader
  // hands out: a plugin that writes past the struct_size it was handed
  // (PLUGIN-4; one built against a header whose struct grew) scribbles into
  // the slack, not over the loader's stack, and is refused. The slack holds
  // a pattern in which no two neighbouring bytes are equal, so that any
  // fill is seen.
  struct NegotiationWithSlack {
    devalloc_negotiation value;
    unsigned char slack[512];
  };
  static_assert(offsetof(NegotiationWithSlack, slack) == sizeof(devalloc_negotiation));
  const auto slack_byte = [](size_t i) { return static_cast<unsigned char>(0xa5 ^ i); };
  NegotiationWithSlack buffer{};
  for (size_t i = 0; i < sizeof buffer.slack; ++i) buffer.slack[i] = slack_byte(i);
  devalloc_negotiation& n = buffer.value;
  n.struct_size = sizeof n;
  n.host_min_major = DEVALLOC_ABI_VERSION_MAJOR;
  n.host_max_major = DEVALLOC_ABI_VERSION_MAJOR;
  n.host_max_minor = DEVALLOC_ABI_VERSION_MINOR;
  devalloc_error error{};
  error.struct_size = sizeof error;
  const devalloc_status status = detail::guarded_call(
      DEVALLOC_PLUGIN_ENTRY_POINT_NAME, &error, [&] { return negotiate(&n, &error); });
  for (size_t i = 0; i < sizeof buffer.slack; ++i) {
    if (buffer.slack[i] != slack_byte(i)) {
      return {nullptr, refuse(PluginOutcome::negotiation_failed, StatusCode::internal, path,
                              DEVALLOC_PLUGIN_ENTRY_POINT_NAME " wrote past the struct_size of " +
                                  std::to_string(sizeof n) + " bytes it was handed (byte " +
                                  std::to_string(sizeof n + i) +
                                  " changed), which PLUGIN-4 forbids (built against another "
                                  "header?)")};
    }
  }

  const std::string loader_speaks =
      "this loader speaks " + std::to_string(DEVALLOC_ABI_VERSION_MAJOR) +
      ".x";
  auto offered = [&] {
    return "ABI " + std::to_string(n.plugin_major) + "." +
           std::to_string(n.plugin_minor) + " offered";
  };
  if (status != DEVALLOC_STATUS_OK && !detail::abi_defines(status)) {
    // PLUGIN-5, worded as for every other call; its out fields are not
    // believed either.
    const size_t length = strnlen(error.message, sizeof error.message);
    return {nullptr,
            refuse(PluginOutcome::negotiation_failed, StatusCode::internal, path,
                   detail::undefined_status_text(
                       DEVALLOC_PLUGIN_ENTRY_POINT_NAME, status,
                       length == 0 ? std::string()
                                   : escaped(std::string_view(error.message, length),
                                             sizeof error.message)))};
  }
  if (status != DEVALLOC_STATUS_OK) {
    const bool other_major = n.plugin_major != 0 &&
                             (n.plugin_major != DEVALLOC_ABI_VERSION_MAJOR ||
                              n.plugin_min_major > DEVALLOC_ABI_VERSION_MAJOR);
    if (other_major) {
      return {nullptr, refuse(PluginOutcome::version_mismatch,
                              StatusCode::unsupported, path,
                              offered() + ", " + loader_speaks +
                                  " (plugin says: " + message_of(error) +
                                  ")")};
    }
    return {nullptr,
            refuse(PluginOutcome::negotiation_failed,
                   status_code_from_abi(status), path,
                   std::string(DEVALLOC_PLUGIN_ENTRY_POINT_NAME) +
                       " refused with " +
                       to_string(status_code_from_abi(status)) + ": " +
                       message_of(error))};
  }
  if (n.plugin_major != DEVALLOC_ABI_VERSION_MAJOR) {
    return {nullptr, refuse(PluginOutcome::version_mismatch,
                            StatusCode::unsupported, path,
                            offered() + ", " + loader_speaks)};
  }
  if (n.api == nullptr) {
    return {nullptr, refuse(PluginOutcome::negotiation_failed,
                            StatusCode::internal, path,
                            DEVALLOC_PLUGIN_ENTRY_POINT_NAME
                            " returned OK without a function table")};
  }
  // PLUGIN-3: the table is read once, here. The loader keeps a copy of what
  // it knows of it (up to the plugin's struct_size), checks the copy and
  // calls through it only: a plugin that changes its table later (one in
  // writable memory) changes nothing, and a function the checks found is
  // never NULL when called.
  const auto* plugin_table = static_cast<const unsigned char*>(n.api);
  size_t table_size = 0;
  std::memcpy(&table_size, plugin_table, sizeof table_size);
  if (table_size < DEVALLOC_PLUGIN_API_V1_MIN_SIZE) {
    return {nullptr,
            refuse(PluginOutcome::table_too_small, StatusCode::unsupported,
                   path,
                   "function table is " + std::to_string(table_size) +
                       " bytes, ABI " +
                       std::to_string(DEVALLOC_ABI_VERSION_MAJOR) +
                       ".0 needs at least " +
                       std::to_string(DEVALLOC_PLUGIN_API_V1_MIN_SIZE))};
  }
  devalloc_plugin_api_v1 copy{};
  const size_t known = std::min(table_size, sizeof copy);
  std::memcpy(&copy, plugin_table, known);
  copy.struct_size = known;
  const devalloc_plugin_api_v1& api = copy;
  if (api.abi_major != DEVALLOC_ABI_VERSION_MAJOR) {
    return {nullptr,
            refuse(PluginOutcome::version_mismatch, StatusCode::unsupported,
                   path,
                   "function table says ABI " +
                       std::to_string(api.abi_major) + ", negotiated " +
                       std::to_string(n.plugin_major))};
  }
  if (const char* missing = first_missing_required(api)) {
    return {nullptr, refuse(PluginOutcome::negotiation_failed,
                            StatusCode::unsupported, path,
                            std::string("function table has no ") + missing +
                                ", which ABI 1 requires")};
  }
  // Every message names the plugin by it: without one they would read
  // `plugin ""`.
  if (api.plugin_name == nullptr) {
    return {nullptr, refuse(PluginOutcome::negotiation_failed, StatusCode::unsupported, path,
                            "function table has no plugin_name (NULL), which PLUGIN-3 "
                            "requires")};
  }
  if (api.plugin_name[0] == '\0') {
    return {nullptr, refuse(PluginOutcome::negotiation_failed, StatusCode::unsupported, path,
                            "function table has an empty plugin_name, which PLUGIN-3 forbids")};
  }

  std::shared_ptr<PluginLibrary> library(new PluginLibrary(std::move(impl)));
  library->path_ = path;
  // The plugin's own words, bounded and escaped: they go into messages,
  // which show at most kMaxQuotedBytes of them and the length of the rest.
  const auto own_text = [](const char* text) {
    constexpr size_t kLongest = 64 * 1024;
    if (text == nullptr) return std::string();
    const size_t length = strnlen(text, kLongest + 1);
    if (length <= kLongest) return escaped(std::string_view(text, length));
    return escaped(std::string_view(text, kMaxQuotedBytes)) + "... (over " +
           std::to_string(kLongest) + " bytes)";
  };
  library->name_ = own_text(api.plugin_name);
  library->version_ = own_text(api.plugin_version);
  library->abi_major_ = n.plugin_major;
  library->abi_minor_ = n.plugin_minor;
  library->api_ = copy;
  return {std::move(library), {PluginOutcome::loaded, Status()}};
}

}  // namespace devalloc
