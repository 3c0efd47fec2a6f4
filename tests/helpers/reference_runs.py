"""Real kill runs of the reference workload, for the tests that launch or read them.

``launch_reference`` starts one through the pipeline of ``python -m pytest_nvrx run --workload
reference`` (RunConfig, prepare_run_dir, plan_run, Launch); ``read_resume`` reads a finished kill
run's replay. A kill run contains its own reference: the iterations between the restored
checkpoint and the fault are computed twice, by the failed cycle and by the replacement.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.evidence import load_run
from pytest_nvrx.evidence.workload import IterationCommitted, LoadCompleted
from pytest_nvrx.launch.launcher import Launch, RunTimeout
from pytest_nvrx.launch.planning import plan_run
from pytest_nvrx.launch.process_tree import tagged
from pytest_nvrx.launch.run import find_launcher
from pytest_nvrx.launch.run_dir_setup import prepare_run_dir
from pytest_nvrx.layout import RESULT_NAME
from pytest_nvrx.settings import ConfigError, RunConfig, SectionTimeouts

TRAIN_ITERS = 12
SAVE_INTERVAL = 4
RUN_TIMEOUT_S = 360.0
# Kill faults are found by the process exit, not by a section timeout: generous timeouts cost
# nothing here and keep a loaded CI machine from turning a slow setup into a second failure.
SECTION_TIMEOUTS = SectionTimeouts(setup=180, step=60, checkpointing=120)

#: The criteria that say the launcher recovered (the others judge what the workload restored).
LAUNCHER_RECOVERED = (
    "prior_checkpoint",
    "replaced_cycle",
    "progress_past_restore",
    "no_repeat_injection",
)


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
    exit_code, wall_s = run_result(layout.run_dir)
    return layout.run_dir, exit_code, wall_s


def run_result(run_dir: Path) -> tuple[int | None, float]:
    """The launcher's exit code and wall time, from the run's result.json."""
    result = json.loads((run_dir / RESULT_NAME).read_text())
    return result["exit_code"], float(result["wall_s"])


@dataclass(frozen=True)
class Resume:
    """A finished kill run: where it is, how it ended, its judgement and its printed values."""

    run_dir: Path
    exit_code: int | None
    judgement: Judgement
    restored: int  # the iteration the replacement loaded
    cycles: tuple[Mapping[int, IterationCommitted], ...]  # iteration lines by number, per cycle
    loads: tuple[LoadCompleted, ...]  # of the replacement, one per rank

    def verdicts(self) -> str:
        return "\n".join(v.render() for v in self.judgement.verdicts)

    def assert_launcher_recovered(self, train_iters: int) -> None:
        """The launcher's part held: exit 0, judgeable, LAUNCHER_RECOVERED pass, exactly one
        failure and one replacement, which trained to ``train_iters``."""
        assert self.exit_code == 0, self.verdicts()
        assert self.judgement.judgeable, self.judgement.unjudgeable_reasons
        for criterion in LAUNCHER_RECOVERED:
            verdict = self.judgement.verdict(criterion)
            assert verdict.passed, verdict.render()
        assert len(self.cycles) == 2  # one failure, one replacement: nothing else went wrong
        assert max(self.cycles[1]) == train_iters

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


def read_resume(run_dir: Path) -> Resume:
    """The replay of the finished kill run in ``run_dir``; fails unless a replacement loaded."""
    exit_code, _ = run_result(run_dir)
    judgement = judge_run_dir(run_dir)
    run = load_run(run_dir)
    assert len(run.cycle_logs) >= 2, f"{run_dir}: no replacement cycle\n" + "\n".join(
        v.render() for v in judgement.verdicts
    )
    loads = tuple(e for e in run.cycle_logs[1].events if isinstance(e, LoadCompleted))
    assert loads, f"{run_dir}: the replacement loaded no checkpoint"
    return Resume(
        run_dir=run_dir,
        exit_code=exit_code,
        judgement=judgement,
        restored=loads[0].iteration,
        cycles=tuple({e.iteration: e for e in log.iterations} for log in run.cycle_logs),
        loads=loads,
    )
