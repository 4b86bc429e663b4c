// The C interface of vmm_torch.h over the C++ core of device_resources.hpp.
//
// Errors. Every entry point catches everything: no exception reaches a C caller.
// vmm_alloc_throwing is the one entry point that throws on purpose, for PyTorch's
// change_current_allocator, which calls it from C++ and does not check for NULL
// (torch/csrc/cuda/CUDAPluggableAllocator.cpp, CUDAPluggableAllocator::malloc): a NULL
// there becomes a tensor at address 0 and the next kernel faults, poisoning the CUDA
// context, while an exception becomes a Python RuntimeError carrying vmm's message.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_resources.hpp"
#include "last_error.hpp"
#include "vmm/error.hpp"
#include "vmm_torch.h"

namespace {

enum class outcome { ok, out_of_memory, failed };

// Runs `fn`, turning any exception into a kept message (also stored in *message when
// given). `context` is called only on failure, to name what failed.
template <class Fn, class Context>
outcome guarded(Fn&& fn, Context&& context, std::string* message = nullptr) noexcept {
  const auto keep = [&](const char* what) noexcept {
    try {
      std::string text = fmt::format("{}: {}", context(), what);
      vmm_python::keep_last_error(text.c_str());
      if (message != nullptr) *message = std::move(text);
    } catch (...) {
      vmm_python::keep_last_error(what);
    }
  };
  try {
    fn();
    return outcome::ok;
  } catch (const std::bad_alloc& error) {
    keep(error.what());
    return outcome::out_of_memory;
  } catch (const std::exception& error) {
    keep(error.what());
    return outcome::failed;
  } catch (...) {
    keep("an unknown exception");
    return outcome::failed;
  }
}

int status_of(outcome result) noexcept {
  switch (result) {
    case outcome::ok:
      return 0;
    case outcome::out_of_memory:
      return 1;
    case outcome::failed:
      break;
  }
  return -1;
}

// vmm_python::configure for the C entry `name`: 0, or -1 with the message kept.
int configure_as(const char* name, const vmm_python::resource_settings& settings) noexcept {
  return status_of(guarded([&] { vmm_python::configure(settings); }, [name] { return std::string(name); }));
}

std::span<const std::uint32_t> tags_of(const std::uint32_t* tags, std::size_t count) {
  if (count != 0 && tags == nullptr)
    throw vmm::invalid_argument(fmt::format("vmm_torch: {} tags at NULL", count));
  return {tags, count};
}

std::string allocation_name(std::size_t size, int device) {
  return fmt::format("vmm_alloc({} bytes, {})", size, vmm_python::name_of(device));
}

}  // namespace

extern "C" {

void* vmm_alloc(size_t size, int device, CUstream_st* stream) {
  void* result = nullptr;
  guarded([&] { result = vmm_python::allocate(size, device, stream); },
          [&] { return allocation_name(size, device); });
  return result;
}

void* vmm_alloc_throwing(size_t size, int device, CUstream_st* stream) {
  void* result = nullptr;
  std::string message;
  const outcome done = guarded([&] { result = vmm_python::allocate(size, device, stream); },
                               [&] { return allocation_name(size, device); }, &message);
  if (done == outcome::ok) return result;
  // The prefix is PyTorch's own, which code that retries with less memory looks for.
  if (done == outcome::out_of_memory) throw vmm::out_of_memory("CUDA out of memory. " + message);
  throw std::runtime_error(message);
}

void vmm_free(void* ptr, size_t size, int device, CUstream_st* stream) {
  guarded([&] { vmm_python::deallocate(ptr, size, device, stream); },
          [&] { return fmt::format("vmm_free({}, {} bytes, {})", ptr, size, vmm_python::name_of(device)); });
}

int vmm_torch_allocate(int device, CUstream_st* stream, size_t size, void** out) {
  if (out == nullptr) {
    vmm_python::keep_last_error("vmm_torch_allocate: out is NULL");
    return -1;
  }
  *out = nullptr;
  return status_of(guarded(
      [&] { *out = vmm_python::allocate(size, device, stream); },
      [&] { return fmt::format("vmm_torch_allocate({} bytes, {})", size, vmm_python::name_of(device)); }));
}

int vmm_torch_configure(size_t max_size, size_t release_threshold, double headroom) {
  return configure_as("vmm_torch_configure", {max_size, release_threshold, headroom});
}

int vmm_torch_configure_large_pages(size_t max_size, size_t release_threshold, double headroom,
                                    size_t large_page_size) {
  return configure_as("vmm_torch_configure_large_pages",
                      {max_size, release_threshold, headroom, large_page_size});
}

uint32_t vmm_torch_set_tag(uint32_t tag) {
  return vmm_python::set_tag(tag);
}

uint32_t vmm_torch_tag(void) {
  return vmm_python::current_tag();
}

int vmm_torch_statistics_of(int device, vmm_torch_statistics* out) {
  return status_of(guarded(
      [&] {
        if (out == nullptr) throw vmm::invalid_argument("out is NULL");
        *out = vmm_python::statistics_of(device);
      },
      [&] { return fmt::format("vmm_torch_statistics_of({})", vmm_python::name_of(device)); }));
}

int vmm_torch_reset_peak(int device) {
  return status_of(
      guarded([&] { vmm_python::reset_peak(device); },
              [&] { return fmt::format("vmm_torch_reset_peak({})", vmm_python::name_of(device)); }));
}

int vmm_torch_trim(int device, size_t bytes_to_keep) {
  return status_of(guarded([&] { vmm_python::trim(device, bytes_to_keep); },
                           [&] {
                             return fmt::format("vmm_torch_trim({}, keep {} bytes)",
                                                vmm_python::name_of(device), bytes_to_keep);
                           }));
}

int vmm_torch_sleep(int device, const uint32_t* offload_tags, size_t count) {
  return status_of(guarded([&] { vmm_python::sleep(device, tags_of(offload_tags, count)); },
                           [&] { return fmt::format("vmm_torch_sleep({})", vmm_python::name_of(device)); }));
}

int vmm_torch_wake(int device, const uint32_t* tags, size_t count, int keep_host_copies) {
  return status_of(guarded([&] { vmm_python::wake(device, tags_of(tags, count), keep_host_copies != 0); },
                           [&] { return fmt::format("vmm_torch_wake({})", vmm_python::name_of(device)); }));
}

int vmm_torch_asleep(int device) {
  return vmm_python::asleep(device) ? 1 : 0;
}

size_t vmm_torch_devices(int* out, size_t capacity) {
  std::vector<int> made;
  guarded([&] { made = vmm_python::devices(); }, [] { return std::string("vmm_torch_devices"); });
  if (out != nullptr) std::copy_n(made.begin(), std::min(capacity, made.size()), out);
  return made.size();
}

size_t vmm_torch_last_error(char* buffer, size_t size) {
  std::string message;
  try {
    message = vmm_python::last_error();
  } catch (...) {
    return 0;  // no memory for the copy
  }
  if (buffer != nullptr && size != 0) {
    const std::size_t copied = std::min(size - 1, message.size());
    std::copy_n(message.data(), copied, buffer);
    buffer[copied] = '\0';
  }
  return message.size();
}

void vmm_torch_clear_last_error(void) {
  vmm_python::clear_last_error();
}

int vmm_torch_testing_use_host_memory(void) {
  return status_of(guarded([] { vmm_python::use_host_memory(); },
                           [] { return std::string("vmm_torch_testing_use_host_memory"); }));
}

}  // extern "C"
