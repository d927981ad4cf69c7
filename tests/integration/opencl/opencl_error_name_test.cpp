// The plugin's names for OpenCL error codes, which every failure message
// carries: the codes of OpenCL 1.2 to 3.0 by name, the ICD loader's
// CL_PLATFORM_NOT_FOUND_KHR, and any other value by its number.
#include "cl_runtime.hpp"

#include <gtest/gtest.h>

namespace devalloc::opencl {
namespace {

TEST(OpenClErrorName, CodesOfEveryVersion_AreNamedAsTheHeadersSpellThem) {
  EXPECT_EQ(error_name(CL_SUCCESS), "CL_SUCCESS");
  EXPECT_EQ(error_name(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES");
  EXPECT_EQ(error_name(CL_MEM_OBJECT_ALLOCATION_FAILURE), "CL_MEM_OBJECT_ALLOCATION_FAILURE");
  EXPECT_EQ(error_name(CL_INVALID_OPERATION), "CL_INVALID_OPERATION");
  EXPECT_EQ(error_name(CL_INVALID_BUFFER_SIZE), "CL_INVALID_BUFFER_SIZE");
  // OpenCL 3.0's last core code and the ICD loader's own.
  EXPECT_EQ(error_name(-72), "CL_MAX_SIZE_RESTRICTION_EXCEEDED");
  EXPECT_EQ(error_name(-1001), "CL_PLATFORM_NOT_FOUND_KHR");
}

TEST(OpenClErrorName, CodeNoVersionDefines_IsGivenByItsNumber) {
  EXPECT_EQ(error_name(-9999), "cl_int -9999");
  EXPECT_EQ(error_name(-20), "cl_int -20");
}

}  // namespace
}  // namespace devalloc::opencl
