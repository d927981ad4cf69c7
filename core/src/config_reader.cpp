#include <devalloc/core/config.hpp>
#include <devalloc/core/device_selection.hpp>

#include <toml++/toml.h>

#include <devalloc/input_text.hpp>
#include <devalloc/regular_file.hpp>

#include <devalloc/no_exceptions.hpp>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <system_error>
#include <utility>

namespace devalloc {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTagSyntax =
    "expected \"name\" or \"name:index\" of at most 256 bytes (name of letters, "
    "digits, \"_\" and \"-\"; index decimal without leading zeros)";
constexpr std::string_view kPluginNameSyntax =
    "use at most 256 letters, digits, \"_\" and \"-\"";
static_assert(kMaxDeviceTagBytes == 256, "kTagSyntax and kPluginNameSyntax give the limit");

// A plugin name a config may give: a tag's name is one, so no longer than
// a tag may be.
bool is_config_plugin_name(std::string_view name) {
  return name.size() <= kMaxDeviceTagBytes && is_valid_plugin_name(name);
}

const char* type_name(toml::node_type type) {
  switch (type) {
    case toml::node_type::none: return "nothing";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
  }
  return "an unknown value";
}

// A key as TOML would need it written inside a [section] header.
std::string key_text(std::string_view key) {
  return is_config_plugin_name(key) ? std::string(key) : quote(key);
}

struct Located {
  SourceLocation where;
  std::string message;
};

class ConfigReader {
 public:
  ConfigReader(std::string_view source_name, fs::path base_dir)
      : source_name_(source_name), base_dir_(std::move(base_dir)) {}

  Result<RuntimeConfig> read(const toml::table& root);

 private:
  SourceLocation at(const toml::source_region& region) const {
    return SourceLocation{source_name_, region.begin.line, region.begin.column};
  }
  void error(const toml::source_region& region, std::string message) {
    errors_.push_back({at(region), std::move(message)});
  }
  void type_error(const toml::node& node, const std::string& what,
                  std::string_view expected) {
    error(node.source(), what + " must be " + std::string(expected) +
                             ", found " + type_name(node.type()));
  }
  // table's `key`, when it is there: into `out` when a boolean, an error
  // naming it "<key> in <section>" when not.
  void read_boolean(const toml::table& table, std::string_view key, std::string_view section,
                    bool& out) {
    const toml::node* node = table.get(key);
    if (node == nullptr) return;
    if (const auto* boolean = node->as_boolean()) {
      out = boolean->get();
    } else {
      type_error(*node, "\"" + std::string(key) + "\" in " + std::string(section), "a boolean");
    }
  }
  // Reports every key of table not in known (which is sorted, as listed).
  void check_keys(const toml::table& table, std::string_view section,
                  std::initializer_list<std::string_view> known);
  // False (and an error at node) when text has a NUL or is not UTF-8.
  bool check(const toml::node& node, const std::string& what, std::string_view text) {
    if (const auto why = check_text(text)) {
      error(node.source(), what + " " + quote(text) + " " + *why);
      return false;
    }
    return true;
  }
  fs::path resolve(std::string_view text) const {
    const fs::path path(text);
    return (path.is_absolute() ? path : base_dir_ / path).lexically_normal();
  }

  void read_plugin_path(const toml::node& node);
  void read_security(const toml::node& node);
  void read_plugin(const toml::key& key, const toml::node& node);
  void read_options(const toml::node& node, PluginConfig& plugin,
                    const std::string& section);
  void read_device(const toml::key& key, const toml::node& node);
  std::optional<DeviceBinding> read_use(const toml::node& node,
                                        const DeviceTag& tag,
                                        const std::string& section);
  std::optional<DeviceBinding> read_binding_array(const toml::array& array,
                                                  const std::string& what);
  std::optional<DeviceSelector> read_selector(const toml::node& node,
                                              const std::string& what);
  void read_fallbacks(const toml::node& node, DeviceTagConfig& device,
                      const std::string& section);
  void read_memory(const toml::key& key, const toml::node& node);
  void read_load(const toml::table& table);
  Status failure();

  std::string source_name_;
  fs::path base_dir_;
  RuntimeConfig config_;
  std::vector<Located> errors_;
};

void ConfigReader::check_keys(const toml::table& table,
                              std::string_view section,
                              std::initializer_list<std::string_view> known) {
  for (const auto& [key, node] : table) {
    if (std::find(known.begin(), known.end(), key.str()) != known.end()) {
      continue;
    }
    std::string list;
    for (const auto name : known) {
      if (!list.empty()) list += ", ";
      list += name;
    }
    error(key.source(), "unknown key " + quote(key.str()) + " " +
                            std::string(section) + " (known: " + list + ")");
  }
}

Result<RuntimeConfig> ConfigReader::read(const toml::table& root) {
  config_.source = fs::path(source_name_);
  check_keys(root, "at the top level",
             {"devices", "load", "memory", "plugin_path", "plugins",
              "security"});

  if (const auto* node = root.get("plugin_path")) read_plugin_path(*node);
  if (const auto* node = root.get("security")) read_security(*node);
  if (const auto* node = root.get("plugins")) {
    if (const auto* table = node->as_table()) {
      for (const auto& [key, plugin] : *table) read_plugin(key, plugin);
    } else {
      type_error(*node, "\"plugins\"", "a table");
    }
  }
  if (const auto* node = root.get("devices")) {
    if (const auto* table = node->as_table()) {
      for (const auto& [key, device] : *table) read_device(key, device);
    } else {
      type_error(*node, "\"devices\"", "a table");
    }
  }
  if (const auto* node = root.get("memory")) {
    if (const auto* table = node->as_table()) {
      for (const auto& [key, tag] : *table) read_memory(key, tag);
    } else {
      type_error(*node, "\"memory\"", "a table");
    }
  }
  if (const auto* node = root.get("load")) {
    if (const auto* table = node->as_table()) {
      read_load(*table);
    } else {
      type_error(*node, "\"load\"", "a table");
    }
  }
  if (!errors_.empty()) return failure();

  // Cycles only show once every tag and fallback is known to be well formed.
  if (Status status = check_fallbacks(config_); !status.ok()) return status;
  return std::move(config_);
}

Status ConfigReader::failure() {
  std::stable_sort(errors_.begin(), errors_.end(),
                   [](const Located& a, const Located& b) {
                     return std::pair(a.where.line, a.where.column) <
                            std::pair(b.where.line, b.where.column);
                   });
  std::string message;
  for (const auto& e : errors_) {
    if (!message.empty()) message += '\n';
    message += e.where.to_string() + ": " + e.message;
  }
  return Status(StatusCode::invalid_argument, std::move(message));
}

void ConfigReader::read_plugin_path(const toml::node& node) {
  const auto* array = node.as_array();
  if (!array) {
    type_error(node, "\"plugin_path\"", "an array of strings");
    return;
  }
  for (const auto& entry : *array) {
    const auto* dir = entry.as_string();
    if (!dir) {
      type_error(entry, "each \"plugin_path\" entry", "a string");
    } else if (dir->get().empty()) {
      error(entry.source(), "a \"plugin_path\" entry is empty");
    } else if (check(entry, "the \"plugin_path\" entry", dir->get())) {
      config_.plugin_path.push_back(resolve(dir->get()));
    }
  }
}

void ConfigReader::read_security(const toml::node& node) {
  const auto* table = node.as_table();
  if (!table) {
    type_error(node, "\"security\"", "a table");
    return;
  }
  check_keys(*table, "in [security]", {"trust_paths"});
  const auto* paths = table->get("trust_paths");
  if (paths == nullptr) return;
  const auto* array = paths->as_array();
  if (!array) {
    type_error(*paths, "\"trust_paths\" in [security]", "an array of strings");
    return;
  }
  for (const auto& entry : *array) {
    const auto* dir = entry.as_string();
    if (!dir) {
      type_error(entry, "each \"trust_paths\" entry", "a string");
    } else if (dir->get().empty()) {
      error(entry.source(), "a \"trust_paths\" entry is empty");
    } else if (check(entry, "the \"trust_paths\" entry", dir->get())) {
      config_.trust_paths.push_back(resolve(dir->get()));
    }
  }
}

void ConfigReader::read_plugin(const toml::key& key, const toml::node& node) {
  const std::string name(key.str());
  if (!is_config_plugin_name(name)) {
    error(key.source(), "invalid plugin name " + quote(name) +
                            " in [plugins]: " + std::string(kPluginNameSyntax));
    return;
  }
  const std::string section = "[plugins." + name + "]";
  const auto* table = node.as_table();
  if (!table) {
    type_error(node, section, "a table");
    return;
  }
  check_keys(*table, "in " + section, {"library", "options", "trust", "validate"});

  PluginConfig plugin;
  plugin.name = name;
  plugin.where = at(key.source());
  if (const auto* library = table->get("library")) {
    const auto* text = library->as_string();
    if (!text) {
      type_error(*library, "\"library\" in " + section, "a string");
    } else if (text->get().empty()) {
      error(library->source(), "\"library\" in " + section + " is empty");
    } else if (check(*library, "\"library\" in " + section, text->get())) {
      plugin.library = resolve(text->get());
    }
  }
  if (const auto* options = table->get("options")) {
    read_options(*options, plugin, section);
  }
  if (const auto* validate = table->get("validate")) {
    if (const auto* boolean = validate->as_boolean()) {
      plugin.layers.validate = boolean->get();
    } else if (const auto* text = validate->as_string(); text && text->get() == "sources") {
      plugin.layers.validate = true;
      plugin.layers.check_sources = true;
    } else {
      type_error(*validate, "\"validate\" in " + section, "a boolean or \"sources\"");
    }
  }
  read_boolean(*table, "trust", section, plugin.trust);
  config_.plugins.emplace(name, std::move(plugin));
}

void ConfigReader::read_options(const toml::node& node, PluginConfig& plugin,
                                const std::string& section) {
  const auto* table = node.as_table();
  if (!table) {
    type_error(node, "\"options\" in " + section, "a table");
    return;
  }
  for (const auto& [key, value] : *table) {
    const std::string what =
        "option " + quote(key.str()) + " of plugin " + quote(plugin.name);
    if (key.str().empty()) {
      error(key.source(), "an option of plugin " + quote(plugin.name) +
                              " has an empty name");
    } else if (const auto why = check_text(key.str())) {
      error(key.source(), "the name of " + what + " " + *why);
    } else if (const auto* text = value.as_string()) {
      if (check(value, "the value of " + what, text->get())) {
        plugin.options.emplace_back(key.str(), text->get());
      }
    } else if (const auto* integer = value.as_integer()) {
      plugin.options.emplace_back(key.str(), std::to_string(integer->get()));
    } else if (const auto* boolean = value.as_boolean()) {
      plugin.options.emplace_back(key.str(), boolean->get() ? "true" : "false");
    } else {
      type_error(value, what, "a string, an integer or a boolean");
    }
  }
}

void ConfigReader::read_device(const toml::key& key, const toml::node& node) {
  const std::string tag_text(key.str());
  const auto tag = parse_device_tag(tag_text);
  if (!tag) {
    error(key.source(), "invalid device tag " + quote(tag_text) +
                            " in [devices]: " + std::string(kTagSyntax));
    return;
  }
  const std::string section = "[devices." + key_text(tag_text) + "]";
  const auto* table = node.as_table();
  if (!table) {
    type_error(node, section, "a table");
    return;
  }
  check_keys(*table, "in " + section, {"fallback", "use"});

  DeviceTagConfig device;
  device.tag = tag_text;
  device.where = at(key.source());
  device.primary = default_binding(*tag);
  if (const auto* use = table->get("use")) {
    if (auto binding = read_use(*use, *tag, section)) {
      device.primary = std::move(*binding);
    }
  }
  if (const auto* fallback = table->get("fallback")) {
    read_fallbacks(*fallback, device, section);
  }
  config_.devices.emplace(tag_text, std::move(device));
}

std::optional<DeviceBinding> ConfigReader::read_use(const toml::node& node,
                                                    const DeviceTag& tag,
                                                    const std::string& section) {
  const std::string what = "\"use\" in " + section;
  if (const auto* array = node.as_array()) {
    return read_binding_array(*array, what);
  }
  const auto* text = node.as_string();
  if (!text) {
    type_error(node, what,
               "a plugin name or [plugin, { index | uuid | pci_bus_id = ... }]");
    return std::nullopt;
  }
  const std::string& plugin = text->get();
  if (is_config_plugin_name(plugin)) {
    return DeviceBinding{plugin,
                         DeviceSelector::by_index(tag.index.value_or(0))};
  }
  // "cuda:1" is a tag, not a plugin; say how to write what was meant.
  if (const auto as_tag = parse_device_tag(plugin); as_tag && as_tag->index) {
    error(node.source(), what + " names " + quote(plugin) +
                             ", which is a device tag, not a plugin; write "
                             "use = [" + quote(as_tag->name) +
                             ", { index = " + std::to_string(*as_tag->index) +
                             " }]");
  } else {
    error(node.source(), what + ": invalid plugin name " + quote(plugin) +
                             ": " + std::string(kPluginNameSyntax));
  }
  return std::nullopt;
}

std::optional<DeviceBinding> ConfigReader::read_binding_array(
    const toml::array& array, const std::string& what) {
  if (array.size() != 2) {
    error(array.source(),
          what + " must be [plugin, { index | uuid | pci_bus_id = ... }], "
                 "found an array of " + std::to_string(array.size()) +
              (array.size() == 1 ? " element" : " elements"));
    return std::nullopt;
  }
  const auto* plugin = array[0].as_string();
  if (!plugin) {
    type_error(array[0], "the plugin in " + what, "a string");
    return std::nullopt;
  }
  if (!is_config_plugin_name(plugin->get())) {
    error(array[0].source(), what + ": invalid plugin name " +
                                 quote(plugin->get()) + ": " +
                                 std::string(kPluginNameSyntax));
    return std::nullopt;
  }
  auto selector = read_selector(array[1], "the selector in " + what);
  if (!selector) return std::nullopt;
  return DeviceBinding{plugin->get(), std::move(*selector)};
}

std::optional<DeviceSelector> ConfigReader::read_selector(
    const toml::node& node, const std::string& what) {
  const auto* table = node.as_table();
  if (!table) {
    type_error(node, what, "a table such as { index = 0 }");
    return std::nullopt;
  }
  const size_t errors_before = errors_.size();
  check_keys(*table, "in " + what, {"index", "pci_bus_id", "uuid"});

  std::vector<std::string_view> given;
  for (const auto name : {"index", "uuid", "pci_bus_id"}) {
    if (table->contains(name)) given.push_back(name);
  }
  if (given.size() != 1) {
    std::string found = "none";
    if (given.size() > 1) {
      found.clear();
      for (size_t i = 0; i < given.size(); ++i) {
        if (i > 0) found += i + 1 == given.size() ? " and " : ", ";
        found += given[i];
      }
    }
    error(table->source(), what +
                               " needs exactly one of index, uuid, "
                               "pci_bus_id; found " + found);
    return std::nullopt;
  }
  if (errors_.size() != errors_before) return std::nullopt;

  const toml::node& value = *table->get(given[0]);
  const std::string value_what = quote(given[0]) + " of " + what;
  if (given[0] == "index") {
    const auto* index = value.as_integer();
    if (!index) {
      type_error(value, value_what, "an integer");
      return std::nullopt;
    }
    if (index->get() < 0 ||
        index->get() > std::numeric_limits<uint32_t>::max()) {
      error(value.source(), value_what + " must be between 0 and " +
                                std::to_string(
                                    std::numeric_limits<uint32_t>::max()) +
                                ", found " + std::to_string(index->get()));
      return std::nullopt;
    }
    return DeviceSelector::by_index(static_cast<uint32_t>(index->get()));
  }
  const auto* text = value.as_string();
  if (!text) {
    type_error(value, value_what, "a string");
    return std::nullopt;
  }
  if (given[0] == "uuid") {
    auto selector = DeviceSelector::by_uuid(text->get());
    if (!selector) {
      error(value.source(),
            "invalid uuid " + quote(text->get()) + " in " + what +
                ": expected 32 hex digits as 8-4-4-4-12, optionally after "
                "\"GPU-\", such as \"GPU-0f3c2a1e-5b6d-4e7f-8a9b-0c1d2e3f4a5b\"");
    }
    return selector;
  }
  auto selector = DeviceSelector::by_pci_bus_id(text->get());
  if (!selector) {
    error(value.source(), "invalid PCI bus id " + quote(text->get()) +
                              " in " + what +
                              ": expected [domain:]bus:device.function "
                              "in hex, such as \"0000:3b:00.0\"");
  }
  return selector;
}

void ConfigReader::read_fallbacks(const toml::node& node,
                                  DeviceTagConfig& device,
                                  const std::string& section) {
  const std::string what = "\"fallback\" in " + section;
  const auto* array = node.as_array();
  if (!array) {
    type_error(node, what, "an array");
    return;
  }
  for (const auto& entry : *array) {
    DeviceFallback fallback;
    fallback.where = at(entry.source());
    if (const auto* text = entry.as_string()) {
      if (!parse_device_tag(text->get())) {
        error(entry.source(), what + " refers to " + quote(text->get()) +
                                  ", which is not a device tag: " +
                                  std::string(kTagSyntax));
        continue;
      }
      fallback.target = text->get();
    } else if (const auto* binding_array = entry.as_array()) {
      auto binding = read_binding_array(*binding_array, "an entry of " + what);
      if (!binding) continue;
      fallback.target = std::move(*binding);
    } else {
      type_error(entry, "each entry of " + what,
                 "a device tag or [plugin, { index | uuid | pci_bus_id = ... "
                 "}]");
      continue;
    }
    device.fallbacks.push_back(std::move(fallback));
  }
}

void ConfigReader::read_memory(const toml::key& key, const toml::node& node) {
  const auto id = parse_memory_id(key.str());
  if (!id) {
    error(key.source(), "memory id " + quote(key.str()) +
                            " in [memory] is not an unsigned 32-bit integer "
                            "(decimal, without sign or leading zeros)");
    return;
  }
  const std::string what = "memory id " + std::to_string(*id) + " in [memory]";
  const auto* tag = node.as_string();
  if (!tag) {
    type_error(node, what, "a device tag string such as \"host\"");
    return;
  }
  if (!parse_device_tag(tag->get())) {
    error(node.source(), what + " maps to " + quote(tag->get()) +
                             ", which is not a device tag: " +
                             std::string(kTagSyntax));
    return;
  }
  config_.memory_overrides.emplace(*id, tag->get());
}

void ConfigReader::read_load(const toml::table& table) {
  check_keys(table, "in [load]",
             {"check_free_memory", "direct", "external_files", "fallback", "read",
              "release_timeout", "staging", "threads", "verify"});

  if (const auto* fallback = table.get("fallback")) {
    const std::string what = "\"fallback\" in [load]";
    const auto* text = fallback->as_string();
    bool known = false;
    for (FallbackPolicy policy :
         {FallbackPolicy::allow, FallbackPolicy::warn, FallbackPolicy::error}) {
      if (text != nullptr && text->get() == to_string(policy)) {
        config_.load.fallback = policy;
        known = true;
      }
    }
    if (text == nullptr) {
      type_error(*fallback, what, "\"allow\", \"warn\" or \"error\"");
    } else if (!known) {
      error(fallback->source(), what + " is " + quote(text->get()) + "; known: allow, warn, error");
    }
  }

  if (const auto* staging = table.get("staging")) {
    const std::string what = "\"staging\" in [load]";
    std::optional<uint64_t> bytes;
    if (const auto* integer = staging->as_integer()) {
      if (integer->get() < 0) {
        error(staging->source(), what + " must not be negative, found " +
                                     std::to_string(integer->get()));
      } else {
        bytes = static_cast<uint64_t>(integer->get());
      }
    } else if (const auto* text = staging->as_string()) {
      auto parsed = parse_byte_size(text->get());
      if (parsed.ok()) {
        bytes = *parsed;
      } else {
        error(staging->source(), what + ": " + parsed.status().message());
      }
    } else {
      type_error(*staging, what,
                 "a size such as \"64MiB\" or an integer number of bytes");
    }
    if (bytes == uint64_t{0}) {
      error(staging->source(), what + " must be at least 1 byte");
    } else if (bytes) {
      config_.load.staging_bytes = *bytes;
    }
  }

  if (const auto* threads = table.get("threads")) {
    const std::string what = "\"threads\" in [load]";
    if (const auto* integer = threads->as_integer()) {
      if (integer->get() < 0 || integer->get() > kMaxLoadThreads) {
        error(threads->source(),
              what + " must be between 0 and " +
                  std::to_string(kMaxLoadThreads) + " (0: automatic), "
                  "found " + std::to_string(integer->get()));
      } else {
        config_.load.threads = static_cast<uint32_t>(integer->get());
      }
    } else {
      type_error(*threads, what, "an integer");
    }
  }

  read_boolean(table, "verify", "[load]", config_.load.verify);
  read_boolean(table, "direct", "[load]", config_.load.direct);
  read_boolean(table, "check_free_memory", "[load]", config_.load.check_free_memory);
  read_boolean(table, "external_files", "[load]", config_.load.external_files);

  if (const auto* timeout = table.get("release_timeout")) {
    const std::string what = "\"release_timeout\" in [load]";
    if (const auto* text = timeout->as_string()) {
      auto parsed = parse_duration(text->get());
      if (!parsed.ok()) {
        error(timeout->source(), what + ": " + parsed.status().message());
      } else if (parsed->count() == 0) {
        error(timeout->source(), what + " must be at least 1ms");
      } else if (*parsed > kMaxReleaseTimeout) {
        error(timeout->source(),
              what + " must be at most " +
                  std::to_string(kMaxReleaseTimeout.count() / 60000) +
                  "min (a day), found " + quote(text->get()));
      } else {
        config_.load.release_timeout = *parsed;
      }
    } else {
      type_error(*timeout, what, "a duration such as \"5s\"");
    }
  }

  if (const auto* read = table.get("read")) {
    const std::string what = "\"read\" in [load]";
    if (const auto* text = read->as_string()) {
      bool known = false;
      for (ReadMode mode : {ReadMode::automatic, ReadMode::mmap, ReadMode::pread,
                            ReadMode::direct_io}) {
        if (text->get() == to_string(mode)) {
          config_.load.read = mode;
          known = true;
        }
      }
      if (!known) {
        error(read->source(), what + " is " + quote(text->get()) +
                                  "; known: auto, mmap, pread, direct_io");
      }
    } else {
      type_error(*read, what, "a string");
    }
  }
}

// toml++ builds one nested table per part of a table header ([a.b.c],
// [[a.b.c]]) or dotted key (a.b.c = 1), one per inline table and array, and
// walks and frees that tree recursively: a 50 000-part key overflowed the
// stack before any check of ours ran. Its TOML_MAX_NESTED_VALUES (256)
// bounds only the nesting of arrays and inline tables, and each of those may
// hold a long dotted key again. So before toml++ sees the text, one pass with
// no recursion refuses a key of more than kMaxConfigKeyParts parts and values
// nested more than kMaxConfigNesting deep: the tree is then at most
// 2 * 64 (a header through arrays of tables) + 64 + 32 * 65 levels deep,
// about 2 300 (toml++ needs less than 1 MiB of stack for 16 500).
//
// Strings (the four kinds, with escapes) and comments are skipped. A run of
// bare-key characters, quoted strings, dots and the blanks between them
// counts its dots: outside strings, valid TOML has a dot only in keys and in
// numbers and times (one, as in 1.5 or 07:32:00.25), so a longer run is a
// key or a syntax error either way. Nesting counts [ and { against ] and },
// except the brackets of table headers: a [ with nothing open that does not
// follow = on its line, and a ] with nothing open.
struct TooDeep {
  uint32_t line = 0;
  uint32_t column = 0;
  std::string reason;
};

std::optional<TooDeep> find_too_deep(std::string_view text) {
  size_t i = 0;
  uint32_t line = 1;
  uint32_t column = 1;
  // Columns count code points, as toml++'s do: a UTF-8 continuation byte
  // does not start a column.
  const auto advance = [&] {
    const auto byte = static_cast<unsigned char>(text[i++]);
    if (byte == '\n') {
      ++line;
      column = 1;
    } else if ((byte & 0xC0) != 0x80) {
      ++column;
    }
  };
  const auto starts = [&](std::string_view token) {
    return text.substr(i, token.size()) == token;
  };
  // Skips the string at i, whose opening quote is quote.
  const auto skip_string = [&](char quote) {
    const bool basic = quote == '"';
    const std::string_view triple = basic ? "\"\"\"" : "'''";
    if (starts(triple)) {
      for (size_t n = 0; n < 3; ++n) advance();
      while (i < text.size() && !starts(triple)) {
        if (basic && text[i] == '\\' && i + 1 < text.size()) advance();
        advance();
      }
      // The closing delimiter, and up to two more quotes before it that
      // belong to the string ('''a''''' is "a''").
      for (size_t n = 0; n < 5 && i < text.size() && text[i] == quote; ++n) {
        advance();
      }
      return;
    }
    advance();
    while (i < text.size() && text[i] != quote && text[i] != '\n') {
      if (basic && text[i] == '\\' && i + 1 < text.size() &&
          text[i + 1] != '\n') {
        advance();
      }
      advance();
    }
    if (i < text.size() && text[i] == quote) advance();
  };

  if (starts("\xEF\xBB\xBF")) i = 3;  // a byte order mark, which toml++ skips
  bool in_run = false;
  size_t dots = 0;
  uint32_t run_line = 0;
  uint32_t run_column = 0;
  size_t nesting = 0;         // open arrays and inline tables
  bool after_equals = false;  // on this line, with nothing open
  while (i < text.size()) {
    const char c = text[i];
    // Bytes above ASCII count as bare-key characters too, in case toml++
    // is built to accept Unicode bare keys (TOML 1.1).
    const bool bare = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                      (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                      static_cast<unsigned char>(c) >= 0x80;
    const bool quoted = c == '"' || c == '\'';
    if (!in_run && (bare || quoted || c == '.')) {
      in_run = true;
      dots = 0;
      run_line = line;
      run_column = column;
    }
    if (quoted) {
      skip_string(c);
      continue;
    }
    if (c == '.' && ++dots >= kMaxConfigKeyParts) {
      return TooDeep{run_line, run_column,
                     "a key of more than " + std::to_string(kMaxConfigKeyParts) +
                         " dotted parts (a table header or dotted key; "
                         "devalloc's keys have at most 4)"};
    }
    if (!bare && c != '.' && c != ' ' && c != '\t') in_run = false;
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') advance();
      continue;
    }
    if (c == '\n' && nesting == 0) after_equals = false;
    if (c == '=' && nesting == 0) after_equals = true;
    if (c == '{' || (c == '[' && (nesting > 0 || after_equals))) {
      if (++nesting > kMaxConfigNesting) {
        return TooDeep{line, column,
                       "arrays and inline tables nested more than " +
                           std::to_string(kMaxConfigNesting) +
                           " deep (devalloc's values nest at most 3)"};
      }
    }
    if ((c == ']' || c == '}') && nesting > 0) --nesting;
    advance();
  }
  return std::nullopt;
}

// toml++'s reason, less the key it repeats for a redefinition: toml++ 3.3
// garbles a quoted one ('devices."cucuda:0"' for [devices."cuda:0"]); the
// line and column point at it.
std::string toml_reason(std::string_view description) {
  constexpr std::string_view kRedefine = "cannot redefine existing ";
  const size_t at = description.find(kRedefine);
  if (at == std::string_view::npos) return std::string(description);
  const size_t quote = description.find(" '", at + kRedefine.size());
  if (quote == std::string_view::npos || description.back() != '\'') {
    return std::string(description);
  }
  return std::string(description.substr(0, quote)) + " (the key on this line is defined above)";
}

// toml++ writes a character it quotes escaped already ("saw '\u0001'"):
// escaped() for the terminal, with its backslashes as toml++ wrote them,
// not doubled ("'\\u0001'").
std::string toml_text(std::string_view description) {
  const std::string safe = escaped(description);
  std::string out;
  out.reserve(safe.size());
  for (size_t i = 0; i < safe.size(); ++i) {
    out += safe[i];
    if (safe[i] == '\\' && i + 1 < safe.size() && safe[i + 1] == '\\') ++i;
  }
  return out;
}

}  // namespace

Result<RuntimeConfig> parse_config(std::string_view text,
                                   std::string_view source_name) {
  return detail::without_exceptions(source_name, "the config", [&]() -> Result<RuntimeConfig> {
    std::error_code ec;
    fs::path base_dir = fs::absolute(fs::path(source_name), ec).parent_path();
    if (ec) base_dir.clear();
    if (auto deep = find_too_deep(text)) {
      const SourceLocation where{std::string(source_name), deep->line, deep->column};
      return Status(StatusCode::invalid_argument,
                    where.to_string() + ": " + deep->reason);
    }
    toml::table root;
    try {
      root = toml::parse(text, source_name);
    } catch (const toml::parse_error& e) {
      const SourceLocation where{std::string(source_name), e.source().begin.line,
                                 e.source().begin.column};
      return Status(StatusCode::invalid_argument,
                    where.to_string() + ": " + toml_text(toml_reason(e.description())));
    }
    return ConfigReader(source_name, std::move(base_dir)).read(root);
  });
}

Result<RuntimeConfig> read_config(const fs::path& path) {
  return detail::without_exceptions(path, "the config", [&]() -> Result<RuntimeConfig> {
    // Else the message would start with the empty name: ": cannot open".
    if (path.empty()) {
      return Status(StatusCode::invalid_argument, "the config path is empty: it names no file");
    }
    Result<std::string> text = read_regular_file(path, kMaxConfigBytes, "config");
    if (!text.ok()) return text.status();
    return parse_config(*text, path.string());
  });
}

}  // namespace devalloc
