// A plan's check of a source file (file_check.hpp): a load takes the
// file's tensors where the rows put them only while the header and the
// rows are as planned, and reads the header otherwise.
#include <devalloc/core/plan.hpp>

#include "core_test_support.hpp"
#include "file_check.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace devalloc {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using test::ScratchDir;

class FileCheck : public ::testing::Test {
 protected:
  void SetUp() override { write_model({4, 8}); }

  // a: F32 [4], b: F16 [shape_b], c: U8 [5], s: a scalar.
  void write_model(std::vector<uint64_t> shape_b) {
    static const std::vector<std::byte> bytes(4096, std::byte{9});
    const uint64_t b_bytes = 2 * shape_b[0] * shape_b[1];
    const std::vector<SafetensorsWriteTensor> tensors = {
        {"a", DType::f32, {4}, std::span(bytes).first(16)},
        {"b", DType::f16, shape_b, std::span(bytes).first(b_bytes)},
        {"c", DType::u8, {5}, std::span(bytes).first(5)},
        {"s", DType::f32, {}, std::span(bytes).first(4)}};
    ASSERT_TRUE(write_safetensors(model(), tensors).ok());
  }
  fs::path model() const { return dir_ / "model.safetensors"; }

  Plan built(uint32_t world_size = 0) {
    const std::vector<fs::path> files = {model()};
    PlanBuildOptions options;
    options.world_size = world_size;
    Result<Plan> plan = build_plan(files, dir_ / "plan.json", options);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    return plan.ok() ? std::move(*plan) : Plan{};
  }

  // Whether the plan's check holds for the model, filling offset_.
  bool holds(const Plan& plan) {
    const auto check = plan.file_checks.find("model.safetensors");
    if (check == plan.file_checks.end()) return false;
    Result<std::shared_ptr<const MappedFile>> file = MappedFile::open(model());
    EXPECT_TRUE(file.ok()) << file.status().message();
    offset_.clear();
    const detail::RowsByFile rows(plan);
    return file.ok() && detail::planned_offsets(plan, rows.rows_of("model.safetensors"),
                                                check->second, **file, offset_);
  }

  ScratchDir dir_;
  std::vector<uint64_t> offset_;
};

TEST_F(FileCheck, GivenAPlanBuiltForOneProcess_ThenTheCheckHoldsAndGivesTheHeadersOffsets) {
  const Plan plan = built();
  ASSERT_EQ(plan.file_checks.size(), 1u);
  ASSERT_TRUE(holds(plan));
  Result<std::shared_ptr<const SafetensorsFile>> file = SafetensorsFile::open(model());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(plan.file_checks.at("model.safetensors").header_bytes, (*file)->data_offset() - 8);
  ASSERT_EQ(plan.tensors.size(), 4u);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    EXPECT_EQ(offset_[i], (*file)->find(plan.tensors[i].name)->offset) << plan.tensors[i].name;
  }
}

TEST_F(FileCheck, GivenAPlanWrittenAndReadBack_ThenItsCheckStillHolds) {
  const Plan plan = built();
  ASSERT_TRUE(write_plan(plan, dir_ / "plan.json").ok());
  EXPECT_THAT(test::read_file(dir_ / "plan.json"),
              HasSubstr("{\"path\":\"model.safetensors\",\"header_bytes\":"));
  Result<Plan> read = read_plan(dir_ / "plan.json");
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->file_checks, plan.file_checks);
  EXPECT_TRUE(holds(*read));
}

TEST_F(FileCheck, GivenTwoFiles_ThenEachHasItsCheckOverItsOwnRows) {
  static const std::vector<std::byte> bytes(64, std::byte{1});
  const std::vector<SafetensorsWriteTensor> more_tensors = {
      {"m", DType::u8, {3}, std::span(bytes).first(3)}};
  ASSERT_TRUE(write_safetensors(dir_ / "more.safetensors", more_tensors).ok());
  const std::vector<fs::path> files = {model(), dir_ / "more.safetensors"};
  Result<Plan> plan = build_plan(files, dir_ / "plan.json");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->file_checks.size(), 2u);
  EXPECT_TRUE(holds(*plan));
  const detail::RowsByFile rows(*plan);
  ASSERT_EQ(rows.rows_of("more.safetensors").size(), 1u);
  Result<std::shared_ptr<const MappedFile>> more = MappedFile::open(dir_ / "more.safetensors");
  ASSERT_TRUE(more.ok());
  std::vector<uint64_t> offsets;
  EXPECT_TRUE(detail::planned_offsets(*plan, rows.rows_of("more.safetensors"),
                                      plan->file_checks.at("more.safetensors"), **more, offsets));
  // The check of one file does not hold for the other.
  EXPECT_FALSE(detail::planned_offsets(*plan, rows.rows_of("more.safetensors"),
                                       plan->file_checks.at("model.safetensors"), **more,
                                       offsets));
}

TEST_F(FileCheck, GivenAPlanForRanks_ThenNoCheck) {
  EXPECT_TRUE(built(2).file_checks.empty());
}

// Any row of the file not as planned: its shape, dtype, key, a slice, the
// order, one row fewer. The load then reads the header, as for a plan
// without a check.
TEST_F(FileCheck, GivenARowNotAsPlanned_ThenTheCheckDoesNotHold) {
  const Plan plan = built();
  ASSERT_TRUE(holds(plan));
  const std::vector<std::function<void(Plan&)>> edits = {
      [](Plan& p) { p.tensors[1].shape = {8, 4}; },
      [](Plan& p) { p.tensors[1].dtype = DType::bf16; },
      [](Plan& p) { p.tensors[0].source->key = "c"; },
      [](Plan& p) { p.tensors[1].source->slice = PlanSlice{0, 0, 4}; },
      [](Plan& p) { std::swap(p.tensors[0], p.tensors[2]); },
      [](Plan& p) { p.tensors.pop_back(); },
      [](Plan& p) { p.tensors[2].name = p.tensors[2].source->key = "d"; },
  };
  for (size_t e = 0; e < edits.size(); ++e) {
    Plan edited = plan;
    edits[e](edited);
    EXPECT_FALSE(holds(edited)) << "edit " << e;
  }
}

TEST_F(FileCheck, GivenTheFileRewritten_ThenTheCheckHoldsOnlyForTheSameBytesOfHeader) {
  const Plan plan = built();
  write_model({4, 8});  // the same header again
  EXPECT_TRUE(holds(plan));
  write_model({8, 4});  // the same names and sizes, another shape
  EXPECT_FALSE(holds(plan));
  write_model({4, 8});
  // Bytes after the last tensor: not the file planned.
  std::ofstream(model(), std::ios::app | std::ios::binary) << "tail";
  EXPECT_FALSE(holds(plan));
}

// A check that no longer holds changes nothing of what validate_plan says:
// the header is read and the row compared, as without a check.
TEST_F(FileCheck, GivenAnEditedRow_WhenValidated_ThenTheSameErrorAsWithoutACheck) {
  Plan plan = built();
  plan.tensors[1].shape = {8, 4};
  const Status with_check = validate_plan(plan);
  plan.file_checks.clear();
  const Status without = validate_plan(plan);
  EXPECT_FALSE(without.ok());
  EXPECT_EQ(with_check.message(), without.message());
  EXPECT_THAT(without.message(), HasSubstr("shape [8, 4] differs from [4, 8]"));
}

}  // namespace
}  // namespace devalloc
