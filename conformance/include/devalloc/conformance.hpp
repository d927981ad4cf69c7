// The plugin conformance suite: every rule of docs/abi.md that a test can
// observe from the host side, run against one plugin. Used by
// `devalloc conformance PLUGIN` so that a vendor can check their own plugin.
#pragma once

#include <devalloc/plugin.hpp>

#include <string>

namespace devalloc::conformance {

struct Target {
  // A path (contains '/' or ends in ".so") or a plugin name that
  // PluginLoader resolves on the default search path.
  std::string plugin;
  // Passed to create() on every load of the plugin.
  PluginOptions options;
};

// Runs the whole suite against target with GoogleTest; every test loads the
// plugin afresh. argv is laid out as main() receives it: argv[0] is the
// program name, the rest are --gtest_* flags (--gtest_filter=DuringCall.*,
// --gtest_repeat=N, ...); any other argument is refused. Call it at most once
// per process: GoogleTest supports a single run. Returns 0 when every test
// passed, 1 when one failed or the plugin cannot be loaded, 2 for an
// argument it does not know.
int run(const Target& target, int argc, char** argv);

}  // namespace devalloc::conformance
