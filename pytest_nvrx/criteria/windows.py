"""Fault windows (issue #10): did the fault land in its window, and what that makes the criteria
check.

A window run's marker (schema 2) says where the selected rank fired: ``step`` (a training step
after a checkpoint completed), ``save`` (inside the preparation of checkpoint N) or ``finalize``
(save N submitted, its background write in flight, not yet finalized), with N its
``in_flight_iteration`` and T its ``tracker_iteration``, the newest completed checkpoint. From
the marker and the logs :func:`window_facts` derives, once per judgement:

* which window is judged: the requested one (run.json ``config.window`` or the caller's), which
  the marker must record; else the marker's own; a run without either is a legacy run (None);
* whether the fault landed in it (:attr:`WindowFacts.problem`, else :attr:`WindowFacts.proof`):
  the marker records the window and a trigger of that window (of its fault:
  ``end_section(checkpointing)`` fires only ckpt-worker) with the section that probe records
  open; T < N for ``save``/``finalize``;
  for ``finalize`` the save of N was scheduled (rank 0's ``save scheduled iteration N`` /
  ``scheduled an async checkpoint save at iteration N``) by the time of the fault; no checkpoint
  newer than T completed before the fault; and the faulted cycle never completed N, before the
  fault (the fault was not in flight) or after it (the tracker named N although a rank died
  before N was durable: the tracker ahead of durability); the injector's fire line, when the log
  has one, says what the marker says.

prior_checkpoint reports that; optimizer_state_load, progress_past_restore and replaced_cycle use
the rest (the in-flight iteration, whether its directory is on disk, its save after the restore).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pytest_nvrx.criteria.expected import ExpectedWindow
from pytest_nvrx.criteria.helpers import clock, or_none
from pytest_nvrx.evidence.checkpoint import CheckpointMetadata, OptimizerState
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.injector_log import InjectorLine
from pytest_nvrx.evidence.marker import Marker
from pytest_nvrx.evidence.refs import EvidenceRef, seconds_between
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import CLOCK_SLACK, FINALIZED_BEFORE_FAULT_SLACK, Timeline
from pytest_nvrx.evidence.workload import SaveCompleted, SaveScheduled
from pytest_nvrx.layout import MARKER_NAME, iteration_dir_name

#: The probes that may fire in each window (the marker's ``trigger``). ``tracker poll`` is the
#: step window's fallback on a workload without NVRx sections; ``end_section(checkpointing)`` is
#: where ``ckpt-worker`` fires in the finalize window (the write has just started).
WINDOW_TRIGGERS: dict[str, tuple[str, ...]] = {
    "step": ("start_section(step)", "tracker poll"),
    "save": ("save submit",),
    "finalize": ("start_section(checkpointing)", "end_section(checkpointing)"),
    # a fault schedule's replacement, entering its checkpoint load (issue #26)
    "restore": ("checkpoint load",),
}
#: Faults whose trigger in a window is fixed.
FAULT_TRIGGERS: dict[tuple[str, str], str] = {
    ("ckpt-worker", "finalize"): "end_section(checkpointing)",
}
#: The probes only one fault fires (the other faults of that window fire elsewhere).
TRIGGER_FAULTS: dict[str, str] = {trigger: fault for (fault, _), trigger in FAULT_TRIGGERS.items()}
#: The NVRx section each probe records as open (injector.py WindowProbes): a section start
#: records the section it started; ``save submit`` the innermost section open at the submit
#: (checkpointing, or none on a workload without sections); ``tracker poll`` fires only when no
#: section was ever seen. ``end_section(checkpointing)`` records whatever encloses it: any.
TRIGGER_SECTIONS: dict[str, tuple[str | None, ...]] = {
    "start_section(step)": ("step",),
    "start_section(checkpointing)": ("checkpointing",),
    "save submit": ("checkpointing", None),
    "tracker poll": (None,),
    # the load runs in NVRx's setup section (none on a workload without sections)
    "checkpoint load": ("setup", None),
}
#: Windows whose fault must have a save in flight (the marker's in_flight_iteration).
IN_FLIGHT_WINDOWS = ("save", "finalize")

Quote = EvidenceRef | None


@dataclass(frozen=True, slots=True)
class Fact:
    """A statement about the window with the lines that prove it."""

    text: str
    refs: tuple[Quote, ...] = ()


@dataclass(frozen=True)
class WindowFacts:
    """What the evidence says about the window of the injected fault (see the module doc)."""

    window: str
    source: str  # run.json, --expect-window, caller, or the marker
    requested: EvidenceRef  # the line that asks for the window (the marker's, if none asked)
    in_flight: int | None  # N: the save in flight at the fault (None: none, or unknown)
    tracker: int | None  # T: the newest completed checkpoint the marker read at the fault
    problem: Fact | None  # the first way the fault did not land in its window; None: it did
    proof: Fact  # how it landed in the window (meaningful when problem is None)
    in_flight_dir: CheckpointMetadata | None  # iter_N/ at the end of the run (None: not read)

    @property
    def landed(self) -> bool:
        return self.problem is None


def window_facts(
    run: RunEvidence, expected: ExpectedWindow, timeline: Timeline
) -> WindowFacts | Fact | None:
    """The window facts of a run; a :class:`Fact` (a failure) when the requested window cannot
    be judged at all (no usable marker, or a marker without a window); None for a legacy run
    (no window requested, marker without one)."""
    marker = run.marker
    if marker is None or not marker.ok:
        if expected.window is None:
            return None
        return Fact(
            f"window {expected.window} was requested ({expected.source}) but no usable injection"
            " marker says a fault was injected in it",
            (expected.ref, marker.ref() if marker is not None else None),
        )
    if marker.window is None:
        if expected.window is None:
            return None
        return Fact(
            f"window {expected.window} was requested ({expected.source}) but the marker records"
            f" no window (schema {marker.schema_version}: the legacy tracker trigger, not a"
            " window probe)",
            (expected.ref, marker.ref("schema_version") if marker.doc else marker.ref()),
        )
    if expected.window is not None:
        window, source, requested = expected.window, expected.source, expected.ref
    else:
        window, source, requested = marker.window, MARKER_NAME, marker.ref("window")
    logs = faulted_logs(run, timeline)
    problem, proof = _landed(run, marker, window, source, requested, logs)
    in_flight = marker.in_flight_iteration
    return WindowFacts(
        window=window,
        source=source,
        requested=requested,
        in_flight=in_flight,
        tracker=marker.tracker_iteration,
        problem=problem,
        proof=proof,
        in_flight_dir=run.checkpoint(in_flight) if in_flight else None,
    )


def faulted_logs(run: RunEvidence, timeline: Timeline) -> list[CycleLog]:
    """The logs of the faulted cycle and any before it (all logs if the cycle is unknown)."""
    failed = timeline.failed_cycle
    if failed is None and timeline.replacement_cycle is not None:
        failed = timeline.replacement_cycle - 1
    return [log for log in run.cycle_logs if failed is None or log.cycle <= failed]


def _before(time: datetime | None, fault: datetime | None, slack: float = 0.0) -> bool | None:
    """Whether a log time lies at or before the fault (None: one of them unknown)."""
    if time is None or fault is None:
        return None
    return (seconds_between(fault, time) or 0.0) <= slack


def _landed(
    run: RunEvidence,
    marker: Marker,
    window: str,
    source: str,
    requested: EvidenceRef,
    logs: list[CycleLog],
) -> tuple[Fact | None, Fact]:
    """(the first problem, the proof): the checks of the module doc, in that order."""
    recorded = marker.ref("window")
    if marker.window != window:
        return Fact(
            f"the marker records window {marker.window} but {window} was requested ({source})",
            (recorded, requested),
        ), Fact("")
    triggers = WINDOW_TRIGGERS[window]
    fixed = FAULT_TRIGGERS.get((marker.fault or "", window))
    if marker.trigger is not None and (
        marker.trigger not in triggers or (fixed is not None and marker.trigger != fixed)
    ):
        wanted = fixed or " or ".join(triggers)
        return Fact(
            f"the marker says {marker.trigger} fired, not a probe of window {window} ({wanted})",
            (marker.ref("trigger"), recorded),
        ), Fact("")
    owner = TRIGGER_FAULTS.get(marker.trigger or "")
    if owner is not None and marker.fault != owner:
        return Fact(
            f"the marker says {marker.trigger} fired a {marker.fault} fault, but"
            f" {marker.trigger} fires only {owner}, not {marker.fault}",
            (marker.ref("trigger"), marker.ref("fault")),
        ), Fact("")
    sections = TRIGGER_SECTIONS.get(marker.trigger or "")
    if marker.trigger is not None and sections is not None and marker.section not in sections:
        recorded_by = " or ".join(x if x is not None else "none" for x in sections)
        return Fact(
            f"the marker says section {marker.section or 'none'} was open when"
            f" {marker.trigger} fired, but that probe records section {recorded_by}",
            (marker.ref("section"), marker.ref("trigger")),
        ), Fact("")
    n, t = marker.in_flight_iteration, marker.tracker_iteration
    if window in IN_FLIGHT_WINDOWS and n is None:
        return Fact(
            f"window {window} needs a save in flight, but the marker records no"
            " in_flight_iteration",
            (marker.ref("in_flight_iteration"), recorded),
        ), Fact("")
    if n is not None and (t is None or t >= n):
        return Fact(
            f"the marker records tracker iteration {t} and in-flight iteration {n}: a save in"
            " flight is newer than the newest completed checkpoint",
            (marker.ref("tracker_iteration"), marker.ref("in_flight_iteration")),
        ), Fact("")
    fired = fire_line(logs, marker)
    if fired is not None and not fired.legacy:
        stated = (fired.window, fired.in_flight_iteration, fired.tracker_iteration)
        disagrees = stated_window_disagrees("the injector's fire line", stated, fired.ref, marker)
        if disagrees is not None:
            return disagrees, Fact("")
    fault_t = marker.time
    completed = [e for log in logs for e in log.of_type(SaveCompleted)]
    if t is not None:
        newer = [
            e
            for e in completed
            if e.iteration > t
            and e.iteration != n
            and _before(e.time, fault_t, FINALIZED_BEFORE_FAULT_SLACK.total_seconds())
        ]
        if newer:
            return Fact(
                f"checkpoint {newer[0].iteration} completed at {clock(newer[0].time)}, before the"
                f" fault at {clock(fault_t)}, but the marker names {t} as the newest completed"
                " checkpoint",
                (newer[0].ref, marker.ref("tracker_iteration"), marker.ref("time")),
            ), Fact("")
    proof: list[Quote] = [recorded, marker.ref("trigger") if marker.trigger else None]
    said_parts = [f"the marker records window {window}"]
    if marker.trigger is not None:
        said_parts.append(f"trigger {marker.trigger}")
    if marker.section is not None:
        said_parts.append(f"section {marker.section} open")
    if n is not None:
        done_n = [e for e in completed if e.iteration == n]
        early = [e for e in done_n if _before(e.time, fault_t) is not False]
        if done_n:
            # completed before the fault: not in the window; after it: ahead of durability
            done = (early or done_n)[0]
            text = (
                f"checkpoint {n}, which the marker says was in flight, had completed at"
                f" {clock(done.time)}, before the fault at {clock(fault_t)}: the fault was not"
                f" in window {window}"
                if early
                else f"the faulted cycle completed checkpoint {n} at {clock(done.time)}, after"
                f" the fault at {clock(fault_t)} had stopped a rank before {n} was durable: the"
                " tracker was advanced ahead of durability"
            )
            quotes = (done.ref, marker.ref("in_flight_iteration"), marker.ref("time"))
            return Fact(text, quotes), Fact("")
        said_parts.append(f"save {n} in flight, tracker {t}")
        proof += [marker.ref("in_flight_iteration"), marker.ref("tracker_iteration")]
        scheduled = [e for log in logs for e in log.of_type(SaveScheduled) if e.iteration == n]
        if window == "finalize":
            in_time = [
                e for e in scheduled if _before(e.time, fault_t, CLOCK_SLACK.total_seconds())
            ]
            if not in_time:
                late = f" (logged only at {clock(scheduled[0].time)})" if scheduled else ""
                return Fact(
                    f"no line of the faulted cycle says save {n} was"
                    f" scheduled by the fault at {clock(fault_t)}{late}: it was never submitted",
                    (
                        scheduled[0].ref if scheduled else None,
                        marker.ref("in_flight_iteration"),
                        marker.ref("time"),
                    ),
                ), Fact("")
            sched = in_time[0]
            lag = seconds_between(fault_t, sched.time)
            when = (
                f"{-lag:.3f} s before the fault"
                if lag is not None and lag <= 0
                else f"{lag:.3f} s after the fault (ranks are not synchronised there)"
                if lag is not None
                else "in the faulted cycle"
            )
            said_parts.append(f"save {n} scheduled {when}")
            proof.append(sched.ref)
        said_parts.append(f"save {n} never completed in the faulted cycle")
        if marker.write_done is not None:
            said_parts.append(
                "its background write " + ("done" if marker.write_done else "still running")
            )
            proof.append(marker.ref("write_done"))
    if fired is not None:
        proof.append(fired.ref)
    return None, Fact(", ".join(said_parts), tuple(proof))


def stated_window_disagrees(
    who: str,
    stated: tuple[str | None, int | None, int | None],
    ref: EvidenceRef,
    marker: Marker,
) -> Fact | None:
    """Where a line that states the fault's (window, in-flight iteration, tracker iteration),
    the injector's fire line or the InjectedFault it raised, says otherwise than the marker: the
    fact, quoting the line and the marker's three keys (None: they agree)."""
    recorded = (marker.window, marker.in_flight_iteration, marker.tracker_iteration)
    if stated == recorded:
        return None
    said, kept = (", ".join(_window_words(values)) for values in (stated, recorded))
    return Fact(
        f"{who} says {said}; the marker says {kept}",
        (
            ref,
            marker.ref("window"),
            marker.ref("in_flight_iteration"),
            marker.ref("tracker_iteration"),
        ),
    )


def _window_words(values: tuple[str | None, int | None, int | None]) -> list[str]:
    window, in_flight, tracker = values
    return [
        f"window {or_none(window)}",
        f"in-flight iteration {or_none(in_flight)}",
        f"tracker {or_none(tracker)}",
    ]


def fire_line(logs: list[CycleLog], marker: Marker) -> InjectorLine | None:
    """The injector's fire line of the marker's rank in the faulted cycle (the last such)."""
    fired = [
        line
        for log in logs
        for line in log.injector
        if line.kind == "fired" and (marker.rank is None or line.rank == marker.rank)
    ]
    return fired[-1] if fired else None


def in_flight_dir_text(facts: WindowFacts, resaved: SaveCompleted | None) -> str:
    """What can be proven about iter_N/ on disk at the end of the run."""
    meta, n = facts.in_flight_dir, facts.in_flight
    if n is None:
        return ""
    if meta is None:
        return f"{iteration_dir_name(n)}/ not examined"
    if meta.state is OptimizerState.ABSENT_DIR:
        return f"{meta.dir}/ is not on disk at the end of the run"
    if resaved is not None:
        return (
            f"{meta.dir}/ exists at the end of the run, rewritten by the save of {n} completed"
            f" at {clock(resaved.time)}: what the fault left in it cannot be told from that"
        )
    return f"{meta.dir}/ exists at the end of the run and was never completed: the partial save"
