#include <devalloc/core/config.hpp>
#include <devalloc/input_text.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <limits>

namespace devalloc {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::optional<uint32_t> hex_digit(char c) {
  if (c >= '0' && c <= '9') return static_cast<uint32_t>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<uint32_t>(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return static_cast<uint32_t>(c - 'A' + 10);
  return std::nullopt;
}

// 1 to max_digits hex digits.
std::optional<uint32_t> parse_hex(std::string_view text, size_t max_digits) {
  if (text.empty() || text.size() > max_digits) return std::nullopt;
  uint32_t value = 0;
  for (char c : text) {
    const auto digit = hex_digit(c);
    if (!digit) return std::nullopt;
    value = value * 16 + *digit;
  }
  return value;
}

// Decimal, no sign, no leading zeros: one spelling per value, so that two
// spellings cannot name the same memory id or device twice.
std::optional<uint32_t> parse_canonical_u32(std::string_view text) {
  if (text.empty() || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (!is_digit(c)) return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
    if (value > std::numeric_limits<uint32_t>::max()) return std::nullopt;
  }
  return static_cast<uint32_t>(value);
}

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() &&
         std::equal(prefix.begin(), prefix.end(), text.begin(),
                    [](char a, char b) {
                      return std::tolower(static_cast<unsigned char>(a)) ==
                             std::tolower(static_cast<unsigned char>(b));
                    });
}

struct SizeUnit {
  std::string_view name;
  uint64_t factor;
};

constexpr std::array<SizeUnit, 9> kSizeUnits{{
    {"B", 1},
    {"KiB", uint64_t{1} << 10},
    {"MiB", uint64_t{1} << 20},
    {"GiB", uint64_t{1} << 30},
    {"TiB", uint64_t{1} << 40},
    {"KB", 1000},
    {"MB", 1000 * 1000},
    {"GB", 1000 * 1000 * 1000},
    {"TB", uint64_t{1000} * 1000 * 1000 * 1000},
}};

std::string known_units() {
  std::string out;
  for (const auto& unit : kSizeUnits) {
    if (!out.empty()) out += ", ";
    out += unit.name;
  }
  return out;
}

std::optional<DeviceSelector> by_identity(SelectorKind kind,
                                          std::optional<std::string> id) {
  if (!id) return std::nullopt;
  DeviceSelector selector;
  selector.kind = kind;
  selector.id = std::move(*id);
  return selector;
}

}  // namespace

std::string SourceLocation::to_string() const {
  const std::string shown = path_for_message(file);
  if (line == 0) return shown;
  return shown + ":" + std::to_string(line) + ":" + std::to_string(column);
}

std::string DeviceTag::to_string() const {
  return index ? name + ":" + std::to_string(*index) : name;
}

std::optional<DeviceTag> parse_device_tag(std::string_view text) {
  if (text.size() > kMaxDeviceTagBytes) return std::nullopt;
  const size_t colon = text.find(':');
  DeviceTag tag;
  tag.name = std::string(text.substr(0, colon));
  if (!is_valid_plugin_name(tag.name)) return std::nullopt;
  if (colon != std::string_view::npos) {
    tag.index = parse_canonical_u32(text.substr(colon + 1));
    if (!tag.index) return std::nullopt;
  }
  return tag;
}

std::optional<uint32_t> parse_memory_id(std::string_view text) {
  return parse_canonical_u32(text);
}

std::optional<std::string> normalize_uuid(std::string_view text) {
  if (starts_with_ignoring_case(text, "GPU-")) text.remove_prefix(4);
  std::string hex;
  if (text.size() == 36) {
    for (size_t i = 0; i < text.size(); ++i) {
      const bool dash_here = i == 8 || i == 13 || i == 18 || i == 23;
      if (dash_here != (text[i] == '-')) return std::nullopt;
      if (!dash_here) hex += text[i];
    }
  } else if (text.size() == 32) {
    hex = std::string(text);
  } else {
    return std::nullopt;
  }
  std::string out;
  for (size_t i = 0; i < hex.size(); ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) out += '-';
    const auto digit = hex_digit(hex[i]);
    if (!digit) return std::nullopt;
    out += "0123456789abcdef"[*digit];
  }
  return out;
}

std::optional<std::string> normalize_pci_bus_id(std::string_view text) {
  const size_t dot = text.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const auto function = parse_hex(text.substr(dot + 1), 1);
  if (!function || *function > 7) return std::nullopt;

  std::string_view rest = text.substr(0, dot);
  const size_t last_colon = rest.rfind(':');
  if (last_colon == std::string_view::npos) return std::nullopt;
  const auto device = parse_hex(rest.substr(last_colon + 1), 2);
  if (!device || *device > 0x1f) return std::nullopt;

  rest = rest.substr(0, last_colon);
  const size_t domain_colon = rest.find(':');
  std::optional<uint32_t> domain = 0;
  if (domain_colon != std::string_view::npos) {
    domain = parse_hex(rest.substr(0, domain_colon), 8);
    rest = rest.substr(domain_colon + 1);
  }
  const auto bus = parse_hex(rest, 2);
  if (!domain || !bus) return std::nullopt;

  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", *domain, *bus, *device,
                *function);
  return std::string(out);
}

std::string human_bytes(uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  }
  return text;
}

Result<uint64_t> parse_byte_size(std::string_view text) {
  const auto invalid = [&](const std::string& why) {
    return Status(StatusCode::invalid_argument,
                  "invalid size " + quote(text) + ": " + why);
  };
  size_t pos = 0;
  uint64_t count = 0;
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  while (pos < text.size() && is_digit(text[pos])) {
    const auto digit = static_cast<uint64_t>(text[pos] - '0');
    if (count > (kMax - digit) / 10) return invalid("does not fit in 64 bits");
    count = count * 10 + digit;
    ++pos;
  }
  if (pos == 0) {
    return invalid("expected an integer followed by a unit such as MiB");
  }
  while (pos < text.size() && text[pos] == ' ') ++pos;
  const std::string_view unit_text = text.substr(pos);
  if (unit_text.empty()) return count;
  for (const auto& unit : kSizeUnits) {
    if (unit.name != unit_text) continue;
    if (count > kMax / unit.factor) return invalid("does not fit in 64 bits");
    return count * unit.factor;
  }
  return invalid("unknown unit " + quote(unit_text) + " (known: " + known_units() + ")");
}

Result<std::chrono::milliseconds> parse_duration(std::string_view text) {
  const auto invalid = [&](const std::string& why) {
    return Status(StatusCode::invalid_argument,
                  "invalid duration " + quote(text) + ": " + why);
  };
  size_t pos = 0;
  uint64_t count = 0;
  // A day in milliseconds times a million still fits; more is a typo.
  constexpr uint64_t kMax = uint64_t{1} << 46;
  while (pos < text.size() && is_digit(text[pos])) {
    count = count * 10 + static_cast<uint64_t>(text[pos] - '0');
    if (count > kMax) return invalid("too long");
    ++pos;
  }
  if (pos == 0) return invalid("expected an integer followed by ms, s or min");
  while (pos < text.size() && text[pos] == ' ') ++pos;
  const std::string_view unit = text.substr(pos);
  uint64_t factor = 0;
  if (unit == "ms") factor = 1;
  if (unit == "s") factor = 1000;
  if (unit == "min") factor = 60000;
  if (factor == 0) {
    return invalid("unknown or missing unit " + quote(unit) + " (known: ms, s, min)");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(count * factor));
}

const char* to_string(ReadMode mode) {
  switch (mode) {
    case ReadMode::automatic: return "auto";
    case ReadMode::mmap: return "mmap";
    case ReadMode::pread: return "pread";
    case ReadMode::direct_io: return "direct_io";
  }
  return "unknown";
}

const char* to_string(FallbackPolicy policy) {
  switch (policy) {
    case FallbackPolicy::allow: return "allow";
    case FallbackPolicy::warn: return "warn";
    case FallbackPolicy::error: return "error";
  }
  return "unknown";
}

const char* to_string(SelectorKind kind) {
  switch (kind) {
    case SelectorKind::index: return "index";
    case SelectorKind::uuid: return "uuid";
    case SelectorKind::pci_bus_id: return "pci_bus_id";
  }
  return "unknown";
}

DeviceSelector DeviceSelector::by_index(uint32_t index) {
  DeviceSelector selector;
  selector.kind = SelectorKind::index;
  selector.index = index;
  return selector;
}

std::optional<DeviceSelector> DeviceSelector::by_uuid(std::string_view text) {
  return by_identity(SelectorKind::uuid, normalize_uuid(text));
}

std::optional<DeviceSelector> DeviceSelector::by_pci_bus_id(
    std::string_view text) {
  return by_identity(SelectorKind::pci_bus_id, normalize_pci_bus_id(text));
}

std::string DeviceSelector::to_string() const {
  const std::string value =
      kind == SelectorKind::index ? std::to_string(index) : id;
  return std::string(devalloc::to_string(kind)) + " " + value;
}

std::string DeviceBinding::to_string() const {
  return plugin + " " + selector.to_string();
}

std::string PluginConfig::load_spec() const {
  return library ? library->string() : name;
}

PluginConfig RuntimeConfig::plugin(std::string_view name) const {
  if (const auto it = plugins.find(name); it != plugins.end()) {
    return it->second;
  }
  PluginConfig unconfigured;
  unconfigured.name = std::string(name);
  return unconfigured;
}

RuntimeConfig default_config() { return RuntimeConfig{}; }

}  // namespace devalloc
