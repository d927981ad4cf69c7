#include <devalloc/core/plan.hpp>
#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>
#include <devalloc/regular_file.hpp>

#include "json_cursor.hpp"
#include "plan_checks.hpp"
#include <devalloc/no_exceptions.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <unordered_set>

namespace devalloc {

namespace {

using detail::JsonCursor;
using detail::JsonKind;

// Where a value is, as a chain from the root: a member's key or an
// element's index. Made into a JSON pointer only for a message: a plan of
// 100 000 tensors that is fine builds none.
struct At {
  static constexpr size_t kNoIndex = SIZE_MAX;
  const At* parent = nullptr;  // nullptr: the root's child
  std::string_view key;        // a member's key, or
  size_t index = kNoIndex;     // an element's index
};

// "/tensors/3/dtype"; "" for the root (at == nullptr).
std::string pointer(const At* at) {
  if (at == nullptr) return "";
  return pointer(at->parent) + "/" +
         (at->index != At::kNoIndex ? std::to_string(at->index)
                                    : detail::json_pointer_token(at->key));
}

// A plan, read in one pass by the one JSON reader (json_cursor.hpp). The
// first error in text order is reported, with one exception: a text that
// is not a devalloc plan of a version this devalloc reads says so first,
// wherever its "format" and "version" are.
class PlanReader {
 public:
  PlanReader(std::string_view text, std::string file)
      : text_(text), json_(text, kMaxPlanDepth), file_(std::move(file)) {}

  Status read(Plan& plan) {
    const bool read = read_root(plan) && json_.at_text_end() && version_fits() &&
                      resolve_files(plan);
    if (read && identified()) return Status();
    if (!identified()) {
      if (std::optional<Status> not_a_plan = identity_error()) return *not_a_plan;
    }
    if (json_.failed()) return syntax_error();
    return fail(problem_pointer_, problem_);
  }

 private:
  // A row's source file, by its index in "files" (use_file).
  struct FileRef {
    size_t tensor;   // index in Plan::tensors
    uint64_t file;   // index in "files", as written
    bool in_object;  // {"file": index, ...} rather than the bare index
  };
  struct Duplicate {
    std::string object;  // JSON pointer of the object
    std::string key;
  };

  Status fail(const std::string& pointer, const std::string& reason) const {
    return Status(StatusCode::invalid_argument,
                  file_ + ": " + (pointer.empty() ? "" : escaped(pointer) + ": ") + reason);
  }
  Status syntax_error() const {
    const detail::JsonError error = json_.error();
    if (duplicate_) {
      return fail(duplicate_->object,
                  "duplicate key " + quote(duplicate_->key) + " at " + error.position());
    }
    return fail("", "invalid JSON at " + error.position() + ": " + error.reason);
  }

  bool identified() const { return format_ok_ && version_ok_; }

  // A value that is wrong, when the text is JSON.
  bool refuse(std::string pointer, std::string reason) {
    problem_pointer_ = std::move(pointer);
    problem_ = std::move(reason);
    return false;
  }
  // The value at the cursor, refused: "expected <what>, got <kind> <value>".
  bool refuse_value(const At* at, const std::string& what) {
    std::string_view text;
    if (!json_.skip(text)) return false;
    return refuse(pointer(at), "expected " + what + ", got " + describe(text));
  }
  static std::string describe(std::string_view text) {
    return std::string(detail::json_kind_name(text)) + " " + detail::json_excerpt(text);
  }

  bool u64(uint64_t& out, const At* at) {
    return json_.unsigned_number(out) || refuse_value(at, "a non-negative integer");
  }
  bool u32(uint32_t& out, const At* at) {
    uint64_t number = 0;
    if (!u64(number, at)) return false;
    if (number > std::numeric_limits<uint32_t>::max()) {
      return refuse(pointer(at), std::to_string(number) + " is above 4294967295");
    }
    out = static_cast<uint32_t>(number);
    return true;
  }
  bool string(std::string_view& out, const At* at) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind != JsonKind::string) return refuse_value(at, "a string");
    return json_.string(out);
  }
  bool string(std::string& out, const At* at) {
    std::string_view value;
    if (!string(value, at)) return false;
    out = value;
    return true;
  }
  template <typename OnElement>
  bool array(const At* at, OnElement on_element) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind != JsonKind::array) return refuse_value(at, "an array");
    return json_.elements(on_element);
  }

  // An object of the keys in `keys`, those in `required` among them:
  // on_member(i) reads the value of keys[i]. A key not in `keys`, or given
  // twice, is refused where it is.
  template <size_t N, typename OnMember>
  bool object(const At* at, const std::array<std::string_view, N>& keys,
              std::initializer_list<size_t> required, OnMember on_member) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind != JsonKind::object) {
      return refuse_value(at, at == nullptr ? "a JSON object" : "an object");
    }
    std::array<bool, N> seen{};
    size_t member = 0;
    const bool read = json_.members([&](std::string_view key) {
      // write_plan writes the keys in the order of `keys`: the member's
      // own place is tried first.
      size_t i = member;
      if (i >= N || keys[i] != key) {
        i = 0;
        while (i < N && keys[i] != key) ++i;
      }
      ++member;
      if (i == N) {
        std::string expected;
        for (std::string_view known : keys) {
          expected += (expected.empty() ? "" : ", ") + std::string(known);
        }
        return refuse(pointer(at) + "/" + detail::json_pointer_token(key),
                      "unknown key (expected one of: " + expected + ")");
      }
      if (seen[i]) {
        duplicate_ = Duplicate{pointer(at), std::string(key)};
        return json_.fail(json_.key_at(), "key appears twice in one object");
      }
      seen[i] = true;
      return on_member(i);
    });
    if (!read) return false;
    for (size_t i : required) {
      if (!seen[i]) return refuse(pointer(at), "missing \"" + std::string(keys[i]) + "\"");
    }
    return true;
  }

  bool read_root(Plan& plan) {
    static constexpr std::array<std::string_view, 8> kKeys = {
        "format", "version", "allow_external_files", "world_size", "files", "buffers",
        "tensors", "methods"};
    return object(nullptr, kKeys, {5, 6, 7}, [&](size_t i) {
      const At at{nullptr, kKeys[i]};
      switch (i) {
        case 0: {  // format
          std::string_view format;
          JsonKind kind = JsonKind::null;
          if (!json_.peek(kind)) return false;
          if (kind != JsonKind::string) return refuse_value(&at, "\"devalloc-plan\"");
          if (!json_.string(format)) return false;
          format_ok_ = format == kPlanFormat;
          return format_ok_ || refuse("/format", "not a devalloc plan");
        }
        case 1: {  // version
          if (!u64(version_, &at)) return false;
          version_ok_ = version_ >= 1 && version_ <= kPlanVersion;
          return version_ok_ || refuse("/version", "version out of range");
        }
        case 2: {  // allow_external_files
          JsonKind kind = JsonKind::null;
          if (!json_.peek(kind)) return false;
          if (kind != JsonKind::boolean) return refuse_value(&at, "true or false");
          return json_.boolean(plan.allow_external_files);
        }
        case 3:  // world_size
          if (!u32(plan.world_size, &at)) return false;
          return plan.world_size != 0 || refuse("/world_size", "a job has at least 1 rank");
        case 4:  // files
          version_2_at(&at);
          if (!array(&at, [&](size_t index) {
                const At element{&at, {}, index};
                return read_file(files_.emplace_back(), plan, &element);
              })) {
            return false;
          }
          files_read_ = true;
          return true;
        case 5:  // buffers
          return array(&at, [&](size_t index) {
            const At element{&at, {}, index};
            return read_buffer(plan.buffers.emplace_back(), &element);
          });
        case 6: {  // tensors
          reserve_tensors(plan);
          return array(&at, [&](size_t index) {
            const At element{&at, {}, index};
            JsonKind kind = JsonKind::null;
            if (!json_.peek(kind)) return false;
            if (kind == JsonKind::array) {
              return read_row(plan.tensors.emplace_back(), index, &element);
            }
            if (kind == JsonKind::object) {
              return read_tensor(plan.tensors.emplace_back(), &element);
            }
            return refuse_value(&element, "a row [name, dtype, shape, memory_id, offset, "
                                          "source] or an object");
          });
        }
        default:  // methods
          plan_tensors_ = plan.tensors.size();
          method_room_ = 2 * plan_tensors_;
          return array(&at, [&](size_t index) {
            const At element{&at, {}, index};
            return read_method(plan.methods.emplace_back(), &element);
          });
      }
    });
  }

  // The first place that needs version 2 (a row, "files"): a plan that
  // says version 1 is refused there once read (version_fits), wherever its
  // "version" stands.
  void version_2_at(const At* at) {
    if (!version_2_at_) version_2_at_ = pointer(at);
  }
  bool version_fits() {
    if (!version_2_at_ || version_ >= 2) return true;
    return refuse(*version_2_at_, "rows and \"files\" are version 2 of the format; the plan "
                                  "says version " + std::to_string(version_));
  }

  // An entry of "files": a source path, no longer than a path may be, so
  // that the rows naming it hold copies of a bounded size; or {"path": ...,
  // "header_bytes": ..., "header_xxh3": ..., "rows_xxh3": ...}, the path
  // and its check (the three together). A path is listed once.
  bool read_file(std::string& path, Plan& plan, const At* at) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    PlanFileCheck check;
    int given = 0;
    if (kind == JsonKind::string) {
      if (!string(path, at)) return false;
    } else if (kind == JsonKind::object) {
      static constexpr std::array<std::string_view, 4> kKeys = {"path", "header_bytes",
                                                                "header_xxh3", "rows_xxh3"};
      const bool read = object(at, kKeys, {0}, [&](size_t i) {
        const At field{at, kKeys[i]};
        switch (i) {
          case 0: return string(path, &field);
          case 1: return ++given, u64(check.header_bytes, &field);
          case 2: return ++given, hex64(check.header_xxh3, &field);
          default: return ++given, hex64(check.rows_xxh3, &field);
        }
      });
      if (!read) return false;
      if (given != 0 && given != 3) {
        return refuse(pointer(at), "a check needs \"header_bytes\", \"header_xxh3\" and "
                                   "\"rows_xxh3\" together, got " + std::to_string(given) +
                                   " of them");
      }
    } else {
      return refuse_value(at, "a path or {\"path\": ...}");
    }
    if (path.size() > kMaxPlanPathBytes) {
      return refuse(pointer(at), "source file " + quote(path) +
                                     " is longer than a path may be (" +
                                     std::to_string(kMaxPlanPathBytes) + " bytes)");
    }
    if (!file_paths_.insert(path).second) {
      return refuse(pointer(at), "source file " + quote(path) + " is listed twice");
    }
    if (given == 3) plan.file_checks.emplace(path, check);
    return true;
  }
  // 16 lowercase hex digits in a string: a 64-bit hash as write_plan
  // writes it.
  bool hex64(uint64_t& out, const At* at) {
    std::string_view text;
    if (!string(text, at)) return false;
    uint64_t value = 0;
    bool hex = text.size() == 16;
    for (size_t i = 0; hex && i < text.size(); ++i) {
      const char c = text[i];
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      hex = digit >= 0;
      value = value << 4 | static_cast<uint64_t>(hex ? digit : 0);
    }
    if (!hex) {
      return refuse(pointer(at), "expected 16 lowercase hex digits, got " + quote(text));
    }
    out = value;
    return true;
  }

  // A row's source file: set at once when "files" came first (as
  // write_plan writes it), else once the whole plan is read. The paths
  // copied into the sources are bounded as a version 1 plan's are by its
  // text: kMaxPlanBytes in all.
  bool use_file(PlanTensor& tensor, const FileRef& ref) {
    if (!files_read_) {
      file_refs_.push_back(ref);
      return true;
    }
    return set_file(tensor, ref);
  }
  bool set_file(PlanTensor& tensor, const FileRef& ref) {
    const auto at = [&] {
      return "/tensors/" + std::to_string(ref.tensor) + "/5" + (ref.in_object ? "/file" : "");
    };
    if (ref.file >= files_.size()) {
      return refuse(at(), "file " + std::to_string(ref.file) + " is not in \"files\" (" +
                              std::to_string(files_.size()) +
                              (files_.size() == 1 ? " entry)" : " entries)"));
    }
    const std::string& path = files_[ref.file];
    path_bytes_ += path.size();
    if (path_bytes_ > kMaxPlanBytes) {
      return refuse(at(), "the sources name " + std::to_string(path_bytes_) +
                              " bytes of paths so far, more than a plan may hold (" +
                              std::to_string(kMaxPlanBytes) + " bytes)");
    }
    tensor.source->file = path;
    return true;
  }
  bool resolve_files(Plan& plan) {
    for (const FileRef& ref : file_refs_) {
      if (!set_file(plan.tensors[ref.tensor], ref)) return false;
    }
    return true;
  }

  // Room for a tensor per line left (write_plan writes one per line), but
  // no more than the shortest tensor entry allows: a plan written so does
  // not grow the vector and copy it, and a text of few lines reserves
  // little.
  void reserve_tensors(Plan& plan) const {
    constexpr size_t kShortestTensor = 20;  // ["","U8",[],0,0,0],
    const std::string_view rest = text_.substr(json_.mark().offset);
    size_t lines = 1;
    for (const char* p = rest.data(), *end = p + rest.size();
         (p = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)))) !=
         nullptr;
         ++p) {
      ++lines;
    }
    reserve_on_huge_pages(plan.tensors, std::min(lines, rest.size() / kShortestTensor + 1));
  }

  bool read_buffer(PlanBuffer& buffer, const At* at) {
    static constexpr std::array<std::string_view, 5> kKeys = {"memory_id", "device", "size",
                                                              "alignment", "rank"};
    return object(at, kKeys, {0, 1, 2}, [&](size_t i) {
      const At field{at, kKeys[i]};
      switch (i) {
        case 0: return u32(buffer.memory_id, &field);
        case 1: return string(buffer.device, &field);
        case 2: return u64(buffer.size, &field);
        case 3: return u64(buffer.alignment, &field);
        default: return u32(buffer.rank.emplace(), &field);
      }
    });
  }

  bool read_dtype(DType& out, const At* at) {
    std::string_view dtype;
    if (!string(dtype, at)) return false;
    const std::optional<DType> parsed = parse_dtype(dtype);
    if (!parsed) {
      return refuse(pointer(at), "unknown dtype " + quote(dtype) + " (known: " +
                                     known_dtype_names() + ")");
    }
    out = *parsed;
    return true;
  }
  bool read_shape(std::vector<uint64_t>& shape, const At* at) {
    return array(at, [&](size_t index) {
      const At element{at, {}, index};
      return u64(shape.emplace_back(), &element);
    });
  }

  // A tensor as a row (version 2, what write_plan writes):
  // [name, dtype, shape, memory_id, offset, source].
  bool read_row(PlanTensor& tensor, size_t row, const At* at) {
    version_2_at(at);
    static constexpr const char* kColumns =
        "6 elements: name, dtype, shape, memory_id, offset, source";
    size_t count = 0;
    const bool read = json_.elements([&](size_t index) {
      count = index + 1;
      const At field{at, {}, index};
      switch (index) {
        case 0: return string(tensor.name, &field);
        case 1: return read_dtype(tensor.dtype, &field);
        case 2: return read_shape(tensor.shape, &field);
        case 3: return u32(tensor.memory_id, &field);
        case 4: return u64(tensor.offset, &field);
        case 5: return read_row_source(tensor, row, &field);
        default:
          return refuse(pointer(at), std::string("a row has ") + kColumns + ", this one more");
      }
    });
    if (!read) return false;
    if (count == 6) return true;
    return refuse(pointer(at), std::string("a row has ") + kColumns + ", this one " +
                                   std::to_string(count));
  }

  // A row's source: null (scratch memory); the index in "files" of the
  // file holding a tensor of the row's name; or {"file": index, "key": ...,
  // "dim": ..., "start": ..., "length": ...} with "key" (default: the
  // row's name) and the slice optional.
  bool read_row_source(PlanTensor& tensor, size_t row, const At* at) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind == JsonKind::null) return json_.null();
    if (kind == JsonKind::number) {
      uint64_t file = 0;
      if (!u64(file, at)) return false;
      tensor.source.emplace().key = tensor.name;
      return use_file(tensor, FileRef{row, file, false});
    }
    if (kind != JsonKind::object) {
      return refuse_value(at, "a file index, {\"file\": ...} or null");
    }
    return read_source_object(tensor, row, at);
  }

  // null, or {"file": ..., "key": ...} with a slice's dim, start and length
  // all three or none.
  bool read_source(PlanTensor& tensor, const At* at) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind == JsonKind::null) return json_.null();
    if (kind != JsonKind::object) {
      return refuse_value(at, "{\"file\": ..., \"key\": ...} or null");
    }
    return read_source_object(tensor, std::nullopt, at);
  }

  // A source object: of an object entry (`row` none: "file" a path, "key"
  // required) or of a row ("file" an index, "key" defaulting to the name).
  bool read_source_object(PlanTensor& tensor, std::optional<size_t> row, const At* at) {
    static constexpr std::array<std::string_view, 5> kKeys = {"file", "key", "dim", "start",
                                                              "length"};
    PlanSource& source = tensor.source.emplace();
    PlanSlice slice;
    int given = 0;
    bool keyed = false;
    const bool read = object(at, kKeys, row ? std::initializer_list<size_t>{0}
                                            : std::initializer_list<size_t>{0, 1},
                             [&](size_t i) {
      const At field{at, kKeys[i]};
      switch (i) {
        case 0: {
          if (!row) return string(source.file, &field);
          uint64_t file = 0;
          if (!u64(file, &field)) return false;
          return use_file(tensor, FileRef{*row, file, true});
        }
        case 1: return keyed = true, string(source.key, &field);
        case 2: return ++given, u32(slice.dim, &field);
        case 3: return ++given, u64(slice.start, &field);
        default: return ++given, u64(slice.length, &field);
      }
    });
    if (!read) return false;
    if (given != 0 && given != 3) {
      return refuse(pointer(at), "a slice needs \"dim\", \"start\" and \"length\" together, got " +
                                     std::to_string(given) + " of them");
    }
    if (given == 3) source.slice = slice;
    if (!keyed) source.key = tensor.name;
    return true;
  }

  bool read_tensor(PlanTensor& tensor, const At* at) {
    static constexpr std::array<std::string_view, 6> kKeys = {"name",      "dtype",  "shape",
                                                              "memory_id", "offset", "source"};
    return object(at, kKeys, {0, 1, 2, 3, 4}, [&](size_t i) {
      const At field{at, kKeys[i]};
      switch (i) {
        case 0: return string(tensor.name, &field);
        case 1: return read_dtype(tensor.dtype, &field);
        case 2: return read_shape(tensor.shape, &field);
        case 3: return u32(tensor.memory_id, &field);
        case 4: return u64(tensor.offset, &field);
        default: return read_source(tensor, &field);
      }
    });
  }

  bool read_method(PlanMethod& method, const At* at) {
    static constexpr std::array<std::string_view, 3> kKeys = {"name", "memory_ids", "tensors"};
    return object(at, kKeys, {0, 1, 2}, [&](size_t i) {
      const At field{at, kKeys[i]};
      switch (i) {
        case 0: return string(method.name, &field);
        case 1:
          return array(&field, [&](size_t index) {
            const At element{&field, {}, index};
            return u32(method.memory_ids.emplace_back(), &element);
          });
        default: {
          // A valid plan's method lists each tensor once at most: room for
          // them all (or for what the text left can hold) saves copying
          // the names each time the list doubles. The methods share room
          // for twice the plan's tensors (one method, or two, listing every
          // tensor), so that many short methods cost no more; what one
          // does not use is given back.
          const size_t left = text_.size() - json_.mark().offset;
          const size_t room = std::min({plan_tensors_, left / 3 + 1, method_room_});
          method_room_ -= room;
          reserve_on_huge_pages(method.tensors, room);
          const bool read = array(&field, [&](size_t index) {
            const At element{&field, {}, index};
            return string(method.tensors.emplace_back(), &element);
          });
          if (method.tensors.capacity() > 2 * method.tensors.size() + 4096) {
            method.tensors.shrink_to_fit();
          }
          return read;
        }
      }
    });
  }

  // Whether the text says it is a devalloc plan of a version this devalloc
  // reads: a second pass over the root's members, taken only when the
  // first stopped (or ended) before it saw both. Nothing when the text
  // does not get as far as saying.
  std::optional<Status> identity_error() const {
    JsonCursor json(text_, kMaxPlanDepth);
    std::optional<std::string_view> format;  // as written
    std::optional<std::string_view> version;
    JsonKind kind = JsonKind::null;
    if (!json.peek(kind)) return std::nullopt;
    if (kind != JsonKind::object) return std::nullopt;  // the first pass says so
    const bool whole = json.members([&](std::string_view key) {
      std::optional<std::string_view>* wanted = key == "format"    ? &format
                                                : key == "version" ? &version
                                                                   : nullptr;
      std::string_view value;
      if (!json.skip(value)) return false;
      if (wanted != nullptr && !*wanted) *wanted = value;
      return true;
    });
    if (format) {
      JsonCursor value(*format, 1);
      std::string_view name;
      JsonKind format_kind = JsonKind::null;
      if (!value.peek(format_kind) || format_kind != JsonKind::string || !value.string(name) ||
          name != kPlanFormat) {
        return fail("/format", "expected \"" + std::string(kPlanFormat) + "\", got " +
                                   describe(*format) + ": not a devalloc plan");
      }
    } else if (whole) {
      return fail("/format", "expected \"" + std::string(kPlanFormat) +
                                 "\", got nothing: not a devalloc plan");
    }
    if (!version) {
      if (whole) return fail("", "missing \"version\"");
      return std::nullopt;
    }
    const std::optional<uint64_t> number = detail::json_unsigned(*version);
    if (!number) {
      return fail("/version", "expected a non-negative integer, got " + describe(*version));
    }
    if (*number == 0) return fail("/version", "versions start at 1");
    if (*number > kPlanVersion) {
      return fail("/version", "version " + std::to_string(*number) +
                                  " is newer than this devalloc reads (" +
                                  std::to_string(kPlanVersion) + ")");
    }
    return std::nullopt;
  }

  std::string_view text_;
  JsonCursor json_;
  std::string file_;
  bool format_ok_ = false;
  bool version_ok_ = false;
  uint64_t version_ = 0;
  std::vector<std::string> files_;
  std::unordered_set<std::string> file_paths_;  // each listed once
  bool files_read_ = false;
  std::vector<FileRef> file_refs_;  // read before "files"
  uint64_t path_bytes_ = 0;         // copied into sources so far
  size_t plan_tensors_ = 0;         // tensors read before "methods"
  size_t method_room_ = 0;          // names the methods may still reserve
  std::optional<std::string> version_2_at_;
  std::string problem_pointer_;  // where the value that is wrong is
  std::string problem_;          // and why, when the text is JSON
  std::optional<Duplicate> duplicate_;  // the syntax error is a key given twice
};

// A plan that was read, unless a name or path in it is longer than a plan
// may hold: refused here, before anything resolves or looks it up.
Result<Plan> checked_limits(Plan plan) {
  if (Status status = detail::check_plan_limits(plan); !status.ok()) return status;
  return plan;
}

Result<Plan> read_plan_checked(const std::filesystem::path& path) {
  if (path.empty()) {
    return Status(StatusCode::invalid_argument, "the plan path is empty: it names no file");
  }
  Result<std::string> text = read_regular_file(path, kMaxPlanBytes, "plan");
  if (!text.ok()) return text.status();
  Plan plan;
  plan.path = path;
  if (Status s = PlanReader(*text, path_for_message(path.string())).read(plan); !s.ok()) {
    return s;
  }
  return checked_limits(std::move(plan));
}

}  // namespace

Result<Plan> read_plan(const std::filesystem::path& path) {
  return detail::without_exceptions(path, "the plan", [&] { return read_plan_checked(path); });
}

}  // namespace devalloc
