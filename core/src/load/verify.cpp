#include "verify.hpp"

#include <devalloc/input_text.hpp>
#include <devalloc/no_exceptions.hpp>

#include "../mapping_guard.hpp"

// xxHash compiled into the core (inline), so that neither the core's
// consumers nor the Python extension need libxxhash.so at run time.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <set>
#include <vector>

namespace devalloc {

namespace {

std::string hex(XXH64_hash_t h) {
  char text[20];
  std::snprintf(text, sizeof text, "%016" PRIx64, static_cast<uint64_t>(h));
  return text;
}

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

}  // namespace

static Status verify_copies_or_throw(const std::vector<CopyRequest>& requests,
                                     uint64_t chunk_bytes) {
  chunk_bytes = std::max<uint64_t>(chunk_bytes, 4096);
  std::vector<std::byte> chunk;
  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  std::unique_ptr<XXH3_state_t, StateDeleter> file_state(XXH3_createState());
  if (!state || !file_state) {
    return Status(StatusCode::out_of_host_memory, "verify: no memory for a hash state");
  }
  const detail::SigbusUnblocked sigbus;  // for the guarded reads, once for all

  for (const CopyRequest& r : requests) {
    if (r.nbytes == 0) continue;
    chunk.resize(std::min(chunk_bytes, r.nbytes));
    const ResolvedDevice& d = r.buffer->device();
    // Guarded: the file may have been truncated since the load mapped it.
    // A slice's bytes lie in runs (for_each_run).
    const std::byte* base = r.file->data();
    uint64_t fault = 0;
    XXH3_64bits_reset(state.get());
    for (uint64_t done = 0; done < r.nbytes;) {
      const uint64_t n = std::min<uint64_t>(chunk.size(), r.nbytes - done);
      // The chunk first holds the complement of the bytes expected, so a
      // read-back that writes less than asked (or nothing) cannot match on
      // bytes left from an earlier chunk or tensor.
      bool read = true;
      uint64_t lost_at = 0;
      for_each_run(r, done, n, [&](uint64_t position, uint64_t at, uint64_t length) {
        if (!read) return;
        auto poison = [&]() noexcept {
          for (uint64_t i = 0; i < length; ++i) chunk[at + i] = ~base[position + i];
        };
        if (!detail::guarded_read(base + position, length, poison, &fault)) {
          read = false;
          lost_at = position + fault;
        }
      });
      if (!read) {
        return detail::lost_to_truncation(*r.file, lost_at)
            .with_context("verify: reading tensor " + quote(r.tensor) + " from its file");
      }
      Status s = d.plugin->copy_to_host(d.device, chunk.data(),
                                        r.buffer->address() + r.buffer_offset + done, n);
      if (!s.ok()) {
        return s.with_context("verify: reading back tensor " + quote(r.tensor) +
                              " from buffer " +
                              std::to_string(r.buffer->memory_id()) + " on " +
                              d.describe());
      }
      XXH3_64bits_update(state.get(), chunk.data(), n);
      done += n;
    }
    const XXH64_hash_t on_device = XXH3_64bits_digest(state.get());
    XXH3_64bits_reset(file_state.get());
    bool read = true;
    uint64_t lost_at = 0;
    for_each_run(r, 0, r.nbytes, [&](uint64_t position, uint64_t, uint64_t length) {
      if (!read) return;
      auto hash = [&]() noexcept { XXH3_64bits_update(file_state.get(), base + position, length); };
      if (!detail::guarded_read(base + position, length, hash, &fault)) {
        read = false;
        lost_at = position + fault;
      }
    });
    if (!read) {
      return detail::lost_to_truncation(*r.file, lost_at)
          .with_context("verify: reading tensor " + quote(r.tensor) + " from its file");
    }
    const XXH64_hash_t in_file = XXH3_64bits_digest(file_state.get());
    if (on_device != in_file) {
      // The hash is of the file as it is now, the offsets are of the file
      // as opened: if it changed, that is the news, not the device.
      if (Status changed = r.file->check_unchanged("since it was opened"); !changed.ok()) {
        return changed.with_context("verify: tensor " + quote(r.tensor) +
                                    " cannot be compared with its file");
      }
      return Status(StatusCode::device_error,
                    "verify: tensor " + quote(r.tensor) + " in buffer " +
                        std::to_string(r.buffer->memory_id()) + " on " +
                        d.describe() + " differs from " + path_for_message(r.file->path().string()) +
                        " (xxh3 " + hex(on_device) + " on the device, " +
                        hex(in_file) + " in the file): plugin " + d.plugin_name +
                        " landed other bytes than it was given; to find the rule it breaks, "
                        "run the load under the validation layer (DEVALLOC_VALIDATE=sources, "
                        "or validate = \"sources\" under [plugins." + d.plugin_name +
                        "]) and run `devalloc conformance " +
                        path_for_message(d.plugin->path().string()) + "`");
    }
  }
  // Every hash agreed, with the files as they are now. They are the files
  // the load copied (and took the offsets from) only if none changed since
  // it opened them: one fstat per file.
  std::set<const MappedFile*> checked;
  const MappedFile* last = nullptr;
  for (const CopyRequest& r : requests) {
    if (r.nbytes == 0 || r.file.get() == last) continue;
    last = r.file.get();
    if (!checked.insert(last).second) continue;
    if (Status changed = last->check_unchanged("since it was opened"); !changed.ok()) {
      return changed.with_context("verify: the copies cannot be compared with the file they came "
                                  "from");
    }
  }
  return Status();
}

Status verify_copies(const std::vector<CopyRequest>& requests, uint64_t chunk_bytes) {
  return detail::without_exceptions("verify",
                                    [&] { return verify_copies_or_throw(requests, chunk_bytes); });
}

}  // namespace devalloc
