// PLUGIN-8, PLUGIN-9: create with options, destroy, and instances side by
// side.
#include "suite.hpp"

#include <devalloc/plugin_loader.hpp>

#include <vector>

namespace devalloc::conformance {
namespace {

using Options = PluginTest;
using Lifecycle = DeviceTest;
DEVALLOC_CONFORMANCE_RULES(Options, "PLUGIN-8");
DEVALLOC_CONFORMANCE_RULES(Lifecycle, "PLUGIN-9, PLUGIN-12");

constexpr const char* kBogusOption = "devalloc_conformance_bogus_option";

TEST_F(Options, UnknownCreateOption_IsRefusedWithAMessageNamingIt) {
  PluginOptions options = target().options;
  options.emplace_back(kBogusOption, "1");
  auto [refused, error] = PluginLoader().load(target().plugin, options);
  EXPECT_FALSE(refused) << "created with option " << kBogusOption;
  EXPECT_EQ(error.outcome, PluginOutcome::create_failed)
      << to_string(error.outcome) << ": " << error.status.message();
  EXPECT_NE(error.status.message().find(kBogusOption), std::string::npos)
      << "message does not name the option: " << error.status.message();
}

TEST_F(Lifecycle, TwoInstancesAtOnce_KeepTheirOwnMemory) {
  auto [second, error] = PluginLoader().load(target().plugin, target().options);
  ASSERT_TRUE(second) << error.status.message();
  constexpr uint64_t kSize = 64 * kKiB;
  Result<uint64_t> first_base = plugin().allocate(kDevice, kSize, 0);
  ASSERT_OK(first_base);
  Result<uint64_t> second_base = second->allocate(kDevice, kSize, 0);
  ASSERT_OK(second_base);
  // Stop here rather than go on with two instances sharing one address:
  // every step below would free or read the other instance's memory.
  ASSERT_NE(*first_base, *second_base)
      << "two instances of the plugin each handed out device address 0x" << std::hex
      << *first_base << std::dec << " on device " << kDevice
      << " while both allocations were live: device addresses must be unique per device "
         "within the process, across instances (PLUGIN-12), because the host exports "
         "device memory through DLPack as a (device, address) pair, which would then "
         "name two allocations";
  const auto& first_bytes = keep_past_destroy<std::vector<uint8_t>>(pattern(kSize, 1));
  const auto& second_bytes = keep_past_destroy<std::vector<uint8_t>>(pattern(kSize, 2));
  ASSERT_OK(plugin().copy_to_device(kDevice, *first_base, first_bytes.data(), kSize));
  ASSERT_OK(second->copy_to_device(kDevice, *second_base, second_bytes.data(), kSize));
  // Fatal: had it freed the other's allocation, the steps below would use
  // freed memory.
  ASSERT_STATUS(plugin().deallocate(kDevice, *second_base), StatusCode::invalid_argument)
      << "one instance freed an allocation of the other (PLUGIN-12)";
  ASSERT_OK(second->synchronize(kDevice));
  std::vector<uint8_t> read(kSize);
  ASSERT_OK(second->copy_to_host(kDevice, read.data(), *second_base, kSize));
  EXPECT_TRUE(BytesEqual(second_bytes, read));
  second.reset();
  Result<std::vector<uint8_t>> first_read = read_device(kDevice, *first_base, kSize);
  ASSERT_OK(first_read) << "after the other instance was destroyed";
  EXPECT_TRUE(BytesEqual(first_bytes, *first_read));
  EXPECT_OK(synchronize_and_deallocate(kDevice, *first_base));
}

TEST_F(Lifecycle, DestroyWithLiveAllocations_ReturnsAndANewInstanceWorks) {
  auto& sources = keep_past_destroy<std::vector<std::vector<uint8_t>>>();
  for (uint64_t nbytes : {1u, 4096u, 1u << 20}) {
    Result<uint64_t> base = plugin().allocate(kDevice, nbytes, 0);
    ASSERT_OK(base);
    sources.push_back(pattern(nbytes, nbytes));
    ASSERT_OK(plugin().copy_to_device(kDevice, *base, sources.back().data(),
                                      nbytes));
  }
  destroy_plugin();
  auto [again, error] = PluginLoader().load(target().plugin, target().options);
  ASSERT_TRUE(again) << error.status.message();
  Result<uint64_t> base = again->allocate(kDevice, 4096, 0);
  ASSERT_OK(base);
  EXPECT_OK(again->deallocate(kDevice, *base));
}

}  // namespace
}  // namespace devalloc::conformance
