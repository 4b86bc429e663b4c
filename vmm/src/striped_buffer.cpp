#include "vmm/striped_buffer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "peer_access.hpp"
#include "vmm/capabilities.hpp"
#include "vmm/error.hpp"

namespace vmm {
namespace {

bool known_mode(access_mode mode) {
  return mode == access_mode::none || mode == access_mode::read_only || mode == access_mode::read_write;
}

// Everything that needs no driver: a bad argument is reported the same with or without one.
void check_arguments(const std::vector<int>& devices, std::size_t size,
                     const striped_buffer_options& options) {
  if (devices.empty()) throw invalid_argument("striped_buffer: the device list is empty");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0)
      throw invalid_argument(fmt::format("striped_buffer: device ordinal {} is negative", devices[i]));
    if (std::find(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(i), devices[i]) !=
        devices.begin() + static_cast<std::ptrdiff_t>(i))
      throw invalid_argument(
          fmt::format("striped_buffer: gpu {} is named twice in the device list", devices[i]));
  }
  if (size == 0) throw invalid_argument("striped_buffer: size 0");
  if (options.mode != stripe_mode::round_robin && options.mode != stripe_mode::contiguous)
    throw invalid_argument(
        fmt::format("striped_buffer: unknown stripe mode {}", static_cast<int>(options.mode)));
  for (std::size_t i = 0; i < options.access.size(); ++i) {
    const access_grant& entry = options.access[i];
    if (entry.who.kind != accessor::kind_type::device)
      throw invalid_argument("striped_buffer: the host cannot be given access to GPU memory");
    if (entry.who.device_ordinal < 0)
      throw invalid_argument(
          fmt::format("striped_buffer: access for negative device ordinal {}", entry.who.device_ordinal));
    if (!known_mode(entry.mode))
      throw invalid_argument(fmt::format("striped_buffer: unknown access mode {} for gpu {}",
                                         static_cast<int>(entry.mode), entry.who.device_ordinal));
    for (std::size_t j = 0; j < i; ++j)
      if (options.access[j].who == entry.who)
        throw invalid_argument(
            fmt::format("striped_buffer: access names gpu {} twice", entry.who.device_ordinal));
  }
  if (!options.pools.empty()) {
    if (options.pools.size() != devices.size())
      throw invalid_argument(
          fmt::format("striped_buffer: {} pools for {} devices: give one per device or none",
                      options.pools.size(), devices.size()));
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (options.pools[i] == nullptr)
        throw invalid_argument(fmt::format("striped_buffer: the pool for gpu {} is null", devices[i]));
      const location where = options.pools[i]->provider()->capabilities().where;
      if (where != location::device(devices[i]))
        throw invalid_argument(
            fmt::format("striped_buffer: the pool for gpu {} holds {} memory", devices[i], to_string(where)));
    }
  }
  for (const device_stream& entry : options.streams)
    if (entry.device < 0)
      throw invalid_argument(
          fmt::format("striped_buffer: a stream for negative device ordinal {}", entry.device));
}

std::vector<access_grant> effective_access(const std::vector<int>& devices,
                                           const std::vector<access_grant>& access) {
  if (!access.empty()) return access;
  std::vector<access_grant> result;
  for (int device : devices) result.push_back({accessor::device(device), access_mode::read_write});
  return result;
}

// The smallest size that every device's granularity divides (granularities are powers of
// two in practice; the general case costs nothing).
std::size_t common_granularity(const std::vector<std::shared_ptr<chunk_pool>>& pools) {
  std::size_t result = 1;
  for (const auto& pool : pools) {
    const std::size_t g = pool->granularity();
    std::size_t a = result;
    std::size_t b = g;
    while (b != 0) a = std::exchange(b, a % b);  // gcd
    result = result / a * g;
  }
  return result;
}

}  // namespace

namespace detail {

void require_peer_access(std::span<const int> holders, std::span<const access_grant> access,
                         bool (*can_access)(int accessor, int holder)) {
  for (const access_grant& entry : access) {
    if (entry.mode == access_mode::none) continue;
    const int device = entry.who.device_ordinal;
    for (int holder : holders) {
      if (holder == device || can_access(device, holder)) continue;
      throw invalid_argument(
          fmt::format("striped_buffer: gpu {} cannot access the memory of gpu {} (no peer access "
                      "between them), "
                      "so it cannot be given {} access to a range with stripes on gpu {}",
                      device, holder, to_string(entry.mode), holder));
    }
  }
}

}  // namespace detail

striped_buffer::striped_buffer(std::vector<int> devices, std::size_t size, striped_buffer_options options) {
  check_arguments(devices, size, options);
  devices_ = std::move(devices);
  access_ = effective_access(devices_, options.access);

  // The devices and their pools: the first driver calls (driver_unavailable without a
  // driver; invalid_argument for a device that does not exist).
  pools_.reserve(devices_.size());
  for (std::size_t i = 0; i < devices_.size(); ++i)
    pools_.push_back(options.pools.empty() ? default_pool(location::device(devices_[i])) : options.pools[i]);
  auto add_user = [&](int device) {
    if (std::any_of(users_.begin(), users_.end(), [&](const device_user& u) { return u.device == device; }))
      return;
    users_.push_back({device, &provider_for(location::device(device))->executor(), {stream_ref()}});
  };
  for (int device : devices_) add_user(device);
  for (const access_grant& entry : access_)
    if (entry.mode != access_mode::none) add_user(entry.who.device_ordinal);
  for (const device_stream& entry : options.streams) add_stream(entry.device, entry.stream);

  const std::size_t granularity = common_granularity(pools_);
  const std::size_t stripe = options.stripe_size == 0 ? granularity : options.stripe_size;
  for (std::size_t i = 0; i < pools_.size(); ++i)
    if (stripe % pools_[i]->granularity() != 0)
      throw invalid_argument(fmt::format(
          "striped_buffer: stripe size {} is not a multiple of gpu {}'s allocation granularity {}", stripe,
          devices_[i], pools_[i]->granularity()));
  layout_ = make_stripe_layout(round_up(size, granularity), stripe,
                               static_cast<std::uint32_t>(devices_.size()), options.mode);

  detail::require_peer_access(devices_, access_, &can_access_peer);

  // One range, then one chunk per stripe in address order, mapped with no access yet.
  mapped_range run(pools_.front()->provider(), static_cast<std::size_t>(layout_.size));
  for (std::uint64_t offset = 0; offset < layout_.size;) {
    const stripe_position stripe_at = layout_.locate(offset);
    const int device = devices_[stripe_at.device];
    pooled_chunk chunk;
    try {
      chunk = pools_[stripe_at.device]->acquire(stripe_at.extent.length);
    } catch (const out_of_memory& error) {
      throw out_of_memory(
          fmt::format("striped_buffer: no memory for the stripe at offset {} ({} bytes) on gpu {}: {}",
                      offset, stripe_at.extent.length, device, error.what()));
    }
    run.push_back(std::make_shared<const pooled_chunk>(std::move(chunk)));
    offset += stripe_at.extent.length;
  }

  // One access call over the whole range, one grant per accessor: the driver's cost is per
  // call and handle, and every device's memory lives in the one CUDA address space, so the
  // first device's provider covers chunks of every device (vmm/address_space.hpp).
  std::vector<access_grant> grants;
  for (const access_grant& entry : access_)
    if (entry.mode != access_mode::none) grants.push_back(entry);
  if (!grants.empty()) run.set_access(0, run.mapped(), grants);
  run_ = std::move(run);
}

striped_buffer::striped_buffer(striped_buffer&& other) noexcept
    : devices_(std::exchange(other.devices_, {})),
      access_(std::exchange(other.access_, {})),
      pools_(std::exchange(other.pools_, {})),
      users_(std::exchange(other.users_, {})),
      layout_(std::exchange(other.layout_, {})),
      run_(std::move(other.run_)) {}

striped_buffer& striped_buffer::operator=(striped_buffer&& other) noexcept {
  if (this != &other) {
    striped_buffer old(std::move(*this));  // retired by old's destructor
    devices_ = std::exchange(other.devices_, {});
    access_ = std::exchange(other.access_, {});
    pools_ = std::exchange(other.pools_, {});
    users_ = std::exchange(other.users_, {});
    layout_ = std::exchange(other.layout_, {});
    run_ = std::move(other.run_);
  }
  return *this;
}

striped_buffer::~striped_buffer() {
  if (run_.data() == nullptr) return;
  // Work queued on any device may still read or write the range: retire it after all of it.
  std::vector<stream_use> uses;
  for (const device_user& user : users_)
    for (stream_ref stream : user.streams) uses.push_back({user.executor, stream});
  std::move(run_).retire_after(uses);
}

int striped_buffer::device_of(std::size_t offset) const {
  if (offset >= size())
    throw invalid_argument(
        fmt::format("striped_buffer: offset {} is past the {} bytes of the buffer", offset, size()));
  return devices_[layout_.device_of(offset)];
}

std::uint32_t striped_buffer::device_index(int ordinal) const {
  const auto it = std::find(devices_.begin(), devices_.end(), ordinal);
  if (it == devices_.end())
    throw invalid_argument(fmt::format("striped_buffer: gpu {} holds no stripes of this buffer", ordinal));
  return static_cast<std::uint32_t>(it - devices_.begin());
}

void striped_buffer::add_stream(int ordinal, stream_ref stream) {
  const auto it =
      std::find_if(users_.begin(), users_.end(), [&](const device_user& u) { return u.device == ordinal; });
  if (it == users_.end())
    throw invalid_argument(fmt::format(
        "striped_buffer: a stream of gpu {}, which neither holds stripes nor has access", ordinal));
  if (std::find(it->streams.begin(), it->streams.end(), stream) == it->streams.end())
    it->streams.push_back(stream);
}

}  // namespace vmm
