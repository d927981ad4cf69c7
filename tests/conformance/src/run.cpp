#include <devalloc/conformance.hpp>
#include <devalloc/plugin_loader.hpp>

#include "suite.hpp"

#include <gtest/gtest.h>

#include <iostream>

namespace devalloc::conformance {
namespace {

// One line that says what is under test, so that a saved log stands alone.
void describe(const Plugin& plugin) {
  std::cout << "[ PLUGIN   ] " << plugin.name() << " " << plugin.version()
            << ", ABI " << plugin.abi_major() << "." << plugin.abi_minor()
            << ", " << plugin.path().string() << ", "
            << plugin.devices().size() << " device(s)";
  for (const auto& [key, value] : target().options) {
    std::cout << ", " << key << "=" << value;
  }
  std::cout << std::endl;
}

}  // namespace

int run(const Target& target, int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) {
    std::cerr << "devalloc conformance: unknown argument \"" << argv[1]
              << "\" (GoogleTest flags start with --gtest_)\n";
    return 2;
  }
  set_target(target);
  // Every test would fail with the same reason; say it once instead.
  if (!GTEST_FLAG_GET(list_tests)) {
    auto [plugin, error] = PluginLoader().load(target.plugin, target.options);
    if (!plugin) {
      std::cerr << "devalloc conformance: cannot load " << target.plugin
                << " (" << to_string(error.outcome)
                << "): " << error.status.message() << "\n";
      return 1;
    }
    describe(*plugin);
  }
  return RUN_ALL_TESTS() == 0 ? 0 : 1;
}

}  // namespace devalloc::conformance
