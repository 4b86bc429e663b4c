# Shared by the README's commands: install what is missing, configure and build.
# Usage: source scripts/common.sh; vmm_prepare BUILD_DIR [extra cmake arguments...]

vmm_install_missing() {
  local wanted=(cmake ninja-build g++ libfmt-dev libgtest-dev libbenchmark-dev python3)
  local missing=()
  for package in "${wanted[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if [ ! -f /usr/local/cuda/include/cuda.h ] && [ ! -f /usr/include/cuda.h ]; then
    echo "cuda.h not found: vmm compiles against the CUDA toolkit's headers (it never links libcuda)" >&2
    return 1
  fi
}

vmm_prepare() {
  local build_dir=$1
  shift
  vmm_install_missing || return 1
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDAToolkit_ROOT=/usr/local/cuda "$@" >"$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; return 1; }
  cmake --build "$build_dir" -j "$(nproc)"
}
