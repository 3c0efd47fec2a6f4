"""A checkpoint directory belongs to one run at a time.

Two runs sharing a ``--checkpoint-dir`` load each other's checkpoints: measured on 476a6ee, the
second run's first cycle loaded the first's checkpoint 5, and the first then PASSED on a
directory another run was writing into. So before anything launches, a run claims its
checkpoint directory as it claims its run dir: a claim file at the checkpoint root, created with
``O_EXCL`` (never through a link), naming the run ID, its run dir, the host, the pid (with the
pid's start time, so that a reused pid is not taken for the run) and the time.

The claim is released when the run ends, on every exit path the harness survives: the end of
the launch, a plan that failed after the claim, interpreter exit (a backstop). A harness that
died by SIGKILL cannot release it: its claim names a process that no longer runs, and the
refusal says so and which file to remove. Nothing here removes another process's claim.

The claim file lies at the checkpoint root: the evidence never lists that directory (it reads
the tracker and ``iter_N/`` by name) and retention keeps the root's files (it prunes below).
No pytest here.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import json
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_nvrx import __version__
from pytest_nvrx.evidence.refs import parse_json
from pytest_nvrx.layout import (
    CYCLE_INFOS_DIR,
    MANIFEST_NAME,
    is_run_claim_name,
    node_file_name,
)
from pytest_nvrx.settings import ConfigError, EntryPoint, option_hint

#: The claim of a single-node run; a multinode run's nodes each claim their own (see claim_path).
CLAIM_NAME = "checkpoint.claim"
#: The largest pid Linux hands out (``/proc/sys/kernel/pid_max`` at most 2**22): a claim naming
#: a larger one is no claim of a process (and ``os.kill`` would overflow on it).
PID_MAX = 1 << 22
#: Largest claim file read back to name its holder.
_READ_MAX = 4096
#: Claims this process made and has not released: released at interpreter exit at the latest.
_HELD: set[Path] = set()


def claim_path(
    checkpoint_dir: Path, *, nnodes: int, host: str, node_index: int | None = None
) -> Path:
    """``checkpoint.claim``; on several nodes, which share the checkpoint dir, one per node (by
    its index when numbered by hand, else by host name), as the run dir's claims."""
    if nnodes == 1:
        return checkpoint_dir / CLAIM_NAME
    if node_index is not None:
        return checkpoint_dir / node_file_name(CLAIM_NAME, node_index)
    return checkpoint_dir / f"checkpoint.{host}.claim"


def is_claim_name(name: str) -> bool:
    """Whether a file of a checkpoint root is one of our claims (any node's)."""
    return name.startswith("checkpoint.") and name.endswith(".claim")


def pid_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), None
    where that cannot be read: with the pid it names one process, a reused pid another."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read(4096)
        # the command (field 2) is in parentheses and may hold spaces or ')'
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def holder_record(run_id: str, run_dir: Path, host: str, time: str) -> dict[str, object]:
    """What a claim file says of its holder, this process (:func:`read_holder` reads it)."""
    return {
        "run_id": run_id,
        "run_dir": str(run_dir),
        "host": host,
        "pid": os.getpid(),
        "pid_start": pid_start(os.getpid()),
        "time": time,
        "tool": __version__,
    }


@dataclass(frozen=True)
class Holder:
    """Who holds a claim, as its file says; ``record`` False when it could not be read (being
    written right now, or not ours to read): then it counts as held by a live run."""

    path: Path
    run_id: str = "?"
    run_dir: str = "?"
    host: str = "?"
    pid: int = 0
    pid_start: int | None = None
    time: str = "?"
    record: bool = False
    # what is wrong with a claim that could not be read ("is empty", ...)
    unread: str = ""

    def describe(self) -> str:
        if not self.record:
            return f"another run ({self.path.name} could not be read)"
        return f"run {self.run_id} (pid {self.pid} on host {self.host}, started {self.time})"

    def alive(self, host: str) -> bool | None:
        """True/False for a claim of this host; None when its host is another (not checkable)."""
        if not self.record:
            return True
        if self.host != host:
            return None
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, OverflowError):
            return False
        except PermissionError:
            pass  # another user's process: alive
        if self.pid_start is None:
            return True
        return pid_start(self.pid) in (self.pid_start, None)


def read_holder(path: Path) -> Holder:
    """The claim at ``path``, read bounded, never through a link or a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return Holder(path, unread=f"could not be opened ({exc.strerror or exc})")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return Holder(path, unread="is not a regular file")
        raw = os.read(fd, _READ_MAX)
        if not raw.strip():
            return Holder(path, unread="is empty")
        data = parse_json(raw.decode("utf-8", "replace"))
        if not isinstance(data, dict):
            return Holder(path, unread="holds no claim record")
        run_id, run_dir, host, pid, since = (
            data["run_id"], data["run_dir"], data["host"], data["pid"], data["time"]
        )  # fmt: skip
        start = data.get("pid_start")
        texts = (run_id, run_dir, host, since)
        if not (all(isinstance(t, str) for t in texts) and type(pid) is int and 0 < pid <= PID_MAX):
            return Holder(path, unread="holds no claim record")
        if start is not None and type(start) is not int:
            return Holder(path, unread="holds no claim record")
        return Holder(path, run_id[:80], run_dir[:200], host[:64], pid, start, since[:40], True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Holder(path, unread="holds no claim record (truncated, or not ours)")
    finally:
        os.close(fd)


#: How long an unreadable claim is given to become readable: a claim is written in one small
#: write right after its ``O_EXCL`` create, so one still unreadable after this was not being
#: written (a run that died in between, or not ours).
SETTLE_READS = 10
SETTLE_PAUSE_S = 0.05


def settled_holder(path: Path, sleep: Callable[[float], None] = time.sleep) -> Holder:
    """:func:`read_holder`, read again while it cannot be read, for :data:`SETTLE_READS`
    (pausing through ``sleep``: a waiter's own, whose clock the pauses then count on)."""
    holder = read_holder(path)
    for _ in range(SETTLE_READS - 1):
        if holder.record or not path.exists():
            break
        sleep(SETTLE_PAUSE_S)
        holder = read_holder(path)
    return holder


def another_checkpoint_dir(entry: EntryPoint) -> str:
    """How a fix-it hint names the setting that picks another checkpoint dir, to a user of
    ``entry``: the CLI's ``--checkpoint-dir``; the plugin's scenarios have no checkpoint dir
    option (theirs is under their run dir), so theirs is another ``--nvrx-work-dir``."""
    return option_hint("work-dir" if entry == "plugin" else "checkpoint-dir", entry)


def _naming(message: Callable[[str], str]) -> ConfigError:
    """A refusal whose fix names the checkpoint dir's setting (``message`` is given its name),
    in the words of the entry point that shows it."""
    return ConfigError.naming(lambda entry: message(another_checkpoint_dir(entry)))


def _refusal(checkpoint_dir: Path, holder: Holder, host: str) -> Callable[[str], str]:
    """Why ``holder``'s claim refuses ``checkpoint_dir``, given the name of the setting that picks
    another; the holder is probed once, whichever entry point shows the message."""
    if not holder.record:
        # a claim is written in one call right after its O_EXCL create: an unreadable one is a
        # run's that died in between, someone else's file, or (for an instant) one being written
        return lambda option: (
            f"checkpoint dir {checkpoint_dir} holds a claim {holder.path} that {holder.unread}:"
            f" if no run uses {checkpoint_dir}, remove {holder.path}; if one does, wait for it"
            f" to end or pass another {option}"
        )
    alive = holder.alive(host)
    who = holder.describe()
    if alive is False:
        return lambda option: (
            f"checkpoint dir {checkpoint_dir} is claimed by {who}, which is no longer running: "
            f"remove {holder.path} if that run is gone"
        )
    if alive is None:
        return lambda option: (
            f"checkpoint dir {checkpoint_dir} is claimed by {who}, whose process cannot be "
            f"checked from this host: wait for it to end, pass another {option}, or "
            f"remove {holder.path} if that run is gone"
        )
    return lambda option: (
        f"checkpoint dir {checkpoint_dir} is in use by {who}: one checkpoint dir serves one "
        f"run at a time; wait for it to end or pass another {option}"
    )


def _foreign_claims(
    checkpoint_dir: Path, run_id: str, run_dir: Path, mine: Path | None
) -> list[Holder]:
    """Claims in ``checkpoint_dir`` other than ``mine`` made by another run (another run ID or
    run dir)."""
    try:
        with os.scandir(checkpoint_dir) as entries:
            names = sorted(e.name for e in entries if is_claim_name(e.name))
    except FileNotFoundError:
        return []
    except OSError as exc:
        why = exc.strerror or exc
        raise _naming(
            lambda option: (
                f"cannot read checkpoint dir {checkpoint_dir}: {why}; pass another {option}"
            )
        ) from None
    out = []
    for name in names:
        path = checkpoint_dir / name
        if mine is not None and path == mine:
            continue
        holder = settled_holder(path)
        if holder.record and (holder.run_id, holder.run_dir) == (run_id, str(run_dir)[:200]):
            # another node of this run, or this run ID started twice: the run dir's claim
            # decides that, and its refusal names the run dir
            continue
        out.append(holder)
    return out


def _run_dir_around(checkpoint_dir: Path, own_run_dir: Path) -> Path | None:
    """Another run's run dir that holds ``checkpoint_dir`` (at any depth), else None: its
    checkpoints are that run's evidence."""
    own = Path(os.path.realpath(own_run_dir))
    here = Path(os.path.realpath(checkpoint_dir))
    for folder in (here, *here.parents):
        if folder == own:
            return None  # our own run dir (the default checkpoints/): nothing above counts
        manifest = os.path.lexists(folder / MANIFEST_NAME) and (folder / CYCLE_INFOS_DIR).is_dir()
        if manifest or _holds_run_claim(folder):
            return folder
    return None


def _holds_run_claim(folder: Path) -> bool:
    """Whether ``folder`` holds a run dir's claim, any node's (one it cannot list: no)."""
    try:
        with os.scandir(folder) as entries:
            return any(is_run_claim_name(e.name) for e in entries)
    except OSError:
        return False


def check_checkpoint_dir(
    checkpoint_dir: Path,
    *,
    run_id: str,
    run_dir: Path,
    host: str | None = None,
) -> None:
    """Refuse (ConfigError) a checkpoint dir another run holds, or one inside another run's run
    dir. Read-only: what a dry run checks, and what a real run checks before it writes."""
    host = socket.gethostname() if host is None else host
    around = _run_dir_around(checkpoint_dir, run_dir)
    if around is not None:
        raise _naming(
            lambda option: (
                f"checkpoint dir {checkpoint_dir} is inside the run dir {around} of"
                f" another run: its checkpoints are that run's evidence; pass another {option}"
            )
        )
    foreign = _foreign_claims(checkpoint_dir, run_id, run_dir, None)
    if foreign:
        raise _naming(_refusal(checkpoint_dir, foreign[0], host))
    nested = _nested_claim(checkpoint_dir, run_id, run_dir)
    if nested is not None:
        where, holder = nested
        refusal = _refusal(holder.path.parent, holder, host)
        raise _naming(lambda option: f"checkpoint dir {checkpoint_dir} {where}: {refusal(option)}")


#: How deep below a checkpoint dir another run's claim is looked for (its iter_N dirs and
#: one level in them): a checkpoint dir inside another's writes into that run's checkpoints.
NESTED_DEPTH = 2


def _nested_claim(checkpoint_dir: Path, run_id: str, run_dir: Path) -> tuple[str, Holder] | None:
    """Another run's claim on a directory above ``checkpoint_dir`` or below it (at most
    :data:`NESTED_DEPTH` levels): the two runs would write into one tree of checkpoints."""
    here = Path(os.path.realpath(checkpoint_dir))
    for folder in here.parents:
        found = _foreign_claims(folder, run_id, run_dir, None)
        if found:
            return f"is inside checkpoint dir {folder}", found[0]
    level = [here]
    for _ in range(NESTED_DEPTH):
        below: list[Path] = []
        for folder in level:
            try:
                with os.scandir(folder) as entries:
                    below += [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
        for folder in below:
            found = _foreign_claims(folder, run_id, run_dir, None)
            if found:
                return f"holds checkpoint dir {folder}", found[0]
        level = below
    return None


def _unwritable(checkpoint_dir: Path, exc: OSError) -> ConfigError:
    why = exc.strerror or exc
    return _naming(
        lambda option: (
            f"cannot claim checkpoint dir {checkpoint_dir}: {why}; pass another"
            f" {option} you can write to"
        )
    )


def claim_checkpoint_dir(
    checkpoint_dir: Path,
    *,
    run_id: str,
    run_dir: Path,
    nnodes: int = 1,
    host: str | None = None,
    node_index: int | None = None,
) -> Path:
    """Claim the (existing) checkpoint dir for this run, atomically; ConfigError when another
    run holds it. Of two runs claiming one directory at once, at most one wins: the claim is
    made with ``O_EXCL`` and, on several nodes (one claim per node), kept only when no other
    run's claim is there afterwards. Returns the claim file; :func:`release` removes it."""
    host = socket.gethostname() if host is None else host
    check_checkpoint_dir(checkpoint_dir, run_id=run_id, run_dir=run_dir, host=host)
    path = claim_path(checkpoint_dir, nnodes=nnodes, host=host, node_index=node_index)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        holder = settled_holder(path)
        raise _naming(_refusal(checkpoint_dir, holder, host)) from None
    except OSError as exc:
        raise _unwritable(checkpoint_dir, exc) from None
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")
    record = holder_record(run_id, run_dir, host, now)
    _HELD.add(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        foreign = _foreign_claims(checkpoint_dir, run_id, run_dir, path)
    except OSError as exc:
        release(path)  # a claim that could not be written blocks nobody
        raise _unwritable(checkpoint_dir, exc) from None
    except BaseException:
        release(path)
        raise
    if foreign:
        release(path)
        raise _naming(_refusal(checkpoint_dir, foreign[0], host))
    return path


def release(path: Path) -> None:
    """Remove a claim this process made (a no-op for any other: never another run's)."""
    if path not in _HELD:
        return
    _HELD.discard(path)
    holder = read_holder(path)
    if holder.record and holder.pid != os.getpid():
        return  # replaced by someone else's after a manual removal: theirs now
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def release_dir(checkpoint_dir: Path) -> None:
    """Release this process's claims of ``checkpoint_dir`` (a no-op where it holds none)."""
    for path in sorted(_HELD):
        if path.parent == checkpoint_dir:
            with contextlib.suppress(OSError):
                release(path)


def release_all() -> None:
    """Release every claim this process still holds (at interpreter exit, and for callers that
    do not keep the claim's path)."""
    for path in sorted(_HELD):
        with contextlib.suppress(OSError):
            release(path)


def held() -> frozenset[Path]:
    return frozenset(_HELD)


atexit.register(release_all)
