// Scratch folders for tests, one machinery for every test executable.
//
// Every ScratchDir of a test process lies under one root,
// <temp>/devalloc-tests-<pid>, which the process removes when it exits.
// A death test's child (GoogleTest's "threadsafe" style runs the test again
// in a new process and ends it with _exit, so no destructor runs there) puts
// its folders under its parent's root instead, and the parent removes them
// with its own. Without this, every death test of a fixture that makes a
// folder left one behind in /tmp.
#pragma once

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace devalloc::test {

namespace scratch_detail {

inline std::filesystem::path root_of(pid_t pid) {
  return std::filesystem::temp_directory_path() / ("devalloc-tests-" + std::to_string(pid));
}

// Removes this process's root when the process exits normally. A death
// test's child ends with _exit and removes nothing.
struct RootRemover {
  pid_t owner = ::getpid();
  ~RootRemover() {
    if (::getpid() != owner) return;  // a forked child that did return
    std::error_code ignored;
    std::filesystem::remove_all(root_of(owner), ignored);
  }
};
inline RootRemover root_remover;

// Whether this process is a death test's child: re-run from the start
// (the flag GoogleTest passes it; InDeathTestChild() alone answers from the
// death_test_style flag, which a test sets after its SetUp has run), or
// forked in the middle of the test ("fast" style).
inline bool in_death_test_child() {
  return !GTEST_FLAG_GET(internal_run_death_test).empty() ||
         ::testing::internal::InDeathTestChild();
}

// The root this process's folders go under, made on first use.
inline std::filesystem::path root() {
  const pid_t owner = in_death_test_child() ? ::getppid() : ::getpid();
  std::filesystem::path path = root_of(owner);
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    ADD_FAILURE() << "cannot make the tests' scratch root " << path << ": "
                  << std::strerror(errno);
  }
  return path;
}

}  // namespace scratch_detail

// A fresh, empty folder, removed with everything in it when this goes.
// `prefix` names the folder, for a person who looks while a test runs.
class ScratchDir {
 public:
  explicit ScratchDir(std::string_view prefix = "scratch") {
    std::string pattern = (scratch_detail::root() / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed for " << pattern << ": " << std::strerror(errno);
    }
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& name) const {
    return path_ / name;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace devalloc::test
