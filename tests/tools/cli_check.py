#!/usr/bin/env python3
"""The command line every vmm tool shares (vmm/tools/cli.hpp, docs/tools.md), run by ctest.

    cli_check.py VERSION VMM_INFO VMM_REPLAY VMM_STORE

VERSION is project(VERSION) of the top-level CMakeLists.txt. Each tool (and each vmm-store
command) answers --help with exit 0 and lists every option with its default, --version with
exit 0 and "NAME VERSION", and a bad option with exit 2 naming it. vmm-info --json parses;
vmm-store's ls, stat and stats print JSON of the documented fields from a daemon started
here (empty: the C++ store tests fill one), started with a low soft descriptor limit, which
serve raises to the hard one, and with --max-connections 2, past which a client is refused.
"""

import json
import os
import re
import resource
import socket as sock
import subprocess
import sys
import tempfile


def run(*args, **kwargs):
    return subprocess.run(list(args), capture_output=True, text=True, errors="replace", timeout=120, **kwargs)


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    version, info, replay, store = sys.argv[1:]
    failures = []

    def expect(condition, what):
        if not condition:
            failures.append(what)

    commands = [[info], [replay], [store], [store, "serve"], [store, "ls"], [store, "stat"], [store, "rm"],
                [store, "stats"], [store, "load"]]
    for command in commands:
        name = " ".join(os.path.basename(c) for c in command)
        result = run(*command, "--help")
        expect(result.returncode == 0, f"{name} --help: exit {result.returncode}, stderr {result.stderr!r}")
        # Every option line but --help's and --version's, and those of flags, shows "=default".
        for line in result.stdout.splitlines():
            option = re.match(r"^  (--[a-z-]+) ([A-Z,.]+)", line)
            if option:
                expect("=" in line, f"{name} --help: {option.group(1)} shows no default: {line!r}")
        result = run(*command, "--bogus-option")
        expect(result.returncode == 2 and "--bogus-option" in result.stderr,
               f"{name} --bogus-option: exit {result.returncode}, stderr {result.stderr!r}")
    for tool in (info, replay, store):
        name = os.path.basename(tool)
        result = run(tool, "--version")
        expect(result.returncode == 0 and result.stdout.strip() == f"{name} {version}",
               f"{name} --version: exit {result.returncode}, stdout {result.stdout!r}, expected {name} {version}")

    result = run(info, "--json")
    try:
        table = json.loads(result.stdout)
        expect(result.returncode == 0 and table["vmm_version"] == version, f"vmm-info --json: {table}")
        for field in ("page_size", "granularity", "commit_budget"):
            expect(field in table["os_host"], f"vmm-info --json: os_host has no {field}")
        expect(set(table["driver"]) == {"loaded", "problem", "version"}, f"vmm-info --json: driver {table['driver']}")
        expect(isinstance(table["gpus"], list) and isinstance(table["peer_access"], list), "vmm-info --json: gpus")
    except (ValueError, KeyError) as error:
        failures.append(f"vmm-info --json: {error}: {result.stdout!r}")

    result = run(store)
    expect(result.returncode == 2 and "a command is needed" in result.stderr, f"vmm-store: {result.stderr!r}")
    result = run(store, "serve", "--cap", "1.5Q")
    expect(result.returncode == 2 and "--cap" in result.stderr and '"1.5Q"' in result.stderr,
           f"vmm-store serve --cap 1.5Q: exit {result.returncode}, stderr {result.stderr!r}")

    # Unsigned options would take -1 as 2^64 - 1 without their checks.
    for option, value in (("--max-connections", "0"), ("--max-offer-descriptors", "-1"), ("--request-timeout", "-1"),
                          ("--reply-timeout", "-1"), ("--version-slots", "-1"), ("--allow-uid", "-1")):
        result = run(store, "serve", "--socket", os.devnull + "/none", option, value)
        expect(result.returncode == 2 and option in result.stderr,
               f"vmm-store serve {option} {value}: exit {result.returncode}, stderr {result.stderr!r}")

    with tempfile.TemporaryDirectory() as directory:
        os.chmod(directory, 0o700)
        socket = os.path.join(directory, "socket")
        ready_read, ready_write = os.pipe()
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        low = min(256, hard)
        daemon = subprocess.Popen([store, "serve", "--socket", socket, "--cap", "64M", "--max-connections", "2", "--ready-fd", str(ready_write)],
                                  pass_fds=(ready_write,), stdout=subprocess.PIPE, text=True,
                                  preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)))
        os.close(ready_write)
        try:
            expect(os.read(ready_read, 1) == b"r", "the daemon did not say it was ready")
            if hard == resource.RLIM_INFINITY:
                with open("/proc/sys/fs/nr_open") as f:
                    hard = int(f.read())
            with open(f"/proc/{daemon.pid}/limits") as f:
                files = next(line for line in f if line.startswith("Max open files")).split()
            expect(files[3] == str(hard), f"serve left its soft descriptor limit at {files[3]}, not the hard {hard}")
            result = run(store, "ls", "--socket", socket, "--json")
            expect(result.returncode == 0 and json.loads(result.stdout or "null") == {"buffers": []},
                   f"ls --json: exit {result.returncode}, {result.stdout!r} {result.stderr!r}")
            result = run(store, "stats", "--socket", socket, "--json")
            counters = json.loads(result.stdout or "{}")
            expect(result.returncode == 0 and list(counters) == [
                "connections", "entries", "named_entries", "holds", "bytes", "capacity", "pool_used", "pool_reserved",
                "cached_exports", "open_fds"] and counters["entries"] == 0 and counters["connections"] == 1,
                f"stats --json: exit {result.returncode}, {result.stdout!r}")
            result = run(store, "stats", "--socket", socket)
            expect(result.returncode == 0 and re.search(r"^open_fds +[0-9]+$", result.stdout, re.M),
                   f"stats: {result.stdout!r}")
            result = run(store, "stat", "absent", "--socket", socket, "--json")
            expect(result.returncode == 1 and '"absent"' in result.stderr, f"stat absent: {result.stderr!r}")
            # Two connections held open fill --max-connections 2: a third is refused, naming the bound.
            held = [sock.socket(sock.AF_UNIX, sock.SOCK_STREAM) for _ in range(2)]
            try:
                for client in held:
                    client.connect(socket)
                result = run(store, "ls", "--socket", socket)
                expect(result.returncode != 0 and "2 connections already" in result.stderr,
                       f"ls past --max-connections 2: exit {result.returncode}, stderr {result.stderr!r}")
            finally:
                for client in held:
                    client.close()
        finally:
            daemon.terminate()
            said, _ = daemon.communicate(timeout=60)
            os.close(ready_read)
        expect(f"up to {hard} open descriptors" in said, f"serve did not say its descriptor limit: {said!r}")

    for failure in failures:
        print("FAILED:", failure)
    print(f"{len(commands)} commands' --help and bad options, 3 --version, 4 JSON outputs, "
          "6 serve bounds checked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
