"""What a live run shows of itself: its newest cycle, iteration, checkpoint load and fault.

A launch reads it every poll (:class:`ProgressReader`) from the run directory as it grows: the
newest cycle log, only what was added to it, and the fault markers. Its lines are read in the
formats of the run's workload adapter (:mod:`pytest_nvrx.evidence.workload`), the ones the
cycle-log parser reads them in: an iteration by the adapter's ``iteration_line`` (the pattern
its parser reads an iteration from, compiled for bytes), a checkpoint load by its
``parse_line``. NVRx's rank prefix is removed first, by the cycle-log parser's rule. A run of
a workload without an adapter shows its cycles and its fault, never an iteration or a load.

The fault is told from its marker, the evidence the verdict reads: its window, the save in
flight and the tracker it recorded (a Megatron log prints an iteration only every few steps, so
the log's newest iteration can lag the marker's in-flight save). A launch that saw nothing new
for :data:`WAIT_LINE_S` says what it waits for and how long is left (:func:`waiting_for`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pytest_nvrx.evidence.marker import Marker, read_marker
from pytest_nvrx.evidence.refs import LineCursor, UnreadableNumber, read_int
from pytest_nvrx.evidence.workload import (
    LoadCompleted,
    LoadStarted,
    WorkloadLogAdapter,
    get_adapter,
    iteration_line,
)
from pytest_nvrx.layout import RunLayout, cycle_log_name
from pytest_nvrx.settings.record import SECTION_NAMES, SectionTimeouts

#: A wait with no new progress line gets a line at least this often (seconds).
WAIT_LINE_S = 10.0


@dataclass(frozen=True)
class InjectedFault:
    """The fault as the progress lines tell it: its marker (who, what and when; for a fault
    schedule's, its position and the checkpoint a restore fault struck the load of; the window,
    the save in flight, the tracker's iteration and the NVRx section open, as the verdict reads
    them), the cycle it hit and the last iteration that cycle had committed when the marker
    appeared."""

    marker: Marker
    cycle: int
    iteration: int | None

    def describe(self) -> str:
        marker = self.marker
        kind = f" ({marker.fault})" if marker.fault else ""
        rank = f" into rank {marker.rank}" if marker.rank is not None else ""
        position = marker.schedule_position
        which = f"fault {position}" if position is not None else "fault"
        return f"{which} injected{rank}{kind}{self.where()}"

    def where(self) -> str:
        """Where it hit, from the marker first: the save in flight says which step the rank had
        done (the log's newest iteration may lag it); the log's iteration otherwise. Nothing is
        said that no evidence shows (no "before the first iteration" for want of a log line)."""
        marker = self.marker
        if marker.load_iteration is not None:
            return f" while it loaded checkpoint {marker.load_iteration}"
        window = f" in the {marker.window} window" if marker.window is not None else ""
        tracker = marker.tracker_iteration
        said = f"tracker at {tracker}" if tracker is not None else None
        if marker.in_flight_iteration is not None:
            facts = [f"save of {marker.in_flight_iteration} in flight", *([said] if said else [])]
            return f"{window}: {', '.join(facts)}"
        at = f" at iteration {self.iteration}" if self.iteration is not None else ""
        return f"{window}{at}{f', {said}' if said else ''}"


@dataclass(frozen=True)
class Progress:
    """What can be seen of a live run from its run directory.

    Every field describes the newest cycle only (a new cycle never shows its predecessor's
    iteration); ``fault`` is the injection, once its marker was read. ``news`` says what this
    reading saw for the first time, so that a line announces the fault and a restore once.
    """

    elapsed_s: float
    #: the newest cycle with a log (``train_cycle<N>.log``); None before the first one
    cycle: int | None
    iteration: int | None
    total: int | None
    #: the checkpoint iteration the newest cycle began loading (a workload that says so)
    restoring: int | None = None
    #: the checkpoint iteration the newest cycle reports loaded
    restored: int | None = None
    fault: InjectedFault | None = None
    news: frozenset[str] = frozenset()
    #: what a launch that saw nothing new for a while waits for (:func:`waiting_for`)
    waiting: str | None = None

    @property
    def state(self) -> tuple[object, ...]:
        """What a new progress line is printed for (elapsed time aside)."""
        return (self.cycle, self.iteration, self.restoring, self.restored, self.fault)

    def describe(self) -> str:
        if self.cycle is None:
            # no worker has written a line yet: rendezvous, or the launcher still importing
            return self._line("launcher starting")
        cycle = f"cycle {self.cycle}"
        if self.iteration is not None:
            now = f"{cycle}, iteration {self.iteration}/{self.total}"
            if "restored" in self.news:
                now = f"{cycle} restored checkpoint {self.restored}, iteration "
                now += f"{self.iteration}/{self.total}"
        elif self.restored is not None:
            now = f"{cycle} restored checkpoint {self.restored}"
        elif self.restoring is not None:
            now = f"{cycle} restoring checkpoint {self.restoring}"
        else:
            now = f"{cycle} starting"
        if self.fault is not None and "fault" in self.news:
            if self.fault.cycle == self.cycle and self.iteration == self.fault.iteration:
                # the cycle that was hit, not past the fault: the fault is all there is to say
                now = f"{cycle}: {self.fault.describe()}"
            else:
                now = f"cycle {self.fault.cycle}: {self.fault.describe()}; {now}"
        return self._line(now)

    def _line(self, now: str) -> str:
        waiting = f"; {self.waiting}" if self.waiting is not None else ""
        return f"[{self.elapsed_s:6.1f}s] {now}{waiting}"


def waiting_for(
    progress: Progress,
    *,
    quiet_s: float,
    run_left_s: float,
    sections: SectionTimeouts | None = None,
    out_of_section_s: float | None = None,
    now: datetime | None = None,
) -> str:
    """What a run that showed nothing new for ``quiet_s`` waits for, and how long is left: a
    hung rank's detection by the deadline of the section its marker recorded open (the
    out-of-section deadline where none was), else the next thing its log will show; always the
    run's own time limit (``run_left_s``)."""
    fault = progress.fault
    if progress.cycle is None:
        what = "for the first cycle's log (rendezvous, workers starting)"
    elif fault is not None and fault.cycle == progress.cycle:
        what = _detection(fault, sections, out_of_section_s, now or datetime.now(UTC))
    elif progress.iteration is not None:
        what = f"for the iteration after {progress.iteration}"
    elif progress.restoring is not None and progress.restored is None:
        what = f"for cycle {progress.cycle} to load checkpoint {progress.restoring}"
    else:
        what = f"for cycle {progress.cycle}'s first iteration"
    return (
        f"nothing new for {quiet_s:.0f} s, waiting {what}; "
        f"the run's time limit in {max(run_left_s, 0.0):.0f} s"
    )


def _detection(
    fault: InjectedFault,
    sections: SectionTimeouts | None,
    out_of_section_s: float | None,
    now: datetime,
) -> str:
    """The faulted cycle still the newest: NVRx has yet to see the fault and restart."""
    marker = fault.marker
    if marker.fault != "hang":
        # the rank died (or raised): the launcher sees its exit, then restarts the workers
        return f"for NVRx to restart the workers after the {marker.fault or 'fault'}"
    if marker.section in SECTION_NAMES and sections is not None:
        deadline = getattr(sections, marker.section)
        which = f"the {marker.section} section's {deadline:g} s deadline"
    elif marker.section is None and out_of_section_s is not None:
        deadline, which = out_of_section_s, f"the out-of-section {out_of_section_s:g} s deadline"
    else:
        return "for NVRx to detect the hung rank"
    if marker.time is None:
        return f"for NVRx to detect the hung rank by {which}"
    fired = marker.time if marker.time.tzinfo is not None else marker.time.replace(tzinfo=UTC)
    left = deadline - (now - fired).total_seconds()
    when = f"~{left:.0f} s left" if left >= 0 else f"passed {-left:.0f} s ago"
    return f"for NVRx to detect the hung rank by {which} ({when})"


#: at most this much of a cycle log is read per poll; a log that grew more is read from its tail
_READ_LIMIT = 8 * 1024 * 1024
_TAIL_SIZE = 65536


class ProgressReader:
    """Follows a live run's newest cycle log and its marker, reading only what was added.

    Cheap on purpose (it runs every poll of a launch): each byte of the newest cycle log is read
    once (a burst above ``_READ_LIMIT`` is skipped to its tail), the marker once it is complete.
    The workload's adapter is the one its run is launched with, else the one run.json names.
    """

    def __init__(self, layout: RunLayout, workload: str | None = None) -> None:
        self.layout = layout
        self._workload = workload
        self._adapter: WorkloadLogAdapter | None = None
        self._adapter_loaded = False
        self._cycle: int | None = None
        self._offset = 0
        self._partial = b""
        self._iteration: int | None = None
        self._total: int | None = None
        self._restoring: int | None = None
        self._restored: int | None = None
        self._fault: InjectedFault | None = None
        self._faults_read = 0

    def read(self, elapsed_s: float) -> Progress:
        news: set[str] = set()
        logs = self.layout.cycle_log_paths()
        if logs:
            newest = max(logs)
            if newest != self._cycle:
                self._start_cycle(newest)
            restored_before = self._restored
            self._follow(logs[newest])
            if self._restored is not None and restored_before is None:
                news.add("restored")
        # a schedule's faults come one per cycle: the next marker, once the last was read
        fault = self._read_fault(logs, self._faults_read + 1)
        if fault is not None:
            self._fault = fault
            self._faults_read += 1
            news.add("fault")
        return Progress(
            elapsed_s=elapsed_s,
            cycle=self._cycle,
            iteration=self._iteration,
            total=self._total,
            restoring=self._restoring,
            restored=self._restored,
            fault=self._fault,
            news=frozenset(news),
        )

    def _start_cycle(self, cycle: int) -> None:
        self._cycle = cycle
        self._offset = 0
        self._partial = b""
        self._iteration = self._total = self._restoring = self._restored = None

    def _follow(self, log: Path) -> None:
        try:
            with log.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self._offset:  # replaced or truncated: start over
                    self._offset, self._partial = 0, b""
                if size - self._offset > _READ_LIMIT:
                    # a burst: its tail, from a line start
                    self._offset, self._partial = size - _TAIL_SIZE, b""
                    fh.seek(self._offset)
                    fh.readline()
                else:
                    fh.seek(self._offset)
                data = fh.read(_READ_LIMIT)
                self._offset = fh.tell()
        except OSError:
            return
        data = self._partial + data
        complete = data.rfind(b"\n") + 1
        self._partial = data[complete:]
        self._scan(data[:complete])

    def _scan(self, data: bytes) -> None:
        """The iterations and checkpoint loads of whole lines of the newest cycle log."""
        adapter = self._load_adapter()
        if adapter is None:
            return
        pattern = iteration_line(adapter)
        if pattern is not None:
            for iteration, total in _iterations(pattern, data):
                if self._iteration is None or iteration >= self._iteration:
                    self._iteration, self._total = iteration, total
        if b"load" not in data:
            return
        cursor = LineCursor(cycle_log_name(self._cycle or 0))
        for line in data.split(b"\n"):
            if b"load" not in line:
                continue
            end = len(line) - 1 if line.endswith(b"\r") else len(line)
            text = line[_body_start(line) : end].decode("utf-8", "replace")
            cursor.raw = text
            try:
                event = adapter.parse_line(text, cursor)
            except UnreadableNumber:  # no load of a run: the judgement says so, not the progress
                continue
            if isinstance(event, LoadCompleted):
                self._restored = event.iteration
            elif isinstance(event, LoadStarted):
                self._restoring = event.iteration

    def _load_adapter(self) -> WorkloadLogAdapter | None:
        if self._adapter_loaded:
            return self._adapter
        workload = self._workload or _manifest_workload(self.layout)
        if workload is None and not self.layout.manifest.is_file():
            # no run.json yet: Megatron's lines for now, the workload decided once it is written
            with contextlib.suppress(KeyError, ImportError):
                return get_adapter("megatron")
            return None
        self._adapter_loaded = True
        # a run.json that names no workload is Megatron's, as the run-dir parser reads it
        with contextlib.suppress(KeyError, ImportError):
            self._adapter = get_adapter(workload or "megatron")
        return self._adapter

    def _last_iteration(self, log: Path) -> int | None:
        """The highest iteration in the tail of a cycle log that is no longer followed."""
        adapter = self._load_adapter()
        pattern = iteration_line(adapter) if adapter is not None else None
        if pattern is None:
            return None
        found = [it for it, _ in _iterations(pattern, read_tail(log))]
        return max(found) if found else None

    def _read_fault(self, logs: Mapping[int, Path], position: int) -> InjectedFault | None:
        """The injection of the marker at ``position`` (1: the run's one fault, or a schedule's
        first), once it is complete (it is written after its claim: an unreadable one is read
        again at the next poll)."""
        marker_path = self.layout.marker_at(position)
        if not marker_path.exists():
            return None
        marker = read_marker(marker_path, self.layout.run_dir)
        if marker is None or not marker.ok:
            return None
        # the cycle hit: the injecting worker's restart count names it where that cycle's log
        # exists (our injector records it), else the newest cycle
        data = marker.doc.data if marker.doc is not None else None
        restarts = data.get("restart_count") if isinstance(data, dict) else None
        cycle = self._cycle if self._cycle is not None else 0
        if isinstance(restarts, int) and restarts in logs and restarts <= cycle:
            cycle = restarts
        iteration = self._iteration if cycle == self._cycle else self._last_iteration(logs[cycle])
        return InjectedFault(marker, cycle, iteration)


def read_progress(layout: RunLayout, elapsed_s: float, workload: str | None = None) -> Progress:
    """One look at a run (a :class:`ProgressReader` read once)."""
    return ProgressReader(layout, workload).read(elapsed_s)


def _iterations(pattern: re.Pattern[bytes], data: bytes) -> Iterator[tuple[int, int]]:
    """(iteration, total) of each line of ``data`` that ``pattern`` (an adapter's
    ``iteration_line``) matches from where its rank prefix ends."""
    for line in data.split(b"\n"):
        found = pattern.match(line, _body_start(line))
        if found is not None:
            try:
                yield read_int(found["it"].decode()), read_int(found["total"].decode())
            except UnreadableNumber:  # no iteration of a run: left to the judgement
                continue


def _body_start(line: bytes) -> int:
    """Where a line's text starts after NVRx's rank prefix (``0: ``, ``12: ``; 0: none), by the
    cycle-log parser's rule (:func:`pytest_nvrx.evidence.refs.split_rank_prefix`) on bytes."""
    colon = line.find(b": ", 0, 8)
    return colon + 2 if colon > 0 and line[:colon].strip().isdigit() else 0


def _manifest_workload(layout: RunLayout) -> str | None:
    try:
        data = json.loads(layout.manifest.read_text())
    except (OSError, ValueError):
        return None
    config = data.get("config") if isinstance(data, dict) else None
    workload = config.get("workload") if isinstance(config, dict) else None
    return workload if isinstance(workload, str) else None


def read_tail(path: Path, size: int = _TAIL_SIZE) -> bytes:
    """The last ``size`` bytes of a file (b"": unreadable), cut wherever that falls."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            fh.seek(max(0, end - size))
            return fh.read()
    except OSError:
        return b""
