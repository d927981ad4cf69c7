#include <devalloc/core/dtype.hpp>
#include <devalloc/input_text.hpp>

#include <array>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>

namespace devalloc {

namespace {

struct DTypeInfo {
  std::string_view name;
  uint32_t bits;
  DLDataType dlpack;
};

// In the order of DType's values: info() is a lookup, run for every
// tensor of a header and of a plan (its name, its width).
constexpr DTypeInfo kInfo[] = {
    {"BOOL", 8, {kDLPackBoolCode, 8, 1}},
    {"U8", 8, {kDLUInt, 8, 1}},
    {"I8", 8, {kDLInt, 8, 1}},
    {"U16", 16, {kDLUInt, 16, 1}},
    {"I16", 16, {kDLInt, 16, 1}},
    {"U32", 32, {kDLUInt, 32, 1}},
    {"I32", 32, {kDLInt, 32, 1}},
    {"U64", 64, {kDLUInt, 64, 1}},
    {"I64", 64, {kDLInt, 64, 1}},
    {"F16", 16, {kDLFloat, 16, 1}},
    {"BF16", 16, {kDLBfloat, 16, 1}},
    {"F32", 32, {kDLFloat, 32, 1}},
    {"F64", 64, {kDLFloat, 64, 1}},
    {"C64", 64, {kDLComplex, 64, 1}},
    {"F8_E4M3", 8, {kDLPackFloat8E4M3FnCode, 8, 1}},
    {"F8_E5M2", 8, {kDLPackFloat8E5M2Code, 8, 1}},
    {"F8_E4M3FNUZ", 8, {kDLPackFloat8E4M3FnuzCode, 8, 1}},
    {"F8_E5M2FNUZ", 8, {kDLPackFloat8E5M2FnuzCode, 8, 1}},
    {"F8_E8M0", 8, {kDLPackFloat8E8M0FnuCode, 8, 1}},
    {"F6_E2M3", 6, {kDLPackFloat6E2M3FnCode, 6, 1}},
    {"F6_E3M2", 6, {kDLPackFloat6E3M2FnCode, 6, 1}},
    {"F4", 4, {kDLPackFloat4E2M1FnCode, 4, 1}},
};
static_assert(std::size(kInfo) == std::size(kAllDTypes));
static_assert(static_cast<size_t>(DType::f4) + 1 == std::size(kInfo));

const DTypeInfo& info(DType dtype) {
  // Only a cast of an out-of-range integer misses the table.
  static constexpr DTypeInfo kUnknown{"?", 8, {kDLUInt, 8, 1}};
  const auto i = static_cast<size_t>(dtype);
  return i < std::size(kInfo) ? kInfo[i] : kUnknown;
}

}  // namespace

std::string_view to_string(DType dtype) { return info(dtype).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  // Called once per tensor of a header and of a plan: by length and first
  // byte, then the whole name, so that the common dtypes take one compare.
  const auto one_of = [&](std::initializer_list<DType> candidates) -> std::optional<DType> {
    for (DType dtype : candidates) {
      if (info(dtype).name == name) return dtype;
    }
    return std::nullopt;
  };
  switch (name.size()) {
    case 2: return one_of({DType::u8, DType::i8, DType::f4});
    case 3:
      switch (name[0]) {
        case 'F': return one_of({DType::f32, DType::f16, DType::f64});
        case 'I': return one_of({DType::i64, DType::i32, DType::i16});
        case 'U': return one_of({DType::u16, DType::u32, DType::u64});
        case 'C': return one_of({DType::c64});
        default: return std::nullopt;
      }
    case 4: return one_of({DType::bf16, DType::boolean});
    case 7:
      return one_of({DType::f8_e4m3, DType::f8_e5m2, DType::f8_e8m0, DType::f6_e2m3,
                     DType::f6_e3m2});
    case 11: return one_of({DType::f8_e4m3fnuz, DType::f8_e5m2fnuz});
    default: return std::nullopt;
  }
}

std::string known_dtype_names() {
  std::string names;
  for (DType dtype : kAllDTypes) {
    if (!names.empty()) names += ", ";
    names += info(dtype).name;
  }
  return names;
}

uint32_t bit_width(DType dtype) { return info(dtype).bits; }

DLDataType to_dlpack(DType dtype) { return info(dtype).dlpack; }

std::string shape_to_string(std::span<const uint64_t> shape) {
  // A shape comes from a file, which may give it millions of dimensions:
  // cut, like any value a message repeats (quote()), after about
  // kMaxQuotedBytes, never inside a number, saying how many there are.
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) text += ", ";
    if (text.size() >= kMaxQuotedBytes) {
      return text + "... (" + std::to_string(shape.size()) + " dimensions)]";
    }
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

Result<uint64_t> byte_size(DType dtype, std::span<const uint64_t> shape) {
  constexpr uint64_t kMaxDimension = std::numeric_limits<int64_t>::max();
  const auto fail = [&](const std::string& reason) {
    return Status(StatusCode::invalid_argument,
                  "shape " + shape_to_string(shape) + " of " +
                      std::string(to_string(dtype)) + reason);
  };
  bool empty = false;
  for (uint64_t dim : shape) {
    if (dim > kMaxDimension) {
      return fail(": dimension " + std::to_string(dim) + " is above 2^63-1");
    }
    empty = empty || dim == 0;
  }
  if (empty) return uint64_t{0};

  uint64_t elements = 1;
  for (uint64_t dim : shape) {
    if (__builtin_mul_overflow(elements, dim, &elements)) {
      return fail(": size overflows 64 bits");
    }
  }
  // elements * bits / 8 without forming elements * bits, which can overflow
  // while the byte count still fits.
  const uint64_t bits = bit_width(dtype);
  uint64_t bytes = 0;
  const uint64_t rest_bits = (elements % 8) * bits;
  if (__builtin_mul_overflow(elements / 8, bits, &bytes) ||
      __builtin_add_overflow(bytes, rest_bits / 8, &bytes)) {
    return fail(": size overflows 64 bits");
  }
  if (rest_bits % 8 != 0) {
    return fail(" is " + std::to_string(elements) + " x " + std::to_string(bits) +
                " bits, not a whole number of bytes");
  }
  return bytes;
}

}  // namespace devalloc
