#include "inputs.hpp"

#include <devalloc/input_text.hpp>

#include "commands.hpp"

#include <cstdio>
#include <filesystem>
#include <new>
#include <utility>
#include <vector>

namespace devalloc::cli {

Result<RuntimeConfig> config_from(const std::string& path,
                                  const std::vector<std::string>& trust_paths) {
  Result<RuntimeConfig> config = path.empty() ? default_config() : read_config(path);
  if (config.ok()) {
    config->trust_path_option = "--trust-plugin-path";
    for (const auto& p : trust_paths) {
      config->trust_paths.push_back(std::filesystem::absolute(p).lexically_normal());
    }
  }
  return config;
}

namespace {

// A CLI11 check refusing an empty value: "" would otherwise mean the
// current directory (an absolute path of nothing) or no file at all.
auto non_empty(std::string why) {
  return [why = std::move(why)](const std::string& text) {
    return text.empty() ? "an empty path " + why : std::string();
  };
}

}  // namespace

void add_config_option(CLI::App* cmd, std::string* path, const std::string& description) {
  cmd->add_option("--config", *path, description)
      ->check(non_empty("names no config; leave --config out for the defaults"));
}

void add_plugin_path_option(CLI::App* cmd, std::vector<std::string>* dirs) {
  cmd->add_option("--plugin-path", *dirs, "Extra directory searched first (repeatable)")
      ->check(non_empty("names no folder; write . for the current one"));
}

void add_trust_plugin_path_option(CLI::App* cmd, std::vector<std::string>* paths) {
  cmd->add_option("--trust-plugin-path", *paths,
                  "Plugins at or below this path skip the owner and permission "
                  "checks; ignored when running with elevated privileges "
                  "(repeatable; docs/security.md)")
      ->check(non_empty("names nothing to trust; write . for the current folder"));
}

void add_rank_options(CLI::App* cmd, RankOptions* o) {
  cmd->add_option("--rank", o->rank,
                  "This process's rank in a job of a plan made with --world-size (default: "
                  "the launcher's, from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)");
  cmd->add_option("--world-size", o->world_size,
                  "The job's rank count (default: the launcher's, else the plan's)")
      ->check(CLI::Range(1u, 1u << 20));
}

Result<std::optional<JobRank>> rank_for(const Plan& plan, const RankOptions& o) {
  if (o.rank || o.world_size) {
    if (!o.rank) {
      return Status(StatusCode::invalid_argument, "--world-size needs --rank");
    }
    JobRank rank;
    rank.rank = *o.rank;
    rank.world_size = o.world_size.value_or(plan.world_size == 0 ? 1 : plan.world_size);
    rank.local_rank = rank.rank;
    rank.source = "--rank " + std::to_string(rank.rank);
    if (Status s = check_rank(rank); !s.ok()) return s;
    return std::optional<JobRank>(rank);
  }
  Result<std::optional<JobRank>> launched = rank_from_environment();
  if (!launched.ok() || launched->has_value() || plan.world_size == 0) return launched;
  return Status(StatusCode::invalid_argument,
                path_for_message(plan.path.string()) + ": the plan is for a job of " +
                    std::to_string(plan.world_size) +
                    " ranks: give --rank R, or launch under torchrun, mpirun or srun");
}

Result<Plan> valid_plan_from(const std::string& path, SafetensorsCache& cache,
                             const RuntimeConfig& config) {
  auto plan = read_plan(path);
  if (!plan.ok()) return plan.status();
  PlanValidationOptions options;
  options.cache = &cache;
  options.external_files = config.load.external_files;
  if (Status s = validate_plan(*plan, options); !s.ok()) return s;
  return plan;
}

void keep_until_exit(std::shared_ptr<const void> held) noexcept {
  // Never freed: reachable from here until the process ends.
  static auto* kept = new (std::nothrow) std::vector<std::shared_ptr<const void>>();
  if (kept == nullptr) return;
  try {
    kept->push_back(std::move(held));
  } catch (const std::bad_alloc&) {
    // Not kept: freed here, as it would have been without this.
  }
}

int report_failure(const char* command, const Status& status) {
  std::fprintf(stderr, "devalloc %s: %s\n", command, status.message().c_str());
  // What the user gave is wrong or not there: bad input. The rest (a
  // device, a plugin, a read that failed, data lost) is a failed job.
  switch (status.code()) {
    case StatusCode::invalid_argument:
    case StatusCode::not_found:
    case StatusCode::permission_denied:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

}  // namespace devalloc::cli
