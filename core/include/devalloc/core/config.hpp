// The runtime config: which plugins to load with which options, which
// physical device backs each device tag, per-memory-id overrides and load
// options. Read from TOML (docs/config.md is the reference); every error
// names file, line and column.
//
// Plugin names are not checked against what is installed: a name that is
// not configured under [plugins] is looked up on the plugin path when the
// runtime loads it, and a missing one fails there.
#pragma once

#include <devalloc/plugin.hpp>
#include <devalloc/plugin_loader.hpp>  // is_valid_plugin_name
#include <devalloc/status.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace devalloc {

// Where a config value was written. line and column are 1-based; 0 means
// "not from a file" (default_config, configs built in code).
struct SourceLocation {
  std::string file;
  uint32_t line = 0;
  uint32_t column = 0;

  // "file:line:column"; only "file" when line is 0.
  std::string to_string() const;
  bool operator==(const SourceLocation&) const = default;
};

// Longest device tag a plan or config may hold, in bytes ("cuda:0" has 6),
// and so the longest plugin name a config may give: a longer one is a typo
// or an attack, refused as bad input before anything is looked up by it
// (and before a message repeats it).
inline constexpr size_t kMaxDeviceTagBytes = 256;

// A device tag as plans and configs spell it: "name" or "name:index"
// ("cuda:0", "host"). name follows is_valid_plugin_name; index is decimal
// without leading zeros, so that one device has one spelling; the whole is
// at most kMaxDeviceTagBytes bytes.
struct DeviceTag {
  std::string name;
  std::optional<uint32_t> index;

  std::string to_string() const;
  bool operator==(const DeviceTag&) const = default;
};
std::optional<DeviceTag> parse_device_tag(std::string_view text);

// A memory id as a [memory] key spells it: decimal, without sign or leading
// zeros, at most 4294967295.
std::optional<uint32_t> parse_memory_id(std::string_view text);


// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" in lower case, from that form or
// 32 bare hex digits, either with an optional "GPU-" prefix, in any case.
// nullopt when text is not a UUID.
std::optional<std::string> normalize_uuid(std::string_view text);
// "dddd:bb:dd.f" in lower case, from "[domain:]bus:device.function" with a
// domain of up to 8 hex digits (nvidia-smi prints 8), a bus of up to 2, a
// device of up to 2 (at most 1f) and a function digit 0-7; a missing domain
// is 0000. nullopt when text is not a PCI bus id.
std::optional<std::string> normalize_pci_bus_id(std::string_view text);

// "4096", "4096B", "64KiB", "64 MiB", "1GiB", "2TiB" (powers of 1024) or
// "64KB", "64MB", "1GB", "2TB" (powers of 1000). Integers only; spaces (not
// tabs) may stand before the unit.
Result<uint64_t> parse_byte_size(std::string_view text);
// For people: "1.5 GiB", "12.0 KiB", "17 B" (powers of 1024, one decimal).
std::string human_bytes(uint64_t bytes);

enum class SelectorKind { index, uuid, pci_bus_id };
const char* to_string(SelectorKind kind);  // "index", "uuid", "pci_bus_id"

// Which device of a plugin: by its index, or by identity (UUID or PCI bus
// id), which survives renumbering by CUDA_VISIBLE_DEVICES and the like.
struct DeviceSelector {
  SelectorKind kind = SelectorKind::index;
  uint32_t index = 0;  // used when kind is index
  std::string id;      // normalized UUID or PCI bus id otherwise

  static DeviceSelector by_index(uint32_t index);
  // nullopt when text does not normalize (see normalize_uuid).
  static std::optional<DeviceSelector> by_uuid(std::string_view text);
  static std::optional<DeviceSelector> by_pci_bus_id(std::string_view text);

  // "index 1", "uuid 0f3c2a1e-...", "pci_bus_id 0000:3b:00.0"
  std::string to_string() const;
  bool operator==(const DeviceSelector&) const = default;
};

// A plugin (by config name) and a device of it.
struct DeviceBinding {
  std::string plugin;
  DeviceSelector selector;

  std::string to_string() const;  // "cuda index 1"
  bool operator==(const DeviceBinding&) const = default;
};

// [plugins.NAME]. NAME is what device tags and bindings refer to. Without
// `library` the file is libdevalloc_NAME.so on the plugin path; with it,
// NAME is only an alias, so one plugin file can be configured twice with
// different options.
struct PluginConfig {
  std::string name;
  std::optional<std::filesystem::path> library;  // absolute
  PluginOptions options;                         // sorted by key
  SourceLocation where;
  // `validate = true` (or "sources"): the validation layer wraps the plugin
  // (docs/reliability.md). Tests set faults here too.
  LayerSettings layers{};
  bool trust = false;  // skip the owner/permission checks (docs/security.md)

  // What PluginLoader::load takes: the library path when set, else name.
  std::string load_spec() const;
};

// One entry of a device tag's fallback list: another device tag (expanded
// with its own binding and fallbacks) or an explicit binding.
struct DeviceFallback {
  std::variant<std::string, DeviceBinding> target;
  SourceLocation where;
};

// [devices."TAG"].
struct DeviceTagConfig {
  std::string tag;
  DeviceBinding primary;
  std::vector<DeviceFallback> fallbacks;  // tried in order
  SourceLocation where;
};

// What a load does with a buffer whose device tag resolves only through a
// fallback ([load] fallback). Whatever the policy, the device is never a
// silent guess: the reason each earlier candidate failed travels with it
// (ResolvedDevice::fallback_reason).
enum class FallbackPolicy {
  allow,  // take the fallback; `devalloc load`/`inspect` report why on stdout
  warn,   // take it and warn on stderr, naming why the primary failed (default)
  error,  // refuse the load, naming the device tag and why the primary failed
};
const char* to_string(FallbackPolicy policy);  // "allow", "warn", "error"

// How the load pipeline reads constants out of their files ([load] read).
enum class ReadMode {
  automatic,  // mmap into staging slots and host-addressable memory (measured
              // fastest here, see docs/performance.md)
  mmap,       // memcpy from the file's mapping
  pread,      // pread(2) from the file
  direct_io,  // pread(2) with O_DIRECT (cold loads; page cache bypassed)
};
const char* to_string(ReadMode mode);  // "auto", "mmap", "pread", "direct_io"

// [load].
struct LoadOptions {
  uint64_t staging_bytes = uint64_t{64} << 20;
  uint32_t threads = 0;  // 0: automatic (see docs/config.md)
  bool verify = false;
  // How long a release may still be missing after synchronize returned
  // before the load fails (PLUGIN-21).
  std::chrono::milliseconds release_timeout{5000};
  ReadMode read = ReadMode::automatic;
  // Read straight into device memory a plugin says is host-addressable.
  bool direct = true;
  // Refuse a load whose buffers do not fit in the free memory their devices
  // report (get_memory_info) before allocating any of them.
  bool check_free_memory = true;
  // Honour a plan's "allow_external_files". False: every source file must
  // lie in its plan's folder whatever the plan says (plans not trusted).
  bool external_files = true;
  FallbackPolicy fallback = FallbackPolicy::warn;
};

// "500ms", "5s", "2min" (an integer and a unit; spaces, not tabs, may stand
// between them). Integers only.
Result<std::chrono::milliseconds> parse_duration(std::string_view text);

// Longest [load] release_timeout a config may give: a day. A release comes
// within milliseconds of synchronize; and a wait of more than ~292 years
// overflows the clock's deadline (nanoseconds in 64 bits), so that the wait
// ended at once.
inline constexpr std::chrono::milliseconds kMaxReleaseTimeout =
    std::chrono::hours(24);

// Most threads [load] threads accepts; more is a typo, not a machine.
inline constexpr uint32_t kMaxLoadThreads = 1024;

struct RuntimeConfig {
  std::filesystem::path source;  // the file or name it was read from; empty
                                 // for default_config()
  std::vector<std::filesystem::path> plugin_path;  // absolute, in order
  // Not read from the file: a program's own plugin folders, searched after
  // DEVALLOC_PLUGIN_PATH (the Python package's; see plugin_loader.hpp).
  std::vector<std::filesystem::path> fallback_plugin_path;
  // [security] trust_paths: plugin files at or below these skip the owner
  // and permission checks (docs/security.md). Absolute.
  std::vector<std::filesystem::path> trust_paths;
  // Not read from the file: how the program's user adds to trust_paths,
  // named where a plugin is refused (PluginSearchOptions::trust_path_option;
  // the CLI's "--trust-plugin-path"). Empty when the program has no way.
  std::string trust_path_option;
  std::map<std::string, PluginConfig, std::less<>> plugins;
  std::map<std::string, DeviceTagConfig, std::less<>> devices;
  std::map<uint32_t, std::string> memory_overrides;  // memory id -> tag
  LoadOptions load;

  // The configured entry for a plugin name, or one with only the name (and
  // so no options) for a plugin found by name on the plugin path.
  PluginConfig plugin(std::string_view name) const;
};

// No file: no plugins configured, no device tags, no overrides, default
// load options. Every tag "X:N" then means plugin X, index N, and "X" means
// plugin X, index 0 (see candidate_bindings).
RuntimeConfig default_config();

// Parses TOML text. source_name appears in every error and is the
// RuntimeConfig's source; relative paths in the text are resolved against
// the folder of source_name (made absolute against the current directory).
// Every problem found is reported, one per line, in file order; the status
// code is invalid_argument.
Result<RuntimeConfig> parse_config(std::string_view text,
                                   std::string_view source_name);

// A config file above this size is refused before it is read: configs are
// written by hand and are a few KiB.
inline constexpr uint64_t kMaxConfigBytes = 1ull << 20;

// Most dotted parts a key or table header may have ([a.b.c] and a.b.c = 1
// have three; devalloc's own keys have at most 4), and how deep arrays and
// inline tables may nest (fallback = [["cuda", { index = 1 }]] is 3 deep).
// Deeper text is refused before toml++ reads it: toml++ builds, walks and
// frees one nested table per part recursively, and 40 000 parts overflowed
// the stack; its own nesting cap (256) still let each level hold a long
// dotted key.
inline constexpr size_t kMaxConfigKeyParts = 64;
inline constexpr size_t kMaxConfigNesting = 32;

// Reads and parses a config file: a regular file of at most kMaxConfigBytes
// (a FIFO or /dev/zero is refused at once; devalloc/regular_file.hpp).
Result<RuntimeConfig> read_config(const std::filesystem::path& path);

}  // namespace devalloc
