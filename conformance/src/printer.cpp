// The suite's result printer. A vendor runs the suite from the installed
// `devalloc` program and has none of its source files, so a failure says
// which PLUGIN rule it checks instead of where in the suite it was found.
// It wraps GoogleTest's own printer and changes only how a failure (or a
// skip) is shown.
#include "suite.hpp"

#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <utility>

namespace devalloc::conformance {
namespace {

std::map<std::string, std::string, std::less<>>& rule_table() {
  static std::map<std::string, std::string, std::less<>> table;
  return table;
}

// "path/to/x_test.cpp:123: " at the start of a line, as GoogleTest writes
// SCOPED_TRACE lines.
std::string without_source_locations(const std::string& text) {
  static const std::regex kLocation(R"(^[^\s:]+\.(cpp|hpp|cc|h):[0-9]+: )",
                                    std::regex::multiline);
  return std::regex_replace(text, kLocation, "  ");
}

class Printer : public ::testing::TestEventListener {
 public:
  explicit Printer(std::unique_ptr<::testing::TestEventListener> inner)
      : inner_(std::move(inner)) {}

  void OnTestProgramStart(const ::testing::UnitTest& u) override {
    inner_->OnTestProgramStart(u);
  }
  void OnTestIterationStart(const ::testing::UnitTest& u, int i) override {
    inner_->OnTestIterationStart(u, i);
  }
  void OnEnvironmentsSetUpStart(const ::testing::UnitTest& u) override {
    inner_->OnEnvironmentsSetUpStart(u);
  }
  void OnEnvironmentsSetUpEnd(const ::testing::UnitTest& u) override {
    inner_->OnEnvironmentsSetUpEnd(u);
  }
  void OnTestSuiteStart(const ::testing::TestSuite& s) override {
    inner_->OnTestSuiteStart(s);
  }
#ifndef GTEST_REMOVE_LEGACY_TEST_CASEAPI_
  void OnTestCaseStart(const ::testing::TestCase& s) override {
    inner_->OnTestCaseStart(s);
  }
#endif
  void OnTestStart(const ::testing::TestInfo& t) override {
    // Kept here: GoogleTest reports a part result under its own lock, so
    // current_test_info() cannot be asked from OnTestPartResult.
    group_ = t.test_suite_name();
    inner_->OnTestStart(t);
  }
  void OnTestDisabled(const ::testing::TestInfo& t) override {
    inner_->OnTestDisabled(t);
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    const std::string message = without_source_locations(result.message());
    if (result.skipped()) {
      std::cout << "Skipped: " << message << "\n" << std::flush;
      return;
    }
    if (!result.failed()) return;
    std::cout << "Failure";
    // A message that names its rule says it best; else the rules the test's
    // group checks.
    if (message.find("PLUGIN-") == std::string::npos) {
      const std::string rules = rules_of(group_);
      std::cout << " (" << (rules.empty() ? "no PLUGIN rule declared" : rules)
                << ")";
    }
    std::cout << "\n" << message << "\n" << std::flush;
  }
  void OnTestEnd(const ::testing::TestInfo& t) override { inner_->OnTestEnd(t); }
  void OnTestSuiteEnd(const ::testing::TestSuite& s) override {
    inner_->OnTestSuiteEnd(s);
  }
#ifndef GTEST_REMOVE_LEGACY_TEST_CASEAPI_
  void OnTestCaseEnd(const ::testing::TestCase& s) override {
    inner_->OnTestCaseEnd(s);
  }
#endif
  void OnEnvironmentsTearDownStart(const ::testing::UnitTest& u) override {
    inner_->OnEnvironmentsTearDownStart(u);
  }
  void OnEnvironmentsTearDownEnd(const ::testing::UnitTest& u) override {
    inner_->OnEnvironmentsTearDownEnd(u);
  }
  void OnTestIterationEnd(const ::testing::UnitTest& u, int i) override {
    inner_->OnTestIterationEnd(u, i);
  }
  void OnTestProgramEnd(const ::testing::UnitTest& u) override {
    inner_->OnTestProgramEnd(u);
  }

 private:
  std::unique_ptr<::testing::TestEventListener> inner_;
  std::string group_;  // of the test running now
};

}  // namespace

bool declare_rules(const char* group, const char* rules) {
  rule_table().emplace(group, rules);
  return true;
}

std::string rules_of(std::string_view group) {
  const auto& table = rule_table();
  const auto it = table.find(group);
  return it == table.end() ? std::string() : it->second;
}

void install_printer() {
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  // NULL when something released it before; then there is nothing to wrap.
  if (::testing::TestEventListener* inner = listeners.default_result_printer()) {
    listeners.Release(inner);
    listeners.Append(
        new Printer(std::unique_ptr<::testing::TestEventListener>(inner)));
  }
}

}  // namespace devalloc::conformance
