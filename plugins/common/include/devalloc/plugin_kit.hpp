// The devalloc plugin kit: the vendor-neutral machinery of a plugin, linked
// statically (CMake target devalloc::plugin_kit). A vendor plugin adds its
// runtime's function table (runtime_library.hpp), device enumeration, its
// stream or queue, and how it learns that a copy completed
// (release_queue.hpp for callbacks, completion_thread.hpp for events).
#pragma once

#include <devalloc/plugin_kit/abi_glue.hpp>
#include <devalloc/plugin_kit/allocation_table.hpp>
#include <devalloc/plugin_kit/completion_thread.hpp>
#include <devalloc/plugin_kit/device_instance.hpp>
#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/fence_releases.hpp>
#include <devalloc/plugin_kit/give_back.hpp>
#include <devalloc/plugin_kit/instance.hpp>
#include <devalloc/plugin_kit/options.hpp>
#include <devalloc/plugin_kit/pinned_staging.hpp>
#include <devalloc/plugin_kit/plugin_entry.hpp>
#include <devalloc/plugin_kit/release.hpp>
#include <devalloc/plugin_kit/release_queue.hpp>
#include <devalloc/plugin_kit/runtime_calls.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>
#include <devalloc/plugin_kit/stream_device.hpp>
#include <devalloc/plugin_kit/stream_releases.hpp>
#include <devalloc/plugin_kit/unique_function.hpp>
