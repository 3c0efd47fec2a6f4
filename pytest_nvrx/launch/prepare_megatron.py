"""Megatron's first-use build, done once before anything launches. No pytest here.

What a checkout builds at first use (its dataset helpers) is read by
:mod:`pytest_nvrx.megatron.build`. Before any scenario launches, the session (the CLI's ``run``,
a pytest session, each xdist worker, the self-test) makes sure it is built, so that every job's
rank 0 then finds it up to date (``make: Nothing to be done``) and no worker can import it half
written:

* up to date (``make -q``) and, for a compiled module, whole (an ELF file as long as its headers
  say): nothing to do;
* else the build is claimed with a claim file beside the artifact (``.nvrx-build.claim`` in the
  Makefile's directory: on shared storage every session, node and job using the checkout sees
  it), made with ``O_EXCL`` and naming its holder like a checkpoint dir's claim
  (:mod:`pytest_nvrx.launch.checkpoint_claim`); the others wait for it. A holder on this host that
  no longer runs is taken over at once; one on another host when its claim stops changing (the
  holder touches it every :data:`HEARTBEAT_S`) for :data:`STALE_S`;
* the holder runs the checkout's own ``make`` in a temporary tree laid out as the checkout (the
  directory copied whole, the rest linked, so relative paths read as in place; a temporary
  directory a killed session left is cleaned by the next build), and renames each file of the
  default goal into place (:func:`pytest_nvrx.outputs.write_atomic`): a reader
  sees the old file or the whole new one, never part of it. The checkout gains only the files
  Megatron's own make would have put there; the claim is removed at the end.

A checkout that cannot be built (no make, a read-only directory, a build that fails: no
compiler, no pybind11) is a ConfigError before anything launches, naming what is missing.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import enum
import errno
import importlib.machinery
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_nvrx.launch.checkpoint_claim import (
    Holder,
    holder_record,
    pid_start,
    read_holder,
    settled_holder,
)
from pytest_nvrx.megatron.build import (
    COMMAND_MISSING,
    FirstUseBuild,
    MakeError,
    MakeState,
    elf_shortfall,
    first_use_builds,
    foreign_extension,
    is_extension,
    is_up_to_date,
    read_make_state,
    run_make,
    telling_line,
)
from pytest_nvrx.outputs import write_atomic
from pytest_nvrx.settings import ConfigError, EntryPoint, option_hint

#: The build's claim, in the directory of what it builds.
CLAIM_NAME = ".nvrx-build.claim"
#: How often the holder touches its claim (its heartbeat, for waiters on other hosts).
HEARTBEAT_S = 2.0
#: A claim of another host (or an unreadable one) that has not changed for this long is a dead
#: holder's: NFS caches attributes for up to 60 s, a build's heartbeat is every 2 s.
STALE_S = 90.0
#: How often a waiter looks at the claim.
POLL_S = 0.2
#: The longest a build may take (Megatron's dataset helpers: 8.7 s on the H200 host).
BUILD_TIMEOUT_S = 900.0
#: The longest a waiter waits for a holder that keeps its claim alive.
WAIT_LIMIT_S = BUILD_TIMEOUT_S + 2 * STALE_S

#: Claims this process holds: removed at interpreter exit at the latest.
_HELD: set[Path] = set()
#: The file name endings the workers' Python (this one: ft_launcher runs it) imports.
_EXTENSION_SUFFIXES: tuple[str, ...] = tuple(importlib.machinery.EXTENSION_SUFFIXES)


class Outcome(enum.StrEnum):
    ALREADY = "already built"
    BUILT = "built"
    WAITED = "waited"


@dataclass(frozen=True)
class Prepared:
    """One first-use build, made sure of."""

    build: FirstUseBuild
    artifacts: tuple[str, ...]
    outcome: Outcome
    #: the build's seconds (BUILT) or the wait's (WAITED)
    seconds: float = 0.0
    #: who built it while this session waited (WAITED)
    builder: str | None = None
    #: what was wrong with the artifact found in place, replaced by the build (BUILT)
    replaced: str | None = None

    @property
    def names(self) -> str:
        return ", ".join(self.build.rel(name) for name in self.artifacts)

    def text(self) -> str:
        site = f"Megatron's first-use make -C {self.build.rel_dir}, {self.build.caller}"
        if self.outcome is Outcome.ALREADY:
            return f"{self.names} already built ({site}: up to date)"
        if self.outcome is Outcome.WAITED:
            return f"{self.names} built by {self.builder}; waited {self.seconds:.1f} s for it"
        done = f"built in {self.seconds:.1f} s, once, before launch ({site})"
        if self.replaced is not None:
            return f"{self.names} was half built ({self.replaced}): re{done}"
        return f"{self.names} {done}"


@dataclass(frozen=True)
class Preparation:
    """A checkout made ready for its first use: one entry per build it runs (none: it builds
    nothing)."""

    checkout: Path
    builds: tuple[Prepared, ...] = ()

    @property
    def line(self) -> str | None:
        """The one console line that says what was done (None: the checkout builds nothing)."""
        if not self.builds:
            return None
        return "nvrx: megatron build: " + "; ".join(p.text() for p in self.builds)

    def as_already(self) -> Preparation:
        """The same checkout as a later session of this process finds it: already built."""
        builds = tuple(replace(p, outcome=Outcome.ALREADY, seconds=0.0) for p in self.builds)
        return replace(self, builds=builds)

    def stamps(self) -> tuple[tuple[str, int, int, int], ...]:
        """(path, inode, size, mtime) of every artifact: what a later call checks unchanged."""
        out = []
        for prepared in self.builds:
            for name in prepared.artifacts:
                path = prepared.build.directory / name
                try:
                    st = path.stat()
                except OSError:
                    return ()
                out.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)


# ---------------------------------------------------------------------------------------------
# The claim


class ClaimNotAFile(RuntimeError):
    """The claim's path holds a directory (or another non-file a claim can never be): no holder
    ever releases it, and it is not ours to remove."""

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(f"{path} is {kind}")
        self.path = path
        self.kind = kind


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _odd_holder(holder: Holder, alive: bool | None) -> str | None:
    """Why a holder cannot be told dead or alive at once (its wait is then said on the
    console), else None."""
    if not holder.record:
        return f"its claim {holder.unread or 'could not be read'}"
    if alive is None:
        return f"on another host ({holder.host}), whose process cannot be checked from here"
    if holder.pid_start is None:
        return "its claim records no process start time (the pid may be reused)"
    return None


class ClaimWaitTooLong(RuntimeError):
    def __init__(self, holder: Holder, waited_s: float) -> None:
        super().__init__(f"waited {waited_s:.0f} s")
        self.holder = holder
        self.waited_s = waited_s


@dataclass
class Claim:
    """A held build claim; :meth:`release` removes it (the heartbeat stops first)."""

    path: Path
    time: str
    #: seconds spent waiting for other holders, and the last one seen (None: none waited for)
    waited_s: float = 0.0
    waited_for: Holder | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _beat: threading.Thread | None = None

    def start_heartbeat(self, every_s: float = HEARTBEAT_S) -> None:
        def beat() -> None:
            while not self._stop.wait(every_s):
                with contextlib.suppress(OSError):
                    os.utime(self.path)

        self._beat = threading.Thread(target=beat, name="nvrx-build-claim", daemon=True)
        self._beat.start()

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        release(self.path, self.time)


def holder_text(holder: Holder) -> str:
    """``pid 4242 on host gpu1 (run megatron-kill-step-...)``."""
    if not holder.record:
        return f"another session ({holder.path.name} could not be read)"
    return f"pid {holder.pid} on host {holder.host} ({holder.run_id})"


def _identity(holder: Holder) -> tuple[object, ...]:
    return (holder.host, holder.pid, holder.pid_start, holder.time, holder.run_id)


def _file_state(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of the claim, opened afresh (NFS revalidates on open); None: gone.
    One that cannot be opened has one state: it never changes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        return (-1, -1, -1)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_ino, st.st_size, st.st_mtime_ns


def break_claim(path: Path, holder: Holder, state: tuple[int, int, int] | None = None) -> bool:
    """Remove a dead holder's claim; True when it was that claim. It is renamed away first and
    read again: a fresh claim made meanwhile by someone else is put back (never over a newer
    one), so that two waiters that both saw the dead one do not remove each other's."""
    tomb = path.with_name(f"{path.name}.stale.{os.getpid()}.{secrets.token_hex(3)}")
    try:
        os.rename(path, tomb)
    except FileNotFoundError:
        return False
    if holder.record:
        same = _identity(read_holder(tomb)) == _identity(holder)
    else:
        same = _file_state(tomb) == state
    if not same:
        with contextlib.suppress(OSError):
            os.link(tomb, path)
    with contextlib.suppress(OSError):
        tomb.unlink()
    return same


def acquire(
    directory: Path,
    *,
    who: str,
    building: tuple[str, ...],
    host: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = POLL_S,
    stale_s: float = STALE_S,
    wait_limit_s: float = WAIT_LIMIT_S,
    say: Callable[[str], None] = _to_stderr,
) -> Claim:
    """Claim the build of ``directory``, waiting while another live holder has it; a wait on a
    holder that cannot be told dead at once (an unreadable claim, another host's, a pid without
    its start time) is said in one line through ``say``, with how long it may last.

    OSError: the claim cannot be created (a read-only directory); ClaimNotAFile: a directory
    (or other non-file) is in the claim's place; ClaimWaitTooLong: a holder kept its claim
    alive past ``wait_limit_s``."""
    host = socket.gethostname() if host is None else host
    path = directory / CLAIM_NAME
    start = clock()
    waited_for: Holder | None = None
    observed: tuple[int, int, int] | None = None
    since = start
    said = False
    while True:
        stamp = _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            pass
        else:
            record = {**holder_record(who, directory, host, stamp), "building": list(building)}
            _HELD.add(path)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
            except BaseException:
                release(path, stamp)
                raise
            waited = clock() - start if waited_for is not None else 0.0
            return Claim(path, stamp, waited, waited_for)
        kind = _not_a_claim_file(path)
        if kind is not None:
            raise ClaimNotAFile(path, kind)
        holder = settled_holder(path, sleep)
        state = _file_state(path)
        if state is None:
            continue  # released meanwhile: try again at once
        if holder.record or waited_for is None:
            waited_for = holder  # the last readable holder is who built it
        now = clock()
        if state != observed:
            observed, since = state, now
        alive = holder.alive(host) if holder.record else None
        if alive is False or (alive is None and now - since >= stale_s):
            break_claim(path, holder, state)
            observed = None
            continue
        if now - start >= wait_limit_s:
            raise ClaimWaitTooLong(holder, now - start)
        odd = _odd_holder(holder, alive)
        if odd is not None and not said:
            said = True
            until = (
                f"while it stays alive, up to {wait_limit_s:.0f} s"
                if alive
                else f"until it has not changed for {stale_s:.0f} s (at most {wait_limit_s:.0f} s)"
            )
            say(
                f"nvrx: megatron build: {path} is held by {holder_text(holder)}, {odd}: waiting"
                f" for it to build {', '.join(building)} {until}"
            )
        sleep(poll_s)


def _not_a_claim_file(path: Path) -> str | None:
    """What is in the claim's place when it is something no holder ever made: a directory."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return "a directory" if stat.S_ISDIR(mode) else None


def release(path: Path, stamp: str) -> None:
    """Remove the claim this process made at ``stamp`` (never one that replaced it)."""
    if path not in _HELD:
        return
    _HELD.discard(path)
    holder = read_holder(path)
    if holder.record and (holder.pid, holder.time) != (os.getpid(), stamp[:40]):
        return
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _release_all() -> None:
    for path in sorted(_HELD):
        with contextlib.suppress(OSError):
            _HELD.discard(path)
            if read_holder(path).pid == os.getpid():
                path.unlink()


atexit.register(_release_all)


# ---------------------------------------------------------------------------------------------
# Refusals: one line each, before anything launches


def _refused(text: str | Callable[[EntryPoint], str]) -> ConfigError:
    if isinstance(text, str):
        return ConfigError(text)
    return ConfigError.naming(text)


def _no_make(build: FirstUseBuild) -> ConfigError:
    return _refused(
        f"this Megatron checkout builds at first use ({build.describe()}), but make is not on"
        " PATH: rank 0 of every job would die there; install make, a C++ compiler and pybind11"
        " for the python3 on PATH"
    )


def _unreadable_makefile(build: FirstUseBuild, why: str) -> ConfigError:
    return _refused(
        f"make cannot read the Makefile of {build.directory} ({why}): Megatron's first-use"
        f" build ({build.describe()}) would fail the same way in every job"
    )


def _foreign(build: FirstUseBuild, name: str, tag: str, env: Mapping[str, str]) -> ConfigError:
    config = shutil.which("python3-config", path=env.get("PATH", os.defpath)) or "not found"
    ours = next(
        (s for s in _EXTENSION_SUFFIXES if s.startswith(".cpython") or s.startswith(".pypy")),
        _EXTENSION_SUFFIXES[0],
    )
    return _refused(
        f"make in {build.rel_dir} would build {name}, an extension for another Python ({tag};"
        f" python3-config on PATH: {config}) than the workers' Python"
        f" {sys.version_info.major}.{sys.version_info.minor} ({sys.executable}, which imports"
        f" *{ours}): Megatron's import of it would fail; put the bin directory of the workers'"
        " Python (with its python3 and python3-config) first on PATH"
    )


def _unwritable(build: FirstUseBuild, names: str, exc: OSError) -> ConfigError:
    why = exc.strerror or str(exc)
    return _refused(
        lambda entry: (
            f"{names} must be built before launch ({build.describe()} at first use), but"
            f" {build.directory} is not writable ({why}): build it once where the checkout is"
            f" writable (make -C {build.directory}) and give that checkout"
            f" ({option_hint('megatron-path', entry)})"
        )
    )


def _hints(line: str) -> str:
    """What to install, for what the telling line says is missing."""
    out = []
    first = line.split(" (and ", 1)[0]
    if COMMAND_MISSING.search(first) and any(cc in first for cc in ("++", "cc", "clang")):
        out.append("install a C++ compiler (g++)")
    if "pybind11" in line:
        out.append("install pybind11 for the python3 on PATH (python3 -m pip install pybind11)")
    return "".join(f"; {hint}" for hint in out)


def _build_failed(
    build: FirstUseBuild, names: str, status: int, output: str, said: tuple[str, ...]
) -> ConfigError:
    line = telling_line("\n".join([*said, output]))
    return _refused(
        f"building {names} failed (make -C {build.directory} exited {status}): {line}"
        f"{_hints(line)}; rank 0 of every job would fail the same way at first use"
        f" ({build.describe()})"
    )


# ---------------------------------------------------------------------------------------------
# Preparing a checkout


def _half_built(build: FirstUseBuild, artifacts: tuple[str, ...]) -> str | None:
    """What is wrong with a compiled artifact in place that its loader could not load whole
    (``file too short (12 of 294256 bytes)``, named when the build makes several)."""
    for name in artifacts:
        path = build.directory / name
        if is_extension(name) and path.is_file():
            why = elf_shortfall(path)
            if why is not None:
                return why if len(artifacts) == 1 else f"{name}: {why}"
    return None


def _read(build: FirstUseBuild, make: str, env: Mapping[str, str]) -> MakeState:
    try:
        state = read_make_state(build, make, env)
    except MakeError as exc:
        raise _unreadable_makefile(build, str(exc)) from None
    except subprocess.TimeoutExpired:
        raise _unreadable_makefile(build, "make did not answer") from None
    for name in state.artifacts:
        if "/" in name or name in (".", ".."):
            raise _unreadable_makefile(build, f"its default goal names {name}, not a file there")
        tag = foreign_extension(name, _EXTENSION_SUFFIXES)
        if tag is not None:
            raise _foreign(build, name, tag, env)
    if not state.artifacts:
        raise _unreadable_makefile(build, "no default goal")
    for name in state.artifacts:
        kind = _not_a_file(build.directory / name)
        if kind is not None:
            raise _refused(
                f"{build.directory / name} is {kind}, where make -C {build.directory} builds the"
                f" file its default goal names ({build.describe()} at first use): Megatron's"
                " import of it would fail, and make may call it up to date; remove it"
            )
    return state


def _not_a_file(path: Path) -> str | None:
    """What is in place of a file to build, when it is something else (a directory, a FIFO, a
    dangling link): make's date for it says nothing of a module to import."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a dangling link" if os.path.islink(path) else None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


#: The temporary directories of builds: ``nvrx-megatron-build-<pid>-<its start>-<random>``, so
#: that a later session recognises one whose process is gone (killed with SIGKILL mid-build).
BUILD_DIR_PREFIX = "nvrx-megatron-build-"
#: In a build's temporary directory: ``<pid> <start>`` of the make it runs.
_MAKE_PID = "make.pid"
_SKIPPED = ("__pycache__",)


def _build_dir_owner(name: str) -> tuple[int, int | None] | None:
    """(pid, start) a build directory's name records; None: not one of ours."""
    if not name.startswith(BUILD_DIR_PREFIX):
        return None
    parts = name[len(BUILD_DIR_PREFIX) :].split("-")
    if len(parts) < 3 or not parts[0].isdigit():
        return None
    return int(parts[0]), int(parts[1]) if parts[1].isdigit() else None


def clean_stale_build_dirs(root: Path | None = None) -> list[Path]:
    """Remove the build directories (in ``root``, default the temporary directory) of sessions of
    this host that no longer run, after killing the make each left running (its process group,
    when the pid still names the same process); the removed directories."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        owner = _build_dir_owner(entry.name)
        if owner is None or not entry.is_dir(follow_symlinks=False):
            continue
        pid, start = owner
        if start is not None and pid_start(pid) == start:
            continue  # its session still runs
        _kill_recorded_make(Path(entry.path) / _MAKE_PID)
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed


def _kill_recorded_make(record: Path) -> None:
    try:
        pid_text, start_text = record.read_text(encoding="utf-8").split()
        pid, start = int(pid_text), int(start_text)
    except (OSError, ValueError):
        return
    if pid_start(pid) == start:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _mirror(build: FirstUseBuild, artifacts: tuple[str, ...], tree: Path) -> Path:
    """A tree laid out as the checkout, where the build's directory is a copy (its files and
    subdirectories, links kept as links) and everything else on the way down is a link to the
    checkout's own: what the Makefile reads by a relative path (``src/x.cpp``,
    ``../include/x.h``) it finds as in place. The copy of the directory in that tree."""
    parts = Path(build.rel_dir).parts
    here, real = tree, build.checkout
    for part in parts:
        here.mkdir(exist_ok=True)
        with os.scandir(real) as entries:
            for entry in entries:
                if entry.name != part:
                    os.symlink(entry.path, here / entry.name)
        here, real = here / part, real / part

    def ignore(directory: str, names: list[str]) -> set[str]:
        top = os.path.samefile(directory, build.directory)
        return {
            n
            for n in names
            if n in _SKIPPED or (top and (n.startswith((CLAIM_NAME, ".nvrx-")) or n in artifacts))
        }

    shutil.copytree(build.directory, here, symlinks=True, ignore=ignore)
    return here


def _build(
    build: FirstUseBuild, make: str, state: MakeState, env: Mapping[str, str], names: str
) -> None:
    """Run the checkout's make on a copy of its directory (in a tree laid out as the checkout);
    rename what it built into place, so that no reader ever sees it half written."""
    clean_stale_build_dirs()
    prefix = f"{BUILD_DIR_PREFIX}{os.getpid()}-{pid_start(os.getpid()) or 'x'}-"
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = _mirror(build, state.artifacts, Path(tmp) / "tree")

        def record(pid: int) -> None:
            write_atomic(Path(tmp) / _MAKE_PID, f"{pid} {pid_start(pid) or 0}\n".encode())

        try:
            status, output, _ = run_make(
                make,
                ["-C", str(work)],
                env,
                timeout_s=BUILD_TIMEOUT_S,
                merge=True,
                started=record,
            )
        except subprocess.TimeoutExpired:
            raise _refused(
                f"building {names} did not finish in {BUILD_TIMEOUT_S:.0f} s (make -C"
                f" {build.directory}); Megatron's rank 0 would wait as long in every job"
            ) from None
        if status != 0:
            raise _build_failed(build, names, status, output, state.said)
        for name in state.artifacts:
            built = work / name
            if not built.is_file():
                raise _refused(
                    f"make -C {build.directory} succeeded but made no {name}, the file its"
                    " default goal names; Megatron's first-use import of it would fail"
                )
            mode = stat.S_IMODE(built.stat().st_mode)
            write_atomic(build.directory / name, built.read_bytes(), mode=mode)


def _prepare(
    build: FirstUseBuild,
    *,
    who: str,
    env: Mapping[str, str],
    host: str | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    say: Callable[[str], None],
) -> Prepared:
    make = shutil.which("make", path=env.get("PATH", os.defpath))
    if make is None:
        raise _no_make(build)
    state = _read(build, make, env)
    names = ", ".join(build.rel(name) for name in state.artifacts)
    if state.up_to_date and _half_built(build, state.artifacts) is None:
        return Prepared(build, state.artifacts, Outcome.ALREADY)
    try:
        claim = acquire(
            build.directory, who=who, building=state.artifacts, host=host, clock=clock,
            sleep=sleep, say=say,
        )  # fmt: skip
    except ClaimWaitTooLong as exc:
        where = build.directory / CLAIM_NAME
        raise _refused(
            f"waited {exc.waited_s:.0f} s for {holder_text(exc.holder)} to build {names}"
            f" (its claim {where} is still alive): if that process is gone, remove {where}"
        ) from None
    except ClaimNotAFile as exc:
        raise _refused(
            f"{exc.path} is {exc.kind}, where the build of {names} keeps its claim file (a"
            " lock shared by every session using this checkout): no session can build it;"
            f" remove {exc.path}"
        ) from None
    except OSError as exc:
        raise _unwritable(build, names, exc) from None
    claim.start_heartbeat()
    try:
        # under the claim, ask again: the session waited for may have built it
        state = _read(build, make, env)
        half = _half_built(build, state.artifacts)
        if state.up_to_date and half is None:
            if claim.waited_for is None:
                return Prepared(build, state.artifacts, Outcome.ALREADY)
            return Prepared(
                build,
                state.artifacts,
                Outcome.WAITED,
                seconds=claim.waited_s,
                builder=holder_text(claim.waited_for),
            )
        started = clock()
        try:
            _build(build, make, state, env, names)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise _unwritable(build, names, exc) from None
            raise _refused(f"building {names} failed: {exc}") from None
        seconds = clock() - started
        if not is_up_to_date(build, make, env):
            raise _refused(
                f"after building {names}, make -q in {build.directory} still finds it out of"
                " date (a source modified in the future? the clocks of this host and of the"
                " checkout's storage disagree): Megatron's rank 0 would build it again in every"
                f" job while others import it; touch the sources of {build.rel_dir} or fix the"
                " clocks"
            )
        return Prepared(build, state.artifacts, Outcome.BUILT, seconds=seconds, replaced=half)
    finally:
        claim.release()


def prepare_checkout(
    checkout: Path,
    *,
    who: str,
    environ: Mapping[str, str] | None = None,
    host: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = _to_stderr,
) -> Preparation:
    """Make sure every first-use build of ``checkout`` is done (``who`` names this session in
    its claim); ConfigError when one cannot be. ``environ`` (default: this process's) is what the
    workers, and so Megatron's own make, will run with."""
    env = dict(os.environ if environ is None else environ)
    builds = first_use_builds(checkout)
    return Preparation(
        checkout,
        tuple(
            _prepare(build, who=who, env=env, host=host, clock=clock, sleep=sleep, say=say)
            for build in builds
        ),
    )


#: This process's preparations, by checkout and PATH, with the artifacts' stamps then.
_PREPARED: dict[tuple[str, str], tuple[Preparation, tuple[tuple[str, int, int, int], ...]]] = {}
#: This process's refusals, by checkout and PATH.
_REFUSED: dict[tuple[str, str], ConfigError] = {}
_PREPARED_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def ensure_prepared(
    checkout: Path,
    *,
    who: str,
    environ: Mapping[str, str] | None = None,
    say: Callable[[str], None] = _to_stderr,
) -> Preparation:
    """:func:`prepare_checkout` once per process: a later call (a scenario's plan after its
    session prepared the checkout, a thread of a pool) whose artifacts are unchanged since is
    told they are already built, without asking make again; one after a refusal is refused
    alike (a failing build is not run again for every scenario)."""
    env = os.environ if environ is None else environ
    key = (os.path.realpath(checkout), env.get("PATH", ""))
    with _LOCKS_LOCK:
        lock = _PREPARED_LOCKS.setdefault(key, threading.Lock())
    with lock:
        refused = _REFUSED.get(key)
        if refused is not None:
            raise refused
        known = _PREPARED.get(key)
        if known is not None and known[0].stamps() == known[1]:
            return known[0].as_already()
        try:
            prepared = prepare_checkout(checkout, who=who, environ=env, say=say)
        except ConfigError as exc:
            _REFUSED[key] = exc
            raise
        _PREPARED[key] = (prepared, prepared.stamps())
        return prepared
