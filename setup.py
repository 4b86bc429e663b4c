"""Builds the Python package vmm (pyproject.toml) with its native module vmm._vmm.

setuptools runs CMake (build_ext below): it configures this source tree in build/pip-TAG/
(a Release build of the module's target only: no tests, no samples, no CUDA C++), builds
the target _vmm and copies the module into the package. The build folder is kept, so that a
second `pip install .` compiles only what changed; ccache is used when it is there.

    python3 -m venv --system-site-packages V && V/bin/pip install --no-build-isolation .
    pip wheel --no-build-isolation .

Environment: CUDAToolkit_ROOT (default /usr/local/cuda when it exists; only the CUDA
headers are needed, libcuda is opened at run time), VMM_JOBS (parallel compile jobs),
VMM_PIP_BUILD_DIR (another CMake build folder).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version():
    """project(vmm VERSION x.y.z) of CMakeLists.txt: the one place the version is kept."""
    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    match = re.search(r"project\(\s*vmm\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", text)
    if match is None:
        raise RuntimeError("CMakeLists.txt has no project(vmm VERSION x.y.z)")
    return match.group(1)


class CMakeExtension(Extension):
    """An extension module that the CMake target `target` builds."""

    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class cmake_build_ext(build_ext):
    def build_extension(self, ext):
        default = ROOT / "build" / f"pip-{sys.implementation.cache_tag}"
        build_dir = Path(os.environ.get("VMM_PIP_BUILD_DIR") or default).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DVMM_BUILD_TESTS=OFF",
            "-DVMM_BUILD_SAMPLES=OFF",
            "-DVMM_CUDA_CODE=OFF",
            "-DVMM_BUILD_PYTHON=ON",
            "-DVMM_PYTHON_MODULE=ON",
            f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        if not (build_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        cuda = os.environ.get("CUDAToolkit_ROOT") or ("/usr/local/cuda" if Path("/usr/local/cuda").is_dir() else "")
        if cuda:
            configure.append(f"-DCUDAToolkit_ROOT={cuda}")
        if shutil.which("ccache") and "CMAKE_CXX_COMPILER_LAUNCHER" not in os.environ:
            configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        jobs = os.environ.get("VMM_JOBS") or str(os.cpu_count() or 1)
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", ext.target, "-j", jobs], check=True)
        built = sorted((build_dir / "python" / "vmm").glob(f"{ext.target}.*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one {ext.target} module in {build_dir / 'python' / 'vmm'}, found {built}")
        destination = Path(self.get_ext_fullpath(ext.name))
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], destination)


# setuptools' own build folders and metadata stay under build/ too, out of the source tree.
(ROOT / "build" / "pip-setuptools").mkdir(parents=True, exist_ok=True)

setup(
    version=project_version(),
    ext_modules=[CMakeExtension("vmm._vmm", target="_vmm")],
    cmdclass={"build_ext": cmake_build_ext},
    options={"build": {"build_base": "build/pip-setuptools"}, "egg_info": {"egg_base": "build/pip-setuptools"}},
)
