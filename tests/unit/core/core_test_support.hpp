// Helpers shared by the core unit tests: scratch folders (scratch_dir.hpp), raw files, and
// config texts that must or must not parse.
#pragma once

#include <devalloc/core/config.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include <sys/wait.h>

#include "scratch_dir.hpp"

namespace devalloc::test {

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A safetensors file made by hand: the length of `header`, `header`, then
// `data_bytes` bytes counting up from 0.
inline std::string safetensors_bytes(std::string_view header, size_t data_bytes) {
  std::string out;
  const uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((length >> (8 * i)) & 0xff);
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out += static_cast<char>(i & 0xff);
  return out;
}

// Runs tests/unit/core/write_reference.py with the reference safetensors
// package; returns its exit status (0 on success).
inline int run_reference_script(const std::string& arguments) {
  if (!std::filesystem::exists(DEVALLOC_TEST_PYTHON)) {
    ADD_FAILURE() << "the reference Python writer " << DEVALLOC_TEST_PYTHON
                  << " is missing (CMake warned at configure time): run "
                     "scripts/setup.sh, or configure with "
                     "-DDEVALLOC_TEST_PYTHON=/path/to/python";
    return 127;
  }
  const std::string command = std::string("'") + DEVALLOC_TEST_PYTHON + "' '" +
                              DEVALLOC_SOURCE_DIR +
                              "/tests/unit/core/write_reference.py' " + arguments;
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The name config texts are parsed under in the tests: errors start with it.
inline constexpr std::string_view kConfigSource = "/cfg/devalloc.toml";

// The error message parse_config gives for text, which must not parse.
inline std::string config_error_of(std::string_view text) {
  auto result = parse_config(text, kConfigSource);
  EXPECT_FALSE(result.ok()) << "parsed, but should not:\n" << text.substr(0, 300);
  if (result.ok()) return {};
  EXPECT_EQ(result.status().code(), StatusCode::invalid_argument);
  return result.status().message();
}

// The config text must parse; the defaults when it does not.
inline RuntimeConfig parsed_config(std::string_view text) {
  auto result = parse_config(text, kConfigSource);
  EXPECT_TRUE(result.ok()) << result.status().message();
  return result.ok() ? std::move(result).value() : RuntimeConfig{};
}

}  // namespace devalloc::test
