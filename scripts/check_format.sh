#!/usr/bin/env bash
# Checks every C++ and CUDA file of the repository against .clang-format (clang-format 14,
# Debian 12's). Prints the files that differ and exits 1; `--fix` rewrites them instead.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
vmm_apt_install_missing clang-format
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for file in "${files[@]}"; do
  clang-format --dry-run --Werror "$file" >/dev/null 2>&1 || bad+=("$file")
done
if [ "${#bad[@]}" -gt 0 ]; then
  printf 'not formatted (bash scripts/check_format.sh --fix): %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted as .clang-format says"
