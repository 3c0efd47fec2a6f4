"""The self-test: each planted recovery bug of the catalogue run for real and judged by the normal
criteria, after an unplanted control. No pytest here; the CLI's ``selftest`` and the plugin's
``--nvrx-selftest`` both run it.

Every run is a kill in the ``step`` window of one rank (the scenarios' fault rank), through the
real ``ft_launcher``, with the self-test's learning rate that moves. The control runs first: it must
qualify, and its first checkpoint seeds the plants that need two completed checkpoints before the
fault. The plants then run side by side (the scenario pool: ``--nvrx-parallel``, GPU slots per
``--nvrx-gpu-share``). Before anything launches, a plant that needs more ranks than the run has
is skipped, and on Megatron one whose patch points the checkout lacks is "cannot plant on this
revision".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_nvrx.criteria.selftest_outcome import (
    PlantOutcome,
    control_outcome,
    exit_status,
    plant_outcome,
)
from pytest_nvrx.evidence.plant_records import read_plant_records
from pytest_nvrx.launch.gpu_slots import visible_gpus
from pytest_nvrx.layout import iteration_dir_name
from pytest_nvrx.session.scenario_pool import ScenarioPool, parallel_limit
from pytest_nvrx.session.scenario_run import ScenarioRun, scenario_values
from pytest_nvrx.session.scenarios import Scenario
from pytest_nvrx.settings import ConfigError, NvrxSettings, RunConfig, WorkloadKind
from pytest_nvrx.settings.plants import PLANTS, Plant, missing_patch_points, plant_named
from pytest_nvrx.worker.plant_hook.nvrx_plants import complete_iterations

#: the ``--json`` document's ``schema_version`` (the key verify's and the report's JSON use); 1
#: named the key ``schema``
JSON_SCHEMA_VERSION = 2


def selftest_scenario(workload: WorkloadKind, plant: str | None) -> Scenario:
    """The self-test's run of ``plant`` (None: the control): a kill in the step window."""
    return Scenario(workload, "kill", "step", selftest=True, plant=plant)


def selftest_scenarios(
    workload: WorkloadKind, plants: Sequence[Plant] = PLANTS
) -> tuple[Scenario, ...]:
    """The control, then each plant in catalogue order."""
    return (
        selftest_scenario(workload, None),
        *(selftest_scenario(workload, p.name) for p in plants),
    )


def choose_plants(names: Sequence[str] | None) -> tuple[Plant, ...]:
    """The plants named (catalogue order, each once), or the whole catalogue; ConfigError for
    a name the catalogue lacks."""
    if not names:
        return PLANTS
    try:
        wanted = {plant_named(n).name for n in names}
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    return tuple(p for p in PLANTS if p.name in wanted)


def preflight(settings: NvrxSettings, scenario: Scenario, plant: Plant) -> PlantOutcome | None:
    """Why ``plant`` is not launched (skipped, or cannot be planted on this checkout), or None."""
    values = scenario_values(settings, scenario)
    world = (values.nnodes or RunConfig.nnodes) * (values.gpus_per_node or RunConfig.gpus_per_node)
    if world < plant.min_world:
        return PlantOutcome(
            plant,
            "skipped",
            f"skipped: {plant.title} needs {plant.min_world} ranks or more; this run has {world}",
        )
    if scenario.workload == "megatron" and settings.megatron_path is not None:
        missing = missing_patch_points(settings.megatron_path, plant)
        if missing:
            return PlantOutcome(
                plant,
                "cannot-plant",
                f"cannot plant on this revision: {settings.megatron_path} has no"
                f" {', '.join(missing)}",
            )
    return None


def first_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The oldest complete ``iter_N`` of a finished run (the seed of the seeded plants)."""
    complete = complete_iterations(str(checkpoint_dir))
    return checkpoint_dir / iteration_dir_name(complete[0]) if complete else None


@dataclass(frozen=True)
class SelftestResult:
    """The self-test of one workload: an outcome per run (the control first) and the runs."""

    workload: str
    rtol: float
    outcomes: tuple[PlantOutcome, ...]
    runs: dict[str, ScenarioRun] = field(default_factory=dict)
    stack: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_status(self) -> int:
        return exit_status(self.outcomes)

    def summary(self) -> str:
        plants = [o for o in self.outcomes if o.plant is not None]
        caught = sum(o.status == "caught" for o in plants)
        skipped = sum(o.status == "skipped" for o in plants)
        control = next((o for o in self.outcomes if o.plant is None), None)
        head = {0: "PASSED", 1: "FAILED", 2: "CANNOT TELL"}[self.exit_status]
        parts = [f"{caught} of {len(plants) - skipped} plants caught as documented"]
        if skipped:
            parts.append(f"{skipped} skipped")
        if control is not None:
            parts.append(f"control {control.status}")
        bad = [o for o in self.outcomes if not o.good]
        text = f"selftest {self.workload}: {head}: {', '.join(parts)}"
        if bad:
            text += "; " + "; ".join(f"{o.name}: {o.status}" for o in bad)
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "workload": self.workload,
            "continuity_rtol": self.rtol,
            "exit_status": self.exit_status,
            "summary": self.summary(),
            "stack": self.stack,
            "outcomes": [o.as_dict() for o in self.outcomes],
        }


def run_selftest(
    settings: NvrxSettings,
    workload: WorkloadKind,
    work_dir: Path,
    *,
    plants: Sequence[Plant] = PLANTS,
    write: Callable[[str], None],
    progress: Callable[[str], None] | None = None,
) -> SelftestResult:
    """Run the control, then the plants side by side; judge each. ConfigError (from planning
    the control): nothing launched."""
    control = selftest_scenario(workload, None)
    gpus = visible_gpus() if workload == "megatron" else ()
    planted = [(p, selftest_scenario(workload, p.name)) for p in plants]
    to_run = []
    outcomes: dict[str, PlantOutcome] = {}
    for plant, scenario in planted:
        refused = preflight(settings, scenario, plant)
        if refused is not None:
            outcomes[plant.name] = refused
            write(f"nvrx {scenario.id}: {refused.reason}")
        else:
            to_run.append((plant, scenario))
    limit = parallel_limit(settings, [control, *(s for _, s in to_run)], gpus)
    pool = ScenarioPool(settings, max_parallel=limit, write=write, gpus=gpus, progress=progress)
    runs: dict[str, ScenarioRun] = {}
    try:
        pool.submit(control, work_dir)
        control_run = pool.run(control, baselines={})
        runs[control.id] = control_run
        first = control_outcome(control_run.judgement, launch_error=control_run.error)
        write(f"nvrx {control.id}: {first.reason}")
        seed = first_checkpoint(control_run.layout.checkpoint_dir)
        for plant, scenario in to_run:
            if plant.seeded and seed is None:
                outcomes[plant.name] = PlantOutcome(
                    plant,
                    "cannot-judge",
                    f"no complete checkpoint in the control's {control_run.layout.checkpoint_dir}"
                    " to start from: the plant needs two completed before the fault",
                )
                continue
            pool.submit(scenario, work_dir, seed=seed if plant.seeded else None)
        for plant, scenario in to_run:
            if plant.name in outcomes:
                continue
            run = pool.run(scenario, baselines={})  # continuity from the run's own replay
            runs[scenario.id] = run
            records = read_plant_records(run.layout.run_dir)
            outcome = plant_outcome(plant, run.judgement, records, rtol=settings.continuity_rtol)
            outcomes[plant.name] = outcome
            write(f"nvrx {scenario.id}: {outcome.status}: {outcome.reason}")
    finally:
        pool.stop()
    ordered = (first, *(outcomes[p.name] for p in plants))
    return SelftestResult(
        workload, settings.continuity_rtol, ordered, runs, stack=control_run.stack
    )
