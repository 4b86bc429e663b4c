#include <vmm/store/host_mirror.hpp>

#include <vmm/error.hpp>

#include <fmt/format.h>

namespace vmm::store {
namespace {

location host_location_for(const buffer& source) {
  if (source.data() == nullptr) throw invalid_argument("vmm::store::host_mirror of an empty buffer handle");
  return source.where().kind == memory_kind::os_host ? location::os_host() : location::pinned_host(0);
}

}  // namespace

host_mirror::host_mirror(const buffer& source, stream_ref stream, mirror_options options)
    : source_(&source),
      host_(host_location_for(source),
            {.max_size = std::max<std::size_t>(source.size(), 1), .stream = stream}),
      size_(source.size()),
      options_(options) {
  host_.resize(size_);
  if (options_.copy_in) copy_in(stream);
}

host_mirror::~host_mirror() {
  if (host_.data() == nullptr || !options_.copy_back || source_->access() != access_mode::read_write) return;
  try {
    copy_back(stream());
  } catch (const std::exception& error) {
    report_cleanup_failure(
        fmt::format("vmm::store::host_mirror: copying back failed: {}", error.what()).c_str());
  }
}

void host_mirror::copy_in(stream_ref stream) {
  if (size_ == 0) return;
  source_->provider()->executor().copy(host_.data(), source_->data(), size_, stream);
}

void host_mirror::copy_back(stream_ref stream) {
  if (source_->access() != access_mode::read_write)
    throw invalid_argument(
        fmt::format("vmm::store::host_mirror: \"{}\" is mapped read-only here", source_->name()));
  if (size_ == 0) return;
  source_->provider()->executor().copy(source_->data(), host_.data(), size_, stream);
}

void host_mirror::synchronize() {
  source_->provider()->executor().synchronize(stream());
}

}  // namespace vmm::store
