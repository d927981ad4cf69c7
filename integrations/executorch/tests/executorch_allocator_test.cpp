// The adapter through ExecuTorch's own compiled code: libexecutorch.so's
// DeviceAllocatorRegistry and DeviceMemoryBuffer::create call into it. The
// config maps "cuda:0" to device 1 of the fake CUDA driver
// (DEVALLOC_EXECUTORCH_TEST_BACKEND=cuda) or to the host plugin (=host).
#include <devalloc/core/config.hpp>
#include <devalloc/core/device_registry.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/executorch/device_allocator.hpp>

#include <executorch/runtime/core/device_memory_buffer.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace et = ::executorch::runtime;
using et::DeviceAllocatorRegistry;
using et::DeviceMemoryBuffer;
using et::etensor::DeviceType;

const std::string kFakeDriver = DEVALLOC_FAKE_CUDA_DRIVER;

bool on_fake_cuda() {
  const char* backend = std::getenv("DEVALLOC_EXECUTORCH_TEST_BACKEND");
  return backend != nullptr && std::string(backend) == "cuda";
}

// What ExecuTorch logged, through its platform layer.
std::mutex g_log_mutex;
std::string g_log;
void capture_log(et_timestamp_t, et_pal_log_level_t, const char*, const char*,
                 size_t, const char* message, size_t length) {
  std::lock_guard lock(g_log_mutex);
  g_log.append(message, length);
  g_log += '\n';
}
std::string take_log() {
  std::lock_guard lock(g_log_mutex);
  return std::exchange(g_log, {});
}

// Live device allocations of one fake CUDA device, as the fake counts them.
uint64_t fake_live_allocations(int device) {
  void* fake = ::dlopen(kFakeDriver.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (fake == nullptr) return UINT64_MAX;
  using Fn = uint64_t (*)(int);
  auto fn = reinterpret_cast<Fn>(::dlsym(fake, "devalloc_fake_cuda_live_allocations"));
  const uint64_t n = fn == nullptr ? UINT64_MAX : fn(device);
  ::dlclose(fake);
  return n;
}

std::string config_text() {
  if (on_fake_cuda()) {
    return "[plugins.cuda]\noptions = { runtime_library = \"" + kFakeDriver +
           "\" }\n[devices.\"cuda:0\"]\nuse = [\"cuda\", { index = 1 }]\n";
  }
  return "[devices.\"cuda:0\"]\nuse = [\"host\", { index = 0 }]\n";
}

// One registration per process, as ExecuTorch allows.
devalloc::executorch::DevallocDeviceAllocator* adapter() {
  static devalloc::executorch::DevallocDeviceAllocator* registered = [] {
    et::runtime_init();
    et::register_pal(et::PalImpl::create(capture_log, __FILE__));
    auto config = devalloc::parse_config(config_text(), "executorch_test.toml");
    EXPECT_TRUE(config.ok()) << config.status().message();
    auto result = devalloc::executorch::register_allocator(
        devalloc::Runtime::create(std::move(*config)));
    EXPECT_TRUE(result.ok()) << result.status().message();
    return result.ok() ? *result : nullptr;
  }();
  return registered;
}

// A runtime of its own, for a test's own adapter (the registered one is
// left as it is).
std::shared_ptr<devalloc::Runtime> own_runtime(const std::string& text = config_text()) {
  auto config = devalloc::parse_config(text, "executorch_test.toml");
  EXPECT_TRUE(config.ok()) << config.status().message();
  return devalloc::Runtime::create(config.ok() ? std::move(*config) : devalloc::default_config());
}

std::vector<uint8_t> pattern(size_t nbytes, uint8_t seed) {
  std::vector<uint8_t> bytes(nbytes);
  for (size_t i = 0; i < nbytes; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return bytes;
}

class ExecuTorchAllocator : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(adapter(), nullptr);
    take_log();
    if (on_fake_cuda()) {
      ASSERT_FALSE(kFakeDriver.empty());
    }
  }
};

TEST_F(ExecuTorchAllocator, GivenRegistration_WhenExecuTorchLooksUpCuda_ThenItGetsTheDevallocAdapter) {
  EXPECT_EQ(DeviceAllocatorRegistry::instance().get_allocator(DeviceType::CUDA), adapter());
  EXPECT_EQ(et::get_device_allocator(DeviceType::CUDA), adapter());
  EXPECT_EQ(DeviceAllocatorRegistry::instance().get_allocator(DeviceType::CPU), nullptr);
  auto device = adapter()->device(0);
  ASSERT_TRUE(device.ok()) << device.status().message();
  EXPECT_EQ(device->tag, "cuda:0");
  EXPECT_EQ(device->plugin_name, on_fake_cuda() ? "cuda" : "host");
  EXPECT_EQ(device->device, on_fake_cuda() ? 1u : 0u);
}

TEST_F(ExecuTorchAllocator, GivenBufferFromDeviceMemoryBufferCreate_WhenBytesCopiedInAndOut_ThenTheyMatch) {
  auto buffer = DeviceMemoryBuffer::create(4096, DeviceType::CUDA, 0);
  ASSERT_TRUE(buffer.ok()) << take_log();
  ASSERT_NE(buffer->data(), nullptr);
  EXPECT_EQ(buffer->size(), 4096u);
  if (on_fake_cuda()) {
    EXPECT_EQ(fake_live_allocations(1), 1u);  // on the device the config names
    EXPECT_EQ(fake_live_allocations(0), 0u);
  }

  et::DeviceAllocator* allocator = DeviceAllocatorRegistry::instance().get_allocator(DeviceType::CUDA);
  ASSERT_NE(allocator, nullptr);
  auto* base = static_cast<uint8_t*>(buffer->data());
  const auto expected = pattern(1000, 3);
  std::vector<uint8_t> source = expected;
  ASSERT_EQ(allocator->copy_host_to_device(base + 100, source.data(), source.size(), 0), et::Error::Ok);
  // "During call": the source may change as soon as the copy returned.
  std::memset(source.data(), 0xEE, source.size());
  std::vector<uint8_t> back(1000, 0);
  ASSERT_EQ(allocator->copy_device_to_host(back.data(), base + 100, back.size(), 0), et::Error::Ok);
  EXPECT_EQ(back, expected);
  EXPECT_EQ(take_log(), "");
}

TEST_F(ExecuTorchAllocator, GivenAlignment_WhenExecuTorchAllocates_ThenPointerIsAligned) {
  for (size_t alignment : {size_t{8}, size_t{256}, size_t{4096}}) {
    auto buffer = DeviceMemoryBuffer::create(100, DeviceType::CUDA, 0, alignment);
    ASSERT_TRUE(buffer.ok()) << take_log();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % alignment, 0u) << alignment;
  }
  // The default ExecuTorch asks for.
  auto buffer = DeviceMemoryBuffer::create(100, DeviceType::CUDA, 0);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % et::DeviceAllocator::kDefaultAlignment, 0u);
}

TEST_F(ExecuTorchAllocator, GivenRequestPastDeviceMemory_WhenCreating_ThenExecuTorchErrorAndDevallocMessageLogged) {
  // The fake has 64 MiB per device here; the host plugin cannot get 2^62 bytes.
  const size_t too_big = on_fake_cuda() ? (size_t{128} << 20) : (size_t{1} << 62);
  auto buffer = DeviceMemoryBuffer::create(too_big, DeviceType::CUDA, 0);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.error(), et::Error::MemoryAllocationFailed);
  const std::string log = take_log();
  // The message is longer than ExecuTorch logs: in parts, none cut off, the
  // reason at its end included.
  EXPECT_NE(log.find("devalloc CUDA allocator: allocate (1/"), std::string::npos) << log;
  std::string message;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_LT(line.size(), 255u) << line;
    message += line.substr(line.find("): ") + 3);
  }
  EXPECT_EQ(message.find("allocating " + std::to_string(too_big) + " bytes"), 0u) << message;
  EXPECT_NE(message.find(on_fake_cuda() ? "plugin cuda" : "plugin host"), std::string::npos)
      << message;
  // The plugin's own reason, at the end of the message.
  EXPECT_NE(message.find(on_fake_cuda() ? "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
                                        : "out of device memory"),
            std::string::npos)
      << message;
  EXPECT_EQ(adapter()->live_allocations(), 0u);
  if (on_fake_cuda()) {
    EXPECT_EQ(fake_live_allocations(1), 0u);
  }
}

TEST_F(ExecuTorchAllocator, GivenLiveBuffer_WhenDestroyed_ThenTheDevallocAllocationIsFreed) {
  const uint64_t before = adapter()->live_allocations();
  {
    auto a = DeviceMemoryBuffer::create(1 << 20, DeviceType::CUDA, 0);
    auto b = DeviceMemoryBuffer::create(512, DeviceType::CUDA, 0);
    ASSERT_TRUE(a.ok() && b.ok()) << take_log();
    EXPECT_EQ(adapter()->live_allocations(), before + 2);
    if (on_fake_cuda()) {
      EXPECT_EQ(fake_live_allocations(1), 2u);
    }
    DeviceMemoryBuffer moved = std::move(*a);  // ownership moves, no free
    EXPECT_EQ(adapter()->live_allocations(), before + 2);
  }
  EXPECT_EQ(adapter()->live_allocations(), before);
  if (on_fake_cuda()) {
    EXPECT_EQ(fake_live_allocations(1), 0u);
  }
  EXPECT_EQ(take_log(), "");
}

TEST_F(ExecuTorchAllocator, GivenCopyPastTheAllocation_WhenCopying_ThenInvalidArgumentAndNothingCopied) {
  auto buffer = DeviceMemoryBuffer::create(256, DeviceType::CUDA, 0);
  ASSERT_TRUE(buffer.ok());
  std::vector<uint8_t> bytes(512, 1);
  et::DeviceAllocator* allocator = et::get_device_allocator(DeviceType::CUDA);
  EXPECT_EQ(allocator->copy_host_to_device(buffer->data(), bytes.data(), 512, 0),
            et::Error::InvalidArgument);
  EXPECT_NE(take_log().find("is not inside a live allocation of cuda:0"), std::string::npos);
  EXPECT_EQ(allocator->copy_device_to_host(bytes.data(), buffer->data(), 256, 1),
            et::Error::InvalidArgument);  // cuda:1 has no such allocation
  take_log();
}

// An address past the end of the allocation below it is in none of this
// allocator's memory, however far past: the adapter refuses it itself and
// never hands it to the plugin, where it could land in memory that another
// user of the plugin owns.
TEST_F(ExecuTorchAllocator, GivenAddressBeyondTheEndOfItsLastAllocation_WhenCopying_ThenTheAdapterRefusesIt) {
  // Its own adapter: its only allocation is the one below the address.
  devalloc::executorch::DevallocDeviceAllocator allocator(own_runtime(), DeviceType::CUDA, "cuda");
  auto memory = allocator.allocate(256, 0, 256);
  ASSERT_TRUE(memory.ok()) << take_log();
  auto* past = static_cast<uint8_t*>(*memory) + 512;
  std::vector<uint8_t> bytes(16, 7);
  EXPECT_EQ(allocator.copy_host_to_device(past, bytes.data(), bytes.size(), 0),
            et::Error::InvalidArgument);
  EXPECT_NE(take_log().find("is not inside a live allocation of cuda:0 made by this allocator"),
            std::string::npos);
  EXPECT_EQ(allocator.copy_device_to_host(bytes.data(), past, bytes.size(), 0),
            et::Error::InvalidArgument);
  EXPECT_NE(take_log().find("is not inside a live allocation of cuda:0 made by this allocator"),
            std::string::npos);
  EXPECT_EQ(bytes, std::vector<uint8_t>(16, 7));
  allocator.deallocate(*memory, 0);
  EXPECT_EQ(take_log(), "");
}

// The range is exact: the whole allocation copies, in and out, and one
// byte more does not, from its start or from one byte in.
TEST_F(ExecuTorchAllocator, GivenCopyOneBytePastTheAllocation_WhenCopying_ThenRefusedAndTheWholeOneCopies) {
  devalloc::executorch::DevallocDeviceAllocator allocator(own_runtime(), DeviceType::CUDA, "cuda");
  auto memory = allocator.allocate(256, 0, 256);
  ASSERT_TRUE(memory.ok()) << take_log();
  auto* start = static_cast<uint8_t*>(*memory);
  std::vector<uint8_t> bytes = pattern(257, 5);
  EXPECT_EQ(allocator.copy_host_to_device(start, bytes.data(), 256, 0), et::Error::Ok);
  EXPECT_EQ(allocator.copy_device_to_host(bytes.data(), start + 1, 255, 0), et::Error::Ok);
  EXPECT_EQ(take_log(), "");
  EXPECT_EQ(allocator.copy_host_to_device(start, bytes.data(), 257, 0),
            et::Error::InvalidArgument);
  EXPECT_NE(take_log().find("is not inside a live allocation of cuda:0"), std::string::npos);
  EXPECT_EQ(allocator.copy_device_to_host(bytes.data(), start + 1, 256, 0),
            et::Error::InvalidArgument);
  EXPECT_NE(take_log().find("is not inside a live allocation of cuda:0"), std::string::npos);
  allocator.deallocate(*memory, 0);
  EXPECT_EQ(take_log(), "");
}

// ExecuTorch names the device of every free: memory of cuda:0 freed as
// cuda:1's is refused and stays allocated, so the right free still works.
TEST_F(ExecuTorchAllocator, GivenFreeNamingAnotherIndex_WhenDeallocating_ThenRefusedAndTheMemoryStaysLive) {
  devalloc::executorch::DevallocDeviceAllocator allocator(own_runtime(), DeviceType::CUDA, "cuda");
  auto memory = allocator.allocate(256, 0, 256);
  ASSERT_TRUE(memory.ok()) << take_log();
  allocator.deallocate(*memory, 1);
  EXPECT_NE(take_log().find("on cuda:1 was not allocated by this allocator"), std::string::npos);
  EXPECT_EQ(allocator.live_allocations(), 1u);
  const auto bytes = pattern(256, 3);
  EXPECT_EQ(allocator.copy_host_to_device(*memory, bytes.data(), bytes.size(), 0), et::Error::Ok);
  allocator.deallocate(*memory, 0);
  EXPECT_EQ(allocator.live_allocations(), 0u);
  EXPECT_EQ(take_log(), "");
}

TEST_F(ExecuTorchAllocator, GivenIndexWithoutDevice_WhenAllocating_ThenErrorNamingTheTag) {
  // "cuda:5" has no config entry, so it means plugin cuda, device 5.
  auto buffer = DeviceMemoryBuffer::create(64, DeviceType::CUDA, 5);
  ASSERT_FALSE(buffer.ok());
  EXPECT_NE(take_log().find("cuda:5"), std::string::npos);
}

// A negative index is refused as such, before any tag is made of it.
TEST_F(ExecuTorchAllocator, GivenNegativeIndex_WhenAllocating_ThenRefusedSayingItIsNegative) {
  auto buffer = DeviceMemoryBuffer::create(64, DeviceType::CUDA, -1);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.error(), et::Error::InvalidArgument);
  EXPECT_NE(take_log().find("device index -1 of CUDA is negative"), std::string::npos);
}

TEST_F(ExecuTorchAllocator, GivenRegisteredType_WhenRegisteringAgain_ThenErrorInsteadOfAbort) {
  auto again = devalloc::executorch::register_allocator(
      devalloc::Runtime::create(devalloc::default_config()));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("already has a device allocator for CUDA"),
            std::string::npos);
  EXPECT_EQ(et::get_device_allocator(DeviceType::CUDA), adapter());
}

// Checked at registration, which cannot be taken back: neither a missing
// runtime nor a tag name that no device could have takes the type's slot.
TEST_F(ExecuTorchAllocator, GivenNoRuntimeOrABadTagName_WhenRegistering_ThenRefusedAndTheTypeStaysFree) {
  auto no_runtime = devalloc::executorch::register_allocator(nullptr, DeviceType::CPU, "host");
  ASSERT_FALSE(no_runtime.ok());
  EXPECT_EQ(no_runtime.status().message(), "register_allocator: no runtime (a null pointer)");
  for (const char* name : {"not a tag!", "", "cuda:0", "../x"}) {
    auto bad = devalloc::executorch::register_allocator(
        devalloc::Runtime::create(devalloc::default_config()), DeviceType::CPU, name);
    ASSERT_FALSE(bad.ok()) << name;
    EXPECT_EQ(bad.status().code(), devalloc::StatusCode::invalid_argument);
    EXPECT_NE(bad.status().message().find("is not a device tag name"), std::string::npos)
        << bad.status().message();
  }
  EXPECT_EQ(DeviceAllocatorRegistry::instance().get_allocator(DeviceType::CPU), nullptr);
}

// PLUGIN-11: 0 bytes are address 0; nothing is tracked, and freeing it is
// a no-op, not an error.
// Recovering from a faulted device is dropping its plugin instance
// (DeviceRegistry::drop_plugin): the next use creates a fresh one. The
// adapter follows it for new allocations, and keeps copying to, copying
// from and freeing older memory through the instance that allocated it.
TEST_F(ExecuTorchAllocator, GivenADroppedPluginInstance_ThenNewMemoryComesFromTheFreshOneAndOldMemoryStaysWithItsOwn) {
  auto runtime = own_runtime();
  // Its own adapter and runtime: the registered one is left as it is.
  devalloc::executorch::DevallocDeviceAllocator allocator(runtime, DeviceType::CUDA, "cuda");
  const std::string plugin = on_fake_cuda() ? "cuda" : "host";

  auto old_memory = allocator.allocate(256, 0, 64);
  ASSERT_TRUE(old_memory.ok()) << take_log();
  const auto old_bytes = pattern(256, 11);
  ASSERT_EQ(allocator.copy_host_to_device(*old_memory, old_bytes.data(), 256, 0), et::Error::Ok);
  const auto old_instance = allocator.device(0)->plugin;

  ASSERT_TRUE(runtime->registry().drop_plugin(plugin));
  auto fresh_memory = allocator.allocate(256, 0, 64);
  ASSERT_TRUE(fresh_memory.ok()) << take_log();
  auto fresh_instance = runtime->registry().plugin(plugin);
  ASSERT_TRUE(fresh_instance.ok()) << fresh_instance.status().message();
  EXPECT_NE(*fresh_instance, old_instance);
  EXPECT_EQ(allocator.device(0)->plugin, *fresh_instance) << "the adapter kept the dropped instance";

  const auto fresh_bytes = pattern(256, 99);
  ASSERT_EQ(allocator.copy_host_to_device(*fresh_memory, fresh_bytes.data(), 256, 0), et::Error::Ok);
  EXPECT_EQ(allocator.synchronize(0), et::Error::Ok);
  std::vector<uint8_t> back(256, 0);
  ASSERT_EQ(allocator.copy_device_to_host(back.data(), *old_memory, 256, 0), et::Error::Ok);
  EXPECT_EQ(back, old_bytes);
  ASSERT_EQ(allocator.copy_device_to_host(back.data(), *fresh_memory, 256, 0), et::Error::Ok);
  EXPECT_EQ(back, fresh_bytes);
  allocator.deallocate(*old_memory, 0);
  allocator.deallocate(*fresh_memory, 0);
  EXPECT_EQ(allocator.live_allocations(), 0u);
  EXPECT_EQ(take_log(), "");
}

// synchronize(index) covers every instance that holds memory of the index:
// a failure of the dropped instance's synchronize (the fake's second
// cuStreamSynchronize; the fresh instance's comes first) is reported. On
// the fake CUDA driver whichever backend the registered adapter uses.
TEST_F(ExecuTorchAllocator, GivenMemoryOfADroppedInstance_WhenSynchronizing_ThenThatInstanceIsSynchronizedToo) {
  if (kFakeDriver.empty()) GTEST_SKIP() << "needs the fake CUDA driver's failure injection";
  auto runtime = own_runtime("[plugins.cuda]\noptions = { runtime_library = \"" + kFakeDriver +
                             "\" }\n[devices.\"cuda:0\"]\nuse = [\"cuda\", { index = 1 }]\n");
  devalloc::executorch::DevallocDeviceAllocator allocator(runtime, DeviceType::CUDA, "cuda");
  auto old_memory = allocator.allocate(256, 0, 64);
  ASSERT_TRUE(old_memory.ok()) << take_log();
  ASSERT_TRUE(runtime->registry().drop_plugin("cuda"));
  auto fresh_memory = allocator.allocate(256, 0, 64);
  ASSERT_TRUE(fresh_memory.ok()) << take_log();

  void* fake = ::dlopen(kFakeDriver.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(fake, nullptr);
  using FailAfter = void (*)(const char*, int, int, int);
  auto fail_after = reinterpret_cast<FailAfter>(::dlsym(fake, "devalloc_fake_cuda_fail_calls_after"));
  ASSERT_NE(fail_after, nullptr);
  fail_after("cuStreamSynchronize", 1, 999 /* CUDA_ERROR_UNKNOWN */, 1);
  ::dlclose(fake);
  EXPECT_EQ(allocator.synchronize(0), et::Error::AccessFailed);
  EXPECT_NE(take_log().find("cuStreamSynchronize"), std::string::npos);
  EXPECT_EQ(allocator.synchronize(0), et::Error::Ok);

  allocator.deallocate(*old_memory, 0);
  allocator.deallocate(*fresh_memory, 0);
  EXPECT_EQ(take_log(), "");
}

TEST_F(ExecuTorchAllocator, GivenZeroByteAllocations_ThenNullNothingTrackedAndFreeingIsQuiet) {
  const uint64_t before = adapter()->live_allocations();
  auto first = adapter()->allocate(0, 0, 0);
  auto second = adapter()->allocate(0, 0, 0);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*first, nullptr);
  EXPECT_EQ(*second, nullptr);
  EXPECT_EQ(adapter()->live_allocations(), before);
  adapter()->deallocate(*first, 0);
  adapter()->deallocate(*second, 0);
  EXPECT_EQ(take_log(), "");
  {
    auto buffer = DeviceMemoryBuffer::create(0, DeviceType::CUDA, 0);
    ASSERT_TRUE(buffer.ok()) << take_log();
  }
  EXPECT_EQ(adapter()->live_allocations(), before);
}

// A tensor with no elements has 0 bytes: its buffer is the nullptr a 0-byte
// allocate gave, and copying its 0 bytes in or out is a no-op that succeeds
// (as cudaMemcpy's and PLUGIN-15's), not an error that fails the method.
TEST_F(ExecuTorchAllocator, GivenZeroByteCopies_ThenTheySucceedAsNoOps) {
  auto empty = adapter()->allocate(0, 0);
  ASSERT_TRUE(empty.ok());
  ASSERT_EQ(*empty, nullptr);
  uint8_t host = 0x5A;
  EXPECT_EQ(adapter()->copy_host_to_device(*empty, &host, 0, 0), et::Error::Ok);
  EXPECT_EQ(adapter()->copy_device_to_host(&host, *empty, 0, 0), et::Error::Ok);
  EXPECT_EQ(host, 0x5A);
  EXPECT_EQ(take_log(), "");
  adapter()->deallocate(*empty, 0);
  // A byte or more still needs a live allocation.
  EXPECT_EQ(adapter()->copy_host_to_device(*empty, &host, 1, 0), et::Error::InvalidArgument);
  take_log();
}

TEST(ExecuTorchLogParts, GivenLongUtf8Message_ThenPartsAreShortStartOnASequenceAndJoinToIt) {
  std::string message;
  for (int i = 0; i < 100; ++i) message += "tensor \xc3\xa9\xe2\x82\xac ";  // 2- and 3-byte sequences
  const std::vector<std::string_view> parts = devalloc::executorch::log_parts(message);
  ASSERT_GT(parts.size(), 1u);
  std::string joined;
  for (std::string_view part : parts) {
    EXPECT_LE(part.size(), devalloc::executorch::kLogPartBytes);
    EXPECT_NE(static_cast<unsigned char>(part.front()) & 0xC0, 0x80) << "starts mid-sequence";
    joined += part;
  }
  EXPECT_EQ(joined, message);
  EXPECT_EQ(devalloc::executorch::log_parts("short").size(), 1u);
  EXPECT_EQ(devalloc::executorch::log_parts("").size(), 1u);
}

// The table of docs/integrations/executorch.md, code by code.
TEST(ExecuTorchErrors, GivenEachStatusCode_ThenTheErrorTheDocumentedTableGives) {
  using devalloc::StatusCode;
  using devalloc::executorch::to_executorch_error;
  EXPECT_EQ(to_executorch_error(StatusCode::ok), et::Error::Ok);
  EXPECT_EQ(to_executorch_error(StatusCode::invalid_argument), et::Error::InvalidArgument);
  EXPECT_EQ(to_executorch_error(StatusCode::out_of_device_memory),
            et::Error::MemoryAllocationFailed);
  EXPECT_EQ(to_executorch_error(StatusCode::out_of_host_memory),
            et::Error::MemoryAllocationFailed);
  EXPECT_EQ(to_executorch_error(StatusCode::no_such_device), et::Error::NotFound);
  EXPECT_EQ(to_executorch_error(StatusCode::runtime_unavailable), et::Error::NotSupported);
  EXPECT_EQ(to_executorch_error(StatusCode::unsupported), et::Error::NotSupported);
  EXPECT_EQ(to_executorch_error(StatusCode::device_error), et::Error::AccessFailed);
  EXPECT_EQ(to_executorch_error(StatusCode::internal), et::Error::Internal);
}

}  // namespace
