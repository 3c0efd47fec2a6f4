"""The run directory on the file system: checked read-only, claimed, created.

Before anything is written, :func:`check_run_paths` finds every reason a later ``mkdir`` or the
launch would fail (a path too long, a file in the way, a pseudo file system, no write
permission, an injection marker, a calculated ft_state, a bad tracker), so a refused run leaves
no trace; :func:`validate_run` is the settings' pure rules
(:func:`pytest_nvrx.settings.validate`) and then these checks, what every real run gets. Then
the run directory is checked fresh, claimed for one launch (``O_EXCL``), its artifact
directories created (:func:`prepare_run_dir`), and each launch gets a fresh TMPDIR
(:func:`make_run_tmpdir`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from pytest_nvrx import __version__
from pytest_nvrx.evidence.tracker import read_tracker
from pytest_nvrx.launch.checkpoint_claim import another_checkpoint_dir, is_claim_name
from pytest_nvrx.launch.recipe import utc_now
from pytest_nvrx.layout import (
    RESULT_NAME,
    RUN_CLAIM_NAME,
    TMP_ROOT,
    TRACKER_NAME,
    RunLayout,
    iteration_of_dir_name,
    node_file_name,
)
from pytest_nvrx.outputs import is_disk_full, reserve_of, reserve_space, write_atomic
from pytest_nvrx.settings import (
    ConfigError,
    EntryPoint,
    RunConfig,
    option_hint,
    quote,
    show_path,
    validate,
)
from pytest_nvrx.worker.plant_hook.nvrx_plants import COMPLETE_FILES

#: Linux limits: a whole path (with its NUL), one path component.
PATH_MAX = 4096
NAME_MAX = 255
#: Bytes kept free below PATH_MAX for what a run writes inside its run and checkpoint dirs
#: (``iter_0000005/__0_0.distcp``, ``logs/train_cycle12.log``, ``.run.json.<pid>.tmp``).
ARTIFACT_ROOM = 256

#: File systems that hold no files of ours: mkdir there fails or, worse, does something else
#: (a directory in a cgroup file system is a new cgroup).
PSEUDO_FILE_SYSTEMS = frozenset(
    {
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "proc",
        "pstore",
        "rpc_pipefs",
        "securityfs",
        "selinuxfs",
        "sysfs",
        "tracefs",
    }
)
MOUNTS_FILE = Path("/proc/self/mounts")


# --------------------------------------------------------------------------------------------
# The file system, read only: what a later mkdir or write would fail on


def _absolute(path: Path) -> Path:
    try:
        return Path(os.path.abspath(path))
    except OSError:  # the current directory is gone
        return path


def _lexists(path: Path) -> bool:
    """Whether anything (a dangling link too) is at ``path``; unreadable counts as present."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except (OSError, ValueError):
        return True
    return True


def _is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _check_path_length(path: Path, what: str, room: int = 0) -> None:
    size = len(os.fsencode(path))
    if size + room >= PATH_MAX:
        limit = PATH_MAX - 1 - room
        raise ConfigError(
            f"{what} {show_path(path)} is too long: {size} bytes, at most {limit} allowed "
            f"(PATH_MAX {PATH_MAX}{', less room for the files of a run' if room else ''}): "
            "use a shorter path"
        )
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ConfigError(
                f"{what} {show_path(path)} has a path component of {len(os.fsencode(part))} "
                f"bytes; each must be at most {NAME_MAX} bytes: use shorter names"
            )


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "of another kind"


def _unescape_mount_field(text: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def file_system_at(path: str, mounts: str) -> tuple[str, str] | None:
    """(mount point, file system type) of the mount that holds ``path`` (absolute, resolved),
    from the text of ``/proc/self/mounts``; the last of equal mount points wins (it is on top)."""
    best: tuple[str, str] | None = None
    for line in mounts.splitlines():
        fields_ = line.split()
        if len(fields_) < 3:
            continue
        point, fs_type = _unescape_mount_field(fields_[1]), fields_[2]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fs_type)
    return best


def _pseudo_file_system(path: Path) -> tuple[str, str] | None:
    """The pseudo file system (mount point, type) holding ``path``, if it is on one."""
    real = os.path.realpath(path)
    try:
        with open(MOUNTS_FILE, encoding="utf-8", errors="replace") as fh:
            mounts = fh.read(1 << 20)
    except OSError:
        mounts = ""
    found = file_system_at(real, mounts)
    if found is None:  # no mount table: the usual places
        for point, fs_type in (("/dev/shm", ""), ("/proc", "proc"), ("/sys", "sysfs")):
            if real == point or real.startswith(point + "/"):
                return (point, fs_type) if fs_type else None
        if real == "/dev" or real.startswith("/dev/"):
            return ("/dev", "devtmpfs")
        return None
    return found if found[1] in PSEUDO_FILE_SYSTEMS else None


#: The fix of a directory's problem, spelled for the entry point that shows it.
Fix = Callable[[EntryPoint], str]


def _refused(problem: str, fix: Fix) -> ConfigError:
    """``problem`` followed by ``fix`` in the words of the entry point that shows it."""
    return ConfigError.naming(lambda entry: problem + fix(entry))


def _check_writable_dir(path: Path, what: str, fix: Fix) -> None:
    """``path`` is a directory we write into, or one ``mkdir -p`` will create: refuse now what
    would make that fail (a file in the way, a link loop or dangling link, a path too long, a
    pseudo file system, no write permission, a read-only or immutable directory)."""
    _check_path_length(path, what, ARTIFACT_ROOM)
    shown = show_path(path)
    existing = path
    while True:
        try:
            st = os.stat(existing)
            break
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(existing):
                raise _refused(
                    f"{what} {shown}: {show_path(existing)} is a dangling symbolic link; "
                    "remove it or ",
                    fix,
                ) from None
            if existing == existing.parent:
                raise ConfigError(f"{what} {shown}: the file system root is missing") from None
            existing = existing.parent
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refused(
                    f"{what} {shown} runs into a symbolic link loop (too many levels of "
                    "symbolic links); ",
                    fix,
                ) from None
            raise _refused(f"{what} {shown}: {exc.strerror or exc}; ", fix) from None
        except ValueError as exc:  # an embedded NUL
            raise ConfigError(f"{what} {quote(str(path))}: {exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        where = "" if existing == path else f": {show_path(existing)}"
        raise _refused(f"{what} {shown}{where} is {_kind(st.st_mode)}, not a directory; ", fix)
    pseudo = _pseudo_file_system(existing)
    if pseudo is not None:
        point, fs_type = pseudo
        raise _refused(
            f"{what} {shown} is on a {fs_type} pseudo file system (mounted at {point}), which "
            "holds no files of a run; ",
            fix,
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        action = "write in it" if existing == path else f"create it in {show_path(existing)}"
        raise _refused(
            f"{what} {shown}: cannot {action}: not writable (permissions, a read-only file "
            "system or the immutable attribute); ",
            fix,
        )


def _another(name: str) -> Fix:
    """``pass another --<name> (VAR)``, in the entry point's spelling."""
    return lambda entry: f"pass another {option_hint(name, entry)}"


def _checkpoint_dir_fix(entry: EntryPoint) -> str:
    return f"pass another {another_checkpoint_dir(entry)}"


def read_baseline(tracker: Path) -> int:
    """The tracker's iteration at start: absent → 0; empty, invalid or unreadable → ConfigError.

    Read by the core's one reader (evidence/tracker.py): only a small regular file, so a FIFO
    cannot block the run, a device or a huge file cannot fill memory, and a message quotes at
    most a short excerpt of what it holds.
    """
    read = read_tracker(tracker, tracker.parent, confined=False)
    if not read.exists:
        return 0
    if read.iteration is not None:
        return read.iteration
    if read.refused:
        raise ConfigError(f"checkpoint tracker {tracker} is unreadable (it {read.error})")
    if read.text is None:  # an OSError, or not UTF-8 text
        raise ConfigError(f"checkpoint tracker {tracker} is unreadable: {read.error}")
    if not read.text:
        raise ConfigError(
            f"checkpoint tracker {tracker} is empty; only an absent tracker starts at iteration 0"
        )
    shown = quote(read.text)
    raise ConfigError(f"checkpoint tracker {tracker} does not hold an integer: {shown}")


def check_run_paths(config: RunConfig) -> None:
    """The file-system part of a run's checks; raise ConfigError with a fix-it message.

    Reads the file system (stat, access, the mount table) but never writes: every reason a
    later ``mkdir`` or the launch would fail is found here, so a refused run leaves no trace.
    """
    megatron = config.megatron_path
    if config.workload == "megatron" and megatron is not None:
        if not megatron.is_absolute():
            raise ConfigError(
                f"Megatron path must be an absolute path, got {quote(str(megatron))} (with a "
                f"relative one the workers fail after starting); use "
                f"{show_path(_absolute(megatron))}"
            )
        _check_path_length(megatron, "Megatron path")
        if not _is_regular_file(megatron / "pretrain_gpt.py"):
            raise ConfigError(f"pretrain_gpt.py not found in Megatron path {show_path(megatron)}")

    layout = config.layout
    _check_writable_dir(config.work_dir, "work dir", _another("work-dir"))
    _check_writable_dir(layout.run_dir, "run dir", lambda entry: "use another run ID or work dir")
    _check_writable_dir(layout.checkpoint_dir, "checkpoint dir", _checkpoint_dir_fix)
    if _lexists(layout.marker):
        raise ConfigError(
            f"run ID {config.run_id!r} already has an injection marker ({layout.marker}); "
            "use a new run ID"
        )
    if _lexists(layout.ft_state):
        raise ConfigError(
            f"checkpoint dir {layout.checkpoint_dir} holds a calculated {layout.ft_state.name}; "
            "the fixed-timeout recipe needs a directory without it (archive it deliberately)"
        )
    read_baseline(layout.tracker)
    _check_unused_checkpoint_dir(layout)


#: Entries of a checkpoint dir looked at for another run's checkpoints.
_LISTED_MAX = 10_000


def _check_unused_checkpoint_dir(layout: RunLayout) -> None:
    """Refuse a checkpoint dir that holds another run's checkpoints (a tracker, an ``iter_N``).

    The run would resume them in its first cycle (``--load`` is ``--save``), so it is no longer
    a run of its own: a finished run's dir leaves nothing to train and the fault never fires,
    and its criteria would read that run's checkpoints as this one's (a prior checkpoint, an
    in-flight save left behind). A qualification run starts from scratch: a self-test's seed
    is copied in only after this check."""
    found: str | None = None
    try:
        with os.scandir(layout.checkpoint_dir) as entries:
            names = [e.name for _, e in zip(range(_LISTED_MAX), entries, strict=False)]
    except OSError:
        return  # absent (made later); unreadable: _check_writable_dir refused it
    if any(is_claim_name(name) for name in names):
        return  # a run holds it, or held it: the claim's refusal says which (checkpoint_claim)
    if _lexists(layout.tracker):
        found = f"its tracker {layout.tracker.name}"
    else:
        found = next((f"{name}/" for name in names if name.startswith("iter_")), None)
    if found is not None:
        checkpoint_dir = layout.checkpoint_dir
        raise _refused(
            f"checkpoint dir {show_path(checkpoint_dir)} holds another run's checkpoints"
            f" ({found}): this run would resume them instead of training from its start, and"
            " its criteria would read them as its own; move them away or ",
            _checkpoint_dir_fix,
        )


def validate_run(config: RunConfig) -> None:
    """Every check of a real run, in order: the settings' rules (no file system), then the file
    system's (:func:`check_run_paths`); nothing is written."""
    validate(config)
    check_run_paths(config)


# --------------------------------------------------------------------------------------------
# The run dir: fresh, claimed for one launch, created; a launch's TMPDIR


def _holds_anything(path: Path, *, folder: bool) -> bool:
    """Anything at ``path`` (a file, a link, a FIFO, ...); where a ``folder`` is expected, an
    empty directory does not count (a dry run leaves those).

    Never follows a link, never opens what is there; a path that cannot be read is a
    ConfigError (not a traceback), like every other file-system error before the launch.
    """
    try:
        st = os.lstat(path)
        if not (folder and stat.S_ISDIR(st.st_mode)):
            return True
        with os.scandir(path) as entries:
            return next(entries, None) is not None
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc}; use a new run ID or a work dir you own"
        ) from None


def check_fresh_run_dir(layout: RunLayout) -> None:
    """Refuse a run directory that already holds another launch's artifacts.

    A dry run leaves only empty directories behind, which a real launch may reuse; logs, cycle
    records or a manifest mean the run ID was used before and its evidence would be mixed in.
    """
    used = [
        path
        for path, folder in (
            (layout.manifest, False),
            (layout.logs, True),
            (layout.cycle_infos, True),
        )
        if _holds_anything(path, folder=folder)
    ]
    if used:
        raise ConfigError(
            f"run dir {layout.run_dir} was used before ({', '.join(p.name for p in used)}); "
            "use a new run ID"
        )


#: Largest claim file read back to name its holder.
_CLAIM_READ_MAX = 4096


def claim_file(layout: RunLayout, *, nnodes: int, host: str, node_index: int | None = None) -> Path:
    """``run.claim``; on several nodes, which share the run dir, one per node: by its index
    when the nodes are numbered by hand (several may share a host), else by host name."""
    if nnodes == 1:
        return layout.run_dir / RUN_CLAIM_NAME
    if node_index is not None:
        return layout.run_dir / node_file_name(RUN_CLAIM_NAME, node_index)
    return layout.run_dir / f"run.{host}.claim"


def _claim_holder(path: Path) -> str:
    """Who holds a claim, from its file (read bounded, never through a link or a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "another run"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "another run"
        data = json.loads(os.read(fd, _CLAIM_READ_MAX))
        pid, host, since = data["pid"], data["host"], data["time"]
        if not (isinstance(pid, int) and isinstance(host, str) and isinstance(since, str)):
            return "another run"
        return f"pid {pid} on host {host[:64]} since {since[:40]}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another run"  # e.g. being written right now
    finally:
        os.close(fd)


def check_unclaimed_run_dir(
    layout: RunLayout, *, nnodes: int, host: str | None = None, node_index: int | None = None
) -> None:
    """What :func:`claim_run_dir` would refuse, read-only (a dry run: it claims nothing)."""
    host = socket.gethostname() if host is None else host
    path = claim_file(layout, nnodes=nnodes, host=host, node_index=node_index)
    if os.path.lexists(path):
        raise ConfigError(
            f"run dir {layout.run_dir} is already claimed by {_claim_holder(path)} "
            f"({path.name}): one run dir holds one run; use a new run ID"
        )


def claim_run_dir(
    layout: RunLayout, *, nnodes: int, host: str | None = None, node_index: int | None = None
) -> Path:
    """Claim the run dir for one launch, atomically, before anything else is written in it.

    The claim file is created with ``O_EXCL`` (never through a planted link), so of two starts
    of one run ID exactly one wins; the other is refused before it writes anything. The claim
    stays: one run dir holds one run. Returns the claim file.
    """
    host = socket.gethostname() if host is None else host
    path = claim_file(layout, nnodes=nnodes, host=host, node_index=node_index)
    try:
        layout.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise ConfigError(
            f"run dir {layout.run_dir} is already claimed by {_claim_holder(path)} "
            f"({path.name}): one run dir holds one run; use a new run ID"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot claim run dir {layout.run_dir}: {exc.strerror or exc}; "
            "choose a work dir you can write to"
        ) from None
    record = {"pid": os.getpid(), "host": host, "time": utc_now(), "tool": __version__}
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write((json.dumps(record) + "\n").encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as exc:
        # a claim we could not write (a full disk, a quota) claims nothing: left behind empty it
        # would refuse this run ID forever as "claimed by another run"
        release_claim(path)
        if isinstance(exc, OSError):
            raise ConfigError(
                f"cannot claim run dir {layout.run_dir}: {exc.strerror or exc}; "
                "free space there or choose another work dir"
            ) from None
        raise
    return path


def release_claim(path: Path) -> None:
    """Give back a claim this process made for a launch that never started."""
    with contextlib.suppress(OSError):
        path.unlink()


def give_back_run_dir(
    layout: RunLayout, *, nnodes: int, node_index: int | None = None, host: str | None = None
) -> None:
    """A launch that never started (its run.json unwritten): give back the run dir's claim and
    the space kept for result.json, so that nothing blocks the run ID and nothing stray is left
    (issue #22: a full disk at run.json left ``run.claim`` behind, refusing the ID forever)."""
    host = socket.gethostname() if host is None else host
    release_claim(claim_file(layout, nnodes=nnodes, host=host, node_index=node_index))
    result = layout.run_dir / (
        node_file_name(RESULT_NAME, node_index) if node_index else RESULT_NAME
    )
    with contextlib.suppress(OSError):
        reserve_of(result).unlink()


def make_run_tmpdir(run_id: str) -> Path:
    """A fresh TMPDIR for one launch of ft_launcher (its Unix sockets, torchelastic's files).

    ``mkdtemp``: a new random name made with mode 0700 by ``mkdir``, which fails on any existing
    path, so nothing planted at a guessable name (a link to another user's directory) is reused
    or followed, and two launches never share one. Short on purpose: ft_launcher appends ~40
    bytes (``_ft_launcher<pid>_rmon<rank>.socket``) and a socket path must fit in 108; with a
    long TMPDIR the launcher cannot bind its sockets and stalls. ``/tmp/nvrx-<run id, 16
    characters at most>-<8 random>`` is at most 35 bytes.
    """
    label = re.sub(r"[^A-Za-z0-9_-]", "", run_id)[:16]
    return Path(tempfile.mkdtemp(prefix=f"nvrx-{label}-", dir=TMP_ROOT))


def prepare_run_dir(config: RunConfig, *, claim: bool = True) -> RunLayout:
    """Validate everything, claim the run dir, then create the artifact directories (as the
    walkthrough does). ``claim=False`` for a dry run: it launches nothing, so the run of that
    ID may still follow it."""
    validate_run(config)
    layout = config.layout
    if config.nnodes == 1:
        # On several nodes every node's launch prepares the same shared run dir; the first one
        # may already have written there, so only the walkthrough's marker check applies.
        check_fresh_run_dir(layout)
    claimed = (
        claim_run_dir(layout, nnodes=config.nnodes, node_index=config.node_index) if claim else None
    )
    try:
        for d in (layout.logs, layout.cycle_infos, layout.checkpoint_dir):
            d.mkdir(parents=True, exist_ok=True)
        if config.seed_checkpoint is not None:
            seed_checkpoint(config.seed_checkpoint, layout.checkpoint_dir)
        if claimed is not None:
            # room for result.json at the end, however full the run leaves the disk
            result = layout.run_dir / (
                node_file_name(RESULT_NAME, config.node_index) if config.node_index else RESULT_NAME
            )
            reserve_space(result, RESULT_RESERVE)
    except OSError as exc:
        if claimed is not None:
            release_claim(claimed)  # nothing was launched: the run ID may be tried again
        if is_disk_full(exc):
            raise ConfigError(
                f"no space left for run dir {layout.run_dir}: {exc.strerror}; "
                "free space there or choose another work dir"
            ) from None
        raise
    return layout


def seed_checkpoint(source: Path, checkpoint_dir: Path) -> int:
    """Copy the complete checkpoint ``source`` (``iter_N``) into an empty ``checkpoint_dir`` and
    write a tracker naming N (atomically): the run resumes it in its first cycle. Returns N.
    Refused (ConfigError) when ``source`` is no complete ``iter_N`` or the directory already
    holds a checkpoint or a tracker: nothing of a user's is ever overwritten."""
    iteration = iteration_of_dir_name(source.name)
    if iteration is None or not any((source / f).is_file() for f in COMPLETE_FILES):
        raise ConfigError(f"seed checkpoint {source} is not a complete iter_NNNNNNN directory")
    if any(checkpoint_dir.iterdir()):
        raise ConfigError(f"cannot seed {checkpoint_dir}: it is not empty")
    shutil.copytree(source, checkpoint_dir / source.name, symlinks=True)
    write_atomic(checkpoint_dir / TRACKER_NAME, str(iteration))
    return iteration


#: Bytes kept free for result.json (a few hundred bytes, one filesystem block or page).
RESULT_RESERVE = 16384
