#!/usr/bin/env bash
# Builds and installs the package vmm with pip into a fresh virtual environment, offline,
# and runs pytest of tests/python against the installed package (a ctest: python.pip_install).
#
#   bash tests/python/pip_install_check.sh SOURCE_DIR WORK_DIR [VMM_REPLAY]
#
# The interpreter is $VMM_PYTHON, default /usr/bin/python3 (Debian's, which has
# python3-setuptools, python3-wheel, python3-pytest and python3-numpy; a `python3` first on
# PATH may be another one without them). The install is scripts/common.sh's
# vmm_install_python_package: the environment, WORK_DIR/venv, sees every package of that
# interpreter, pip uses no index (--no-index --no-build-isolation) and nothing is downloaded.
# pip builds in the source tree, in build/pip-TAG/ (setup.py), which is kept between runs, so
# that a second run compiles only what changed. WORK_DIR/venv stays after the run:
# WORK_DIR/venv/bin/python imports the installed package.
# Exit status: pytest's; 77 (a skip) when the interpreter has no pytest or pytest collected
# no test (its status 5).
set -euo pipefail
source_dir=$(cd "$1" && pwd)
work_dir=$2
replay=${3:+$(realpath "$3")}
python=${VMM_PYTHON:-/usr/bin/python3}

mkdir -p "$work_dir"
work_dir=$(cd "$work_dir" && pwd)
venv=$work_dir/venv
# shellcheck source=scripts/common.sh
source "$source_dir/scripts/common.sh"
vmm_install_python_package "$python" "$venv" "$source_dir"
if ! "$venv/bin/python" -c "import pytest" 2>/dev/null; then
  echo "skipped: $python has no pytest: tests/python not run (the package is installed in $venv)"
  exit 77
fi

# Outside the source tree, so that only the installed package can be imported.
cd "$work_dir"
status=0
VMM_REPLAY=$replay "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs "$source_dir/tests/python" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no test" >&2
  exit 77
fi
exit "$status"
