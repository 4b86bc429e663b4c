"""Shared helpers of the tests of the installed package vmm (python3 -m pytest tests/python).

The tests import the package as installed (tests/python/pip_install_check.sh builds and
installs it with pip into a fresh virtual environment and runs them there). A resource's
settings and the host-memory test hook hold for a whole process, so tests of the resources
run their scenario in a fresh interpreter (run_scenario).
"""

import os
import subprocess
import sys
import textwrap

import pytest


HOST_MEMORY_PRELUDE = "import vmm, vmm._vmm\nvmm._vmm.use_host_memory()\nimport vmm.torch\n"


def run_scenario(code, env=None, expect_ok=True, timeout=300, prelude=HOST_MEMORY_PRELUDE):
    """Runs `prelude` and `code` in a new interpreter (by default with vmm's resources on OS
    host memory), without the caller's VMM_CONF or PYTORCH_CUDA_ALLOC_CONF.

    The scenario prints "ok" at its end; returns the CompletedProcess. With expect_ok, a
    non-zero status or a missing "ok" fails the test with the output.
    """
    environment = dict(os.environ)
    environment.pop("VMM_CONF", None)
    environment.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    environment.update(env or {})
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code) + "\nprint('ok')\n"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if expect_ok:
        output = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        assert done.returncode == 0, output
        assert done.stdout.rstrip().endswith("ok"), output
    return done


@pytest.fixture
def scenario():
    return run_scenario
