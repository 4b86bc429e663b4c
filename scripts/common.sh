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
    nlohmann-json3-dev python3 || return 1
  # The Python package (pip install . offline, and its ctest python.pip_install_and_pytest):
  # pybind11 and Python's headers for the module, setuptools and wheel for pip's build,
  # venv for the fresh environment, pytest and numpy for its tests, matplotlib for python -m
  # vmm.plot's.
  vmm_apt_install_missing pybind11-dev python3-dev python3-venv python3-setuptools python3-wheel \
    python3-pytest python3-numpy python3-matplotlib || return 1
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

# For the scripts under bench/results that time vmm_torch on the lent GPU machine: configures
# a Release build of the source tree SOURCE in BUILD_DIR, builds only the PyTorch allocator
# library and exports VMM_TORCH_LIBRARY for bench/torch_allocators.py. The logs go to
# BUILD_DIR.configure.log and BUILD_DIR.build.log; the build log's tail is printed on failure.
# Usage: vmm_build_torch_allocator SOURCE BUILD_DIR
vmm_build_torch_allocator() {
  local source=$1 build_dir=$2
  cmake -S "$source" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$build_dir.configure.log" 2>&1 ||
    { tail -30 "$build_dir.configure.log"; return 1; }
  cmake --build "$build_dir" -j "${VMM_JOBS:-$(nproc)}" --target vmm_torch_allocator >"$build_dir.build.log" 2>&1 ||
    { tail -30 "$build_dir.build.log"; return 1; }
  VMM_TORCH_LIBRARY=$(realpath "$build_dir")/python/libvmm_torch_allocator.so
  export VMM_TORCH_LIBRARY
}
