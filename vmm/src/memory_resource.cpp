// vmm::memory_resource: each call handed to its state (resource/resource_state.hpp).

#include "vmm/memory_resource.hpp"

#include "vmm/resource_like.hpp"

#include "resource/resource_state.hpp"
#include "vmm/error.hpp"

namespace vmm {

// The names CCCL 3.1's resource concepts ask for, checked without any CCCL header.
static_assert(resource_like<memory_resource>);

namespace {

std::shared_ptr<chunk_pool> require(std::shared_ptr<chunk_pool> pool) {
  if (pool == nullptr) throw invalid_argument("memory_resource: the pool is null");
  return pool;
}

}  // namespace

memory_resource::memory_resource(location where, memory_resource_properties properties,
                                 reuse_policies policies)
    : memory_resource(default_pool(where), properties, policies) {}

memory_resource::memory_resource(std::shared_ptr<chunk_pool> pool, memory_resource_properties properties,
                                 reuse_policies policies)
    : state_(std::make_unique<detail::resource_state>(require(std::move(pool)), properties, policies)) {}

memory_resource::~memory_resource() = default;

void* memory_resource::allocate(stream_ref stream, std::size_t bytes, std::size_t alignment) {
  return state_->allocate(stream, bytes, alignment, false);
}

void memory_resource::deallocate(stream_ref stream, void* ptr, std::size_t bytes,
                                 std::size_t alignment) noexcept {
  state_->deallocate(stream, ptr, bytes, alignment, false);
}

void* memory_resource::allocate(stream_ref stream, std::size_t bytes, std::size_t alignment,
                                allocation_tag tag) {
  return state_->allocate(stream, bytes, alignment, false, tag.value);
}

memory_registration memory_resource::register_memory(void* ptr, std::size_t bytes,
                                                     std::shared_ptr<memory_registrar> registrar) {
  return state_->register_memory(ptr, bytes, std::move(registrar));
}

void memory_resource::sleep(std::span<const allocation_tag> offload, stream_ref stream) {
  state_->sleep(offload, stream);
}
void memory_resource::wake(std::span<const allocation_tag> tags, stream_ref stream, after_wake then) {
  state_->wake(tags, stream, then);
}
bool memory_resource::asleep() const noexcept {
  return state_->asleep();
}

void* memory_resource::allocate_sync(std::size_t bytes, std::size_t alignment) {
  return state_->allocate({}, bytes, alignment, true);
}

void memory_resource::deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
  state_->deallocate({}, ptr, bytes, alignment, true);
}

void memory_resource::trim_to(std::size_t bytes_to_keep) {
  state_->trim_to(bytes_to_keep);
}
void memory_resource::synchronize() {
  state_->synchronize();
}
void memory_resource::set_release_threshold(std::size_t bytes) {
  state_->set_release_threshold(bytes);
}
void memory_resource::set_access(std::span<const access_grant> grants) {
  state_->set_access(grants);
}
access_mode memory_resource::access(const accessor& who) const {
  return state_->access(who);
}
void memory_resource::wait_for(stream_ref waiting, stream_ref freeing) {
  state_->wait_for(waiting, freeing);
}
memory_resource_statistics memory_resource::statistics() const {
  return state_->statistics();
}
memory_resource::allocation_pages memory_resource::pages_of(const void* ptr, std::size_t bytes) const {
  return state_->pages_of(ptr, bytes);
}
void memory_resource::reset_high_water_marks() {
  state_->reset_high_water_marks();
}
const memory_resource_properties& memory_resource::properties() const noexcept {
  return state_->properties();
}
const reuse_policies& memory_resource::policies() const noexcept {
  return state_->policies();
}
const std::shared_ptr<memory_provider>& memory_resource::provider() const noexcept {
  return state_->provider();
}
const std::shared_ptr<chunk_pool>& memory_resource::pool() const noexcept {
  return state_->pool();
}
bool memory_resource::owns(const void* ptr) const noexcept {
  return state_->owns(ptr);
}

}  // namespace vmm
