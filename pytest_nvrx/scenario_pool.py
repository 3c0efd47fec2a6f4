"""Several scenarios of a session launched side by side (``--nvrx-parallel``). No pytest here.

The fixture asks for one scenario at a time; the first ask submits every scenario of that
workload the session will run, and :class:`ScenarioPool` launches as many as fit at once
(:class:`pytest_nvrx.parallel.LaunchPool`: ``--nvrx-parallel``, and GPU slots per
``--nvrx-gpu-share``). Each run is planned when its turn comes (its own run dir, TMPDIR, log
server port and rendezvous port are chosen then, moments before its launcher binds them) and
gets ``CUDA_VISIBLE_DEVICES`` naming the GPUs of its slot. Judging stays in the order pytest asks,
so a workload's baseline is judged first and is the continuity reference of its fault
scenarios, exactly as one after the other.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path

from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.gpu_slots import GpuSlots, Slot, visible_gpus
from pytest_nvrx.launch import Launch, RunTimeout
from pytest_nvrx.parallel import Job, LaunchPool
from pytest_nvrx.planning import Plan
from pytest_nvrx.scenario_run import (
    LaunchOutcome,
    ScenarioRun,
    announce_plan,
    judge_scenario,
    plan_launch,
    scenario_config,
    scenario_timeout,
    scenario_values,
)
from pytest_nvrx.scenarios import Scenario
from pytest_nvrx.settings import NvrxSettings


def scenario_gpus(settings: NvrxSettings, scenario: Scenario) -> int:
    """GPUs one launch of ``scenario`` uses on this host (0 for the CPU workload)."""
    if not scenario.needs_gpu:
        return 0
    return int(scenario_values(settings, scenario).get("gpus_per_node", 1))


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
    if int(values.get("nnodes", 1)) > 1 or values.get("node_index") is not None:
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


class GpuLedger:
    """Which runs of the pool held which GPUs when: a run's recovery timings on a GPU that
    another run held meanwhile include that run's memory (NVRx waits until the whole GPU's
    memory is reclaimed) and its load. Thread-safe: the pool's waiting threads report."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # run id -> (its GPUs, started, ended or None while it runs)
        self._held: dict[str, tuple[frozenset[str], float, float | None]] = {}

    def started(self, run_id: str, gpus: Sequence[str]) -> None:
        with self._lock:
            self._held[run_id] = (frozenset(gpus), self._clock(), None)

    def ended(self, run_id: str) -> None:
        with self._lock:
            if run_id in self._held:
                gpus, began, _ = self._held[run_id]
                self._held[run_id] = (gpus, began, self._clock())

    def shared_with(self, run_id: str) -> list[str]:
        """The other runs that held one of ``run_id``'s GPUs at some moment of its run so far."""
        with self._lock:
            if run_id not in self._held:
                return []
            gpus, began, ended = self._held[run_id]
            until = ended if ended is not None else self._clock()
            return sorted(
                other
                for other, (theirs, start, end) in self._held.items()
                if other != run_id
                and gpus & theirs
                and start <= until
                and (end is None or end >= began)
            )


class ScenarioPool:
    """Launches submitted scenarios side by side; :meth:`run` waits for one and judges it."""

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
            slots = GpuSlots(gpus, share=settings.gpu_share)
        self.pool = LaunchPool(max_parallel=max_parallel, slots=slots)
        self._scenarios: dict[str, Scenario] = {}
        self._plans: dict[str, Plan] = {}
        self.gpu_ledger = GpuLedger()

    def write(self, scenario: Scenario, text: str, *, tick: bool = False) -> None:
        # progress lines come from the pool's waiting threads too
        with self._write_lock:
            (self._progress if tick else self._write)(f"nvrx {scenario.id}: {text}")

    def __contains__(self, scenario: Scenario) -> bool:
        return scenario.id in self._scenarios

    def submit(self, scenario: Scenario, work_dir: Path) -> None:
        settings = self.settings

        def say(text: str) -> None:
            self.write(scenario, text)

        def make(slot: Slot) -> Launch:
            planned = plan_launch(scenario_config(settings, scenario, work_dir))
            if slot.gpus:
                recipe = dataclasses.replace(
                    planned.recipe,
                    env={**planned.recipe.env, "CUDA_VISIBLE_DEVICES": slot.cuda_visible_devices},
                )
                planned = dataclasses.replace(planned, recipe=recipe)
            self._plans[scenario.id] = planned
            announce_plan(planned, say)
            run_id = planned.recipe.config.run_id
            if not slot.gpus:
                return Launch(planned.recipe, stack=planned.manifest_stack())
            self.gpu_ledger.started(run_id, slot.gpus)
            return Launch(
                planned.recipe,
                stack=planned.manifest_stack(),
                gpu_sharing=lambda: self.gpu_ledger.shared_with(run_id),
            )

        timeout = scenario_timeout(settings, scenario)

        def wait(launch: Launch) -> LaunchOutcome:
            try:
                return LaunchOutcome(
                    launch.wait(
                        timeout, on_progress=lambda p: self.write(scenario, p.describe(), tick=True)
                    )
                )
            except RunTimeout as exc:
                return LaunchOutcome(None, str(exc))
            finally:
                self.gpu_ledger.ended(launch.recipe.config.run_id)

        self._scenarios[scenario.id] = scenario
        self.pool.submit(Job(scenario.id, scenario_gpus(settings, scenario), make, wait))

    def run(
        self, scenario: Scenario, *, baselines: MutableMapping[str, RunEvidence]
    ) -> ScenarioRun:
        """Wait for ``scenario``'s launch (running the others meanwhile) and judge it. What
        planning or starting it raised (a ConfigError: nothing launched) is raised here."""
        outcome = self.pool.wait_for(scenario.id)
        if outcome.launch is None:
            assert outcome.error is not None
            raise outcome.error
        if outcome.error is not None:
            raise outcome.error
        launched = outcome.result
        assert isinstance(launched, LaunchOutcome)
        planned = self._plans[scenario.id]
        return judge_scenario(
            self.settings,
            scenario,
            planned,
            launched,
            baselines=baselines,
            say=lambda text: self.write(scenario, text),
        )

    def stop(self) -> None:
        """Stop whatever still runs (the session ends early: -x, Ctrl-C)."""
        self.pool.stop_all()
