// vmm._vmm: the pybind11 module of the Python package vmm.
//
// The same shared library holds the C interface of vmm_torch.h, which torch's
// CUDAPluggableAllocator loads by this file's path (vmm._vmm.__file__): torch, CuPy and this
// module then act on the same resources. Everything else Python sees goes through pybind11:
// vmm's C++ exceptions become vmm.Error and its subclasses by one translator, the
// statistics are a class with a field per figure, and arguments are converted (and refused
// with the argument's name) by pybind11.

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "conf.hpp"
#include "handle_header.hpp"
#include "device_resources.hpp"
#include "last_error.hpp"
#include "vmm/byte_size.hpp"
#include "vmm/error.hpp"
#include "vmm/ipc/protocol_error.hpp"
#include "vmm/store/client.hpp"
#include "vmm_torch.h"

namespace py = pybind11;

namespace {

CUstream_st* stream_of(std::uintptr_t stream) {
  return reinterpret_cast<CUstream_st*>(stream);  // NOLINT(performance-no-int-to-ptr): a handle from Python
}

// Python exception types, made once at import and kept for the process (the translator
// runs until the interpreter ends).
struct exception_types {
  PyObject* error = nullptr;
  PyObject* out_of_memory = nullptr;
  PyObject* invalid_argument = nullptr;
};

exception_types& types() {
  static exception_types kept;
  return kept;
}

PyObject* new_exception(const char* name, py::tuple bases, const char* doc) {
  PyObject* made = PyErr_NewExceptionWithDoc(name, doc, bases.ptr(), nullptr);
  if (made == nullptr) throw py::error_already_set();
  return made;
}

void register_exceptions(py::module_& m) {
  exception_types& kept = types();
  kept.error = new_exception("vmm.Error", py::make_tuple(py::handle(PyExc_RuntimeError)),
                             "A vmm call failed or was refused; nothing was changed. The message says why.");
  kept.out_of_memory = new_exception(
      "vmm.OutOfMemoryError", py::make_tuple(py::handle(kept.error), py::handle(PyExc_MemoryError)),
      "vmm could not have the memory: a pool's cap, the device's memory or the OS's is reached.");
  kept.invalid_argument = new_exception(
      "vmm.InvalidArgumentError", py::make_tuple(py::handle(kept.error), py::handle(PyExc_ValueError)),
      "An argument, a setting or a state was refused; the message names it. Nothing was changed.");
  m.attr("Error") = py::handle(kept.error);
  m.attr("OutOfMemoryError") = py::handle(kept.out_of_memory);
  m.attr("InvalidArgumentError") = py::handle(kept.invalid_argument);
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const vmm::out_of_memory& error) {
      PyErr_SetString(types().out_of_memory, error.what());
    } catch (const vmm::invalid_argument& error) {
      PyErr_SetString(types().invalid_argument, error.what());
    } catch (const vmm::driver_error& error) {
      PyErr_SetString(types().error, error.what());
    } catch (const vmm::os_error& error) {
      PyErr_SetString(types().error, error.what());
    } catch (const vmm::ipc::protocol_error& error) {  // bytes from another process: bad input
      PyErr_SetString(types().invalid_argument, error.what());
    } catch (const vmm::store::store_error& error) {  // the daemon refused, or is gone
      PyErr_SetString(types().error, error.what());
    }
  });
}

// The Python stack of the calling thread, one "file\tline\tfunction" line per frame,
// innermost first; empty on a thread that does not hold the GIL (torch's autograd threads
// allocate without it) or while the interpreter is not running.
std::string python_stack() noexcept {
  if (Py_IsInitialized() == 0 || PyGILState_Check() == 0) return {};
  std::string text;
  try {
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    while (frame != nullptr) {
      PyCodeObject* code = PyFrame_GetCode(frame);
      const char* file = PyUnicode_AsUTF8(code->co_filename);
      const char* name = PyUnicode_AsUTF8(code->co_name);
      if (file == nullptr || name == nullptr) PyErr_Clear();
      text += fmt::format("{}\t{}\t{}\n", file != nullptr ? file : "?", PyFrame_GetLineNumber(frame),
                          name != nullptr ? name : "?");
      Py_DECREF(code);
      PyFrameObject* back = PyFrame_GetBack(frame);
      Py_DECREF(frame);
      frame = back;
    }
  } catch (...) {
    // No memory for the text: what was written stays.
  }
  return text;
}

void bind_history(py::module_& m) {
  using event = vmm_python::history_event;
  py::class_<event>(m, "HistoryEvent", "An allocation or a free recorded by record_history().")
      .def_readonly("allocate", &event::allocate)
      .def_readonly("device", &event::device)
      .def_readonly("tag", &event::tag)
      .def_readonly("ptr", &event::ptr)
      .def_readonly("size", &event::size)
      .def_readonly("stream", &event::stream)
      .def_readonly("time_ns", &event::time_ns)
      .def_readonly("context", &event::context);
  m.def(
      "record_history",
      [](bool enabled, std::size_t max_entries, bool python_stacks) {
        vmm_python::record_history(enabled, max_entries, python_stacks ? &python_stack : nullptr);
      },
      py::arg("enabled"), py::arg("max_entries"), py::arg("python_stacks"),
      "Starts (clearing) or stops recording every allocation and free of the resources.");
  m.def("history", &vmm_python::history, "The recorded events, oldest first.");
}

void bind_resources(py::module_& m) {
  using statistics = vmm_torch_statistics;
  py::class_<statistics>(m, "Statistics", "What a device's resource holds (bytes unless said otherwise).")
      .def_readonly("reserved_current", &statistics::reserved_current)
      .def_readonly("reserved_high", &statistics::reserved_high)
      .def_readonly("used_current", &statistics::used_current)
      .def_readonly("used_high", &statistics::used_high)
      .def_readonly("allocations", &statistics::allocations)
      .def_readonly("allocations_total", &statistics::allocations_total)
      .def_readonly("segments", &statistics::segments)
      .def_readonly("handles", &statistics::handles)
      .def_readonly("largest_free_block", &statistics::largest_free_block)
      .def_readonly("pages_stitched", &statistics::pages_stitched)
      .def_readonly("pages_created", &statistics::pages_created)
      .def_readonly("pages_released", &statistics::pages_released)
      .def_readonly("host_waits", &statistics::host_waits)
      .def_readonly("slow_path_ns", &statistics::slow_path_ns)
      .def_readonly("host_wait_ns", &statistics::host_wait_ns)
      .def_readonly("bad_deallocations", &statistics::bad_deallocations)
      .def_readonly("out_of_memory", &statistics::out_of_memory)
      .def_readonly("failed", &statistics::failed)
      .def_readonly("frees_deferred", &statistics::frees_deferred)
      .def_readonly("host_copy_bytes", &statistics::host_copy_bytes)
      .def_readonly("page_size", &statistics::page_size)
      .def_property_readonly("asleep", [](const statistics& s) { return s.asleep != 0; })
      .def_property_readonly("exportable", [](const statistics& s) { return s.exportable != 0; });

  m.def(
      "allocate",
      [](std::size_t size, int device, std::uintptr_t stream) {
        return reinterpret_cast<std::uintptr_t>(vmm_python::allocate(size, device, stream_of(stream)));
      },
      py::arg("size"), py::arg("device"), py::arg("stream") = 0,
      "Allocates from the device's resource; returns the address (0 for size 0).");
  m.def(
      "deallocate",
      [](std::uintptr_t ptr, std::size_t size, int device, std::uintptr_t stream) {
        vmm_python::deallocate(reinterpret_cast<void*>(ptr), size,
                               device,  // NOLINT(performance-no-int-to-ptr)
                               stream_of(stream));
      },
      py::arg("ptr"), py::arg("size"), py::arg("device"), py::arg("stream") = 0, "Frees in stream order.");
  m.def(
      "configure",
      [](std::size_t max_size, std::size_t release_threshold, double headroom, std::size_t large_page_size) {
        vmm_python::configure({max_size, release_threshold, headroom, large_page_size});
      },
      py::arg("max_size"), py::arg("release_threshold"), py::arg("headroom"), py::arg("large_page_size") = 0,
      "Settings of the resources made from now on.");
  m.def("use_host_memory", &vmm_python::use_host_memory,
        "For tests: every device from now on is host memory of the OS provider.");
  m.def("uses_host_memory", &vmm_python::uses_host_memory);
  m.def("set_tag", &vmm_python::set_tag, py::arg("tag"),
        "Sets the calling thread's tag; returns the previous.");
  m.def("current_tag", &vmm_python::current_tag);
  m.def("statistics", &vmm_python::statistics_of, py::arg("device"));
  m.def("reset_peak", &vmm_python::reset_peak, py::arg("device"));
  m.def(
      "trim",
      [](int device, std::size_t keep) {
        vmm_python::trim(device, keep);
        vmm_python::purge_shared_exports();  // the pages given back may have been shared
      },
      py::arg("device"), py::arg("keep"));
  m.def(
      "sleep",
      [](int device, const std::vector<std::uint32_t>& offload) { vmm_python::sleep(device, offload); },
      py::arg("device"), py::arg("offload_tags"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "wake",
      [](int device, const std::vector<std::uint32_t>& tags, bool keep_host_copies) {
        vmm_python::wake(device, tags, keep_host_copies);
      },
      py::arg("device"), py::arg("tags"), py::arg("keep_host_copies"),
      py::call_guard<py::gil_scoped_release>());
  m.def("asleep", &vmm_python::asleep, py::arg("device"));
  m.def(
      "owns",
      [](int device, std::uintptr_t ptr) {
        return vmm_python::owns(device,
                                reinterpret_cast<const void*>(ptr));  // NOLINT(performance-no-int-to-ptr)
      },
      py::arg("device"), py::arg("ptr"), "Whether the address is in the device's resource.");
  m.def("devices", &vmm_python::devices);
  m.def("last_error", &vmm_python::last_error, "The latest message of the C interface ('' when none).");
  m.def("clear_last_error", &vmm_python::clear_last_error);
  m.attr("max_devices") = vmm_python::max_devices;
  m.def("parse_byte_size", &vmm::parse_byte_size, py::arg("text"),
        "Bytes of 4096, 64M, 64MiB, 1.5G, ... (vmm::parse_byte_size); refuses a bad text naming why.");
  m.def("format_byte_size", &vmm::format_byte_size, py::arg("bytes"),
        "`bytes` in the largest binary unit, as parse_byte_size reads it back.");
  m.def(
      "parse_conf",
      [](std::string_view text) {
        const vmm_python::conf_settings settings = vmm_python::parse_conf(text);
        py::dict result;
        if (settings.max_size) result["max_size"] = *settings.max_size;
        if (settings.release_threshold)
          result["release_threshold"] =
              settings.release_threshold->has_value() ? py::cast(**settings.release_threshold) : py::none();
        if (settings.headroom) result["headroom"] = *settings.headroom;
        if (settings.large_page_size) result["large_page_size"] = *settings.large_page_size;
        return result;
      },
      py::arg("text"),
      "The settings of a VMM_CONF text as use()'s keyword arguments (conf.hpp); refuses a bad one naming "
      "it.");
  m.def(
      "parse_handle_header",
      [](std::string_view text) {
        const vmm_python::handle_header header = vmm_python::parse_handle_header(text);
        py::dict result;
        result["manifest"] = header.manifest_bytes;
        result["fds"] = header.fds;
        result["dtype"] = header.dtype;
        result["length"] = header.length ? py::cast(*header.length) : py::none();
        result["read_only"] = header.read_only;
        result["offset"] = header.offset;
        result["lease"] = header.lease;
        result["tensor"] = py::none();
        if (header.tensor) {
          const vmm_python::array_layout& layout = *header.tensor;
          const bool torch = layout.kind == vmm_python::array_layout::library::torch;
          py::dict tensor;
          tensor["kind"] = torch ? "torch" : "cupy";
          tensor["dtype"] = layout.dtype;
          tensor["shape"] = layout.shape;
          tensor[torch ? "stride" : "strides"] = layout.strides;
          tensor[torch ? "storage_offset" : "offset"] = layout.offset;
          result["tensor"] = tensor;
        }
        return result;
      },
      py::arg("text"),
      "The checked fields of a vmm.share() handle's header, a JSON text (handle_header.hpp); refuses a bad "
      "one naming the field.");
}

}  // namespace

PYBIND11_MODULE(_vmm, m) {
  m.doc() = "The native part of the vmm package (see vmm's docstring).";
  m.attr("__version__") = VMM_VERSION;
  register_exceptions(m);
  bind_resources(m);
  bind_history(m);
  vmm_python::bind_buffers(m);
  vmm_python::bind_store(m);
}
