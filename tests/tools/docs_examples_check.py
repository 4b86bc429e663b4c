#!/usr/bin/env python3
"""Runs the examples of docs/tools.md, so that each command there works as written.

    docs_examples_check.py DOCS_TOOLS_MD BIN_DIR...

Every line starting with "$ " in a ```console block runs under bash, in a scratch directory,
with the BIN_DIRs (where vmm-info, vmm-replay and vmm-store are) first on PATH and
XDG_RUNTIME_DIR a scratch directory of mode 0700 (so the store's default socket is private
to the check). A command must exit 0, or the status its comment names ("# exit 3: ...").
A `vmm-store serve ... &` line starts the daemon in the background and waits until it
listens (its --ready-fd), without polling; it is stopped at the end.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile


def examples(path):
    commands, in_block = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_block = line.strip() == "```console"
            elif in_block and line.startswith("$ "):
                commands.append(line[2:].rstrip("\n"))
    return commands


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    commands = examples(sys.argv[1])
    failures, daemons = [], []
    with tempfile.TemporaryDirectory() as directory:
        runtime = os.path.join(directory, "run")
        os.mkdir(runtime, 0o700)
        env = dict(os.environ, XDG_RUNTIME_DIR=runtime,
                   PATH=os.pathsep.join([os.path.abspath(d) for d in sys.argv[2:]] + [os.environ.get("PATH", "")]))
        try:
            for command in commands:
                code, _, comment = command.partition("#")
                expected = re.match(r"\s*exit (\d+)", comment)
                status = int(expected.group(1)) if expected else 0
                if code.strip().startswith("vmm-store serve") and code.strip().endswith("&"):
                    ready_read, ready_write = os.pipe()
                    argv = shlex.split(code.strip()[:-1]) + ["--ready-fd", str(ready_write)]
                    argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
                    daemons.append(subprocess.Popen(argv, cwd=directory, env=env, pass_fds=(ready_write,),
                                                    stdout=subprocess.DEVNULL))
                    os.close(ready_write)
                    if os.read(ready_read, 1) != b"r":
                        failures.append(f"{command}: the daemon did not start")
                    os.close(ready_read)
                    continue
                result = subprocess.run(["bash", "-c", command], cwd=directory, env=env, capture_output=True,
                                        text=True, errors="replace", timeout=300)
                if result.returncode != status:
                    failures.append(f"{command}: exit {result.returncode}, expected {status}; "
                                    f"stdout {result.stdout[-400:]!r}, stderr {result.stderr[-400:]!r}")
        finally:
            for daemon in daemons:
                daemon.terminate()
                daemon.wait(timeout=60)
    for failure in failures:
        print("FAILED:", failure)
    print(f"{len(commands)} examples run")
    return 1 if failures or not commands else 0


if __name__ == "__main__":
    sys.exit(main())
