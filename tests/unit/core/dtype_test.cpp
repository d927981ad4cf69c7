#include <devalloc/core/dtype.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace devalloc {
namespace {

using ::testing::HasSubstr;

std::string size_error(DType dtype, std::vector<uint64_t> shape) {
  Result<uint64_t> size = byte_size(dtype, shape);
  EXPECT_FALSE(size.ok()) << "sized " << size.value();
  return size.ok() ? std::string() : size.status().message();
}

TEST(DType, EverySafetensorsNameParsesBackToItsDType) {
  const std::vector<std::string> names = {
      "BOOL", "U8",  "I8",  "U16", "I16",     "U32",     "I32",         "U64",
      "I64",  "F16", "BF16", "F32", "F64",    "C64",     "F8_E4M3",     "F8_E5M2",
      "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"};
  ASSERT_EQ(std::size(kAllDTypes), names.size());
  std::set<DType> seen;
  for (const std::string& name : names) {
    const std::optional<DType> dtype = parse_dtype(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(to_string(*dtype), name);
    seen.insert(*dtype);
  }
  EXPECT_EQ(seen.size(), names.size());
}

TEST(DType, GivenWrongCaseOrUnknownName_WhenParsing_ThenNone) {
  EXPECT_FALSE(parse_dtype("f32").has_value());
  EXPECT_FALSE(parse_dtype("F33").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
  EXPECT_FALSE(parse_dtype("F32 ").has_value());
  EXPECT_FALSE(parse_dtype(std::string_view("F32\0", 4)).has_value());
  EXPECT_FALSE(parse_dtype(std::string_view("F3\0", 3)).has_value());
  EXPECT_FALSE(parse_dtype("BOOLEAN").has_value());
  // Every name with any one byte changed is no dtype, and cut short it is
  // none or the dtype of that name (F8_E4M3 of F8_E4M3FNUZ).
  for (DType dtype : kAllDTypes) {
    const std::string name(to_string(dtype));
    for (size_t i = 0; i < name.size(); ++i) {
      std::string changed = name;
      changed[i] = 'x';
      EXPECT_FALSE(parse_dtype(changed).has_value()) << changed;
      const std::string prefix = name.substr(0, i);
      const std::optional<DType> cut = parse_dtype(prefix);
      EXPECT_TRUE(!cut || to_string(*cut) == prefix) << prefix;
    }
  }
}

TEST(DType, KnownNamesListEveryDType) {
  const std::string names = known_dtype_names();
  for (DType dtype : kAllDTypes) EXPECT_THAT(names, HasSubstr(std::string(to_string(dtype))));
  EXPECT_THAT(names, ::testing::StartsWith("BOOL, U8, I8"));
}

TEST(DType, BitWidths) {
  EXPECT_EQ(bit_width(DType::boolean), 8u);
  EXPECT_EQ(bit_width(DType::u8), 8u);
  EXPECT_EQ(bit_width(DType::i16), 16u);
  EXPECT_EQ(bit_width(DType::bf16), 16u);
  EXPECT_EQ(bit_width(DType::f16), 16u);
  EXPECT_EQ(bit_width(DType::u32), 32u);
  EXPECT_EQ(bit_width(DType::f32), 32u);
  EXPECT_EQ(bit_width(DType::i64), 64u);
  EXPECT_EQ(bit_width(DType::f64), 64u);
  EXPECT_EQ(bit_width(DType::c64), 64u);
  EXPECT_EQ(bit_width(DType::f8_e4m3), 8u);
  EXPECT_EQ(bit_width(DType::f8_e8m0), 8u);
  EXPECT_EQ(bit_width(DType::f6_e2m3), 6u);
  EXPECT_EQ(bit_width(DType::f6_e3m2), 6u);
  EXPECT_EQ(bit_width(DType::f4), 4u);
}

void expect_dlpack(DType dtype, uint8_t code, uint8_t bits) {
  const DLDataType type = to_dlpack(dtype);
  EXPECT_EQ(type.code, code) << to_string(dtype);
  EXPECT_EQ(type.bits, bits) << to_string(dtype);
  EXPECT_EQ(type.lanes, 1) << to_string(dtype);
}

TEST(DType, DLPackCodesOfTheClassicTypesComeFromTheHeader) {
  expect_dlpack(DType::i8, kDLInt, 8);
  expect_dlpack(DType::i64, kDLInt, 64);
  expect_dlpack(DType::u8, kDLUInt, 8);
  expect_dlpack(DType::u16, kDLUInt, 16);
  expect_dlpack(DType::u64, kDLUInt, 64);
  expect_dlpack(DType::f16, kDLFloat, 16);
  expect_dlpack(DType::f32, kDLFloat, 32);
  expect_dlpack(DType::f64, kDLFloat, 64);
  expect_dlpack(DType::bf16, kDLBfloat, 16);
  expect_dlpack(DType::c64, kDLComplex, 64);
}

TEST(DType, BoolAndLowPrecisionFloatsGetTheirOwnCodesNotUnsignedInt) {
  // DLPack 0.8 / 1.1 numbering.
  expect_dlpack(DType::boolean, 6, 8);
  expect_dlpack(DType::f8_e4m3, 10, 8);
  expect_dlpack(DType::f8_e4m3fnuz, 11, 8);
  expect_dlpack(DType::f8_e5m2, 12, 8);
  expect_dlpack(DType::f8_e5m2fnuz, 13, 8);
  expect_dlpack(DType::f8_e8m0, 14, 8);
  expect_dlpack(DType::f6_e2m3, 15, 6);
  expect_dlpack(DType::f6_e3m2, 16, 6);
  expect_dlpack(DType::f4, 17, 4);
}

TEST(DType, DLPackBitsAgreeWithBitWidth) {
  for (DType dtype : kAllDTypes) EXPECT_EQ(to_dlpack(dtype).bits, bit_width(dtype));
}

TEST(DType, ByteSizeIsElementsTimesWidth) {
  EXPECT_EQ(byte_size(DType::f32, std::vector<uint64_t>{2, 3}).value(), 24u);
  EXPECT_EQ(byte_size(DType::bf16, std::vector<uint64_t>{5}).value(), 10u);
  EXPECT_EQ(byte_size(DType::c64, std::vector<uint64_t>{3}).value(), 24u);
  EXPECT_EQ(byte_size(DType::boolean, std::vector<uint64_t>{7}).value(), 7u);
}

TEST(DType, GivenScalarShape_ThenOneElement) {
  EXPECT_EQ(byte_size(DType::f64, std::vector<uint64_t>{}).value(), 8u);
}

TEST(DType, GivenZeroDimension_ThenEmptyEvenWithHugeOtherDimensions) {
  EXPECT_EQ(byte_size(DType::f32, std::vector<uint64_t>{1ull << 40, 0, 1ull << 40}).value(), 0u);
  // The product passes 64 bits before the zero: still empty, not an error.
  EXPECT_EQ(byte_size(DType::f32, std::vector<uint64_t>{1ull << 40, 1ull << 40, 0}).value(), 0u);
}

TEST(DType, PackedTypesCountBits) {
  EXPECT_EQ(byte_size(DType::f4, std::vector<uint64_t>{2, 4}).value(), 4u);
  EXPECT_EQ(byte_size(DType::f6_e2m3, std::vector<uint64_t>{4}).value(), 3u);
  EXPECT_EQ(byte_size(DType::f6_e3m2, std::vector<uint64_t>{8, 4}).value(), 24u);
}

TEST(DType, GivenPackedTypeWithPartialByte_ThenError) {
  const std::string message = size_error(DType::f4, {3});
  EXPECT_THAT(message, HasSubstr("shape [3] of F4"));
  EXPECT_THAT(message, HasSubstr("not a whole number of bytes"));
  EXPECT_THAT(size_error(DType::f6_e2m3, {2, 3}), HasSubstr("not a whole number of bytes"));
}

TEST(DType, GivenElementCountOverflow_ThenError) {
  const std::string message = size_error(DType::u8, {1ull << 32, 1ull << 32});
  EXPECT_THAT(message, HasSubstr("shape [4294967296, 4294967296] of U8"));
  EXPECT_THAT(message, HasSubstr("overflows 64 bits"));
}

TEST(DType, GivenByteCountOverflow_ThenError) {
  EXPECT_THAT(size_error(DType::f32, {1ull << 62}), HasSubstr("overflows 64 bits"));
}

TEST(DType, GivenSizeThatFitsInBytesButNotInBits_ThenExact) {
  // 2^59 doubles are 2^62 bytes, but 2^65 bits.
  EXPECT_EQ(byte_size(DType::f64, std::vector<uint64_t>{1ull << 59}).value(), 1ull << 62);
  // 2^63-2 F4 values are 2^62-1 bytes, but 2^65-8 bits.
  EXPECT_EQ(byte_size(DType::f4, std::vector<uint64_t>{(1ull << 63) - 2}).value(),
            (1ull << 62) - 1);
}

TEST(DType, GivenDimensionAboveInt64_ThenError) {
  const std::string message = size_error(DType::f32, {0, 1ull << 63});
  EXPECT_THAT(message, HasSubstr("dimension 9223372036854775808 is above 2^63-1"));
  // Named before the product's overflow, the first such dimension.
  EXPECT_THAT(size_error(DType::u8, {3, 1ull << 63, (1ull << 63) + 1}),
              HasSubstr("dimension 9223372036854775808 is above 2^63-1"));
}

TEST(DType, ShapeToString) {
  EXPECT_EQ(shape_to_string(std::vector<uint64_t>{}), "[]");
  EXPECT_EQ(shape_to_string(std::vector<uint64_t>{4}), "[4]");
  EXPECT_EQ(shape_to_string(std::vector<uint64_t>{2, 3, 0}), "[2, 3, 0]");
}

// Shapes come from files: a message shows the first 200 bytes or so of one
// and says how many dimensions it has, as quote() does for a long value.
TEST(DType, GivenAShapeOfManyDimensions_ThenShapeToStringIsCut) {
  const std::vector<uint64_t> many(100000, 12345);
  const std::string text = shape_to_string(many);
  EXPECT_LT(text.size(), 260u) << text;
  EXPECT_EQ(text.rfind("[12345, 12345, ", 0), 0u) << text;
  EXPECT_THAT(text, ::testing::EndsWith(", 12345, ... (100000 dimensions)]"));
  // Up to the limit a shape is shown whole.
  const std::vector<uint64_t> some(20, 12345);
  EXPECT_EQ(shape_to_string(some).find("..."), std::string::npos);
}

}  // namespace
}  // namespace devalloc
