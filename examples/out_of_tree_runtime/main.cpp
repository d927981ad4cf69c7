// Writes a two-tensor model, plans it onto "host" and loads it through the
// installed host plugin, then reads a tensor back and compares.
//   example_runtime DIR     (a writable folder for the model)
#include <devalloc/core/plan.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/core/safetensors.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::vector<std::byte> weight(4096), bias(64);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = std::byte(i * 7);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = std::byte(255 - i);
  const std::vector<devalloc::SafetensorsWriteTensor> tensors = {
      {"weight", devalloc::DType::f32, {32, 32}, weight},
      {"bias", devalloc::DType::f32, {16}, bias}};
  if (auto s = devalloc::write_safetensors(dir / "model.safetensors", tensors); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  const std::vector<std::filesystem::path> files = {dir / "model.safetensors"};
  // One cache for the plan and the load: each header is read once.
  devalloc::SafetensorsCache cache;
  devalloc::PlanBuildOptions options;
  options.cache = &cache;
  auto plan = devalloc::build_plan(files, dir / "plan.json", options);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().message().c_str());
    return 1;
  }
  devalloc::RuntimeConfig config = devalloc::default_config();
  config.plugin_path.push_back(EXAMPLE_PLUGIN_DIR);
  auto runtime = devalloc::Runtime::create(config);
  devalloc::LoadReport report;
  auto program = runtime->load(std::move(*plan), {.report = &report, .files = &cache});
  if (!program.ok()) {
    std::fprintf(stderr, "%s\n", program.status().message().c_str());
    return 1;
  }
  // What the load tolerated but a user should hear of (a plugin's late
  // releases, say).
  for (const std::string& line : devalloc::load_warnings(report)) {
    std::fprintf(stderr, "warning: %s\n", line.c_str());
  }
  const std::optional<devalloc::LoadedTensor> w = (*program)->find("weight");
  std::vector<std::byte> back(weight.size());
  if (!w || !w->device().plugin->copy_to_host(w->device().device, back.data(), w->address(),
                                              back.size()).ok() ||
      back != weight) {
    std::fprintf(stderr, "weight did not load right\n");
    return 1;
  }
  std::printf("loaded %llu constants (%llu bytes) on %s\n",
              static_cast<unsigned long long>(report.constants),
              static_cast<unsigned long long>(report.bytes), w->device().describe().c_str());
  return 0;
}
