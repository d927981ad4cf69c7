#include <devalloc/input_text.hpp>
#include <devalloc/plugin.hpp>
#include <devalloc/regular_file.hpp>

#include "elf_check.hpp"
#include "guarded_call.hpp"

#include <boost/dll/shared_library.hpp>

#include <cstring>
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

// Boost.DLL's what() wraps dlerror's text: "boost::dll::shared_library::
// load() failed (dlerror system message: TEXT): Bad file descriptor", the
// last part a stale errno. TEXT alone, or all of what() if it reads
// otherwise.
std::string_view dlerror_text(std::string_view what) {
  constexpr std::string_view kOpen = "(dlerror system message: ";
  const size_t start = what.find(kOpen);
  const size_t end = what.rfind("): ");
  if (start == std::string_view::npos || end == std::string_view::npos ||
      end < start + kOpen.size()) {
    return what;
  }
  return what.substr(start + kOpen.size(), end - start - kOpen.size());
}

std::string message_of(const devalloc_error& error) {
  const size_t n = strnlen(error.message, sizeof error.message);
  return n == 0 ? std::string("(no message)")
                : escaped(std::string_view(error.message, n), sizeof error.message);
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

  auto impl = std::make_unique<Impl>();
  try {
    // RTLD_LOCAL keeps one plugin's symbols from resolving another's;
    // RTLD_NOW reports a missing symbol here instead of at first call.
    impl->library.load(path, boost::dll::load_mode::rtld_now |
                                 boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    // dlerror's own words (they name a missing dependency), escaped: they
    // repeat the file name.
    return {nullptr, refuse(PluginOutcome::open_failed,
                            StatusCode::runtime_unavailable, path,
                            "cannot be opened: " + escaped(dlerror_text(e.what()), 8192))};
  }

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

  devalloc_negotiation n{};
  n.struct_size = sizeof n;
  n.host_min_major = DEVALLOC_ABI_VERSION_MAJOR;
  n.host_max_major = DEVALLOC_ABI_VERSION_MAJOR;
  n.host_max_minor = DEVALLOC_ABI_VERSION_MINOR;
  devalloc_error error{};
  error.struct_size = sizeof error;
  const devalloc_status status = detail::guarded_call(
      DEVALLOC_PLUGIN_ENTRY_POINT_NAME, &error, [&] { return negotiate(&n, &error); });

  const std::string loader_speaks =
      "this loader speaks " + std::to_string(DEVALLOC_ABI_VERSION_MAJOR) +
      ".x";
  auto offered = [&] {
    return "ABI " + std::to_string(n.plugin_major) + "." +
           std::to_string(n.plugin_minor) + " offered";
  };
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
  const auto* api = static_cast<const devalloc_plugin_api_v1*>(n.api);
  if (api->struct_size < DEVALLOC_PLUGIN_API_V1_MIN_SIZE) {
    return {nullptr,
            refuse(PluginOutcome::table_too_small, StatusCode::unsupported,
                   path,
                   "function table is " + std::to_string(api->struct_size) +
                       " bytes, ABI " +
                       std::to_string(DEVALLOC_ABI_VERSION_MAJOR) +
                       ".0 needs at least " +
                       std::to_string(DEVALLOC_PLUGIN_API_V1_MIN_SIZE))};
  }
  if (api->abi_major != DEVALLOC_ABI_VERSION_MAJOR) {
    return {nullptr,
            refuse(PluginOutcome::version_mismatch, StatusCode::unsupported,
                   path,
                   "function table says ABI " +
                       std::to_string(api->abi_major) + ", negotiated " +
                       std::to_string(n.plugin_major))};
  }
  if (const char* missing = first_missing_required(*api)) {
    return {nullptr, refuse(PluginOutcome::negotiation_failed,
                            StatusCode::unsupported, path,
                            std::string("function table has no ") + missing +
                                ", which ABI 1 requires")};
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
  library->name_ = own_text(api->plugin_name);
  library->version_ = own_text(api->plugin_version);
  library->abi_major_ = n.plugin_major;
  library->abi_minor_ = n.plugin_minor;
  library->api_ = api;
  return {std::move(library), {PluginOutcome::loaded, Status()}};
}

}  // namespace devalloc
