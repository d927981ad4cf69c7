// Reading what the user named on the command line: the runtime config and
// the plan, and turning failures into messages and exit codes.
#pragma once

#include <devalloc/core/config.hpp>
#include <devalloc/core/job_rank.hpp>
#include <devalloc/core/plan.hpp>
#include <devalloc/core/safetensors.hpp>
#include <devalloc/status.hpp>

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace devalloc::cli {

// Input errors (a bad plan, config or data file) and failed jobs exit
// differently; see docs/cli.md.
inline constexpr int kExitBadInput = 3;

// The config file if one was given (path not empty: add_config_option
// refuses an empty --config), else the defaults; trust_paths
// (--trust-plugin-path) are added to its [security] trust_paths, and a
// refused plugin's message names --trust-plugin-path.
Result<RuntimeConfig> config_from(const std::string& path,
                                  const std::vector<std::string>& trust_paths = {});

// Adds --config FILE to cmd, into *path. An empty FILE is a usage error
// (exit 2), never taken as "no config".
void add_config_option(CLI::App* cmd, std::string* path, const std::string& description);

// Adds --plugin-path DIR (repeatable) to cmd, collected into *dirs; an empty
// DIR is a usage error.
void add_plugin_path_option(CLI::App* cmd, std::vector<std::string>* dirs);

// Adds --trust-plugin-path (repeatable) to cmd, collected into *paths; an
// empty PATH is a usage error.
void add_trust_plugin_path_option(CLI::App* cmd, std::vector<std::string>* paths);

// Reads and validates the plan; source files are opened through cache, and
// a plan's "allow_external_files" is honoured as config's [load]
// external_files says.
// --rank and --world-size of a command that loads or inspects a plan.
struct RankOptions {
  std::optional<uint32_t> rank;
  std::optional<uint32_t> world_size;
};
void add_rank_options(CLI::App* cmd, RankOptions* o);

// The rank this command acts as: --rank (with --world-size, else the
// plan's), else the launcher's environment (torchrun, Open MPI, PMI,
// Slurm); nullopt for a plan without ranks when neither says one. A plan
// for several ranks and no rank from anywhere is an error that says how
// to give one.
Result<std::optional<JobRank>> rank_for(const Plan& plan, const RankOptions& o);

Result<Plan> valid_plan_from(const std::string& path, SafetensorsCache& cache,
                             const RuntimeConfig& config);

// What a command is done with but would only spend time freeing (a plan of
// 100 000 tensors, the headers it was checked against, about 5 % of such a
// run): kept until the process exits, which takes the memory back at once.
// Memory only: nothing whose destructor must run (a loaded program, a
// runtime, an open plugin) goes here.
void keep_until_exit(std::shared_ptr<const void> held) noexcept;

// Prints "devalloc COMMAND: message" to stderr and returns the exit code.
int report_failure(const char* command, const Status& status);

}  // namespace devalloc::cli
