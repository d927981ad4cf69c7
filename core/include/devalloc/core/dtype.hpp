// Element types of tensor data: the dtypes of the safetensors format, their
// widths, and their DLPack type codes.
#pragma once

#include <devalloc/status.hpp>

#include <dlpack/dlpack.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace devalloc {

// Every dtype the safetensors format defines (reference implementation 0.8),
// named in the file as the comment says.
enum class DType : uint8_t {
  boolean,       // "BOOL", one byte per element
  u8,            // "U8"
  i8,            // "I8"
  u16,           // "U16"
  i16,           // "I16"
  u32,           // "U32"
  i32,           // "I32"
  u64,           // "U64"
  i64,           // "I64"
  f16,           // "F16"
  bf16,          // "BF16"
  f32,           // "F32"
  f64,           // "F64"
  c64,           // "C64", two F32 parts
  f8_e4m3,       // "F8_E4M3" (e4m3fn: no infinities)
  f8_e5m2,       // "F8_E5M2"
  f8_e4m3fnuz,   // "F8_E4M3FNUZ"
  f8_e5m2fnuz,   // "F8_E5M2FNUZ"
  f8_e8m0,       // "F8_E8M0" (e8m0fnu, the MX scale type)
  f6_e2m3,       // "F6_E2M3", 6 bits, packed
  f6_e3m2,       // "F6_E3M2", 6 bits, packed
  f4,            // "F4" (e2m1fn), 4 bits, two per byte
};

inline constexpr DType kAllDTypes[] = {
    DType::boolean,     DType::u8,          DType::i8,      DType::u16,
    DType::i16,         DType::u32,         DType::i32,     DType::u64,
    DType::i64,         DType::f16,         DType::bf16,    DType::f32,
    DType::f64,         DType::c64,         DType::f8_e4m3, DType::f8_e5m2,
    DType::f8_e4m3fnuz, DType::f8_e5m2fnuz, DType::f8_e8m0, DType::f6_e2m3,
    DType::f6_e3m2,     DType::f4,
};

// The safetensors name: "F32", "BF16", "F8_E4M3", ...
std::string_view to_string(DType dtype);

// The dtype of a safetensors name (exact, case-sensitive); nullopt if none.
std::optional<DType> parse_dtype(std::string_view name);

// "BOOL, U8, I8, ...": every name, for error messages.
std::string known_dtype_names();

// Bits per element: 4 for F4, 6 for F6_*, otherwise a multiple of 8.
uint32_t bit_width(DType dtype);

// The bytes of a tensor of this dtype and shape: the element count times the
// bit width, divided by 8. Fails (invalid_argument, with a message naming the
// shape and dtype and no prefix) when the product overflows 64 bits, when a
// packed dtype does not fill a whole number of bytes, or when a dimension is
// above 2^63-1 (DLPack and most frameworks hold dimensions as int64).
Result<uint64_t> byte_size(DType dtype, std::span<const uint64_t> shape);

// "[2, 3]", for messages: a shape longer than about 200 bytes of text is cut
// and says how many dimensions it has: "[1, 1, ... (1000000 dimensions)]".
std::string shape_to_string(std::span<const uint64_t> shape);

// DLPack codes beyond the 0.6 header that Debian ships (libdlpack-dev).
// kDLBool came with DLPack 0.8, the low-precision float codes with 1.1.
inline constexpr uint8_t kDLPackBoolCode = 6;
inline constexpr uint8_t kDLPackFloat8E4M3FnCode = 10;
inline constexpr uint8_t kDLPackFloat8E4M3FnuzCode = 11;
inline constexpr uint8_t kDLPackFloat8E5M2Code = 12;
inline constexpr uint8_t kDLPackFloat8E5M2FnuzCode = 13;
inline constexpr uint8_t kDLPackFloat8E8M0FnuCode = 14;
inline constexpr uint8_t kDLPackFloat6E2M3FnCode = 15;
inline constexpr uint8_t kDLPackFloat6E3M2FnCode = 16;
inline constexpr uint8_t kDLPackFloat4E2M1FnCode = 17;

// The DLPack type of one element (lanes = 1). Every dtype has its exact code:
// BOOL is kDLBool/8, BF16 kDLBfloat/16, C64 kDLComplex/64, and the F8, F6
// and F4 types their DLPack 1.1 float codes. None is reinterpreted as an
// unsigned integer: a consumer that predates a code rejects the tensor
// instead of reading its bits as numbers of another kind.
DLDataType to_dlpack(DType dtype);

}  // namespace devalloc
