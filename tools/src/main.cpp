#include "commands.hpp"

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  CLI::App app{"devalloc: put the planned constants of a model into device "
               "memory through vendor plugins"};
  app.require_subcommand(1);
  devalloc::cli::Action action;
  devalloc::cli::add_plugins_command(app, &action);
  devalloc::cli::add_conformance_command(app, &action);
  devalloc::cli::add_plan_command(app, &action);
  devalloc::cli::add_inspect_command(app, &action);
  devalloc::cli::add_load_command(app, &action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return devalloc::cli::kExitUsage;
  }
  try {
    return action();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "devalloc: internal error: %s\n", e.what());
    return devalloc::cli::kExitFailure;
  }
}
