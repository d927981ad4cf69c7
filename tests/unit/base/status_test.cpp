#include <devalloc/status.hpp>

#include <gtest/gtest.h>

#include <cerrno>

#include <memory>
#include <stdexcept>
#include <string>

namespace devalloc {
namespace {

Result<std::string> failed() {
  return Status(StatusCode::invalid_argument, "devalloc.toml: cannot open: No such file");
}

// `read_config("devalloc.toml").value()` on a missing file ended the
// program with std::bad_variant_access ("wrong index for variant") and no
// word of devalloc's message.
TEST(StatusCodeFromErrno, GivenEachKindOfFileFailure_ThenItsCode) {
  EXPECT_EQ(status_code_from_errno(ENOENT), StatusCode::not_found);
  EXPECT_EQ(status_code_from_errno(ENOTDIR), StatusCode::not_found);
  EXPECT_EQ(status_code_from_errno(EACCES), StatusCode::permission_denied);
  EXPECT_EQ(status_code_from_errno(EMFILE), StatusCode::out_of_host_memory);
  EXPECT_EQ(status_code_from_errno(EIO), StatusCode::io_error);
  EXPECT_EQ(status_code_from_errno(EISDIR), StatusCode::invalid_argument);
  EXPECT_STREQ(to_string(StatusCode::data_loss), "data_loss");
  EXPECT_STREQ(to_string(StatusCode::not_found), "not_found");
}

TEST(ResultValue, GivenError_WhenTakingTheValue_ThenDevallocErrorWithTheStatusMessage) {
  const Result<std::string> result = failed();
  try {
    (void)result.value();
    FAIL() << "value() returned";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "devalloc.toml: cannot open: No such file");
    EXPECT_EQ(error.status().code(), StatusCode::invalid_argument);
    EXPECT_EQ(error.status().message(), "devalloc.toml: cannot open: No such file");
  }
}

TEST(ResultValue, GivenError_WhenTakingItAnyWay_ThenEachThrowsARuntimeError) {
  Result<std::string> result = failed();
  EXPECT_THROW((void)result.value(), std::runtime_error);
  EXPECT_THROW((void)*result, Error);
  EXPECT_THROW((void)result->size(), Error);
  EXPECT_THROW((void)std::move(result).value(), Error);
  EXPECT_THROW((void)*failed(), Error);
}

TEST(ResultValue, GivenValue_WhenTakingIt_ThenItIsThereAndMoveOnlyValuesMove) {
  Result<std::string> text = std::string("w");
  EXPECT_EQ(text.value(), "w");
  EXPECT_EQ(text->size(), 1u);
  Result<std::unique_ptr<int>> owned = std::make_unique<int>(7);
  std::unique_ptr<int> taken = std::move(owned).value();
  EXPECT_EQ(*taken, 7);
}

}  // namespace
}  // namespace devalloc
