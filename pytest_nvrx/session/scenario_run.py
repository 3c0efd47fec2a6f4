"""One scenario, start to end: plan -> launch -> judge. No pytest here.

The plugin's fixture runs a scenario through :func:`run_scenario`, or side by side through
pytest_nvrx.session.scenario_pool: both plan, launch, wait for and judge it with one
:class:`ScenarioLaunch`. ``python -m pytest_nvrx run`` plans and launches one run through the same
:func:`~pytest_nvrx.launch.run.plan_launch` and :func:`~pytest_nvrx.launch.launcher.hold_launch`
(:func:`~pytest_nvrx.launch.run.launch_run`; it does not judge: ``verify`` does). What is printed
along the way is the caller's: it passes ``write`` (or callbacks), so the fixture writes to pytest's
terminal and the CLI to stdout/stderr.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_nvrx.criteria import Judgement, judge
from pytest_nvrx.criteria.outcome import Outcome, run_outcome
from pytest_nvrx.evidence.progress import Progress
from pytest_nvrx.evidence.rundir import RunEvidence, load_run
from pytest_nvrx.evidence.timeline import Phase
from pytest_nvrx.launch import claims
from pytest_nvrx.launch.gpu_slots import GpuLedger, Slot, lock_dir_of, visible_gpus
from pytest_nvrx.launch.launcher import (
    Launch,
    LaunchOutcome,
    RunResult,
    hold_launch,
    tail_text,
    wait_launch,
)
from pytest_nvrx.launch.planning import Plan
from pytest_nvrx.launch.run import announce_plan, plan_launch
from pytest_nvrx.layout import CONSOLE_LOG_NAME, RunLayout
from pytest_nvrx.outputs import full_disk_note
from pytest_nvrx.session.scenarios import RUN_TIMEOUTS, Scenario
from pytest_nvrx.session.verdict_table import Row, fault_rows
from pytest_nvrx.settings import (
    ConfigError,
    NvrxSettings,
    PartialRunConfig,
    RunConfig,
    default_launcher,
    resolve,
    shared_run_id,
    validate,
    workload_defaults,
)

if TYPE_CHECKING:
    from pytest_nvrx.report import ScenarioReport

#: The key of a judged existing run (--nvrx-run-dir), where a scenario's id would be.
EXISTING_RUN = "existing-run"


#: verify's timing of the recovery clock's downtime (the one the gate holds to its limit, and
#: report.json's downtime_s)
DOWNTIME_TIMING = "failure_to_first_iteration_after_restore_s"


def downtime_breakdown(timings: Mapping[str, float]) -> list[str]:
    """verify's timings (RecoveryClock.timings) as the steps of a downtime, each from the one
    before it."""
    parts = []
    for key, text in (
        ("failure_to_detected_s", "detected after {:.1f} s"),
        ("detected_to_replacement_start_s", "replacement started {:.1f} s later"),
        ("replacement_start_to_checkpoint_loaded_s", "checkpoint loaded {:.1f} s later"),
    ):
        if key in timings:
            parts.append(text.format(timings[key]))
            reclaim = timings.get("gpu_memory_reclaim_s")
            if key == "detected_to_replacement_start_s" and reclaim is not None:
                parts[-1] += f" (of which {reclaim:.0f} s waiting for GPU memory)"
    first = timings.get("replacement_start_to_first_iteration_s")
    loaded = timings.get("replacement_start_to_checkpoint_loaded_s")
    if first is not None:
        if loaded is not None:
            parts.append(f"first step {first - loaded:.1f} s later")
        else:
            parts.append(f"first step {first:.1f} s after the replacement started")
    return parts


@dataclass
class ScenarioRun:
    """A finished (or judged existing) run and its verdicts."""

    key: str
    scenario: Scenario | None
    layout: RunLayout
    judgement: Judgement
    result: RunResult | None = None
    stack: dict[str, Any] = field(default_factory=dict)
    #: why the launch did not end by itself (its deadline), else None
    error: str | None = None
    #: the evidence judged (None: not kept), which the report is built from
    evidence: RunEvidence | None = field(default=None, repr=False, compare=False)
    #: the recovery report of this run, built on first use (report()) from the evidence judged
    #: and the judgement's recovery clock
    _report: ScenarioReport | None = field(default=None, init=False, repr=False, compare=False)

    def log_tails(self) -> list[tuple[str, str]]:
        logs = self.layout.cycle_log_paths()
        out = []
        for path in [
            *([logs[max(logs)]] if logs else []),
            self.layout.launcher_log,
            self.layout.logs / CONSOLE_LOG_NAME,
        ]:
            if path.is_file():
                rel = path.relative_to(self.layout.run_dir)
                out.append((f"nvrx: tail of {rel}", tail_text(path, 30)))
        return out

    def summary_lines(self) -> list[str]:
        """The run in the terminal summary: where it is, the launcher's end, every verdict with
        the line that proves it."""
        wall = ""
        if self.result is not None:
            wall = f", launcher {self.result.wall_s:.1f}s exit {self.result.exit_code}"
        lines = [f"{self.key}: {self.layout.run_dir}{wall}"]
        lines += [f"  {verdict.headline()}" for verdict in self.judgement.verdicts]
        return lines

    # --- the outcome and the downtime gate ---------------------------------------------------

    @property
    def baseline(self) -> bool:
        return self.judgement.expected.baseline

    @property
    def downtime_s(self) -> float | None:
        """The fault's instant to the first step committed after the restore, as judged (verify's
        timing, the recovery clock's downtime); a fault schedule's total downtime (every
        recovery's, evidence/segments.py); None: the evidence shows no such pair."""
        if self.judgement.schedule:
            return self.judgement.total_downtime_s
        return self.judgement.timings.get(DOWNTIME_TIMING)

    def downtime_failure(self, limit_s: float) -> str | None:
        """Why the run breaks ``--nvrx-max-downtime limit_s``; None when it keeps to it (a
        baseline has no downtime to hold). No measurement is a failure, never a pass. A fault
        schedule holds every recovery to the limit (:meth:`_recoveries_downtime_failure`)."""
        if self.baseline:
            return None
        if self.judgement.schedule:
            return self._recoveries_downtime_failure(limit_s)
        clock = self.judgement.clock
        downtime = clock.downtime_s
        if downtime is None:
            return (
                f"no measurable downtime, limit {limit_s:g} s (--nvrx-max-downtime): the evidence "
                "shows no fault instant or no step committed after a restore"
            )
        if downtime < 0:
            return (
                f"downtime {downtime:.3f} s is negative, limit {limit_s:g} s"
                " (--nvrx-max-downtime): the clocks disagree, nothing was measured"
            )
        if downtime <= limit_s:
            return None
        parts = downtime_breakdown(self.judgement.timings)
        split = f" ({', '.join(parts)})" if parts else ""
        return (
            f"downtime {downtime:.3f} s exceeds the limit {limit_s:g} s (--nvrx-max-downtime): "
            f"fault to first step committed after the restore{split}"
        )

    def _recoveries_downtime_failure(self, limit_s: float) -> str | None:
        """A fault schedule under ``--nvrx-max-downtime``: every recovery that was due is held to
        the limit, each by its own clock. One the next fault struck while it restored is held
        by what it has: the time it was down until that fault (already over the limit is a
        failure; its restore is judged again, in full, in the next fault's recovery, which
        loads the same checkpoint). A recovery without a measurement fails, as does a
        schedule with no recovery to measure; after a fault at which the launcher had to stop
        the job no recovery was due (no_repeat_injection judges that stop)."""
        given = f"limit {limit_s:g} s (--nvrx-max-downtime)"
        due = [r for r in self.judgement.recoveries if r.due]
        if not due:
            return (
                f"no measurable downtime, {given}: no recovery of the schedule"
                f" {','.join(self.judgement.schedule)} to measure"
            )
        out = []
        for recovery in due:
            downtime = recovery.downtime_s
            if downtime is None:
                out.append(
                    f"{recovery.label}: no measurable downtime, {given}: the evidence shows no"
                    " fault instant or no step committed after its restore"
                )
            elif downtime < 0:
                out.append(
                    f"{recovery.label}: downtime {downtime:.3f} s is negative, {given}: the"
                    " clocks disagree, nothing was measured"
                )
            elif downtime > limit_s and recovery.struck_by is not None:
                out.append(
                    f"{recovery.label}: down {downtime:.3f} s until fault {recovery.struck_by}"
                    f" struck its replacement while it restored, over the {given}"
                )
            elif downtime > limit_s:
                parts = downtime_breakdown(recovery.timings())
                split = f" ({', '.join(parts)})" if parts else ""
                out.append(
                    f"{recovery.label}: downtime {downtime:.3f} s exceeds the {given}: fault to"
                    f" first step committed after the restore{split}"
                )
        return "; ".join(out) or None

    def phase_failures(self, limits: Mapping[str, float]) -> list[str]:
        """Why the run breaks ``--nvrx-max-phase`` (the recovery clock's phases, the recovery
        report's); a phase the evidence cannot measure breaks its limit too. A fault schedule
        holds every due recovery's phases to the limits, each named by its fault; the phases a
        recovery struck while it restored never reached (its checkpoint load, its first step)
        are judged in the next fault's recovery, which loads the same checkpoint."""
        if self.baseline or not limits:
            return []
        if self.judgement.schedule:
            due = [r for r in self.judgement.recoveries if r.due]
            if not due:
                return [
                    f"phase {phase_id} not measurable, limit {limit:g} s (--nvrx-max-phase"
                    f" {phase_id}={limit:g}): no recovery of the schedule to measure"
                    for phase_id, limit in limits.items()
                ]
            return [
                f"{r.label}: {failure}"
                for r in due
                for failure in _phase_failures(
                    {p.id: p for p in r.phases}, limits, unreached=r.unreached
                )
            ]
        clock = self.judgement.clock
        phases = {phase.id: phase for phase in clock.phases} if clock.has_recovery else {}
        return _phase_failures(phases, limits)

    def gate_failures(self, limits: Limits | None) -> list[str]:
        """Every limit the run breaks (none for a baseline or without limits)."""
        if limits is None or self.baseline or not limits.given:
            return []
        if not self.judgement.judgeable:
            # timings of a run that cannot be judged are no measurement to hold to a limit
            return [
                "cannot hold the run to --nvrx-max-downtime/--nvrx-max-phase: it cannot be"
                " judged: " + "; ".join(self.judgement.unjudgeable_reasons)
            ]
        if self.judgement.gpu_shared and not limits.shared_gpu:
            # a measurement of several runs is no measurement of this stack
            return [
                "cannot hold the run to --nvrx-max-downtime/--nvrx-max-phase: "
                + (self.judgement.sharing_note() or "it shared its GPU")
                + "; run it on a GPU of its own (--nvrx-gpu-share 1), or pass"
                " --nvrx-gate-shared-gpu to gate it anyway"
            ]
        out = []
        if limits.downtime_s is not None:
            failure = self.downtime_failure(limits.downtime_s)
            if failure is not None:
                out.append(failure)
        return out + self.phase_failures(limits.phases)

    def outcome(self, limits: Limits | None = None) -> Outcome:
        """The scenario's outcome and its one cause (criteria/outcome.py): the judgement, the
        launch's deadline and the time limits it breaks, in that function's order."""
        gate = "; ".join(self.gate_failures(limits)) or None
        return run_outcome(self.judgement, launch_error=self.error, limits=gate)

    def table_row(self, limits: Limits | None = None) -> Row:
        """The session's closing table's row (pytest_nvrx.session.verdict_table)."""
        outcome = self.outcome(limits)
        return Row(
            scenario=self.key,
            outcome=outcome.status,
            timings=dict(self.judgement.timings),
            cause=outcome.reason,
            baseline=self.baseline,
            shared_gpu=self.judgement.gpu_shared,
            recoveries=fault_rows(self.judgement.recoveries),
            total_downtime_s=self.judgement.total_downtime_s,
        )

    def outcome_line(self, limits: Limits | None = None) -> str:
        """``nvrx <scenario>: <outcome>``, the line the console prints when it was judged."""
        return f"nvrx {self.key}: {self.outcome(limits).text}"

    def report(self, limits: Limits | None = None) -> ScenarioReport:
        """The recovery report's view of this run (pytest_nvrx.report): the evidence judged
        (loaded again only where it was not kept), the verdicts and the recovery clock this
        judgement gave; a broken limit makes it not qualified."""
        if self._report is None:
            from pytest_nvrx.report import ScenarioReport

            evidence = self.evidence
            if evidence is None:
                evidence = load_run(
                    self.layout.run_dir, self.layout.checkpoint_dir, read_checkpoints=False
                )
            self._report = ScenarioReport.from_judgement(
                evidence, self.judgement, name=self.key, launch_error=self.error
            )
        if limits is None or not limits.given:
            return self._report
        failures = self.gate_failures(limits)
        return self._report.held_to(
            self.outcome(limits),
            "; ".join(failures) or None,
            max_downtime_s=limits.downtime_s,
            max_phases=dict(limits.phases) or None,
        )


def _phase_failures(
    phases: Mapping[str, Phase], limits: Mapping[str, float], *, unreached: Sequence[str] = ()
) -> list[str]:
    """Each of ``limits`` (phase id -> seconds) that ``phases`` break; a phase the evidence
    cannot measure breaks its limit too. ``unreached``: phases a recovery struck while it
    restored never reached, held to no limit here."""
    out = []
    for phase_id, limit in limits.items():
        if phase_id in unreached:
            continue
        given = f"--nvrx-max-phase {phase_id}={limit:g}"
        phase = phases.get(phase_id)
        if phase is None:
            out.append(f"phase {phase_id} not measurable, limit {limit:g} s ({given}): no "
                       "recovery to measure (no fault instant)")  # fmt: skip
        elif phase.seconds is None:
            out.append(
                f"phase {phase_id} ({phase.label}) not measurable, limit {limit:g} s "
                f"({given}): {phase.missing}"
            )
        elif phase.seconds < 0:
            out.append(
                f"phase {phase_id} ({phase.label}) is {phase.seconds:.3f} s, negative, limit"
                f" {limit:g} s ({given}): the clocks disagree, nothing was measured"
            )
        elif phase.seconds > limit:
            out.append(
                f"phase {phase_id} ({phase.label}) {phase.seconds:.3f} s exceeds the limit "
                f"{limit:g} s ({given})"
            )
    return out


@dataclass(frozen=True)
class Limits:
    """The recovery-time limits fault scenarios are held to: ``--nvrx-max-downtime`` and
    ``--nvrx-max-phase`` (phase id -> seconds, the recovery report's phases)."""

    downtime_s: float | None = None
    phases: Mapping[str, float] = field(default_factory=dict)
    #: hold runs that shared a GPU to the limits anyway (--nvrx-gate-shared-gpu)
    shared_gpu: bool = False

    @property
    def given(self) -> bool:
        return self.downtime_s is not None or bool(self.phases)

    @classmethod
    def of(cls, settings: NvrxSettings) -> Limits:
        return cls(settings.max_downtime, dict(settings.max_phases or {}), settings.gate_shared_gpu)


def scenario_values(settings: NvrxSettings, scenario: Scenario) -> PartialRunConfig:
    """The RunConfig values the user set for the scenarios, over its workload's defaults."""
    return settings.overrides.over(workload_defaults(scenario.workload))


def scenario_config(
    settings: NvrxSettings,
    scenario: Scenario,
    work_dir: Path,
    environ: Mapping[str, str] | None = None,
    *,
    seed: Path | None = None,
) -> RunConfig:
    """The scenario's RunConfig: its workload's defaults, the user's settings over them
    (``seed``: a checkpoint the run starts from, a self-test's)."""
    env = os.environ if environ is None else environ
    values = scenario_values(settings, scenario)
    nnodes = values.nnodes or RunConfig.nnodes  # RunConfig's default where not given
    launcher = default_launcher(nnodes, env) if values.launcher is None else values.launcher
    # every node runs this same session: they must agree on the run ID (and so on the
    # rendezvous ID and the shared run dir); a slurm launch starts every node from here
    base = shared_run_id(nnodes, launcher, env)
    if base is not None:
        run_id = f"{base}-{scenario.id}"
    else:
        run_id = f"{scenario.id}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid() % 100000:05d}"
    values = dataclasses.replace(
        values,
        launcher=launcher,
        workload=scenario.workload,
        fault=scenario.fault,
        window=scenario.window,
        work_dir=work_dir,
        run_id=run_id,
        megatron_path=settings.megatron_path,
        selftest=scenario.selftest or None,
        plant=scenario.plant,
        seed_checkpoint=seed,
        schedule=scenario.schedule or None,
        max_restarts=(
            scenario.max_restarts if scenario.max_restarts is not None else values.max_restarts
        ),
    )
    ranks = (values.gpus_per_node or RunConfig.gpus_per_node) * nnodes
    if ranks == 1 and settings.overrides.fault_rank is None:
        # one rank in all: it is the one faulted (the default rank 1 would not exist); with
        # more, the walkthrough's rank 1 (on a multinode run, a rank of the second node)
        values = dataclasses.replace(values, fault_rank=0)
    return resolve(values, environ={})


def check_scenarios(settings: NvrxSettings, scenarios: Sequence[Scenario], work_dir: Path) -> None:
    """The walkthrough's rules between the values (:func:`pytest_nvrx.settings.validate`,
    nothing on disk read) over the RunConfig of each scenario, before any is launched: a value
    no scenario of the session can run with (``--nvrx-tp 3`` on 2 ranks, a save interval past
    the train iterations, a fault rank beyond the world) is one ConfigError, never an error per
    scenario once the session runs. It names the first scenario the value breaks and how many
    more. ``work_dir``: the scenarios' (only its form is a rule)."""
    broken: list[tuple[Scenario, ConfigError]] = []
    for scenario in scenarios:
        try:
            validate(scenario_config(settings, scenario, work_dir))
        except ConfigError as exc:
            broken.append((scenario, exc))
    if not broken:
        return
    first, error = broken[0]
    more = len(broken) - 1
    also = f" (and {more} more scenario{'' if more == 1 else 's'})" if more else ""
    raise ConfigError.naming(lambda entry: f"scenario {first.id}{also}: {error.message_for(entry)}")


class ScenarioLaunch:
    """One scenario's launch: plans it, announces it, launches it, waits for it and judges it.

    The one launch path of both ways scenarios run: one at a time, :meth:`run` (holding a lock
    per GPU the session sees); side by side, a :class:`~pytest_nvrx.session.launch_pool.LaunchPool`
    job of :class:`~pytest_nvrx.session.scenario_pool.ScenarioPool` whose ``make`` is :meth:`launch`
    (on the slot the pool took) and whose ``wait`` is :meth:`wait`. ``write`` gets the scenario's
    lines, ``progress`` (else ``write``) the periodic ones while it trains, each prefixed with the
    scenario; ``gpu_ledger`` (a pool's) learns which GPUs the run held when; ``seed`` is a
    checkpoint the run starts from (a self-test's seeded plant)."""

    def __init__(
        self,
        settings: NvrxSettings,
        scenario: Scenario,
        work_dir: Path,
        *,
        write: Callable[[str], None],
        progress: Callable[[str], None] | None = None,
        gpu_ledger: GpuLedger | None = None,
        seed: Path | None = None,
    ) -> None:
        self.settings = settings
        self.scenario = scenario
        self.work_dir = work_dir
        #: a complete checkpoint the run starts from (a self-test's seeded plant), else None
        self.seed = seed
        self._write = write
        self._progress = progress if progress is not None else write
        self._ledger = gpu_ledger
        #: the plan, once :meth:`launch` made it
        self.planned: Plan | None = None

    def say(self, text: str) -> None:
        self._write(f"nvrx {self.scenario.id}: {text}")

    def _tick(self, progress: Progress) -> None:
        self._progress(f"nvrx {self.scenario.id}: {progress.describe()}")

    @property
    def timeout_s(self) -> float:
        return scenario_timeout(self.settings, self.scenario)

    def launch(self, slot: Slot | None = None) -> Launch:
        """Plan the run (its run dir, TMPDIR and ports chosen now; on ``slot``'s GPUs, named by
        its CUDA_VISIBLE_DEVICES) and announce it: its launch, not yet started. ConfigError:
        nothing launched."""
        config = scenario_config(self.settings, self.scenario, self.work_dir, seed=self.seed)
        planned = plan_launch(config, run_timeout=self.timeout_s)
        gpus = slot.gpus if slot is not None else ()
        if slot is not None and gpus:
            env = {**planned.recipe.env, "CUDA_VISIBLE_DEVICES": slot.cuda_visible_devices}
            planned = dataclasses.replace(
                planned, recipe=dataclasses.replace(planned.recipe, env=env)
            )
        self.planned = planned
        announce_plan(planned, self.say)
        ledger = self._ledger
        if not gpus or ledger is None:
            return Launch(planned.recipe, stack=planned.manifest_stack())
        run_id = planned.recipe.config.run_id
        ledger.started(run_id, gpus)
        return Launch(
            planned.recipe,
            stack=planned.manifest_stack(),
            gpu_sharing=lambda: ledger.shared_with(run_id),
        )

    def wait(self, launch: Launch) -> LaunchOutcome:
        """Wait for the started launch (its deadline: the scenario's run timeout)."""
        try:
            return wait_launch(launch, self.timeout_s, self._tick)
        finally:
            if self._ledger is not None:
                self._ledger.ended(launch.recipe.config.run_id)

    def run(self) -> LaunchOutcome:
        """One at a time: launch and wait holding a lock per GPU this session sees, so that
        sessions on disjoint GPUs run side by side (see :func:`hold_launch`)."""
        launch = self.launch()
        return hold_launch(
            launch,
            self.wait,
            gpus=visible_gpus() if self.scenario.needs_gpu else (),
            lock_dir=lock_dir_of(self.settings.gpu_lock_dir),
        )

    def judge(
        self, outcome: LaunchOutcome, *, baselines: MutableMapping[str, RunEvidence]
    ) -> ScenarioRun:
        """Judge the run dir of what :meth:`launch` planned (see :func:`run_scenario` for
        ``baselines``)."""
        assert self.planned is not None, "launch() first"
        return judge_scenario(
            self.settings, self.scenario, self.planned, outcome, baselines=baselines, say=self.say
        )


def run_scenario(
    settings: NvrxSettings,
    scenario: Scenario,
    work_dir: Path,
    *,
    baselines: MutableMapping[str, RunEvidence],
    write: Callable[[str], None],
    progress: Callable[[str], None] | None = None,
) -> ScenarioRun:
    """Plan, launch and judge one scenario; ConfigError (nothing launched) for bad settings.

    ``baselines`` (workload -> evidence) holds the session's passed baselines: a fault
    scenario's continuity is also checked against its workload's, and a passed baseline is
    added. ``write`` gets the scenario's lines, each prefixed with the scenario; ``progress``
    (else ``write``) the periodic ones while it trains (pytest -q drops them)."""
    launch = ScenarioLaunch(settings, scenario, work_dir, write=write, progress=progress)
    return launch.judge(launch.run(), baselines=baselines)


def scenario_timeout(settings: NvrxSettings, scenario: Scenario) -> float:
    return settings.run_timeout or RUN_TIMEOUTS[scenario.workload]


def judge_scenario(
    settings: NvrxSettings,
    scenario: Scenario,
    planned: Plan,
    outcome: LaunchOutcome,
    *,
    baselines: MutableMapping[str, RunEvidence],
    say: Callable[[str], None],
) -> ScenarioRun:
    """Judge a launched scenario's run dir (see :func:`run_scenario` for ``baselines``)."""
    layout = planned.recipe.layout
    claims.release(layout)  # a pool's launch (not hold_launch's): the tree is gone
    if outcome.result is not None:
        say(f"launcher exit {outcome.result.exit_code} after {outcome.result.wall_s:.1f}s")
    full = full_disk_note([layout.run_dir, layout.checkpoint_dir])
    if full is not None:
        say(full)
    # a node > 0 of a run started node by node has its own result file (node 0's may be due)
    node = planned.recipe.config.node_index
    evidence = load_run(layout.run_dir, layout.checkpoint_dir, node_index=node)
    reference = baselines.get(scenario.workload) if scenario.fault != "none" else None
    judgement = judge(
        evidence, scenario.fault, baseline=reference, continuity_rtol=settings.continuity_rtol
    )
    if judgement.first_cause is not None:
        # the workers died before the fault: say so before any derived verdict
        say(judgement.first_cause.text)
    if scenario.fault == "none" and judgement.passed:
        baselines[scenario.workload] = evidence
    if reference is not None and judgement.baseline_dir is not None:
        say(f"continuity also checked against {reference.run_dir.name}")
    elif reference is not None:
        # judge() refused it (criteria/baseline.py): continuity rests on the replay alone
        why = judgement.baseline_refused
        say(f"continuity not checked against {reference.run_dir.name}: {why}")
    return ScenarioRun(
        key=scenario.id,
        scenario=scenario,
        layout=layout,
        judgement=judgement,
        result=outcome.result,
        stack=planned.manifest_stack() or {},
        error=outcome.timed_out,
        evidence=evidence,
    )


def judge_existing(
    run_dir: Path, settings: NvrxSettings, write: Callable[[str], None]
) -> ScenarioRun:
    """An existing run directory (--nvrx-run-dir) judged as it is. Raises RunDirError if it
    is not one."""
    evidence = load_run(run_dir)
    judgement = judge(evidence, continuity_rtol=settings.continuity_rtol)
    if judgement.first_cause is not None:
        write(f"nvrx {EXISTING_RUN}: {judgement.first_cause.text}")
    return ScenarioRun(
        key=EXISTING_RUN,
        scenario=None,
        layout=RunLayout.for_run(run_dir, judgement.checkpoint_dir),
        judgement=judgement,
        stack=judgement.stack,
        evidence=evidence,
    )
