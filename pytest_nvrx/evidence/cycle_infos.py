"""``cycle_infos/``: the launcher's record of each cycle (``--ft-cycle-info-dir``).

Files are ``cycle_info.<job_id>.<attempt>.<cycle>`` (empty job id outside Slurm:
``cycle_info..0.1``) holding NVRx's protobuf-JSON record, plus ``cycle_info.<job_id>.current``
(a symlink, or a copy holding the name it pointed to). Records carry start/end times and the
cycle's log file (an absolute path on the run host: only its name is used here). They record no
failure reason.

What NVRx always writes (``cycle_info_writer.py``: ``write_cycle_start`` creates each record with
its ``job_id``, ``cycle_start_time`` and ``cycle_log_file``; a new cycle starts only after the
previous one's end was recorded) makes a record that lacks it a contradiction
(:attr:`CycleInfos.contradictions`, fatal in criteria/consistency.py): no ``cycle_start_time``;
no ``cycle_end_time`` while a later cycle of the same attempt was recorded; a ``job_id`` other
than the name's job part; a ``cycle_log_file`` that is not a non-empty string; and a gap in the
numbering (``cycle_info..0.1`` without ``cycle_info..0.0``: each attempt numbers its cycles one
after another, the first from 0).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

from pytest_nvrx.evidence.fields import shown
from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    JsonFile,
    Problem,
    UnreadableNumber,
    display_path,
    file_refusal,
    json_key_ref,
    parse_iso_utc,
    read_int,
    read_json_file,
)

_NAME = re.compile(r"cycle_info\.(?P<job>.*)\.(?P<attempt>\d+)\.(?P<cycle>\d+)")


@dataclass(frozen=True, slots=True)
class CycleInfo:
    cycle: int
    attempt: int
    job_id: str
    start: datetime | None
    end: datetime | None  # None while the cycle runs (or if the launcher died)
    log_name: str | None  # basename of the cycle's application log
    active_ranks: str | None
    ref: EvidenceRef  # the cycle_start_time line
    end_ref: EvidenceRef | None
    # the cycle_log_file line: the launcher's own word on which file is the cycle's log
    log_ref: EvidenceRef | None = None
    # the line of a start or end time that is no time (impossible, outside refs.TIME_RANGE, not
    # a string): the run's clocks cannot be checked
    bad_time: EvidenceRef | None = None


@dataclass(frozen=True, slots=True)
class CycleInfos:
    dir: str
    exists: bool
    records: tuple[CycleInfo, ...] = ()
    problems: tuple[Problem, ...] = ()
    # records that contradict what NVRx always writes (module doc): fatal where judged
    contradictions: tuple[Problem, ...] = ()

    def by_cycle(self, cycle: int) -> CycleInfo | None:
        for record in self.records:
            if record.cycle == cycle:
                return record
        return None


_TIMES = ("cycle_start_time", "cycle_end_time")
# a time key present with a value that is no time
_NO_TIME = datetime.min.replace(tzinfo=UTC)


def _time(data: dict[str, object], key: str) -> datetime | None:
    """The record's ``key`` time; None when absent (or null); :data:`_NO_TIME` when it holds
    something no clock reads."""
    value = data.get(key)
    if value is None:
        return None
    parsed = parse_iso_utc(value)
    return _NO_TIME if parsed is None else parsed


_NUMBERS = (("cycle_number", "cycle"), ("attempt_index", "attempt"))


def _numbering_problem(file: str, doc: JsonFile, name: re.Match[str]) -> Problem | None:
    """A record whose ``cycle_number`` or ``attempt_index`` is not the one its name carries:
    NVRx names each record after the numbers it holds, so such a file cannot say which cycle
    it records (a NaN, a string, a boolean, another number)."""
    data = doc.data
    assert isinstance(data, dict)
    for key, part in _NUMBERS:
        if key not in data:
            continue  # older records held no numbers: the name says them
        value = data[key]
        named = read_int(name[part])  # read_cycle_infos read it already
        if type(value) is not int or value != named:
            ref = json_key_ref(file, doc, key)
            return Problem(
                "fatal",
                f"cycle record {file}: {key} is {shown(value)} but its name says {named}"
                f" ({ref.location}): which cycle it records is unknown",
                ref,
            )
    return None


def read_cycle_infos(directory: Path, run_dir: Path) -> CycleInfos:
    """All cycle records, ordered by (attempt, cycle).

    A record name held by a FIFO, device or directory is a fatal problem: only regular files
    are evidence (it is never opened). So is a record that is no JSON object (truncated, nested
    too deep, too large, not UTF-8): NVRx writes each one whole (to a temp name, then renamed),
    so such a file is not the launcher's record and the cycles cannot be judged without it.
    Symlinks are skipped: NVRx writes only its ``.current`` pointer as a link.
    """
    shown = display_path(directory, run_dir)
    if not os.path.isdir(directory):
        return CycleInfos(shown, exists=False)
    records: list[CycleInfo] = []
    problems: list[Problem] = []
    contradictions: list[Problem] = []
    # every record's name, read or not: (attempt, cycle) -> file
    named: dict[tuple[int, int], str] = {}
    try:
        with os.scandir(directory) as listing:
            entries = sorted((e.name, e.is_symlink()) for e in listing)
    except OSError as exc:
        why = f"cannot be read ({exc.strerror or exc})"
        problem = Problem("fatal", f"{shown}/ {why}", EvidenceRef(shown, None, f"({why})"))
        return CycleInfos(shown, exists=True, problems=(problem,))
    for name, link in entries:
        m = _NAME.fullmatch(name)
        if m is None or link:
            continue  # ".current" pointer, temp files of the atomic writer, strays
        path = directory / name
        file = display_path(path, run_dir)
        try:
            numbers = (read_int(m["attempt"]), read_int(m["cycle"]))
        except UnreadableNumber as exc:
            problems.append(
                Problem(
                    "fatal",
                    f"cycle record {file} is named with {exc}: no cycle of a run is numbered so",
                    EvidenceRef(file, None, "(a name no cycle has)"),
                )
            )
            continue
        named.setdefault(numbers, file)
        refusal = file_refusal(path, run_dir)
        if refusal is not None:
            problems.append(
                Problem(
                    "fatal",
                    f"cycle record {file} {refusal}",
                    EvidenceRef(file, None, f"({refusal})"),
                )
            )
            continue
        try:
            doc = read_json_file(path, run_dir, shown=file)
            if not isinstance(doc.data, dict):
                raise ValueError(f"a JSON {type(doc.data).__name__}, not an object")
        except (OSError, ValueError) as exc:
            problems.append(
                Problem(
                    "fatal",
                    f"cycle record {file} unreadable: {exc}",
                    EvidenceRef(file, None, str(exc)),
                )
            )
            continue
        data = doc.data
        start, end = (_time(data, key) for key in _TIMES)
        bad = next(
            (key for key, t in zip(_TIMES, (start, end), strict=True) if t is _NO_TIME), None
        )
        numbering = _numbering_problem(file, doc, m)
        if numbering is not None:
            problems.append(numbering)
            continue
        log_file = data.get("cycle_log_file")
        ranks = data.get("active_ranks")
        contradictions += _unlike_nvrx(file, doc, m)
        records.append(
            CycleInfo(
                cycle=numbers[1],
                attempt=numbers[0],
                job_id=m["job"],
                start=None if start is _NO_TIME else start,
                end=None if end is _NO_TIME else end,
                log_name=Path(log_file).name if isinstance(log_file, str) and log_file else None,
                active_ranks=str(ranks) if ranks is not None else None,
                ref=json_key_ref(file, doc, "cycle_start_time"),
                end_ref=json_key_ref(file, doc, "cycle_end_time")
                if "cycle_end_time" in data
                else None,
                log_ref=json_key_ref(file, doc, "cycle_log_file")
                if "cycle_log_file" in data
                else None,
                bad_time=json_key_ref(file, doc, bad) if bad is not None else None,
            )
        )
    records.sort(key=lambda r: (r.attempt, r.cycle))
    contradictions += _gaps(named) + _unended(records)
    return CycleInfos(
        shown,
        exists=True,
        records=tuple(records),
        problems=tuple(problems),
        contradictions=tuple(contradictions),
    )


def _unlike_nvrx(file: str, doc: JsonFile, name: re.Match[str]) -> list[Problem]:
    """A record without the start time, job id and log file NVRx writes into every record."""
    data = doc.data
    assert isinstance(data, dict)
    out: list[Problem] = []
    if data.get("cycle_start_time") is None:
        out.append(
            Problem(
                "fatal",
                f"cycle record {file} has no cycle_start_time: NVRx writes it into every record"
                " it creates, so this is not the launcher's record of the cycle",
                EvidenceRef(file, None, "(no 'cycle_start_time')"),
            )
        )
    if "job_id" in data and data["job_id"] != name["job"]:
        ref = json_key_ref(file, doc, "job_id")
        out.append(
            Problem(
                "fatal",
                f"cycle record {file}: job_id is {shown(data['job_id'])} ({ref.location}) but its"
                f" name says job {name['job']!r}: NVRx names each record after the job it records",
                ref,
            )
        )
    log_file = data.get("cycle_log_file")
    if not isinstance(log_file, str) or not log_file:
        ref = (
            json_key_ref(file, doc, "cycle_log_file")
            if "cycle_log_file" in data
            else EvidenceRef(file, None, "(no 'cycle_log_file')")
        )
        what = (
            "no cycle_log_file"
            if "cycle_log_file" not in data
            else f"cycle_log_file {shown(log_file)}"
        )
        out.append(
            Problem(
                "fatal",
                f"cycle record {file} has {what}: the launcher names every cycle's log"
                " (--ft-per-cycle-applog-prefix), so which file is the cycle's log is unknown",
                ref,
            )
        )
    return out


def _gaps(named: dict[tuple[int, int], str]) -> list[Problem]:
    """A cycle missing between recorded ones, or before the first attempt's first: NVRx numbers
    an attempt's cycles one after another, the first attempt's from 0."""
    out: list[Problem] = []
    attempts = sorted({attempt for attempt, _ in named})
    for attempt in attempts:
        cycles = sorted(c for a, c in named if a == attempt)
        start = 0 if attempt == attempts[0] else cycles[0]
        # the first number missing, found over the records (never over the numbers between
        # them: a record named for cycle 10**200 must not cost 10**200 steps)
        missing, cycle = next(
            ((start + k, c) for k, c in enumerate(cycles) if c != start + k), (None, None)
        )
        if missing is not None and cycle is not None:
            later = named[(attempt, cycle)]
            out.append(
                Problem(
                    "fatal",
                    f"{later} records cycle {cycle} of attempt {attempt}, but no record of cycle"
                    f" {missing} exists: NVRx records every cycle, so a record of this run is"
                    " missing",
                    EvidenceRef(later, None, f"(no record of cycle {missing})"),
                )
            )
    return out


def unended(record: CycleInfo) -> bool:
    """The record holds no end time at all (absent or null; not one that is no time)."""
    return record.end is None and (record.end_ref is None or record.bad_time != record.end_ref)


def _unended(records: list[CycleInfo]) -> list[Problem]:
    """A record without an end while a later cycle of its attempt was recorded: NVRx records a
    cycle's end before it starts the next."""
    out: list[Problem] = []
    for record, following in pairwise(records):
        if unended(record) and following.attempt == record.attempt:
            out.append(
                Problem(
                    "fatal",
                    f"{record.ref.file} has no cycle_end_time, but {following.ref.file} records"
                    f" the next cycle: NVRx records a cycle's end before it starts the next",
                    record.ref,
                )
            )
    return out
