// GrowableBuffer and DLPack for the pybind11 module (bindings.hpp).
//
// Lifetime. Every view Python gets of a buffer's memory holds the buffer: a memoryview of
// the buffer protocol holds its exporter, and a DLPack capsule holds the Python object it
// was made from (the buffer, or a vmm.Vector over it) until the consumer calls the deleter.
// The address never changes (growable_buffer), so growing never invalidates a view;
// shrinking unmaps what lies past the new size, which a view past it must not read.

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fcntl.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "device_resources.hpp"
#include "dlpack.hpp"
#include "vmm/error.hpp"
#include "vmm/growable_buffer.hpp"
#include "vmm/ipc/exporter.hpp"
#include "vmm/ipc/importer.hpp"
#include "vmm/ipc/manifest.hpp"
#include "vmm/unique_fd.hpp"
#include "vmm/location.hpp"
#include "vmm/memory_resource.hpp"
#include "vmm/provider.hpp"
#include "vmm/stream_ref.hpp"

namespace py = pybind11;

namespace vmm_python {

// "os_host", "pinned_host" or "pinned_host:NODE", "cuda" or "cuda:ORDINAL".
vmm::location parse_location(std::string_view text) {
  const std::size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  int id = 0;
  if (colon != std::string_view::npos) {
    const std::string_view number = text.substr(colon + 1);
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), id);
    if (number.empty() || error != std::errc() || end != number.data() + number.size() || id < 0)
      throw vmm::invalid_argument(
          fmt::format("location \"{}\": \"{}\" is not a device or node number", text, number));
  }
  if (kind == "os_host" && colon == std::string_view::npos) return vmm::location::os_host();
  if (kind == "pinned_host") return vmm::location::pinned_host(id);
  if (kind == "cuda") return vmm::location::device(id);
  throw vmm::invalid_argument(fmt::format(
      "location \"{}\" is not one of \"os_host\", \"pinned_host[:NODE]\", \"cuda[:ORDINAL]\"", text));
}

std::string name_of(const vmm::location& where) {
  switch (where.kind) {
    case vmm::memory_kind::os_host:
      return "os_host";
    case vmm::memory_kind::pinned_host:
      return fmt::format("pinned_host:{}", where.id);
    case vmm::memory_kind::device:
      break;
  }
  return fmt::format("cuda:{}", where.id);
}

namespace {

bool host_readable(const vmm::location& where) {
  return where.kind != vmm::memory_kind::device;
}

vmm::stream_ref stream_of(std::uintptr_t stream) {
  return vmm::stream_ref(reinterpret_cast<CUstream_st*>(stream));  // NOLINT(performance-no-int-to-ptr)
}

// The buffer protocol's view of `size` bytes at `data` of memory at `where` (uint8, 1-D).
py::buffer_info host_bytes(const vmm::location& where, void* data, std::size_t size, bool read_only) {
  if (!host_readable(where))
    throw py::buffer_error(
        fmt::format("{} memory has no buffer protocol (the CPU cannot read it): use "
                    "__dlpack__ or __cuda_array_interface__",
                    name_of(where)));
  return py::buffer_info(data, 1, py::format_descriptor<std::uint8_t>::format(), 1,
                         {static_cast<py::ssize_t>(size)}, {1}, read_only);
}

// (manifest bytes, fds) of an export: the descriptors become the Python caller's to close.
py::tuple manifest_and_fds(vmm::ipc::exported_manifest& sent) {
  std::vector<int> fds;
  fds.reserve(sent.fds.size());
  for (vmm::unique_fd& fd : sent.fds) fds.push_back(fd.release());
  return py::make_tuple(py::bytes(reinterpret_cast<const char*>(sent.bytes.data()), sent.bytes.size()), fds);
}

// The export options of a share: read-only grants the importer read access only.
vmm::ipc::export_options share_options(bool read_only) {
  vmm::ipc::export_options options;
  options.grant = read_only ? vmm::access_mode::read_only : vmm::access_mode::read_write;
  return options;
}

// vmm::growable_buffer with the location it was made for.
struct python_buffer {
  python_buffer(vmm::location where_, std::size_t max_size)
      : where(where_), buffer(where_, vmm::growable_buffer_options{.max_size = max_size}) {}
  vmm::location where;
  vmm::growable_buffer buffer;
};

}  // namespace

// (DLDeviceType, device id) of memory at `where`.
std::pair<int, int> dlpack_device_of(const vmm::location& where) {
  switch (where.kind) {
    case vmm::memory_kind::os_host:
      return {dlpack::cpu, 0};
    case vmm::memory_kind::pinned_host:
      return {dlpack::cuda_host, 0};
    case vmm::memory_kind::device:
      break;
  }
  return {dlpack::cuda, where.id};
}

namespace {

// What a capsule's DLManagedTensor points to: the shape, and the Python owner of the memory.
struct dlpack_context {
  dlpack::managed_tensor managed{};
  std::vector<std::int64_t> shape;
  py::object owner;
};

void delete_context(dlpack::managed_tensor* self) noexcept {
  // Consumers call the deleter with or without the GIL; the owner's reference needs it.
  const PyGILState_STATE gil = PyGILState_Ensure();
  delete static_cast<dlpack_context*>(self->manager_ctx);
  PyGILState_Release(gil);
}

constexpr const char* unused_capsule = "dltensor";

void delete_unused_capsule(PyObject* capsule) noexcept {
  // A consumer renames the capsule "used_dltensor" and owns the tensor from then on.
  if (PyCapsule_IsValid(capsule, unused_capsule) == 0) return;
  auto* managed = static_cast<dlpack::managed_tensor*>(PyCapsule_GetPointer(capsule, unused_capsule));
  managed->deleter(managed);
}

}  // namespace

// A capsule over [data, data + product(shape) * bits / 8) of `owner`'s memory.
py::capsule dlpack_capsule(py::object owner, std::uintptr_t data, const std::vector<std::int64_t>& shape,
                           std::uint8_t code, std::uint8_t bits, std::pair<int, int> device) {
  if (bits == 0 || bits % 8 != 0)
    throw vmm::invalid_argument(fmt::format("bits {} is not a whole number of bytes", bits));
  for (const std::int64_t extent : shape)
    if (extent < 0) throw vmm::invalid_argument(fmt::format("shape has a negative extent {}", extent));
  auto context = std::make_unique<dlpack_context>();
  context->shape = shape;
  context->owner = std::move(owner);
  dlpack::tensor& tensor = context->managed.dl_tensor;
  tensor.data = reinterpret_cast<void*>(data);  // NOLINT(performance-no-int-to-ptr)
  tensor.where = {device.first, device.second};
  tensor.ndim = static_cast<std::int32_t>(context->shape.size());
  tensor.dtype = {code, bits, 1};
  tensor.shape = context->shape.data();
  tensor.strides = nullptr;
  tensor.byte_offset = 0;
  context->managed.manager_ctx = context.get();
  context->managed.deleter = &delete_context;
  PyObject* capsule = PyCapsule_New(&context->managed, unused_capsule, &delete_unused_capsule);
  if (capsule == nullptr) throw py::error_already_set();
  context.release();  // the capsule's, or its consumer's, from now on
  return py::reinterpret_steal<py::capsule>(capsule);
}

namespace {

// The exporter of every buffer this process shares: each chunk is exported once, and its fd
// cached while the chunk lives (vmm/ipc/exporter.hpp). Never destroyed: a handle may be
// made while the interpreter shuts down.
vmm::ipc::exporter& buffer_exporter() {
  static auto* const kept = new vmm::ipc::exporter();
  return *kept;
}

// A receiver's copy of a lease (receiver_leases.hpp): closed last, once the work this
// process queued on the memory has passed, so that the sender reuses nothing still read.
// The import's unmapping is ordered after the legacy default stream (imported_buffer), and
// so is this wait.
class held_lease {
 public:
  held_lease(vmm::unique_fd fd, const vmm::location& where) : fd_(std::move(fd)), where_(where) {}
  held_lease(held_lease&&) noexcept = default;
  held_lease& operator=(held_lease&&) noexcept = default;
  held_lease(const held_lease&) = delete;
  held_lease& operator=(const held_lease&) = delete;
  ~held_lease() {
    if (fd_.get() < 0 || host_readable(where_)) return;
    try {
      vmm::provider_for(where_)->executor().synchronize(vmm::stream_ref{});
    } catch (const std::exception& error) {
      // The device is lost: nothing of this process reads the memory any more either.
      vmm::report_cleanup_failure(fmt::format("closing a shared tensor's lease: {}", error.what()).c_str());
    }
  }

 private:
  vmm::unique_fd fd_;
  vmm::location where_;
};

// Another process's buffer (or one of this process's, shared with itself), mapped here.
// The lease is declared first, so it is closed after the buffer is unmapped.
struct python_import {
  held_lease lease;
  vmm::ipc::imported_buffer buffer;
  vmm::location where;
  bool read_only = false;
};

vmm::unique_fd duplicate(int fd, const char* what) {
  vmm::unique_fd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (copy.get() < 0) throw vmm::os_error(errno, fmt::format("{}: cannot duplicate descriptor {}", what, fd));
  return copy;
}

python_import import_shared(const py::bytes& manifest_bytes, const std::vector<int>& fds, bool read_only,
                            int lease) {
  const std::string_view bytes = manifest_bytes;
  const vmm::ipc::manifest description =
      vmm::ipc::parse_manifest(std::as_bytes(std::span(bytes.data(), bytes.size())));
  std::vector<vmm::unique_fd> owned;
  owned.reserve(fds.size());
  for (const int fd : fds) {
    // The handle keeps its own descriptors (it may be opened again): the import gets copies.
    owned.push_back(duplicate(fd, "fds"));
  }
  vmm::unique_fd lease_copy = lease < 0 ? vmm::unique_fd() : duplicate(lease, "lease");
  const bool granted_read_only = description.grant == vmm::access_mode::read_only;
  vmm::ipc::import_options options;
  options.access =
      read_only || granted_read_only ? vmm::access_mode::read_only : vmm::access_mode::read_write;
  return python_import{held_lease(std::move(lease_copy), description.where),
                       vmm::ipc::imported_buffer(description, std::move(owned), options), description.where,
                       options.access == vmm::access_mode::read_only};
}

}  // namespace

void purge_shared_exports() {
  buffer_exporter().purge();
}

void bind_buffers(py::module_& m) {
  py::class_<python_buffer>(m, "GrowableBuffer", py::buffer_protocol(),
                            R"(Bytes that grow at a stable address.

GrowableBuffer(location="os_host", max_size=0): an address range of max_size bytes (0: the
location's memory) on "os_host" (host memory from the OS), "pinned_host[:NODE]" or
"cuda[:ORDINAL]"; resize() maps or unmaps memory at its end, data never moves. Host memory
has the buffer protocol (memoryview, numpy.asarray); every location has DLPack
(torch.from_dlpack, cupy.from_dlpack, numpy.from_dlpack) and GPU memory
__cuda_array_interface__. Views hold the buffer alive; shrinking unmaps what is past the
new size, which no view may read afterwards.)")
      .def(py::init([](const std::string& location, std::size_t max_size) {
             return std::make_unique<python_buffer>(parse_location(location), max_size);
           }),
           py::arg("location") = "os_host", py::arg("max_size") = 0)
      .def(
          "resize",
          [](python_buffer& self, std::size_t bytes, std::uintptr_t stream) {
            self.buffer.resize(bytes, stream_of(stream));
          },
          py::arg("bytes"), py::arg("stream") = 0, "Sets the size; the address stays.")
      .def(
          "reserve",
          [](python_buffer& self, std::size_t bytes, std::uintptr_t stream) {
            self.buffer.reserve(bytes, stream_of(stream));
          },
          py::arg("bytes"), py::arg("stream") = 0, "Maps at least `bytes` without changing the size.")
      .def(
          "shrink_to_fit",
          [](python_buffer& self, std::uintptr_t stream) { self.buffer.shrink_to_fit(stream_of(stream)); },
          py::arg("stream") = 0)
      .def_property_readonly("size", [](const python_buffer& self) { return self.buffer.size(); })
      .def("__len__", [](const python_buffer& self) { return self.buffer.size(); })
      .def_property_readonly("capacity", [](const python_buffer& self) { return self.buffer.capacity(); })
      .def_property_readonly("max_size", [](const python_buffer& self) { return self.buffer.max_size(); })
      .def_property_readonly(
          "data",
          [](const python_buffer& self) { return reinterpret_cast<std::uintptr_t>(self.buffer.data()); })
      .def_property_readonly("location", [](const python_buffer& self) { return name_of(self.where); })
      .def(
          "write",
          [](python_buffer& self, std::size_t offset, const py::buffer& source) {
            const py::buffer_info info = source.request();
            const auto bytes = static_cast<std::size_t>(info.size * info.itemsize);
            if (!host_readable(self.where))
              throw vmm::invalid_argument(fmt::format(
                  "write: the buffer is {} memory; copy into it through torch or cupy (from_dlpack)",
                  name_of(self.where)));
            if (offset > self.buffer.size() || bytes > self.buffer.size() - offset)
              throw vmm::invalid_argument(fmt::format("write: offset {} + {} bytes is past the size {}",
                                                      offset, bytes, self.buffer.size()));
            std::memcpy(static_cast<std::byte*>(self.buffer.data()) + offset, info.ptr, bytes);
          },
          py::arg("offset"), py::arg("source"),
          "Copies a bytes-like object in at `offset` (host memory only).")
      .def_buffer([](python_buffer& self) {
        return host_bytes(self.where, self.buffer.data(), self.buffer.size(), false);
      })
      .def(
          "__dlpack__",
          [](py::object self, const py::object& /*stream*/) {
            const python_buffer& buffer = self.cast<const python_buffer&>();
            const auto data = reinterpret_cast<std::uintptr_t>(buffer.buffer.data());
            const std::vector<std::int64_t> shape{static_cast<std::int64_t>(buffer.buffer.size())};
            return dlpack_capsule(std::move(self), data, shape, dlpack::uint_code, 8,
                                  dlpack_device_of(buffer.where));
          },
          py::arg("stream") = py::none(),
          "A DLPack capsule of the bytes (uint8, 1-D). Work on the consumer's stream must be ordered after "
          "the "
          "buffer's by the caller.")
      .def("__dlpack_device__", [](const python_buffer& self) { return dlpack_device_of(self.where); })
      .def_property_readonly("__cuda_array_interface__", [](const python_buffer& self) {
        if (host_readable(self.where))
          throw py::attribute_error(
              fmt::format("{} memory has no __cuda_array_interface__", name_of(self.where)));
        py::dict interface;
        interface["shape"] = py::make_tuple(self.buffer.size());
        interface["typestr"] = "|u1";
        interface["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(self.buffer.data()), false);
        interface["version"] = 3;
        return interface;
      });

  m.def(
      "share_buffer",
      [](const python_buffer& self, bool read_only) {
        vmm::ipc::exported_manifest sent =
            buffer_exporter().export_buffer(self.buffer, share_options(read_only));
        return manifest_and_fds(sent);
      },
      py::arg("buffer"), py::arg("read_only"),
      "(manifest bytes, fds) of every chunk the buffer maps now (vmm::ipc::exporter); the fds are the "
      "caller's.");

  m.def(
      "share_allocation",
      [](std::uintptr_t ptr, std::size_t size, int device, bool read_only) {
        const void* start = reinterpret_cast<const void*>(ptr);  // NOLINT(performance-no-int-to-ptr)
        const vmm::memory_resource::allocation_pages pages = vmm_python::pages_of(device, start, size);
        vmm::ipc::exported_manifest sent =
            buffer_exporter().export_chunks(pages.pages, share_options(read_only));
        // The pages travel back to back: the allocation starts this far into the first one.
        const std::size_t offset = ptr - (pages.arena_base + pages.first_page * pages.page_size);
        vmm::unique_fd lease = vmm_python::lease_allocation(device, start, size);
        return manifest_and_fds(sent) + py::make_tuple(offset, lease.release());
      },
      py::arg("ptr"), py::arg("size"), py::arg("device"), py::arg("read_only"),
      "(manifest bytes, fds, offset, lease fd) of the pages under a live allocation of a device's "
      "resource; the fds are the caller's. The allocation's free is held until every copy of the "
      "lease is closed (receivers hold it while they map the memory).");

  m.def(
      "held_for_receivers",
      [](int device) {
        const held_frees held = vmm_python::held_for_receivers(device);
        return py::make_tuple(held.frees, held.bytes);
      },
      py::arg("device"),
      "(frees, bytes) held until the processes a tensor was shared with let go, after completing "
      "those whose receivers all have.");

  py::class_<python_import>(
      m, "ImportedBuffer", py::buffer_protocol(),
      "A shared buffer mapped in this process (vmm.open); holds the memory while it lives.")
      .def(py::init(&import_shared), py::arg("manifest"), py::arg("fds"), py::arg("read_only") = false,
           py::arg("lease") = -1)
      .def_property_readonly(
          "data",
          [](const python_import& self) { return reinterpret_cast<std::uintptr_t>(self.buffer.data()); })
      .def_property_readonly("size", [](const python_import& self) { return self.buffer.size(); })
      .def("__len__", [](const python_import& self) { return self.buffer.size(); })
      .def_property_readonly("location", [](const python_import& self) { return name_of(self.where); })
      .def_property_readonly("read_only", [](const python_import& self) { return self.read_only; })
      .def_buffer([](python_import& self) {
        return host_bytes(self.where, self.buffer.data(), self.buffer.size(), self.read_only);
      })
      .def("__dlpack_device__", [](const python_import& self) { return dlpack_device_of(self.where); });

  m.def(
      "dlpack_capsule",
      [](py::object owner, std::uintptr_t data, const std::vector<std::int64_t>& shape, std::uint8_t code,
         std::uint8_t bits, int device_type, int device_id) {
        return dlpack_capsule(std::move(owner), data, shape, code, bits, {device_type, device_id});
      },
      py::arg("owner"), py::arg("data"), py::arg("shape"), py::arg("code"), py::arg("bits"),
      py::arg("device_type"), py::arg("device_id"),
      "A DLPack capsule over memory that `owner` keeps alive (held until the consumer is done).");
  m.def(
      "parse_location", [](const std::string& text) { return name_of(parse_location(text)); },
      py::arg("location"), "The canonical name of a location; refuses a bad one naming it.");
}

}  // namespace vmm_python
