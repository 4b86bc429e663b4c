#pragma once
/// @file
/// The latest error message of the process, for callers that get only a status (the C
/// interface of vmm_torch.h, a NULL under torch's caching allocator) and for vmm's cleanup
/// failure handler. One message for the process, the latest: PyTorch allocates on its
/// autograd threads and the caller reads the message on another thread.

#include <string>

namespace vmm_python {

/// Keeps `message` as the latest (a failure to copy it keeps the previous one).
void keep_last_error(const char* message) noexcept;

/// The latest message ("" when there was none).
/// @throws std::bad_alloc no memory for the copy.
[[nodiscard]] std::string last_error();

/// Forgets the latest message.
void clear_last_error() noexcept;

}  // namespace vmm_python
