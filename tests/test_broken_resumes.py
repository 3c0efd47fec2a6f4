"""Broken resumes, for real: the reference workload under the real ft_launcher and injector.

A kill run contains its own reference: the iterations between the restored checkpoint and the
fault are computed twice, by the failed cycle and by the replacement. Each scenario here is one
real kill run (2 ranks, 12 iterations, a save every 4) launched through the pipeline of
``python -m pytest_nvrx run --workload reference`` (RunConfig, prepare_run_dir, plan_run,
Launch), with ``--break-restore PART`` passed to the workload the way a user passes it (after
``--``): the replacement deliberately leaves that part of the checkpoint out. The runs are
judged as they are: no log is edited.

* unbroken: the launcher recovered, all criteria pass, every replayed value is equal;
* optimizer: the launcher recovered, ``optimizer_state_load`` fails (the load line lacks the
  optimizer), the loss of the second replayed iteration differs (the first one's loss depends
  only on the restored weights);
* rng, data: the launcher recovered, ``optimizer_state_load`` passes, the loss of the first
  replayed iteration differs (other dropout masks, other samples);
* scheduler: the same, but the learning rate of the first replayed iteration differs;
* training_continuity (issue #8) passes the unbroken run and fails every broken one.

One run per scenario, shared by its tests (module-scoped fixture), run one after the other.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.cli import find_launcher
from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.evidence import load_run
from pytest_nvrx.evidence.workload import IterationCommitted, LoadCompleted
from pytest_nvrx.launch import Launch, RunTimeout, tagged
from pytest_nvrx.layout import RESULT_NAME
from pytest_nvrx.planning import plan_run
from pytest_nvrx.run_dir import prepare_run_dir
from pytest_nvrx.settings import ConfigError, RunConfig, SectionTimeouts

TRAIN_ITERS = 12
SAVE_INTERVAL = 4
RUN_TIMEOUT_S = 360.0
# Kill faults are found by the process exit, not by a section timeout: generous timeouts cost
# nothing here and keep a loaded CI machine from turning a slow setup into a second failure.
SECTION_TIMEOUTS = SectionTimeouts(setup=180, step=60, checkpointing=120)

LAUNCHER_RECOVERED = (
    "prior_checkpoint",
    "replaced_cycle",
    "progress_past_restore",
    "no_repeat_injection",
)


@dataclass(frozen=True)
class Scenario:
    """A kill run whose replacement leaves ``broken`` out of its restore (None: nothing)."""

    broken: str | None
    differs: str | None = None  # the printed value that must show it
    offset: int = 1  # at which replayed iteration, counted from the restored one

    @property
    def id(self) -> str:
        return self.broken or "unbroken"


SCENARIOS = (
    Scenario(None),
    Scenario("optimizer", "loss", offset=2),
    Scenario("rng", "loss"),
    Scenario("data", "loss"),
    Scenario("scheduler", "learning_rate"),
)

pytestmark = pytest.mark.timeout(RUN_TIMEOUT_S + 120)


@dataclass(frozen=True)
class Resume:
    """One finished run: where it is, how it ended, its judgement and its printed values."""

    scenario: Scenario
    run_dir: Path
    exit_code: int | None
    judgement: Judgement
    restored: int  # the iteration the replacement loaded
    cycles: tuple[Mapping[int, IterationCommitted], ...]  # iteration lines by number, per cycle
    loads: tuple[LoadCompleted, ...]  # of the replacement, one per rank

    def verdicts(self) -> str:
        return "\n".join(v.render() for v in self.judgement.verdicts)

    @property
    def replayed(self) -> list[int]:
        """Iterations both the failed cycle and its replacement printed."""
        failed, replacement = self.cycles[0], self.cycles[1]
        return sorted(set(failed) & set(replacement))

    def first_difference(self) -> tuple[int, str, str, str] | None:
        """(iteration, value name, failed cycle's text, replacement's text) of the first
        replayed value printed differently; None when the replay is exact."""
        failed, replacement = self.cycles[0], self.cycles[1]
        for iteration in self.replayed:
            before, after = dict(failed[iteration].values), dict(replacement[iteration].values)
            assert before.keys() == after.keys(), (iteration, before, after)
            for name in before:
                if before[name] != after[name]:
                    return iteration, name, before[name], after[name]
        return None


def _launch(scenario: Scenario, work: Path) -> tuple[Path, int | None, float]:
    extra = ("--break-restore", scenario.broken) if scenario.broken else ()
    return launch_reference(work, f"broken-{scenario.id}", extra)


def launch_reference(
    work: Path,
    run_id: str,
    extra: tuple[str, ...],
    *,
    seed: Callable[[Path], None] | None = None,
    **overrides: Any,
) -> tuple[Path, int | None, float]:
    """One real 2-rank reference run (kill of rank 1 unless ``overrides`` say otherwise) through
    the pipeline of ``python -m pytest_nvrx run``; ``seed`` may fill the checkpoint directory
    before the launch. Returns the run dir, the launcher's exit code and its wall time."""
    settings: dict[str, Any] = {
        "train_iters": TRAIN_ITERS,
        "save_interval": SAVE_INTERVAL,
        "fault": "kill",
        "fault_rank": 1,
        "max_restarts": 2,
        **overrides,
    }
    config = RunConfig(
        work_dir=work,
        run_id=run_id,
        workload="reference",
        gpus_per_node=2,
        section_timeouts=SECTION_TIMEOUTS,
        out_of_section_timeout=120.0,
        workload_check_interval=1.0,
        extra_args=extra,
        **settings,
    )
    try:
        launcher = find_launcher()
    except ConfigError as exc:
        pytest.skip(str(exc))
    layout = prepare_run_dir(config)
    if seed is not None:
        seed(layout.checkpoint_dir)
    plan = plan_run(config, launcher_exe=launcher, probe=False)  # the stack probe costs ~6 s
    with Launch(plan.recipe) as launch:
        try:
            launch.wait(RUN_TIMEOUT_S)
        except RunTimeout as exc:
            pytest.fail(f"{run_id}: {exc}")
    # Leaving Launch killed the whole tree; nothing of the run may be left.
    assert not tagged(launch.tag), f"processes of {layout.run_dir} survived"
    result = json.loads((layout.run_dir / RESULT_NAME).read_text())
    return layout.run_dir, result["exit_code"], float(result["wall_s"])


def _by_iteration(iterations: tuple[IterationCommitted, ...]) -> dict[int, IterationCommitted]:
    return {event.iteration: event for event in iterations}


@pytest.fixture(scope="module", params=SCENARIOS, ids=lambda s: s.id)
def resume(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Resume]:
    scenario: Scenario = request.param
    work = tmp_path_factory.mktemp(f"broken-{scenario.id}")
    run_dir, exit_code, wall_s = _launch(scenario, work)
    print(f"\n{scenario.id}: launcher exit {exit_code} after {wall_s:.1f}s")  # -s shows it
    judgement = judge_run_dir(run_dir)
    run = load_run(run_dir)
    assert len(run.cycle_logs) >= 2, f"{run_dir}: no replacement cycle\n" + "\n".join(
        v.render() for v in judgement.verdicts
    )
    loads = tuple(e for e in run.cycle_logs[1].events if isinstance(e, LoadCompleted))
    assert loads, f"{run_dir}: the replacement loaded no checkpoint"
    yield Resume(
        scenario=scenario,
        run_dir=run_dir,
        exit_code=exit_code,
        judgement=judgement,
        restored=loads[0].iteration,
        cycles=tuple(_by_iteration(log.iterations) for log in run.cycle_logs),
        loads=loads,
    )


def test_the_launcher_recovered(resume: Resume) -> None:
    assert resume.exit_code == 0, resume.verdicts()
    assert resume.judgement.judgeable, resume.judgement.problems
    for criterion in LAUNCHER_RECOVERED:
        verdict = resume.judgement.verdict(criterion)
        assert verdict.passed, verdict.render()
    assert len(resume.cycles) == 2  # one failure, one replacement: nothing else went wrong
    assert max(resume.cycles[1]) == TRAIN_ITERS
    if resume.scenario.broken is None:
        assert resume.judgement.passed, resume.verdicts()


def test_the_failed_cycle_ran_past_the_restored_checkpoint(resume: Resume) -> None:
    """At least two replayed iterations: the first replayed loss depends only on the restored
    weights, so a reset optimizer shows from the second on. The tracker moves to N only when
    the save of N is finalized, at iteration N + save interval: by construction the failed
    cycle printed a whole interval past whatever the replacement restores."""
    assert resume.restored >= SAVE_INTERVAL
    assert resume.replayed == list(range(resume.restored + 1, max(resume.cycles[0]) + 1))
    assert len(resume.replayed) >= 2, (resume.restored, sorted(resume.cycles[0]))


def test_optimizer_state_load(resume: Resume) -> None:
    verdict = resume.judgement.verdict("optimizer_state_load")
    if resume.scenario.broken == "optimizer":
        assert verdict.status == "FAIL", verdict.render()
        assert f"restored iteration {resume.restored} without optimizer state" in verdict.reason
    else:
        assert verdict.passed, verdict.render()


def test_the_load_lines_say_what_was_restored(resume: Resume) -> None:
    """Every rank lists what it restored; a deliberately skipped part is named once per rank,
    and only in the replacement (cycle 0 got the same flag)."""
    parts = ("model", "optimizer", "scheduler", "rng", "data")
    expected = tuple(p for p in parts if p != resume.scenario.broken)
    ranks = [re.search(r" rank (\d+) load checkpoint ", e.ref.text) for e in resume.loads]
    assert sorted(m[1] for m in ranks if m is not None) == ["0", "1"]
    assert {e.parts for e in resume.loads} == {expected}
    logs = resume.run_dir / "logs"
    cycle0 = (logs / "train_cycle0.log").read_text()
    cycle1 = (logs / "train_cycle1.log").read_text()
    assert "restore skipped" not in cycle0
    assert "started pid" in cycle1 and " restart_count 1" in cycle1
    skipped = [line for line in cycle1.splitlines() if "restore skipped" in line]
    if resume.scenario.broken is None:
        assert skipped == []
    else:
        assert len(skipped) == 2, skipped
        assert all(
            f"restore skipped {resume.scenario.broken} of iteration {resume.restored} on purpose"
            " (--break-restore, restart_count 1)" in line
            for line in skipped
        )


def test_the_replayed_iterations_show_the_break(resume: Resume) -> None:
    first = resume.first_difference()
    scenario = resume.scenario
    if scenario.broken is None:
        assert first is None, first
        return
    assert first is not None, f"{scenario.id}: replay {resume.replayed} printed identically"
    iteration, name, before, after = first
    assert (iteration, name) == (resume.restored + scenario.offset, scenario.differs), first
    print(f"\n{scenario.id}: iteration {iteration} {name} {before} -> {after}")


def test_training_continuity_verdict(resume: Resume) -> None:
    """Issue #8's criterion on real runs: it passes the exact replay and fails each broken one
    on the line of the first replayed iteration that printed something else."""
    verdict = resume.judgement.verdict("training_continuity")
    first = resume.first_difference()
    if resume.scenario.broken is None:
        assert verdict.passed, verdict.render()
        return
    assert verdict.status == "FAIL", verdict.render()
    assert first is not None
    quoted = verdict.evidence[0]
    assert quoted.file == "logs/train_cycle1.log", verdict.render()
    assert f" iteration {first[0]}/{TRAIN_ITERS} " in quoted.text, verdict.render()
