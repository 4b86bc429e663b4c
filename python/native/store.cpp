// vmm-store for the pybind11 module (bindings.hpp): a client's tensor sets and a daemon on a
// thread of this process. The Python face, vmm.store, turns a state dict into the rows put()
// takes and the rows of a set into torch tensors or numpy arrays (python/vmm/store.py).
//
// Private tensors (get's private_names: tensor_set::make_private) are writable: torch tensors
// through the same DLPack capsules, numpy arrays through PrivateBytes, a writable buffer.
//
// Lifetime. A TensorSet holds the set (its buffer handle, so the daemon keeps it and this
// process keeps it mapped); every DLPack capsule and memoryview made of it holds the
// TensorSet, so a tensor outlives the dict it came in and the client it was got through.

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "vmm/error.hpp"
#include "vmm/store/client.hpp"
#include "vmm/store/server.hpp"
#include "vmm/store/tensor_set.hpp"

namespace py = pybind11;

namespace vmm_python {
namespace {

// A client, usable from one Python thread at a time (the GIL's).
struct python_client {
  explicit python_client(const std::string& path)
      : client(vmm::store::client_options{.socket_path =
                                              path.empty() ? vmm::store::default_socket_path() : path}) {}
  vmm::store::client client;
};

struct python_set {
  vmm::store::tensor_set set;
};

// The bytes of one private tensor, writable through the buffer protocol (numpy arrays of
// private tensors); holds the set.
struct python_private_bytes {
  std::shared_ptr<python_set> owner;
  void* data = nullptr;
  std::size_t bytes = 0;
};

// (name, dtype name, shape, data address): what put() takes and tensors() gives, per tensor.
using tensor_row = std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t>;

// One buffer or set as a dict of `vmm-store ls --json`'s fields: what list() and stat() give.
py::dict row_of(const vmm::store::buffer_info& info) {
  py::dict row;
  row["name"] = info.name;
  row["location"] = name_of(info.where);
  row["size"] = info.size;
  row["capacity"] = info.capacity;
  row["holders"] = info.holders;
  row["sealed"] = info.sealed;
  row["tensors"] = info.tensors;
  row["named_bytes"] = info.named_bytes;
  row["stored_bytes"] = info.stored_bytes;
  row["shared_bytes"] = info.shared_bytes;
  return row;
}

vmm::store::dtype dtype_named(const std::string& name) {
  const auto found = vmm::store::dtype_from_name(name);
  if (!found) throw vmm::invalid_argument(fmt::format("dtype \"{}\" is not a safetensors dtype", name));
  return *found;
}

// A daemon serving on its own thread until stopped (or destroyed).
class python_daemon {
 public:
  python_daemon(const std::string& path, std::uint64_t cap)
      : server_(vmm::store::server_options{.socket_path = path, .cap = static_cast<std::size_t>(cap)}),
        thread_([this] { server_.run(); }) {}
  python_daemon(const python_daemon&) = delete;
  python_daemon& operator=(const python_daemon&) = delete;
  ~python_daemon() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    server_.stop();
    thread_.join();
  }
  [[nodiscard]] const std::string& path() const noexcept { return server_.options().socket_path; }

 private:
  vmm::store::server server_;
  std::thread thread_;
};

}  // namespace

void bind_store(py::module_& m) {
  py::class_<python_set, std::shared_ptr<python_set>>(
      m, "TensorSet", py::buffer_protocol(),
      "A read-only vmm-store tensor set mapped here (vmm.store.Client.get); holds it while it lives.")
      .def_property_readonly("name", [](const python_set& self) { return self.set.memory().name(); })
      .def_property_readonly("location",
                             [](const python_set& self) { return name_of(self.set.memory().where()); })
      .def_property_readonly(
          "data",
          [](const python_set& self) { return reinterpret_cast<std::uintptr_t>(self.set.memory().data()); })
      .def(
          "tensors",
          [](const python_set& self) {
            std::vector<std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uint64_t>> rows;
            for (const vmm::store::tensor_info& t : self.set.tensors())
              rows.emplace_back(t.name, vmm::store::to_string(t.type), t.shape, t.offset);
            return rows;
          },
          "(name, dtype, shape, byte offset) of every tensor, in the set's order.")
      .def_buffer([](python_set& self) {
        const vmm::store::buffer& memory = self.set.memory();
        if (memory.where().kind == vmm::memory_kind::device)
          throw py::buffer_error(
              fmt::format("{} memory has no buffer protocol: use DLPack", name_of(memory.where())));
        return py::buffer_info(memory.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(memory.size())}, {1}, true);
      })
      .def("__dlpack_device__",
           [](const python_set& self) { return dlpack_device_of(self.set.memory().where()); })
      .def(
          "private_names",
          [](const python_set& self) {
            std::vector<std::string> names;
            for (const vmm::store::tensor_info& t : self.set.tensors())
              if (self.set.is_private(t.name)) names.push_back(t.name);
            return names;
          },
          "The tensors private to this process (writable), in the set's order.")
      .def(
          "private_bytes",
          [](const std::shared_ptr<python_set>& self, const std::string& name) {
            void* data = self->set.data_writable(name);
            return python_private_bytes{self, data, static_cast<std::size_t>(self->set.at(name).info->bytes)};
          },
          py::arg("name"), "The writable bytes of a private tensor (host memory: a buffer).");

  py::class_<python_private_bytes>(m, "PrivateBytes", py::buffer_protocol(),
                                   "The writable bytes of a private tensor; holds its set.")
      .def_buffer([](python_private_bytes& self) {
        if (self.owner->set.memory().where().kind == vmm::memory_kind::device)
          throw py::buffer_error(fmt::format("{} memory has no buffer protocol: use DLPack",
                                             name_of(self.owner->set.memory().where())));
        return py::buffer_info(self.data, 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(self.bytes)}, {1}, false);
      });

  py::class_<python_client>(m, "StoreClient", "A connection to a vmm-store daemon (vmm.store.Client).")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def(
          "put",
          [](python_client& self, const std::string& name, const std::vector<tensor_row>& rows,
             const std::string& location, bool dedup) {
            std::vector<vmm::store::tensor_source> sources;
            sources.reserve(rows.size());
            for (const auto& [tensor, dtype, shape, data] : rows)
              sources.push_back(
                  {.name = tensor,
                   .type = dtype_named(dtype),
                   .shape = shape,
                   .data = reinterpret_cast<const void*>(data)});  // NOLINT(performance-no-int-to-ptr)
            // De-duplication shares chunks: the layout that gives each large tensor its own.
            const vmm::store::tensor_set_options options =
                dedup ? vmm::store::tensor_set_options{.layout = vmm::store::set_layout::per_tensor,
                                                       .deduplicate = true}
                      : vmm::store::tensor_set_options{};
            return std::make_shared<python_set>(python_set{
                vmm::store::tensor_set::put(self.client, name, sources, parse_location(location), options)});
          },
          py::arg("name"), py::arg("tensors"), py::arg("location"), py::arg("dedup") = false,
          "Puts (name, dtype, shape, address) rows as the sealed set `name` at `location` (dedup: laid "
          "out per tensor and de-duplicated); returns it read-only.")
      .def(
          "get",
          [](python_client& self, const std::string& name, const std::vector<std::string>& private_names) {
            if (private_names.empty())
              return std::make_shared<python_set>(python_set{vmm::store::tensor_set::get(self.client, name)});
            return std::make_shared<python_set>(
                python_set{vmm::store::tensor_set::get(self.client, name, private_names)});
          },
          py::arg("name"), py::arg("private_names") = std::vector<std::string>{},
          "The tensor set `name`, read-only but for the tensors named private (copies of their "
          "chunks, writable, at addresses of this set's own).")
      .def(
          "reconnect", [](python_client& self) { return self.client.reconnect(); },
          py::call_guard<py::gil_scoped_release>(),
          "Connects again; after a daemon restart offers it every sealed set this client maps "
          "(vmm::store::client::reconnect). Returns the refused offers as 'name: why'.")
      .def(
          "remove", [](python_client& self, const std::string& name) { self.client.remove(name); },
          py::arg("name"), "Frees the name; the set lives while a process holds it.")
      .def(
          "list",
          [](python_client& self) {
            py::list rows;
            for (const vmm::store::buffer_info& info : self.client.list()) rows.append(row_of(info));
            return rows;
          },
          "Every named buffer and set, as dicts of vmm-store ls --json's fields.")
      .def(
          "stat", [](python_client& self, const std::string& name) { return row_of(self.client.stat(name)); },
          py::arg("name"), "One buffer or set, as a dict of list()'s fields.")
      .def(
          "statistics",
          [](python_client& self) {
            const vmm::store::daemon_statistics s = self.client.statistics();
            py::dict row;
            row["connections"] = s.connections;
            row["entries"] = s.entries;
            row["named_entries"] = s.named_entries;
            row["holds"] = s.holds;
            row["bytes"] = s.bytes;
            row["capacity"] = s.capacity;
            row["pool_used"] = s.pool_used;
            row["pool_reserved"] = s.pool_reserved;
            row["cached_exports"] = s.cached_exports;
            row["open_fds"] = s.open_fds;
            return row;
          },
          "The daemon's counters, as a dict of vmm-store stats --json's fields.");

  py::class_<python_daemon>(m, "StoreDaemon", "A vmm-store daemon serving on a thread of this process.")
      .def(py::init<const std::string&, std::uint64_t>(), py::arg("path"), py::arg("cap"))
      .def_property_readonly("path", &python_daemon::path)
      .def("stop", &python_daemon::stop, py::call_guard<py::gil_scoped_release>(),
           "Stops serving; every client's connection closes.");
}

}  // namespace vmm_python
