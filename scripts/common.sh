# shellcheck shell=bash
# Shared by the README's commands: install what is missing, configure and build.
# Usage: source scripts/common.sh; vmm_prepare BUILD_DIR [extra cmake arguments...]

# Installs those of the given Debian packages that are not installed yet.
vmm_apt_install_missing() {
  local missing=()
  for package in "$@"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

vmm_install_missing() {
  vmm_apt_install_missing cmake ninja-build g++ libfmt-dev libgtest-dev libbenchmark-dev libcli11-dev \
    nlohmann-json3-dev libxxhash-dev python3 || return 1
  # The Python package (pip install . offline, and its ctest python.pip_install_and_pytest):
  # pybind11 and Python's headers for the module, pip, setuptools and wheel for pip's build,
  # venv for the fresh environment, pytest and numpy for its tests, matplotlib for those of
  # python -m vmm.plot, and CPU torch for the tests of arrays and memory history under torch.
  vmm_apt_install_missing pybind11-dev python3-dev python3-pip python3-venv python3-setuptools python3-wheel \
    python3-pytest python3-numpy python3-matplotlib python3-torch || return 1
  if [ ! -f /usr/local/cuda/include/cuda.h ] && [ ! -f /usr/include/cuda.h ]; then
    echo "cuda.h not found: vmm compiles against the CUDA toolkit's headers (it never links libcuda)" >&2
    return 1
  fi
}

vmm_prepare() {
  vmm_install_missing || return 1
  vmm_configure_and_build "$@"
}

# Configures with Ninja and builds, installing nothing: for machines that have every tool
# already (the lent GPU image has cmake and ninja from pip, not dpkg, and no network).
# VMM_JOBS sets the build's parallelism (default: every core).
# Usage: vmm_configure_and_build BUILD_DIR [extra cmake arguments...]
vmm_configure_and_build() {
  local build_dir=$1
  shift
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDAToolkit_ROOT=/usr/local/cuda "$@" >"$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; return 1; }
  cmake --build "$build_dir" -j "${VMM_JOBS:-$(nproc)}"
}

# clang and its libFuzzer runtime, for the fuzz build (scripts/fuzz.sh).
vmm_install_fuzz_tools() {
  vmm_apt_install_missing clang || return 1
  local runtime
  runtime="$(clang++ -print-runtime-dir)/libclang_rt.fuzzer-x86_64.a"
  if [ ! -f "$runtime" ]; then
    vmm_apt_install_missing "libclang-rt-$(clang++ -dumpversion | cut -d. -f1)-dev" || return 1
  fi
  [ -f "$runtime" ] || { echo "libFuzzer runtime not found: $runtime" >&2; return 1; }
}

# Installs the Python package vmm of the source tree SOURCE (default: the working directory)
# with pip into a fresh virtual environment VENV_DIR made by the interpreter PYTHON, offline:
# no index, no build isolation, no dependencies. The environment sees every package PYTHON
# sees, the installed vmm first: --system-site-packages gives the base installation's, and a
# .pth file adds PYTHON's own site directories where they are others, as when PYTHON is itself
# a virtual environment's (the lent GPU image's python3, which holds torch and CuPy, is). pip,
# setuptools and wheel are PYTHON's (--without-pip: no ensurepip needed). Then
# VENV_DIR/bin/python imports the installed vmm, and so do the processes it starts with
# sys.executable. pip builds the native module in SOURCE/build/pip-TAG/ (setup.py), kept
# between installs. pip's output is this function's; the status is non-zero, with the reason
# on stderr, when the package cannot be installed and imported.
# Usage: vmm_install_python_package PYTHON VENV_DIR [SOURCE]
vmm_install_python_package() {
  local python=$1 venv=$2 source=${3:-.}
  "$python" -m pip --version >/dev/null 2>&1 ||
    { echo "$python has no pip: it cannot install the package vmm" >&2; return 1; }
  rm -rf "$venv"
  "$python" -m venv --system-site-packages --without-pip "$venv" ||
    { echo "$python could not make a virtual environment in $venv" >&2; return 1; }
  venv=$(cd "$venv" && pwd) || return 1
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || return 1
  "$python" -c '
import os, site, sys
given = set(site.getsitepackages([sys.base_prefix]))  # what --system-site-packages gives
seen = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
for directory in seen:
    if directory not in given and os.path.isdir(directory):
        print(f"import site; site.addsitedir({directory!r})")
' >"$site/vmm-interpreter-site.pth" || return 1
  # pybind11 from pip keeps its CMake files inside its Python package, where CMake does not
  # look: pybind11_ROOT in the environment points setup.py's find_package there.
  local hint=() cmake_dir
  if [ -z "${pybind11_ROOT:-}" ] &&
     cmake_dir=$("$python" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null); then
    hint=("pybind11_ROOT=$cmake_dir")
  fi
  env "${hint[@]}" "$venv/bin/python" -m pip install --no-index --no-build-isolation --no-deps "$source" ||
    { echo "pip install of $source with $python failed" >&2; return 1; }
  # From outside the source tree, so that only the installed package can be imported.
  (cd / && "$venv/bin/python" -c 'import vmm, vmm._vmm; print("vmm", vmm.__version__, "installed in", vmm.__path__[0])') ||
    { echo "the package vmm installed in $venv does not import" >&2; return 1; }
}
