"""``fault_injected.json``: the once-only injector's claim that it injected a fault.

Written exclusively (O_EXCL) by the worker that injected, just before it signals itself; a
replacement worker sees it and does not inject again. Fields (walkthrough wrapper and ours):
``fault`` (kill|hang), ``rank``, ``pid``, ``host``, ``signal``, ``tracker_iteration`` (the
completed checkpoint it waited for), ``baseline_iteration``, ``time`` (ISO-8601); ours adds
``local_rank`` and more (pytest_nvrx.injector.build_marker_record).

A marker that exists but cannot be read is evidence of a problem, reported as
:attr:`Marker.error`, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    JsonFile,
    display_path,
    json_key_ref,
    parse_iso_utc,
    read_json_file,
)


@dataclass(frozen=True, slots=True)
class Marker:
    file: str
    error: str | None = None  # why the file could not be used; the fields below are then None
    fault: str | None = None
    rank: int | None = None
    local_rank: int | None = None  # written by our injector; absent in the walkthrough's
    pid: int | None = None
    host: str | None = None
    signal: str | None = None
    tracker_iteration: int | None = None
    baseline_iteration: int | None = None
    time: datetime | None = None
    doc: JsonFile | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def ref(self, key: str | None = None) -> EvidenceRef:
        """The line of ``key`` in the marker (the whole file when no key or unreadable)."""
        if self.doc is None or key is None:
            return EvidenceRef(self.file, None, self.error or "injection marker")
        return json_key_ref(self.file, self.doc, key)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_marker(path: Path, run_dir: Path) -> Marker | None:
    """The marker, ``None`` when there is none, or a Marker whose ``error`` says what is wrong."""
    file = display_path(path, run_dir)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        doc = read_json_file(path)
    except (OSError, ValueError) as exc:
        return Marker(file, error=f"{file} is unreadable: {exc}")
    data = doc.data
    if not isinstance(data, dict):
        return Marker(file, error=f"{file} is not a JSON object", doc=doc)
    problems: list[str] = []
    fault = data.get("fault")
    if not isinstance(fault, str):
        problems.append("no 'fault'")
    time = parse_iso_utc(data.get("time"))
    if time is None:
        problems.append("no valid 'time'")
    rank = _int(data.get("rank"))
    if rank is None:
        problems.append("no integer 'rank'")
    return Marker(
        file=file,
        error=f"{file}: " + ", ".join(problems) if problems else None,
        fault=fault if isinstance(fault, str) else None,
        rank=rank,
        local_rank=_int(data.get("local_rank")),
        pid=_int(data.get("pid")),
        host=data.get("host") if isinstance(data.get("host"), str) else None,
        signal=data.get("signal") if isinstance(data.get("signal"), str) else None,
        tracker_iteration=_int(data.get("tracker_iteration")),
        baseline_iteration=_int(data.get("baseline_iteration")),
        time=time,
        doc=doc,
    )
