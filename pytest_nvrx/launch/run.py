"""The generic launch path, shared by ``python -m pytest_nvrx run`` and every scenario: plan
(validate, claim and create the run dirs, build the recipe), launch the process tree, wait for it
and give its claims back. No judging here (verify, a scenario's judge) and no pytest.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_nvrx.evidence.progress import Progress
from pytest_nvrx.launch import claims
from pytest_nvrx.launch.launcher import Launch, LaunchOutcome, hold_launch, wait_launch
from pytest_nvrx.launch.planning import Plan, plan_run
from pytest_nvrx.launch.prepare_megatron import Preparation, ensure_prepared
from pytest_nvrx.launch.run_dir_setup import validate_run
from pytest_nvrx.settings import ConfigError, RunConfig, check_run_timeout, quote
from pytest_nvrx.worker.plant_hook.nvrx_plants import PLANT_ENV


def find_launcher() -> str:
    """ft_launcher of the interpreter running us (its workers use the same Python)."""
    beside = Path(sys.executable).parent / "ft_launcher"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("ft_launcher")
    if found is None:
        raise ConfigError(
            "ft_launcher not found beside the interpreter or on PATH; install "
            "nvidia-resiliency-ext 0.7.x into this environment"
        )
    return found


def refuse_stray_plant(config: RunConfig, environ: Mapping[str, str]) -> None:
    """A run that plants nothing refuses to start where the environment names a plant: its
    workers would inherit it, and a planted run must never pass for a qualification run."""
    stray = environ.get(PLANT_ENV)
    if config.plant is None and stray:
        raise ConfigError(
            f"{PLANT_ENV}={quote(stray)} is set in this environment: the workers would run with a"
            " planted recovery bug, and a planted run is never a qualification; unset it (python"
            " -m pytest_nvrx selftest plants its bugs on purpose)"
        )


def prepare_megatron(config: RunConfig) -> Preparation | None:
    """A Megatron run's checkout made ready for its first use: what Megatron builds there at
    first use (its dataset helpers) built once, under a lock every session shares
    (:mod:`pytest_nvrx.launch.prepare_megatron`; done once per process). ConfigError: it cannot
    be."""
    if config.workload != "megatron" or config.megatron_path is None:
        return None
    return ensure_prepared(config.megatron_path, who=f"run {config.run_id}")


def plan_launch(
    config: RunConfig,
    *,
    dry_run: bool = False,
    port: int | None = None,
    run_timeout: float | None = None,
) -> Plan:
    """Validate, claim and create the run dirs, build the recipe (nothing launched). A dry run
    writes nothing (no claim, no directory, no build), probes no stack and names ``ft_launcher``
    without looking for it. ``run_timeout``: the seconds the launch will be given; a run that
    cannot detect and recover from its faults in that time is refused
    (settings/feasibility.py).

    Before the run dir is made, a Megatron checkout is made ready for its first use
    (:func:`prepare_megatron`): the plan's ``first_use`` says what was done.

    The run dir and the checkpoint dir (one run at a time) are claimed as one
    (:mod:`pytest_nvrx.launch.claims`): checked before anything is built or made, so a refused
    run writes nothing, then claimed; a plan that fails afterwards gives both back,
    :func:`hold_launch` frees the checkpoint dir at the launch's end."""
    validate_run(config)
    if run_timeout is not None:
        check_run_timeout(config, run_timeout)
    refuse_stray_plant(config, os.environ)
    claims.check(config)
    if dry_run:
        # what the run would be refused for, and its command; nothing written (the
        # walkthrough's script makes the run dir first: then verify called it no run dir)
        return plan_run(config, launcher_exe="ft_launcher", port=port, probe=False)
    first_use = prepare_megatron(config)
    claims.claim(config)
    try:
        planned = plan_run(config, launcher_exe=find_launcher(), port=port, probe=True)
        return dataclasses.replace(planned, first_use=first_use)
    except BaseException:
        claims.give_back(config)
        raise


def launch_run(
    planned: Plan,
    timeout_s: float,
    *,
    on_progress: Callable[[Progress], None] | None = None,
    on_start: Callable[[Launch], None] | None = None,
    gpus: Sequence[str] = (),
) -> LaunchOutcome:
    """Launch the planned recipe and wait for it (holding a lock per GPU in ``gpus``): ``python -m
    pytest_nvrx run``'s launch (a scenario's is
    :class:`~pytest_nvrx.session.scenario_run.ScenarioLaunch`)."""
    launch = Launch(planned.recipe, stack=planned.manifest_stack())
    wait = functools.partial(wait_launch, timeout_s=timeout_s, on_progress=on_progress)
    return hold_launch(launch, wait, gpus=gpus, on_start=on_start)


def announce_plan(planned: Plan, say: Callable[[str], None]) -> None:
    """The stack, the plan's notes and the run dir, before the launch."""
    if planned.stack is not None:
        # "nvrx <scenario>: stack: ...", not "nvrx <scenario>: nvrx stack: ..."
        from pytest_nvrx.megatron.stack import format_stack_line

        say(format_stack_line(planned.stack).removeprefix("nvrx "))
    for note in planned.notes:
        say(f"note: {note}")
    gpus = planned.recipe.env.get("CUDA_VISIBLE_DEVICES")
    on = f" on GPU {gpus}" if gpus is not None else ""
    say(f"launching in {planned.recipe.layout.run_dir}{on}")
