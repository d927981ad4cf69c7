// Loads through broken plugins of the zoo under the validation layer, turned
// on in the runtime config: each load ends with an error that names the
// broken rule, leaves nothing behind, and does not hang.
#include "load_fixture.hpp"

#include <devalloc/core/device_buffer.hpp>
#include <devalloc/plugin_layer.hpp>

#include <gmock/gmock.h>

#include <string>
#include <thread>
#include <vector>

namespace devalloc::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class ValidatedLoad : public LoadFixture {
 protected:
  Result<std::shared_ptr<LoadedProgram>> load_through(const std::string& variant,
                                                      const std::string& validate = "true") {
    const auto library = kZooDir / ("libdevalloc_zoo_" + variant + ".so");
    return Runtime::create(config("[plugins.zoo]\nlibrary = \"" + library.string() +
                                  "\"\nvalidate = " + validate +
                                  "\n[devices.host]\nuse = [\"zoo\", { index = 0 }]\n"))
        ->load(plan());
  }
};

TEST_F(ValidatedLoad, GivenTheWellBehavedZoo_WhenLoadingWithSourceChecks_ThenTheLoadSucceedsWithoutBreach) {
  clear_validation_breaches();
  auto program = load_through("well_behaved", "\"sources\"");
  ASSERT_TRUE(program.ok()) << program.status().message();
  EXPECT_EQ(read_back(*(*program)->find("head")), source("head"));
  EXPECT_TRUE(validation_breaches().empty());
}

// Loads at once through one runtime: a synchronize of one load must not
// return while another thread is still firing releases of copies issued
// before it (PLUGIN-20). The zoo's control plugin broke that once (it fired
// outside its lock and told nobody), and 10 of 12 such loads failed.
TEST_F(ValidatedLoad, GivenTheWellBehavedZoo_WhenLoadingFromSeveralThreadsAtOnce_ThenEveryLoadSucceedsWithoutBreach) {
  clear_validation_breaches();
  const auto library = kZooDir / "libdevalloc_zoo_well_behaved.so";
  // Staged, so that every constant is an until-released copy.
  auto runtime = Runtime::create(config("[plugins.zoo]\nlibrary = \"" + library.string() +
                                        "\"\nvalidate = true\n[devices.host]\nuse = [\"zoo\", "
                                        "{ index = 0 }]\n[load]\ndirect = false\n"));
  constexpr int kThreads = 4;
  constexpr int kLoads = 25;
  std::vector<std::string> failures[kThreads];
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLoads; ++i) {
        auto program = runtime->load(plan());
        if (!program.ok()) failures[t].push_back(program.status().message());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_THAT(failures[t], ::testing::IsEmpty()) << "thread " << t;
  }
  EXPECT_TRUE(validation_breaches().empty());
}

TEST_F(ValidatedLoad, GivenAPluginThatReleasesTwice_WhenLoading_ThenTheLoadFailsWithPlugin14AndLeavesNothing) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = load_through("double_release");
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("PLUGIN-14"), HasSubstr("a second time"), HasSubstr("plugin zoo")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(ValidatedLoad, GivenAPluginReturningMisalignedMemory_WhenLoading_ThenTheLoadFailsWithPlugin11NamingTheBuffer) {
  const uint64_t before = DeviceBuffer::live_count();
  auto program = load_through("misaligned");
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(),
              AllOf(HasSubstr("PLUGIN-11"), HasSubstr("allocating buffer 0")));
  EXPECT_EQ(DeviceBuffer::live_count(), before);
}

TEST_F(ValidatedLoad, GivenAPluginWithAnUnknownStatus_WhenLoading_ThenTheLoadFailsWithPlugin5) {
  auto program = load_through("unknown_status");
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(), AllOf(HasSubstr("PLUGIN-5"), HasSubstr("synchronizing host")));
}

TEST_F(ValidatedLoad, GivenValidateIsNeitherABooleanNorSources_WhenReadingTheConfig_ThenAnErrorNamesTheKey) {
  auto parsed = parse_config("[plugins.host]\nvalidate = \"yes\"\n", (dir() / "devalloc.toml").string());
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), AllOf(HasSubstr("\"validate\" in [plugins.host]"), HasSubstr("sources")));
}

}  // namespace
}  // namespace devalloc::testing
