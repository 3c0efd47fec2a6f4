"""Fixtures: one launched run per scenario, shared by its criteria tests. Thin glue.

The run happens in the session-scoped ``nvrx_scenario_run`` fixture (parametrized by the plugin
with ``indirect=True, scope="session"``, so pytest groups a scenario's tests and launches it
once). GPU scenarios hold a lock per GPU they see (gpu_slots), so scenarios never share a GPU
(xdist workers or sessions on one host wait), while sessions on disjoint GPUs run side by side.

A baseline scenario that passed becomes the reference of the same workload's fault scenarios
(every fault and window) judged after it in the session (training_continuity compares every
iteration after the restore with it); its parsed evidence is kept in memory. Every run dir is
kept after the session, less its checkpoint payload unless --nvrx-keep (retention).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.criteria import Judgement, judge, judge_run_dir
from pytest_nvrx.evidence.rundir import RunEvidence, load_run
from pytest_nvrx.gpu_slots import gpu_locks, visible_gpus
from pytest_nvrx.launch import (
    Launch,
    RunResult,
    RunTimeout,
    interrupt_on_stop_signals,
    tail_text,
)
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.plugin import (
    NvrxSettings,
    nvrx_settings,
    record_judged,
    terminal_writer,
)
from pytest_nvrx.recipe import prepare_run_dir
from pytest_nvrx.retention import prune_checkpoint_payload
from pytest_nvrx.scenarios import DEFAULTS, RUN_TIMEOUTS, Scenario
from pytest_nvrx.settings import (
    ConfigError,
    RunConfig,
    default_launcher,
    resolve,
    shared_run_id,
)

# workload -> the evidence of this session's passed baseline scenario
BASELINES_KEY = pytest.StashKey[dict[str, RunEvidence]]()


@dataclass
class ScenarioRun:
    """A finished (or judged existing) run and its verdicts."""

    key: str
    scenario: Scenario | None
    layout: RunLayout
    judgement: Judgement
    result: RunResult | None = None
    stack: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def junit_properties(self) -> list[tuple[str, Any]]:
        props: list[tuple[str, Any]] = [("nvrx_run_dir", str(self.layout.run_dir))]
        if self.result is not None:
            props += [
                ("nvrx_exit_code", self.result.exit_code),
                ("nvrx_wall_s", round(self.result.wall_s, 1)),
            ]
        props += [(f"nvrx_stack_{k}", v) for k, v in sorted(self.stack.items())]
        props += [(f"nvrx_timing_{k}", v) for k, v in sorted(self.judgement.timings.items())]
        return props

    def log_tails(self) -> list[tuple[str, str]]:
        logs = sorted(self.layout.logs.glob("train_cycle*.log"))
        out = []
        for path in [
            *logs[-1:],
            self.layout.launcher_log,
            self.layout.logs / "launcher.console.log",
        ]:
            if path.is_file():
                rel = path.relative_to(self.layout.run_dir)
                out.append((f"nvrx: tail of {rel}", tail_text(path, 30)))
        return out


def gpu_available() -> str | None:
    """None when an NVIDIA GPU is visible, else the reason why not."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA GPU (nvidia-smi not found)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    if out.returncode != 0 or "GPU" not in out.stdout:
        return "nvidia-smi lists no GPU"
    return None


def scenario_config(settings: NvrxSettings, scenario: Scenario, work_dir: Path) -> RunConfig:
    values: dict[str, Any] = {**DEFAULTS[scenario.workload], **settings.overrides}
    nnodes = int(values.get("nnodes", 1))
    launcher = values.get("launcher") or default_launcher(nnodes, os.environ)
    # every node runs this same session: they must agree on the run ID (and so on the
    # rendezvous ID and the shared run dir); a slurm launch starts every node from here
    base = shared_run_id(nnodes, launcher, os.environ)
    if base is not None:
        run_id = f"{base}-{scenario.id}"
    else:
        run_id = f"{scenario.id}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid() % 100000:05d}"
    values.update(
        launcher=launcher,
        workload=scenario.workload,
        fault=scenario.fault,
        window=scenario.window,
        work_dir=work_dir,
        run_id=run_id,
        megatron_path=settings.megatron_path,
    )
    if int(values.get("gpus_per_node", 1)) * nnodes == 1 and "fault_rank" not in settings.overrides:
        # one rank in all: it is the one faulted (the default rank 1 would not exist); with
        # more, the walkthrough's rank 1 (on a multinode run, a rank of the second node)
        values["fault_rank"] = 0
    return resolve(values, environ={})


def _run_scenario(
    request: pytest.FixtureRequest, settings: NvrxSettings, scenario: Scenario
) -> Iterator[ScenarioRun]:
    config = request.config
    if scenario.needs_gpu:
        if settings.megatron_path is None:
            pytest.skip("gpu scenario: give --nvrx-megatron-path (or MEGATRON_PATH)")
        reason = gpu_available()
        if reason is not None:
            # The user asked for a GPU qualification: a host that cannot run it is an error,
            # never a green "skipped" (a CI runner that lost its GPUs must go red).
            pytest.fail(
                f"pytest-nvrx: scenario {scenario.id}: a Megatron checkout was given"
                f" ({settings.megatron_path}) but this host cannot run GPU scenarios: {reason}"
                " (probed with nvidia-smi -L)",
                pytrace=False,
            )
    if settings.work_dir is not None:
        work_dir = settings.work_dir
    else:
        work_dir = request.getfixturevalue("tmp_path_factory").mktemp(f"nvrx-{scenario.id}")
    try:
        run_config = scenario_config(settings, scenario, work_dir)
        layout = prepare_run_dir(run_config)
    except ConfigError as exc:
        pytest.fail(f"pytest-nvrx: scenario {scenario.id}: {exc}", pytrace=False)

    from pytest_nvrx.cli import find_launcher
    from pytest_nvrx.planning import plan_run
    from pytest_nvrx.stack import format_stack_line

    write = terminal_writer(config)
    # SIGTERM (CI cancel, Slurm) and SIGHUP stop the session like Ctrl-C (pytest exits 2) after
    # the run's whole tree is stopped and result.json written; Ctrl-C works even where pytest was
    # started with SIGINT ignored (a background job).
    with interrupt_on_stop_signals():
        try:
            planned = plan_run(run_config, launcher_exe=find_launcher())
        except ConfigError as exc:
            pytest.fail(f"pytest-nvrx: scenario {scenario.id}: {exc}", pytrace=False)
        recipe = planned.recipe
        stack_dict: dict[str, Any] = planned.manifest_stack() or {}
        if planned.stack is not None:
            # "nvrx <scenario>: stack: ...", not "nvrx <scenario>: nvrx stack: ..."
            stack_line = format_stack_line(planned.stack).removeprefix("nvrx ")
            write(f"nvrx {scenario.id}: {stack_line}")
        for note in planned.notes:
            write(f"nvrx {scenario.id}: note: {note}")
        write(f"nvrx {scenario.id}: launching in {layout.run_dir}")
        timeout = settings.run_timeout or RUN_TIMEOUTS[scenario.workload]
        result: RunResult | None = None
        error: str | None = None
        # one lock per GPU this session sees: sessions on disjoint GPUs run side by side
        gpus = visible_gpus() if scenario.needs_gpu else []
        with gpu_locks(gpus), Launch(recipe, stack=stack_dict) as launch:
            try:
                result = launch.wait(
                    timeout, on_progress=lambda p: write(f"nvrx {scenario.id}: {p.describe()}")
                )
            except RunTimeout as exc:
                error = str(exc)
    if result is not None:
        write(f"nvrx {scenario.id}: launcher exit {result.exit_code} after {result.wall_s:.1f}s")
    evidence = load_run(layout.run_dir, layout.checkpoint_dir)
    baselines = config.stash.setdefault(BASELINES_KEY, {})
    reference = baselines.get(scenario.workload) if scenario.fault != "none" else None
    judgement = judge(
        evidence,
        scenario.fault,
        baseline=reference,
        continuity_rtol=settings.continuity_rtol,
    )
    if judgement.first_cause is not None:
        # the workers died before the fault: say so before any derived verdict
        write(f"nvrx {scenario.id}: {judgement.first_cause.text}")
    if scenario.fault == "none" and judgement.passed:
        baselines[scenario.workload] = evidence
    if reference is not None:
        write(f"nvrx {scenario.id}: continuity also checked against {reference.run_dir.name}")
    run = ScenarioRun(
        key=scenario.id,
        scenario=scenario,
        layout=layout,
        judgement=judgement,
        result=result,
        stack=stack_dict,
        error=error,
    )
    record_judged(config, run)
    yield run
    # Passed or failed, the run dir stays: the summary and JUnit name it and every verdict
    # quotes lines in it. Only checkpoint payload goes, and only from the directory we made
    # under pytest's tmp; --nvrx-keep keeps it, a user's --nvrx-work-dir is left as it is.
    if not settings.keep and settings.work_dir is None:
        pruned = prune_checkpoint_payload(layout, owned_root=work_dir)
        write(f"nvrx {scenario.id}: {pruned.describe()} (--nvrx-keep keeps everything)")


@pytest.fixture(scope="session")
def nvrx_scenario_run(request: pytest.FixtureRequest) -> Iterator[ScenarioRun]:
    """The scenario's run, launched once and judged; shared by all its criteria tests."""
    settings = nvrx_settings(request.config)
    scenario: Scenario | None = request.param
    if scenario is None:
        assert settings.run_dir is not None
        judgement = judge_run_dir(
            settings.run_dir, None, expect_fault=None, continuity_rtol=settings.continuity_rtol
        )
        layout = RunLayout.for_run(settings.run_dir, judgement.checkpoint_dir)
        if judgement.first_cause is not None:
            terminal_writer(request.config)(f"nvrx existing-run: {judgement.first_cause.text}")
        run = ScenarioRun(
            key="existing-run",
            scenario=None,
            layout=layout,
            judgement=judgement,
            stack=judgement.stack,
        )
        record_judged(request.config, run)
        yield run
        return
    yield from _run_scenario(request, settings, scenario)
