#!/usr/bin/env python3
"""Checks vmm's layering: no file of a lower layer includes a header of a higher layer.

    python3 scripts/check_layers.py              # check the repository this script is in
    python3 scripts/check_layers.py --root DIR   # check another checkout
    python3 scripts/check_layers.py --self-test  # check the checker on a fixture tree

    python3 scripts/check_layers.py --table      # print the layer table docs/ARCHITECTURE.md holds

The layers, bottom up, are defined below by path (LAYERS). A file may include headers of its
own layer and of any layer below it. Two layers of the same rank (driver and os; store and
python) are siblings: neither is above the other.

Every .hpp/.cpp/.cu/.h file under vmm/, ipc/ and python/ must belong to exactly one layer, so
that a new file cannot slip past the check: add it to LAYERS. tests/, bench/ and samples/ use
every layer and are not checked.

docs/ARCHITECTURE.md holds the same layers as a table between the markers <!-- layers:begin -->
and <!-- layers:end -->: one row per layer with its name, its rank and the layers it may
include. The check fails when that table and LAYERS differ (a layer missing or extra, another
rank, other layers it may include), so the document cannot drift from the script; --table
prints the table as it must read.

An #include is resolved as the compiler would: "name" first next to the including file,
then (for "name" and <name>) under the include directories the targets use: vmm/include,
ipc/include, vmm/src (vmm's own, and the white-box tests') and vmm/tools (the tools' own). A name
that resolves to no file of the repository is a system or third-party header and is not
checked.

Two finer rules hold as well. The parts of the memory resource (vmm/src/resource, RESOURCE_PARTS)
are ranked: a part includes only parts ranked below it (and its own header), so that no two
of its files include each other, however indirectly. And a target's private sources
(TARGETS: vmm/src of vmm::vmm, ipc/src of vmm::ipc, vmm/tools of the tools, python/native of
the Python layer) are included only by that target's own files: another target reaches a
target through its installed headers (what a target above needs of one below and that is no
interface of it lives in an installed internal header: vmm/include/vmm/detail/,
ipc/include/vmm/ipc/detail/).

Headers and sources mirror each other: an out-of-line member of a class that an installed
header (vmm/include, ipc/include) declares at namespace scope is defined in a source of that
header's name (vmm/src/.../NAME.cpp, ipc/src/.../NAME.cpp for NAME.hpp), so that a reader
finds a header's code by its name.

Exit status: 0 when the layering holds and the document agrees, 1 when a file breaks it or
belongs to no layer, or the document's table differs (each problem on its own line, naming the
file and what differs), 2 on bad usage.
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
    # So do the byte-size parser of every tool's options, which throws invalid_argument, and
    # the library's version (its header is generated into the build tree from cmake/).
    ("base", 0,
     concept("error", "location", "stream_ref", "byte_size", "version")
     + ["vmm/include/vmm/detail/cleanup.hpp", "vmm/src/cleanup.cpp", "vmm/include/vmm/detail/enum_names.hpp"]),
    # libcuda, loaded at run time: one X-macro table of entry points; and the driver calls of
    # sharing between processes, which vmm::ipc asks for through an internal header.
    ("driver", 1, ["vmm/src/driver/", "vmm/include/vmm/detail/driver_sharing.hpp"]),
    # Every system call, and the fault injection that both the OS calls and the driver
    # table ask before calling out.
    ("os", 1,
     ["vmm/src/os/", "vmm/include/vmm/detail/system.hpp"] + concept("fault_injection")
     + ["vmm/src/fault_injection.hpp"]),
    # One interface per kind of physical memory, its address space, its stream executor,
    # and the value types that interface speaks in.
    ("provider", 2,
     concept("provider", "address_space", "stream_executor", "unique_fd", "capabilities")
     + ["vmm/src/providers/"]),
    # Move-only RAII over one provider call each (their ownership is one template,
    # provider_owned), and the process's retirement list.
    ("primitives", 3,
     concept("address_range", "physical_allocation", "mapping", "provider_owned", "retirement")
     + ["vmm/include/vmm/detail/retirement.hpp"]),
    # Physical chunks recycled per location, and the run of chunks mapped in a range that
    # every buffer and view is made of.
    ("pool", 4, concept("chunk_pool", "shared_chunk", "mapped_range")),
    # What users hold.
    ("buffers", 5,
     concept("growable_buffer", "device_vector", "chunk_view", "ring_buffer", "ring_buffer_view",
             "striped_buffer", "stripe_layout", "host_device", "memory_resource", "memory_registration", "append",
             "append_view", "cuda_mr", "resource_like", "replicated_buffer")
     + ["vmm/src/peer_access.hpp", "vmm/src/broadcast_plan.hpp", "vmm/src/resource/", "vmm/src/growth_worker.hpp",
        "vmm/src/growth_worker.cpp"]),
    # Sharing between processes.
    ("ipc", 6, ["ipc/"]),
    # The store (vmm::store): a daemon that keeps named buffers, and its client, over vmm::ipc.
    ("store", 7, ["ipc/src/store/", "ipc/include/vmm/store/"]),
    # Programs built beside the libraries (vmm-info, vmm-replay; vmm-store beside vmm::store),
    # above them: they share vmm/tools/cli.hpp.
    ("tools", 8, ["vmm/tools/", "ipc/tools/"]),
    # The Python layer: the PyTorch / CuPy allocator library and the bindings, over the public
    # headers of everything below.
    ("python", 7, ["python/"]),
]

# The parts of the memory resource, by file name in vmm/src/resource without its suffix, and
# their ranks: each owns its data and includes only parts of a lower rank.
RESOURCE_FOLDER = "vmm/src/resource/"
RESOURCE_PARTS: dict[str, int] = {
    # The bookkeeping every part shares: locks, free lists, timers, host copies, registrations.
    "arena_mutex": 0, "free_index": 0, "timed_into": 0, "host_copies": 0, "registrations": 0,
    "block_table": 1, "usage": 1,
    "arena": 2,  # one arena's blocks and pages, and the stream record its frees name
    "arena_set": 3,  # the arenas of one resource
    "stream_clock": 3,  # stream records, points, epochs, waits
    "page_supply": 4,  # spare, lent and mapped pages; stitching, lending, giving back
    "placement": 5,  # each stream's arenas; choosing and carving blocks
    "sleep_wake": 5,  # sleep and wake with the host copies
    "resource_state": 6,  # the composition, and the locks
}

# (target, the folders of its files, the folders private to it). The longest folder wins.
TARGETS: list[tuple[str, list[str], list[str]]] = [
    ("vmm::vmm", ["vmm/include/", "vmm/src/"], ["vmm/src/"]),
    ("vmm::ipc", ["ipc/include/", "ipc/src/"], ["ipc/src/"]),
    ("vmm::store", ["ipc/include/vmm/store/", "ipc/src/store/"], ["ipc/src/store/"]),
    ("tools", ["vmm/tools/", "ipc/tools/"], ["vmm/tools/"]),
    ("python", ["python/"], ["python/native/"]),
]

CHECKED_FOLDERS = ("vmm", "ipc", "python")
DOCUMENT = "docs/ARCHITECTURE.md"
TABLE_BEGIN = "<!-- layers:begin -->"
TABLE_END = "<!-- layers:end -->"
SOURCE_SUFFIXES = (".hpp", ".h", ".cpp", ".cu", ".cuh")
INCLUDE_DIRECTORIES = ("vmm/include", "ipc/include", "vmm/src", "vmm/tools")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
INSTALLED_HEADERS = ("vmm/include/", "ipc/include/")
SOURCE_FOLDERS = ("vmm/src/", "ipc/src/")
# A class at namespace scope (column 0; a forward declaration ends in ';' and is none).
CLASS = re.compile(r"^(?:class|struct)\s+(\w+)\b[^;]*$", re.M)
# An out-of-line member definition at namespace scope: `... name::member(`, at column 0.
MEMBER_DEFINITION = re.compile(r"^(?![\s#/])[^;(){}=]*?\b(\w+)::(~?\w+|operator[^\s(]*)\s*\(", re.M)


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


def longest(path: str, folders: list[str]) -> int:
    """The length of the longest of `folders` that holds `path` (0: none does)."""
    return max((len(folder) for folder in folders if path.startswith(folder)), default=0)


def target_of(path: str) -> str | None:
    """The target whose files include `path`, or None."""
    best = max(TARGETS, key=lambda t: longest(path, t[1]))
    return best[0] if longest(path, best[1]) else None


def private_owner(path: str) -> str | None:
    """The target `path` is private to, or None for an installed header."""
    best = max(TARGETS, key=lambda t: longest(path, t[2]))
    return best[0] if longest(path, best[2]) else None


def resource_part(path: str) -> str | None:
    """The part of the memory resource `path` is (its name), or None outside RESOURCE_FOLDER."""
    if not path.startswith(RESOURCE_FOLDER) or "/" in path[len(RESOURCE_FOLDER):]:
        return None
    return PurePosixPath(path).stem


def check_finer(path: str, number: int, shown: str, target: str) -> list[problem]:
    """The resource's part ranks and the targets' private sources, for one include."""
    problems: list[problem] = []
    part, other_part = resource_part(path), resource_part(target)
    if part in RESOURCE_PARTS and other_part in RESOURCE_PARTS and other_part != part:
        if RESOURCE_PARTS[other_part] >= RESOURCE_PARTS[part]:
            problems.append(problem(
                path, number,
                f"includes {shown} ({target}): resource part {part} (rank {RESOURCE_PARTS[part]}) may "
                f"include only parts ranked below it, not {other_part} (rank {RESOURCE_PARTS[other_part]})"))
    owner, own_target = private_owner(target), target_of(path)
    if owner is not None and own_target is not None and owner != own_target:
        problems.append(problem(
            path, number,
            f"includes {shown} ({target}): a private source of {owner}, from {own_target}: reach it "
            f"through an installed header"))
    return problems


def check(root: Path) -> list[problem]:
    problems: list[problem] = check_mirrors(root, source_files(root))
    for path in source_files(root):
        own = layer_of(path)
        if own is None:
            problems.append(problem(path, 0, "belongs to no layer: add it to LAYERS in "
                                             "scripts/check_layers.py"))
            continue
        if (part := resource_part(path)) is not None and part not in RESOURCE_PARTS:
            problems.append(problem(path, 0, "is no part of RESOURCE_PARTS in scripts/check_layers.py: rank it"))
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
            shown = f'"{name}"' if delimiter == '"' else f"<{name}>"
            problems += check_finer(path, number, shown, target)
            if other.rank > own.rank:
                problems.append(problem(
                    path, number,
                    f"includes {shown} ({target}): layer {own.name} (rank {own.rank}) may not "
                    f"include layer {other.name} (rank {other.rank}), which is above it"))
    return problems


def check_mirrors(root: Path, files: list[str]) -> list[problem]:
    """Members of an installed header's classes defined in a source of another name."""
    declared: dict[str, list[str]] = {}  # class -> the installed headers declaring it
    for path in files:
        if path.startswith(INSTALLED_HEADERS) and path.endswith(".hpp"):
            for match in CLASS.finditer((root / path).read_text(encoding="utf-8", errors="replace")):
                declared.setdefault(match.group(1), []).append(path)
    problems: list[problem] = []
    for path in files:
        if not (path.startswith(SOURCE_FOLDERS) and path.endswith(".cpp")):
            continue
        text = (root / path).read_text(encoding="utf-8", errors="replace")
        reported: set[str] = set()
        for match in MEMBER_DEFINITION.finditer(text):
            owner = match.group(1)
            headers = declared.get(owner, [])
            if not headers or owner in reported:
                continue
            if all(PurePosixPath(h).stem != PurePosixPath(path).stem for h in headers):
                reported.add(owner)
                number = text.count("\n", 0, match.start()) + 1
                names = " or ".join(f"{PurePosixPath(h).stem}.cpp" for h in headers)
                problems.append(problem(path, number, f"defines members of {owner} ({', '.join(headers)}): "
                                                      f"a header's code lives in the source of its name, {names}"))
    return problems


def may_include(name: str, rank: int) -> list[str]:
    """The other layers a layer of `rank` may include: those of its rank or below, bottom up."""
    return [other for other, other_rank, _ in LAYERS if other != name and other_rank <= rank]


def layer_table() -> str:
    """The table docs/ARCHITECTURE.md holds between its markers, as it must read."""
    rows = [TABLE_BEGIN, "| layer | rank | may include |", "| --- | --- | --- |"]
    for name, rank, _ in LAYERS:
        below = ", ".join(may_include(name, rank)) or "nothing"
        rows.append(f"| {name} | {rank} | {below} |")
    rows.append(TABLE_END)
    return "\n".join(rows) + "\n"


def check_document(root: Path) -> list[problem]:
    """Whether DOCUMENT's marked layer table lists exactly LAYERS, their ranks and inclusions."""
    path = root / DOCUMENT
    if not path.is_file():
        return [problem(DOCUMENT, 0, "missing: it must hold the layer table (print it with --table)")]
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    starts = [n for n, line in enumerate(lines, start=1) if line.strip() == TABLE_BEGIN]
    ends = [n for n, line in enumerate(lines, start=1) if line.strip() == TABLE_END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        return [problem(DOCUMENT, 0, f"needs exactly one layer table between {TABLE_BEGIN} and "
                                     f"{TABLE_END} (print it with --table)")]
    problems: list[problem] = []
    listed: dict[str, tuple[int, int, list[str]]] = {}  # name -> (line, rank, may include)
    for number in range(starts[0] + 1, ends[0]):
        cells = [cell.strip().strip("`").strip() for cell in lines[number - 1].strip().strip("|").split("|")]
        if not lines[number - 1].strip() or cells[0] in ("layer", "") or set(cells[0]) <= set("-: "):
            continue  # a blank line, the header or the separator row
        if len(cells) < 3 or not cells[1].isdigit():
            problems.append(problem(DOCUMENT, number, f"a layer row reads | name | rank | may include |: "
                                                      f"{lines[number - 1].strip()!r}"))
            continue
        below = [] if cells[2] in ("nothing", "-", "—") else [n.strip().strip("`") for n in cells[2].split(",")]
        if cells[0] in listed:
            problems.append(problem(DOCUMENT, number, f"layer {cells[0]} is listed twice"))
        listed[cells[0]] = (number, int(cells[1]), below)
    for name, rank, _ in LAYERS:
        if name not in listed:
            problems.append(problem(DOCUMENT, starts[0], f"the layer table lacks layer {name} (rank {rank}) "
                                                         f"of scripts/check_layers.py"))
            continue
        number, doc_rank, doc_below = listed[name]
        if doc_rank != rank:
            problems.append(problem(DOCUMENT, number, f"layer {name} has rank {doc_rank} in the table, "
                                                      f"{rank} in scripts/check_layers.py"))
        expected = may_include(name, rank)
        if sorted(doc_below) != sorted(expected):
            problems.append(problem(DOCUMENT, number,
                                    f"layer {name} may include {', '.join(sorted(doc_below)) or 'nothing'} "
                                    f"in the table, but scripts/check_layers.py allows "
                                    f"{', '.join(sorted(expected)) or 'nothing'}"))
    known = {name for name, _, _ in LAYERS}
    for name, (number, _, _) in listed.items():
        if name not in known:
            problems.append(problem(DOCUMENT, number, f"the layer table lists {name}, which "
                                                      f"scripts/check_layers.py does not define"))
    return problems


def run(root: Path) -> int:
    problems = check(root) + check_document(root)
    for found in problems:
        print(found, file=sys.stderr)
    if problems:
        print(f"check_layers: {len(problems)} problem(s); the layers are defined in "
              f"scripts/check_layers.py and tabled in {DOCUMENT} (--table prints the table)",
              file=sys.stderr)
        return 1
    print(f"check_layers: {len(source_files(root))} files, the layering holds, and {DOCUMENT} "
          f"agrees with it")
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
    "ipc/include/vmm/ipc/detail/little_endian.hpp": "#include <cstdint>\n",
    "vmm/include/vmm/detail/driver_sharing.hpp": "#include <array>\n",
    "ipc/src/gpu_context.hpp": '#include "vmm/provider.hpp"\n',
    # Allowed: a target above reaches one below through its installed internal headers.
    "ipc/src/fabric.cpp": ('#include <vmm/growable_buffer.hpp>\n#include "vmm/ipc/detail/little_endian.hpp"\n'
                            '#include "vmm/detail/driver_sharing.hpp"\n#include "gpu_context.hpp"\n'),
    "ipc/src/store/protocol.cpp": '#include "vmm/ipc/detail/little_endian.hpp"\n',
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

        (root / DOCUMENT).parent.mkdir(parents=True, exist_ok=True)
        (root / DOCUMENT).write_text("# Layers\n\n" + layer_table() + "\nMore prose.\n", encoding="utf-8")

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

        # The document's table: as printed it agrees; each kind of drift is one problem naming it.
        expect(check_document(root) == [], f"the printed table agrees: {[str(p) for p in check_document(root)]}")
        good = (root / DOCUMENT).read_text(encoding="utf-8")
        drifts = {
            "another rank": (good.replace("| ipc | 6 |", "| ipc | 5 |"), ["layer ipc has rank 5"]),
            "a missing row": (good.replace("| python | 7 |", "| not-python | 7 |"),
                              ["lacks layer python", "lists not-python"]),
            "other inclusions": (good.replace("| os | 1 | base, driver |", "| os | 1 | base, driver, provider |"),
                                 ["layer os may include base, driver, provider in the table"]),
            "no markers": (good.replace(TABLE_BEGIN, ""), ["needs exactly one layer table"]),
        }
        for what, (text, parts) in drifts.items():
            (root / DOCUMENT).write_text(text, encoding="utf-8")
            drift = [str(p) for p in check_document(root)]
            expect(len(drift) == len(parts) and all(any(part in d for d in drift) for part in parts),
                   f"{what} is reported: {drift}")
            expect(run_quietly(root) == 1, f"{what}: the run exits 1")
        (root / DOCUMENT).write_text(good, encoding="utf-8")
        (root / DOCUMENT).unlink()
        expect(any("missing" in str(p) for p in check_document(root)), "a missing document is reported")
        (root / DOCUMENT).write_text(good, encoding="utf-8")

        # A file of no layer is reported, so that a new file cannot slip past.
        (root / "vmm/src/stray.cpp").write_text('#include "vmm/error.hpp"\n', encoding="utf-8")
        stray = check(root)
        expect(len(stray) == 1 and "vmm/src/stray.cpp" in str(stray[0]) and "no layer" in str(stray[0]),
               f"the unclassified file is reported: {[str(p) for p in stray]}")

        (root / "vmm/src/stray.cpp").unlink()

        # The resource's parts: one including a part ranked as high or higher is reported; so
        # is a file of the folder that no rank names.
        (root / "vmm/src/resource").mkdir(parents=True, exist_ok=True)
        (root / "vmm/src/resource/arena.hpp").write_text("#include <cstdint>\n", encoding="utf-8")
        (root / "vmm/src/resource/placement.hpp").write_text('#include "resource/arena.hpp"\n', encoding="utf-8")
        (root / "vmm/src/resource/sleep_wake.hpp").write_text('#include "resource/placement.hpp"\n',
                                                              encoding="utf-8")
        found = [str(p) for p in check(root)]
        expect(len(found) == 1 and "vmm/src/resource/sleep_wake.hpp:1" in found[0]
               and "resource part sleep_wake (rank 5)" in found[0] and "placement (rank 5)" in found[0],
               f"a part including a part of its rank is reported: {found}")
        (root / "vmm/src/resource/sleep_wake.hpp").write_text('#include "resource/arena.hpp"\n', encoding="utf-8")
        (root / "vmm/src/resource/unranked.cpp").write_text("#include <cstdint>\n", encoding="utf-8")
        found = [str(p) for p in check(root)]
        expect(len(found) == 1 and "unranked.cpp" in found[0] and "RESOURCE_PARTS" in found[0],
               f"an unranked part is reported: {found}")
        (root / "vmm/src/resource/unranked.cpp").unlink()
        expect(check(root) == [], f"the ranked parts are clean: {[str(p) for p in check(root)]}")

        # A private source of another target: reported, in a layer above it as much as in one
        # beside it, and the store's reach into ipc's sources as much as ipc's into vmm's.
        (root / "python/native/allocator.cpp").parent.mkdir(parents=True, exist_ok=True)
        (root / "python/native/allocator.cpp").write_text('#include "resource/arena.hpp"\n', encoding="utf-8")
        (root / "ipc/src/handoff.cpp").write_text('#include "os/system.hpp"\n', encoding="utf-8")
        (root / "ipc/src/store/server.cpp").write_text('#include "../gpu_context.hpp"\n', encoding="utf-8")
        found = [str(p) for p in check(root)]
        expect(len(found) == 3, f"three private includes across targets expected: {found}")
        expect(any("python/native/allocator.cpp:1" in f and "private source of vmm::vmm, from python" in f
                   and "vmm/src/resource/arena.hpp" in f for f in found), f"python's is reported: {found}")
        expect(any("ipc/src/handoff.cpp:1" in f and "private source of vmm::vmm, from vmm::ipc" in f
                   for f in found), f"ipc's include of vmm/src is reported: {found}")
        expect(any("ipc/src/store/server.cpp:1" in f and "private source of vmm::ipc, from vmm::store" in f
                   for f in found), f"the store's include of ipc/src is reported: {found}")
        expect(run_quietly(root) == 1, "a private include across targets exits 1")

        (root / "python/native/allocator.cpp").unlink()
        (root / "ipc/src/handoff.cpp").unlink()
        (root / "ipc/src/store/server.cpp").unlink()

        # A member of an installed header's class defined in a source of another name is
        # reported; in the source of the header's name it is not.
        (root / "vmm/include/vmm/ring_buffer.hpp").write_text("namespace vmm {\nclass ring_buffer {\n};\n}\n",
                                                              encoding="utf-8")
        member = "namespace vmm {\nvoid ring_buffer::push(int value) {}\n}\n"
        (root / "vmm/src/chunk_view.cpp").write_text(member, encoding="utf-8")
        found = [str(p) for p in check(root)]
        expect(len(found) == 1 and "vmm/src/chunk_view.cpp:2" in found[0] and "ring_buffer" in found[0]
               and "ring_buffer.cpp" in found[0], f"a member defined in another source is reported: {found}")
        expect(run_quietly(root) == 1, "a header's member in another source exits 1")
        (root / "vmm/src/chunk_view.cpp").unlink()
        (root / "vmm/src/ring_buffer.cpp").write_text(member, encoding="utf-8")
        expect(check(root) == [], f"the member in its own source is clean: {[str(p) for p in check(root)]}")

    # The classification itself: longest match wins, folders and files.
    expect(layer_of("vmm/src/driver/device.cpp") == layer("driver", 1), "driver folder")
    expect(layer_of("vmm/src/providers/os_host_provider.cpp") == layer("provider", 2), "providers folder")
    expect(layer_of("vmm/include/vmm/mapped_range.hpp") == layer("pool", 4), "mapped_range")
    expect(layer_of("vmm/include/vmm/shared_chunk.hpp") == layer("pool", 4), "shared_chunk")
    expect(layer_of("ipc/include/vmm/ipc/manifest.hpp") == layer("ipc", 6), "ipc")
    expect(layer_of("ipc/tools/vmm_store.cpp") == layer("tools", 8), "a tool beside vmm::store")
    expect(layer_of("ipc/src/store/server.cpp") == layer("store", 7), "the store's sources")
    expect(layer_of("ipc/include/vmm/store/client.hpp") == layer("store", 7), "the store's headers")
    expect(layer_of("vmm/src/unknown.cpp") is None, "an unlisted file has no layer")
    expect(layer_of("python/native/device_resources.cpp") == layer("python", 7), "python")
    expect(may_include("os", 1) == ["base", "driver"], f"siblings: {may_include('os', 1)}")
    expect(target_of("ipc/src/store/server.cpp") == "vmm::store", "the store's sources")
    expect(target_of("ipc/src/handoff.cpp") == "vmm::ipc", "ipc's sources")
    expect(target_of("ipc/tools/vmm_store.cpp") == "tools", "a tool beside vmm::ipc")
    expect(private_owner("vmm/include/vmm/error.hpp") is None, "an installed header is no one's private")
    expect(private_owner("vmm/tools/cli.hpp") == "tools", "the tools' own")

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
    parser.add_argument("--table", action="store_true",
                        help=f"print the layer table {DOCUMENT} must hold between its markers")
    arguments = parser.parse_args()
    if arguments.self_test:
        return self_test()
    if arguments.table:
        print(layer_table(), end="")
        return 0
    if not (arguments.root / "vmm").is_dir():
        parser.error(f"{arguments.root} holds no vmm/ folder")
    return run(arguments.root)


if __name__ == "__main__":
    sys.exit(main())
