// PLUGIN-1, PLUGIN-2, PLUGIN-3: the entry point, as the loader and as hosts
// of other ABI versions call it.
#include "suite.hpp"

#include <devalloc/plugin_loader.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

namespace devalloc::conformance {
namespace {

constexpr uint32_t kFutureMajor = DEVALLOC_ABI_VERSION_MAJOR + 1;
// Far beyond any major a plugin will speak: its refusal tells the highest
// major the plugin has.
constexpr uint32_t kFarFutureMajor = 1000;
constexpr uint32_t kUnwritten = 0xdeadbeef;
constexpr uint8_t kCanary = 0xab;

// The plugin opened by hand, as a host of another ABI version would: nothing
// but the entry point and the negotiation struct, whose layout every major
// version shares.
class Negotiation : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [path, error] = PluginLoader().resolve(target().plugin);
    ASSERT_TRUE(error.status.ok() && !path.empty())
        << "cannot resolve " << target().plugin << ": "
        << error.status.message();
    path_ = path;
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    negotiate_ = reinterpret_cast<devalloc_plugin_negotiate_fn>(
        dlsym(handle_, DEVALLOC_PLUGIN_ENTRY_POINT_NAME));
    ASSERT_NE(negotiate_, nullptr)
        << path_ << " does not export " DEVALLOC_PLUGIN_ENTRY_POINT_NAME;
  }
  void TearDown() override {
    if (handle_ != nullptr) dlclose(handle_);
  }

  // The output fields start as values no plugin answers, so that one left
  // unwritten is seen. With slack after it: a plugin that writes past the
  // struct (PLUGIN-4) is reported by LargerStructThanItKnows_* alone.
  static WithSlack<devalloc_negotiation> request(uint32_t min_major,
                                                 uint32_t max_major) {
    WithSlack<devalloc_negotiation> slack;
    devalloc_negotiation& n = slack.value;
    n.struct_size = sizeof n;
    n.host_min_major = min_major;
    n.host_max_major = max_major;
    n.host_max_minor =
        max_major == DEVALLOC_ABI_VERSION_MAJOR ? DEVALLOC_ABI_VERSION_MINOR : 0;
    n.plugin_major = kUnwritten;
    n.plugin_minor = kUnwritten;
    n.plugin_min_major = kUnwritten;
    n.api = &n;
    return slack;
  }

  // The highest major the plugin speaks, from its refusal of a host that
  // speaks only a far-future major.
  uint32_t highest_major() {
    auto request_buffer = request(kFarFutureMajor, kFarFutureMajor);
    devalloc_negotiation& n = *request_buffer;
    RawError error;
    EXPECT_TRUE(RawFailure(negotiate_(&n, error.get()),
                           DEVALLOC_STATUS_UNSUPPORTED, error));
    return n.plugin_major;
  }

  std::filesystem::path path_;
  void* handle_ = nullptr;
  devalloc_plugin_negotiate_fn negotiate_ = nullptr;
};
DEVALLOC_CONFORMANCE_RULES(Negotiation, "PLUGIN-1, PLUGIN-2, PLUGIN-3");

TEST_F(Negotiation, LoaderOpensTheLibrary_AgreeingOnMajor1) {
  auto [library, error] = PluginLibrary::open(path_);
  ASSERT_TRUE(library) << to_string(error.outcome) << ": "
                       << error.status.message();
  EXPECT_EQ(library->abi_major(), 1u);
  EXPECT_FALSE(library->name().empty());
  EXPECT_GE(library->api().struct_size, DEVALLOC_PLUGIN_API_V1_MIN_SIZE);
}

TEST_F(Negotiation, HostSpeakingOnlyAFutureMajor_IsRefusedWithoutATable) {
  auto request_buffer = request(kFutureMajor, kFutureMajor);
  devalloc_negotiation& n = *request_buffer;
  RawError error;
  EXPECT_TRUE(RawFailure(negotiate_(&n, error.get()),
                         DEVALLOC_STATUS_UNSUPPORTED, error));
  EXPECT_EQ(n.api, nullptr) << "a refusal hands out no table";
  EXPECT_NE(n.plugin_major, kUnwritten) << "plugin_major was not reported";
  EXPECT_NE(n.plugin_min_major, kUnwritten)
      << "plugin_min_major was not reported";
  EXPECT_GE(n.plugin_major, 1u);
  EXPECT_NE(n.plugin_major, kFutureMajor)
      << "reports speaking the major it refused";
  EXPECT_LE(n.plugin_min_major, n.plugin_major);
}

// A range that ends below the plugin's majors holds none of them either:
// PLUGIN-2 has the plugin refuse it, not answer its own major.
TEST_F(Negotiation, HostSpeakingOnlyAnOlderMajor_IsRefusedWithoutATable) {
  auto request_buffer = request(0, 0);
  devalloc_negotiation& n = *request_buffer;
  RawError error;
  EXPECT_TRUE(RawFailure(negotiate_(&n, error.get()),
                         DEVALLOC_STATUS_UNSUPPORTED, error));
  EXPECT_EQ(n.api, nullptr) << "a refusal hands out no table";
  EXPECT_NE(n.plugin_major, kUnwritten) << "plugin_major was not reported";
  EXPECT_GE(n.plugin_min_major, 1u);
}

TEST_F(Negotiation, RefusalWithoutAnErrorBuffer_StillRefuses) {
  auto request_buffer = request(kFutureMajor, kFutureMajor);
  devalloc_negotiation& n = *request_buffer;
  EXPECT_NE(negotiate_(&n, nullptr), DEVALLOC_STATUS_OK);
  EXPECT_EQ(n.api, nullptr);
}

TEST_F(Negotiation, HostSpeakingMajor1_GetsACompleteVersion1Table) {
  auto request_buffer = request(1, 1);
  devalloc_negotiation& n = *request_buffer;
  RawError error;
  ASSERT_EQ(negotiate_(&n, error.get()), DEVALLOC_STATUS_OK) << error.text();
  EXPECT_TRUE(error.untouched()) << "success wrote the error message";
  EXPECT_EQ(n.plugin_major, 1u);
  EXPECT_LE(n.plugin_min_major, 1u);
  ASSERT_NE(n.api, nullptr);
  const auto& api = *static_cast<const devalloc_plugin_api_v1*>(n.api);
  EXPECT_GE(api.struct_size, DEVALLOC_PLUGIN_API_V1_MIN_SIZE);
  EXPECT_EQ(api.abi_major, 1u);
  EXPECT_EQ(api.abi_minor, n.plugin_minor)
      << "the function table's abi_minor and the plugin_minor that negotiation answered "
         "must be equal (PLUGIN-3): both say which minor of ABI 1 the plugin implements, "
         "a host reports the negotiated one while a reader holding only the table sees "
         "the table's, and which functions exist follows from struct_size alone";
  ASSERT_NE(api.plugin_name, nullptr);
  EXPECT_STRNE(api.plugin_name, "");
  ASSERT_NE(api.plugin_version, nullptr);
  EXPECT_STRNE(api.plugin_version, "");
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.get_capabilities, nullptr);
  EXPECT_NE(api.get_device_count, nullptr);
  EXPECT_NE(api.get_device_properties, nullptr);
  EXPECT_NE(api.allocate, nullptr);
  EXPECT_NE(api.deallocate, nullptr);
  EXPECT_NE(api.copy_host_to_device, nullptr);
  EXPECT_NE(api.copy_device_to_host, nullptr);
  EXPECT_NE(api.synchronize, nullptr);
}

TEST_F(Negotiation, HostSpeakingMajors1To3_AgreesOnTheHighestMajorInCommon) {
  const uint32_t highest = highest_major();
  auto request_buffer = request(1, 3);
  devalloc_negotiation& n = *request_buffer;
  RawError error;
  ASSERT_EQ(negotiate_(&n, error.get()), DEVALLOC_STATUS_OK) << error.text();
  EXPECT_EQ(n.plugin_major, std::min<uint32_t>(highest, 3));
  ASSERT_NE(n.api, nullptr);
  if (n.plugin_major == 1) {
    EXPECT_EQ(static_cast<const devalloc_plugin_api_v1*>(n.api)->abi_major, 1u);
  }
}

TEST_F(Negotiation, LargerStructThanItKnows_IsAcceptedAndItsTailLeftAlone) {
  constexpr size_t kTail = 64;
  const size_t grown_size = sizeof(devalloc_negotiation) + kTail;
  // Slack after the grown struct too: a plugin that writes even further is
  // reported here, not by the heap.
  std::vector<uint8_t> bytes(grown_size + kSlackBytes, kCanary);
  const devalloc_negotiation n = *request(1, 1);
  std::memcpy(bytes.data(), &n, sizeof n);
  auto* grown = reinterpret_cast<devalloc_negotiation*>(bytes.data());
  grown->struct_size = grown_size;
  RawError error;
  ASSERT_EQ(negotiate_(grown, error.get()), DEVALLOC_STATUS_OK) << error.text();
  EXPECT_NE(grown->api, nullptr);
  for (size_t i = sizeof n; i < bytes.size(); ++i) {
    ASSERT_EQ(bytes[i], kCanary)
        << "wrote byte " << i
        << (i < grown_size ? " it does not know" : ", beyond the struct_size it was given");
  }
}

TEST_F(Negotiation, StructTooSmallForVersion1_IsRefusedWithoutWritingBeyondIt) {
  for (size_t size : {size_t{0}, sizeof(size_t),
                      DEVALLOC_STRUCT_SIZE(devalloc_negotiation, plugin_min_major)}) {
    SCOPED_TRACE("struct_size = " + std::to_string(size));
    std::vector<uint8_t> bytes(sizeof(devalloc_negotiation) + kSlackBytes, kCanary);
    const devalloc_negotiation n = *request(1, 1);
    std::memcpy(bytes.data(), &n, size);
    std::memcpy(bytes.data(), &size, sizeof size);
    RawError error;
    EXPECT_TRUE(RawFailure(
        negotiate_(reinterpret_cast<devalloc_negotiation*>(bytes.data()),
                   error.get()),
        DEVALLOC_STATUS_INVALID_ARGUMENT, error));
    for (size_t i = std::max(size, sizeof(size_t)); i < bytes.size(); ++i) {
      ASSERT_EQ(bytes[i], kCanary) << "wrote byte " << i << " beyond struct_size";
    }
  }
}

TEST_F(Negotiation, NullStruct_IsRefused) {
  RawError error;
  EXPECT_TRUE(RawFailure(negotiate_(nullptr, error.get()),
                         DEVALLOC_STATUS_INVALID_ARGUMENT, error));
}

}  // namespace
}  // namespace devalloc::conformance
