// The subcommands of the `devalloc` program. Each registers itself on the
// CLI11 app and returns the process exit code when run (see docs/cli.md).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace devalloc::cli {

// Exit codes, documented in docs/cli.md.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the job ran and failed
inline constexpr int kExitUsage = 2;    // bad command line

// Adds a subcommand to app; *run is set to its action when it is chosen.
using Action = std::function<int()>;
void add_plugins_command(CLI::App& app, Action* run);
void add_conformance_command(CLI::App& app, Action* run);
void add_plan_command(CLI::App& app, Action* run);
void add_inspect_command(CLI::App& app, Action* run);
void add_load_command(CLI::App& app, Action* run);

}  // namespace devalloc::cli
