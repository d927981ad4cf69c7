// The OpenCL ICD loader as this plugin sees it: a library opened at run time
// (no link-time dependency on libOpenCL), each API function looked up by
// name, and every cl_int other than CL_SUCCESS turned into a Failure that
// names the call, its arguments and the error code by its symbolic name.
// Only OpenCL 1.2 entry points are used, so that any conformant 1.2 driver
// serves.
#pragma once

#include <CL/cl.h>

#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>
#include <string>

namespace devalloc::opencl {

#define DEVALLOC_CL_ENTRY_POINTS(X) \
  X(clGetPlatformIDs)               \
  X(clGetPlatformInfo)              \
  X(clGetDeviceIDs)                 \
  X(clGetDeviceInfo)                \
  X(clCreateContext)                \
  X(clReleaseContext)               \
  X(clCreateCommandQueue)           \
  X(clReleaseCommandQueue)          \
  X(clCreateBuffer)                 \
  X(clRetainMemObject)              \
  X(clReleaseMemObject)             \
  X(clEnqueueMigrateMemObjects)     \
  X(clEnqueueWriteBuffer)           \
  X(clEnqueueReadBuffer)            \
  X(clEnqueueMapBuffer)             \
  X(clEnqueueUnmapMemObject)        \
  X(clSetEventCallback)             \
  X(clWaitForEvents)                \
  X(clGetEventInfo)                 \
  X(clReleaseEvent)                 \
  X(clFlush)                        \
  X(clFinish)

// "CL_OUT_OF_RESOURCES", or "cl_int -1234" for a code this plugin does not
// know (a vendor extension's).
std::string error_name(cl_int code);

class Runtime {
 public:
  // Opens `path` and looks up every entry point. Throws Failure
  // (RUNTIME_UNAVAILABLE) with the dlerror text when either fails.
  explicit Runtime(const std::string& path);

  // Throws Failure unless code is CL_SUCCESS, with the message
  // "<call> failed: <error_name>", the call printf-formatted; the status
  // follows from kind (plugin::status_of_failed_call): out of memory in an
  // allocation is CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES,
  // CL_OUT_OF_HOST_MEMORY or CL_INVALID_BUFFER_SIZE.
  void check(cl_int code, plugin::CallKind kind, const char* call_format, ...) const
      __attribute__((format(printf, 4, 5)));

  // First, so that the entry points below are bound after it is open.
  plugin::RuntimeLibrary library;
  DEVALLOC_CL_ENTRY_POINTS(DEVALLOC_KIT_DECLARE_ENTRY_POINT)
};

}  // namespace devalloc::opencl
