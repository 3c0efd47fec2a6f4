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

A fault that never landed (no marker, no fire line) is a cause of its own, worded "the requested
fault never happened": the injector's exit-3 line (``ERROR: the requested fault ... never
happened: ...``), or the launcher's record of exit code 3 (the injector's code for it), or a run
that ended without the fault. Exit code 3 is never "the workers failed". It says in which window
and what the evidence shows about why (:func:`_why_never`): the tracker already named each save
when its finalization began (it advanced at submit), no checkpoint completed, the run ended
before the window could open, nothing was left to train, the injector could not fire.

A run our run timeout ended (result.json: ``timed_out`` true) whose workers had not failed by
themselves has that for its cause (:func:`run_timeout_cause`, worded "the run timeout ended the
run"): which fault it cut short, how far that got and for how long. The launcher's records after
it was signalled (:func:`before_stop`) are that stop's: the workers it ends exit -15, which is no
worker failure here nor a detection there.

The cause is the first worker error in the cycle logs, searched cycle by cycle up to the fault
(in the faulted cycle only above the injector's fire line): a Python traceback with its
exception line (the one whose head came first), else the first error line the workload's
adapter names; else the launcher's first failure record. It quotes the file and line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pytest_nvrx.criteria.expected import ExpectedFault
from pytest_nvrx.criteria.helpers import clock, launcher_words
from pytest_nvrx.criteria.verdict import Verdict, failing
from pytest_nvrx.criteria.workload_errors import describe, same_error_in
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.injector_log import InjectorLine
from pytest_nvrx.evidence.launcher_log import FAILURE_KINDS, LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.marker import Marker
from pytest_nvrx.evidence.refs import EvidenceRef, absent, seconds_between
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.segments import FaultSegment, fault_segments
from pytest_nvrx.evidence.timeline import CLOCK_SLACK, Timeline
from pytest_nvrx.evidence.workload import (
    LoadCompleted,
    SaveCompleted,
    SaveScheduled,
    WorkloadError,
)
from pytest_nvrx.settings.schedule import NVRX_NO_PROGRESS_LIMIT, schedule_ending

BEFORE_FAULT = "the workers failed before the fault"
# result.json says our run timeout stopped the launcher: what it cut short (run_timeout_cause)
RUN_TIMEOUT = "the run timeout ended the run"
# a baseline has no fault to fail before
WITHOUT_FAULT = "the workers failed"
# no marker, no fire line: the fault was asked for and never came
NEVER_HAPPENED = "the requested fault never happened"
#: The injector's exit code when the requested fault never happened (pytest_nvrx/worker/injector.py:
#: EXIT_FAULT_NOT_INJECTED; not imported: the injector is a stdlib-only script).
INJECTOR_NOT_INJECTED = 3
_NAMED_EARLY = re.compile(
    r"the tracker already named the save in flight when its finalization began: (?P<its>[\d, ]+)"
)
_CANNOT_FIRE = ("window probe failed", "no persistent checkpoint worker", "marker", "watcher")

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
    # True: no worker failed before the fault; the fault itself never came (NEVER_HAPPENED)
    never: bool = False
    # True: our run timeout ended the run (RUN_TIMEOUT): ``what`` says what it cut short
    run_timeout: bool = False

    @property
    def text(self) -> str:
        """``the workers failed before the fault: X at f.py:12 [logs/train_cycle0.log:37]
        (the same in cycles 1, 2)``: what a failing reason and the summary start with."""
        lead = (
            RUN_TIMEOUT
            if self.run_timeout
            else NEVER_HAPPENED
            if self.never
            else BEFORE_FAULT
            if self.before_fault
            else WITHOUT_FAULT
        )
        repeated = ""
        if self.again:
            cycles = ", ".join(map(str, self.again))
            same = "again" if self.never else "the same"
            repeated = f" ({same} in cycle{'s' if len(self.again) > 1 else ''} {cycles})"
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
            "never_happened": self.never,
            "run_timeout": self.run_timeout,
            "evidence": [ref.render() for ref in self.evidence],
        }


def _is_failure(event: LauncherEvent) -> bool:
    return event.kind in FAILURE_KINDS or event.is_failure_detected


def before_stop(run: RunEvidence) -> tuple[LauncherEvent, ...]:
    """The launcher's events before it was signalled (our run timeout, a stop signal): the
    workers it stops then exit -15, which is neither a worker failing by itself nor a fault's
    detection. All of them where nothing signalled it."""
    events = run.launcher.events
    stop = run.launcher.signalled()
    return events if stop is None else events[: events.index(stop)]


def _before(event: LauncherEvent, fault_time: datetime) -> bool:
    return event.time is not None and event.time < fault_time - CLOCK_SLACK


def first_cause(
    run: RunEvidence, timeline: Timeline, expected: ExpectedFault, *, window: str | None = None
) -> FirstCause | None:
    """The first cause when the workers failed before any fault was injected or the requested
    fault never happened, else None. ``window``: the requested fault window, if known."""
    marker = run.marker
    if marker is not None and (expected.baseline or not marker.ok or marker.time is None):
        return None
    failures = [e for e in before_stop(run) if _is_failure(e)]
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
            # the run ended well without the fault: why it never happened
            if expected.baseline:
                return None
            for log in run.cycle_logs:
                line = next((i for i in log.injector if i.kind == "never"), None)
                if line is not None:
                    return _never(run, expected, window, log, line)
            return _never(run, expected, window, None, None)
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
        never = (
            None
            if expected.baseline or fire_line is not None or marker is not None
            else next((line for line in log.injector if line.kind == "never"), None)
        )
        limit = fire_line if log.cycle == faulted else None
        if never is not None:
            limit = never.ref.line
        error = _first_error(log, limit)
        if error is None:
            if never is not None:
                return _never(run, expected, window, log, never, early[0] if early else None)
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
    never_fired = not expected.baseline and marker is None and fire_line is None
    if never_fired and early and early[0].exit_code == INJECTOR_NOT_INJECTED:
        return _never(run, expected, window, None, None, early[0])
    if early:
        record_ref = early[0].ref
        said = launcher_words(record_ref)
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


def _never(
    run: RunEvidence,
    expected: ExpectedFault,
    window: str | None,
    log: CycleLog | None,
    line: InjectorLine | None,
    record: LauncherEvent | None = None,
) -> FirstCause:
    """The requested fault never happened: where it says so (the injector's exit-3 line, else
    the launcher's exit-3 record, else the run's own end), in which window, and why."""
    watching = next(
        (i for cycle_log in run.cycle_logs for i in cycle_log.injector if i.kind == "watching"),
        None,
    )
    fault = (line.fault if line is not None else None) or (
        expected.kind if expected.kind != "any" else "a fault"
    )
    win = window or (line.window if line is not None else None)
    win = win or (watching.window if watching is not None else None)
    rank = line.rank if line is not None else watching.rank if watching is not None else None
    who = f" on rank {rank}" if rank is not None else ""
    where = f" in window {win}" if win is not None else ""
    cycle = log.cycle if log is not None else None
    why, proof = _why_never(run, line, cycle, win, watching)
    if line is not None:
        ref = line.ref
        said = f"never fired in cycle {cycle} (the injector exited {INJECTOR_NOT_INJECTED})"
        again = tuple(
            other.cycle
            for other in run.cycle_logs
            if other.cycle > (cycle or 0) and any(i.kind == "never" for i in other.injector)
        )
        what = f"{fault}{who}{where} {said}: {why}"
    elif record is not None:
        ref = record.ref
        local = f" of local rank {record.rank}" if record.rank is not None else ""
        what = (
            f"{fault}{who}{where} never fired: the launcher recorded exit code"
            f" {INJECTOR_NOT_INJECTED}{local}, the injector's exit when it never happened: {why}"
        )
        again = ()
    else:
        ref = expected.ref
        last = _last_outcome(run)
        article = "a fault" if fault == "a fault" else f"the {fault}"
        what = f"the run ended without {article}{who}{where}: {why}"
        if last is not None:
            proof.append(last)
        again = ()
    evidence = [ref, *proof]
    if record is not None:
        evidence.append(record.ref)
    return FirstCause(
        what=what,
        ref=ref,
        evidence=tuple(dict.fromkeys(evidence)),
        cycle=cycle,
        again=again,
        before_fault=True,
        never=True,
    )


def _last_outcome(run: RunEvidence) -> EvidenceRef | None:
    """Where the run is seen to end: its last iteration line."""
    last = [log.iterations[-1] for log in run.cycle_logs if log.iterations]
    return last[-1].ref if last else None


def _why_never(
    run: RunEvidence,
    line: InjectorLine | None,
    cycle: int | None,
    window: str | None,
    watching: InjectorLine | None,
) -> tuple[str, list[EvidenceRef]]:
    """What the evidence shows about why the window never opened, and the lines that show it.

    In order: the injector could not fire (its own error); the tracker already named each save
    when its finalization began (it advanced at submit: a finalize window cannot open); the
    cycle resumed the last iteration (nothing left to train); no checkpoint completed above
    the baseline; one completed but the run ended before the window could follow it; else the
    injector's own words."""
    reason = line.reason if line is not None else None
    logs = [log for log in run.cycle_logs if cycle is None or log.cycle <= cycle]
    this = [log for log in logs if cycle is None or log.cycle == cycle]
    scheduled = [e for log in this for e in log.of_type(SaveScheduled)]
    completed = [e for log in this for e in log.of_type(SaveCompleted)]
    # (a log keeps its iteration lines apart from its events)
    iterations = [e for log in this for e in log.iterations]
    line_refs = [line.ref] if line is not None else []
    if line is None and watching is None and not any(log.injector for log in run.cycle_logs):
        files = [log.file for log in run.cycle_logs][:1]
        return (
            "no injector line in any cycle log: nothing watched for the window (the workers were"
            " not started through pytest_nvrx/worker/injector.py)",
            [absent(f, "no [pytest-nvrx injector] line") for f in files],
        )
    if reason is not None and reason.startswith(_CANNOT_FIRE):
        return f"the injector could not fire: {reason}", line_refs
    named = _NAMED_EARLY.search(reason or "")
    if named is not None:
        its = [int(n) for n in re.findall(r"\d+", named["its"], re.ASCII)]
        first_it = its[0]
        sched = next((e for e in scheduled if e.iteration == first_it), None)
        done = next((e for e in completed if e.iteration == first_it), None)
        text = (
            "the window never opened because the tracker advanced at submit: it already named"
            f" each save in flight when its finalization began ({', '.join(map(str, its))})"
        )
        if sched is not None and done is not None:
            text += (
                f"; the save of {first_it} was scheduled at {clock(sched.time)} and finalized"
                f" only at {clock(done.time)}"
            )
        return text, [e.ref for e in (sched, done) if e is not None]
    baseline = line.baseline_iteration if line is not None else None
    if baseline is None and watching is not None:
        baseline = watching.baseline_iteration
    base = baseline or 0
    if baseline and not iterations:
        loads = [e.ref for log in this for e in log.of_type(LoadCompleted)]
        return (
            f"the cycle resumed checkpoint {baseline} and trained no iteration: nothing was left"
            " to train",
            loads[:1],
        )
    newer = [e for e in completed if e.iteration > base]
    if not newer:
        if scheduled:
            listed = ", ".join(str(e.iteration) for e in scheduled[:8])
            return (
                f"no checkpoint completed above the baseline {base}: the saves of {listed} were"
                " scheduled and never finalized",
                [scheduled[0].ref],
            )
        last = iterations[-1].ref if iterations else None
        return (
            f"no checkpoint completed above the baseline {base}: no save was scheduled",
            [last] if last is not None else [],
        )
    first_done = newer[0]
    line_no = first_done.ref.line or 0
    if window in (None, "step"):
        followed = any((e.ref.line or 0) > line_no for e in iterations)
    else:
        followed = any(e.iteration > first_done.iteration for e in scheduled)
    if not followed:
        last = iterations[-1].ref if iterations else None
        follow = "iteration" if window in (None, "step") else "save submitted"
        return (
            f"the run ended first: checkpoint {first_done.iteration}, the first completed above"
            f" the baseline {base}, was finalized at {clock(first_done.time)} and no {follow}"
            " followed it",
            [r for r in (first_done.ref, last) if r is not None],
        )
    if reason is not None:
        return f"the injector says: {reason}", line_refs
    return "the evidence shows no reason", []


def run_timeout_cause(
    run: RunEvidence,
    timeline: Timeline,
    expected: ExpectedFault,
    segments: Sequence[FaultSegment] | None = None,
    ending: tuple[int, str | None] | None = None,
) -> FirstCause | None:
    """What our run timeout cut short, when result.json says it stopped the launcher
    (``timed_out`` true); None otherwise.

    The fault that matters is the last that happened (a schedule's, by its segments): struck
    and still undetected when the launcher was signalled, or detected and not recovered (no step
    committed after its restore), or recovered with a fault still due and not injected, or
    every fault recovered and training unfinished; on a run where no fault happened, the fault
    still to come. The launcher's records after it was signalled (:func:`before_stop`) are the
    stop's and detect nothing. ``segments``: the schedule's, where the caller has them;
    ``ending``: after how many faults the schedule's run must end and, where the launcher had to
    stop the job then, why (criteria/schedule_recoveries.py run_ending), computed with NVRx's
    default no-progress limit if None. After the fault at which the job had to stop no recovery was
    due: that fault is not "detected but not recovered"."""
    manifest = run.manifest
    flag = manifest.timed_out if manifest is not None else None
    if manifest is None or flag is None or flag.value is not True:
        return None
    stop = run.launcher.signalled()
    stop_time = stop.time if stop is not None and stop.time is not None else manifest.end.time
    wall = manifest.wall_s
    proof = [flag.ref, *(r.ref for r in (wall, stop) if r is not None)]
    scheduled = manifest.scheduled_faults
    happened: list[tuple[str, Marker, Timeline, RunEvidence]] = []
    pending: list[str] = []
    stop_due: str | None = None
    if scheduled:
        cut = list(segments) if segments is not None else fault_segments(run, scheduled)
        happened = [(_segment_label(s), s.marker, s.timeline, s.view) for s in cut]
        if ending is None:
            budget = manifest.max_restarts.value if manifest.max_restarts is not None else None
            due, how = schedule_ending(scheduled, budget, NVRX_NO_PROGRESS_LIMIT)
            ending = (due, None if how == "finished" else f"its {how} limit")
        due, stopping = ending
        if stopping is not None and len(happened) == due:
            stop_due = stopping
        pending = [
            f"fault {k} of {len(scheduled)}, {scheduled[k - 1]}"
            for k in range(len(happened) + 1, due + 1)
        ]
    elif not expected.baseline:
        label = f"the {_asked(run, expected)}"
        marker = run.marker
        if marker is not None and marker.ok and marker.time is not None:
            happened = [(label, marker, timeline, run)]
        else:
            pending = [label]
    cycle = None
    if happened:
        what, more = _cut_short(run, *happened[-1], stop_time, pending, stop_due)
        cycle = happened[-1][2].failed_cycle
    else:
        what = f"before {pending[0]} was injected" if pending else "before training finished"
        last = _last_outcome(run)
        logged = f"last iteration logged: {last.location}" if last else "no iteration was logged"
        what += f" ({logged})"
        more = [last] if last is not None else []
    if wall is not None:
        what += f"; the launch lasted {wall.value:.1f} s"
    return FirstCause(
        what=what,
        ref=flag.ref,
        evidence=tuple(dict.fromkeys([*proof[:1], *more, *proof[1:]])),
        cycle=cycle,
        before_fault=not happened and not expected.baseline,
        run_timeout=True,
    )


def _segment_label(segment: FaultSegment) -> str:
    """``fault 2 of 2 (hang@restore in cycle 1)``."""
    cycle = segment.timeline.failed_cycle
    where = f" in cycle {cycle}" if cycle is not None else ""
    return f"fault {segment.position} of {len(segment.schedule)} ({segment.scheduled}{where})"


def _asked(run: RunEvidence, expected: ExpectedFault) -> str:
    """``hang@step``: the one fault run.json asks for (its kind alone where no window)."""
    manifest = run.manifest
    window = manifest.window.value if manifest is not None and manifest.window else None
    return f"{expected.kind}@{window}" if window else expected.kind


def _cut_short(
    run: RunEvidence,
    label: str,
    marker: Marker,
    timeline: Timeline,
    view: RunEvidence,
    stop_time: datetime | None,
    pending: list[str],
    stop_due: str | None = None,
) -> tuple[str, list[EvidenceRef]]:
    """How far the last fault that happened got before the stop, and the lines that show it;
    ``stop_due``: why the launcher had to stop the job after this fault (no recovery due)."""
    struck = marker.ref("time")
    since = seconds_between(marker.time, stop_time)
    if since is not None and since < 0:
        # the stop before the fault: a contradiction (clocks.marker_after_stop), no wait to tell
        return (
            f"{label} is stamped {clock(marker.time)} ({struck.location}), {-since:.1f} s after"
            " the launcher was told to stop: the records contradict each other",
            [struck],
        )
    later = f" {since:.1f} s later" if since is not None else ""
    detected = timeline.detected
    if detected is not None and not any(e is detected for e in before_stop(run)):
        detected = None  # the stop's record of the workers it ended
    if detected is None:
        where = ""
        if marker.fault == "hang" and marker.section:
            where = (
                f" (its rank stopped in the open {marker.section} section, whose deadline had not"
                " come)"
            )
        return (
            f"{label} struck at {clock(marker.time)} ({struck.location}) and was still"
            f" undetected{later}{where}",
            [struck],
        )
    if stop_due is not None:
        return (
            f"{label} struck at {clock(marker.time)} ({struck.location}) and was detected at"
            f" {clock(detected.time)} ({detected.ref.location}); no recovery was due ({stop_due}"
            f" had to stop the job after it), but the launcher had not exited{later}",
            [struck, detected.ref],
        )
    replacement = timeline.replacement_cycle
    log = view.cycle_log(replacement) if replacement is not None else None
    first = log.first_iteration if log is not None else None
    if first is not None and stop_time is not None and first.time is not None:
        first = first if first.time < stop_time else None
    if first is None:
        return (
            f"{label} struck at {clock(marker.time)} ({struck.location}) and was detected at"
            f" {clock(detected.time)} ({detected.ref.location}) but not recovered: no step was"
            f" committed after its restore{later}",
            [struck, detected.ref],
        )
    if pending:
        return (
            f"{label} was recovered (first step after its restore: {first.ref.location}), but"
            f" {pending[0]} had not been injected",
            [struck, first.ref],
        )
    finished = [
        e
        for e in before_stop(run)
        if e.kind in (LauncherEventKind.RUN_OK, LauncherEventKind.GROUP_SUCCEEDED)
    ]
    recovered = f"every fault was recovered ({label}: first step after its restore at"
    if finished:
        return (
            f"{recovered} {first.ref.location}) and the workers finished"
            f" ({finished[0].ref.location}), but the launcher had not exited",
            [struck, first.ref, finished[0].ref],
        )
    return (
        f"{recovered} {first.ref.location}), but training had not finished",
        [struck, first.ref],
    )
