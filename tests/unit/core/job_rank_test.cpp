// Slices of source tensors, ranks from launchers, and a rank's view of a
// plan for a job (docs/distributed.md).
#include <devalloc/core/job_rank.hpp>
#include <devalloc/core/plan.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

namespace devalloc {
namespace {

using ::testing::HasSubstr;

TEST(SliceLayout, GivenASliceAlongDimZero_ThenItIsOneRange) {
  const std::vector<uint64_t> shape{8, 6};
  std::vector<uint64_t> sliced;
  auto layout = slice_layout(PlanSlice{0, 2, 4}, DType::f32, shape, &sliced);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_EQ(layout->rows, 1u);
  EXPECT_EQ(layout->run_bytes, 4u * 6 * 4);
  EXPECT_EQ(layout->first_byte, 2u * 6 * 4);
  EXPECT_EQ(sliced, (std::vector<uint64_t>{4, 6}));
}

TEST(SliceLayout, GivenASliceAlongALaterDimension_ThenItIsOneRunPerRow) {
  const std::vector<uint64_t> shape{3, 5, 8};
  auto layout = slice_layout(PlanSlice{1, 1, 2}, DType::i16, shape);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_EQ(layout->rows, 3u);
  EXPECT_EQ(layout->run_bytes, 2u * 8 * 2);
  EXPECT_EQ(layout->stride_bytes, 5u * 8 * 2);
  EXPECT_EQ(layout->first_byte, 1u * 8 * 2);
}

TEST(SliceLayout, GivenAWholeDimension_ThenTheRowsMergeIntoOneRange) {
  const std::vector<uint64_t> shape{4, 6};
  auto layout = slice_layout(PlanSlice{1, 0, 6}, DType::u8, shape);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->rows, 1u);
  EXPECT_EQ(layout->run_bytes, 24u);
}

TEST(SliceLayout, GivenBadSlices_ThenEachIsRefusedSayingWhy) {
  const std::vector<uint64_t> shape{4, 6};
  EXPECT_THAT(slice_layout(PlanSlice{2, 0, 1}, DType::u8, shape).status().message(),
              HasSubstr("the tensor has 2 dimensions"));
  EXPECT_THAT(slice_layout(PlanSlice{1, 4, 3}, DType::u8, shape).status().message(),
              HasSubstr("dimension 1 has 6 elements"));
  // F4: two elements a byte; a slice of 3 along the last dimension ends
  // inside a byte.
  EXPECT_THAT(slice_layout(PlanSlice{1, 0, 3}, DType::f4, shape).status().message(),
              HasSubstr("whole bytes"));
}

Plan plan_for_two() {
  Plan plan;
  plan.path = "job.json";
  plan.world_size = 2;
  plan.buffers = {{0, "host", 64, 1, std::nullopt}, {1, "cuda:local", 32, 1, 0u},
                  {2, "cuda:local", 32, 1, 1u}};
  plan.tensors = {
      {"norm", DType::u8, {64}, 0, 0, PlanSource{"m.safetensors", "norm", std::nullopt}},
      {"w", DType::u8, {2, 16}, 1, 0, PlanSource{"m.safetensors", "w", PlanSlice{0, 0, 2}}},
      {"w", DType::u8, {2, 16}, 2, 0, PlanSource{"m.safetensors", "w", PlanSlice{0, 2, 2}}}};
  plan.methods = {{"main", {0, 1, 2}, {"norm", "w"}}};
  return plan;
}

TEST(PlanForRank, GivenAPlanForTwoRanks_ThenEachViewHoldsItsShareAndTheReplicated) {
  const Plan plan = plan_for_two();
  auto view = plan_for_rank(plan, JobRank{1, 2, 5, "test"});
  ASSERT_TRUE(view.ok()) << view.status().message();
  EXPECT_EQ(view->world_size, 0u);
  ASSERT_EQ(view->buffers.size(), 2u);
  EXPECT_EQ(view->buffers[1].memory_id, 2u);
  EXPECT_EQ(view->buffers[1].device, "cuda:5");  // the local rank
  ASSERT_EQ(view->tensors.size(), 2u);
  EXPECT_EQ(view->tensors[1].source->slice->start, 2u);
  EXPECT_EQ(view->methods[0].memory_ids, (std::vector<uint32_t>{0, 2}));
}

TEST(PlanForRank, GivenAJobOfAnotherSize_ThenItIsRefused) {
  auto view = plan_for_rank(plan_for_two(), JobRank{0, 3, 0, "RANK"});
  ASSERT_FALSE(view.ok());
  EXPECT_THAT(view.status().message(),
              HasSubstr("the plan is for a job of 2 ranks, this job has 3"));
}

TEST(PlanForRank, GivenARankPastTheWorldSize_ThenValidationNamesTheBuffer) {
  Plan plan = plan_for_two();
  plan.buffers[2].rank = 2;
  const Status s = validate_plan(plan, PlanValidationOptions{false, nullptr, true});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("names rank 2, not below the plan's world_size 2"));
}

TEST(PlanForRank, GivenANamePerRank_ThenTheWholePlanValidatesOnceAndRepeatsInARankAreRefused) {
  Plan plan = plan_for_two();
  PlanValidationOptions no_sources{false, nullptr, true};
  ASSERT_TRUE(validate_plan(plan, no_sources).ok()) << validate_plan(plan, no_sources).message();
  // "w" twice in rank 1's view.
  plan.buffers.push_back({3, "host", 32, 1, 1u});
  plan.tensors.push_back(
      {"w", DType::u8, {2, 16}, 3, 0, PlanSource{"m.safetensors", "w", PlanSlice{0, 2, 2}}});
  EXPECT_THAT(validate_plan(plan, no_sources).message(),
              HasSubstr("name also used by /tensors/2 in the same rank's view"));
  // A replicated "w" beside the ranks' ones.
  plan = plan_for_two();
  plan.tensors.push_back({"w", DType::u8, {4}, 0, 0, std::nullopt});
  EXPECT_THAT(validate_plan(plan, no_sources).message(), HasSubstr("name also used by"));
}

class LauncherEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVariables) ::unsetenv(v);
  }
  void TearDown() override { SetUp(); }
  static constexpr const char* kVariables[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID",
      "SLURM_NTASKS", "SLURM_LOCALID"};
};

TEST_F(LauncherEnvironment, GivenNoLauncher_ThenThereIsNoRank) {
  auto rank = rank_from_environment();
  ASSERT_TRUE(rank.ok());
  EXPECT_FALSE(rank->has_value());
}

TEST_F(LauncherEnvironment, GivenEachLauncher_ThenItsRankSizeAndLocalRankAreRead) {
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "8", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  auto rank = rank_from_environment();
  ASSERT_TRUE(rank.ok() && rank->has_value());
  EXPECT_EQ((*rank)->rank, 5u);
  EXPECT_EQ((*rank)->world_size, 8u);
  EXPECT_EQ((*rank)->local_rank, 1u);
  // torchrun's variables come first.
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  rank = rank_from_environment();
  ASSERT_TRUE(rank.ok() && rank->has_value());
  EXPECT_EQ((*rank)->rank, 2u);
  EXPECT_EQ((*rank)->local_rank, 2u);  // no LOCAL_RANK: the rank
  EXPECT_THAT((*rank)->source, HasSubstr("torchrun"));
}

TEST_F(LauncherEnvironment, GivenBadValues_ThenTheVariableIsNamed) {
  ::setenv("OMPI_COMM_WORLD_RANK", "x1", 1);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_THAT(rank_from_environment().status().message(),
              HasSubstr("OMPI_COMM_WORLD_RANK is \"x1\""));
  ::setenv("OMPI_COMM_WORLD_RANK", "4", 1);
  EXPECT_THAT(rank_from_environment().status().message(),
              HasSubstr("rank 4 is not below the world size 4"));
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_THAT(rank_from_environment().status().message(),
              HasSubstr("OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"));
}

TEST(PlanFormat, GivenSlicesRanksAndAWorldSize_ThenTheyRoundTrip) {
  const std::string path = ::testing::TempDir() + "job_rank_roundtrip.json";
  Plan plan = plan_for_two();
  ASSERT_TRUE(write_plan(plan, path).ok());
  auto read = read_plan(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->world_size, 2u);
  EXPECT_FALSE(read->buffers[0].rank.has_value());
  EXPECT_EQ(read->buffers[2].rank, std::optional<uint32_t>(1));
  ASSERT_TRUE(read->tensors[2].source->slice.has_value());
  EXPECT_EQ(read->tensors[2].source->slice->start, 2u);
  EXPECT_EQ(read->tensors[2].source->slice->length, 2u);
  EXPECT_FALSE(read->tensors[0].source->slice.has_value());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace devalloc
