"""The files we write: whole or not at all, and never into the evidence we judge (no pytest).

Every file pytest-nvrx writes (run.json, result.json, reports, ``verify --json``) goes through
:func:`write_atomic`: a temp file beside the target, renamed over it only once it is complete, so
a failed write (a full disk, a quota) leaves the old file whole and no temp file behind.
:func:`check_outputs` refuses an output path that resolves (links followed) into a run directory
being judged, or onto another output of the same command: ``report X -o X/run.json`` would
replace the manifest it judges. :func:`check_output_targets` refuses a path where something
other than a regular file lies (a device, FIFO, socket, directory or symlink): a rename would
replace it (``--json /dev/full`` turned the device into a file); :func:`write_atomic` checks
again just before its rename.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from pytest_nvrx.evidence.refs import file_kind
from pytest_nvrx.layout import CHECKPOINTS_DIR

#: errno values that mean "the filesystem has no room for this": an ordinary error, never a
#: traceback
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class OutputRefused(ValueError):
    """An output path that would overwrite evidence or another output; the message names the
    fix."""


class NotAnOutputFile(OSError):
    """Something other than a regular file lies where an output would be written: nothing is
    written (a rename would replace the device, FIFO, socket, directory or link)."""


def target_refusal(path: Path | str) -> str | None:
    """Why ``path`` must not be replaced by an output, as a phrase after the path ("is a FIFO,
    not a regular file"); None for a regular file or a new path. A symlink is refused whatever
    it points to: the rename would replace the link, not write where it leads."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # a new path (a parent that is a file fails the write itself)
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    if stat.S_ISREG(st.st_mode):
        return None
    what = "a symlink" if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)
    return f"is {what}, not a regular file: only a regular file or a new path is written"


def check_output_targets(outputs: Iterable[tuple[str, Path]]) -> None:
    """Refuse an output (``(how the user named it, path)``) whose path holds anything but a
    regular file: :class:`OutputRefused` with one line that names the fix."""
    for flag, path in outputs:
        why = target_refusal(path)
        if why is not None:
            raise OutputRefused(f"{flag} {path} {why}; give another path")


def check_output_paths(
    outputs: Iterable[tuple[str, Path]], evidence: Iterable[tuple[str, Path]]
) -> None:
    """Both refusals of a command's outputs before anything is judged or written:
    :func:`check_outputs` (into the evidence, onto one another), then
    :func:`check_output_targets` (onto anything but a regular file)."""
    outputs = list(outputs)
    check_outputs(outputs, evidence)
    check_output_targets(outputs)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


#: A run's file system with less free than this once the run ended has filled up: its
#: result.json came out of the space kept for it (16 KiB), and a checkpoint needs megabytes.
FULL_BELOW_BYTES = 1 << 20


def full_disk_note(paths: Iterable[Path]) -> str | None:
    """One line naming the full disk when the file system of one of ``paths`` (a run's run and
    checkpoint dirs, after the run) has less than :data:`FULL_BELOW_BYTES` free; None else.
    What the run's own logs say about it is the judgement's (a fatal problem of the evidence)."""
    for path in paths:
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        free = st.f_bavail * st.f_frsize
        if free < FULL_BELOW_BYTES:
            return (
                f"{os.strerror(errno.ENOSPC)}: the file system of {path} has {free} bytes free"
                " after the run, so the run's writes there (checkpoints, logs, cycle records)"
                " may have failed; free space there and run it again"
            )
    return None


def reserve_of(path: Path) -> Path:
    """The space kept for ``path`` (:func:`reserve_space`), beside it."""
    return path.with_name(f".{path.name}.reserve")


def reserve_space(path: Path, size: int) -> None:
    """Keep ``size`` bytes for a later :func:`write_atomic` of ``path`` (result.json, written
    when the run ends, perhaps on a disk the run filled): that write frees them when the disk
    is full. Raises OSError (ENOSPC: there is not even that much room now)."""
    reserve = reserve_of(path)
    try:
        fd = os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            # written, not a sparse truncate: the blocks are taken now (a short write means
            # the disk is nearly full: the next one raises ENOSPC)
            _write_all(fd, b"\0" * size)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            reserve.unlink()
        raise


def write_atomic(path: Path | str, data: str | bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through a temp file in its directory, with
    ``mode`` (less the umask).

    The temp file (``.<name>.<pid>.<random>.tmp``, created exclusively, never through a link)
    is renamed over ``path`` once written and synced; on any failure it is removed and ``path``
    keeps its old content. On a full disk the space kept by :func:`reserve_space` is given back
    and the write tried once more. Errors are OSError naming ``path``, not the temp file;
    :class:`NotAnOutputFile` where ``path`` holds anything but a regular file (nothing written)."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    _refuse_target(path)
    try:
        _write_replace(path, raw, mode)
    except OSError as exc:
        reserve = reserve_of(path)
        if not (is_disk_full(exc) and reserve.is_file()):
            raise _naming(exc, path) from None
        with contextlib.suppress(OSError):
            reserve.unlink()
        try:
            _write_replace(path, raw, mode)
        except OSError as again:
            raise _naming(again, path) from None
    with contextlib.suppress(OSError):
        reserve_of(path).unlink()


def write_output(path: Path | str, data: str | bytes) -> None:
    """A report or ``verify --json`` file: its missing parent directories made first (as
    pytest's ``--junitxml`` does), then :func:`write_atomic`; the directories made are removed
    again when the write fails (a full disk). Only after :func:`check_outputs` let the path
    through: a new directory inside evidence would change it too."""
    made: list[Path] = []
    folder = Path(path).parent
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    try:
        for new in reversed(made):
            new.mkdir()
        write_atomic(path, data)
    except BaseException:
        for new in made:
            with contextlib.suppress(OSError):
                new.rmdir()
        raise


def check_in_place_output(flag: str, path: Path, evidence: Iterable[tuple[str, Path]]) -> None:
    """Refuse an existing ``path`` that another writer (pytest's ``--junitxml``) will truncate
    in place when it is a hard link of a file in the evidence (``ln run.json out.xml``: the
    XML replaced run.json). Our own outputs are renamed over the name, never written through it."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
        return
    target = (st.st_dev, st.st_ino)
    for what, where in evidence:
        seen = 0
        for root, dirs, files in os.walk(where):
            for name in files:
                try:
                    other = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                if (other.st_dev, other.st_ino) == target:
                    raise OutputRefused(
                        f"{flag} {path} is a hard link of {os.path.join(root, name)} in {what}"
                        f" {where}: writing it would overwrite that evidence; give another path"
                    )
            seen += len(files) + len(dirs)
            if seen > _WALK_LIMIT:
                break


#: Entries of an evidence dir looked through for a hard link (a run dir holds a few hundred;
#: checkpoint shards more).
_WALK_LIMIT = 50_000


def _write_replace(path: Path, raw: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        try:
            _write_all(fd, raw)
            # a filesystem may report the full disk only here (delayed allocation, NFS)
            os.fsync(fd)
        finally:
            os.close(fd)
        _refuse_target(path)  # again: it may have appeared while the temp file was written
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _refuse_target(path: Path) -> None:
    why = target_refusal(path)
    if why is not None:
        raise NotAnOutputFile(f"{path} {why}; nothing written")


def _write_all(fd: int, raw: bytes) -> None:
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view) :]


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` as an error about ``path`` (the temp file's name means nothing to the user)."""
    if exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def _real(path: Path | str) -> str:
    """Where ``path`` lands on disk. ``..`` is resolved after the links before it, as the
    kernel does (``os.path.abspath`` first would collapse ``link/..`` on the name alone: an
    output ``w/L/../RUN/x`` with ``L`` a link got past the check into RUN)."""
    return os.path.realpath(os.path.join(os.getcwd(), os.fspath(path)))


def _dir_id(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of a directory, None if it is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _ancestor_ids(real: str) -> set[tuple[int, int]]:
    """(device, inode) of every existing directory on the way to ``real`` (itself included)."""
    ids: set[tuple[int, int]] = set()
    current = Path(real)
    for folder in (current, *current.parents):
        found = _dir_id(folder)
        if found is not None:
            ids.add(found)
    return ids


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_outputs(
    outputs: Iterable[tuple[str, Path]], evidence: Iterable[tuple[str, Path]]
) -> None:
    """Refuse an output (``(how the user named it, path)``) that resolves into an evidence
    directory (``(what it is, path)``: a run dir judged, its checkpoint dir) or onto another
    output. Raises :class:`OutputRefused` with one line that names the fix."""
    evidence = list(evidence)
    # a run dir's checkpoints are evidence too, wherever a link takes them
    evidence += [
        (f"{what}'s {CHECKPOINTS_DIR}", Path(where) / CHECKPOINTS_DIR)
        for what, where in evidence
        if os.path.lexists(Path(where) / CHECKPOINTS_DIR)
    ]
    folders = [(what, Path(where), _real(where), _dir_id(where)) for what, where in evidence]
    seen: dict[str, str] = {}
    for flag, path in outputs:
        real = _real(path)
        above = _ancestor_ids(real)
        for what, where, real_dir, dir_id in folders:
            # by name, and by identity: a bind mount (or a second mount) of the run dir names
            # the same directory by another path
            if _inside(real, real_dir) or (dir_id is not None and dir_id in above):
                how = "is inside" if real == os.path.abspath(path) else "resolves into"
                raise OutputRefused(
                    f"{flag} {path} {how} {what} {where}: it would overwrite the evidence "
                    "being judged; write it outside that directory"
                )
        if real in seen:
            raise OutputRefused(
                f"{flag} {path} is the same file as {seen[real]}: one would overwrite the other; "
                "give them different paths"
            )
        seen[real] = f"{flag} {path}"
