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

// The loader finds a plugin by name only as libdevalloc_NAME.so, NAME being
// the plugin_name of its own table.
void warn_if_misnamed(const Plugin& plugin) {
  const std::string expected = PluginLoader::file_name_for(plugin.name());
  const std::string actual = plugin.path().filename().string();
  if (actual == expected) return;
  std::cout << "[ WARNING  ] warning: the file is named " << actual << ", but plugin \""
            << plugin.name() << "\" is found by name only as " << expected
            << ": rename the file, or configure it with [plugins." << plugin.name()
            << "] library = \"" << plugin.path().string() << "\"" << std::endl;
}

// A group that declares no rule would print failures that name none.
bool every_group_names_its_rules() {
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  bool all = true;
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const char* group = unit.GetTestSuite(i)->name();
    if (rules_of(group).empty()) {
      std::cerr << "devalloc conformance: test group " << group
                << " declares no PLUGIN rule (DEVALLOC_CONFORMANCE_RULES)\n";
      all = false;
    }
  }
  return all;
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
  if (!every_group_names_its_rules()) return 1;
  install_printer();
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
    warn_if_misnamed(*plugin);
  }
  return RUN_ALL_TESTS() == 0 ? 0 : 1;
}

}  // namespace devalloc::conformance
