// Addresses as messages write them: "0x1000", and a range "[0x1000, 0x2000)",
// end excluded.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace devalloc::detail {

inline std::string hex_address(uint64_t address) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(address));
  return text;
}

inline std::string address_range(uint64_t begin, uint64_t end) {
  char text[48];
  std::snprintf(text, sizeof text, "[0x%llx, 0x%llx)", static_cast<unsigned long long>(begin),
                static_cast<unsigned long long>(end));
  return text;
}

}  // namespace devalloc::detail
