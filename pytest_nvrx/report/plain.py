"""Plain data: a record as JSON, and an instant as seconds from a scenario's ``t0``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from pytest_nvrx.evidence.rundir import RunEvidence


def flat_dict(record: Any) -> dict[str, Any]:
    """A flat record (a dataclass of plain values) as JSON data: its fields in order, a tuple as
    a list. The records below without an ``as_dict`` of their own are written this way."""
    return {key: list(v) if isinstance(v, tuple) else v for key, v in asdict(record).items()}


def start_time(run: RunEvidence) -> datetime | None:
    """The earliest of the launcher's first line and run.json's start."""
    candidates = [run.launcher.first.time]
    if run.manifest is not None:
        candidates += [run.manifest.result_start.time, run.manifest.start.time]
    known = [t for t in candidates if t is not None]
    return min(known) if known else None


def seconds_from(t0: datetime | None, t: datetime | None) -> float | None:
    if t0 is None or t is None:
        return None
    return round((t - t0).total_seconds(), 3)
