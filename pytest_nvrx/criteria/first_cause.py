"""The first cause: what the workers died of when they failed before any fault was injected.

A cycle that dies at setup (an assertion in Megatron's argument validation, an ImportError, a
bad flag) never reaches the fault; every criterion then fails for a derived reason ("no
injection marker: ... it never happened"). The judgement leads each failing verdict, and the
scenario's summary, with the first cause instead, so the report opens with the error that
matters.

The workers failed before the fault when:

* there is no injection marker nor injector fire line, and the launcher recorded a worker
  failure (or the run exited non-zero), or
* a usable marker exists and the launcher recorded a failure before the marker's time (outside
  the clock slack the timeline allows), or
* the marker is gone but the injector's fire line is in a cycle log (the fault did happen), and
  an earlier cycle ended before that one.

A baseline (fault=none) has no fault to precede: any recorded failure of its workers is its
first cause, worded "the workers failed". An unusable marker is a story of its own: no cause.

The cause is the first worker error in the cycle logs, searched cycle by cycle up to the fault
(in the faulted cycle only above the injector's fire line): a Python traceback with its
exception line (the one whose head came first), else the first error line the workload's
adapter names; else the launcher's first failure record. It quotes the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pytest_nvrx.criteria.expected import ExpectedFault
from pytest_nvrx.criteria.verdict import Verdict, failing
from pytest_nvrx.criteria.workload_errors import describe, same_error_in
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import FAILURE_KINDS, LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import CLOCK_SLACK, Timeline
from pytest_nvrx.evidence.workload import WorkloadError

BEFORE_FAULT = "the workers failed before the fault"
# a baseline has no fault to fail before
WITHOUT_FAULT = "the workers failed"

# the launcher's words that the run as a whole failed
_RUN_FAILED = (
    LauncherEventKind.RUN_FAILED,
    LauncherEventKind.NO_RESTART,
    LauncherEventKind.EARLY_TERMINATION,
)


@dataclass(frozen=True, slots=True)
class FirstCause:
    """The error the workers died of before the fault, and the lines that prove it."""

    # what failed where: "AssertionError: ... at megatron/training/arguments.py:1437"
    what: str
    # the line that says it (a traceback's exception line, an error line, a launcher record)
    ref: EvidenceRef
    # the proof, that line first: the raising frame and its source, the launcher's record
    evidence: tuple[EvidenceRef, ...]
    # the cycle whose log holds the error (None: the cause is the launcher's record)
    cycle: int | None = None
    # later cycles that died of the same error at the same place
    again: tuple[int, ...] = ()
    # False for a baseline: there was no fault to fail before
    before_fault: bool = True

    @property
    def text(self) -> str:
        """``the workers failed before the fault: X at f.py:12 [logs/train_cycle0.log:37]
        (the same in cycles 1, 2)``: what a failing reason and the summary start with."""
        lead = BEFORE_FAULT if self.before_fault else WITHOUT_FAULT
        repeated = ""
        if self.again:
            cycles = ", ".join(map(str, self.again))
            repeated = f" (the same in cycle{'s' if len(self.again) > 1 else ''} {cycles})"
        return f"{lead}: {self.what} [{self.ref.location}]{repeated}"

    def lead(self, verdict: Verdict) -> Verdict:
        """``verdict`` with its failing reason led by this cause (a passing or N/A one as is).

        The verdict's own lines stay first (its headline's location is its own reason's); the
        cause's lines follow, and the reason quotes the cause's location itself."""
        if verdict.passed:
            return verdict
        return failing(
            verdict.id, f"{self.text}; {verdict.reason}", verdict.evidence, self.evidence
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "text": self.text,
            "what": self.what,
            "location": self.ref.location,
            "cycle": self.cycle,
            "same_in_cycles": list(self.again),
            "before_fault": self.before_fault,
            "evidence": [ref.render() for ref in self.evidence],
        }


def _is_failure(event: LauncherEvent) -> bool:
    return event.kind in FAILURE_KINDS or event.is_failure_detected


def _before(event: LauncherEvent, fault_time: datetime) -> bool:
    return event.time is not None and event.time < fault_time - CLOCK_SLACK


def first_cause(run: RunEvidence, timeline: Timeline, expected: ExpectedFault) -> FirstCause | None:
    """The first cause when the workers failed before any fault was injected, else None."""
    marker = run.marker
    if marker is not None and (expected.baseline or not marker.ok or marker.time is None):
        return None
    failures = [e for e in run.launcher.events if _is_failure(e)]
    faulted, fire_line = _fire(run, timeline)
    if marker is not None and marker.time is not None:
        early = [e for e in failures if _before(e, marker.time)]
        if not early:
            return None  # the first failure is the fault's (or after it)
    elif fire_line is not None and faulted is not None:
        # the injector fired but its marker is gone: the fault came at the fire line, and the
        # workers failed before it only if an earlier cycle ended (a new cycle follows a failure)
        cycles = {r.cycle for r in run.cycles} | {log.cycle for log in run.cycle_logs}
        if not any(cycle < faulted for cycle in cycles):
            return None
        record = run.cycle_infos.by_cycle(faulted)
        start = record.start if record is not None else None
        early = [e for e in failures if start is not None and _before(e, start)]
    else:
        exit_code = run.manifest.exit_code if run.manifest is not None else None
        run_failed = bool(run.launcher.of_kind(*_RUN_FAILED)) or (
            exit_code is not None and exit_code.value != 0
        )
        if not failures and not run_failed:
            return None  # the run ended well without a fault: "it never happened" is the story
        early = failures
        faulted, fire_line = None, None  # no fault at all: every cycle is before it
    # errors count in the cycles before the fault and, in the faulted cycle, above its fire line
    logs = [
        log
        for log in run.cycle_logs
        if faulted is None
        or log.cycle < faulted
        or (log.cycle == faulted and fire_line is not None)
    ]
    before_fault = not expected.baseline
    launcher_first = early[0].ref if early else None
    for log in logs:
        error = _first_error(log, fire_line if log.cycle == faulted else None)
        if error is None:
            continue
        frame = error.innermost
        proof = [
            ref
            for ref in (
                error.ref,
                frame.ref if frame is not None else error.traceback,
                frame.source if frame is not None else None,
                launcher_first,
            )
            if ref is not None
        ]
        return FirstCause(
            what=describe(error, code=False),
            ref=error.ref,
            evidence=tuple(dict.fromkeys(proof)),
            cycle=log.cycle,
            again=tuple(same_error_in(run, error, log.cycle)),
            before_fault=before_fault,
        )
    if early:
        record_ref = early[0].ref
        said = record_ref.text.split("] ")[-1].strip()
        return FirstCause(
            what=f"the launcher recorded {said}",
            ref=record_ref,
            evidence=tuple(e.ref for e in early[:2]),
            before_fault=before_fault,
        )
    return None


def _fire(run: RunEvidence, timeline: Timeline) -> tuple[int | None, int | None]:
    """The faulted cycle and its injector fire line (None when no fire line was logged)."""
    for log in run.cycle_logs:
        for line in log.injector:
            if line.kind == "fired":
                return log.cycle, line.ref.line
    return timeline.failed_cycle, None


def _first_error(log: CycleLog, limit: int | None) -> WorkloadError | None:
    """The cycle's first error above line ``limit``: the traceback that began first and has its
    exception line, else the first error of any kind (an error line, a cut traceback)."""
    errors = [
        e
        for e in log.of_type(WorkloadError)
        if limit is None or ((e.traceback or e.ref).line or 0) < limit
    ]
    complete = [e for e in errors if e.traceback is not None and e.exception is not None]
    if complete:
        return min(complete, key=lambda e: (e.traceback or e.ref).line or 0)
    return errors[0] if errors else None
