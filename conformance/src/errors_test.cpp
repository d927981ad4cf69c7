// PLUGIN-6: every failure writes a non-empty, NUL-terminated message into the
// caller's devalloc_error; a success leaves it alone; a NULL error is allowed.
// Called through the raw table, because the loader's handle fills in a
// message of its own when a plugin gives none.
#include "suite.hpp"

#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace devalloc::conformance {
namespace {

class Errors : public DeviceTest {
 protected:
  struct FailingCall {
    std::string call;
    devalloc_status expected;
    std::function<devalloc_status(devalloc_error*)> invoke;
  };

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DeviceTest::SetUp());
    Result<uint64_t> base = plugin().allocate(kDevice, kSize, 0);
    ASSERT_OK(base);
    base_ = *base;
    host_ = &keep_past_destroy<std::vector<uint8_t>>(2 * kSize);
  }

  // Each with slack after it, as every struct the suite hands out.
  WithSlack<devalloc_allocate_args> allocate_args(uint32_t device, uint64_t nbytes,
                                                  uint64_t alignment) const {
    WithSlack<devalloc_allocate_args> buffer;
    devalloc_allocate_args& args = *buffer;
    args.struct_size = sizeof args;
    args.device = device;
    args.nbytes = nbytes;
    args.alignment = alignment;
    return buffer;
  }
  WithSlack<devalloc_copy_to_device_args> to_device_args(uint32_t device, uint64_t dst,
                                                         const void* src, uint64_t nbytes,
                                                         uint32_t lifetime) const {
    WithSlack<devalloc_copy_to_device_args> buffer;
    devalloc_copy_to_device_args& args = *buffer;
    args.struct_size = sizeof args;
    args.device = device;
    args.src_lifetime = lifetime;
    args.dst = dst;
    args.src = src;
    args.nbytes = nbytes;
    return buffer;
  }
  WithSlack<devalloc_copy_to_host_args> to_host_args(uint32_t device, void* dst,
                                                     uint64_t src, uint64_t nbytes) const {
    WithSlack<devalloc_copy_to_host_args> buffer;
    devalloc_copy_to_host_args& args = *buffer;
    args.struct_size = sizeof args;
    args.device = device;
    args.src = src;
    args.dst = dst;
    args.nbytes = nbytes;
    return buffer;
  }

  std::vector<FailingCall> failing_calls();

  static constexpr uint64_t kSize = 4096;
  uint64_t base_ = 0;
  std::vector<uint8_t>* host_ = nullptr;
};
DEVALLOC_CONFORMANCE_RULES(Errors, "PLUGIN-6");

std::vector<Errors::FailingCall> Errors::failing_calls() {
  const devalloc_plugin_api_v1* const t = &api();
  devalloc_instance* const in = instance();
  const uint32_t count = device_count();
  std::vector<FailingCall> calls = {
      {"allocate(alignment = 3)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=, this](devalloc_error* e) {
         auto args = allocate_args(kDevice, 64, 3);
         return t->allocate(in, args.get(), e);
       }},
      {"allocate(nbytes = UINT64_MAX)", DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
       [=, this](devalloc_error* e) {
         auto args = allocate_args(kDevice, std::numeric_limits<uint64_t>::max(), 0);
         return t->allocate(in, args.get(), e);
       }},
      {"allocate(device = count)", DEVALLOC_STATUS_NO_SUCH_DEVICE,
       [=, this](devalloc_error* e) {
         auto args = allocate_args(count, 64, 0);
         return t->allocate(in, args.get(), e);
       }},
      {"deallocate(base + 1)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=, this](devalloc_error* e) { return t->deallocate(in, kDevice, base_ + 1, e); }},
      {"deallocate(device = count)", DEVALLOC_STATUS_NO_SUCH_DEVICE,
       [=](devalloc_error* e) { return t->deallocate(in, count, 0, e); }},
      {"copy_host_to_device(range past the end)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=, this](devalloc_error* e) {
         auto args = to_device_args(kDevice, base_, host_->data(), kSize + 1,
                                    DEVALLOC_SRC_DURING_CALL);
         return t->copy_host_to_device(in, args.get(), e);
       }},
      {"copy_host_to_device(src = NULL)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=, this](devalloc_error* e) {
         auto args = to_device_args(kDevice, base_, nullptr, 16,
                                    DEVALLOC_SRC_DURING_CALL);
         return t->copy_host_to_device(in, args.get(), e);
       }},
      {"copy_host_to_device(src_lifetime = 2)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=, this](devalloc_error* e) {
         auto args = to_device_args(kDevice, base_, host_->data(), 16, 2);
         return t->copy_host_to_device(in, args.get(), e);
       }},
      {"copy_host_to_device(device = count)", DEVALLOC_STATUS_NO_SUCH_DEVICE,
       [=, this](devalloc_error* e) {
         auto args = to_device_args(count, base_, host_->data(), 16,
                                    DEVALLOC_SRC_DURING_CALL);
         return t->copy_host_to_device(in, args.get(), e);
       }},
      {"copy_device_to_host(range past the end)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=, this](devalloc_error* e) {
         auto args = to_host_args(kDevice, host_->data(), base_ + 1, kSize);
         return t->copy_device_to_host(in, args.get(), e);
       }},
      {"copy_device_to_host(dst = NULL)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=, this](devalloc_error* e) {
         auto args = to_host_args(kDevice, nullptr, base_, 16);
         return t->copy_device_to_host(in, args.get(), e);
       }},
      {"copy_device_to_host(device = count)", DEVALLOC_STATUS_NO_SUCH_DEVICE,
       [=, this](devalloc_error* e) {
         auto args = to_host_args(count, host_->data(), base_, 16);
         return t->copy_device_to_host(in, args.get(), e);
       }},
      {"synchronize(device = count)", DEVALLOC_STATUS_NO_SUCH_DEVICE,
       [=](devalloc_error* e) { return t->synchronize(in, count, e); }},
      {"get_device_properties(device = count)", DEVALLOC_STATUS_NO_SUCH_DEVICE,
       [=](devalloc_error* e) {
         WithSlack<devalloc_device_properties> p;
         p->struct_size = sizeof *p;
         return t->get_device_properties(in, count, p.get(), e);
       }},
      {"get_capabilities(NULL)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=](devalloc_error* e) { return t->get_capabilities(in, nullptr, e); }},
      {"get_device_count(NULL)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=](devalloc_error* e) { return t->get_device_count(in, nullptr, e); }},
      {"create(unknown option)", DEVALLOC_STATUS_INVALID_ARGUMENT,
       [=](devalloc_error* e) {
         std::vector<const char*> keys;
         std::vector<const char*> values;
         for (const auto& [key, value] : target().options) {
           keys.push_back(key.c_str());
           values.push_back(value.c_str());
         }
         keys.push_back("devalloc_conformance_bogus_option");
         values.push_back("1");
         WithSlack<devalloc_create_args> buffer;
         devalloc_create_args& args = *buffer;
         args.struct_size = sizeof args;
         args.option_keys = keys.data();
         args.option_values = values.data();
         args.option_count = keys.size();
         const devalloc_status status = t->create(&args, e);
         if (status == DEVALLOC_STATUS_OK) t->destroy(args.instance);
         return status;
       }},
  };
  const uint64_t max_alignment = plugin().capabilities().max_alignment;
  if (max_alignment <= std::numeric_limits<uint64_t>::max() / 2) {
    calls.push_back({"allocate(alignment above max_alignment)",
                     DEVALLOC_STATUS_UNSUPPORTED,
                     [=, this](devalloc_error* e) {
                       auto args = allocate_args(kDevice, 64, max_alignment * 2);
                       return t->allocate(in, args.get(), e);
                     }});
  }
  if (plugin().capabilities().host_staging) {
    calls.push_back({"free_host(pointer not from allocate_host)",
                     DEVALLOC_STATUS_INVALID_ARGUMENT,
                     [=, this](devalloc_error* e) {
                       return t->free_host(in, host_->data(), e);
                     }});
  }
  return calls;
}

TEST_F(Errors, EveryFailure_WritesANonEmptyNulTerminatedMessage) {
  for (const FailingCall& call : failing_calls()) {
    SCOPED_TRACE(call.call);
    RawError error;
    EXPECT_TRUE(RawFailure(call.invoke(error.get()), call.expected, error));
  }
}

TEST_F(Errors, EveryFailureWithoutAnErrorBuffer_StillReportsItsStatus) {
  for (const FailingCall& call : failing_calls()) {
    EXPECT_EQ(call.invoke(nullptr), call.expected) << call.call;
  }
}

TEST_F(Errors, EverySuccess_LeavesTheErrorBufferUntouched) {
  const auto& t = api();
  devalloc_instance* const in = instance();
  std::vector<std::pair<std::string, std::function<devalloc_status(devalloc_error*)>>>
      calls = {
          {"get_capabilities", [&](devalloc_error* e) {
             WithSlack<devalloc_capabilities> c;
             c->struct_size = sizeof *c;
             return t.get_capabilities(in, c.get(), e);
           }},
          {"get_device_count", [&](devalloc_error* e) {
             uint32_t count = 0;
             return t.get_device_count(in, &count, e);
           }},
          {"get_device_properties", [&](devalloc_error* e) {
             WithSlack<devalloc_device_properties> p;
             p->struct_size = sizeof *p;
             return t.get_device_properties(in, kDevice, p.get(), e);
           }},
          {"copy_host_to_device", [&](devalloc_error* e) {
             auto args = to_device_args(kDevice, base_, host_->data(), kSize,
                                        DEVALLOC_SRC_DURING_CALL);
             return t.copy_host_to_device(in, args.get(), e);
           }},
          {"copy_device_to_host", [&](devalloc_error* e) {
             auto args = to_host_args(kDevice, host_->data(), base_, kSize);
             return t.copy_device_to_host(in, args.get(), e);
           }},
          {"synchronize", [&](devalloc_error* e) { return t.synchronize(in, kDevice, e); }},
          {"deallocate", [&](devalloc_error* e) {
             return t.deallocate(in, kDevice, base_, e);
           }},
      };
  for (const auto& [call, invoke] : calls) {
    RawError error;
    EXPECT_EQ(invoke(error.get()), DEVALLOC_STATUS_OK) << call << ": " << error.text();
    EXPECT_TRUE(error.untouched()) << call << " succeeded but wrote the message";
  }
}

}  // namespace
}  // namespace devalloc::conformance
