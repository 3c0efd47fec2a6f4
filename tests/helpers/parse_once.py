"""Parse each distinct evidence file once per test process: the doctored-copy sweeps judge
hundreds of copies of the same committed runs, each copy with one file edited.

Only the product's pure parsers of one file are memoized, keyed by the file's whole content
(SHA-256) and by every other argument they take: :func:`~pytest_nvrx.evidence.cycle_log.
parse_cycle_log` (a cycle log), :func:`~pytest_nvrx.evidence.launcher_log.parse_launcher_log`
(the launcher log) and :func:`~pytest_nvrx.evidence.checkpoint.read_dcp_metadata` (a
checkpoint's ``.metadata`` bytes). An edited file has other bytes, so it is parsed by the real
parser; an unchanged one gives what the real parser gave for the same bytes (the results are
frozen dataclasses and tuples, never mutated). Everything else of a judgement runs as it would:
``load_run``'s refusals of links, FIFOs and unreadable directories, the manifest, the marker,
the cross-checks, every criterion and verify's output. A file that is not a regular file (a
symlink, a FIFO, a directory) or cannot be read is handed to the real parser untouched, as is a
cycle log the product would parse in byte ranges (``workers``). tests/evidence/test_parse_once.py
holds the memoized results equal to fresh ones on every committed run, unchanged and doctored.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import tzinfo
from pathlib import Path
from typing import Any

import pytest

import pytest_nvrx.evidence.checkpoint as checkpoint
import pytest_nvrx.evidence.rundir as rundir
from pytest_nvrx.evidence.cycle_log import PARALLEL_MIN_BYTES, CycleLog, parse_cycle_log
from pytest_nvrx.evidence.launcher_log import LauncherLog, parse_launcher_log
from pytest_nvrx.evidence.workload import WorkloadLogAdapter

#: the real parsers, whatever is installed in their place
REAL_CYCLE_LOG = parse_cycle_log
REAL_LAUNCHER_LOG = parse_launcher_log
REAL_DCP_METADATA = checkpoint.read_dcp_metadata

#: the committed runs: what every copy's unchanged files are the same bytes as
DATA = Path(__file__).parents[1] / "data"

_memo: dict[tuple[object, ...], Any] = {}
# keys parsed once and not kept: a doctored file is mostly seen once, a committed file's bytes
# in every copy; keeping a copy's result from its second sighting on bounds the memory by the
# files reused (all committed runs' evidence: ~80 MB)
_seen: set[tuple[object, ...]] = set()


def _digest(path: Path) -> bytes | None:
    """The SHA-256 of a regular file's bytes; None for anything else or what cannot be read
    (the real parser says why)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size >= PARALLEL_MIN_BYTES:
            return None
        with path.open("rb") as f:
            return hashlib.sha256(f.read()).digest()
    except OSError:
        return None


def _once[T](key: tuple[object, ...], parse: Callable[[], T], path: Path | None = None) -> T:
    if key in _memo:
        return _memo[key]  # type: ignore[no-any-return]
    parsed = parse()
    if key in _seen or (path is not None and Path(os.path.abspath(path)).is_relative_to(DATA)):
        _memo[key] = parsed
    else:
        _seen.add(key)
    return parsed


def cycle_log_once(
    path: Path,
    cycle: int,
    adapter: WorkloadLogAdapter,
    *,
    file: str | None = None,
    tz: tzinfo | None = None,
    workers: int | None = None,
) -> CycleLog:
    kwargs: dict[str, Any] = {"file": file} if tz is None else {"file": file, "tz": tz}
    digest = _digest(path) if workers is None else None
    if digest is None:
        return REAL_CYCLE_LOG(path, cycle, adapter, workers=workers, **kwargs)
    key = ("cycle", digest, path.name, cycle, type(adapter), adapter.name, file, tz)
    return _once(key, lambda: REAL_CYCLE_LOG(path, cycle, adapter, **kwargs), path)


def launcher_log_once(path: Path, *, file: str | None = None) -> LauncherLog:
    digest = _digest(path)
    if digest is None:
        return REAL_LAUNCHER_LOG(path, file=file)
    key = ("launcher", digest, path.name, file)
    return _once(key, lambda: REAL_LAUNCHER_LOG(path, file=file), path)


def dcp_metadata_once(data: bytes) -> tuple[list[str], str | None]:
    def parse() -> tuple[tuple[str, ...], str | None]:
        keys, saved_to = REAL_DCP_METADATA(data)
        return tuple(keys), saved_to

    keys, saved_to = _once(("metadata", hashlib.sha256(data).digest()), parse)
    return list(keys), saved_to  # a fresh list each call: the caller may keep or change it


@contextmanager
def parsing_once() -> Iterator[None]:
    """Within it, ``load_run`` (and so ``judge_run_dir``, ``verify``, ``report``) parses each
    distinct cycle log, launcher log and checkpoint metadata once; the real parsers after."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rundir, "parse_cycle_log", cycle_log_once)
        mp.setattr(rundir, "parse_launcher_log", launcher_log_once)
        mp.setattr(checkpoint, "read_dcp_metadata", dcp_metadata_once)
        yield
