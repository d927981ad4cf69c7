// A plan file from the fuzz input: read, then validated without sources,
// and for a plan for several ranks, a rank's view taken. nlohmann's parser
// reads the same text as the oracle.
#include <devalloc/core/job_rank.hpp>
#include <devalloc/core/plan.hpp>

#include <nlohmann/json.hpp>

#include "memory_file.hpp"

#include <cstdlib>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

// nlohmann's parser reads the same text as the oracle: a text that is not
// JSON to it is refused, and an accepted plan says what it says to it.
void check_against_oracle(const devalloc::Result<devalloc::Plan>& plan, const uint8_t* data,
                          size_t size) {
  const json root = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    if (plan.ok()) std::abort();  // taken what is not JSON
    return;
  }
  if (!plan.ok()) return;
  const devalloc::Plan& p = *plan;
  // nlohmann keeps the last of a key given twice; the reader refuses it, so
  // every count and value agrees.
  if (root.value("allow_external_files", false) != p.allow_external_files ||
      root.value("world_size", uint32_t{0}) != p.world_size ||
      root.at("buffers").size() != p.buffers.size() ||
      root.at("tensors").size() != p.tensors.size() ||
      root.at("methods").size() != p.methods.size()) {
    std::abort();
  }
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const json& b = root["buffers"][i];
    const devalloc::PlanBuffer& x = p.buffers[i];
    if (b.size() != 3u + b.contains("alignment") + b.contains("rank") ||
        x.memory_id != b.at("memory_id").get<uint32_t>() ||
        x.device != b.at("device").get<std::string>() || x.size != b.at("size").get<uint64_t>() ||
        x.alignment != b.value("alignment", uint64_t{1}) ||
        x.rank.has_value() != b.contains("rank") ||
        (x.rank && *x.rank != b["rank"].get<uint32_t>())) {
      std::abort();
    }
  }
  // A "files" entry is a path, or an object with the path and its check.
  std::vector<std::string> files;
  size_t checks = 0;
  for (const json& f : root.value("files", json::array())) {
    files.push_back(f.is_string() ? f.get<std::string>() : f.at("path").get<std::string>());
    if (f.is_object() && f.contains("header_bytes")) {
      const auto check = p.file_checks.find(files.back());
      if (check == p.file_checks.end() ||
          check->second.header_bytes != f["header_bytes"].get<uint64_t>() ||
          check->second.header_xxh3 != std::stoull(f["header_xxh3"].get<std::string>(), nullptr, 16) ||
          check->second.rows_xxh3 != std::stoull(f["rows_xxh3"].get<std::string>(), nullptr, 16)) {
        std::abort();
      }
      ++checks;
    }
  }
  if (checks != p.file_checks.size()) std::abort();
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const json& t = root["tensors"][i];
    const devalloc::PlanTensor& x = p.tensors[i];
    if (t.is_array()) {  // a row: [name, dtype, shape, memory_id, offset, source]
      if (t.size() != 6 || x.name != t[0].get<std::string>() ||
          devalloc::to_string(x.dtype) != t[1].get<std::string>() ||
          x.shape != t[2].get<std::vector<uint64_t>>() || x.memory_id != t[3].get<uint32_t>() ||
          x.offset != t[4].get<uint64_t>() || x.source.has_value() != !t[5].is_null()) {
        std::abort();
      }
      if (!x.source) continue;
      const json& s = t[5];
      const json& file = s.is_object() ? s.at("file") : s;
      const std::string key = s.is_object() ? s.value("key", x.name) : x.name;
      if (x.source->file != files.at(file.get<size_t>()) || x.source->key != key ||
          x.source->slice.has_value() != (s.is_object() && s.contains("dim"))) {
        std::abort();
      }
      if (x.source->slice && (x.source->slice->dim != s.at("dim").get<uint32_t>() ||
                              x.source->slice->start != s.at("start").get<uint64_t>() ||
                              x.source->slice->length != s.at("length").get<uint64_t>())) {
        std::abort();
      }
      continue;
    }
    if (x.name != t.at("name").get<std::string>() ||
        devalloc::to_string(x.dtype) != t.at("dtype").get<std::string>() ||
        x.shape != t.at("shape").get<std::vector<uint64_t>>() ||
        x.memory_id != t.at("memory_id").get<uint32_t>() ||
        x.offset != t.at("offset").get<uint64_t>()) {
      std::abort();
    }
    const bool has_source = t.contains("source") && !t["source"].is_null();
    if (x.source.has_value() != has_source) std::abort();
    if (!has_source) continue;
    const json& s = t["source"];
    if (x.source->file != s.at("file").get<std::string>() ||
        x.source->key != s.at("key").get<std::string>() ||
        x.source->slice.has_value() != s.contains("dim")) {
      std::abort();
    }
    if (x.source->slice && (x.source->slice->dim != s.at("dim").get<uint32_t>() ||
                            x.source->slice->start != s.at("start").get<uint64_t>() ||
                            x.source->slice->length != s.at("length").get<uint64_t>())) {
      std::abort();
    }
  }
  for (size_t i = 0; i < p.methods.size(); ++i) {
    const json& m = root["methods"][i];
    const devalloc::PlanMethod& x = p.methods[i];
    if (x.name != m.at("name").get<std::string>() ||
        x.memory_ids != m.at("memory_ids").get<std::vector<uint32_t>>() ||
        x.tensors != m.at("tensors").get<std::vector<std::string>>()) {
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  devalloc::fuzz::MemoryFile file(data, size);
  auto plan = devalloc::read_plan(file.path());
  check_against_oracle(plan, data, size);
  if (!plan.ok()) {
    devalloc::fuzz::check_names_file(plan.status().message(), file.path());
    return 0;
  }
  devalloc::PlanValidationOptions options;
  options.check_sources = false;
  if (devalloc::Status s = devalloc::validate_plan(*plan, options); !s.ok()) {
    devalloc::fuzz::check_names_file(s.message(), file.path());
  }
  // A rank's view of a plan for several ranks: refused or a plan.
  if (plan->world_size != 0) {
    (void)devalloc::plan_for_rank(*plan, devalloc::JobRank{plan->world_size - 1,
                                                           plan->world_size, 0, "fuzz"});
  }
  return 0;
}
