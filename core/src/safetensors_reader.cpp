#include <devalloc/core/safetensors.hpp>

#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>

#include "json_parse.hpp"
#include "plain_json.hpp"
#include <devalloc/no_exceptions.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <tuple>

namespace devalloc {

namespace {

using nlohmann::json;

// "-3", "2.5", "\"x\"": a JSON value as it appears in the file, for messages.
std::string shown(const json& value) { return detail::json_excerpt(value); }

// A non-negative integer as written in JSON; 1.0 and -0 are not integers here.
std::optional<uint64_t> as_unsigned(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  return std::nullopt;
}

class HeaderReader {
 public:
  HeaderReader(std::string file, uint64_t data_size)
      : file_(std::move(file)), data_size_(data_size) {}

  Status fail(const std::string& reason) const {
    return Status(StatusCode::invalid_argument, file_ + ": " + reason);
  }
  Status fail(std::string_view tensor, const std::string& reason) const {
    return fail("tensor " + quote(tensor) + ": " + reason);
  }

  Status read_metadata(const json& value, std::map<std::string, std::string>& out) const {
    if (value.is_null()) return Status();  // as the reference reads it: no metadata
    if (!value.is_object()) {
      return fail("__metadata__ is " + shown(value) +
                  ", expected an object of strings");
    }
    for (const auto& [key, item] : value.items()) {
      if (!item.is_string()) {
        return fail("__metadata__ " + quote(key) + " is " + shown(item) +
                    ", expected a string");
      }
      out.emplace(key, item.get<std::string>());
    }
    return Status();
  }

  // Everything about one entry that does not involve other entries.
  Status read_tensor(const std::string& name, const json& entry, uint64_t data_offset,
                     SafetensorsTensor& out) const {
    if (!entry.is_object()) {
      return fail(name, "entry is " + shown(entry) + ", expected an object");
    }
    for (auto it = entry.begin(); it != entry.end(); ++it) {
      if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets") {
        return fail(name, "unknown field " + quote(it.key()) +
                              " (expected dtype, shape, data_offsets)");
      }
    }
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(key)) return fail(name, std::string("no ") + key);
    }

    const json& dtype = entry["dtype"];
    if (!dtype.is_string()) {
      return fail(name, "dtype is " + shown(dtype) + ", expected a string");
    }
    const std::optional<DType> parsed = parse_dtype(dtype.get<std::string>());
    if (!parsed) {
      return fail(name, "unknown dtype " + shown(dtype) + " (known: " +
                            known_dtype_names() + ")");
    }

    const json& shape = entry["shape"];
    if (!shape.is_array()) {
      return fail(name, "shape is " + shown(shape) + ", expected an array");
    }
    std::vector<uint64_t> dims;
    for (size_t i = 0; i < shape.size(); ++i) {
      const std::optional<uint64_t> dim = as_unsigned(shape[i]);
      if (!dim) {
        return fail(name, "shape[" + std::to_string(i) + "] is " + shown(shape[i]) +
                              ", expected a non-negative integer");
      }
      dims.push_back(*dim);
    }

    const json& offsets = entry["data_offsets"];
    std::optional<uint64_t> first;
    std::optional<uint64_t> last;
    if (offsets.is_array() && offsets.size() == 2) {
      first = as_unsigned(offsets[0]);
      last = as_unsigned(offsets[1]);
    }
    if (!first || !last) {
      return fail(name, "data_offsets is " + shown(offsets) +
                            ", expected [begin, end] with non-negative integers");
    }
    if (*first > *last) {
      return fail(name, "data_offsets " + shown(offsets) + " end before they begin");
    }
    if (*last > data_size_) {
      // Both in file bytes; data_offset + data_size_ is the file size, so no
      // overflow is possible on the right, and on the left only for an end
      // that is past the file anyway.
      uint64_t end_in_file = 0;
      const std::string end_text =
          __builtin_add_overflow(data_offset, *last, &end_in_file)
              ? "data offset " + std::to_string(*last)
              : "byte " + std::to_string(end_in_file);
      return fail(name, "ends at " + end_text + ", file has " +
                            std::to_string(data_offset + data_size_) + " bytes");
    }

    Result<uint64_t> nbytes = byte_size(*parsed, dims);
    if (!nbytes.ok()) return fail(name, nbytes.status().message());
    if (*nbytes != *last - *first) {
      return fail(name, "shape " + shape_to_string(dims) + " of " +
                            std::string(to_string(*parsed)) + " needs " +
                            std::to_string(*nbytes) + " bytes, data_offsets " +
                            shown(offsets) + " hold " +
                            std::to_string(*last - *first));
    }

    out.name = name;
    out.dtype = *parsed;
    out.shape = std::move(dims);
    out.offset = data_offset + *first;
    out.nbytes = *nbytes;
    return Status();
  }

 private:
  std::string file_;
  uint64_t data_size_;
};

// The fast path: headers as writers emit them, read without building any
// JSON value. It accepts only a plain subset of what the strict reader
// accepts, and for that subset it yields exactly what the strict reader
// would: the same entries in the same order and the same metadata. Anything
// else (an escape in a string, a number that is not a plain unsigned
// integer, an unknown field, an unknown dtype, a bad size, a key given
// twice, any syntax error) makes it give up without a reason, and the
// strict reader reads the header again from the start and says what is
// wrong. So every error comes from one place; the fuzz target checks that
// both readers agree on whatever the fast one accepts.
class PlainHeaderScanner {
 public:
  PlainHeaderScanner(std::string_view header, uint64_t data_offset, uint64_t data_size)
      : json_(header), data_offset_(data_offset), data_size_(data_size) {}

  // True when the whole header is in the plain subset; `tensors` are then
  // in header order, as the strict reader lists them. Names given twice are
  // left to the caller, which indexes them anyway.
  bool read(std::vector<SafetensorsTensor>& tensors,
            std::map<std::string, std::string>& metadata) {
    bool seen_metadata = false;
    json_.space();
    return json_.members([&](std::string_view name) {
             if (name == "__metadata__") {
               if (seen_metadata) return false;
               seen_metadata = true;
               return read_metadata(metadata);
             }
             SafetensorsTensor& tensor = tensors.emplace_back();
             tensor.name = name;
             return read_entry(tensor);
           }) &&
           json_.at_text_end();
  }

 private:
  bool read_entry(SafetensorsTensor& tensor) {
    bool has_dtype = false;
    bool has_shape = false;
    bool has_offsets = false;
    uint64_t offsets[2] = {0, 0};
    size_t offset_count = 0;
    const bool read = json_.members([&](std::string_view field) {
      if (field == "dtype" && !has_dtype) {
        has_dtype = true;
        std::string_view name;
        if (!json_.plain_string(name)) return false;
        const std::optional<DType> dtype = parse_dtype(name);
        if (!dtype) return false;
        tensor.dtype = *dtype;
        return true;
      }
      if (field == "shape" && !has_shape) {
        has_shape = true;
        return json_.unsigned_array([&](uint64_t d) {
          tensor.shape.push_back(d);
          return true;
        });
      }
      if (field == "data_offsets" && !has_offsets) {
        has_offsets = true;
        return json_.unsigned_array([&](uint64_t o) {
                 if (offset_count == 2) return false;
                 offsets[offset_count++] = o;
                 return true;
               }) &&
               offset_count == 2;
      }
      return false;
    });
    if (!read || !has_dtype || !has_shape || !has_offsets) return false;
    const uint64_t first = offsets[0];
    const uint64_t last = offsets[1];
    if (first > last || last > data_size_) return false;
    const Result<uint64_t> nbytes = byte_size(tensor.dtype, tensor.shape);
    if (!nbytes.ok() || *nbytes != last - first) return false;
    tensor.offset = data_offset_ + first;
    tensor.nbytes = *nbytes;
    return true;
  }

  // {"key": "value", ...}; null and anything else go to the strict reader.
  bool read_metadata(std::map<std::string, std::string>& metadata) {
    return json_.members([&](std::string_view key) {
      std::string_view value;
      return json_.plain_string(value) && metadata.emplace(key, value).second;
    });
  }

  detail::PlainJson json_;
  uint64_t data_offset_;
  uint64_t data_size_;
};

// The strict reader, entry by entry: a header of 100 000 tensors is never
// one document.
Status read_header_strict(std::string_view header, uint64_t data_offset,
                          const HeaderReader& reader,
                          std::vector<SafetensorsTensor>& tensors,
                          std::map<std::string, std::string>& metadata) {
  Status entry_status;
  auto parsed = detail::parse_json_members(
      header, kMaxSafetensorsHeaderDepth, [&](const std::string& name, json&& entry) {
        if (name == "__metadata__") {
          entry_status = reader.read_metadata(entry, metadata);
          return entry_status.ok();
        }
        SafetensorsTensor tensor;
        entry_status = reader.read_tensor(name, entry, data_offset, tensor);
        if (entry_status.ok()) tensors.push_back(std::move(tensor));
        return entry_status.ok();
      });
  if (const auto* error = std::get_if<detail::JsonError>(&parsed)) {
    const std::string where = "header " + error->position() + " (byte " +
                              std::to_string(8 + error->byte) + " of the file): ";
    if (const auto& duplicate = error->duplicate) {
      // Top-level keys are tensor names; deeper ones are fields of an entry.
      if (duplicate->object_pointer.empty()) {
        if (duplicate->key == "__metadata__") return reader.fail(where + "__metadata__ appears twice");
        return reader.fail(where + "tensor " + quote(duplicate->key) + " appears twice");
      }
      return reader.fail(where + "duplicate key " + quote(duplicate->key) + " in " +
                         quote(duplicate->object_pointer));
    }
    return reader.fail(where + error->reason);
  }
  if (const auto* root = std::get_if<json>(&parsed)) {
    return reader.fail("header is " + std::string(root->type_name()) +
                       ", expected a JSON object");
  }
  return entry_status;
}

}  // namespace

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::open(
    const std::filesystem::path& path, detail::HeaderReading mode,
    const std::filesystem::path& beneath) {
  return detail::without_exceptions(path, "the header",
                                    [&] { return open_checked(path, mode, beneath); });
}

Result<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::open_checked(
    const std::filesystem::path& path, detail::HeaderReading mode,
    const std::filesystem::path& beneath) {
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
  HeaderReader reader(file, bytes.size() - data_offset);
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
  // The fast path first; anything outside it, a name given twice included,
  // is read again by the strict reader, which says what is wrong. No entry
  // of the plain form is shorter than kShortestEntry bytes, so this reserves
  // at least what the header holds: the vector never grows and copies
  // (reserved pages nobody writes cost no memory).
  constexpr size_t kShortestEntry = 48;
  reserve_on_huge_pages(tensors, header.size() / kShortestEntry + 1);
  if (mode == detail::HeaderReading::strict ||
      !PlainHeaderScanner(header, data_offset, bytes.size() - data_offset)
           .read(tensors, result->metadata_) ||
      !arrange()) {
    if (mode == detail::HeaderReading::fast_only) {
      return fail("header is not in the plain form the fast reader reads");
    }
    tensors.clear();
    result->metadata_.clear();
    result->index_.clear();
    result->indexed_.store(false, std::memory_order_relaxed);
    if (Status s = read_header_strict(header, data_offset, reader, tensors, result->metadata_);
        !s.ok()) {
      return s;
    }
    arrange();  // the strict reader refuses a name given twice
  }

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
