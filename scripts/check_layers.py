#!/usr/bin/env python3
"""Checks vmm's layering: no file of a lower layer includes a header of a higher layer.

    python3 scripts/check_layers.py              # check the repository this script is in
    python3 scripts/check_layers.py --root DIR   # check another checkout
    python3 scripts/check_layers.py --self-test  # check the checker on a fixture tree

The layers, bottom up, are defined below by path (LAYERS); docs/ARCHITECTURE.md draws them.
A file may include headers of its own layer and of any layer below it. Two layers of the
same rank (driver and os) are siblings: neither is above the other.

Every .hpp/.cpp/.cu/.h file under vmm/ and ipc/ must belong to exactly one layer, so that a
new file cannot slip past the check: add it to LAYERS. tests/, bench/ and samples/ use every
layer and are not checked.

An #include is resolved as the compiler would: "name" first next to the including file,
then (for "name" and <name>) under the include directories the targets use: vmm/include,
ipc/include and vmm/src (private to vmm and vmm::ipc). A name that resolves to no file of
the repository is a system or third-party header and is not checked.

Exit status: 0 when the layering holds, 1 when a file breaks it or belongs to no layer (each
problem on its own line, naming the file, the include and both layers), 2 on bad usage.
Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


def concept(*names: str) -> list[str]:
    """The public header and the source of each concept: vmm/include/vmm/NAME.hpp, vmm/src/NAME.cpp."""
    paths: list[str] = []
    for name in names:
        paths += [f"vmm/include/vmm/{name}.hpp", f"vmm/src/{name}.cpp"]
    return paths


# (name, rank, paths). A path ending in "/" is a folder and everything under it; any other
# path is one file (a listed file that does not exist is ignored: concept() lists both
# halves of a concept even where one is missing).
LAYERS: list[tuple[str, int, list[str]]] = [
    # Below everything: the exceptions every layer throws, the driver's wrappers included
    # (STYLE.md: a throwing wrapper names the failed call), and the never-throwing cleanup
    # helper that error.cpp implements, and the enum-name lookup of every to_string. None
    # includes anything of vmm.
    # The vocabulary value types (where memory lives, who accesses it, a stream) sit here
    # too: the driver layer speaks in them.
    ("base", 0, concept("error", "location", "stream_ref") + ["vmm/src/cleanup.hpp", "vmm/src/enum_names.hpp"]),
    # libcuda, loaded at run time: one X-macro table of entry points.
    ("driver", 1, ["vmm/src/driver/"]),
    # Every system call, and the fault injection that both the OS calls and the driver
    # table ask before calling out.
    ("os", 1, ["vmm/src/os/"] + concept("fault_injection") + ["vmm/src/fault_injection.hpp"]),
    # One interface per kind of physical memory, its address space, its stream executor,
    # and the value types that interface speaks in.
    ("provider", 2,
     concept("provider", "address_space", "stream_executor", "unique_fd", "capabilities")
     + ["vmm/src/providers/"]),
    # Move-only RAII over one provider call each (their ownership is one template,
    # provider_owned), and the process's retirement list.
    ("primitives", 3,
     concept("address_range", "physical_allocation", "mapping", "provider_owned", "retirement")
     + ["vmm/src/retirement.hpp"]),
    # Physical chunks recycled per location, and the run of chunks mapped in a range that
    # every buffer and view is made of.
    ("pool", 4, concept("chunk_pool", "shared_chunk", "mapped_range")),
    # What users hold.
    ("buffers", 5,
     concept("growable_buffer", "device_vector", "chunk_view", "ring_buffer", "ring_buffer_view",
             "striped_buffer", "stripe_layout", "host_device", "memory_resource", "memory_registration", "append",
             "append_view", "cuda_mr")
     + ["vmm/src/peer_access.hpp", "vmm/src/resource/", "vmm/src/growth_worker.hpp",
        "vmm/src/growth_worker.cpp"]),
    # Sharing between processes.
    ("ipc", 6, ["ipc/"]),
    # Programs built beside the library (vmm-info).
    ("tools", 7, ["vmm/tools/"]),
]

CHECKED_FOLDERS = ("vmm", "ipc")
SOURCE_SUFFIXES = (".hpp", ".h", ".cpp", ".cu", ".cuh")
INCLUDE_DIRECTORIES = ("vmm/include", "ipc/include", "vmm/src")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


@dataclass(frozen=True)
class layer:
    name: str
    rank: int


@dataclass(frozen=True)
class problem:
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


def layer_of(path: str) -> layer | None:
    """The layer `path` (relative, with /) belongs to; the longest matching entry wins."""
    best: tuple[int, layer] | None = None
    for name, rank, entries in LAYERS:
        for entry in entries:
            matches = path.startswith(entry) if entry.endswith("/") else path == entry
            if matches and (best is None or len(entry) > best[0]):
                best = (len(entry), layer(name, rank))
    return best[1] if best else None


def source_files(root: Path) -> list[str]:
    files: list[str] = []
    for folder in CHECKED_FOLDERS:
        base = root / folder
        if not base.is_dir():
            continue
        for directory, _, names in os.walk(base):
            for name in names:
                if name.endswith(SOURCE_SUFFIXES):
                    files.append(Path(directory, name).relative_to(root).as_posix())
    return sorted(files)


def resolve(root: Path, includer: str, delimiter: str, name: str) -> str | None:
    """The repository file `#include <name>` or `"name"` in `includer` refers to, or None."""
    candidates: list[PurePosixPath] = []
    if delimiter == '"':
        candidates.append(PurePosixPath(includer).parent / name)
    candidates += [PurePosixPath(directory) / name for directory in INCLUDE_DIRECTORIES]
    for candidate in candidates:
        normal = PurePosixPath(os.path.normpath(candidate.as_posix()))
        if not normal.as_posix().startswith("..") and (root / normal).is_file():
            return normal.as_posix()
    return None


def check(root: Path) -> list[problem]:
    problems: list[problem] = []
    for path in source_files(root):
        own = layer_of(path)
        if own is None:
            problems.append(problem(path, 0, "belongs to no layer: add it to LAYERS in "
                                             "scripts/check_layers.py"))
            continue
        text = (root / path).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            match = INCLUDE.match(line)
            if not match:
                continue
            delimiter, name = match.groups()
            target = resolve(root, path, delimiter, name)
            if target is None:
                continue  # a system or third-party header
            other = layer_of(target)
            if other is None:
                continue  # reported once, as its own file
            if other.rank > own.rank:
                shown = f'"{name}"' if delimiter == '"' else f"<{name}>"
                problems.append(problem(
                    path, number,
                    f"includes {shown} ({target}): layer {own.name} (rank {own.rank}) may not "
                    f"include layer {other.name} (rank {other.rank}), which is above it"))
    return problems


def run(root: Path) -> int:
    problems = check(root)
    for found in problems:
        print(found, file=sys.stderr)
    if problems:
        print(f"check_layers: {len(problems)} problem(s); the layers are defined in "
              f"scripts/check_layers.py and drawn in docs/ARCHITECTURE.md", file=sys.stderr)
        return 1
    print(f"check_layers: {len(source_files(root))} files, the layering holds")
    return 0


# ---- self-test -----------------------------------------------------------------------------

FIXTURE = {
    # One real violation: the driver reaches up into the provider layer.
    "vmm/src/driver/driver_api.hpp": '#include <cuda.h>\n#include "vmm/provider.hpp"\n',
    "vmm/src/driver/driver_api.cpp": '#include "driver/driver_api.hpp"\n#include "vmm/error.hpp"\n',
    # Allowed: the same layer, a lower layer, a sibling of the same rank, a system header.
    "vmm/src/os/system.cpp": '#include "os/system.hpp"\n#include "fault_injection.hpp"\n',
    "vmm/src/os/system.hpp": "#include <poll.h>\n",
    "vmm/src/fault_injection.hpp": "#include <atomic>\n",
    "vmm/include/vmm/error.hpp": "#include <stdexcept>\n",
    "vmm/include/vmm/provider.hpp": '#include "vmm/error.hpp"\n#include "vmm/location.hpp"\n',
    "vmm/include/vmm/location.hpp": "#include <compare>\n",
    "vmm/include/vmm/growable_buffer.hpp": '#include "vmm/chunk_pool.hpp"\n',
    "vmm/include/vmm/chunk_pool.hpp": '#include "vmm/provider.hpp"\n',
    "ipc/src/little_endian.hpp": "#include <cstdint>\n",
    "ipc/src/sharing.cpp": ('#include <vmm/growable_buffer.hpp>\n#include "little_endian.hpp"\n'
                            '#include "driver/driver_api.hpp"\n'),
    # Not checked: tests use every layer.
    "tests/provider_test.cpp": '#include "vmm/growable_buffer.hpp"\n#include "driver/driver_api.hpp"\n',
}


def self_test() -> int:
    failures: list[str] = []

    def expect(condition: bool, what: str) -> None:
        if not condition:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="check_layers.") as directory:
        root = Path(directory)
        for path, text in FIXTURE.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text, encoding="utf-8")

        found = check(root)
        expect(len(found) == 1, f"one violation expected, found {len(found)}: {[str(p) for p in found]}")
        if found:
            message = str(found[0])
            for part in ("vmm/src/driver/driver_api.hpp:2", '"vmm/provider.hpp"',
                         "vmm/include/vmm/provider.hpp", "layer driver", "layer provider"):
                expect(part in message, f"the message names {part!r}: {message}")
        expect(run_quietly(root) == 1, "a tree with a violation exits 1")

        # Without the violation the tree is clean.
        (root / "vmm/src/driver/driver_api.hpp").write_text("#include <cuda.h>\n", encoding="utf-8")
        expect(check(root) == [], f"the fixed tree is clean: {[str(p) for p in check(root)]}")
        expect(run_quietly(root) == 0, "a clean tree exits 0")

        # A file of no layer is reported, so that a new file cannot slip past.
        (root / "vmm/src/stray.cpp").write_text('#include "vmm/error.hpp"\n', encoding="utf-8")
        stray = check(root)
        expect(len(stray) == 1 and "vmm/src/stray.cpp" in str(stray[0]) and "no layer" in str(stray[0]),
               f"the unclassified file is reported: {[str(p) for p in stray]}")

    # The classification itself: longest match wins, folders and files.
    expect(layer_of("vmm/src/driver/device.cpp") == layer("driver", 1), "driver folder")
    expect(layer_of("vmm/src/providers/os_host_provider.cpp") == layer("provider", 2), "providers folder")
    expect(layer_of("vmm/include/vmm/mapped_range.hpp") == layer("pool", 4), "mapped_range")
    expect(layer_of("vmm/include/vmm/shared_chunk.hpp") == layer("pool", 4), "shared_chunk")
    expect(layer_of("ipc/include/vmm/ipc/manifest.hpp") == layer("ipc", 6), "ipc")
    expect(layer_of("vmm/src/unknown.cpp") is None, "an unlisted file has no layer")

    for failure in failures:
        print(f"check_layers self-test FAILED: {failure}", file=sys.stderr)
    if failures:
        return 1
    print("check_layers self-test: passed")
    return 0


def run_quietly(root: Path) -> int:
    saved = sys.stdout, sys.stderr
    with open(os.devnull, "w", encoding="utf-8") as devnull:
        sys.stdout = sys.stderr = devnull
        try:
            return run(root)
        finally:
            sys.stdout, sys.stderr = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the repository to check (default: the one this script is in)")
    parser.add_argument("--self-test", action="store_true",
                        help="check the checker on a fixture tree in a temporary folder")
    arguments = parser.parse_args()
    if arguments.self_test:
        return self_test()
    if not (arguments.root / "vmm").is_dir():
        parser.error(f"{arguments.root} holds no vmm/ folder")
    return run(arguments.root)


if __name__ == "__main__":
    sys.exit(main())
