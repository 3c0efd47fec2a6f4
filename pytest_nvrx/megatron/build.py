"""What a Megatron-LM checkout builds at first use, read from the checkout itself. No pytest here.

Megatron compiles its dataset helpers (a pybind11 extension) the first time a job needs them:
rank 0 of every job runs ``make -C <its directory>`` from a function of a module there
(``compile_helpers`` in ``megatron/core/datasets/utils.py`` since core 0.5, ``compile_helper`` in
``megatron/data/dataset_utils.py`` before), then every rank imports what it built. Jobs started
together on one fresh checkout race: one imports the ``.so`` while another's make is still
writing it (``ImportError: ...: file too short``).

Nothing of one revision is assumed. The build is found in the source: the functions under
``megatron/`` that run ``make`` in their own module's directory, beside a Makefile (their
syntax tree; nothing imported). What it makes, and whether that is up to date, is asked of make
itself on that directory's own Makefile (``make -pq``: its database), in the environment the
workers will have, so ``$(shell python3-config --extension-suffix)`` names the file Megatron's
own make would. ``-q`` runs no ordinary recipe, but make still runs, in the real checkout, what
reading the Makefile runs (its ``$(shell ...)`` calls, the rules that remake an included
makefile) and a recipe's ``+`` lines: exactly what Megatron's own make runs there at first use
in every job, so nothing a job would not run (docs/gpu.md says so). Building it once, under a
lock, is :mod:`pytest_nvrx.launch.prepare_megatron`.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.machinery
import os
import re
import signal
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pytest_nvrx.megatron.source_ast import call_name, const_str

#: The names GNU make looks for, in its order.
MAKEFILE_NAMES = ("GNUmakefile", "makefile", "Makefile")
#: Where the first-use builds are looked for (what pretrain_gpt.py imports).
PACKAGE_DIR = "megatron"
#: A module larger than this is not one that runs make (Megatron's are a few kB).
_MAX_SOURCE_BYTES = 2 << 20
#: Calls that leave a path's meaning as it is: abspath(x), Path(x), str(x), x.resolve(), ...
_SAME_PATH = frozenset({"abspath", "realpath", "normpath", "str", "fspath", "Path", "PurePath"})
_SAME_PATH_METHODS = frozenset({"resolve", "absolute"})


class MakeError(RuntimeError):
    """make could not read the directory's Makefile (exit 2): the message is its own word."""


@dataclass(frozen=True)
class MakeCall:
    """A ``make`` a function of a module runs: ``(["make", "-C", dir])``, read from source."""

    function: str
    line: int
    #: the command as the source spells it (``<expr>`` for what is not a literal)
    command: tuple[str, ...]
    #: whether it runs in the module's own directory (``-C``/``cwd=`` ``dirname(__file__)``)
    own_dir: bool


@dataclass(frozen=True)
class FirstUseBuild:
    """A build a checkout runs at first use: ``make -C directory`` from ``function`` at
    ``caller`` (relative to the checkout)."""

    checkout: Path
    directory: Path
    caller: str
    function: str
    command: tuple[str, ...]

    @property
    def rel_dir(self) -> str:
        return os.path.relpath(self.directory, self.checkout)

    def rel(self, name: str) -> str:
        """A file of the build's directory, relative to the checkout."""
        return os.path.join(self.rel_dir, name)

    def describe(self) -> str:
        """``megatron/core/datasets/utils.py:26 compile_helpers() runs make -C
        megatron/core/datasets``."""
        return f"{self.caller} {self.function}() runs make -C {self.rel_dir}"


@dataclass(frozen=True)
class MakeState:
    """What make says of a build's directory: the files of its default goal, and whether they
    are up to date; ``said``: what it printed on stderr while reading (a ``$(shell ...)`` that
    failed, e.g. ``No module named pybind11``)."""

    artifacts: tuple[str, ...]
    up_to_date: bool
    said: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# The source: which functions run make, and where


def first_use_builds(checkout: Path) -> tuple[FirstUseBuild, ...]:
    """The builds the checkout runs at first use, one per directory: each directory under
    ``megatron/`` with a Makefile whose own modules run ``make`` there. None: it builds
    nothing."""
    root = checkout / PACKAGE_DIR
    found: dict[Path, FirstUseBuild] = {}
    # links are followed (a megatron/core linked from elsewhere is imported, and built, all the
    # same); each directory is walked once, so a link back up the tree ends there
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        if not any(name in filenames for name in MAKEFILE_NAMES):
            continue
        directory = Path(dirpath)
        for name in sorted(f for f in filenames if f.endswith(".py")):
            tree = _parse(directory / name)
            if tree is None:
                continue
            for call in make_calls(tree):
                if call.own_dir and directory not in found:
                    found[directory] = FirstUseBuild(
                        checkout=checkout,
                        directory=directory,
                        caller=f"{os.path.relpath(directory / name, checkout)}:{call.line}",
                        function=call.function,
                        command=call.command,
                    )
    return tuple(found.values())


def _parse(path: Path) -> ast.Module | None:
    try:
        if path.stat().st_size > _MAX_SOURCE_BYTES:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "make" not in text:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def make_calls(tree: ast.Module) -> list[MakeCall]:
    """Every call in a function of ``tree`` whose command is a literal list starting with
    ``"make"`` (``subprocess.run(["make", "-C", path])``, ``check_call``, ...)."""
    out: list[MakeCall] = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names = _assignments(func)
        for node in ast.walk(func):
            if not isinstance(node, ast.Call):
                continue
            argv = _argv(node, names)
            if argv is None or not argv.elts or const_str(argv.elts[0]) != "make":
                continue
            texts = tuple(
                text if (text := const_str(e)) is not None else f"<{ast.unparse(e)}>"
                for e in argv.elts
            )
            where = _directory(node, argv)
            own = where is not None and _is_own_dir(where, names, depth=0)
            out.append(MakeCall(func.name, node.lineno, texts, own))
    return out


def _argv(call: ast.Call, names: Mapping[str, ast.expr]) -> ast.List | ast.Tuple | None:
    """The call's command: its first argument (or ``args=``), a literal list or a name bound
    to one (``command = ["make", ...]; subprocess.run(command)``)."""
    first = call.args[0] if call.args else None
    if first is None:
        first = next((k.value for k in call.keywords if k.arg == "args"), None)
    if isinstance(first, ast.Name):
        first = names.get(first.id)
    return first if isinstance(first, (ast.List, ast.Tuple)) else None


def _directory(call: ast.Call, argv: ast.List | ast.Tuple) -> ast.expr | None:
    """Where the command runs: the item after ``-C``, else the ``cwd=`` argument."""
    items = argv.elts
    for i, item in enumerate(items[:-1]):
        if const_str(item) == "-C":
            return items[i + 1]
    return next((k.value for k in call.keywords if k.arg == "cwd"), None)


def _assignments(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
    """``name = value`` of the function (a name assigned once)."""
    seen: dict[str, list[ast.expr]] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                seen.setdefault(target.id, []).append(node.value)
    return {name: values[0] for name, values in seen.items() if len(values) == 1}


def _unwrap(node: ast.expr, names: Mapping[str, ast.expr], depth: int) -> ast.expr:
    """``node`` without the calls that keep a path's meaning, names followed to their value."""
    while depth < 8:
        depth += 1
        if isinstance(node, ast.Name) and node.id in names:
            node = names[node.id]
        elif isinstance(node, ast.Call) and len(node.args) == 1 and call_name(node) in _SAME_PATH:
            node = node.args[0]
        elif (
            isinstance(node, ast.Call)
            and not node.args
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _SAME_PATH_METHODS
        ):
            node = node.func.value
        else:
            break
    return node


def _is_file(node: ast.expr, names: Mapping[str, ast.expr], depth: int) -> bool:
    node = _unwrap(node, names, depth)
    return isinstance(node, ast.Name) and node.id == "__file__"


def _is_own_dir(node: ast.expr, names: Mapping[str, ast.expr], depth: int) -> bool:
    """``dirname(__file__)`` or ``Path(__file__).parent``, however wrapped."""
    node = _unwrap(node, names, depth)
    if isinstance(node, ast.Call) and call_name(node) == "dirname" and len(node.args) == 1:
        return _is_file(node.args[0], names, depth + 1)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        return _is_file(node.value, names, depth + 1)
    return False


# ---------------------------------------------------------------------------------------------
# The Makefile, as make reads it

_RULE_VARIABLE = re.compile(r"\s*\S+\s*(?:::=|:::=|[:+?!]?=)")


def default_goal_files(database: str) -> tuple[str, ...]:
    """The files ``make`` with no target builds, from its database (``make -p``): the default
    goal's prerequisites when the goal itself has no recipe (Megatron's ``default: $(OUT)``),
    else the goal."""
    goal = None
    for line in database.splitlines():
        if line.startswith(".DEFAULT_GOAL := "):
            goal = line.split(":=", 1)[1].strip()
    if not goal:
        return ()
    lines = database.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("#", "\t")) or not line.startswith(goal + ":"):
            continue
        rest = line[len(goal) + 1 :].lstrip(":")
        if _RULE_VARIABLE.match(rest):
            continue  # a target-specific variable (``x.so: .SHELLSTATUS := 1``)
        prerequisites = rest.split("|", 1)[0].split()
        block = []
        for after in lines[i + 1 :]:
            if not after.strip():
                break
            block.append(after)
        has_recipe = any(b.startswith("\t") for b in block)
        return (goal,) if has_recipe or not prerequisites else tuple(prerequisites)
    return (goal,)


def run_make(
    make: str,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout_s: float,
    merge: bool = False,
    started: Callable[[int], None] | None = None,
) -> tuple[int, str, str]:
    """``make args`` in a session of its own: (exit status, stdout, stderr); ``merge`` puts
    stderr into stdout; ``started`` is told make's pid (its process group's) once it runs.

    The bound is make's own exit: its output goes to unnamed files, not pipes, so a process a
    recipe leaves behind holding them (a compiler server, a daemon in a session of its own) can
    neither delay the return of a make that exited nor outlive the deadline's wait. At the
    deadline, or on Ctrl-C, make's whole process group (the compiler it started) is killed and
    TimeoutExpired raised; a make that exited in time is never reported as timed out."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [make, *args],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out if merge else err,
            start_new_session=True,
        )
        try:
            if started is not None:
                started(proc.pid)
            status = proc.wait(timeout=timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            # make itself cannot ignore SIGKILL: this wait is short
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_REAP_S)
            raise
        # the rest of make's group (what its recipes left running in it) goes with it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return status, _read_back(out), _read_back(err)


#: How long a make killed with SIGKILL is waited for.
_REAP_S = 5.0
#: The most of make's output kept (its end: where it says why it failed).
_OUTPUT_MAX = 4 << 20


def _read_back(fh: BinaryIO) -> str:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - _OUTPUT_MAX))
    return _text(fh.read())


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


#: How long reading a Makefile may take (its ``$(shell ...)`` calls run: python3-config, ...).
READ_TIMEOUT_S = 120.0


def read_make_state(build: FirstUseBuild, make: str, env: Mapping[str, str]) -> MakeState:
    """Ask make what the directory's default goal builds and whether it is up to date (``make
    -pq``: exit 0 up to date, 1 not; no ordinary recipe runs, but ``$(shell ...)``, ``+`` recipe
    lines and the remaking of included makefiles do, as in any make there). MakeError: make
    cannot read it."""
    status, out, err = run_make(
        make,
        ["--no-print-directory", "-C", str(build.directory), "-p", "-q"],
        env,
        timeout_s=READ_TIMEOUT_S,
    )
    said = tuple(line.strip() for line in err.splitlines() if line.strip())
    if status not in (0, 1):
        raise MakeError(telling_line("\n".join(said)) or f"make exited {status}")
    return MakeState(default_goal_files(out), status == 0, said)


def is_up_to_date(build: FirstUseBuild, make: str, env: Mapping[str, str]) -> bool:
    """``make -q``: what Megatron's own make in that directory would do is nothing."""
    status, _, _ = run_make(
        make,
        ["--no-print-directory", "-C", str(build.directory), "-q"],
        env,
        timeout_s=READ_TIMEOUT_S,
    )
    return status == 0


# ---------------------------------------------------------------------------------------------
# What make said, and what it built

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: A command make or the shell could not run: ``make: g++: No such file or directory``.
COMMAND_MISSING = re.compile(
    r"^make: [^:\s]+: (?:No such file or directory|[Cc]ommand not found)$"
    r"|^(?:/bin/)?sh: (?:\d+: )?[^:]+: (?:not found|[Cc]ommand not found)$"
)
#: A module a ``$(shell python3 -m ...)`` of the Makefile lacked.
MODULE_MISSING = re.compile(r"No module named")
#: The most telling lines of a failed build first: a command not found, a compiler's fatal
#: error, any error, a module a $(shell ...) lacked, make's own stop.
_TELLING = (
    COMMAND_MISSING,
    re.compile(r"fatal error:"),
    re.compile(r"^(?!make(?:\[\d+\])?: \*\*\*).*\berror\b", re.IGNORECASE),
    MODULE_MISSING,
    re.compile(r"\*\*\*"),
)
_TELLING_MAX = 300


def telling_line(output: str) -> str:
    """The line of make's output that best says why it failed (else its last line), and a
    module a ``$(shell ...)`` lacked when that is another line: ``helpers.cpp:8:10: fatal error:
    pybind11/pybind11.h: No such file or directory (and python3: No module named pybind11)``."""
    lines = [_ANSI.sub("", line).strip() for line in output.splitlines()]
    lines = [line for line in lines if line]
    best = lines[-1] if lines else ""
    for pattern in _TELLING:
        hit = next((line for line in lines if pattern.search(line)), None)
        if hit is not None:
            best = hit
            break
    module = next((line for line in lines if MODULE_MISSING.search(line)), None)
    if module is not None and module != best:
        return f"{_cut(best)} (and {_cut(module)})"
    return _cut(best)


def _cut(line: str) -> str:
    return line if len(line) <= _TELLING_MAX else line[: _TELLING_MAX - 1] + "…"


_TAGGED_EXTENSION = re.compile(r"\.(?:cpython|pypy|graalpy)[^.]*\.so$")


def is_extension(name: str) -> bool:
    """A compiled module's name (``x.cpython-312-x86_64-linux-gnu.so``, ``x.abi3.so``, ``x.so``)."""
    return name.endswith(".so") or name.endswith(".pyd")


def foreign_extension(
    name: str, suffixes: Sequence[str] = tuple(importlib.machinery.EXTENSION_SUFFIXES)
) -> str | None:
    """The interpreter tag of an extension built for another Python than the one with
    ``suffixes`` (``.cpython-311-x86_64-linux-gnu.so`` for a 3.12 worker), else None."""
    match = _TAGGED_EXTENSION.search(name)
    if match is None or match.group(0) in suffixes:
        return None
    return match.group(0)


_ELF_MAGIC = b"\x7fELF"
_PT_LOAD = 1


def elf_shortfall(path: Path) -> str | None:
    """Why the ELF file at ``path`` cannot be loaded whole (the dynamic loader's ``file too
    short`` or ``invalid ELF header``), else None: shorter than its headers, program segments
    and section table say it is, as a file still being written is."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(64)
            if head[:4] != _ELF_MAGIC:
                return f"invalid ELF header ({size} bytes)"
            wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
            if len(head) < (64 if wide else 52):
                return f"file too short ({size} bytes)"
            if wide:
                phoff, shoff = struct.unpack_from(order + "QQ", head, 32)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 54)
            else:
                phoff, shoff = struct.unpack_from(order + "II", head, 28)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", head, 42)
            need = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
            for offset, filesz in _load_segments(fh, order, wide, phoff, phentsize, phnum, size):
                need = max(need, offset + filesz)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    except struct.error:
        return f"file too short ({size} bytes)"
    if size < need:
        return f"file too short ({size} of {need} bytes)"
    return None


def _load_segments(
    fh: BinaryIO, order: str, wide: bool, phoff: int, phentsize: int, phnum: int, size: int
) -> Iterator[tuple[int, int]]:
    """(offset, size in the file) of each loadable segment whose header is in the file."""
    if phentsize < (56 if wide else 32) or phoff + phnum * phentsize > size or phnum > 4096:
        return
    fh.seek(phoff)
    table = fh.read(phnum * phentsize)
    for i in range(phnum):
        entry = table[i * phentsize : (i + 1) * phentsize]
        (kind,) = struct.unpack_from(order + "I", entry, 0)
        if kind != _PT_LOAD:
            continue
        if wide:
            (offset,) = struct.unpack_from(order + "Q", entry, 8)
            (filesz,) = struct.unpack_from(order + "Q", entry, 32)
        else:
            (offset,) = struct.unpack_from(order + "I", entry, 4)
            (filesz,) = struct.unpack_from(order + "I", entry, 16)
        yield offset, filesz
