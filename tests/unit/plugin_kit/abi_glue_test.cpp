// The kit's argument helpers that do not need an instance.
#include <devalloc/plugin_kit/abi_glue.hpp>

#include <gtest/gtest.h>

namespace devalloc::plugin {
namespace {

// A runtime's PCI address in the ABI's form; one with anything after the
// function number is not a PCI address and is reported unknown (""), not
// cut down to the part that looked like one.
TEST(NormalizePciBusId, GivenTextAfterTheFunction_ThenUnknownRatherThanTruncated) {
  EXPECT_EQ(normalize_pci_bus_id("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(normalize_pci_bus_id("1:2:3.4"), "0001:02:03.4");
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00.0 "), "");
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00.0/1"), "");
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00.0:0000:3c:00.0"), "");
  EXPECT_EQ(normalize_pci_bus_id("0000:3b:00"), "");
  EXPECT_EQ(normalize_pci_bus_id(""), "");
}

}  // namespace
}  // namespace devalloc::plugin
