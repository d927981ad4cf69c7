#include <devalloc/core/plan.hpp>

#include "core_test_support.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace devalloc {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using test::ScratchDir;
using nlohmann::json;

// A model file, and a valid plan for it: two methods sharing weights, a
// scratch tensor overlapping a constant (allowed), two buffers.
constexpr std::string_view kValidPlan = R"({
  "format": "devalloc-plan",
  "version": 1,
  "buffers": [
    {"memory_id": 0, "device": "cuda:0", "size": 4096, "alignment": 256},
    {"memory_id": 2, "device": "host", "size": 1024, "alignment": 64}
  ],
  "tensors": [
    {"name": "tok.weight", "dtype": "F32", "shape": [4, 4], "memory_id": 0, "offset": 0,
     "source": {"file": "model.safetensors", "key": "tok.weight"}},
    {"name": "blk.0.attn.weight", "dtype": "F16", "shape": [8, 8], "memory_id": 0, "offset": 256,
     "source": {"file": "model.safetensors", "key": "blk.0.attn.weight"}},
    {"name": "blk.0.norm", "dtype": "BF16", "shape": [8], "memory_id": 2, "offset": 0,
     "source": {"file": "model.safetensors", "key": "blk.0.norm"}},
    {"name": "scratch", "dtype": "F32", "shape": [16], "memory_id": 0, "offset": 0,
     "source": null}
  ],
  "methods": [
    {"name": "prefill", "memory_ids": [0, 2],
     "tensors": ["tok.weight", "blk.0.attn.weight", "blk.0.norm", "scratch"]},
    {"name": "decode", "memory_ids": [0], "tensors": ["tok.weight", "blk.0.attn.weight"]}
  ]
})";

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_model(dir_ / "model.safetensors");
    plan_ = json::parse(kValidPlan);
  }

  static void write_model(const fs::path& path) {
    static const std::vector<std::byte> bytes(128, std::byte{0x5a});
    const std::span<const std::byte> all(bytes);
    const std::vector<SafetensorsWriteTensor> tensors = {
        {"tok.weight", DType::f32, {4, 4}, all.first(64)},
        {"blk.0.attn.weight", DType::f16, {8, 8}, all},
        {"blk.0.norm", DType::bf16, {8}, all.first(16)}};
    ASSERT_TRUE(write_safetensors(path, tensors).ok());
  }

  fs::path plan_path() const { return dir_ / "plan.json"; }

  // Writes plan_ (or `text`) and reads it back.
  Result<Plan> read(const std::string& text) {
    test::write_file(plan_path(), text);
    return read_plan(plan_path());
  }
  Result<Plan> read() { return read(plan_.dump(2)); }

  // The message after "<plan path>: ".
  std::string without_file(const Status& status,
                           StatusCode code = StatusCode::invalid_argument) {
    EXPECT_FALSE(status.ok());
    EXPECT_EQ(status.code(), code);
    const std::string prefix = plan_path().string() + ": ";
    const std::string message = status.message();
    EXPECT_THAT(message, StartsWith(prefix));
    return message.substr(std::min(prefix.size(), message.size()));
  }
  std::string read_error(const std::string& text) { return without_file(read(text).status()); }
  std::string read_error() { return read_error(plan_.dump(2)); }

  // Reads plan_ (which must read) and validates it.
  Status validate(const PlanValidationOptions& options = {}) {
    Result<Plan> plan = read();
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    if (!plan.ok()) return plan.status();
    return validate_plan(*plan, options);
  }
  std::string validation_error(StatusCode code = StatusCode::invalid_argument) {
    return without_file(validate(), code);
  }

  ScratchDir dir_;
  json plan_;
};

// ---------------------------------------------------------------------------
// Reading.

TEST_F(PlanTest, GivenValidPlan_WhenRead_ThenEveryFieldIsThere) {
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->path, plan_path());
  EXPECT_FALSE(plan->allow_external_files);
  ASSERT_EQ(plan->buffers.size(), 2u);
  EXPECT_EQ(plan->buffers[1].memory_id, 2u);
  EXPECT_EQ(plan->buffers[1].device, "host");
  EXPECT_EQ(plan->buffers[1].size, 1024u);
  EXPECT_EQ(plan->buffers[1].alignment, 64u);
  ASSERT_EQ(plan->tensors.size(), 4u);
  const PlanTensor& attn = plan->tensors[1];
  EXPECT_EQ(attn.name, "blk.0.attn.weight");
  EXPECT_EQ(attn.dtype, DType::f16);
  EXPECT_THAT(attn.shape, ElementsAre(8, 8));
  EXPECT_EQ(attn.memory_id, 0u);
  EXPECT_EQ(attn.offset, 256u);
  ASSERT_TRUE(attn.source.has_value());
  EXPECT_EQ(attn.source->file, "model.safetensors");
  EXPECT_EQ(attn.source->key, "blk.0.attn.weight");
  EXPECT_FALSE(plan->tensors[3].is_constant());
  ASSERT_EQ(plan->methods.size(), 2u);
  EXPECT_EQ(plan->methods[1].name, "decode");
  EXPECT_THAT(plan->methods[1].memory_ids, ElementsAre(0));
  EXPECT_THAT(plan->methods[1].tensors, ElementsAre("tok.weight", "blk.0.attn.weight"));
}

TEST_F(PlanTest, GivenOptionalFieldsLeftOut_ThenDefaults) {
  plan_["buffers"][0].erase("alignment");
  plan_["tensors"][3].erase("source");
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->buffers[0].alignment, 1u);
  EXPECT_FALSE(plan->tensors[3].source.has_value());
}

TEST_F(PlanTest, GivenMissingFile_ThenCannotOpen) {
  EXPECT_EQ(without_file(read_plan(plan_path()).status(), StatusCode::not_found),
            "cannot open: No such file or directory");
}

TEST_F(PlanTest, GivenInvalidJson_ThenLineAndColumn) {
  const std::string message = read_error("{\n  \"format\": \"devalloc-plan\",\n  \"version\": 1,,\n}");
  EXPECT_EQ(message,
            "invalid JSON at line 3, column 16: expected a key in double quotes, found ','");
}

TEST_F(PlanTest, GivenOtherJson_ThenNotAPlan) {
  EXPECT_EQ(read_error(R"({"buffers": []})"),
            "/format: expected \"devalloc-plan\", got nothing: not a devalloc plan");
  EXPECT_EQ(read_error(R"({"format": "onnx"})"),
            "/format: expected \"devalloc-plan\", got string \"onnx\": not a devalloc plan");
  EXPECT_EQ(read_error("[1]"), "expected a JSON object, got array [1]");
}

TEST_F(PlanTest, GivenNewerVersion_ThenRejectedWithBothVersions) {
  plan_["version"] = kPlanVersion + 1;
  plan_["something_new"] = true;  // a newer plan may have fields this one lacks
  EXPECT_EQ(read_error(), "/version: version 3 is newer than this devalloc reads (2)");
}

TEST_F(PlanTest, GivenVersionZeroOrMissing_ThenRejected) {
  plan_["version"] = 0;
  EXPECT_EQ(read_error(), "/version: versions start at 1");
  plan_.erase("version");
  EXPECT_EQ(read_error(), "missing \"version\"");
}

TEST_F(PlanTest, GivenUnknownKey_ThenRejectedWithItsPointer) {
  plan_["tensors"][2]["ofset"] = 4;
  EXPECT_EQ(read_error(),
            "/tensors/2/ofset: unknown key (expected one of: name, dtype, shape, memory_id, "
            "offset, source)");
  plan_["tensors"][2].erase("ofset");
  plan_["allow_external"] = true;
  EXPECT_THAT(read_error(), StartsWith("/allow_external: unknown key"));
}

TEST_F(PlanTest, GivenMissingField_ThenRejected) {
  plan_["tensors"][1].erase("offset");
  EXPECT_EQ(read_error(), "/tensors/1: missing \"offset\"");
}

TEST_F(PlanTest, GivenWrongTypes_ThenRejectedWithPointerAndValue) {
  plan_["tensors"][3]["offset"] = "12";
  EXPECT_EQ(read_error(), "/tensors/3/offset: expected a non-negative integer, got string \"12\"");
  plan_["tensors"][3]["offset"] = 12;
  plan_["tensors"][0]["shape"][1] = -4;
  EXPECT_EQ(read_error(), "/tensors/0/shape/1: expected a non-negative integer, got number -4");
  plan_["tensors"][0]["shape"] = "4x4";
  EXPECT_EQ(read_error(), "/tensors/0/shape: expected an array, got string \"4x4\"");
  plan_["tensors"][0]["shape"] = {4, 4};
  plan_["methods"][0]["tensors"][1] = 7;
  EXPECT_EQ(read_error(), "/methods/0/tensors/1: expected a string, got number 7");
  plan_["methods"][0]["tensors"][1] = "blk.0.attn.weight";
  plan_["allow_external_files"] = "yes";
  EXPECT_EQ(read_error(), "/allow_external_files: expected true or false, got string \"yes\"");
}

TEST_F(PlanTest, GivenMemoryIdAbove32Bits_ThenRejected) {
  plan_["buffers"][0]["memory_id"] = 4294967296ull;
  EXPECT_EQ(read_error(), "/buffers/0/memory_id: 4294967296 is above 4294967295");
}

TEST_F(PlanTest, GivenUnknownDType_ThenRejected) {
  plan_["tensors"][0]["dtype"] = "FP32";
  EXPECT_THAT(read_error(), StartsWith("/tensors/0/dtype: unknown dtype \"FP32\" (known: BOOL, "));
}

TEST_F(PlanTest, GivenMalformedSource_ThenRejected) {
  plan_["tensors"][0]["source"] = "model.safetensors";
  EXPECT_EQ(read_error(), "/tensors/0/source: expected {\"file\": ..., \"key\": ...} or null, "
                          "got string \"model.safetensors\"");
  plan_["tensors"][0]["source"] = {{"file", "model.safetensors"}};
  EXPECT_EQ(read_error(), "/tensors/0/source: missing \"key\"");
}

TEST_F(PlanTest, GivenDuplicateKey_ThenRejected) {
  EXPECT_EQ(read_error(R"({"format": "devalloc-plan", "version": 1, "buffers": [],)"
                       R"( "tensors": [{"name": "a", "offset": 0, "offset": 8}], "methods": []})"),
            "/tensors/0: duplicate key \"offset\" at line 1, column 97");
}

// ---------------------------------------------------------------------------
// Hostile plans (issue 9).

TEST_F(PlanTest, GivenDeepNesting_ThenRefusedWhereItStarts) {
  EXPECT_EQ(read_error(R"({"format": "devalloc-plan", "version": 1, "buffers": [],)"
                       R"( "tensors": [{"shape": [[1]]}], "methods": []})"),
            "invalid JSON at line 1, column 81: nesting deeper than 4 levels");
  EXPECT_EQ(read_error(std::string(100000, '[') + std::string(100000, ']')),
            "invalid JSON at line 1, column 5: nesting deeper than 4 levels");
}

// A number is shown as written: no float conversion that could overflow or
// round it.
TEST_F(PlanTest, GivenNumberOutOfDoubleRange_ThenRefusedAsWritten) {
  EXPECT_EQ(read_error("{\"format\": \"devalloc-plan\",\n \"version\": 1e400}"),
            "/version: expected a non-negative integer, got number 1e400");
}

TEST_F(PlanTest, GivenNulInASourceFile_ThenRefusedNotCutShort) {
  plan_["tensors"][0]["source"]["file"] = std::string("model.safetensors\0/../../etc/passwd", 35);
  const std::string message = read_error();
  EXPECT_THAT(message, ::testing::EndsWith(": \\u0000 (NUL) inside a string")) << message;
}

TEST_F(PlanTest, GivenFifo_ThenRefusedAtOnce) {
  ASSERT_EQ(::mkfifo(plan_path().c_str(), 0600), 0);
  ::alarm(30);  // a hang fails instead of stalling the suite
  const Status status = read_plan(plan_path()).status();
  ::alarm(0);
  EXPECT_EQ(without_file(status), "not a regular file (a FIFO)");
}

TEST_F(PlanTest, GivenFileAboveTheSizeLimit_ThenRefusedUnread) {
  test::write_file(plan_path(), "");
  fs::resize_file(plan_path(), kMaxPlanBytes + 1);  // sparse
  EXPECT_EQ(without_file(read_plan(plan_path()).status()),
            "the plan is 268435457 bytes, above the limit of 268435456 bytes");
}

TEST_F(PlanTest, GivenUnknownKeyWithControlCharacters_ThenThePointerIsEscaped) {
  EXPECT_EQ(read_error(R"({"format": "devalloc-plan", "version": 1, "buffers": [],)"
                       R"( "tensors": [], "methods": [], "x\u001b[31m": 1})"),
            "/x\\x1b[31m: unknown key (expected one of: format, version, "
            "allow_external_files, world_size, files, buffers, tensors, methods)");
}

// ---------------------------------------------------------------------------
// Limits: names and paths past the format's limits are bad input, refused by
// read_plan before anything resolves or looks them up, and repeated only in
// part. A 10 MB device tag was a valid tag: its load failed with a 40 MB
// message; a 10 MB source path took 517 MB to resolve.

TEST_F(PlanTest, GivenDeviceTagOf1MiB_WhenRead_ThenRefusedWithAShortMessage) {
  plan_["buffers"][0]["device"] = std::string(1 << 20, 'a');
  const std::string error = read_error();
  EXPECT_THAT(error, StartsWith("/buffers/0: device \"aaaa"));
  EXPECT_THAT(error, HasSubstr("...\" (1048576 bytes) is longer than a device tag may be "
                               "(256 bytes)"));
  EXPECT_LT(error.size(), 400u);
}

TEST_F(PlanTest, GivenDeviceTagOf256Bytes_ThenValidAnd257Refused) {
  plan_["buffers"][0]["device"] = std::string(256, 'a');
  EXPECT_TRUE(validate().ok());
  plan_["buffers"][0]["device"] = std::string(254, 'a') + ":1";
  EXPECT_TRUE(validate().ok());
  plan_["buffers"][0]["device"] = std::string(257, 'a');
  EXPECT_THAT(read_error(), HasSubstr("(257 bytes) is longer than a device tag may be"));
}

TEST_F(PlanTest, GivenSourcePathPastPathMax_WhenRead_ThenRefusedNamingTheTensorNotThePath) {
  std::string path;
  while (path.size() < 4096) path += "./";
  plan_["tensors"][0]["source"]["file"] = path + "model.safetensors";
  const std::string error = read_error();
  EXPECT_THAT(error, StartsWith("/tensors/0 \"tok.weight\": source file \"././"));
  EXPECT_THAT(error, HasSubstr("...\" (4113 bytes) is longer than a path may be (4095 bytes)"));
  EXPECT_LT(error.size(), 400u);
}

TEST_F(PlanTest, GivenSourcePathOf10MiB_WhenRead_ThenRefusedBeforeItIsResolved) {
  std::string path;
  path.reserve(10 << 20);
  while (path.size() < (10u << 20)) path += "./";
  plan_["tensors"][0]["source"]["file"] = path;
  EXPECT_THAT(read_error(), HasSubstr("(10485760 bytes) is longer than a path may be"));
}

// A "files" entry is a path too: refused where it is, in the table, before
// any row copies it.
TEST_F(PlanTest, GivenAFilesEntryPastPathMax_WhenRead_ThenRefusedInTheTable) {
  std::string path;
  while (path.size() < 4096) path += "./";
  json plan = json::parse(R"({"format":"devalloc-plan","version":2,"buffers":[],"tensors":[],)"
                          R"("methods":[]})");
  plan["files"] = {"model.safetensors", path + "model.safetensors"};
  const std::string error = read_error(plan.dump());
  EXPECT_THAT(error, StartsWith("/files/1: source file \"././"));
  EXPECT_THAT(error, HasSubstr("...\" (4113 bytes) is longer than a path may be (4095 bytes)"));
  EXPECT_LT(error.size(), 400u);
}

// Rows share their file's path; the copies they take are bounded as a
// version 1 plan's text bounds its paths: 256 MiB in all. Here 1 MiB of
// text asks for 272 MiB of copies, refused at the row that passes the
// limit, before the rest is copied.
TEST_F(PlanTest, GivenRowsCopyingMoreThanAPlanOfPaths_WhenRead_ThenRefusedAtTheRowThatPassesIt) {
  const std::string path(kMaxPlanPathBytes, 'p');
  const size_t rows = kMaxPlanBytes / path.size() + 1;
  std::string text = R"({"format":"devalloc-plan","version":2,"files":[")" + path +
                     R"("],"buffers":[],"methods":[],"tensors":[)";
  for (size_t i = 0; i < rows; ++i) {
    text += (i == 0 ? R"([")" : R"(,[")") + std::to_string(i) + R"(","U8",[],0,0,0])";
  }
  text += "]}";
  const std::string error = read_error(text);
  EXPECT_EQ(error, "/tensors/" + std::to_string(rows - 1) + "/5: the sources name " +
                       std::to_string(rows * path.size()) +
                       " bytes of paths so far, more than a plan may hold (268435456 bytes)");
}

TEST_F(PlanTest, GivenNamesPastTheLimit_WhenRead_ThenEachIsRefusedWhereItIs) {
  const std::string long_name(kMaxPlanNameBytes + 1, 'n');
  {
    json plan = plan_;
    plan["tensors"][3]["name"] = long_name;
    EXPECT_THAT(read_error(plan.dump()),
                StartsWith("/tensors/3: name \"nnn"));
  }
  {
    json plan = plan_;
    plan["tensors"][0]["source"]["key"] = long_name;
    EXPECT_THAT(read_error(plan.dump()),
                StartsWith("/tensors/0 \"tok.weight\": source key \"nnn"));
  }
  {
    json plan = plan_;
    plan["methods"][1]["name"] = long_name;
    EXPECT_THAT(read_error(plan.dump()), StartsWith("/methods/1: name \"nnn"));
  }
  {
    json plan = plan_;
    plan["methods"][1]["tensors"][1] = long_name;
    EXPECT_THAT(read_error(plan.dump()),
                StartsWith("/methods/1/tensors/1: tensor \"nnn"));
  }
  // At the limit, a name is only a name the plan does not have.
  plan_["methods"][1]["tensors"][1] = std::string(kMaxPlanNameBytes, 'n');
  EXPECT_THAT(validation_error(), HasSubstr("which is not in the plan"));
}

TEST(PlanLimits, GivenPlanBuiltInCodeWithLongTag_WhenValidated_ThenRefusedFirst) {
  Plan plan;
  plan.buffers = {{0, std::string(1 << 20, 'a'), 16, 1, std::nullopt}};
  plan.tensors = {{"w", DType::u8, {4}, 7, 0, std::nullopt}};  // memory id 7: no buffer
  const Status status = validate_plan(plan);
  EXPECT_EQ(status.message(),
            "plan (no file): /buffers/0: device \"" + std::string(200, 'a') +
                "...\" (1048576 bytes) is longer than a device tag may be (256 bytes)");
}

TEST_F(PlanTest, GivenEmptyPath_WhenRead_ThenSaysItNamesNoFile) {
  const Result<Plan> plan = read_plan("");
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(), "the plan path is empty: it names no file");
}

// ---------------------------------------------------------------------------
// Validation: buffers.

TEST_F(PlanTest, GivenValidPlan_WhenValidated_ThenOk) {
  const Status status = validate();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(PlanTest, GivenDuplicateMemoryId_ThenRejected) {
  plan_["buffers"][1]["memory_id"] = 0;
  EXPECT_EQ(validation_error(), "/buffers/1: memory id 0 is also used by /buffers/0");
}

TEST_F(PlanTest, GivenAlignmentNotPowerOfTwo_ThenRejected) {
  plan_["buffers"][1]["alignment"] = 48;
  EXPECT_EQ(validation_error(), "/buffers/1: alignment 48 of memory id 2 is not a power of two");
  plan_["buffers"][1]["alignment"] = 0;
  EXPECT_EQ(validation_error(), "/buffers/1: alignment 0 of memory id 2 is not a power of two");
}

TEST_F(PlanTest, GivenDeviceTagThatDoesNotParse_ThenRejected) {
  for (const char* tag : {"cuda:x", "cuda:", "cu da:0", "", "cuda:01"}) {
    plan_["buffers"][0]["device"] = tag;
    EXPECT_EQ(validation_error(),
              "/buffers/0: device \"" + std::string(tag) +
                  "\" of memory id 0 is not a device tag (\"name\" or \"name:index\", "
                  "e.g. \"cuda:0\" or \"host\")");
  }
}

TEST_F(PlanTest, GivenEveryDeviceTagForm_ThenAccepted) {
  for (const char* tag : {"cuda:0", "hip:1", "level_zero:0", "host", "cuda"}) {
    plan_["buffers"][0]["device"] = tag;
    const Status status = validate();
    EXPECT_TRUE(status.ok()) << tag << ": " << status.message();
  }
}

// ---------------------------------------------------------------------------
// Validation: tensors.

TEST_F(PlanTest, GivenDuplicateTensorName_ThenRejected) {
  plan_["tensors"][3]["name"] = "tok.weight";
  EXPECT_EQ(validation_error(), "/tensors/3 \"tok.weight\": name also used by /tensors/0");
}

TEST_F(PlanTest, GivenUnknownMemoryId_ThenRejectedListingKnownOnes) {
  plan_["tensors"][2]["memory_id"] = 7;
  EXPECT_EQ(validation_error(),
            "/tensors/2 \"blk.0.norm\": memory id 7 has no buffer (memory ids: 0, 2)");
}

// The known ids were listed whole: a plan of a million buffers gave a
// message of megabytes. At most 16 are shown, then the count.
TEST_F(PlanTest, GivenUnknownMemoryIdAmongManyBuffers_ThenTheListIsCutAndSaysTheCount) {
  for (int id = 3; id < 100000; ++id) {
    plan_["buffers"].push_back({{"memory_id", id}, {"device", "host"}, {"size", 0}});
  }
  plan_["tensors"][2]["memory_id"] = 100000;
  const std::string message = validation_error();
  EXPECT_EQ(message,
            "/tensors/2 \"blk.0.norm\": memory id 100000 has no buffer (memory ids: 0, 2, 3, 4, "
            "5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, ... (99999 in all))");
}

TEST_F(PlanTest, GivenTensorEndingPastItsBuffer_ThenRejected) {
  plan_["tensors"][1]["offset"] = 4224;
  EXPECT_EQ(validation_error(),
            "/tensors/1 \"blk.0.attn.weight\": ends at byte 4352 of buffer 0, which has 4096 "
            "bytes");
}

TEST_F(PlanTest, GivenTensorEndingOneBytePastItsBuffer_ThenRejected) {
  plan_["tensors"][1]["offset"] = 4096 - 127;
  EXPECT_EQ(validation_error(),
            "/tensors/1 \"blk.0.attn.weight\": ends at byte 4097 of buffer 0, which has 4096 "
            "bytes");
}

TEST_F(PlanTest, GivenTensorEndingExactlyAtItsBuffer_ThenOk) {
  plan_["tensors"][1]["offset"] = 4096 - 128;
  const Status status = validate();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(PlanTest, GivenOffsetThatWrapsAround_ThenOverflowNotAFalsePass) {
  plan_["tensors"][1]["offset"] = 18446744073709551600ull;
  EXPECT_EQ(validation_error(),
            "/tensors/1 \"blk.0.attn.weight\": offset 18446744073709551600 + 128 bytes "
            "overflows 64 bits");
}

TEST_F(PlanTest, GivenShapeThatIsNoWholeNumberOfBytes_ThenRejected) {
  plan_["tensors"][3]["dtype"] = "F4";
  plan_["tensors"][3]["shape"] = {3};
  EXPECT_EQ(validation_error(),
            "/tensors/3 \"scratch\": shape [3] of F4 is 3 x 4 bits, not a whole number of bytes");
}

TEST_F(PlanTest, GivenTwoConstantsOverlapping_ThenRejectedNamingBoth) {
  plan_["tensors"][1]["offset"] = 32;
  EXPECT_EQ(validation_error(),
            "/tensors/1 \"blk.0.attn.weight\": bytes [32, 160) of buffer 0 overlap /tensors/0 "
            "\"tok.weight\" at [0, 64)");
}

TEST_F(PlanTest, GivenConstantInsideAnother_ThenRejected) {
  plan_["tensors"][2]["memory_id"] = 0;
  plan_["tensors"][2]["offset"] = 300;  // [300, 316) inside [256, 384)
  EXPECT_EQ(validation_error(),
            "/tensors/2 \"blk.0.norm\": bytes [300, 316) of buffer 0 overlap /tensors/1 "
            "\"blk.0.attn.weight\" at [256, 384)");
}

TEST_F(PlanTest, GivenConstantsTouchingOrInDifferentBuffers_ThenNoOverlap) {
  plan_["tensors"][1]["offset"] = 64;  // right after tok.weight [0, 64)
  const Status status = validate();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(PlanTest, GivenScratchOverlappingConstants_ThenAllowed) {
  plan_["tensors"][3]["shape"] = {1024};  // covers the whole buffer
  const Status status = validate();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(PlanTest, GivenEmptyConstantInsideAnother_ThenNoOverlap) {
  plan_["tensors"][2]["memory_id"] = 0;
  plan_["tensors"][2]["offset"] = 16;
  plan_["tensors"][2]["shape"] = {0};
  plan_["tensors"][2]["source"] = nullptr;
  const Status status = validate();
  EXPECT_TRUE(status.ok()) << status.message();
}

// ---------------------------------------------------------------------------
// Validation: methods.

TEST_F(PlanTest, GivenDuplicateMethodName_ThenRejected) {
  plan_["methods"][1]["name"] = "prefill";
  EXPECT_EQ(validation_error(), "/methods/1 \"prefill\": name also used by /methods/0");
}

TEST_F(PlanTest, GivenMethodWithUnknownMemoryId_ThenRejected) {
  plan_["methods"][1]["memory_ids"] = {0, 5};
  EXPECT_EQ(validation_error(),
            "/methods/1/memory_ids/1: method \"decode\" uses memory id 5, which has no buffer "
            "(memory ids: 0, 2)");
}

TEST_F(PlanTest, GivenMethodListingMemoryIdTwice_ThenRejected) {
  plan_["methods"][1]["memory_ids"] = {0, 0};
  EXPECT_EQ(validation_error(), "/methods/1/memory_ids/1: method \"decode\" lists memory id 0 twice");
}

TEST_F(PlanTest, GivenMethodWithUnknownTensor_ThenRejected) {
  plan_["methods"][1]["tensors"][1] = "blk.0.attn.weights";
  EXPECT_EQ(validation_error(),
            "/methods/1/tensors/1: method \"decode\" lists tensor \"blk.0.attn.weights\", which "
            "is not in the plan");
}

// Tensors in ascending name order (as write_plan writes them) are known
// unique without an index; methods that list them out of order, twice, or
// a name the plan lacks are still found out, with the same words.
TEST_F(PlanTest, GivenTensorsInNameOrder_WhenMethodsListThemInAnyOrder_ThenCheckedAlike) {
  json sorted = json::array();
  for (const char* name : {"blk.0.attn.weight", "blk.0.norm", "scratch", "tok.weight"}) {
    for (const json& tensor : plan_["tensors"]) {
      if (tensor["name"] == name) sorted.push_back(tensor);
    }
  }
  plan_["tensors"] = sorted;
  plan_["methods"][0]["tensors"] = {"tok.weight", "scratch", "blk.0.norm", "blk.0.attn.weight"};
  EXPECT_TRUE(validate().ok()) << validate().message();

  plan_["methods"][1]["tensors"] = {"tok.weight", "blk.0.attn.weights"};
  EXPECT_EQ(validation_error(),
            "/methods/1/tensors/1: method \"decode\" lists tensor \"blk.0.attn.weights\", "
            "which is not in the plan");
  plan_["methods"][1]["tensors"] = {"blk.0.attn.weight", "tok.weight", "blk.0.attn.weight"};
  EXPECT_EQ(validation_error(),
            "/methods/1/tensors/2: method \"decode\" lists tensor \"blk.0.attn.weight\" twice");
  plan_["methods"][1]["tensors"] = {"blk.0.norm"};
  EXPECT_EQ(validation_error(),
            "/methods/1/tensors/0: method \"decode\" uses tensor \"blk.0.norm\" in memory id 2, "
            "which is not in its memory_ids");
  plan_["tensors"][1]["name"] = "blk.0.attn.weight";  // equal neighbours: not ascending
  EXPECT_EQ(validation_error(),
            "/tensors/1 \"blk.0.attn.weight\": name also used by /tensors/0");
}

TEST_F(PlanTest, GivenMethodListingTensorTwice_ThenRejected) {
  plan_["methods"][1]["tensors"][1] = "tok.weight";
  EXPECT_EQ(validation_error(),
            "/methods/1/tensors/1: method \"decode\" lists tensor \"tok.weight\" twice");
}

TEST_F(PlanTest, GivenMethodTensorOutsideItsMemoryIds_ThenRejected) {
  plan_["methods"][1]["tensors"].push_back("blk.0.norm");
  EXPECT_EQ(validation_error(),
            "/methods/1/tensors/2: method \"decode\" uses tensor \"blk.0.norm\" in memory id 2, "
            "which is not in its memory_ids");
}

// ---------------------------------------------------------------------------
// Validation: sources.

TEST_F(PlanTest, GivenDTypeDifferentFromTheSource_ThenRejected) {
  plan_["tensors"][2]["dtype"] = "F16";
  EXPECT_EQ(validation_error(),
            "/tensors/2 \"blk.0.norm\": dtype F16 differs from BF16 of \"blk.0.norm\" in "
            "\"model.safetensors\"");
}

TEST_F(PlanTest, GivenShapeDifferentFromTheSource_ThenRejected) {
  plan_["tensors"][1]["shape"] = {64};
  EXPECT_EQ(validation_error(),
            "/tensors/1 \"blk.0.attn.weight\": shape [64] differs from [8, 8] of "
            "\"blk.0.attn.weight\" in \"model.safetensors\"");
}

TEST_F(PlanTest, GivenMissingSourceFile_ThenRejectedWithTheResolvedPath) {
  plan_["tensors"][0]["source"]["file"] = "weights/missing.safetensors";
  const fs::path resolved = fs::weakly_canonical(dir_.path()) / "weights/missing.safetensors";
  EXPECT_EQ(validation_error(StatusCode::not_found),
            "/tensors/0 \"tok.weight\": source file: " + resolved.string() +
                ": cannot open: No such file or directory");
}

TEST_F(PlanTest, GivenSourceFileThatIsNotSafetensors_ThenItsErrorIsPassedOn) {
  test::write_file(dir_ / "bad.safetensors", "abc");
  plan_["tensors"][0]["source"]["file"] = "bad.safetensors";
  EXPECT_THAT(validation_error(),
              HasSubstr("/tensors/0 \"tok.weight\": source file: "));
  EXPECT_THAT(validation_error(), HasSubstr("bad.safetensors: file has 3 bytes"));
}

TEST_F(PlanTest, GivenMissingKey_ThenRejected) {
  plan_["tensors"][0]["source"]["key"] = "tok.weights";
  EXPECT_EQ(validation_error(),
            "/tensors/0 \"tok.weight\": source key \"tok.weights\" is not in \"model.safetensors\"");
}

TEST_F(PlanTest, GivenSourceEscapingThePlanFolder_ThenRejectedUnlessAllowed) {
  // The plan in dir/plans, the data in dir.
  plan_["tensors"][0]["source"]["file"] = "sub/../../model.safetensors";
  const fs::path nested = dir_ / "plans" / "plan.json";
  test::write_file(nested, plan_.dump());
  Result<Plan> plan = read_plan(nested);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const fs::path canonical = fs::weakly_canonical(dir_.path());
  EXPECT_EQ(validate_plan(*plan).message(),
            nested.string() + ": /tensors/0 \"tok.weight\": source file "
                              "\"sub/../../model.safetensors\" resolves to " +
                (canonical / "model.safetensors").string() + ", outside the plan's folder " +
                (canonical / "plans").string() +
                " (set \"allow_external_files\": true to allow this)");

  for (json& tensor : plan_["tensors"]) {
    if (!tensor["source"].is_null()) tensor["source"]["file"] = "../model.safetensors";
  }
  plan_["allow_external_files"] = true;
  test::write_file(nested, plan_.dump());
  plan = read_plan(nested);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const Status status = validate_plan(*plan);
  EXPECT_TRUE(status.ok()) << status.message();
}

// The resolved file and the plan's folder are paths in the middle of the
// message: escaped like every path, so a folder named with terminal escapes
// cannot drive the terminal that shows the error.
TEST_F(PlanTest, GivenAPlanFolderNamedWithEscapes_WhenASourceEscapesIt_ThenTheMessageShowsThemEscaped) {
  plan_["tensors"][0]["source"]["file"] = "../model.safetensors";
  const fs::path nested = dir_ / "p\x1b[2J" / "plan.json";
  test::write_file(nested, plan_.dump());
  Result<Plan> plan = read_plan(nested);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const std::string message = validate_plan(*plan).message();
  EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
  const fs::path canonical = fs::weakly_canonical(dir_.path());
  EXPECT_THAT(message, HasSubstr("resolves to " + (canonical / "model.safetensors").string() +
                                 ", outside the plan's folder " +
                                 (canonical / "p\\x1b[2J").string() + " (set"));
}

TEST_F(PlanTest, GivenAbsoluteSource_ThenRejectedUnlessAllowed) {
  const std::string absolute = (dir_ / "model.safetensors").string();
  for (json& tensor : plan_["tensors"]) {
    if (!tensor["source"].is_null()) tensor["source"]["file"] = absolute;
  }
  EXPECT_EQ(validation_error(),
            "/tensors/0 \"tok.weight\": source file \"" + absolute +
                "\" is absolute; source files are relative to the plan's folder unless "
                "\"allow_external_files\" is true");
  plan_["allow_external_files"] = true;
  const Status status = validate();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(PlanTest, GivenSymlinkInsideThePlanFolderPointingOutside_ThenRejected) {
  ScratchDir elsewhere;
  write_model(elsewhere / "model.safetensors");
  fs::create_directory_symlink(elsewhere.path(), dir_ / "link");
  plan_["tensors"][0]["source"]["file"] = "link/model.safetensors";
  EXPECT_THAT(validation_error(),
              HasSubstr("resolves to " +
                        (fs::weakly_canonical(elsewhere.path()) / "model.safetensors").string() +
                        ", outside the plan's folder"));
}

TEST_F(PlanTest, GivenDotDotThatStaysInside_ThenAccepted) {
  fs::create_directory(dir_ / "sub");
  plan_["tensors"][0]["source"]["file"] = "sub/../model.safetensors";
  const Status status = validate();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(PlanTest, GivenCheckSourcesOff_ThenMissingFilesAreNotOpened) {
  plan_["tensors"][0]["source"]["file"] = "missing.safetensors";
  PlanValidationOptions options;
  options.check_sources = false;
  const Status status = validate(options);
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(PlanTest, GivenCache_ThenValidationUsesFilesAlreadyOpened) {
  SafetensorsCache cache;
  auto opened = cache.open(fs::weakly_canonical(dir_ / "model.safetensors"));
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  fs::remove(dir_ / "model.safetensors");

  PlanValidationOptions options;
  options.cache = &cache;
  const Status with_cache = validate(options);
  EXPECT_TRUE(with_cache.ok()) << with_cache.message();
  EXPECT_THAT(without_file(validate(), StatusCode::not_found), HasSubstr("cannot open"));
}

// ---------------------------------------------------------------------------
// Paths, selections, writing.

TEST_F(PlanTest, SourcePathIsCanonicalAndAbsolute) {
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  Result<fs::path> path = plan->source_path(*plan->tensors[0].source);
  ASSERT_TRUE(path.ok()) << path.status().message();
  EXPECT_EQ(*path, fs::weakly_canonical(dir_ / "model.safetensors"));
  EXPECT_TRUE(path->is_absolute());
}

TEST_F(PlanTest, GivenPlanPathWithoutFolder_ThenDirectoryIsCurrent) {
  Plan plan;
  plan.path = "plan.json";
  EXPECT_EQ(plan.directory(), fs::path("."));
}

TEST_F(PlanTest, GivenOneMethod_ThenItsBuffersAndTensors) {
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  Result<PlanSelection> decode = plan->tensors_for_methods(std::vector<std::string>{"decode"});
  ASSERT_TRUE(decode.ok()) << decode.status().message();
  EXPECT_THAT(decode->memory_ids, ElementsAre(0));
  EXPECT_THAT(decode->tensors, ElementsAre(0, 1));
  EXPECT_THAT(decode->constants, ElementsAre(0, 1));
}

TEST_F(PlanTest, GivenMethodsSharingWeights_ThenEachBufferAndTensorOnce) {
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  Result<PlanSelection> both =
      plan->tensors_for_methods(std::vector<std::string>{"decode", "prefill", "decode"});
  ASSERT_TRUE(both.ok()) << both.status().message();
  EXPECT_THAT(both->memory_ids, ElementsAre(0, 2));
  EXPECT_THAT(both->tensors, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(both->constants, ElementsAre(0, 1, 2));  // scratch needs no copy
}

TEST_F(PlanTest, GivenUnknownMethod_ThenErrorListsTheKnownOnes) {
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(without_file(plan->tensors_for_methods(std::vector<std::string>{"decod"}).status()),
            "no method \"decod\" (methods: \"prefill\", \"decode\")");
}

TEST_F(PlanTest, GivenUnknownMethodAmongManyMethods_ThenTheListIsCutAndSaysTheCount) {
  for (int i = 0; i < 100000; ++i) {
    plan_["methods"].push_back(
        {{"name", "m" + std::to_string(i)}, {"memory_ids", json::array()}, {"tensors", json::array()}});
  }
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const std::string message =
      without_file(plan->tensors_for_methods(std::vector<std::string>{"decod"}).status());
  EXPECT_LT(message.size(), 400u) << message.substr(0, 400);
  EXPECT_THAT(message, StartsWith("no method \"decod\" (methods: \"prefill\", \"decode\", \"m0\", "));
  EXPECT_THAT(message, ::testing::EndsWith(", \"m13\", ... (100002 in all))"));
}

// A plan built in code may have no file: its messages say so rather than
// starting with ": ".
TEST_F(PlanTest, GivenAPlanWithoutAPath_WhenInvalid_ThenTheMessageSaysItHasNoFile) {
  Plan plan;
  plan.buffers = {{0, "host", 64, 64, std::nullopt}};
  plan.tensors = {PlanTensor{"w", DType::u8, {128}, 0, 0, std::nullopt}};
  plan.methods = {{"main", {0}, {"w"}}};
  Status s = validate_plan(plan);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("plan (no file): /tensors/0 \"w\": ", 0), 0u) << s.message();
}

// Every field of two plans is the same (not their paths).
void expect_same_plan(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.allow_external_files, b.allow_external_files);
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    EXPECT_EQ(a.buffers[i].memory_id, b.buffers[i].memory_id);
    EXPECT_EQ(a.buffers[i].device, b.buffers[i].device);
    EXPECT_EQ(a.buffers[i].size, b.buffers[i].size);
    EXPECT_EQ(a.buffers[i].alignment, b.buffers[i].alignment);
  }
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_EQ(a.tensors[i].memory_id, b.tensors[i].memory_id);
    EXPECT_EQ(a.tensors[i].offset, b.tensors[i].offset);
    ASSERT_EQ(a.tensors[i].source.has_value(), b.tensors[i].source.has_value());
    if (a.tensors[i].source) {
      EXPECT_EQ(a.tensors[i].source->file, b.tensors[i].source->file);
      EXPECT_EQ(a.tensors[i].source->key, b.tensors[i].source->key);
      const std::optional<PlanSlice>& x = a.tensors[i].source->slice;
      const std::optional<PlanSlice>& y = b.tensors[i].source->slice;
      ASSERT_EQ(x.has_value(), y.has_value()) << a.tensors[i].name;
      if (x) {
        EXPECT_EQ(x->dim, y->dim);
        EXPECT_EQ(x->start, y->start);
        EXPECT_EQ(x->length, y->length);
      }
    }
  }
  EXPECT_EQ(a.file_checks, b.file_checks);
  ASSERT_EQ(a.methods.size(), b.methods.size());
  for (size_t i = 0; i < a.methods.size(); ++i) {
    EXPECT_EQ(a.methods[i].name, b.methods[i].name);
    EXPECT_EQ(a.methods[i].memory_ids, b.methods[i].memory_ids);
    EXPECT_EQ(a.methods[i].tensors, b.methods[i].tensors);
  }
}

TEST_F(PlanTest, GivenPlan_WhenWrittenAndReadBack_ThenTheSamePlan) {
  plan_["allow_external_files"] = true;
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const fs::path copy = dir_ / "copy.json";
  ASSERT_TRUE(write_plan(*plan, copy).ok());
  Result<Plan> again = read_plan(copy);
  ASSERT_TRUE(again.ok()) << again.status().message();

  EXPECT_TRUE(again->allow_external_files);
  expect_same_plan(*again, *plan);
}

TEST_F(PlanTest, WrittenPlanHasOneLinePerEntry) {
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_TRUE(write_plan(*plan, dir_ / "copy.json").ok());
  const std::string text = test::read_file(dir_ / "copy.json");
  EXPECT_THAT(text, StartsWith("{\n  \"format\": \"devalloc-plan\",\n  \"version\": 2,\n"));
  EXPECT_THAT(text, HasSubstr("\n  \"files\": [\n    \"model.safetensors\"\n  ],\n"));
  EXPECT_THAT(text, HasSubstr("\n    {\"memory_id\":2,\"device\":\"host\",\"size\":1024,"
                              "\"alignment\":64}\n  ],\n"));
  // Tensors as rows: a whole tensor of its own name is its file's index.
  EXPECT_THAT(text, HasSubstr("\n  \"tensors\": [\n    [\"tok.weight\",\"F32\",[4,4],0,0,0],\n"));
  EXPECT_THAT(text, HasSubstr("\n    [\"scratch\",\"F32\",[16],0,0,null]\n  ],\n"));
}

TEST_F(PlanTest, GivenEmptyPlan_WhenWritten_ThenReadsAndValidates) {
  Plan empty;
  empty.path = dir_ / "empty.json";
  ASSERT_TRUE(write_plan(empty, empty.path).ok());
  Result<Plan> again = read_plan(empty.path);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE(validate_plan(*again).ok());
  EXPECT_TRUE(again->tensors.empty());
}

TEST_F(PlanTest, GivenNamesThatNeedEscaping_WhenWritten_ThenEachLineIsTheJsonOfItsEntryAndReadsBack) {
  // Quote, backslash, every named escape, other control bytes, DEL and
  // multi-byte UTF-8.
  const std::string odd = std::string("q\"b\\s/\b\f\n\r\t\x01\x1f\x7f") + "\xc3\xa9\xe2\x80\xae";
  Plan plan;
  plan.path = dir_ / "odd.json";
  plan.buffers = {{0, "host", 64, 64, std::nullopt}};
  plan.tensors = {PlanTensor{odd, DType::u8, {4, 2}, 0, 8, PlanSource{"m" + odd, "k" + odd, std::nullopt}},
                  PlanTensor{"plain", DType::bf16, {}, 0, 0, std::nullopt}};
  plan.methods = {PlanMethod{"m" + odd, {0}, {odd, "plain"}}};
  ASSERT_TRUE(write_plan(plan, plan.path).ok());
  const std::string text = test::read_file(plan.path);

  // Each entry is exactly its compact JSON, as a JSON library writes it.
  const nlohmann::ordered_json tensor = nlohmann::ordered_json::array(
      {odd, "U8", {4, 2}, 0, 8, {{"file", 0}, {"key", "k" + odd}}});
  const nlohmann::ordered_json scalar =
      nlohmann::ordered_json::array({"plain", "BF16", nlohmann::ordered_json::array(), 0, 0, nullptr});
  const nlohmann::ordered_json method = {
      {"name", "m" + odd}, {"memory_ids", {0}}, {"tensors", {odd, "plain"}}};
  EXPECT_THAT(text, HasSubstr("\n  \"files\": [\n    " + nlohmann::json("m" + odd).dump() +
                              "\n  ],\n"));
  EXPECT_THAT(text, HasSubstr("\n    " + tensor.dump() + ",\n    " + scalar.dump() + "\n"));
  EXPECT_THAT(text, HasSubstr("\n    " + method.dump() + "\n  ]\n}\n"));

  Result<Plan> again = read_plan(plan.path);
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_EQ(again->tensors.size(), 2u);
  EXPECT_EQ(again->tensors[0].name, odd);
  EXPECT_EQ(again->tensors[0].source->key, "k" + odd);
  EXPECT_EQ(again->methods[0].tensors, (std::vector<std::string>{odd, "plain"}));
}

// Long runs of plain bytes go into the text whole (eight at a time): every
// byte that needs an escape is still escaped wherever it falls in a run.
TEST_F(PlanTest, GivenLongNamesWithEscapesAtEveryPosition_WhenWritten_ThenTheTextIsTheJsonOfEachAndReadsBack) {
  Plan plan;
  plan.path = dir_ / "long.json";
  plan.buffers = {{0, "host", 64, 64, std::nullopt}};
  std::vector<std::string> names;
  for (size_t at = 0; at < 24; ++at) {
    std::string name(30, static_cast<char>('a' + at % 26));
    name[at] = "\"\\\n\x01\x7f\xc3"[at % 6];
    if (name[at] == '\xc3') name[at + 1] = '\xa9';  // "é"
    names.push_back(name);
    plan.tensors.push_back(PlanTensor{name, DType::u8, {1}, 0, 0, std::nullopt});
  }
  plan.methods = {PlanMethod{"main", {0}, names}};
  ASSERT_TRUE(write_plan(plan, plan.path).ok());
  const std::string text = test::read_file(plan.path);
  for (const std::string& name : names) {
    EXPECT_THAT(text, HasSubstr("\n    [" + nlohmann::json(name).dump() + ",")) << name;
  }
  Result<Plan> again = read_plan(plan.path);
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_EQ(again->tensors.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(again->tensors[i].name, names[i]);
}

TEST_F(PlanTest, GivenANameThatIsNotUtf8_WhenWritten_ThenRefusedNamingItAndNothingWritten) {
  Plan plan;
  plan.path = dir_ / "bad.json";
  plan.buffers = {{0, "host", 64, 64, std::nullopt}};
  plan.tensors = {PlanTensor{"w", DType::u8, {1}, 0, 0, PlanSource{"m.safetensors", "w\xff", std::nullopt}}};
  Status s = write_plan(plan, plan.path);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), plan.path.string() +
                             ": tensor \"w\" source key is not valid UTF-8 at byte 1");
  EXPECT_FALSE(fs::exists(plan.path));
}

TEST_F(PlanTest, GivenASourceFileThatIsNotUtf8_WhenWritten_ThenRefusedNamingItsFirstTensor) {
  Plan plan;
  plan.path = dir_ / "bad.json";
  plan.buffers = {{0, "host", 64, 64, std::nullopt}};
  plan.tensors = {PlanTensor{"v", DType::u8, {1}, 0, 0, std::nullopt},
                  PlanTensor{"w", DType::u8, {1}, 0, 1, PlanSource{"m\xff", "w", std::nullopt}},
                  PlanTensor{"x", DType::u8, {1}, 0, 2, PlanSource{"m\xff", "x", std::nullopt}}};
  Status s = write_plan(plan, plan.path);
  EXPECT_EQ(s.message(), plan.path.string() +
                             ": tensor \"w\" source file is not valid UTF-8 at byte 1");
  EXPECT_FALSE(fs::exists(plan.path));
}

// Sources of several files, keys other than the name, slices, scratch:
// each file is written once, in the order the tensors first use it, and
// every source reads back as it was.
TEST_F(PlanTest, GivenSourcesOfEveryForm_WhenWrittenAndReadBack_ThenTheSamePlan) {
  Plan plan;
  plan.path = dir_ / "forms.json";
  plan.world_size = 2;
  plan.buffers = {{0, "host", 4096, 64, std::nullopt}};
  plan.tensors = {
      PlanTensor{"a", DType::f32, {4}, 0, 0, PlanSource{"one.safetensors", "a", std::nullopt}},
      PlanTensor{"b", DType::f32, {2, 2}, 0, 64, PlanSource{"two.safetensors", "b", std::nullopt}},
      PlanTensor{"c", DType::f32, {4}, 0, 128, PlanSource{"one.safetensors", "other", std::nullopt}},
      PlanTensor{"d", DType::f32, {2, 1}, 0, 192, PlanSource{"two.safetensors", "b", PlanSlice{1, 1, 1}}},
      PlanTensor{"e", DType::f32, {1, 2}, 0, 256, PlanSource{"one.safetensors", "e", PlanSlice{0, 1, 1}}},
      PlanTensor{"f", DType::u8, {8}, 0, 320, std::nullopt}};
  ASSERT_TRUE(write_plan(plan, plan.path).ok());
  const std::string text = test::read_file(plan.path);
  EXPECT_THAT(text, HasSubstr("\"files\": [\n    \"one.safetensors\",\n    \"two.safetensors\"\n  ],"));
  EXPECT_THAT(text, HasSubstr("\n    [\"a\",\"F32\",[4],0,0,0],\n    [\"b\",\"F32\",[2,2],0,64,1],\n"
                              "    [\"c\",\"F32\",[4],0,128,{\"file\":0,\"key\":\"other\"}],\n"
                              "    [\"d\",\"F32\",[2,1],0,192,{\"file\":1,\"key\":\"b\",\"dim\":1,"
                              "\"start\":1,\"length\":1}],\n"
                              "    [\"e\",\"F32\",[1,2],0,256,{\"file\":0,\"dim\":0,\"start\":1,"
                              "\"length\":1}],\n    [\"f\",\"U8\",[8],0,320,null]\n"));
  Result<Plan> again = read_plan(plan.path);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->world_size, 2u);
  expect_same_plan(*again, plan);
}

// A plan written over a FIFO or a folder (or, as root, a device node such
// as /dev/null) would replace it by a rename: refused, and it stays.
TEST_F(PlanTest, GivenAFifoOrAFolderAtTheOutputPath_WhenWritten_ThenRefusedAndLeftAsItWas) {
  Plan plan;
  plan.buffers = {{0, "host", 64, 64, std::nullopt}};
  const fs::path fifo = dir_ / "out.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Status s = write_plan(plan, fifo);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), fifo.string() + ": not a regular file (a FIFO); it is not replaced");
  EXPECT_TRUE(fs::is_fifo(fifo));
  const fs::path folder = dir_ / "out.dir";
  fs::create_directory(folder);
  s = write_plan(plan, folder);
  EXPECT_EQ(s.message(), folder.string() + ": not a regular file (a directory); it is not replaced");
  EXPECT_TRUE(fs::is_directory(folder));
  for (const auto& entry : fs::directory_iterator(dir_.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
        << "a temporary file was left: " << entry.path();
  }
}

// ---------------------------------------------------------------------------
// Plan texts through the one reader: what it takes is what nlohmann's
// parser reads from the same text (the test's oracle, mapped to a Plan
// below), and what it refuses it refuses with a reason.

struct PlanTextCase {
  std::string text;
  std::string error;  // empty: taken; otherwise a part of the message
};

// The plan a text holds, by nlohmann's reading.
Plan plan_of(const json& root) {
  Plan plan;
  if (root.contains("allow_external_files")) plan.allow_external_files = root["allow_external_files"];
  if (root.contains("world_size")) plan.world_size = root["world_size"];
  for (const json& b : root["buffers"]) {
    PlanBuffer& buffer = plan.buffers.emplace_back();
    buffer.memory_id = b["memory_id"];
    buffer.device = b["device"];
    buffer.size = b["size"];
    if (b.contains("alignment")) buffer.alignment = b["alignment"];
    if (b.contains("rank")) buffer.rank = b["rank"].get<uint32_t>();
  }
  std::vector<std::string> files;
  for (const json& f : root.value("files", json::array())) {
    files.push_back(f.is_string() ? f.get<std::string>() : f["path"].get<std::string>());
    if (f.is_object() && f.contains("header_bytes")) {
      plan.file_checks[files.back()] = PlanFileCheck{
          f["header_bytes"], std::stoull(f["header_xxh3"].get<std::string>(), nullptr, 16),
          std::stoull(f["rows_xxh3"].get<std::string>(), nullptr, 16)};
    }
  }
  for (const json& t : root["tensors"]) {
    PlanTensor& tensor = plan.tensors.emplace_back();
    if (t.is_array()) {  // [name, dtype, shape, memory_id, offset, source]
      tensor.name = t[0];
      tensor.dtype = *parse_dtype(t[1].get<std::string>());
      tensor.shape = t[2].get<std::vector<uint64_t>>();
      tensor.memory_id = t[3];
      tensor.offset = t[4];
      const json& s = t[5];
      if (s.is_number()) {
        tensor.source = PlanSource{files.at(s.get<size_t>()), tensor.name, std::nullopt};
      } else if (s.is_object()) {
        tensor.source = PlanSource{files.at(s["file"].get<size_t>()), s.value("key", tensor.name),
                                   std::nullopt};
        if (s.contains("dim")) tensor.source->slice = PlanSlice{s["dim"], s["start"], s["length"]};
      }
      continue;
    }
    tensor.name = t["name"];
    tensor.dtype = *parse_dtype(t["dtype"].get<std::string>());
    tensor.shape = t["shape"].get<std::vector<uint64_t>>();
    tensor.memory_id = t["memory_id"];
    tensor.offset = t["offset"];
    if (t.contains("source") && !t["source"].is_null()) {
      const json& s = t["source"];
      tensor.source = PlanSource{s["file"], s["key"], std::nullopt};
      if (s.contains("dim")) tensor.source->slice = PlanSlice{s["dim"], s["start"], s["length"]};
    }
  }
  for (const json& m : root["methods"]) {
    plan.methods.push_back(PlanMethod{m["name"], m["memory_ids"], m["tensors"]});
  }
  return plan;
}

class PlanReading : public PlanTest, public ::testing::WithParamInterface<PlanTextCase> {};

TEST_P(PlanReading, GivenPlanText_ThenTakenAsJsonReadsItOrRefusedWithTheReason) {
  test::write_file(plan_path(), GetParam().text);
  auto plan = read_plan(plan_path());
  if (!GetParam().error.empty()) {
    ASSERT_FALSE(plan.ok()) << GetParam().text;
    EXPECT_EQ(plan.status().message().rfind(plan_path().string() + ": ", 0), 0u)
        << plan.status().message();
    EXPECT_THAT(plan.status().message(), HasSubstr(GetParam().error));
    return;
  }
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  expect_same_plan(*plan, plan_of(json::parse(GetParam().text)));
}

std::string plan_text(std::string_view tensors, std::string_view extra = "") {
  return std::string(R"({"format":"devalloc-plan","version":1,)") + std::string(extra) +
         R"("buffers":[{"memory_id":0,"device":"host","size":64}],"tensors":[)" +
         std::string(tensors) + R"(],"methods":[{"name":"m","memory_ids":[0],"tensors":["a"]}]})";
}

// A version 2 plan of these tensors, with `extra` members first.
std::string v2_text(std::string_view tensors, std::string_view extra = "") {
  return std::string(R"({"format":"devalloc-plan","version":2,)") + std::string(extra) +
         R"("buffers":[{"memory_id":0,"device":"host","size":64}],"tensors":[)" +
         std::string(tensors) + R"(],"methods":[]})";
}

constexpr std::string_view kTensorA =
    R"({"name":"a","dtype":"U8","shape":[4],"memory_id":0,"offset":0,"source":null})";

INSTANTIATE_TEST_SUITE_P(
    Texts, PlanReading,
    ::testing::Values(
        // As write_plan emits it, and in other orders and spacing.
        PlanTextCase{std::string(kValidPlan), ""},
        PlanTextCase{plan_text(kTensorA), ""},
        PlanTextCase{plan_text(kTensorA, R"("allow_external_files":true,)"), ""},
        PlanTextCase{plan_text(R"({"source":{"key":"k","file":"f.safetensors"},"offset":8,)"
                               R"("memory_id":0,"shape":[2,2],"dtype":"BF16","name":"a"})"),
                     ""},
        PlanTextCase{plan_text(R"({"source":{"key":"k","file":"f","length":2,"dim":1,)"
                               R"("start":3},"offset":8,"memory_id":0,"shape":[2,2],)"
                               R"("dtype":"BF16","name":"a"})",
                               R"("world_size":2,)"),
                     ""},
        PlanTextCase{"\n{ \"methods\" : [ ] , \"tensors\" : [ ] , \"buffers\" : [ { \"size\" : 1"
                     " , \"device\" : \"host\" , \"memory_id\" : 4294967295 , \"alignment\" : 8 ,"
                     " \"rank\" : 0 } ] , \"version\" : 1 , \"format\" : \"devalloc-plan\" }\n",
                     ""},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"U8","shape":[4],"memory_id":0,"offset":0})"),
                     ""},
        PlanTextCase{plan_text(kTensorA, R"("allow_external_files":false , )") + " ", ""},
        // Escapes anywhere.
        PlanTextCase{plan_text(R"({"name":"\u0061","dtype":"\u0055\u0038","shape":[4],)"
                               R"("memory_id":0,"offset":0,"s\u006furce":{"file":"a\\b\/c",)"
                               R"("key":"\ud83d\ude00\n"}})"),
                     ""},
        // Version 2: rows, a file table, and object entries beside rows.
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,0],["b","F32",[],0,4,null],)"
                             R"(["c","U8",[2,2],0,8,{"file":1,"key":"k"}],)"
                             R"(["d","U8",[2,1],0,12,{"dim":1,"length":1,"file":0,"start":1}],)"
                             R"({"name":"e","dtype":"U8","shape":[1],"memory_id":0,"offset":16,)"
                             R"("source":{"file":"path.safetensors","key":"e"}})",
                             R"("files":["f.safetensors","g.safetensors"],)"),
                     ""},
        // "files" after the rows that use it, spacing anywhere.
        PlanTextCase{std::string(R"({"format":"devalloc-plan","version":2,"buffers":[],)") +
                         R"("tensors":[ [ "a" , "U8" , [ 4 ] , 0 , 0 , 1 ] ],"methods":[],)"
                         R"("files":["f","g"]})",
                     ""},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,0])", R"("files":[],)"),
                     "/tensors/0/5: file 0 is not in \"files\" (0 entries)"},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,{"file":1}])", R"("files":["f"],)"),
                     "/tensors/0/5/file: file 1 is not in \"files\" (1 entry)"},
        PlanTextCase{std::string(R"({"format":"devalloc-plan","version":2,"buffers":[],)") +
                         R"("tensors":[["a","U8",[4],0,0,2]],"methods":[],"files":["f","g"]})",
                     "/tensors/0/5: file 2 is not in \"files\" (2 entries)"},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0])"),
                     "/tensors/0: a row has 6 elements: name, dtype, shape, memory_id, offset, "
                     "source, this one 5"},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,null,1])"),
                     "/tensors/0: a row has 6 elements: name, dtype, shape, memory_id, offset, "
                     "source, this one more"},
        PlanTextCase{v2_text(R"(["a","X",[4],0,0,null])"), "/tensors/0/1: unknown dtype \"X\""},
        PlanTextCase{v2_text(R"(["a","U8",[4],-1,0,null])"),
                     "/tensors/0/3: expected a non-negative integer, got number -1"},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,"f"])", R"("files":["f"],)"),
                     "/tensors/0/5: expected a file index, {\"file\": ...} or null, got string "
                     "\"f\""},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,{"file":"f"}])", R"("files":["f"],)"),
                     "/tensors/0/5/file: expected a non-negative integer, got string \"f\""},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,{"key":"k"}])", R"("files":["f"],)"),
                     "/tensors/0/5: missing \"file\""},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,{"file":0,"dim":1}])", R"("files":["f"],)"),
                     "/tensors/0/5: a slice needs \"dim\", \"start\" and \"length\" together"},
        PlanTextCase{v2_text(R"(5)"),
                     "/tensors/0: expected a row [name, dtype, shape, memory_id, offset, source] "
                     "or an object, got number 5"},
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,null])", R"("files":[7],)"),
                     "/files/0: expected a path or {\"path\": ...}, got number 7"},
        // A file with its check, beside one without.
        PlanTextCase{v2_text(R"(["a","U8",[4],0,0,0],["b","U8",[4],0,4,1])",
                             R"("files":[{"rows_xxh3":"00000000000000ff","path":"f",)"
                             R"("header_bytes":80,"header_xxh3":"0123456789abcdef"},"g"],)"),
                     ""},
        PlanTextCase{v2_text("", R"("files":[{"path":"f","header_bytes":80}],)"),
                     "/files/0: a check needs \"header_bytes\", \"header_xxh3\" and "
                     "\"rows_xxh3\" together, got 1 of them"},
        PlanTextCase{v2_text("", R"("files":[{"path":"f","header_bytes":80,)"
                                 R"("header_xxh3":"0123456789ABCDEF","rows_xxh3":"0"}],)"),
                     "/files/0/header_xxh3: expected 16 lowercase hex digits, got "
                     "\"0123456789ABCDEF\""},
        PlanTextCase{v2_text("", R"("files":[{"header_bytes":80}],)"),
                     "/files/0: missing \"path\""},
        PlanTextCase{v2_text("", R"("files":["f",{"path":"f"}],)"),
                     "/files/1: source file \"f\" is listed twice"},
        PlanTextCase{v2_text("", R"("files":{},)"), "/files: expected an array, got object {}"},
        // Rows and "files" need version 2, wherever "version" stands.
        PlanTextCase{plan_text(R"(["a","U8",[4],0,0,null])"),
                     "/tensors/0: rows and \"files\" are version 2 of the format; the plan says "
                     "version 1"},
        PlanTextCase{plan_text(kTensorA, R"("files":[],)"),
                     "/files: rows and \"files\" are version 2 of the format; the plan says "
                     "version 1"},
        PlanTextCase{R"({"tensors":[["a","U8",[4],0,0,null]],"buffers":[],"methods":[],)"
                     R"("format":"devalloc-plan","version":1})",
                     "/tensors/0: rows and \"files\" are version 2"},
        // Refused, with the reason.
        PlanTextCase{plan_text(kTensorA, R"("allow_external_files":1,)"),
                     "/allow_external_files: expected true or false, got number 1"},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"X","shape":[4],"memory_id":0,"offset":0})"),
                     "/tensors/0/dtype: unknown dtype \"X\" (known: "},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"U8","shape":[4.0],"memory_id":0,)"
                               R"("offset":0})"),
                     "/tensors/0/shape/0: expected a non-negative integer, got number 4.0"},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"U8","shape":[4],"memory_id":4294967296,)"
                               R"("offset":0})"),
                     "/tensors/0/memory_id: 4294967296 is above 4294967295"},
        PlanTextCase{R"({"format":"devalloc-plan","version":1,"buffers":[],"tensors":[],)"
                     R"("methods":[{"name":"m","memory_ids":[4294967296],"tensors":[]}]})",
                     "/methods/0/memory_ids/0: 4294967296 is above 4294967295"},
        PlanTextCase{plan_text(R"({"name":"a","name":"b","dtype":"U8","shape":[4],)"
                               R"("memory_id":0,"offset":0})"),
                     "/tensors/0: duplicate key \"name\" at line 1, column 116"},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"U8","shape":[4],"memory_id":0})"),
                     "/tensors/0: missing \"offset\""},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"U8","shape":[4],"memory_id":0,"offset":0,)"
                               R"("extra":1})"),
                     "/tensors/0/extra: unknown key (expected one of: name, dtype, shape, "
                     "memory_id, offset, source)"},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"U8","shape":[4],"memory_id":0,"offset":0,)"
                               R"("source":{"file":"f"}})"),
                     "/tensors/0/source: missing \"key\""},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"U8","shape":[4],"memory_id":0,"offset":0,)"
                               R"("source":{"file":"f","key":"k","dim":0}})"),
                     "/tensors/0/source: a slice needs \"dim\", \"start\" and \"length\" "
                     "together, got 1 of them"},
        PlanTextCase{plan_text(R"({"name":"a","dtype":"U8","shape":[4],"memory_id":0,"offset":0,)"
                               R"("source":[]})"),
                     "/tensors/0/source: expected {\"file\": ..., \"key\": ...} or null, got "
                     "array []"},
        PlanTextCase{R"({"format":"devalloc-plan","version":3,"buffers":[],"tensors":[],)"
                     R"("methods":[]})",
                     "/version: version 3 is newer than this devalloc reads (2)"},
        PlanTextCase{R"({"format":"devalloc-plan","version":0,"buffers":[],"tensors":[],)"
                     R"("methods":[]})",
                     "/version: versions start at 1"},
        PlanTextCase{R"({"format":"other","version":1,"buffers":[],"tensors":[],"methods":[]})",
                     "/format: expected \"devalloc-plan\", got string \"other\": not a devalloc "
                     "plan"},
        // Not a plan says so first, wherever "format" is.
        PlanTextCase{R"({"tensors":[{"name":5}],"buffers":[],"methods":[],"format":"other"})",
                     "/format: expected \"devalloc-plan\", got string \"other\""},
        PlanTextCase{R"({"tensors":[],"buffers":[],"methods":[]})",
                     "/format: expected \"devalloc-plan\", got nothing: not a devalloc plan"},
        PlanTextCase{R"({"format":"devalloc-plan","buffers":[],"tensors":[],"methods":[]})",
                     "missing \"version\""},
        PlanTextCase{R"({"version":1,"format":"devalloc-plan","buffers":[],"tensors":[]})",
                     "missing \"methods\""},
        PlanTextCase{R"({"format":"devalloc-plan","version":1,"buffers":[],"tensors":[],)"
                     R"("methods":[],"methods":[]})",
                     "duplicate key \"methods\" at line 1, column 78"},
        PlanTextCase{R"({"format":"devalloc-plan","version":1,"buffers":[],"tensors":[],)"
                     R"("methods":[]} x)",
                     "invalid JSON at line 1, column 79: 'x' after the end of the JSON value"},
        PlanTextCase{"{\"format\":\"devalloc-plan\",\n\"version\":1,\n\"buffers\":[],\n"
                     "\"tensors\":[\n{\"name\":\"a\xc0\"}]}",
                     "invalid JSON at line 5, column 11: invalid UTF-8 (byte 0xc0) inside a "
                     "string"},
        PlanTextCase{R"({"format":"devalloc-plan","version":1,"buffers":[[]],"tensors":[],)"
                     R"("methods":[]})",
                     "/buffers/0: expected an object, got array []"},
        PlanTextCase{R"({"format":"devalloc-plan","version":1,"buffers":[{"size":[[[1]]]}]})",
                     "nesting deeper than 4 levels"},
        PlanTextCase{"[]", "expected a JSON object, got array []"}));

TEST_F(PlanTest, GivenWhatWritePlanWrites_ThenItReadsBack) {
  Result<Plan> plan = read();
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_TRUE(write_plan(*plan, dir_ / "copy.json").ok());
  Result<Plan> copy = read_plan(dir_ / "copy.json");
  ASSERT_TRUE(copy.ok()) << copy.status().message();
  expect_same_plan(*copy, *plan);
}

// Loading a plan without naming methods selects every method, and unloading
// one selects those that stay: each name was looked up by a scan of all the
// methods, so a plan of 200 000 methods (about 45 MB) took minutes to load.
// No timing here: ParseScaling runs as its own ctest with a TIMEOUT.
// The methods' lists are read into room reserved for every tensor of the
// plan (a method lists each at most once), twice the plan's tensors in all;
// a short method gives back what it did not use, so 50 000 of them do not
// each keep room for 200 000 names.
TEST(ParseScaling, GivenPlanOf200000TensorsAnd50000ShortMethods_WhenRead_ThenEachHoldsItsNames) {
  ScratchDir dir;
  std::string text = R"({"format":"devalloc-plan","version":2,"buffers":[],"tensors":[)";
  for (int i = 0; i < 200000; ++i) {
    text += (i == 0 ? "" : ",") + std::string(R"([")") + std::to_string(i) + R"(","U8",[1],0,0,null])";
  }
  text += R"(],"methods":[)";
  for (int m = 0; m < 50000; ++m) {
    text += (m == 0 ? "" : ",") + std::string(R"({"name":"m)") + std::to_string(m) +
            R"(","memory_ids":[],"tensors":[")" + std::to_string(m) + R"("]})";
  }
  text += "]}";
  test::write_file(dir / "plan.json", text);
  Result<Plan> plan = read_plan(dir / "plan.json");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->methods.size(), 50000u);
  for (int m = 0; m < 50000; ++m) {
    const std::vector<std::string>& names = plan->methods[m].tensors;
    ASSERT_EQ(names, std::vector<std::string>{std::to_string(m)});
    ASSERT_LE(names.capacity(), 4097u) << m;
  }
}

// write_plan hands its text to the file a chunk at a time; a plan whose
// text passes the 256 MiB read_plan takes is still refused whole, with its
// length, and no file (or temporary file) is left.
TEST(ParseScaling, GivenPlanTextPastTheLimit_WhenWritten_ThenRefusedAndNothingLeft) {
  ScratchDir dir;
  Plan plan;
  plan.buffers = {{0, "host", 1, 1, std::nullopt}};
  PlanMethod& method = plan.methods.emplace_back(PlanMethod{"main", {0}, {}});
  // Each name is in a row and in the method: about 8 KiB of text a tensor.
  const size_t tensors = kMaxPlanBytes / (2 * kMaxPlanNameBytes) + 16;
  for (size_t i = 0; i < tensors; ++i) {
    std::string name = std::to_string(i);
    name.resize(kMaxPlanNameBytes, 'n');
    plan.tensors.push_back(PlanTensor{name, DType::u8, {}, 0, 0, std::nullopt});
    method.tensors.push_back(std::move(name));
  }
  const fs::path path = dir / "big.json";
  const Status s = write_plan(plan, path);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  const std::string prefix = path.string() + ": not written: the plan is ";
  ASSERT_THAT(s.message(), StartsWith(prefix));
  EXPECT_THAT(s.message(), HasSubstr(" bytes, more than a plan file may be (256 MiB)"));
  // The whole text's length, counted past the limit: each row and method
  // entry holds a name of kMaxPlanNameBytes.
  const uint64_t length = std::stoull(s.message().substr(prefix.size()));
  EXPECT_GT(length, 2 * tensors * kMaxPlanNameBytes);
  EXPECT_TRUE(fs::is_empty(dir.path())) << "a file was left";
}

TEST(ParseScaling, GivenPlanOf200000Methods_WhenAllAreSelected_ThenEachIsFoundByName) {
  Plan plan;
  plan.buffers = {{0, "host", 200000, 1, std::nullopt}};
  // Names of one length with a long common start: a scan compares them all.
  const std::string prefix(200, 'm');
  std::vector<std::string> names;
  for (int i = 0; i < 200000; ++i) {
    char digits[8];
    std::snprintf(digits, sizeof digits, "%06d", i);
    names.push_back(prefix + digits);
    plan.tensors.push_back(PlanTensor{"t" + std::to_string(i), DType::u8, {1}, 0,
                                      static_cast<uint64_t>(i), std::nullopt});
    plan.methods.push_back(PlanMethod{names.back(), {0}, {plan.tensors.back().name}});
  }
  ASSERT_TRUE(validate_plan(plan).ok());
  Result<PlanSelection> all = plan.tensors_for_methods(names);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(all->tensors.size(), 200000u);
  EXPECT_THAT(all->memory_ids, ElementsAre(0));
}

}  // namespace
}  // namespace devalloc
