#include <devalloc/core/plan.hpp>

#include "core_test_support.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace devalloc {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using test::ScratchDir;

void write_model(const fs::path& path, const std::vector<SafetensorsWriteTensor>& tensors) {
  fs::create_directories(path.parent_path());
  const Status status = write_safetensors(path, tensors);
  ASSERT_TRUE(status.ok()) << status.message();
}

std::vector<std::string> names(const Plan& plan) {
  std::vector<std::string> out;
  for (const PlanTensor& tensor : plan.tensors) out.push_back(tensor.name);
  return out;
}

class PlanBuilder : public ::testing::Test {
 protected:
  void SetUp() override {
    // a: 64 + 6 + 5 bytes; b: 8 bytes.
    write_model(dir_ / "a.safetensors", {{"tok.weight", DType::f32, {4, 4}, span(64)},
                                         {"blk.0.attn.weight", DType::f16, {3}, span(6)},
                                         {"blk.0.norm", DType::u8, {5}, span(5)}});
    write_model(dir_ / "b.safetensors", {{"lm_head.weight", DType::bf16, {2, 2}, span(8)}});
  }

  static std::span<const std::byte> span(size_t n) {
    static const std::vector<std::byte> bytes(1024, std::byte{7});
    return std::span(bytes).first(n);
  }

  Result<Plan> build(const PlanBuildOptions& options, const fs::path& plan = {}) {
    const std::vector<fs::path> files = {dir_ / "a.safetensors", dir_ / "b.safetensors"};
    return build_plan(files, plan.empty() ? dir_ / "plan.json" : plan, options);
  }

  static std::string error(const Result<Plan>& plan,
                           StatusCode code = StatusCode::invalid_argument) {
    EXPECT_FALSE(plan.ok());
    if (plan.ok()) return {};
    EXPECT_EQ(plan.status().code(), code);
    return plan.status().message();
  }

  ScratchDir dir_;
};

TEST(PlacementRule, GivenGlobAndDevice_ThenParsed) {
  Result<PlacementRule> rule = parse_placement_rule("blk.*=cuda:0");
  ASSERT_TRUE(rule.ok()) << rule.status().message();
  EXPECT_EQ(rule->pattern, "blk.*");
  EXPECT_EQ(rule->device, "cuda:0");
}

TEST(PlacementRule, GivenEqualsInTheGlob_ThenTheLastOneSplits) {
  Result<PlacementRule> rule = parse_placement_rule("a=b*=host");
  ASSERT_TRUE(rule.ok()) << rule.status().message();
  EXPECT_EQ(rule->pattern, "a=b*");
  EXPECT_EQ(rule->device, "host");
}

TEST(PlacementRule, GivenMalformedRule_ThenErrorQuotesIt) {
  EXPECT_EQ(parse_placement_rule("blk.*").status().message(),
            "placement rule \"blk.*\": expected GLOB=DEVICE, e.g. 'blk.*=cuda:0'");
  EXPECT_EQ(parse_placement_rule("=cuda:0").status().message(),
            "placement rule \"=cuda:0\": empty glob");
  EXPECT_EQ(parse_placement_rule("blk.*=cuda:x").status().message(),
            "placement rule \"blk.*=cuda:x\": \"cuda:x\" is not a device tag (\"name\" or "
            "\"name:index\" of at most 256 bytes, e.g. \"cuda:0\")");
}

TEST_F(PlanBuilder, GivenRules_ThenOneBufferPerDeviceWithAlignedPacking) {
  PlanBuildOptions options;
  options.rules = {{"blk.*", "cuda:0"}, {"lm_head.*", "hip:1"}, {"blk.0.norm", "host"}};
  Result<Plan> plan = build(options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();

  // Devices in the order they first receive a tensor; the first rule that
  // matches wins (blk.0.norm goes to cuda:0, not host).
  ASSERT_EQ(plan->buffers.size(), 3u);
  EXPECT_EQ(plan->buffers[0].device, "host");
  EXPECT_EQ(plan->buffers[1].device, "cuda:0");
  EXPECT_EQ(plan->buffers[2].device, "hip:1");
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(plan->buffers[i].memory_id, i);
    EXPECT_EQ(plan->buffers[i].alignment, 256u);
  }
  EXPECT_EQ(plan->buffers[0].size, 64u);
  EXPECT_EQ(plan->buffers[1].size, 256u + 5u);  // attn at 0, norm at 256
  EXPECT_EQ(plan->buffers[2].size, 8u);

  EXPECT_THAT(names(*plan),
              ElementsAre("tok.weight", "blk.0.attn.weight", "blk.0.norm", "lm_head.weight"));
  const PlanTensor& norm = plan->tensors[2];
  EXPECT_EQ(norm.memory_id, 1u);
  EXPECT_EQ(norm.offset, 256u);
  EXPECT_EQ(norm.dtype, DType::u8);
  EXPECT_THAT(norm.shape, ElementsAre(5));
  ASSERT_TRUE(norm.source.has_value());
  EXPECT_EQ(norm.source->file, "a.safetensors");
  EXPECT_EQ(norm.source->key, "blk.0.norm");
  EXPECT_EQ(plan->tensors[3].source->file, "b.safetensors");
  EXPECT_FALSE(plan->allow_external_files);

  ASSERT_EQ(plan->methods.size(), 1u);
  EXPECT_EQ(plan->methods[0].name, "main");
  EXPECT_THAT(plan->methods[0].memory_ids, ElementsAre(0, 1, 2));
  EXPECT_EQ(plan->methods[0].tensors, names(*plan));
}

TEST_F(PlanBuilder, GivenNoRules_ThenEverythingOnTheDefaultDevice) {
  PlanBuildOptions options;
  options.default_device = "cuda:1";
  options.alignment = 64;
  Result<Plan> plan = build(options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->buffers.size(), 1u);
  EXPECT_EQ(plan->buffers[0].device, "cuda:1");
  std::vector<uint64_t> offsets;
  for (const PlanTensor& tensor : plan->tensors) offsets.push_back(tensor.offset);
  EXPECT_THAT(offsets, ElementsAre(0, 64, 128, 192));
  EXPECT_EQ(plan->buffers[0].size, 200u);
}

// `--place 'layers.*=cuda:0'` on a file whose names start "model.layers."
// placed nothing and said nothing: everything went to the default device.
TEST_F(PlanBuilder, GivenRulesThatPlaceNothing_ThenTheReportSaysWhichAndWhy) {
  PlanBuildOptions options;
  options.rules = {{"layers.*", "cuda:0"}, {"blk.*", "cuda:1"}, {"blk.0.norm", "cuda:2"}};
  PlanBuildReport report;
  const std::vector<fs::path> files = {dir_ / "a.safetensors", dir_ / "b.safetensors"};
  Result<Plan> plan = build_plan(files, dir_ / "plan.json", options, &report);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_THAT(report.unused_rules,
              ElementsAre("placement rule \"layers.*=cuda:0\" placed no tensor: it matches "
                          "none of the 4 tensors",
                          "placement rule \"blk.0.norm=cuda:2\" placed no tensor: every tensor "
                          "it matches was placed by an earlier rule"));
}

TEST_F(PlanBuilder, GivenRulesThatEachPlaceATensor_ThenTheReportIsEmpty) {
  PlanBuildOptions options;
  options.rules = {{"blk.*", "cuda:1"}, {"*", "cuda:0"}};
  PlanBuildReport report;
  report.unused_rules = {"stale"};
  const std::vector<fs::path> files = {dir_ / "a.safetensors", dir_ / "b.safetensors"};
  ASSERT_TRUE(build_plan(files, dir_ / "plan.json", options, &report).ok());
  EXPECT_THAT(report.unused_rules, ElementsAre());
}

TEST_F(PlanBuilder, GivenBuiltPlan_WhenWrittenReadAndValidated_ThenValid) {
  PlanBuildOptions options;
  options.rules = {{"*.weight", "cuda:0"}};
  options.methods = {"prefill", "decode"};
  Result<Plan> plan = build(options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_TRUE(write_plan(*plan, dir_ / "plan.json").ok());
  Result<Plan> read = read_plan(dir_ / "plan.json");
  ASSERT_TRUE(read.ok()) << read.status().message();
  const Status status = validate_plan(*read);
  EXPECT_TRUE(status.ok()) << status.message();
  ASSERT_EQ(read->methods.size(), 2u);
  EXPECT_EQ(read->methods[1].name, "decode");
  EXPECT_EQ(read->methods[1].tensors, names(*read));
}

TEST_F(PlanBuilder, GivenPlanInAnotherFolder_ThenSourcesAreRelativeToIt) {
  const fs::path plan_path = dir_ / "plans" / "v1" / "plan.json";
  fs::create_directories(plan_path.parent_path());
  Result<Plan> plan = build({}, plan_path);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->tensors[0].source->file, "../../a.safetensors");
  EXPECT_TRUE(plan->allow_external_files);
  ASSERT_TRUE(write_plan(*plan, plan_path).ok());
  Result<Plan> read = read_plan(plan_path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  const Status status = validate_plan(*read);
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST_F(PlanBuilder, GivenDataInASubfolder_ThenNoExternalFiles) {
  write_model(dir_ / "weights" / "c.safetensors", {{"c", DType::u8, {1}, span(1)}});
  const std::vector<fs::path> files = {dir_ / "weights" / "c.safetensors"};
  Result<Plan> plan = build_plan(files, dir_ / "plan.json");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->tensors[0].source->file, "weights/c.safetensors");
  EXPECT_FALSE(plan->allow_external_files);
}

TEST_F(PlanBuilder, GivenSameTensorNameInTwoFiles_ThenErrorNamesBoth) {
  write_model(dir_ / "c.safetensors", {{"blk.0.norm", DType::u8, {5}, span(5)}});
  const std::vector<fs::path> files = {dir_ / "a.safetensors", dir_ / "c.safetensors"};
  EXPECT_EQ(error(build_plan(files, dir_ / "plan.json")),
            "tensor \"blk.0.norm\" is in both " + (dir_ / "a.safetensors").string() + " and " +
                (dir_ / "c.safetensors").string());
}

TEST_F(PlanBuilder, GivenSameFileTwice_ThenSaysSo) {
  const std::vector<fs::path> files = {dir_ / "a.safetensors",
                                       dir_ / "sub" / ".." / "a.safetensors"};
  fs::create_directory(dir_ / "sub");
  EXPECT_EQ(error(build_plan(files, dir_ / "plan.json")),
            (dir_ / "sub" / ".." / "a.safetensors").string() + ": given twice (also as " +
                (dir_ / "a.safetensors").string() + ")");
}

// File names in these messages are escaped like every path in a message:
// a name that holds terminal escapes is shown as \x1b, never sent raw.
TEST_F(PlanBuilder, GivenFilesNamedWithEscapes_WhenRefused_ThenTheMessagesShowThemEscaped) {
  const fs::path odd = dir_ / "c\x1b[2J.safetensors";
  write_model(odd, {{"blk.0.norm", DType::u8, {5}, span(5)}});
  const std::string shown = (dir_ / "c\\x1b[2J.safetensors").string();
  EXPECT_EQ(error(build_plan(std::vector<fs::path>{dir_ / "a.safetensors", odd},
                             dir_ / "plan.json")),
            "tensor \"blk.0.norm\" is in both " + (dir_ / "a.safetensors").string() + " and " +
                shown);
  EXPECT_EQ(error(build_plan(std::vector<fs::path>{odd, odd}, dir_ / "plan.json")),
            shown + ": given twice (also as " + shown + ")");
}

TEST_F(PlanBuilder, GivenBadOptions_ThenRejected) {
  PlanBuildOptions options;
  options.alignment = 96;
  EXPECT_EQ(error(build(options)), "alignment 96 is not a power of two");
  options = {};
  options.default_device = "gpu 0";
  EXPECT_THAT(error(build(options)), HasSubstr("default device: \"gpu 0\" is not a device tag"));
  options = {};
  options.rules = {{"blk.*", "cuda:zero"}};
  EXPECT_THAT(error(build(options)),
              HasSubstr("placement rule \"blk.*=cuda:zero\": \"cuda:zero\" is not a device tag"));
  options = {};
  options.methods = {};
  EXPECT_EQ(error(build(options)), "a plan needs at least one method");
  options.methods = {"main", "main"};
  EXPECT_EQ(error(build(options)), "method \"main\" given twice");
  // A plan is JSON, which holds only UTF-8 (issue 9: strings are checked).
  options.methods = {"ma\xffin"};
  EXPECT_EQ(error(build(options)),
            "method name \"ma\\xffin\" is not valid UTF-8 at byte 2");
}

TEST_F(PlanBuilder, GivenUnreadableFile_ThenItsError) {
  const std::vector<fs::path> files = {dir_ / "missing.safetensors"};
  EXPECT_THAT(error(build_plan(files, dir_ / "plan.json"), StatusCode::not_found),
              HasSubstr("missing.safetensors: cannot open: No such file or directory"));
}

TEST_F(PlanBuilder, GivenCache_ThenALoadOfThePlanFindsTheFilesItOpened) {
  // The files spelled with a detour: the cache must hold them under the
  // resolved path that the plan's sources resolve to, or a load would read
  // every header a second time.
  fs::create_directories(dir_ / "sub");
  const std::vector<fs::path> files = {dir_ / "sub" / ".." / "a.safetensors",
                                       dir_ / "b.safetensors"};
  SafetensorsCache cache;
  PlanBuildOptions options;
  options.cache = &cache;
  Result<Plan> plan = build_plan(files, dir_ / "plan.json", options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  Result<Plan> uncached = build_plan(files, dir_ / "plan.json");
  ASSERT_TRUE(uncached.ok()) << uncached.status().message();
  fs::remove(dir_ / "a.safetensors");
  fs::remove(dir_ / "b.safetensors");

  // With the files gone, only what the cache holds can check the sources.
  PlanValidationOptions validation;
  validation.cache = &cache;
  const Status cached = validate_plan(*plan, validation);
  EXPECT_TRUE(cached.ok()) << cached.message();
  SafetensorsCache empty;
  validation.cache = &empty;
  EXPECT_THAT(validate_plan(*uncached, validation).message(), HasSubstr("cannot open"));
}

TEST_F(PlanBuilder, GivenCacheAndUnreadableFile_ThenItsErrorNamesTheFile) {
  const std::vector<fs::path> files = {dir_ / "missing.safetensors"};
  SafetensorsCache cache;
  PlanBuildOptions options;
  options.cache = &cache;
  EXPECT_THAT(error(build_plan(files, dir_ / "plan.json", options), StatusCode::not_found),
              HasSubstr("missing.safetensors: cannot open: No such file or directory"));
}

TEST_F(PlanBuilder, GivenReferenceFile_WhenPlannedAndValidated_ThenSourcesResolveToItsBytes) {
  ASSERT_EQ(test::run_reference_script("write '" + dir_.path().string() + "'"), 0);
  const std::vector<fs::path> files = {dir_ / "numpy.safetensors", dir_ / "raw.safetensors"};
  PlanBuildOptions options;
  options.rules = {{"blk.*", "cuda:0"}, {"fp8.*", "hip:0"}};
  Result<Plan> plan = build_plan(files, dir_ / "plan.json", options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_TRUE(write_plan(*plan, dir_ / "plan.json").ok());
  Result<Plan> read = read_plan(dir_ / "plan.json");
  ASSERT_TRUE(read.ok()) << read.status().message();
  SafetensorsCache cache;
  PlanValidationOptions validation;
  validation.cache = &cache;
  const Status status = validate_plan(*read, validation);
  ASSERT_TRUE(status.ok()) << status.message();

  // Every constant's source is the reference tensor of the same name.
  size_t checked = 0;
  for (const PlanTensor& tensor : read->tensors) {
    Result<fs::path> path = read->source_path(*tensor.source);
    ASSERT_TRUE(path.ok()) << path.status().message();
    auto file = cache.open(*path);
    ASSERT_TRUE(file.ok()) << file.status().message();
    const SafetensorsTensor* source = (*file)->find(tensor.source->key);
    ASSERT_NE(source, nullptr) << tensor.name;
    EXPECT_EQ(source->dtype, tensor.dtype);
    EXPECT_EQ(source->shape, tensor.shape);
    ++checked;
  }
  EXPECT_EQ(checked, 14u + 8u);
  EXPECT_EQ(read->buffers.size(), 3u);
}

// build_and_write_plan (what `devalloc plan` and Python's devalloc.plan
// run) writes, without holding the plan's tensors, the very bytes
// write_plan writes of build_plan's plan, with the same report; and fails
// where build_plan fails, with the same message and no file.
struct BuildCase {
  std::string name;
  std::vector<std::string> files;  // under the fixture's folder
  PlanBuildOptions options;
};

class BuildAndWrite : public ::testing::TestWithParam<BuildCase> {
 protected:
  void SetUp() override {
    static const std::vector<std::byte> bytes(4096, std::byte{3});
    const auto span = [](size_t n) { return std::span(bytes).first(n); };
    write_model(dir_ / "a.safetensors", {{"tok.weight", DType::f32, {4, 8}, span(128)},
                                         {"blk.0.q.weight", DType::f16, {4, 6}, span(48)},
                                         {"blk.0.norm", DType::u8, {5}, span(5)},
                                         {"experts.3.w", DType::bf16, {2, 2}, span(8)},
                                         {"experts.4.w", DType::bf16, {2, 2}, span(8)}});
    write_model(dir_ / "sub" / "b.safetensors", {{"lm_head.weight", DType::f32, {2, 4}, span(32)}});
    write_model(dir_ / "a_too.safetensors", {{"tok.weight", DType::f32, {1}, span(4)}});
  }
  ScratchDir dir_;
};

TEST_P(BuildAndWrite, GivenOptions_ThenTheFileIsWhatWritePlanWritesOfBuildPlan) {
  const BuildCase& c = GetParam();
  std::vector<fs::path> files;
  for (const std::string& f : c.files) files.push_back(dir_ / f);
  const fs::path built_path = dir_ / "plans" / "built.json";
  const fs::path streamed_path = dir_ / "plans" / "streamed.json";
  fs::create_directories(built_path.parent_path());

  PlanBuildReport built_report;
  Result<Plan> built = build_plan(files, built_path, c.options, &built_report);
  PlanBuildReport streamed_report;
  Result<PlanWritten> streamed =
      build_and_write_plan(files, streamed_path, c.options, &streamed_report);
  if (!built.ok()) {
    ASSERT_FALSE(streamed.ok());
    // The same failure, naming the same file and place.
    std::string expected = built.status().message();
    EXPECT_EQ(streamed.status().message(), expected);
    EXPECT_FALSE(fs::exists(streamed_path));
    EXPECT_TRUE(fs::is_empty(streamed_path.parent_path()));
    return;
  }
  ASSERT_TRUE(streamed.ok()) << streamed.status().message();
  ASSERT_TRUE(write_plan(*built, built_path).ok());
  EXPECT_EQ(test::read_file(streamed_path), test::read_file(built_path));
  EXPECT_EQ(streamed_report.unused_rules, built_report.unused_rules);
  EXPECT_EQ(streamed_report.unused_shard_rules, built_report.unused_shard_rules);

  // What it returns: the buffers and methods, the tensors counted.
  const Plan& plan = streamed->plan;
  EXPECT_EQ(plan.allow_external_files, built->allow_external_files);
  EXPECT_EQ(plan.world_size, built->world_size);
  ASSERT_EQ(plan.buffers.size(), built->buffers.size());
  std::vector<size_t> per_buffer(built->buffers.size());
  for (const PlanTensor& t : built->tensors) ++per_buffer[t.memory_id];
  for (size_t b = 0; b < plan.buffers.size(); ++b) {
    EXPECT_EQ(plan.buffers[b].device, built->buffers[b].device);
    EXPECT_EQ(plan.buffers[b].size, built->buffers[b].size);
    EXPECT_EQ(plan.buffers[b].rank, built->buffers[b].rank);
  }
  EXPECT_EQ(streamed->tensors_per_buffer, per_buffer);
  EXPECT_EQ(streamed->tensors, built->tensors.size());
  ASSERT_EQ(plan.methods.size(), built->methods.size());
  for (size_t m = 0; m < plan.methods.size(); ++m) {
    EXPECT_EQ(plan.methods[m].name, built->methods[m].name);
    EXPECT_EQ(plan.methods[m].memory_ids, built->methods[m].memory_ids);
    EXPECT_TRUE(plan.methods[m].tensors.empty());
  }
}

PlanBuildOptions options_with(const std::function<void(PlanBuildOptions&)>& set) {
  PlanBuildOptions options;
  set(options);
  return options;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BuildAndWrite,
    ::testing::Values(
        BuildCase{"defaults", {"a.safetensors"}, {}},
        BuildCase{"two_files_rules_methods",
                  {"a.safetensors", "sub/b.safetensors"},
                  options_with([](PlanBuildOptions& o) {
                    o.rules = {{"blk.*", "cuda:0"}, {"lm_head.*", "host"}, {"none.*", "cuda:1"}};
                    o.default_device = "cuda:1";
                    o.alignment = 64;
                    o.methods = {"prefill", "decode"};
                  })},
        BuildCase{"ranks_shards_experts",
                  {"a.safetensors", "sub/b.safetensors"},
                  options_with([](PlanBuildOptions& o) {
                    o.world_size = 2;
                    o.shards = {{"*.q.weight", 1, {}}, {"tok.weight", 0, {3, 1}}};
                    o.experts = {"experts.*"};
                    o.rules = {{"blk.*", "cuda:local"}};
                  })},
        BuildCase{"shard_rules_that_cut_nothing",
                  {"a.safetensors"},
                  options_with([](PlanBuildOptions& o) {
                    o.world_size = 3;
                    o.shards = {{"nothing.*", 0, {}}};
                  })},
        BuildCase{"a_name_in_two_files", {"a.safetensors", "a_too.safetensors"}, {}},
        BuildCase{"a_shard_that_does_not_divide",
                  {"a.safetensors"},
                  options_with([](PlanBuildOptions& o) {
                    o.world_size = 3;
                    o.shards = {{"tok.weight", 1, {}}};
                  })},
        BuildCase{"bad_alignment", {"a.safetensors"},
                  options_with([](PlanBuildOptions& o) { o.alignment = 3; })},
        BuildCase{"missing_file", {"a.safetensors", "missing.safetensors"}, {}}),
    [](const ::testing::TestParamInfo<BuildCase>& param) { return param.param.name; });

}  // namespace
}  // namespace devalloc
