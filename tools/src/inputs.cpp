#include "inputs.hpp"

#include "commands.hpp"

#include <cstdio>
#include <filesystem>

namespace devalloc::cli {

Result<RuntimeConfig> config_from(const std::string& path,
                                  const std::vector<std::string>& trust_paths) {
  Result<RuntimeConfig> config = path.empty() ? default_config() : read_config(path);
  if (config.ok()) {
    for (const auto& p : trust_paths) {
      config->trust_paths.push_back(std::filesystem::absolute(p).lexically_normal());
    }
  }
  return config;
}

void add_trust_plugin_path_option(CLI::App* cmd, std::vector<std::string>* paths) {
  cmd->add_option("--trust-plugin-path", *paths,
                  "Plugins at or below this path skip the owner and permission "
                  "checks; ignored when running with elevated privileges "
                  "(repeatable; docs/security.md)");
}

Result<Plan> valid_plan_from(const std::string& path, SafetensorsCache& cache) {
  auto plan = read_plan(path);
  if (!plan.ok()) return plan.status();
  PlanValidationOptions options;
  options.cache = &cache;
  if (Status s = validate_plan(*plan, options); !s.ok()) return s;
  return plan;
}

int report_failure(const char* command, const Status& status) {
  std::fprintf(stderr, "devalloc %s: %s\n", command, status.message().c_str());
  return status.code() == StatusCode::invalid_argument ? kExitBadInput
                                                       : kExitFailure;
}

}  // namespace devalloc::cli
