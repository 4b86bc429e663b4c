#pragma once
/// @file
/// The ownership that vmm::address_range, vmm::physical_allocation and vmm::mapping share:
/// `size` bytes at a value (an address, or a physical handle) that must be given back to the
/// provider they came from. Moving, giving back and giving up are written once here; each
/// owner says only how it gives back.
///
/// Giving back may fail (the driver or the OS refused): reset() then keeps what it holds and
/// returns false, so that a later reset() tries again; the destructor and a move assignment
/// try once and then give it up (the failure was reported where it happened).

#include <cstddef>
#include <memory>
#include <utility>

#include "vmm/provider.hpp"

namespace vmm::detail {

/// `GiveBack(provider, value, size)` frees, destroys or unmaps; it returns false when that
/// failed, after reporting it, and never throws. Empty: the provider is null.
template <class Value, bool (*GiveBack)(const std::shared_ptr<memory_provider>&, Value, std::size_t) noexcept>
class provider_owned {
 public:
  provider_owned() noexcept = default;
  /// Takes ownership of what `provider` made.
  provider_owned(std::shared_ptr<memory_provider> provider, Value value, std::size_t size) noexcept
      : provider_(std::move(provider)), value_(value), size_(size) {}
  provider_owned(provider_owned&& other) noexcept
      : provider_(std::move(other.provider_)),
        value_(std::exchange(other.value_, Value{})),
        size_(std::exchange(other.size_, 0)) {}
  provider_owned& operator=(provider_owned&& other) noexcept {
    if (this != &other) {
      give_back_or_give_up();
      provider_ = std::move(other.provider_);
      value_ = std::exchange(other.value_, Value{});
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~provider_owned() { give_back_or_give_up(); }

  [[nodiscard]] const std::shared_ptr<memory_provider>& provider() const noexcept { return provider_; }
  [[nodiscard]] Value value() const noexcept { return value_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  /// Gives back now and becomes empty; false when giving back failed (still owned).
  bool reset() noexcept {
    if (provider_ == nullptr) return true;
    if (!GiveBack(provider_, value_, size_)) return false;
    release();
    return true;
  }
  /// Gives up ownership without giving back; returns the value.
  Value release() noexcept {
    provider_.reset();
    size_ = 0;
    return std::exchange(value_, Value{});
  }

 private:
  void give_back_or_give_up() noexcept {
    if (!reset()) release();
  }

  std::shared_ptr<memory_provider> provider_;
  Value value_{};
  std::size_t size_ = 0;
};

}  // namespace vmm::detail
