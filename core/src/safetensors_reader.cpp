#include <devalloc/core/safetensors.hpp>

#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>

#include "json_cursor.hpp"
#include <devalloc/no_exceptions.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <tuple>
#include <unordered_set>

namespace devalloc {

namespace {

using detail::JsonCursor;
using detail::JsonKind;

// The header, read in one pass by the one JSON reader (json_cursor.hpp)
// into the tensors in header order and the metadata, each entry checked
// on its own as it is read (what involves several entries, names given
// twice and the tiling, is open()'s). The first error, in text order,
// is the one reported.
class HeaderReader {
 public:
  HeaderReader(std::string_view header, std::string file, uint64_t data_offset,
               uint64_t data_size)
      : header_(header),
        json_(header, kMaxSafetensorsHeaderDepth),
        file_(std::move(file)),
        data_offset_(data_offset),
        data_size_(data_size) {}

  Status fail(const std::string& reason) const {
    return Status(StatusCode::invalid_argument, file_ + ": " + reason);
  }
  Status fail(std::string_view tensor, const std::string& reason) const {
    return fail("tensor " + quote(tensor) + ": " + reason);
  }

  Status read(std::vector<SafetensorsTensor>& tensors,
              std::map<std::string, std::string>& metadata) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return syntax_error(json_);
    if (kind != JsonKind::object) {
      std::string_view text;
      if (!json_.skip(text)) return syntax_error(json_);
      return fail("header is " + std::string(detail::json_kind_name(text)) +
                  ", expected a JSON object");
    }
    bool seen_metadata = false;
    const bool read = json_.members([&](std::string_view name) {
                        if (name == "__metadata__") {
                          if (seen_metadata) {
                            return json_.fail(json_.key_at(), "__metadata__ appears twice");
                          }
                          seen_metadata = true;
                          return read_metadata(metadata);
                        }
                        SafetensorsTensor& tensor = tensors.emplace_back();
                        tensor.name = name;
                        return read_entry(tensor);
                      }) &&
                      json_.at_text_end();
    if (read) return Status();
    if (json_.failed()) return syntax_error(json_);
    return problem_;
  }

  // For a header read without error whose tensor names are not unique:
  // the first name given twice, where it is given again. A second pass,
  // taken only for this error.
  Status name_given_twice() const {
    JsonCursor json(header_, kMaxSafetensorsHeaderDepth);
    std::unordered_set<std::string> names;
    const bool read = json.members([&](std::string_view name) {
      if (name != "__metadata__" && !names.emplace(name).second) {
        return json.fail(json.key_at(), "tensor " + quote(name) + " appears twice");
      }
      std::string_view value;
      return json.skip(value);
    });
    if (!read && json.failed()) return syntax_error(json);
    return fail("a tensor name appears twice");  // not reached: read() took the header
  }

 private:
  // "<file>: header line 3, column 14 (byte 52 of the file): <reason>"
  Status syntax_error(const JsonCursor& json) const {
    const detail::JsonError error = json.error();
    return fail("header " + error.position() + " (byte " + std::to_string(8 + error.byte) +
                " of the file): " + error.reason);
  }

  // Refuses the value at the cursor: `what` is <value as written> `expected`.
  bool refuse(const std::string& what, const std::string& expected) {
    std::string_view text;
    if (!json_.skip(text)) return false;
    problem_ = fail(what + " is " + detail::json_excerpt(text) + ", expected " + expected);
    return false;
  }
  bool refuse(std::string_view tensor, const std::string& what, const std::string& expected) {
    return refuse("tensor " + quote(tensor) + ": " + what, expected);
  }

  // null (no metadata, as the reference reads it) or {"key": "value", ...}.
  bool read_metadata(std::map<std::string, std::string>& metadata) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind == JsonKind::null) return json_.null();
    if (kind != JsonKind::object) return refuse("__metadata__", "an object of strings");
    return json_.members([&](std::string_view key) {
      JsonKind value_kind = JsonKind::null;
      if (!json_.peek(value_kind)) return false;
      if (value_kind != JsonKind::string) {
        return refuse("__metadata__ " + quote(key), "a string");
      }
      std::string_view value;
      if (!json_.string(value)) return false;
      if (!metadata.emplace(key, value).second) {
        return json_.fail(json_.key_at(),
                          "duplicate key " + quote(key) + " in \"/__metadata__\"");
      }
      return true;
    });
  }

  // One entry, {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}.
  bool read_entry(SafetensorsTensor& tensor) {
    const std::string& name = tensor.name;
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind != JsonKind::object) return refuse(name, "entry", "an object");
    bool has_dtype = false;
    bool has_shape = false;
    bool has_offsets = false;
    uint64_t offsets[2] = {0, 0};
    std::string_view offsets_text;
    const bool read = json_.members([&](std::string_view field) {
      bool* seen = field == "dtype"          ? &has_dtype
                   : field == "shape"        ? &has_shape
                   : field == "data_offsets" ? &has_offsets
                                             : nullptr;
      if (seen == nullptr) {
        problem_ = fail(name, "unknown field " + quote(field) +
                                  " (expected dtype, shape, data_offsets)");
        return false;
      }
      if (*seen) {
        return json_.fail(json_.key_at(), "duplicate key " + quote(field) + " in " +
                                              quote("/" + detail::json_pointer_token(name)));
      }
      *seen = true;
      if (seen == &has_dtype) return read_dtype(tensor);
      if (seen == &has_shape) return read_shape(tensor);
      return read_offsets(name, offsets, offsets_text);
    });
    if (!read) return false;
    for (const auto& [given, field] : {std::pair{has_dtype, "dtype"},
                                       {has_shape, "shape"},
                                       {has_offsets, "data_offsets"}}) {
      if (!given) {
        problem_ = fail(name, std::string("no ") + field);
        return false;
      }
    }
    const uint64_t first = offsets[0];
    const uint64_t last = offsets[1];
    // Made only for a message.
    const auto shown_offsets = [&] { return detail::json_excerpt(offsets_text); };
    if (first > last) {
      problem_ = fail(name, "data_offsets " + shown_offsets() + " end before they begin");
      return false;
    }
    if (last > data_size_) {
      // Both in file bytes; data_offset_ + data_size_ is the file size, so
      // no overflow is possible on the right, and on the left only for an
      // end that is past the file anyway.
      uint64_t end_in_file = 0;
      const std::string end_text = __builtin_add_overflow(data_offset_, last, &end_in_file)
                                       ? "data offset " + std::to_string(last)
                                       : "byte " + std::to_string(end_in_file);
      problem_ = fail(name, "ends at " + end_text + ", file has " +
                                std::to_string(data_offset_ + data_size_) + " bytes");
      return false;
    }
    const Result<uint64_t> nbytes = byte_size(tensor.dtype, tensor.shape);
    if (!nbytes.ok()) {
      problem_ = fail(name, nbytes.status().message());
      return false;
    }
    if (*nbytes != last - first) {
      problem_ = fail(name, "shape " + shape_to_string(tensor.shape) + " of " +
                                std::string(to_string(tensor.dtype)) + " needs " +
                                std::to_string(*nbytes) + " bytes, data_offsets " +
                                shown_offsets() + " hold " + std::to_string(last - first));
      return false;
    }
    tensor.offset = data_offset_ + first;
    tensor.nbytes = *nbytes;
    return true;
  }

  bool read_dtype(SafetensorsTensor& tensor) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind != JsonKind::string) return refuse(tensor.name, "dtype", "a string");
    const JsonCursor::Mark start = json_.mark();
    std::string_view value;
    if (!json_.string(value)) return false;
    const std::optional<DType> dtype = parse_dtype(value);
    if (!dtype) {
      problem_ = fail(tensor.name, "unknown dtype " +
                                       detail::json_excerpt(json_.text_since(start)) +
                                       " (known: " + known_dtype_names() + ")");
      return false;
    }
    tensor.dtype = *dtype;
    return true;
  }

  bool read_shape(SafetensorsTensor& tensor) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    if (kind != JsonKind::array) return refuse(tensor.name, "shape", "an array");
    return json_.elements([&](size_t i) {
      uint64_t dim = 0;
      if (json_.unsigned_number(dim)) {
        tensor.shape.push_back(dim);
        return true;
      }
      return refuse(tensor.name, "shape[" + std::to_string(i) + "]",
                    "a non-negative integer");
    });
  }

  // [begin, end], two non-negative integers; anything else is refused
  // whole, as written.
  bool read_offsets(std::string_view name, uint64_t (&offsets)[2], std::string_view& text) {
    JsonKind kind = JsonKind::null;
    if (!json_.peek(kind)) return false;
    const JsonCursor::Mark start = json_.mark();
    size_t count = 0;
    bool plain = kind == JsonKind::array;
    if (plain) {
      const bool read = json_.elements([&](size_t) {
        if (count == 2 || !json_.unsigned_number(offsets[count])) {
          plain = false;
          return false;
        }
        ++count;
        return true;
      });
      if (!read && json_.failed()) return false;
      plain = plain && count == 2;
    }
    if (plain) {
      text = json_.text_since(start);
      return true;
    }
    json_.rewind(start);
    return refuse(name, "data_offsets", "[begin, end] with non-negative integers");
  }

  std::string_view header_;
  JsonCursor json_;
  std::string file_;
  uint64_t data_offset_;
  uint64_t data_size_;
  Status problem_;  // what the header says that is wrong, when not syntax
};

}  // namespace

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::open(
    const std::filesystem::path& path, const std::filesystem::path& beneath) {
  return detail::without_exceptions(path, "the header",
                                    [&] { return open_checked(path, beneath); });
}

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::open_checked(
    const std::filesystem::path& path, const std::filesystem::path& beneath) {
  Result<std::shared_ptr<const MappedFile>> mapped = MappedFile::open(path, beneath);
  if (!mapped.ok()) return mapped.status();
  const std::string file = path_for_message(path.string());
  const auto fail = [&](const std::string& reason) {
    return Status(StatusCode::invalid_argument, file + ": " + reason);
  };

  // The length and the header are copied out of the mapping by guarded
  // reads (MappedFile::copy_to) and parsed from the copy: a file truncated
  // by another program after it was mapped is an error here, not a SIGBUS
  // in the middle of the parse.
  const std::span<const std::byte> bytes = (*mapped)->bytes();
  if (bytes.size() < 8) {
    return fail("file has " + std::to_string(bytes.size()) +
                " bytes, too short for the 8-byte header length");
  }
  unsigned char length_bytes[8];
  if (Status s = (*mapped)->copy_to(0, 8, length_bytes); !s.ok()) return s;
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return fail("header length " + std::to_string(header_size) + " is above the limit of " +
                std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (header_size > bytes.size() - 8) {
    return fail("header length " + std::to_string(header_size) + " ends at byte " +
                std::to_string(8 + header_size) + ", file has " +
                std::to_string(bytes.size()) + " bytes");
  }
  const uint64_t data_offset = 8 + header_size;
  // Not zero-filled: copy_to writes every byte or fails.
  const auto header_copy = std::make_unique_for_overwrite<char[]>(static_cast<size_t>(header_size));
  advise_huge_pages(header_copy.get(), static_cast<size_t>(header_size));
  if (Status s = (*mapped)->copy_to(8, header_size, header_copy.get()); !s.ok()) return s;
  const std::string_view header(header_copy.get(), static_cast<size_t>(header_size));

  std::shared_ptr<SafetensorsFile> result(new SafetensorsFile());
  HeaderReader reader(header, file, data_offset, bytes.size() - data_offset);
  std::vector<SafetensorsTensor>& tensors = result->tensors_;
  // Offset order, and the name index; false when a name appears twice.
  // Empty tensors go first among equal offsets, so one at a boundary fits
  // the tiling check below; ties (empty tensors at one offset) go by name:
  // the order never depends on the order of the header's entries.
  const auto arrange = [&] {
    // Writers mostly list names in ascending order, which proves them
    // unique without an index.
    const bool ascending = std::adjacent_find(tensors.begin(), tensors.end(),
                                              [](const SafetensorsTensor& a,
                                                 const SafetensorsTensor& b) {
                                                return !(a.name < b.name);
                                              }) == tensors.end();
    const auto by_place = [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
      return std::tie(a.offset, a.nbytes, a.name) < std::tie(b.offset, b.nbytes, b.name);
    };
    // Writers mostly list tensors in offset order already.
    if (!std::is_sorted(tensors.begin(), tensors.end(), by_place)) {
      std::sort(tensors.begin(), tensors.end(), by_place);
    }
    return ascending || result->build_index();
  };
  // No entry is shorter than kShortestEntry bytes, so this reserves at
  // least what the header holds: the vector never grows and copies
  // (reserved pages nobody writes cost no memory).
  constexpr size_t kShortestEntry = 48;
  reserve_on_huge_pages(tensors, header.size() / kShortestEntry + 1);
  if (Status s = reader.read(tensors, result->metadata_); !s.ok()) return s;
  if (!arrange()) return reader.name_given_twice();

  // As the reference reader requires, the tensors tile the data section
  // exactly: each starts where the one before it ends, the first at 0, the
  // last at the end of the file. A gap would hold bytes that no tool shows.
  const auto range = [&](const SafetensorsTensor& t) {
    return "[" + std::to_string(t.offset - data_offset) + ", " +
           std::to_string(t.offset - data_offset + t.nbytes) + "]";
  };
  const uint64_t data_size = bytes.size() - data_offset;
  uint64_t covered = 0;  // data bytes [0, covered) belong to the tensors so far
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& tensor : tensors) {
    const uint64_t begin = tensor.offset - data_offset;
    if (begin < covered) {
      return reader.fail(tensor.name, "data_offsets " + range(tensor) + " overlap tensor " +
                                          quote(previous->name) + " at " + range(*previous));
    }
    if (begin > covered) {
      const std::string where = previous == nullptr ? "at the start of the data section"
                                                    : "after tensor " + quote(previous->name) +
                                                          " at " + range(*previous);
      return reader.fail(tensor.name, "data_offsets " + range(tensor) + " leave a gap " +
                                          where + ": data bytes " + std::to_string(covered) +
                                          " to " + std::to_string(begin) +
                                          " belong to no tensor");
    }
    covered = begin + tensor.nbytes;
    previous = &tensor;
  }
  if (covered != data_size) {
    return fail("the data section has " + std::to_string(data_size) +
                " bytes, the tensors end at " + std::to_string(covered) + ": data bytes " +
                std::to_string(covered) + " to " + std::to_string(data_size) +
                " belong to no tensor");
  }

  result->mapping_ = std::move(*mapped);
  result->data_offset_ = data_offset;
  return std::shared_ptr<const SafetensorsFile>(std::move(result));
}

bool SafetensorsFile::build_index() const {
  index_.clear();
  index_.reserve(tensors_.size());
  bool unique = true;
  for (size_t i = 0; i < tensors_.size(); ++i) unique = index_.insert(tensors_[i].name, i) && unique;
  indexed_.store(true, std::memory_order_release);
  return unique;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  if (!indexed_.load(std::memory_order_acquire)) {
    const std::lock_guard<std::mutex> lock(index_mutex_);
    if (!indexed_.load(std::memory_order_relaxed)) build_index();
  }
  const std::optional<size_t> found = index_.find(name);
  return found ? &tensors_[*found] : nullptr;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name, size_t hint) const {
  // Names are unique in a file, so a match at the hint is the match.
  if (hint < tensors_.size() && tensors_[hint].name == name) return &tensors_[hint];
  return find(name);
}

std::span<const std::byte> SafetensorsFile::bytes(const SafetensorsTensor& tensor) const {
  return mapping_->bytes().subspan(static_cast<size_t>(tensor.offset),
                                   static_cast<size_t>(tensor.nbytes));
}

}  // namespace devalloc
