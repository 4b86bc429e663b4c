"""The installed package: its version, its native module, its errors and the old name."""

import ctypes
import os
import re
import subprocess
import sys
import warnings

import pytest

import vmm
import vmm.torch

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_version_is_the_projects():
    with open(os.path.join(REPOSITORY, "CMakeLists.txt"), encoding="utf-8") as cmake:
        expected = re.search(r"project\(\s*vmm\s+VERSION\s+([0-9.]+)", cmake.read()).group(1)
    assert vmm.__version__ == expected


def test_the_package_is_the_installed_one_not_the_source_tree():
    # Run from the tests, the package must come from site-packages (pip's copy).
    assert "site-packages" in vmm.__file__ or "dist-packages" in vmm.__file__, vmm.__file__


def test_the_native_module_exports_torchs_three_functions_and_no_more_of_the_c_interface():
    library = ctypes.CDLL(vmm.torch.library_path())
    for name in ("vmm_alloc", "vmm_alloc_throwing", "vmm_free"):
        assert hasattr(library, name), name
    for name in ("vmm_torch_statistics_of", "vmm_torch_sleep", "vmm_torch_configure"):
        assert not hasattr(library, name), name


def test_the_exceptions_form_one_hierarchy():
    assert issubclass(vmm.Error, RuntimeError)
    assert issubclass(vmm.OutOfMemoryError, vmm.Error) and issubclass(vmm.OutOfMemoryError, MemoryError)
    assert issubclass(vmm.InvalidArgumentError, vmm.Error) and issubclass(vmm.InvalidArgumentError, ValueError)
    assert vmm.torch.Error is vmm.Error and vmm.torch.OutOfMemoryError is vmm.OutOfMemoryError
    assert vmm.Error.__module__ == "vmm"


def test_vmm_torch_is_a_deprecated_alias_of_vmm_torch():
    sys.modules.pop("vmm_torch", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import vmm_torch
    assert any(issubclass(w.category, DeprecationWarning) and "vmm.torch" in str(w.message) for w in caught)
    assert vmm_torch.use is vmm.torch.use and vmm_torch.memory_stats is vmm.torch.memory_stats
    assert vmm_torch.VmmError is vmm.Error


def test_a_bad_argument_type_is_refused_naming_the_function():
    with pytest.raises(TypeError, match="allocate"):
        vmm._vmm.allocate("many", 0)
    with pytest.raises(TypeError):
        vmm._vmm.allocate(-1, 0)


def test_the_launcher_without_a_program_prints_its_usage_and_fails():
    done = subprocess.run([sys.executable, "-m", "vmm.torch.run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "usage" in done.stderr, done
