// A tiny model written into a temporary folder, a plan over it, and helpers
// to load it through the real loader and host plugins.
#pragma once

#include <devalloc/core/config.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/core/safetensors.hpp>

#include <gtest/gtest.h>

#include "scratch_dir.hpp"


#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace devalloc::testing {

inline const std::filesystem::path kZooDir = DEVALLOC_PLUGIN_ZOO_DIR;

// Weights are contiguous in the file and in their buffer when aligned
// sizes are used: w.a (256 B) and w.b (512 B) are shared by both methods,
// head (256 B) only by "decode"; scratch is planned memory without data.
class LoadFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    add_tensor("w.a", DType::f32, {64});
    add_tensor("w.b", DType::f16, {16, 16});
    add_tensor("head", DType::bf16, {128});
    add_tensor("empty", DType::f32, {0});
    std::vector<SafetensorsWriteTensor> out;
    for (const auto& name : order_) {
      out.push_back({name, dtypes_[name], shapes_[name], bytes_[name]});
    }
    ASSERT_TRUE(write_safetensors(dir_ / "model.safetensors", out).ok());

    plan_.path = dir_ / "plan.json";
    plan_.buffers = {{0, "host", 768, 256, std::nullopt}, {1, "host", 256, 256, std::nullopt}, {2, "host", 1024, 256, std::nullopt}};
    plan_.tensors = {
        constant("w.a", 0, 0), constant("w.b", 0, 256), constant("head", 1, 0),
        constant("empty", 0, 768),
        PlanTensor{"scratch", DType::u8, {1024}, 2, 0, std::nullopt}};
    plan_.methods = {{"prefill", {0, 2}, {"w.a", "w.b", "empty", "scratch"}},
                     {"decode", {0, 1, 2}, {"w.a", "w.b", "head", "empty", "scratch"}}};
    ASSERT_TRUE(validate_plan(plan_).ok()) << validate_plan(plan_).message();
  }

  // Parses a config given as TOML text, written as a file of the test dir.
  RuntimeConfig config(const std::string& toml) {
    auto parsed = parse_config(toml, (dir_ / "devalloc.toml").string());
    EXPECT_TRUE(parsed.ok()) << parsed.status().message();
    return parsed.ok() ? *parsed : default_config();
  }

  // The bytes of a loaded tensor, read back through its plugin.
  std::vector<std::byte> read_back(const LoadedTensor& t) {
    std::vector<std::byte> out(t.nbytes());
    Status s = t.device().plugin->copy_to_host(t.device().device, out.data(),
                                               t.address(), t.nbytes());
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }

  const std::vector<std::byte>& source(const std::string& name) { return bytes_[name]; }
  Plan& plan() { return plan_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  void add_tensor(const std::string& name, DType dtype, std::vector<uint64_t> shape) {
    const uint64_t n = *byte_size(dtype, shape);
    std::vector<std::byte> data(n);
    for (uint64_t i = 0; i < n; ++i) {
      data[i] = static_cast<std::byte>((i * 131 + name.size() * 17 + name[0]) & 0xff);
    }
    order_.push_back(name);
    dtypes_[name] = dtype;
    shapes_[name] = std::move(shape);
    bytes_[name] = std::move(data);
  }

  PlanTensor constant(const std::string& name, uint32_t memory_id, uint64_t offset) {
    return PlanTensor{name, dtypes_[name], shapes_[name], memory_id, offset,
                      PlanSource{"model.safetensors", name, std::nullopt}};
  }

  test::ScratchDir scratch_{"load"};
  const std::filesystem::path dir_ = scratch_.path();
  Plan plan_;
  std::vector<std::string> order_;
  std::map<std::string, DType> dtypes_;
  std::map<std::string, std::vector<uint64_t>> shapes_;
  std::map<std::string, std::vector<std::byte>> bytes_;
};

}  // namespace devalloc::testing
