// Which physical device backs a device tag: the pure half of device
// resolution. Nothing here loads a plugin. The runtime resolves a tag like
// this:
//
//   tag = tag_for_memory(config, memory_id, planned_tag)
//   for each candidate of candidate_bindings(config, tag):
//     load config.plugin(candidate.binding.plugin); on failure record
//       "plugin NAME is unavailable: REASON" and go on
//     select_device(candidate.binding.selector, plugin.devices()); on
//       nullopt record no_match_reason(...) and go on
//     done: the first candidate that yields a device wins
//   none did: no_device_error(tag, memory_id, attempts)
//
// A tag without a resolvable device is always an error, never a silent
// guess.
#pragma once

#include <devalloc/core/config.hpp>
#include <devalloc/plugin.hpp>
#include <devalloc/status.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace devalloc {

// The binding a tag has when the config does not define it: "X:N" is
// plugin X, index N; "X" is plugin X, index 0.
DeviceBinding default_binding(const DeviceTag& tag);

// One binding to try for a tag, and why it is on the list.
struct DeviceCandidate {
  DeviceBinding binding;
  std::string via_tag;       // the device tag whose entry contributed it
  bool is_fallback = false;  // false only for the first candidate
};

// The ordered bindings to try for tag: its binding (configured, or the
// default binding), then its fallbacks in order, a fallback that is a device
// tag expanded in place with its own binding and fallbacks. A binding that
// appears again later is dropped (the first occurrence stays, with its
// via_tag), so the list never has more entries than the config has distinct
// bindings; a tag met again after its expansion is skipped, as it could add
// only such duplicates. Time linear in the tags and fallback entries reached
// from tag; no recursion. Fails, naming the tag, when a tag does not parse
// or the fallbacks form a cycle (naming the chain, its middle elided past 16
// tags, and, for a config read from a file, where the closing fallback is
// written).
Result<std::vector<DeviceCandidate>> candidate_bindings(
    const RuntimeConfig& config, std::string_view tag);

// The first error candidate_bindings would give for the tags of
// config.devices taken in order, or OK: every tag checked in one walk, time
// linear in the config (the config reader calls it).
Status check_fallbacks(const RuntimeConfig& config);

// The device tag a memory id is placed on: the [memory] override when there
// is one, else the tag the plan gave it.
std::string tag_for_memory(const RuntimeConfig& config, uint32_t memory_id,
                           std::string_view planned_tag);

// The DeviceInfo::index of the device that selector picks, or nullopt.
// uuid: compared with DeviceInfo::uuid_string() after normalize_uuid (case
// and a "GPU-" prefix do not matter); devices without a UUID never match.
// pci_bus_id: both sides normalized with normalize_pci_bus_id (case and a
// missing domain do not matter).
std::optional<uint32_t> select_device(const DeviceSelector& selector,
                                      const std::vector<DeviceInfo>& devices);

// Why select_device found nothing, listing what the plugin has:
// "no device with index 2 (devices: 0, 1)".
std::string no_match_reason(const DeviceSelector& selector,
                            const std::vector<DeviceInfo>& devices);

// A candidate that was tried and did not yield a device.
struct SelectionAttempt {
  DeviceCandidate candidate;
  std::string reason;
};

// The attempts in words, joined by "; ", as no_device_error writes them:
//   cuda index 0: plugin cuda is unavailable: ...; fallback host index 0
//   (device "host"): ...
// Also why a tag resolved only through a fallback
// (ResolvedDevice::fallback_reason).
std::string attempts_text(std::string_view tag, const std::vector<SelectionAttempt>& attempts);

// The no_such_device error for a tag none of whose candidates worked:
//   no device for "cuda:0" (memory id 3): cuda index 0: plugin cuda is
//   unavailable: ...; fallback host index 0 (device "host"): ...
// memory_id is left out of the text when nullopt.
Status no_device_error(std::string_view tag, std::optional<uint32_t> memory_id,
                       const std::vector<SelectionAttempt>& attempts);

}  // namespace devalloc
