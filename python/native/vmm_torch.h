#ifndef VMM_TORCH_H
#define VMM_TORCH_H
/* The C interface of libvmm_torch_allocator.so: vmm::memory_resource for PyTorch (as a
 * pluggable allocator) and anything else that speaks C, over the C++ core of
 * device_resources.hpp.
 *
 *     torch.cuda.memory.CUDAPluggableAllocator(path, "vmm_alloc", "vmm_free")
 *
 * The Python package's module vmm._vmm holds the same core and exports only the first three
 * functions below (what torch loads by name; vmm.torch.library_path() is its path); the
 * package reaches the rest through pybind11, not through this header.
 *
 * One resource per device, made on first use and kept until the process exits (tensors are
 * still freed while the interpreter shuts down). The resource of device d is a
 * vmm::memory_resource over the default chunk pool of vmm::location::device(d), with
 * exportable (POSIX fd) pages where the GPU allows it, so that its memory can be registered
 * with NCCL and shared through vmm::ipc.
 *
 * Errors. No C++ exception leaves a function of this header, with one deliberate exception,
 * vmm_alloc_throwing (see there). A function that fails returns NULL or a negative number
 * and keeps the message for vmm_torch_last_error(): one process-wide message, the latest,
 * since PyTorch allocates on its autograd threads and the caller reads the message on
 * another thread.
 *
 * Tags. Each thread has a current tag (vmm_torch_set_tag), given to every allocation the
 * thread makes; vmm_torch_sleep and vmm_torch_wake act on allocations by tag.
 *
 * Sleep. While a device's resource is asleep, an allocation on it fails (the message says
 * why) and a free is kept and done at the wake that wakes every tag: nothing is lost, and
 * freed memory is not handed out again before its bytes are back. Sleep waits until the
 * allocations and frees already running on other threads have returned.
 */

#include <stddef.h>
#include <stdint.h>

/* The library is built with hidden symbols (it holds vmm and fmt, which other libraries of
 * the process may hold in other versions); only what is marked here is exported. */
#if defined(__GNUC__)
#define VMM_TORCH_API __attribute__((visibility("default")))
#else
#define VMM_TORCH_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* cudaStream_t and CUstream are pointers to it */

/* What a device's resource holds: vmm::memory_resource_statistics plus what this layer
 * counts. Bytes unless said otherwise. */
typedef struct vmm_torch_statistics {
  uint64_t reserved_current; /* physical bytes mapped or kept spare */
  uint64_t reserved_high;
  uint64_t used_current; /* bytes handed out, each rounded up to 256 */
  uint64_t used_high;
  uint64_t allocations;       /* live allocations */
  uint64_t allocations_total; /* allocations made */
  uint64_t segments;          /* address ranges (arenas) */
  uint64_t handles;           /* physical pages mapped or spare */
  uint64_t largest_free_block;
  uint64_t pages_stitched;
  uint64_t pages_created;
  uint64_t pages_released;
  uint64_t host_waits;        /* times an allocation waited for a stream to pass a free */
  uint64_t slow_path_ns;      /* host time of the allocations that took the slow path */
  uint64_t host_wait_ns;      /* host time of the host_waits */
  uint64_t bad_deallocations; /* frees refused by the resource */
  uint64_t out_of_memory;     /* allocations that failed for want of memory */
  uint64_t failed;            /* allocations that failed otherwise (asleep, bad argument) */
  uint64_t frees_deferred;    /* frees that arrived while asleep, done at the wake */
  uint64_t host_copy_bytes;   /* pinned host memory of the sleep, or kept by a wake for the next */
  uint64_t page_size;         /* the granularity */
  uint32_t asleep;            /* 1 while some tag sleeps */
  uint32_t exportable;        /* 1 when the pages are exportable (POSIX fd) */
} vmm_torch_statistics;

/* ---- what torch.cuda.memory.CUDAPluggableAllocator loads ------------------------------ */

/* `size` bytes on `device`, usable by work queued on `stream` from now on, tagged with the
 * calling thread's tag. NULL for size 0, and on any failure (out of memory, asleep, bad
 * device), with the message kept for vmm_torch_last_error(). Never throws.
 * Under torch.cuda.MemPool (torch's caching allocator on top), NULL is what torch turns
 * into torch.OutOfMemoryError after freeing its cache and trying again. */
VMM_TORCH_API void* vmm_alloc(size_t size, int device, struct CUstream_st* stream);

/* Frees in stream order: work queued on `stream` before this call may still use the
 * memory. `size` and `device` as given to vmm_alloc. Never throws; a pointer the resource
 * did not hand out is counted (bad_deallocations) and reported, and nothing changes. */
VMM_TORCH_API void vmm_free(void* ptr, size_t size, int device, struct CUstream_st* stream);

/* vmm_alloc, except that a failure throws a C++ exception (a std::bad_alloc for want of
 * memory, a std::runtime_error otherwise) whose what() starts with "CUDA out of memory."
 * for want of memory. For torch.cuda.memory.change_current_allocator only: there PyTorch
 * calls the function from C++ and does not check for NULL (a NULL becomes a tensor at
 * address 0, and the next kernel faults), while it turns a C++ exception into a Python
 * RuntimeError with the message. Never call it from C. */
VMM_TORCH_API void* vmm_alloc_throwing(size_t size, int device, struct CUstream_st* stream);

/* ---- for other C callers (the Python package uses the C++ core through pybind11) ---- */

/* Allocates like vmm_alloc into *out. Returns 0, 1 when memory ran out, -1 on any other
 * failure (message in vmm_torch_last_error()). */
VMM_TORCH_API int vmm_torch_allocate(int device, struct CUstream_st* stream, size_t size, void** out);

/* Settings for resources made from now on: max_size (0: the GPU's memory), the release
 * threshold (SIZE_MAX: keep idle pages) and the headroom (0: the default; a share from 0
 * to 1), as in vmm::memory_resource_properties. Returns 0, or -1 once a resource has been
 * made (the settings would not apply to it) or for a headroom outside [0, 1]. */
VMM_TORCH_API int vmm_torch_configure(size_t max_size, size_t release_threshold, double headroom);
/* vmm_torch_configure with the page size of large requests too (0: vmm's default, 16 times
 * the granularity; else a power of two up to 1 GiB, at least the granularity, which the
 * resource checks when it is made): the Python package's large_page_size. -1 also for a
 * large_page_size that is not a power of two up to 1 GiB; vmm_torch_configure is this
 * function with 0. */
VMM_TORCH_API int vmm_torch_configure_large_pages(size_t max_size, size_t release_threshold, double headroom,
                                                  size_t large_page_size);

/* The calling thread's tag for its later allocations; returns the previous one. */
VMM_TORCH_API uint32_t vmm_torch_set_tag(uint32_t tag);
VMM_TORCH_API uint32_t vmm_torch_tag(void);

/* Fills *out for `device`; makes its resource if there is none yet. 0, or -1. */
VMM_TORCH_API int vmm_torch_statistics_of(int device, vmm_torch_statistics* out);
/* Sets the high-water marks to the current values. 0, or -1. */
VMM_TORCH_API int vmm_torch_reset_peak(int device);
/* Gives idle pages back until at most `bytes_to_keep` are reserved (cudaMemPoolTrimTo),
 * then the chunk pool's idle memory back to the device, and host copies a wake kept back to
 * the system. 0, or -1. */
VMM_TORCH_API int vmm_torch_trim(int device, size_t bytes_to_keep);

/* Puts `device`'s resource to sleep, saving the allocations whose tag is one of
 * offload_tags[0..count) to pinned host memory and dropping the rest; its physical memory
 * goes back to the device. 0, or -1 (asleep already, or the host copies could not be had:
 * nothing changed). */
VMM_TORCH_API int vmm_torch_sleep(int device, const uint32_t* offload_tags, size_t count);
/* Wakes the tags tags[0..count) (count 0: all) of `device`'s resource: fresh memory at the
 * same addresses, saved bytes restored. Once every tag is awake, the frees that arrived
 * during the sleep are done, and the pinned host copies are given back, or kept for the
 * next sleep when keep_host_copies is not 0 (vmm::after_wake). 0, 1 when memory ran out
 * (nothing changed, the tags still sleep), or -1 (not asleep, or another failure). */
VMM_TORCH_API int vmm_torch_wake(int device, const uint32_t* tags, size_t count, int keep_host_copies);
/* 1 while some tag of `device` sleeps, 0 when awake or when it has no resource. */
VMM_TORCH_API int vmm_torch_asleep(int device);

/* The devices that have a resource, ascending, into out[0..capacity); returns how many
 * there are (which may exceed capacity). */
VMM_TORCH_API size_t vmm_torch_devices(int* out, size_t capacity);

/* Copies the latest error message (NUL-terminated, cut to fit) into `buffer` and returns
 * its full length; 0 when there was none. `buffer` may be NULL when `size` is 0. */
VMM_TORCH_API size_t vmm_torch_last_error(char* buffer, size_t size);
VMM_TORCH_API void vmm_torch_clear_last_error(void);

/* For tests: every "device" from now on is plain host memory of the OS provider (memfd +
 * mmap, no GPU, synchronous), so that this layer runs in CI. Returns 0, or -1 once a
 * resource has been made. */
VMM_TORCH_API int vmm_torch_testing_use_host_memory(void);

#ifdef __cplusplus
}
#endif
#endif /* VMM_TORCH_H */
