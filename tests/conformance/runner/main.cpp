// devalloc_conformance_runner PLUGIN [--option KEY=VALUE]... [--gtest_*]...
// The conformance suite without the CLI, for the project's own tests and for
// debugging a plugin under gdb or valgrind.
#include <devalloc/conformance.hpp>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  constexpr const char* kUsage =
      "usage: devalloc_conformance_runner PLUGIN [--option KEY=VALUE]... "
      "[--gtest_*]...\n";
  if (argc < 2 || argv[1][0] == '-') {
    std::cerr << kUsage;
    return 2;
  }
  devalloc::conformance::Target target{argv[1], {}};
  std::vector<char*> gtest_args{argv[0]};
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--option") != 0) {
      gtest_args.push_back(argv[i]);
      continue;
    }
    const std::string option = i + 1 < argc ? argv[++i] : "";
    const auto equals = option.find('=');
    if (equals == std::string::npos || equals == 0) {
      std::cerr << "--option needs KEY=VALUE, got \"" << option << "\"\n"
                << kUsage;
      return 2;
    }
    target.options.emplace_back(option.substr(0, equals),
                                option.substr(equals + 1));
  }
  gtest_args.push_back(nullptr);
  return devalloc::conformance::run(
      target, static_cast<int>(gtest_args.size() - 1), gtest_args.data());
}
