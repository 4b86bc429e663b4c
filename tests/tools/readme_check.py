"""Checks that the README says only what the repository does (ctest readme.*).

Every fenced code block of README.md must be checked by one of these rules, or the check
fails ("no rule checks this block"):

- A block preceded by `<!-- snippet: PATH#NAME -->` equals the region of PATH between the
  lines `[readme:NAME]` and `[/readme:NAME]` (comment markers of any language), compared
  line by line with runs of whitespace collapsed and blank lines dropped. The files holding
  regions are built and run as tests (samples/, tests/subproject_consumer/, ...), so a
  snippet that compiles and runs there is the one the README shows. Every region in the
  repository must be shown by the README, and every `vmm.torch.NAME` of a Python snippet
  must be defined by python/vmm/torch.
- A `sh` block is a list of commands, each checked against the tree: `bash SCRIPT` and
  `python3 SCRIPT` name a tracked file, and each option given appears in that file (the
  scripts' own option parsing); `--help` is run; `pip install PATH` (or `python3 -m pip`)
  names a folder with a pyproject.toml or setup.py. `cmake` options `-DNAME` are the project's
  option()s or CMake's own, `--target NAME` a target the project defines; `ctest -R PATTERN`
  matches a registered test when --build-dir is given; `export VAR=$PWD/PATH` names a
  tracked path.

Besides the blocks: every relative link and every backticked repository path (bench/...,
docs/..., scripts/..., ...) must exist.

    python3 tests/tools/readme_check.py [--root DIR] [--readme FILE] [--build-dir BUILD]
    python3 tests/tools/readme_check.py --self-test   # a drifted README fails each rule

Exit status 0 when every rule holds, 1 with one line per problem otherwise.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Links to documents that other branches of this release add. Once one exists the check
# fails until it is removed from here, so that the list cannot outlive its reason.
PENDING_LINKS = set()

REPOSITORY_DIRS = ("bench/", "docs/", "scripts/", "samples/", "tests/", "python/", "vmm/", "ipc/", "cmake/")
CMAKE_OWN_OPTIONS = {"-S", "-B", "-G", "--build", "--install", "--prefix", "--target", "-j", "--parallel",
                     "--config", "--test-dir", "--output-on-failure", "-R", "-N"}

FENCE = re.compile(r"^```(\S*)\s*$")
SNIPPET = re.compile(r"^<!--\s*snippet:\s*(\S+?)#(\S+)\s*-->\s*$")
# A marker is a line of its own: a comment (//, # or <!--) holding only the marker.
REGION_BEGIN = re.compile(r"^\s*(?://|#|<!--)\s*\[readme:([\w-]+)\]\s*(?:-->)?\s*$")
REGION_END = re.compile(r"^\s*(?://|#|<!--)\s*\[/readme:([\w-]+)\]\s*(?:-->)?\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
BACKTICKED = re.compile(r"`([^`\s]+)`")


def normalized(lines):
    """The lines with runs of whitespace collapsed and blank lines dropped."""
    return [" ".join(line.split()) for line in lines if line.strip()]


def tracked_files(root):
    """The repository's files: git's (tracked, or new and not ignored), or, outside a git
    checkout (a source archive), every file but those of build folders."""
    done = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                          capture_output=True, text=True)
    if done.returncode == 0:
        return {path for path in done.stdout.split("\n") if path and os.path.exists(os.path.join(root, path))}
    files = set()
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith((".git", "build"))]
        files |= {os.path.relpath(os.path.join(folder, name), root) for name in names}
    return files


def regions_of(root, files):
    """{(path, name): [lines]} for every [readme:NAME] region of a tracked text file."""
    regions = {}
    for path in sorted(files):
        if path.startswith("tests/tools/readme_check.py") or not os.path.isfile(os.path.join(root, path)):
            continue
        try:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if "[readme:" not in text:
            continue
        current, body = None, []
        for line in text.split("\n"):
            begin, end = REGION_BEGIN.search(line), REGION_END.search(line)
            if begin and current is None:
                current, body = begin.group(1), []
            elif end and current == end.group(1):
                regions[(path, current)] = body
                current = None
            elif current is not None:
                body.append(line)
        if current is not None:
            regions[(path, current)] = None  # never closed
    return regions


def blocks_of(readme_lines):
    """[(line number of the fence, language, marker or None, [lines])] of the README."""
    blocks, i = [], 0
    while i < len(readme_lines):
        match = FENCE.match(readme_lines[i])
        if not match:
            i += 1
            continue
        start, language, body = i, match.group(1), []
        i += 1
        while i < len(readme_lines) and not readme_lines[i].startswith("```"):
            body.append(readme_lines[i])
            i += 1
        before = start - 1
        while before >= 0 and not readme_lines[before].strip():
            before -= 1
        marker = SNIPPET.match(readme_lines[before]) if before >= 0 else None
        blocks.append((start + 1, language, marker, body))
        i += 1
    return blocks


class Checker:
    def __init__(self, root, readme, build_dir):
        self.root, self.readme, self.build_dir = root, readme, build_dir
        self.problems = []
        self.files = tracked_files(root)
        self.dirs = {path[: i + 1] for path in self.files for i in range(len(path)) if path[i] == "/"}
        self._cmake_text = None
        self._tests = None

    def problem(self, line, message):
        self.problems.append(f"{os.path.basename(self.readme)}:{line}: {message}")

    def exists(self, path):
        path = os.path.normpath(path)
        return path in self.files or path + "/" in self.dirs

    def cmake_text(self):
        if self._cmake_text is None:
            parts = []
            for path in sorted(self.files):
                if path.endswith("CMakeLists.txt") or path.endswith(".cmake"):
                    with open(os.path.join(self.root, path), encoding="utf-8") as f:
                        parts.append(f.read())
            self._cmake_text = "\n".join(parts)
        return self._cmake_text

    def registered_tests(self):
        if self._tests is None:
            out = subprocess.run(["ctest", "--test-dir", self.build_dir, "-N"], capture_output=True, text=True)
            self._tests = re.findall(r"Test\s+#\d+:\s+(\S+)", out.stdout)
        return self._tests

    # --- code blocks -----------------------------------------------------------------
    def check_blocks(self, lines, regions):
        shown = set()
        for line, language, marker, body in blocks_of(lines):
            if marker:
                key = (marker.group(1), marker.group(2))
                shown.add(key)
                self.check_snippet(line, key, body, regions)
            elif language in ("sh", "bash"):
                self.check_commands(line, body)
            else:
                self.problem(line, f"no rule checks this ```{language} block: give it a "
                                   "<!-- snippet: PATH#NAME --> marker or make it a sh block of commands")
        for key, body in sorted(regions.items()):
            if key not in shown:
                self.problem(0, f"{key[0]} has the region [readme:{key[1]}], which the README does not show")

    def check_snippet(self, line, key, body, regions):
        path, name = key
        if key not in regions:
            self.problem(line, f"{path} has no region [readme:{name}]" if self.exists(path)
                         else f"{path} is not in the repository")
            return
        if regions[key] is None:
            self.problem(line, f"{path}: the region [readme:{name}] is never closed")
            return
        want, got = normalized(regions[key]), normalized(body)
        if want != got:
            for i in range(max(len(want), len(got))):
                a = want[i] if i < len(want) else "(nothing)"
                b = got[i] if i < len(got) else "(nothing)"
                if a != b:
                    self.problem(line, f"the block differs from {path}#{name} at its line {i + 1}: "
                                       f"the file has {a!r}, the README {b!r}")
                    break
        if path.endswith(".py"):
            self.check_python_names(line, body)

    def check_python_names(self, line, body):
        """Every vmm.torch.NAME (and the alias's vmm_torch.NAME) of a Python block is defined,
        imported or listed in python/vmm/torch/__init__.py."""
        package = os.path.join(self.root, "python", "vmm", "torch", "__init__.py")
        with open(package, encoding="utf-8") as f:
            text = f.read()
        defined = (set(re.findall(r"^def (\w+)", text, re.M)) | set(re.findall(r"^(\w+)\s*=", text, re.M))
                   | {n.strip() for names in re.findall(r"^from \S+ import (.+)$", text, re.M)
                      for n in names.split(",")})
        for name in sorted(set(re.findall(r"\bvmm(?:\.|_)torch\.(\w+)", "\n".join(body)))):
            if name not in defined:
                self.problem(line, f"vmm.torch.{name} is not defined in python/vmm/torch/__init__.py")

    # --- shell commands ----------------------------------------------------------------
    def check_commands(self, line, body):
        joined, pending = [], ""
        for i, text in enumerate(body):
            text = re.sub(r"(^|\s)#.*$", "", text).rstrip()
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            text = (pending + text).strip()
            pending = ""
            if text:
                joined.append((line + 1 + i, text))
        for number, text in joined:
            for command in re.split(r"\s*(?:&&|;|\|\|)\s*", text):
                try:
                    words = shlex.split(command)
                except ValueError as error:
                    self.problem(number, f"cannot read the command {command!r}: {error}")
                    continue
                if words:
                    self.check_command(number, words)

    def check_options(self, number, path, options):
        with open(os.path.join(self.root, path), encoding="utf-8") as f:
            text = f.read()
        for option in options:
            name = option.split("=", 1)[0]
            if not re.search(r"(?<![\w-])" + re.escape(name) + r"(?![\w-])", text):
                self.problem(number, f"{path} does not take {name}")

    def check_command(self, number, words):
        program, args = words[0], words[1:]
        if program in ("python3", "python") and args[:2] == ["-m", "pip"]:
            program, args = "pip", args[2:]
        # [--a|--b] in a usage line: each alternative is an option to check.
        options = [part for arg in args for part in arg.strip("[]").split("|") if part.startswith("-")]
        if program in ("bash", "python3", "python"):
            if not args:
                self.problem(number, f"{program} with no script")
                return
            script = args[0]
            if not self.exists(script) or not os.path.isfile(os.path.join(self.root, script)):
                self.problem(number, f"{script} is not in the repository")
                return
            self.check_options(number, script, [o for o in options])
            if args[1:] == ["--help"]:
                run = subprocess.run([sys.executable if program != "bash" else "bash", script, "--help"],
                                     cwd=self.root, capture_output=True, text=True, timeout=120)
                if run.returncode != 0:
                    self.problem(number, f"{script} --help exited {run.returncode}")
        elif program == "cmake":
            for arg in args:
                if arg.startswith("-D"):
                    name = arg[2:].split("=", 1)[0].split(":", 1)[0]
                    if not (name.startswith("CMAKE_") or name == "CUDAToolkit_ROOT"
                            or re.search(r"option\(\s*" + re.escape(name) + r"\b", self.cmake_text())):
                        self.problem(number, f"-D{name} is neither an option() of the project nor CMake's")
                elif arg.startswith("-") and arg not in CMAKE_OWN_OPTIONS:
                    self.problem(number, f"cmake option {arg}: the check knows no such option")
            for i, arg in enumerate(args[:-1]):
                if arg == "--target":
                    target = args[i + 1]
                    if not re.search(r"add_(?:executable|library|custom_target)\(\s*" + re.escape(target) + r"\b",
                                     self.cmake_text()):
                        self.problem(number, f"--target {target}: the project defines no such target")
        elif program in ("pip", "pip3"):
            # pip install [options] PATH: PATH is a folder of the repository with a Python
            # project (pyproject.toml or setup.py).
            paths = [a for a in args[1:] if not a.startswith("-")] if args[:1] == ["install"] else None
            if not paths:
                self.problem(number, "the check knows pip only as pip install PATH")
            for path in paths or []:
                folder = os.path.normpath(path)
                if not any(self.exists(os.path.join(folder, name)) for name in ("pyproject.toml", "setup.py")):
                    self.problem(number, f"pip install {path}: no pyproject.toml or setup.py there")
        elif program == "ctest":
            for i, arg in enumerate(args[:-1]):
                if arg == "-R" and self.build_dir:
                    pattern = args[i + 1]
                    if not any(re.search(pattern, test) for test in self.registered_tests()):
                        self.problem(number, f"ctest -R {pattern}: no registered test matches")
        elif program == "export":
            for arg in args:
                value = arg.split("=", 1)[1] if "=" in arg else ""
                if value.startswith("$PWD/") and not self.exists(value[len("$PWD/"):]):
                    self.problem(number, f"export {arg}: {value[5:]} is not in the repository")
        else:
            self.problem(number, f"no rule checks the command {program!r}: extend tests/tools/readme_check.py")

    # --- links and paths -----------------------------------------------------------------
    def check_paths(self, lines):
        # Links resolve against the README's folder; a README outside the repository (the
        # self-test's drifted copies) is read as if it were at its root.
        base = os.path.relpath(os.path.dirname(os.path.abspath(self.readme)), self.root)
        if base.startswith(".."):
            base = ""
        for number, text in enumerate(lines, 1):
            for target in LINK.findall(text):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                path = os.path.normpath(os.path.join(base, target.split("#", 1)[0]))
                self.check_path(number, path + ("/" if target.endswith("/") else ""), "the link")
            for word in BACKTICKED.findall(text):
                if word.startswith(REPOSITORY_DIRS) and not any(c in word for c in "*{}$<>|[]"):
                    self.check_path(number, word.rstrip(".,:;"), "the path")

    def check_path(self, number, path, what):
        if path in PENDING_LINKS:
            if self.exists(path):
                self.problem(number, f"{path} is in the tree now: remove it from PENDING_LINKS "
                                     "in tests/tools/readme_check.py")
            return
        if not self.exists(path):
            self.problem(number, f"{what} {path} names nothing in the repository")

    def run(self):
        with open(self.readme, encoding="utf-8") as f:
            lines = f.read().split("\n")
        self.check_blocks(lines, regions_of(self.root, self.files))
        self.check_paths(lines)
        return self.problems


def self_test(root):
    """A README that drifted in each way fails the check, naming what drifted."""
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        original = f.read()
    assert not Checker(root, os.path.join(root, "README.md"), None).run(), "the README itself must pass"
    snippet = re.search(r"<!-- snippet: (\S+)#(\S+) -->\n```\w*\n(.*?)\n", original)
    first_line = snippet.group(3)
    drifts = {
        "a snippet line changed": (original.replace(first_line, first_line + " // changed", 1), "differs from"),
        "an option that no script takes": (original.replace("scripts/test.sh --sanitize", "scripts/test.sh --sanitise", 1),
                                           "does not take --sanitise"),
        "a script that is gone": (original.replace("bash scripts/run.sh", "bash scripts/main.sh", 1),
                                  "scripts/main.sh is not in the repository"),
        "a block no rule checks": (original + "\n```cpp\nint main() {}\n```\n", "no rule checks"),
        "a link to nothing": (original + "\n[gone](docs/gone.md)\n", "docs/gone.md names nothing"),
        "a cmake option the project lacks": (original.replace("cmake -S", "cmake -DVMM_NOTHING=ON -S", 1),
                                             "-DVMM_NOTHING is neither"),
    }
    with tempfile.TemporaryDirectory() as folder:
        for name, (text, expected) in drifts.items():
            assert text != original, f"{name}: the self-test found nothing to change in README.md"
            path = os.path.join(folder, "README.md")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            problems = Checker(root, path, None).run()
            assert any(expected in p for p in problems), f"{name}: expected {expected!r}, got {problems}"
            print(f"self-test: {name}: fails as it should ({[p for p in problems if expected in p][0]})")
    print("self-test: ok")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--root", default=default_root, help="the repository (default: this script's)")
    parser.add_argument("--readme", help="the README to check (default: ROOT/README.md)")
    parser.add_argument("--build-dir", help="a configured build: ctest -R patterns must match its tests")
    parser.add_argument("--self-test", action="store_true", help="check that drifted READMEs fail")
    args = parser.parse_args()
    if args.self_test:
        self_test(args.root)
        return 0
    problems = Checker(args.root, args.readme or os.path.join(args.root, "README.md"), args.build_dir).run()
    for problem in problems:
        print(problem)
    print(f"readme_check: {len(problems)} problem(s)" if problems else "readme_check: every block, command and path holds")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
