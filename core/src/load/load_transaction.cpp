#include "load_transaction.hpp"

#include "verify.hpp"

#include <devalloc/huge_pages.hpp>
#include <devalloc/input_text.hpp>

#include "../plan_errors.hpp"

#include <algorithm>
#include <filesystem>
#include <tuple>
#include <utility>

namespace devalloc::load {

namespace {

std::string where(const PlanTensor& t) {
  return "tensor " + quote(t.name) + " (buffer " + std::to_string(t.memory_id) +
         ", offset " + std::to_string(t.offset) + ")";
}

}  // namespace

LoadTransaction::LoadTransaction(const Plan& plan, const LoadOptions& options,
                                 DeviceRegistry& registry, const BufferMap& live,
                                 std::function<bool(size_t)> filled)
    : plan_(plan), options_(options), registry_(registry), live_(live),
      filled_(std::move(filled)) {}

Status LoadTransaction::resolve(const std::vector<std::string>& methods) {
  auto needs = needs_of(plan_, methods, options_.external_files);
  if (!needs.ok()) return needs.status();
  needs_ = std::move(*needs);
  // validate_plan checks these too; a caller that skipped it must still get
  // an error before anything is allocated, never an exception, never an
  // address past its buffer.
  std::map<uint32_t, const PlannedBuffer*> buffer_by_id;  // not T x B lookups
  for (const PlannedBuffer& pb : needs_->buffers) buffer_by_id.emplace(pb.memory_id, &pb);
  for (const NeededTensor& n : needs_->tensors) {
    const PlanTensor& t = plan_.tensors[n.index];
    const auto found = buffer_by_id.find(t.memory_id);
    const PlannedBuffer* b = found == buffer_by_id.end() ? nullptr : found->second;
    if (b == nullptr) {
      // A safety check, not validate_plan's: the ids of all the methods of
      // this call are allowed, which keeps every address in its buffer.
      // At most kShownIds of them: a plan may have thousands of buffers.
      using detail::kShownIds;
      std::string ids;
      for (size_t k = 0; k < needs_->buffers.size() && k < kShownIds; ++k) {
        ids += (k == 0 ? "" : ", ") + std::to_string(needs_->buffers[k].memory_id);
      }
      if (needs_->buffers.size() > kShownIds) {
        ids += ", ... (" + std::to_string(needs_->buffers.size()) + " in all)";
      }
      return Status(StatusCode::invalid_argument,
                    where(t) + ": memory id " + std::to_string(t.memory_id) +
                        " is not among the memory ids of the methods this call loads (" +
                        (ids.empty() ? "none" : ids) + ")");
    }
    if (t.offset > b->nbytes || n.nbytes > b->nbytes - t.offset) {
      return Status(StatusCode::invalid_argument,
                    where(t) + ": " + std::to_string(n.nbytes) +
                        " bytes do not fit in buffer " +
                        std::to_string(b->memory_id) + " of " +
                        std::to_string(b->nbytes) + " bytes");
    }
  }
  return Status();
}

// A load that cannot fit fails here, before anything is allocated.
Status LoadTransaction::place() {
    for (const PlannedBuffer& b : needs_->buffers) {
    if (live_.count(b.memory_id) != 0) continue;
    auto placed = place_buffer(b, registry_);
    if (!placed.ok()) return placed.status().with_context(buffer_place(plan_, b));
    placements_.push_back(std::move(*placed));
  }
  if (options_.check_free_memory) {
    if (Status s = check_fit(device_demands(placements_)); !s.ok()) {
      return s.with_context(detail::plan_name(plan_));
    }
  }
  return Status();
}

// Until the commit the buffers are owned here only, so any failure frees
// them with the transaction.
Status LoadTransaction::allocate() {
  for (const BufferPlacement& p : placements_) {
    const PlannedBuffer& b = p.buffer;
    auto buffer = DeviceBuffer::allocate(p.device, b.memory_id, b.nbytes, b.alignment);
    if (!buffer.ok()) return buffer.status().with_context(buffer_place(plan_, b));
    fresh_.emplace(b.memory_id, std::move(*buffer));
  }
  return Status();
}

Status LoadTransaction::gather(SafetensorsCache& sources) {
  // Consecutive tensors mostly share a buffer: look it up once per run.
  uint32_t last_id = 0;
  const std::shared_ptr<DeviceBuffer>* last_buffer = nullptr;
  auto buffer_of = [&](uint32_t id) -> const std::shared_ptr<DeviceBuffer>& {
    if (last_buffer == nullptr || last_id != id) {
      auto it = fresh_.find(id);
      last_buffer = it != fresh_.end() ? &it->second : &live_.find(id)->second;
      last_id = id;
    }
    return *last_buffer;
  };

  // Copy requests: constants not yet on their device; request_tensor[k] is
  // the plan index of requests[k].
  std::vector<CopyRequest> requests;
  reserve_on_huge_pages(requests, needs_->tensors.size());
  request_tensor_.reserve(needs_->tensors.size());
  // Each file is opened once by this load, whatever order the plan lists
  // its tensors in: every tensor of a file is checked against the one
  // header the copies take their offsets from (a cache may open a file
  // modified in place again, into a new entry, at each open).
  std::vector<std::shared_ptr<const SafetensorsFile>>& opened_files = opened_;
  opened_files.assign(needs_->files.size(), nullptr);
  // A file the plan's check still holds for (file_check.hpp) is mapped but
  // its header not read: its tensors are where the plan's rows put them.
  planned_.assign(needs_->files.size(), detail::PlannedFile{});
  std::vector<bool> checked(needs_->files.size(), false);
  std::vector<uint64_t> planned_offset;  // by plan tensor, for planned files
  std::optional<detail::RowsByFile> rows;  // made for the first file with a check
  // Consecutive tensors mostly share a file: look it up once per run of
  // them, not once per tensor.
  size_t last_file_id = NeededTensor::kNoFile;
  const SafetensorsFile* last_file = nullptr;
  const MappedFile* last_planned = nullptr;
  size_t next_in_file = 0;  // plans mostly list a file's tensors in its order
  for (const NeededTensor& n : needs_->tensors) {
    if (n.file == NeededTensor::kNoFile || filled_(n.index)) continue;
    const PlanTensor& t = plan_.tensors[n.index];
    const std::filesystem::path& path = needs_->files[n.file];
    if (n.file != last_file_id) {
      if (!checked[n.file]) {
        checked[n.file] = true;
        planned_[n.file] = detail::open_planned(plan_, t.source->file, path,
                                                needs_->files_beneath, rows, planned_offset);
      }
      last_planned = planned_[n.file].mapping.get();
      std::shared_ptr<const SafetensorsFile>& file = opened_files[n.file];
      if (last_planned == nullptr && file == nullptr) {
        auto opened = sources.open(path, needs_->files_beneath);
        if (!opened.ok()) return opened.status().with_context(where(t));
        file = std::move(*opened);
      }
      last_file = file.get();
      last_file_id = n.file;
      next_in_file = 0;
    }
    if (last_planned != nullptr) {
      requests.push_back(CopyRequest{buffer_of(t.memory_id), t.offset, planned_[n.file].mapping,
                                     planned_offset[n.index], n.nbytes, t.name, 0, 0});
      request_tensor_.push_back(n.index);
      continue;
    }
    const std::string& key = t.source->key;
    const SafetensorsTensor* source = last_file->find(key, next_in_file);
    if (source == nullptr) {
      return Status(StatusCode::invalid_argument,
                    where(t) + ": " + path_for_message(path.string()) + " has no tensor " +
                        quote(key));
    }
    next_in_file = static_cast<size_t>(source - last_file->tensors().data()) + 1;
    // What validate_plan checked, checked again against the header this
    // load copies by: the file the plan was validated with may have been
    // modified in place since, and opened again (SafetensorsCache).
    SliceLayout layout{1, source->nbytes, source->nbytes, 0};
    std::vector<uint64_t> sliced;
    const std::vector<uint64_t>* shape = &source->shape;
    if (const std::optional<PlanSlice>& slice = t.source->slice) {
      Result<SliceLayout> cut = slice_layout(*slice, source->dtype, source->shape, &sliced);
      if (!cut.ok()) {
        return Status(StatusCode::invalid_argument,
                      where(t) + ": " + cut.status().message() + " (" + quote(key) + " in " +
                          path_for_message(path.string()) + ")");
      }
      layout = *cut;
      shape = &sliced;
    }
    const uint64_t nbytes = layout.rows * layout.run_bytes;
    if (nbytes != n.nbytes) {
      return Status(StatusCode::invalid_argument,
                    where(t) + ": the plan says " + std::to_string(n.nbytes) +
                        " bytes, " + path_for_message(path.string()) + " has " +
                        std::to_string(nbytes) + " for " + quote(key) +
                        (t.source->slice ? " (" + slice_to_string(*t.source->slice) + ")" : ""));
    }
    if (source->dtype != t.dtype || *shape != t.shape) {
      return Status(StatusCode::invalid_argument,
                    where(t) + ": the plan says " + std::string(to_string(t.dtype)) + " " +
                        shape_to_string(t.shape) + ", " + path_for_message(path.string()) +
                        " has " + std::string(to_string(source->dtype)) + " " +
                        shape_to_string(*shape) + " for " + quote(key) +
                        (t.source->slice ? " (" + slice_to_string(*t.source->slice) + ")" : ""));
    }
    const bool strided = layout.rows > 1;
    requests.push_back(CopyRequest{buffer_of(t.memory_id), t.offset, last_file->mapping(),
                                   source->offset + layout.first_byte, nbytes, t.name,
                                   strided ? layout.run_bytes : 0,
                                   strided ? layout.stride_bytes : 0});
    request_tensor_.push_back(n.index);
  }
  schedule_ = CopySchedule::build(std::move(requests));
  return Status();
}

Status LoadTransaction::execute(const LoadProgress& progress, bool verify) {
  if (Status s = schedule_->execute(PipelineOptions::from(options_), &stats_, &pipeline_,
                                    progress);
      !s.ok()) {
    return s;
  }
  if (verify) {
    if (Status s = verify_copies(schedule_->requests(),
                                 std::min<uint64_t>(options_.staging_bytes, 8 << 20));
        !s.ok()) {
      return s;
    }
  }
  verified_ = verify;
  // A device that got buffers of this load but no constant (scratch only)
  // has a row too, with nothing copied: the report covers every device the
  // load allocated on. Before the commit, which must not allocate.
  for (const auto& [id, buffer] : fresh_) {
    const ResolvedDevice& device = buffer->device();
    const bool listed = std::any_of(stats_.begin(), stats_.end(), [&](const DeviceLoadStats& d) {
      return d.device.same_device(device);
    });
    if (!listed) stats_.push_back(DeviceLoadStats{device});
  }
  return Status();
}

LoadReport LoadTransaction::report() const {
  LoadReport report;
  for (const DeviceLoadStats& d : stats_) {
    report.copies += d.copies;
    report.direct_reads += d.direct_reads;
  }
  report.pipeline = pipeline_;
  report.devices = stats_;
  for (const CopyRequest& r : schedule_->requests()) {
    // An empty tensor is in place without a copy.
    if (r.nbytes > 0) ++report.constants;
    report.bytes += r.nbytes;
  }
  report.verified = verified_;
  // Each file this call opened: its header (read, or hashed against the
  // plan's check), and the data its pieces read.
  const auto add_file = [&](const std::filesystem::path& path, uint64_t header) {
    uint64_t data = 0;
    for (const FileReadStats& f : pipeline_.files) {
      if (f.path == path) data += f.bytes;
    }
    report.files.push_back(FileReadStats{path, header + data});
  };
  for (size_t i = 0; i < opened_.size(); ++i) {
    if (opened_[i] != nullptr) {
      add_file(opened_[i]->path(), opened_[i]->data_offset());
    } else if (i < planned_.size() && planned_[i].mapping != nullptr) {
      add_file(planned_[i].mapping->path(), planned_[i].data_offset);
    }
  }
  return report;
}

}  // namespace devalloc::load
