// A loaded program over time: lookups that outlive an unload, loads that a
// progress callback watches, plans that skipped validation, constants that
// scratch may overwrite, exports and plugin instances that are recreated.
#include "load_fixture.hpp"

#include <devalloc/core/device_buffer.hpp>
#include <devalloc/core/device_registry.hpp>

#include <gmock/gmock.h>

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

namespace devalloc::testing {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(LoadFixture, GivenALookupHeld_WhenItsMethodIsUnloaded_ThenTheLookupStaysValidAndHoldsItsBuffer) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = Runtime::create(default_config())->load(plan());
  ASSERT_TRUE(program.ok()) << program.status().message();
  std::optional<LoadedTensor> head = (*program)->find("head");
  ASSERT_TRUE(head);
  ASSERT_TRUE((*program)->unload_method("decode").ok());
  EXPECT_FALSE((*program)->find("head"));
  // Buffer 1 belongs to no loaded method any more, but the lookup holds it.
  EXPECT_EQ(DeviceBuffer::live_count(), before + 3);
  EXPECT_EQ(read_back(*head), source("head"));
  head.reset();
  EXPECT_EQ(DeviceBuffer::live_count(), before + 2);
}

TEST_F(LoadFixture, GivenAProgressCallbackThatLooksUp_WhenLoadingMoreMethods_ThenItRunsDuringTheCopiesAndSeesNothingHalfLoaded) {
  auto runtime = Runtime::create(default_config());
  std::shared_ptr<LoadedProgram> watched;
  std::vector<bool> head_seen, w_a_seen;
  runtime->set_progress([&](uint64_t, uint64_t) {
    if (!watched) return;
    // Before the fix this waited for the program's lock, held by the load
    // that called it: a deadlock.
    head_seen.push_back(watched->find("head").has_value());
    w_a_seen.push_back(watched->find("w.a").has_value());
    EXPECT_EQ(watched->methods(), std::vector<std::string>{"prefill"});
  });
  auto program = runtime->load(plan(), {.methods = {"prefill"}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  watched = *program;
  ASSERT_TRUE(watched->load_methods({.methods = {"decode"}}).ok());
  // head is copied by this load: while it ran, decode was not visible.
  EXPECT_THAT(head_seen, ElementsAre(false));
  EXPECT_THAT(w_a_seen, ElementsAre(true));
  EXPECT_TRUE(watched->find("head"));
}

// A load's own callback replaces the runtime's for that load only; a load
// that gives none still gets the runtime's.
TEST_F(LoadFixture, GivenARuntimeCallbackAndALoadsOwn_WhenLoading_ThenEachLoadCallsOnlyTheOneItGets) {
  auto runtime = Runtime::create(default_config());
  std::vector<uint64_t> runtime_done, own_done;
  runtime->set_progress([&](uint64_t done, uint64_t) { runtime_done.push_back(done); });
  const LoadProgress own = [&](uint64_t done, uint64_t) { own_done.push_back(done); };

  auto program = runtime->load(plan(), {.methods = {"prefill"}, .progress = own});
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_THAT(runtime_done, ElementsAre());
  ASSERT_FALSE(own_done.empty());
  EXPECT_EQ(own_done.back(), 768u);  // w.a and w.b

  own_done.clear();
  ASSERT_TRUE((*program)->load_methods({.methods = {"decode"}, .progress = own}).ok());
  EXPECT_THAT(runtime_done, ElementsAre());
  EXPECT_THAT(own_done, ElementsAre(256u));  // head only: the rest is in place

  own_done.clear();
  ASSERT_TRUE(runtime->load(plan(), {.methods = {"decode"}}).ok());
  EXPECT_THAT(own_done, ElementsAre());
  ASSERT_FALSE(runtime_done.empty());
  EXPECT_EQ(runtime_done.back(), 1024u);
}

TEST_F(LoadFixture, GivenUnvalidatedPlanWithTensorOutsideItsMethodsMemoryIds_WhenLoading_ThenRefusedNamingTheTensorAndNothingIsAllocated) {
  const uint64_t before = DeviceBuffer::live_count();
  plan().methods[0].memory_ids = {0};  // prefill's scratch lies in buffer 2
  auto program = Runtime::create(default_config())->load(plan(), {.methods = {"prefill"}});
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("tensor \"scratch\""),
                    HasSubstr("memory id 2 is not among the memory ids of the methods this "
                              "call loads (0)")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(LoadFixture, GivenUnvalidatedPlanWithTensorOutsideItsMethodsMemoryIds_WhenItsBufferIsLiveAlready_ThenStillRefusedAndTheProgramUnchanged) {
  // "wide" lists buffer 0 only; its scratch lies in buffer 2 (1024 bytes),
  // which decode makes live, and runs past its end.
  plan().tensors.push_back(PlanTensor{"wide.scratch", DType::u8, {4096}, 2, 0, std::nullopt});
  plan().methods.push_back(PlanMethod{"wide", {0}, {"w.a", "wide.scratch"}});
  auto program = Runtime::create(default_config())->load(plan(), {.methods = {"decode"}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  const uint64_t before = DeviceBuffer::live_count();
  Status s = (*program)->load_methods({.methods = {"wide"}});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("tensor \"wide.scratch\""),
                    HasSubstr("memory id 2 is not among the memory ids of the methods this "
                              "call loads (0)")));
  EXPECT_EQ((*program)->methods(), std::vector<std::string>{"decode"});
  EXPECT_FALSE((*program)->find("wide.scratch"));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(LoadFixture, GivenScratchOfAnotherMethodOverlappingAConstant_WhenTheConstantsMethodIsUnloadedAndLoadedAgain_ThenTheConstantIsCopiedAgain) {
  // "overlay" uses buffer 1 as scratch, over the bytes of head (decode's).
  plan().tensors.push_back(PlanTensor{"overlay.scratch", DType::u8, {256}, 1, 0, std::nullopt});
  plan().methods.push_back(PlanMethod{"overlay", {1}, {"overlay.scratch"}});
  auto program = Runtime::create(default_config())->load(plan(), {.methods = {"decode", "overlay"}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  ASSERT_TRUE((*program)->unload_method("decode").ok());

  // overlay runs and writes its scratch: head's bytes are gone.
  const std::optional<LoadedTensor> scratch = (*program)->find("overlay.scratch");
  ASSERT_TRUE(scratch);
  const std::vector<std::byte> garbage(256, std::byte{0x5a});
  ASSERT_TRUE(scratch->device().plugin->copy_to_device(scratch->device().device, scratch->address(),
                                                       garbage.data(), garbage.size()).ok());

  LoadReport report;
  ASSERT_TRUE((*program)->load_methods({.methods = {"decode"}, .report = &report}).ok());
  EXPECT_EQ(report.allocations, 2u);  // buffers 0 and 2; buffer 1 lived on
  EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));
}

TEST_F(LoadFixture, GivenAMethodThatListsABufferWithNoTensorOfItsOwn_WhenAnotherMethodIsUnloaded_ThenTheBufferLivesOnAndItsConstantsAreCopiedAgain) {
  // "spare" lists buffer 1 (where decode's head lies) as memory it uses,
  // with no tensor in it: a runtime may hand it out as scratch.
  plan().methods.push_back(PlanMethod{"spare", {1}, {}});
  auto program = Runtime::create(default_config())->load(plan(), {.methods = {"decode", "spare"}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  const uint64_t before = DeviceBuffer::live_count();
  ASSERT_TRUE((*program)->unload_method("decode").ok());
  EXPECT_EQ((*program)->methods(), std::vector<std::string>{"spare"});
  EXPECT_FALSE((*program)->find("head"));
  EXPECT_TRUE((*program)->tensors().empty());
  EXPECT_EQ(DeviceBuffer::live_count(), before - 2);  // buffers 0 and 2 went
  ASSERT_EQ((*program)->buffers().size(), 1u);
  EXPECT_EQ((*program)->buffers()[0]->memory_id(), 1u);

  LoadReport report;
  ASSERT_TRUE((*program)->load_methods({.methods = {"decode"}, .report = &report}).ok());
  EXPECT_EQ(report.allocations, 2u);  // buffer 1 lived on
  EXPECT_EQ(report.constants, 3u);    // head too: no loaded method listed it
  EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));
}

TEST_F(LoadFixture, GivenUnvalidatedPlanWithTensorInAnotherMethodsBuffer_WhenThatMethodIsUnloaded_ThenTheTensorKeepsItsBuffer) {
  // "lean" lists head (buffer 1) but only memory id 0; loaded together with
  // "wide", which lists buffer 1, the load accepts it.
  plan().methods = {{"lean", {0}, {"w.a", "head"}}, {"wide", {1}, {}}};
  auto program = Runtime::create(default_config())->load(plan(), {.methods = {"lean", "wide"}});
  ASSERT_TRUE(program.ok()) << program.status().message();
  ASSERT_TRUE((*program)->unload_method("wide").ok());
  const std::optional<LoadedTensor> head = (*program)->find("head");
  ASSERT_TRUE(head);
  EXPECT_EQ(read_back(*head), source("head"));
  EXPECT_EQ((*program)->buffers().size(), 2u);
}

TEST_F(LoadFixture, GivenAPlanMovedIn_ThenTheProgramOwnsItAndLoadsEveryMethod) {
  Plan moved = plan();
  auto program = Runtime::create(default_config())->load(std::move(moved));
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ((*program)->methods(), (std::vector<std::string>{"decode", "prefill"}));
  EXPECT_EQ((*program)->plan().tensors.size(), plan().tensors.size());
  EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));
}

TEST_F(LoadFixture, GivenASharedPlan_WhenLoadedTwice_ThenBothProgramsHoldItWithoutACopy) {
  auto shared = std::make_shared<const Plan>(plan());
  auto runtime = Runtime::create(default_config());
  auto first = runtime->load(shared, {.methods = {"decode"}});
  auto second = runtime->load(shared);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(&(*first)->plan(), shared.get());
  EXPECT_EQ(&(*second)->plan(), shared.get());
  EXPECT_EQ(read_back(*(*first)->find("head")), source("head"));
  EXPECT_EQ(read_back(*(*second)->find("head")), source("head"));
  // The programs keep the plan when the caller lets it go.
  std::weak_ptr<const Plan> weak = shared;
  shared.reset();
  EXPECT_FALSE(weak.expired());
  first->reset();
  second->reset();
  EXPECT_TRUE(weak.expired());
}

TEST_F(LoadFixture, GivenANullSharedPlan_WhenLoading_ThenRefusedWithAStatus) {
  auto program = Runtime::create(default_config())->load(std::shared_ptr<const Plan>());
  ASSERT_FALSE(program.ok());
  EXPECT_EQ(program.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(program.status().message(), "load: no plan (a null pointer)");
}

TEST_F(LoadFixture, GivenADlpackExport_WhenTheLastProgramHandleGoes_ThenTheExportKeepsTheProgramAlive) {
  std::weak_ptr<LoadedProgram> weak;
  DLManagedTensor* managed = nullptr;
  {
    auto program = Runtime::create(default_config())->load(plan(), {.methods = {"decode"}});
    ASSERT_TRUE(program.ok()) << program.status().message();
    weak = *program;
    auto exported = (*program)->export_dlpack("head");
    ASSERT_TRUE(exported.ok()) << exported.status().message();
    managed = *exported;
  }
  EXPECT_FALSE(weak.expired());
  managed->deleter(managed);
  EXPECT_TRUE(weak.expired());
}

// A registry that cannot find a plugin now must find it once it is there:
// a failure is not remembered.
TEST_F(LoadFixture, GivenAPluginThatFailedToLoad_WhenItBecomesLoadable_ThenTheNextUseLoadsIt) {
  const auto library = dir() / "libdevalloc_late.so";
  auto runtime = Runtime::create(config("[plugins.late]\nlibrary = \"" + library.string() + "\"\n"));
  auto first = runtime->registry().plugin("late");
  ASSERT_FALSE(first.ok());
  EXPECT_THAT(first.status().message(), HasSubstr("libdevalloc_late.so"));
  std::filesystem::copy_file(kZooDir / "libdevalloc_host_faulty.so", library);
  auto second = runtime->registry().plugin("late");
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ((*second)->devices().size(), 1u);
}

// After a device fault the user destroys the instance and makes a new one
// (docs/plugins/cuda.md): dropping it from the registry does that, while
// what still holds the old instance keeps it alive.
TEST_F(LoadFixture, GivenALoadedPlugin_WhenDroppedFromTheRegistry_ThenTheNextLoadCreatesAFreshInstanceAndOldTensorsStayValid) {
  auto runtime = Runtime::create(default_config());
  auto old_program = runtime->load(plan(), {.methods = {"decode"}});
  ASSERT_TRUE(old_program.ok()) << old_program.status().message();
  const std::shared_ptr<Plugin> old_instance = (*old_program)->find("head")->device().plugin;
  EXPECT_TRUE(runtime->registry().drop_plugin("host"));
  EXPECT_FALSE(runtime->registry().drop_plugin("host"));

  auto new_program = runtime->load(plan(), {.methods = {"decode"}});
  ASSERT_TRUE(new_program.ok()) << new_program.status().message();
  EXPECT_NE((*new_program)->find("head")->device().plugin, old_instance);
  EXPECT_EQ(read_back(*(*old_program)->find("head")), source("head"));
  EXPECT_EQ(read_back(*(*new_program)->find("head")), source("head"));
}

}  // namespace
}  // namespace devalloc::testing
