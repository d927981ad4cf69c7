// Slices of source tensors (PlanSlice): where their bytes lie in the file.
#include <devalloc/core/plan.hpp>

#include <string>
#include <vector>

namespace devalloc {

std::string slice_to_string(const PlanSlice& slice) {
  return "dim " + std::to_string(slice.dim) + ", start " + std::to_string(slice.start) +
         ", length " + std::to_string(slice.length);
}

Result<SliceLayout> slice_layout(const PlanSlice& slice, DType dtype,
                                 std::span<const uint64_t> source_shape,
                                 std::vector<uint64_t>* sliced_shape) {
  const auto refuse = [&](const std::string& why) -> Result<SliceLayout> {
    return Status(StatusCode::invalid_argument,
                  "slice (" + slice_to_string(slice) + ") of a tensor of shape " +
                      shape_to_string(source_shape) + ": " + why);
  };
  if (slice.dim >= source_shape.size()) {
    return refuse("the tensor has " + std::to_string(source_shape.size()) +
                  (source_shape.size() == 1 ? " dimension" : " dimensions"));
  }
  const uint64_t extent = source_shape[slice.dim];
  if (slice.start > extent || slice.length > extent - slice.start) {
    return refuse("dimension " + std::to_string(slice.dim) + " has " + std::to_string(extent) +
                  " elements");
  }
  std::vector<uint64_t> leading(source_shape.begin(), source_shape.begin() + slice.dim);
  uint64_t rows = 1;
  for (uint64_t d : leading) {
    if (d != 0 && rows > UINT64_MAX / d) return refuse("its element count overflows 64 bits");
    rows *= d;
  }
  // A packed dtype (F4, F6) must not be cut inside a byte: every run and
  // every offset a whole number of bytes.
  const uint32_t bits = bit_width(dtype);
  const auto whole_bytes = [&](uint64_t elements) -> std::optional<uint64_t> {
    std::vector<uint64_t> shape(source_shape.begin() + slice.dim + 1, source_shape.end());
    shape.insert(shape.begin(), elements);
    Result<uint64_t> n = byte_size(dtype, shape);
    if (!n.ok()) return std::nullopt;
    return *n;
  };
  const std::optional<uint64_t> run = whole_bytes(slice.length);
  const std::optional<uint64_t> first = whole_bytes(slice.start);
  const std::optional<uint64_t> stride = whole_bytes(extent);
  if (!run || !first || !stride) {
    return refuse(bits % 8 != 0 ? "a " + std::to_string(bits) +
                                      "-bit dtype cut here does not start and end on whole "
                                      "bytes"
                                : "its size overflows 64 bits");
  }
  if (rows > 1 && *run != 0 && rows > UINT64_MAX / *run) {
    return refuse("its size overflows 64 bits");
  }
  if (sliced_shape != nullptr) {
    sliced_shape->assign(source_shape.begin(), source_shape.end());
    (*sliced_shape)[slice.dim] = slice.length;
  }
  SliceLayout layout;
  layout.rows = rows;
  layout.run_bytes = *run;
  layout.stride_bytes = *stride;
  layout.first_byte = *first;
  // A slice along dim 0, or one whole along its dimension, is one range.
  if (rows <= 1 || *run == *stride) {
    layout.run_bytes = rows * *run;
    layout.rows = rows == 0 ? 0 : 1;
    layout.stride_bytes = layout.run_bytes;
  }
  return layout;
}

}  // namespace devalloc
