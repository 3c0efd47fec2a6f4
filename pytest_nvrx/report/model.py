"""One scenario's report as plain data: verdicts, recovery cost, timeline and loss, from a run dir.

Nothing here judges: :meth:`ScenarioReport.from_run_dir` loads and judges a run directory with
the code path ``verify`` uses (:func:`~pytest_nvrx.evidence.rundir.load_run` then
:func:`~pytest_nvrx.criteria.judge`), and derives what a person wants to *see* from the evidence
already parsed. A report is JSON-able both ways (:meth:`ScenarioReport.as_dict`,
:meth:`ScenarioReport.from_dict`) so that an xdist worker can ship it to the controller as plain
data. Times are seconds from the scenario's ``t0`` (the launcher's first line, else run.json's
start), so that a report carries no time zone questions.

The recovery breakdown splits the downtime (the fault's instant to the first step the
replacement committed) at the milestones NVRx's profiling lines and the workload's log show. A
milestone the evidence lacks makes the phases on either side of it *missing* (``None``, never 0):
the time between the known milestones around it is ``unattributed_s``, so that the known phases
plus ``unattributed_s`` are always the downtime. The milestones, phases and downtime are the
recovery clock's (:func:`pytest_nvrx.evidence.timeline.recovery_clock`), the computation verify's
timings and the downtime gate read too; here they are only put in seconds from ``t0``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pytest_nvrx.criteria import judge
from pytest_nvrx.criteria.judgement import Judgement
from pytest_nvrx.criteria.training_continuity import print_model
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import FAILURE_KINDS, LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.plant_records import read_plant_records
from pytest_nvrx.evidence.replay import PrintModel, windows
from pytest_nvrx.evidence.rundir import RunEvidence, load_run
from pytest_nvrx.evidence.segments import fault_segments
from pytest_nvrx.evidence.timeline import (
    MILESTONE_LABELS,
    Phase,
    RecoveryClock,
    Timeline,
    marker_ref,
    recovery_clock,
)
from pytest_nvrx.evidence.timeline import PHASES as PHASES  # re-exported: the report's phases
from pytest_nvrx.evidence.workload import (
    SaveCompleted,
    SaveScheduled,
)
from pytest_nvrx.plants import Plant, plant_named
from pytest_nvrx.selftest_outcome import PlantOutcome, control_outcome, plant_outcome

#: the scenario document's version: raised only when a change breaks existing readers
SCHEMA_VERSION = 2  # 2: termination ends when the workers stopped; gpu_reclaim follows

#: at most this many loss points per run are kept (replayed iterations always are)
MAX_LOSS_POINTS = 2000
#: at most this many save events per kind and run are drawn
MAX_SAVE_EVENTS = 200


def _flat_dict(record: Any) -> dict[str, Any]:
    """A flat record (a dataclass of plain values) as JSON data: its fields in order, a tuple as
    a list. The records below without an ``as_dict`` of their own are written this way."""
    return {key: list(v) if isinstance(v, tuple) else v for key, v in asdict(record).items()}


# ----------------------------------------------------------------------------------------------
# The recovery's phases


@dataclass(frozen=True, slots=True)
class MilestoneTime:
    id: str
    t_s: float | None  # None: the evidence does not show it
    ref: str | None  # file:line that shows it


@dataclass(frozen=True, slots=True)
class LostWork:
    """Training the fault threw away and the replacement did again."""

    restored_iteration: int | None
    last_iteration_before_failure: int | None
    iterations: int | None  # recomputed: last before failure - restored
    # the failed cycle's time from committing the restored iteration to the fault
    discarded_s: float | None
    # the replacement's time from its first committed step to re-committing the last lost one
    recomputed_s: float | None


@dataclass(frozen=True, slots=True)
class Recovery:
    milestones: tuple[MilestoneTime, ...]
    phases: tuple[Phase, ...]
    downtime_s: float | None  # failure -> first committed step after restore
    unattributed_s: float | None  # downtime not covered by a known phase (milestones missing)
    lost_work: LostWork

    def as_dict(self) -> dict[str, Any]:
        return {
            "downtime_s": self.downtime_s,
            "unattributed_s": self.unattributed_s,
            "milestones": [_flat_dict(m) for m in self.milestones],
            "phases": [_flat_dict(p) for p in self.phases],
            "lost_work": _flat_dict(self.lost_work),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recovery:
        return cls(
            **{
                **data,
                "milestones": tuple(MilestoneTime(**m) for m in data["milestones"]),
                "phases": tuple(Phase(**p) for p in data["phases"]),
                "lost_work": LostWork(**data["lost_work"]),
            }
        )


# ----------------------------------------------------------------------------------------------
# Timeline and loss


@dataclass(frozen=True, slots=True)
class CycleSpan:
    cycle: int
    start_s: float | None
    end_s: float | None  # None: still running when the evidence ends
    ranks: tuple[int, ...]
    first_iteration: int | None
    last_iteration: int | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CycleSpan:
        return cls(**{**data, "ranks": tuple(data["ranks"])})


#: the kinds of timeline events, and how the legend names them
EVENT_KINDS: dict[str, str] = {
    "fault": "fault injected",
    "failure": "failure recorded",
    "detected": "failure detected",
    "workers_terminated": "workers terminated",
    "rendezvous": "rendezvous completed",
    "workers_started": "workers started",
    "checkpoint_loaded": "checkpoint loaded",
    "first_step": "first committed step",
    "save_submitted": "save submitted",
    "save_finalized": "save finalized",
    "decision": "launcher decision",
}


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    kind: str  # a key of EVENT_KINDS
    t_s: float
    label: str
    cycle: int | None
    rank: int | None
    ref: str | None


@dataclass(frozen=True, slots=True)
class TimelineData:
    t0: str | None  # ISO UTC time that t_s counts from
    end_s: float | None
    cycles: tuple[CycleSpan, ...]
    events: tuple[TimelineEvent, ...]
    fault_rank: int | None
    # the shaded window: the fault's instant to the first committed step after the restore
    fault_window: tuple[float, float] | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "t0": self.t0,
            "end_s": self.end_s,
            "fault_rank": self.fault_rank,
            "fault_window": list(self.fault_window) if self.fault_window is not None else None,
            "cycles": [_flat_dict(c) for c in self.cycles],
            "events": [_flat_dict(e) for e in self.events],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimelineData:
        window = data["fault_window"]
        window = (float(window[0]), float(window[1])) if window is not None else None
        return cls(
            **{
                **data,
                "cycles": tuple(CycleSpan.from_dict(c) for c in data["cycles"]),
                "events": tuple(TimelineEvent(**e) for e in data["events"]),
                "fault_window": window,
            }
        )


@dataclass(frozen=True, slots=True)
class LossPoint:
    cycle: int
    iteration: int
    loss: float
    replayed: bool  # an earlier cycle had committed this iteration already
    # the line printed the mean over iterations mean_from..iteration, not this iteration's loss
    # (Megatron-LM #6237: a process's second line); None: its own window, as printed normally
    mean_from: int | None = None


@dataclass(frozen=True, slots=True)
class LossSeries:
    points: tuple[LossPoint, ...]
    dropped: int  # points left out to keep the report small (never replayed or #6237 ones)

    def as_dict(self) -> dict[str, Any]:
        return {
            "columns": ["cycle", "iteration", "loss", "replayed"],
            "points": [[p.cycle, p.iteration, p.loss, p.replayed] for p in self.points],
            "dropped": self.dropped,
            # a key of its own, not a fifth column: readers of the four columns read on
            "window_means": [
                [p.cycle, p.iteration, p.mean_from] for p in self.points if p.mean_from is not None
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LossSeries:
        means = {(int(c), int(i)): int(f) for c, i, f in data.get("window_means", [])}
        return cls(
            points=tuple(
                LossPoint(int(c), int(i), float(v), bool(r), means.get((int(c), int(i))))
                for c, i, v, r in data["points"]
            ),
            dropped=int(data["dropped"]),
        )


# ----------------------------------------------------------------------------------------------
# The scenario


@dataclass(frozen=True, slots=True)
class CriterionResult:
    id: str
    status: str  # PASS | FAIL | N/A
    reason: str
    evidence: tuple[str, ...]  # "file:line: quoted text"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CriterionResult:
        return cls(data["id"], data["status"], data["reason"], tuple(data["evidence"]))


@dataclass(frozen=True, slots=True)
class ScenarioReport:
    """What the report shows of one scenario; plain data, JSON-able both ways."""

    name: str
    run_dir: str
    workload: str | None
    fault: str  # the expected fault kind ("none": a baseline)
    window: str | None
    train_iters: int | None
    passed: bool
    judgeable: bool
    summary: str
    first_cause: str | None
    criteria: tuple[CriterionResult, ...]
    problems: tuple[str, ...]
    stack: dict[str, Any]
    timings: dict[str, float]
    recovery: Recovery | None  # None: a baseline, or no fault time to measure from
    timeline: TimelineData
    loss: LossSeries
    #: the limits the run was held to (--nvrx-max-downtime, --nvrx-max-phase), and why it
    #: broke them
    max_downtime_s: float | None = None
    max_phases: dict[str, float] | None = None
    gate: str | None = None
    #: the runs that held one of this run's GPUs while it ran (result.json; None: not
    #: recorded): its recovery timings include theirs
    gpu_shared_with: tuple[str, ...] | None = None
    #: the self-test's planted bug the run names (never a qualification run; every line about
    #: it starts with "planted: <name>")
    planted: str | None = None
    #: a self-test run's row (pytest_nvrx.selftest_outcome.PlantOutcome.as_dict, plus the
    #: tolerance it was judged at): was its plant caught, by what; None: not a self-test run
    selftest: dict[str, Any] | None = None

    @property
    def baseline(self) -> bool:
        return self.fault == "none"

    @property
    def cause(self) -> str | None:
        """Why the scenario did not qualify, in one line: the first cause when the workers died
        before the fault, else the first failing criterion's reason (None when it qualified)."""
        if self.passed:
            return None
        if not self.judgeable:
            # as verify's summary: a run that cannot be judged says why first, never a cause
            # its broken evidence suggests (an empty dir's "the fault never happened")
            fatal = next((p for p in self.problems if p.startswith("fatal: ")), None)
            why = fatal.removeprefix("fatal: ") if fatal is not None else self.summary
            return f"cannot judge the run directory: {why}"
        if self.first_cause:
            return self.first_cause
        failing = next((c for c in self.criteria if c.status == "FAIL"), None)
        if failing is not None:
            return f"{failing.id}: {failing.reason}"
        return self.gate or self.summary

    @property
    def outcome(self) -> str:
        """``QUALIFIED`` or ``NOT QUALIFIED: <cause>``, after ``planted: <name>: `` in a planted
        run."""
        outcome = "QUALIFIED" if self.passed else f"NOT QUALIFIED: {self.cause}"
        return f"planted: {self.planted}: {outcome}" if self.planted is not None else outcome

    @property
    def downtime_s(self) -> float | None:
        return self.recovery.downtime_s if self.recovery is not None else None

    def held_to(
        self,
        failure: str | None,
        *,
        max_downtime_s: float | None = None,
        max_phases: dict[str, float] | None = None,
    ) -> ScenarioReport:
        """This report under time limits: ``failure`` (why the run broke them, None when it
        kept to them) makes it not qualified."""
        return replace(
            self,
            max_downtime_s=max_downtime_s,
            max_phases=max_phases,
            gate=failure,
            passed=self.passed and failure is None,
        )

    @classmethod
    def from_run_dir(
        cls,
        run_dir: Path | str,
        *,
        name: str | None = None,
        checkpoint_dir: Path | None = None,
        expect_fault: str | None = None,
        expect_window: str | None = None,
        baseline: Path | None = None,
        continuity_rtol: float = 0.0,
    ) -> ScenarioReport:
        """Load and judge ``run_dir`` as ``verify`` does, then build its report. Raises
        :class:`~pytest_nvrx.evidence.rundir.RunDirError` if it is not a directory."""
        run = load_run(Path(run_dir), checkpoint_dir)
        base = load_run(Path(baseline), read_checkpoints=False) if baseline is not None else None
        judgement = judge(
            run,
            expect_fault,
            source="caller",
            baseline=base,
            continuity_rtol=continuity_rtol,
            expect_window=expect_window,
        )
        return cls.from_judgement(run, judgement, name=name)

    @classmethod
    def from_judgement(
        cls,
        run: RunEvidence,
        judgement: Judgement,
        *,
        name: str | None = None,
    ) -> ScenarioReport:
        """The report of a run already judged (the plugin has both at hand): its recovery is
        the judgement's recovery clock (:func:`~pytest_nvrx.evidence.timeline.recovery_clock`)."""
        clock = judgement.clock
        t0 = _t0(run)
        manifest = run.manifest
        train_iters = None
        if manifest is not None and manifest.train_iters is not None:
            train_iters = int(manifest.train_iters.value)
        if train_iters is None:
            train_iters = next(
                (
                    log.last_iteration.total
                    for log in run.cycle_logs
                    if log.last_iteration and log.last_iteration.total
                ),
                None,
            )
        window = judgement.window.window if judgement.window is not None else None
        recovery = None if judgement.expected.baseline else _recovery(run, clock, t0)
        return cls(
            name=name or run.run_dir.name,
            run_dir=str(run.run_dir),
            workload=run.workload,
            fault=str(judgement.expected.kind),
            window=window,
            train_iters=train_iters,
            passed=judgement.passed,
            judgeable=judgement.judgeable,
            summary=judgement.summary(),
            first_cause=judgement.first_cause.text if judgement.first_cause is not None else None,
            criteria=tuple(
                CriterionResult(v.id, v.status, v.reason, tuple(ref.render() for ref in v.evidence))
                for v in judgement.verdicts
            ),
            problems=tuple(f"{p.severity}: {p.message}" for p in judgement.problems),
            stack=dict(judgement.stack),
            timings=dict(judgement.timings),
            recovery=recovery,
            timeline=_timeline_data(run, clock.timeline, t0, recovery),
            loss=_loss_series(run.cycle_logs, print_model(run)),
            gpu_shared_with=judgement.gpu_shared_with,
            planted=judgement.planted,
            selftest=_selftest_row(run, judgement),
        )

    def as_dict(self) -> dict[str, Any]:
        # a planted run's document starts with its plant; "planted" and "selftest" are absent
        # from the documents of every other run (which stay as they were)
        planted = {"planted": self.planted} if self.planted is not None else {}
        selftest = {"selftest": self.selftest} if self.selftest is not None else {}
        return {
            **planted,
            "name": self.name,
            "run_dir": self.run_dir,
            "workload": self.workload,
            "fault": self.fault,
            "window": self.window,
            "train_iters": self.train_iters,
            "passed": self.passed,
            "judgeable": self.judgeable,
            "summary": self.summary,
            "outcome": self.outcome,
            "first_cause": self.first_cause,
            "criteria": [_flat_dict(c) for c in self.criteria],
            "problems": list(self.problems),
            "stack": self.stack,
            "timings": self.timings,
            "downtime_s": self.downtime_s,
            "max_downtime_s": self.max_downtime_s,
            "max_phases": self.max_phases,
            "gate": self.gate,
            "gpu_shared_with": (
                list(self.gpu_shared_with) if self.gpu_shared_with is not None else None
            ),
            "recovery": self.recovery.as_dict() if self.recovery is not None else None,
            "timeline": self.timeline.as_dict(),
            "loss": self.loss.as_dict(),
            **selftest,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScenarioReport:
        recovery = data["recovery"]
        return cls(
            name=data["name"],
            run_dir=data["run_dir"],
            workload=data["workload"],
            fault=data["fault"],
            window=data["window"],
            train_iters=data["train_iters"],
            passed=data["passed"],
            judgeable=data["judgeable"],
            summary=data["summary"],
            first_cause=data["first_cause"],
            criteria=tuple(CriterionResult.from_dict(c) for c in data["criteria"]),
            problems=tuple(data["problems"]),
            stack=dict(data["stack"]),
            timings={k: float(v) for k, v in data["timings"].items()},
            recovery=Recovery.from_dict(recovery) if recovery is not None else None,
            timeline=TimelineData.from_dict(data["timeline"]),
            loss=LossSeries.from_dict(data["loss"]),
            max_downtime_s=data.get("max_downtime_s"),
            max_phases=data.get("max_phases"),
            gate=data.get("gate"),
            gpu_shared_with=(
                tuple(data["gpu_shared_with"]) if data.get("gpu_shared_with") is not None else None
            ),
            planted=data.get("planted"),
            selftest=data.get("selftest"),
        )


# ----------------------------------------------------------------------------------------------
# Building


def _selftest_row(run: RunEvidence, judgement: Judgement) -> dict[str, Any] | None:
    """A self-test run's outcome (run.json's ``config.selftest``, or a plant named): the control
    qualified or not, a plant caught, missed or not applied (its ``plant-records/``), judged at
    the tolerance ``judgement`` was; None for every other run."""
    manifest = run.manifest
    selftest = manifest is not None and manifest.is_selftest
    if not selftest and judgement.planted is None:
        return None
    rtol = judgement.continuity_rtol
    if judgement.planted is None:
        outcome = control_outcome(judgement)
    else:
        try:
            plant = plant_named(judgement.planted)
        except KeyError as exc:
            plant = Plant(judgement.planted, "not in this version's catalogue", str(exc), "")
            reason = "; ".join(judgement.unjudgeable_reasons) or str(exc.args[0])
            outcome = PlantOutcome(plant, "cannot-judge", reason, judgement.run_dir)
        else:
            records = read_plant_records(run.run_dir)
            outcome = plant_outcome(plant, judgement, records, rtol=rtol)
    return {**outcome.as_dict(), "continuity_rtol": rtol}


def _t0(run: RunEvidence) -> datetime | None:
    """The earliest of the launcher's first line and run.json's start."""
    candidates = [run.launcher.first_time]
    if run.manifest is not None:
        candidates += [run.manifest.result_start_time, run.manifest.start_time]
    known = [t for t in candidates if t is not None]
    return min(known) if known else None


def _rel(t0: datetime | None, t: datetime | None) -> float | None:
    if t0 is None or t is None:
        return None
    return round((t - t0).total_seconds(), 3)


def _recovery(run: RunEvidence, clock: RecoveryClock, t0: datetime | None) -> Recovery | None:
    """The recovery clock's milestones (from ``t0``), phases and downtime, and the lost work."""
    if not clock.has_recovery:
        return None
    milestones = tuple(
        MilestoneTime(
            mid, _rel(t0, at.time), None if at.ref is None or at.time is None else at.ref.location
        )
        for mid, at in clock.milestones.items()
    )
    tl = clock.timeline
    restored = clock.restored_iteration
    marker = run.marker
    if restored is None and marker is not None and marker.ok:
        restored = marker.tracker_iteration
    replacement = run.cycle_log(tl.replacement_cycle) if tl.replacement_cycle is not None else None
    return Recovery(
        milestones=milestones,
        phases=clock.phases,
        downtime_s=clock.downtime_s,
        unattributed_s=clock.unattributed_s,
        lost_work=_lost_work(run, tl, restored, replacement),
    )


def _lost_work(
    run: RunEvidence, tl: Timeline, restored: int | None, replacement: CycleLog | None
) -> LostWork:
    failed = [
        log
        for log in run.cycle_logs
        if tl.replacement_cycle is None or log.cycle < tl.replacement_cycle
    ]
    before = [it for log in failed for it in log.iterations]
    last = max((it.iteration for it in before), default=None)
    iterations = max(0, last - restored) if last is not None and restored is not None else None
    discarded = None
    if restored is not None and tl.fault_time is not None:
        done = [it.time for it in before if it.iteration == restored and it.time is not None]
        if done:
            discarded = round((tl.fault_time - done[-1]).total_seconds(), 3)
        elif restored == 0:
            starts = [it.time for it in before if it.time is not None]
            discarded = round((tl.fault_time - starts[0]).total_seconds(), 3) if starts else None
    recomputed = None
    if replacement is not None and replacement.first_iteration is not None and last is not None:
        first_t = replacement.first_iteration.time
        redone = [it.time for it in replacement.iterations if it.iteration == last and it.time]
        if first_t is not None and redone:
            recomputed = round((redone[0] - first_t).total_seconds(), 3)
        elif iterations == 0:
            recomputed = 0.0
    return LostWork(restored, last, iterations, discarded, recomputed)


_DECISIONS = {
    LauncherEventKind.GROUP_FAILED: "worker group failed, restart",
    LauncherEventKind.JOIN_RESTART: "joining cluster restart",
    LauncherEventKind.PROGRESS: "cycle made progress",
    LauncherEventKind.NO_PROGRESS: "cycle made NO progress",
    LauncherEventKind.EARLY_TERMINATION: "early termination",
    LauncherEventKind.NO_RESTART: "no more restarts",
    LauncherEventKind.GROUP_SUCCEEDED: "worker group finished",
    LauncherEventKind.RUN_OK: "run OK",
    LauncherEventKind.RUN_FAILED: "run failed",
    LauncherEventKind.AGENT_EXIT: "agent exit",
}
_PROFILING_KINDS = {
    "failure_detected": "detected",
    "worker_terminated": "workers_terminated",
    "rendezvous_completed": "rendezvous",
    "worker_start_completed": "workers_started",
}


def _later_faults(run: RunEvidence, t0: datetime | None) -> list[TimelineEvent]:
    """A fault schedule's later faults (issue #26), each with its cycle, and each later
    recovery's checkpoint load and first committed step: the timeline shows every fault."""
    scheduled = run.manifest.scheduled_faults if run.manifest is not None else ()
    if not scheduled:
        return []
    out: list[TimelineEvent] = []
    for segment in fault_segments(run, scheduled)[1:]:
        marker, tl = segment.marker, segment.timeline
        t_s = _rel(t0, marker.time)
        if t_s is None:
            continue
        what = f"{marker.fault} ({marker.signal})" if marker.signal else (marker.fault or "fault")
        out.append(
            TimelineEvent(
                "fault",
                t_s,
                f"fault {segment.position}: {what} into rank {marker.rank} ({segment.scheduled})",
                tl.failed_cycle,
                marker.rank,
                marker.ref("time").location,
            )
        )
        clock = recovery_clock(segment.view, tl)
        for mid in ("checkpoint_loaded", "first_step"):
            instant = clock.milestones[mid]
            at = _rel(t0, instant.time)
            if at is not None:
                ref = instant.ref.location if instant.ref is not None else None
                label = f"{MILESTONE_LABELS[mid]} (fault {segment.position})"
                out.append(TimelineEvent(mid, at, label, tl.replacement_cycle, None, ref))
    return out


def _launcher_event(event: LauncherEvent, t_s: float) -> TimelineEvent | None:
    ref = event.ref.location
    if event.kind is LauncherEventKind.PROFILING:
        kind = _PROFILING_KINDS.get(event.name or "")
        if kind is None:
            return None
        return TimelineEvent(
            kind, t_s, f"{event.name} (cycle {event.cycle})", event.cycle, event.rank, ref
        )
    if event.kind in FAILURE_KINDS:
        what = event.kind.value.replace("_", " ")
        if event.exit_code is not None:
            what += f" (exit {event.exit_code})"
        if event.name and event.kind is not LauncherEventKind.GROUP_FAILED:
            what += f" {event.name}"
        kind = "decision" if event.kind is LauncherEventKind.GROUP_FAILED else "failure"
        label = _DECISIONS[event.kind] if kind == "decision" else what
        return TimelineEvent(kind, t_s, label, event.cycle, event.rank, ref)
    if event.kind in _DECISIONS:
        label = _DECISIONS[event.kind]
        if event.exit_code is not None:
            label += f" (exit {event.exit_code})"
        return TimelineEvent("decision", t_s, label, event.cycle, None, ref)
    return None


def _timeline_data(
    run: RunEvidence, tl: Timeline, t0: datetime | None, recovery: Recovery | None
) -> TimelineData:
    events: list[TimelineEvent] = []
    for event in run.launcher.events:
        t_s = _rel(t0, event.time)
        if t_s is None:
            continue
        found = _launcher_event(event, t_s)
        if found is not None:
            events.append(found)
    fault_t = _rel(t0, tl.fault_time)
    marker = run.marker
    fault_rank = marker.rank if marker is not None and marker.ok else None
    if fault_t is not None and marker is not None:
        what = (
            f"{marker.fault or 'fault'} ({marker.signal})"
            if marker.signal
            else (marker.fault or "fault")
        )
        ref = marker_ref(run)
        events.append(
            TimelineEvent(
                "fault",
                fault_t,
                f"{what} into rank {fault_rank}",
                tl.failed_cycle,
                fault_rank,
                ref.location if ref else None,
            )
        )
    events += _later_faults(run, t0)
    cycles: list[CycleSpan] = []
    numbers = sorted({r.cycle for r in run.cycles} | {log.cycle for log in run.cycle_logs})
    for cycle in numbers:
        record = run.cycle_infos.by_cycle(cycle)
        log = run.cycle_log(cycle)
        start = record.start if record is not None else None
        end = record.end if record is not None else None
        if log is not None and start is None and log.first_iteration is not None:
            start = log.first_iteration.time
        if log is not None and end is None and log.last_iteration is not None:
            end = log.last_iteration.time
        cycles.append(
            CycleSpan(
                cycle,
                _rel(t0, start),
                _rel(t0, end),
                log.ranks if log is not None else (),
                log.first_iteration.iteration if log is not None and log.first_iteration else None,
                log.last_iteration.iteration if log is not None and log.last_iteration else None,
            )
        )
        if log is None:
            continue
        saves: list[tuple[str, SaveScheduled | SaveCompleted]] = [
            *(("submitted", e) for e in log.of_type(SaveScheduled)[:MAX_SAVE_EVENTS]),
            *(("finalized", e) for e in log.of_type(SaveCompleted)[:MAX_SAVE_EVENTS]),
        ]
        for verb, save in saves:
            t_s = _rel(t0, save.time)
            if t_s is not None:
                label = f"save {save.iteration} {verb}"
                where = save.ref.location
                events.append(TimelineEvent(f"save_{verb}", t_s, label, cycle, None, where))
    if recovery is not None:
        for m in recovery.milestones:
            if m.id in ("checkpoint_loaded", "first_step") and m.t_s is not None:
                events.append(
                    TimelineEvent(
                        m.id, m.t_s, MILESTONE_LABELS[m.id], tl.replacement_cycle, None, m.ref
                    )
                )
    events.sort(key=lambda e: e.t_s)
    ends = [run.launcher.last_time]
    if run.manifest is not None:
        ends.append(run.manifest.end_time)
    end_s = max((v for v in (_rel(t0, t) for t in ends) if v is not None), default=None)
    known = [e.t_s for e in events] + [c.end_s for c in cycles if c.end_s is not None]
    if known:
        end_s = max([*known, end_s or 0.0])
    window = None
    if recovery is not None and fault_t is not None:
        # to the first committed step after the restore; without one, to the end of the evidence
        by_id = {m.id: m.t_s for m in recovery.milestones}
        end_t = by_id["first_step"] if by_id["first_step"] is not None else end_s
        if end_t is not None and end_t > fault_t:
            window = (fault_t, end_t)
    return TimelineData(
        t0=t0.isoformat() if t0 is not None else None,
        end_s=end_s,
        cycles=tuple(cycles),
        events=tuple(events),
        fault_rank=fault_rank,
        fault_window=window,
    )


def _window_means(log: CycleLog, model: PrintModel) -> dict[int, int]:
    """The iterations of one cycle whose printed loss is a mean over more iterations than the
    workload's own print rule gives, each with its window's first iteration: Megatron core
    <= 0.19 does not reset its loss accumulators at a process's first print (Megatron-LM
    #6237), so with ``--log-interval 1`` its second line prints the mean of its first two. The
    same windows ``training_continuity`` compares by (:func:`print_model`), read here so that
    the chart does not draw such a mean as the iteration's loss."""
    if "loss" not in model.averaged or model.first_print_resets:
        return {}
    fixed = {
        p.iteration: p.first
        for p in windows(log.iterations, replace(model, first_print_resets=True), log.cycle)
    }
    return {
        p.iteration: p.first
        for p in windows(log.iterations, model, log.cycle)
        if p.first != fixed.get(p.iteration, p.first)
    }


def _loss_series(logs: tuple[CycleLog, ...], model: PrintModel | None = None) -> LossSeries:
    points: list[LossPoint] = []
    done = 0  # the highest iteration an earlier cycle committed
    for log in logs:
        means = _window_means(log, model) if model is not None else {}
        seen: set[int] = set()
        for it in log.iterations:
            if it.loss is None or it.iteration in seen:
                continue
            seen.add(it.iteration)
            points.append(
                LossPoint(
                    log.cycle,
                    it.iteration,
                    it.loss,
                    it.iteration <= done,
                    means.get(it.iteration),
                )
            )
        done = max([done, *seen])
    return _thin(points)


def _thin(points: list[LossPoint]) -> LossSeries:
    """At most :data:`MAX_LOSS_POINTS`: every k-th point, all replayed ones, each cycle's ends."""
    if len(points) <= MAX_LOSS_POINTS:
        return LossSeries(tuple(points), 0)
    step = -(-len(points) // MAX_LOSS_POINTS)
    kept = [
        p
        for i, p in enumerate(points)
        if p.replayed
        or p.mean_from is not None
        or i % step == 0
        or i == len(points) - 1
        or points[i - 1].cycle != p.cycle
        or points[min(i + 1, len(points) - 1)].cycle != p.cycle
    ]
    return LossSeries(tuple(kept), len(points) - len(kept))
