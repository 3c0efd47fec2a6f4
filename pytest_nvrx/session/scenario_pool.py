"""Several scenarios of a session launched side by side (``--nvrx-parallel``). No pytest here.

The fixture asks for one scenario at a time; the first ask submits every scenario of that
workload the session will run, and :class:`ScenarioPool` launches as many as fit at once
(:class:`pytest_nvrx.session.launch_pool.LaunchPool`: ``--nvrx-parallel``, and GPU slots per
``--nvrx-gpu-share``). Each run is planned when its turn comes (its own run dir, TMPDIR, log
server port and rendezvous port are chosen then, moments before its launcher binds them) and
gets ``CUDA_VISIBLE_DEVICES`` naming the GPUs of its slot. Judging stays in the order pytest asks,
so a workload's baseline is judged first and is the continuity reference of its fault
scenarios, exactly as one after the other.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path

from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.launch.gpu_slots import GpuLedger, GpuSlots, lock_dir_of, visible_gpus
from pytest_nvrx.launch.launcher import LaunchOutcome
from pytest_nvrx.session.launch_pool import Job, LaunchPool
from pytest_nvrx.session.scenario_run import ScenarioLaunch, ScenarioRun, scenario_values
from pytest_nvrx.session.scenarios import Scenario
from pytest_nvrx.settings import NvrxSettings, RunConfig


def scenario_gpus(settings: NvrxSettings, scenario: Scenario) -> int:
    """GPUs one launch of ``scenario`` uses on this host (0 for the CPU workload)."""
    if not scenario.needs_gpu:
        return 0
    return scenario_values(settings, scenario).gpus_per_node or RunConfig.gpus_per_node


def parallel_limit(
    settings: NvrxSettings, scenarios: Sequence[Scenario], gpus: Sequence[str]
) -> int:
    """How many of ``scenarios`` (one workload's) may run at once: ``--nvrx-parallel`` when given,
    else for GPU scenarios what the visible GPUs hold (``--nvrx-gpu-share`` per GPU), else
    :func:`cpu_parallel`.

    A multinode run (started by hand node by node, or through Slurm) is never pooled: its other
    nodes start their launches in step with this one."""
    if not scenarios:
        return 1
    values = scenario_values(settings, scenarios[0])
    if (values.nnodes or RunConfig.nnodes) > 1 or values.node_index is not None:
        return 1
    if settings.parallel is not None:
        return settings.parallel
    need = max(scenario_gpus(settings, s) for s in scenarios)
    if need == 0:
        return cpu_parallel(os.cpu_count())
    return max(1, GpuSlots(gpus, share=settings.gpu_share).capacity(need))


def cpu_parallel(cpus: int | None) -> int:
    """Reference scenarios at once by default: 3, or half the CPUs where there are more than 6.

    A reference run mostly waits (for the launcher's monitors, detection timeouts, rendezvous):
    on the 2-core machine the default matrix (7 scenarios) took 242.2 s one after the other,
    149.5 s two at a time and 132.4 s three at a time, every criterion passing
    (docs/performance.md). More than 3 was not measured there; on larger hosts half the CPUs
    keeps each run's two ranks a core."""
    return max(3, (cpus or 1) // 2)


class ScenarioPool:
    """Launches submitted scenarios side by side; :meth:`run` waits for one and judges it. Each
    is a :class:`~pytest_nvrx.session.scenario_run.ScenarioLaunch`, the launch path of a scenario
    run one at a time too: the pool's job makes its launch on the slot it took and waits for it."""

    def __init__(
        self,
        settings: NvrxSettings,
        *,
        max_parallel: int,
        write: Callable[[str], None],
        gpus: Sequence[str] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self._write_lock = threading.Lock()
        self._write = write
        # the periodic lines while a run trains (pytest -q drops them)
        self._progress = progress if progress is not None else write
        slots = None
        if gpus is None:
            gpus = visible_gpus()
        if gpus:
            slots = GpuSlots(
                gpus, share=settings.gpu_share, lock_dir=lock_dir_of(settings.gpu_lock_dir)
            )
        self.pool: LaunchPool[LaunchOutcome] = LaunchPool(max_parallel=max_parallel, slots=slots)
        self._launches: dict[str, ScenarioLaunch] = {}
        self.gpu_ledger = GpuLedger()

    # progress lines come from the pool's waiting threads too: one line at a time
    def _write_line(self, line: str) -> None:
        with self._write_lock:
            self._write(line)

    def _progress_line(self, line: str) -> None:
        with self._write_lock:
            self._progress(line)

    def __contains__(self, scenario: Scenario) -> bool:
        return scenario.id in self._launches

    def submit(self, scenario: Scenario, work_dir: Path, *, seed: Path | None = None) -> None:
        launch = ScenarioLaunch(
            self.settings,
            scenario,
            work_dir,
            write=self._write_line,
            progress=self._progress_line,
            gpu_ledger=self.gpu_ledger,
            seed=seed,
        )
        self._launches[scenario.id] = launch
        gpus = scenario_gpus(self.settings, scenario)
        self.pool.submit(Job(scenario.id, gpus, launch.launch, launch.wait))

    def run(
        self, scenario: Scenario, *, baselines: MutableMapping[str, RunEvidence]
    ) -> ScenarioRun:
        """Wait for ``scenario``'s launch (running the others meanwhile) and judge it. What
        planning or starting it raised (a ConfigError: nothing launched) is raised here."""
        outcome = self.pool.wait_for(scenario.id)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.result is not None  # its wait() returned
        return self._launches[scenario.id].judge(outcome.result, baselines=baselines)

    def stop(self) -> None:
        """Stop whatever still runs (the session ends early: -x, Ctrl-C)."""
        self.pool.stop_all()
