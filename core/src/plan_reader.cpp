#include <devalloc/core/plan.hpp>
#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/regular_file.hpp>

#include "json_parse.hpp"
#include "plain_json.hpp"
#include "plan_checks.hpp"
#include <devalloc/no_exceptions.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>

namespace devalloc {

namespace {

using nlohmann::json;

// Thrown inside the reader only, to unwind from any depth to read_plan().
struct StructureError {
  std::string pointer;
  std::string reason;
};

[[noreturn]] void fail(const std::string& pointer, const std::string& reason) {
  throw StructureError{pointer, reason};
}

std::string describe(const json& value) {
  return std::string(value.type_name()) + " " + detail::json_excerpt(value);
}

void require_object(const json& value, const std::string& pointer) {
  if (!value.is_object()) fail(pointer, "expected an object, got " + describe(value));
}

// Where a value is: its object's pointer, a field ("/name") and, for an
// array element, its index. Made into a JSON pointer only for a message: a
// plan of 100 000 tensors that is fine builds none.
struct At {
  static constexpr size_t kNoIndex = SIZE_MAX;
  const std::string& object;
  std::string_view field;
  size_t index = kNoIndex;

  std::string pointer() const {
    std::string out = object + std::string(field);
    if (index != kNoIndex) out += "/" + std::to_string(index);
    return out;
  }
};

const std::string kRoot;  // the root's JSON pointer: ""

// Every key of `object` is one of `allowed`, and every one of `required` is there.
void check_keys(const json& object, const At& at,
                std::initializer_list<std::string_view> allowed,
                std::initializer_list<std::string_view> required) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool known = false;
    for (std::string_view key : allowed) known = known || it.key() == key;
    if (!known) {
      std::string expected;
      for (std::string_view key : allowed) {
        expected += (expected.empty() ? "" : ", ") + std::string(key);
      }
      fail(at.pointer() + "/" + detail::json_pointer_token(it.key()),
           "unknown key (expected one of: " + expected + ")");
    }
  }
  for (std::string_view key : required) {
    if (!object.contains(key)) fail(at.pointer(), "missing \"" + std::string(key) + "\"");
  }
}

uint64_t read_u64(const json& value, const At& at) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  fail(at.pointer(), "expected a non-negative integer, got " + describe(value));
}

uint32_t read_u32(const json& value, const At& at) {
  const uint64_t number = read_u64(value, at);
  if (number > std::numeric_limits<uint32_t>::max()) {
    fail(at.pointer(), std::to_string(number) + " is above 4294967295");
  }
  return static_cast<uint32_t>(number);
}

std::string read_string(const json& value, const At& at) {
  if (!value.is_string()) fail(at.pointer(), "expected a string, got " + describe(value));
  return value.get<std::string>();
}

const json& read_array(const json& value, const At& at) {
  if (!value.is_array()) fail(at.pointer(), "expected an array, got " + describe(value));
  return value;
}

PlanBuffer read_buffer(const json& value, const std::string& pointer) {
  require_object(value, pointer);
  check_keys(value, {pointer, ""}, {"memory_id", "device", "size", "alignment", "rank"},
             {"memory_id", "device", "size"});
  PlanBuffer buffer;
  buffer.memory_id = read_u32(value["memory_id"], {pointer, "/memory_id"});
  buffer.device = read_string(value["device"], {pointer, "/device"});
  buffer.size = read_u64(value["size"], {pointer, "/size"});
  if (value.contains("alignment")) {
    buffer.alignment = read_u64(value["alignment"], {pointer, "/alignment"});
  }
  if (value.contains("rank")) buffer.rank = read_u32(value["rank"], {pointer, "/rank"});
  return buffer;
}

PlanTensor read_tensor(const json& value, const std::string& pointer) {
  require_object(value, pointer);
  check_keys(value, {pointer, ""}, {"name", "dtype", "shape", "memory_id", "offset", "source"},
             {"name", "dtype", "shape", "memory_id", "offset"});
  PlanTensor tensor;
  tensor.name = read_string(value["name"], {pointer, "/name"});
  const std::string dtype = read_string(value["dtype"], {pointer, "/dtype"});
  const std::optional<DType> parsed = parse_dtype(dtype);
  if (!parsed) {
    fail(pointer + "/dtype",
         "unknown dtype " + quote(dtype) + " (known: " + known_dtype_names() + ")");
  }
  tensor.dtype = *parsed;
  const json& shape = read_array(value["shape"], {pointer, "/shape"});
  for (size_t i = 0; i < shape.size(); ++i) {
    tensor.shape.push_back(read_u64(shape[i], {pointer, "/shape", i}));
  }
  tensor.memory_id = read_u32(value["memory_id"], {pointer, "/memory_id"});
  tensor.offset = read_u64(value["offset"], {pointer, "/offset"});
  if (value.contains("source") && !value["source"].is_null()) {
    const json& source = value["source"];
    if (!source.is_object()) {
      fail(pointer + "/source",
           "expected {\"file\": ..., \"key\": ...} or null, got " + describe(source));
    }
    check_keys(source, {pointer, "/source"}, {"file", "key", "dim", "start", "length"},
               {"file", "key"});
    tensor.source = PlanSource{read_string(source["file"], {pointer, "/source/file"}),
                               read_string(source["key"], {pointer, "/source/key"}),
                               std::nullopt};
    // A slice is the three of dim, start and length, or none of them.
    const int given = static_cast<int>(source.contains("dim")) +
                      static_cast<int>(source.contains("start")) +
                      static_cast<int>(source.contains("length"));
    if (given != 0 && given != 3) {
      fail(pointer + "/source",
           "a slice needs \"dim\", \"start\" and \"length\" together, got " +
               std::to_string(given) + " of them");
    }
    if (given == 3) {
      tensor.source->slice = PlanSlice{read_u32(source["dim"], {pointer, "/source/dim"}),
                                       read_u64(source["start"], {pointer, "/source/start"}),
                                       read_u64(source["length"], {pointer, "/source/length"})};
    }
  }
  return tensor;
}

PlanMethod read_method(const json& value, const std::string& pointer) {
  require_object(value, pointer);
  check_keys(value, {pointer, ""}, {"name", "memory_ids", "tensors"},
             {"name", "memory_ids", "tensors"});
  PlanMethod method;
  method.name = read_string(value["name"], {pointer, "/name"});
  const json& ids = read_array(value["memory_ids"], {pointer, "/memory_ids"});
  for (size_t i = 0; i < ids.size(); ++i) {
    method.memory_ids.push_back(read_u32(ids[i], {pointer, "/memory_ids", i}));
  }
  const json& tensors = read_array(value["tensors"], {pointer, "/tensors"});
  method.tensors.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    method.tensors.push_back(read_string(tensors[i], {pointer, "/tensors", i}));
  }
  return method;
}

void read_root(const json& root, Plan& plan) {
  if (!root.is_object()) fail("", "expected a JSON object, got " + describe(root));
  // format and version first: a file that is not a plan, or a newer plan,
  // should say so rather than report its first unexpected key.
  if (!root.contains("format") || !root["format"].is_string() ||
      root["format"].get<std::string>() != kPlanFormat) {
    fail("/format", "expected \"" + std::string(kPlanFormat) + "\", got " +
                        (root.contains("format") ? describe(root["format"]) : "nothing") +
                        ": not a devalloc plan");
  }
  if (!root.contains("version")) fail("", "missing \"version\"");
  const uint64_t version = read_u64(root["version"], {kRoot, "/version"});
  if (version == 0) fail("/version", "versions start at 1");
  if (version > kPlanVersion) {
    fail("/version", "version " + std::to_string(version) +
                         " is newer than this devalloc reads (" +
                         std::to_string(kPlanVersion) + ")");
  }
  check_keys(root, {kRoot, ""},
             {"format", "version", "allow_external_files", "world_size", "buffers", "tensors",
              "methods"},
             {"buffers", "tensors", "methods"});
  if (root.contains("world_size")) {
    plan.world_size = read_u32(root["world_size"], {kRoot, "/world_size"});
    if (plan.world_size == 0) fail("/world_size", "a job has at least 1 rank");
  }
  if (root.contains("allow_external_files")) {
    const json& allow = root["allow_external_files"];
    if (!allow.is_boolean()) {
      fail("/allow_external_files", "expected true or false, got " + describe(allow));
    }
    plan.allow_external_files = allow.get<bool>();
  }
  const json& buffers = read_array(root["buffers"], {kRoot, "/buffers"});
  for (size_t i = 0; i < buffers.size(); ++i) {
    plan.buffers.push_back(read_buffer(buffers[i], "/buffers/" + std::to_string(i)));
  }
  const json& tensors = read_array(root["tensors"], {kRoot, "/tensors"});
  plan.tensors.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    plan.tensors.push_back(read_tensor(tensors[i], "/tensors/" + std::to_string(i)));
  }
  const json& methods = read_array(root["methods"], {kRoot, "/methods"});
  for (size_t i = 0; i < methods.size(); ++i) {
    plan.methods.push_back(read_method(methods[i], "/methods/" + std::to_string(i)));
  }
}

// The fast path: a plan in the form write_plan emits (and any other
// spacing or key order), read with no JSON values built. It accepts only
// plans the strict reader accepts and yields the same Plan; anything else
// (an escape in a string, an unknown key, a key given twice, a value of the
// wrong kind or out of range, an unknown dtype, another format or version)
// makes it give up without a reason, and read_root reads the plan from the
// start and says what is wrong. The fuzz target fuzz_plan checks that the
// two agree.
class PlainPlanReader {
 public:
  explicit PlainPlanReader(std::string_view text) : json_(text) {}

  bool read(Plan& plan) {
    bool format = false, version = false, allow = false, world = false;
    bool buffers = false, tensors = false, methods = false;
    json_.space();
    const bool read = json_.members([&](std::string_view key) {
      if (key == "format" && !format) {
        std::string_view value;
        format = true;
        return json_.plain_string(value) && value == kPlanFormat;
      }
      if (key == "version" && !version) {
        uint64_t value = 0;
        version = true;
        return json_.plain_unsigned(value) && value >= 1 && value <= kPlanVersion;
      }
      if (key == "allow_external_files" && !allow) {
        allow = true;
        plan.allow_external_files = json_.word("true");
        return plan.allow_external_files || json_.word("false");
      }
      if (key == "world_size" && !world) {
        world = true;
        return u32(plan.world_size) && plan.world_size != 0;
      }
      if (key == "buffers" && !buffers) {
        buffers = true;
        return json_.sequence('[', ']', [&] { return read_buffer(plan.buffers.emplace_back()); });
      }
      if (key == "tensors" && !tensors) {
        tensors = true;
        // Room for a tensor per line left (write_plan writes one per line),
        // but no more than the shortest tensor of the plain form allows:
        // a plan written so does not grow the vector and copy it, and a
        // text of few lines reserves little.
        constexpr size_t kShortestTensor = 56;
        const std::string_view rest = json_.rest();
        size_t lines = 1;
        for (const char* p = rest.data(), *end = p + rest.size();
             (p = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)))) !=
             nullptr;
             ++p) {
          ++lines;
        }
        reserve_on_huge_pages(plan.tensors, std::min(lines, rest.size() / kShortestTensor + 1));
        return json_.sequence('[', ']', [&] { return read_tensor(plan.tensors.emplace_back()); });
      }
      if (key == "methods" && !methods) {
        methods = true;
        return json_.sequence('[', ']', [&] { return read_method(plan.methods.emplace_back()); });
      }
      return false;
    });
    return read && json_.at_text_end() && format && version && buffers && tensors && methods;
  }

 private:
  static bool fits_u32(uint64_t value) { return value <= std::numeric_limits<uint32_t>::max(); }
  bool u32(uint32_t& out) {
    uint64_t value = 0;
    if (!json_.plain_unsigned(value) || !fits_u32(value)) return false;
    out = static_cast<uint32_t>(value);
    return true;
  }
  bool string(std::string& out) {
    std::string_view value;
    if (!json_.plain_string(value)) return false;
    out = value;
    return true;
  }

  bool read_buffer(PlanBuffer& buffer) {
    bool id = false, device = false, size = false, alignment = false, rank = false;
    return json_.members([&](std::string_view key) {
             if (key == "rank" && !rank) {
               rank = true;
               return u32(buffer.rank.emplace());
             }
             if (key == "memory_id" && !id) {
               id = true;
               return u32(buffer.memory_id);
             }
             if (key == "device" && !device) {
               device = true;
               return string(buffer.device);
             }
             if (key == "size" && !size) {
               size = true;
               return json_.plain_unsigned(buffer.size);
             }
             if (key == "alignment" && !alignment) {
               alignment = true;
               return json_.plain_unsigned(buffer.alignment);
             }
             return false;
           }) &&
           id && device && size;
  }

  bool read_tensor(PlanTensor& tensor) {
    bool name = false, dtype = false, shape = false, id = false, offset = false,
         source = false;
    return json_.members([&](std::string_view key) {
             if (key == "name" && !name) {
               name = true;
               return string(tensor.name);
             }
             if (key == "dtype" && !dtype) {
               dtype = true;
               std::string_view value;
               if (!json_.plain_string(value)) return false;
               const std::optional<DType> parsed = parse_dtype(value);
               if (parsed) tensor.dtype = *parsed;
               return parsed.has_value();
             }
             if (key == "shape" && !shape) {
               shape = true;
               return json_.unsigned_array([&](uint64_t d) {
                 tensor.shape.push_back(d);
                 return true;
               });
             }
             if (key == "memory_id" && !id) {
               id = true;
               return u32(tensor.memory_id);
             }
             if (key == "offset" && !offset) {
               offset = true;
               return json_.plain_unsigned(tensor.offset);
             }
             if (key == "source" && !source) {
               source = true;
               if (json_.word("null")) return true;
               return read_source(tensor.source.emplace());
             }
             return false;
           }) &&
           name && dtype && shape && id && offset;
  }

  bool read_source(PlanSource& source) {
    bool file = false, key = false, dim = false, start = false, length = false;
    PlanSlice slice;
    return json_.members([&](std::string_view k) {
             if (k == "dim" && !dim) {
               dim = true;
               return u32(slice.dim);
             }
             if (k == "start" && !start) {
               start = true;
               return json_.plain_unsigned(slice.start);
             }
             if (k == "length" && !length) {
               length = true;
               return json_.plain_unsigned(slice.length);
             }
             if (k == "file" && !file) {
               file = true;
               return string(source.file);
             }
             if (k == "key" && !key) {
               key = true;
               return string(source.key);
             }
             return false;
           }) &&
           file && key && (dim == start && start == length) &&
           (!dim || (source.slice = slice, true));
  }

  bool read_method(PlanMethod& method) {
    bool name = false, ids = false, tensors = false;
    return json_.members([&](std::string_view key) {
             if (key == "name" && !name) {
               name = true;
               return string(method.name);
             }
             if (key == "memory_ids" && !ids) {
               ids = true;
               return json_.unsigned_array([&](uint64_t id) {
                 if (!fits_u32(id)) return false;
                 method.memory_ids.push_back(static_cast<uint32_t>(id));
                 return true;
               });
             }
             if (key == "tensors" && !tensors) {
               tensors = true;
               return json_.string_array([&](std::string_view t) {
                 method.tensors.emplace_back(t);
                 return true;
               });
             }
             return false;
           }) &&
           name && ids && tensors;
  }

  detail::PlainJson json_;
};

// "/tensors/3: ", or nothing for the top level.
std::string place(const std::string& pointer) {
  return pointer.empty() ? std::string() : escaped(pointer) + ": ";
}

// A plan that was read, unless a name or path in it is longer than a plan
// may hold: refused here, before anything resolves or looks it up.
Result<Plan> checked_limits(Plan plan) {
  if (Status status = detail::check_plan_limits(plan); !status.ok()) return status;
  return plan;
}

Result<Plan> read_plan_checked(const std::filesystem::path& path,
                               detail::PlanReading mode) {
  if (path.empty()) {
    return Status(StatusCode::invalid_argument, "the plan path is empty: it names no file");
  }
  const std::string file = path_for_message(path.string());
  Result<std::string> text = read_regular_file(path, kMaxPlanBytes, "plan");
  if (!text.ok()) return text.status();
  if (mode != detail::PlanReading::strict) {
    Plan plan;
    plan.path = path;
    if (PlainPlanReader(*text).read(plan)) return checked_limits(std::move(plan));
    if (mode == detail::PlanReading::fast_only) {
      return Status(StatusCode::invalid_argument,
                    file + ": not in the plain form the fast reader reads");
    }
  }
  auto parsed = detail::parse_json(*text, kMaxPlanDepth);
  if (const auto* error = std::get_if<detail::JsonError>(&parsed)) {
    if (const auto& duplicate = error->duplicate) {
      return Status(StatusCode::invalid_argument,
                    file + ": " + place(duplicate->object_pointer) + "duplicate key " +
                        quote(duplicate->key) + " at " + error->position());
    }
    return Status(StatusCode::invalid_argument,
                  file + ": invalid JSON at " + error->position() + ": " + error->reason);
  }
  Plan plan;
  plan.path = path;
  try {
    read_root(std::get<json>(parsed), plan);
  } catch (const StructureError& error) {
    return Status(StatusCode::invalid_argument,
                  file + ": " + place(error.pointer) + error.reason);
  }
  return checked_limits(std::move(plan));
}

}  // namespace

Result<Plan> read_plan(const std::filesystem::path& path, detail::PlanReading mode) {
  return detail::without_exceptions(path, "the plan",
                                    [&] { return read_plan_checked(path, mode); });
}

}  // namespace devalloc
