"""Resolution: explicit values (CLI options, pytest options) > walkthrough environment >
defaults; the plugin's resolved settings; the run ID and launcher when none is given."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_nvrx.settings.compare_gate import GateRule
from pytest_nvrx.settings.record import (
    WORKLOAD_KINDS,
    LauncherKind,
    PartialRunConfig,
    RunConfig,
)
from pytest_nvrx.settings.schedule import ScheduledFault
from pytest_nvrx.settings.setting import Setting
from pytest_nvrx.settings.table import ENV_VARS, PLUGIN_SETTINGS, option_hint, parse_value
from pytest_nvrx.settings.values import ConfigError, parse_bool


@dataclass(slots=True)
class NvrxSettings:
    """The plugin's resolved settings: the scenarios' RunConfig overrides and the session's own.

    Each attribute is a row's ``attr`` (slots: a row naming an attribute that is not here fails
    at once)."""

    #: the RunConfig values the user set for the scenarios
    overrides: PartialRunConfig = field(default_factory=PartialRunConfig)
    workloads: tuple[str, ...] = WORKLOAD_KINDS
    matrix: str = "default"
    #: None: the matrix decides; else every fault in these windows
    windows: tuple[str, ...] | None = None
    megatron_path: Path | None = None
    work_dir: Path | None = None
    run_dir: Path | None = None
    run_timeout: float | None = None
    keep: bool = False
    continuity_rtol: float = 0.0
    #: scenarios of one workload at once; None: auto
    parallel: int | None = None
    gpu_share: int = 1
    #: where the GPU locks go; None: launch/gpu_slots.py's LOCK_DIR (/tmp)
    gpu_lock_dir: Path | None = None
    #: the HTML report's path (its report.json beside it, named after it: a.html -> a.json)
    report: Path | None = None
    #: the downtime gate's limit, seconds
    max_downtime: float | None = None
    #: the downtime gate's limits per recovery phase, seconds
    max_phases: dict[str, float] | None = None
    #: hold runs that shared a GPU to the gate anyway
    gate_shared_gpu: bool = False
    #: an earlier qualification's report.json to compare the session with, and the gate on it
    compare: Path | None = None
    compare_fail: tuple[GateRule, ...] = ()
    #: also run the self-test of each selected workload (test_plant_caught)
    selftest: bool = False
    #: the fault-schedule scenarios: "default", "none", or one schedule
    schedules: str | tuple[ScheduledFault, ...] = "default"


@dataclass(frozen=True, slots=True)
class SessionPaths:
    """What a pytest session writes of ours and what it judges, that the one is kept off the
    other (session/output_paths.py): the report as given (relative to where pytest was
    invoked; its JSON beside it, with ``compare`` the comparison's JSON too), --nvrx-run-dir
    (likewise), the work dir (its runs/ holds the scenarios' run dirs) and the run dirs judged.
    Here, not beside that check: the plugin builds one in every session, and session/ loads
    only where pytest-nvrx is used."""

    report: Path | None
    run_dir: Path | None = None
    work_dir: Path | None = None
    judged: Sequence[Path] = ()
    compare: bool = False

    @classmethod
    def of(cls, settings: NvrxSettings) -> SessionPaths:
        """Those the settings name (the run dirs judged are known only at the session's end)."""
        return cls(
            settings.report,
            settings.run_dir,
            settings.work_dir,
            compare=settings.compare is not None,
        )

    def empty(self) -> bool:
        """No output of ours and no evidence (nothing to keep pytest's outputs off)."""
        return (
            self.report is None
            and self.run_dir is None
            and self.work_dir is None
            and not self.judged
        )


#: Where a plugin setting was found: (raw value, source for messages), or None where not given.
Lookup = Callable[[Setting], "tuple[Any, str] | None"]


def resolve_plugin_settings(lookup: Lookup, environ: Mapping[str, str] | None) -> NvrxSettings:
    """Read and parse every plugin setting through ``lookup`` (option > env > ini); ConfigError
    names the source. ``environ`` None: the environment is not consulted (nor the launcher's
    default derived from it)."""
    resolved = NvrxSettings()
    overrides: dict[str, object] = {}
    for setting in PLUGIN_SETTINGS:
        found = lookup(setting)
        if found is None:
            continue
        raw, source = found
        value: Any
        if setting.flag:
            given = raw if isinstance(raw, bool) else parse_bool(str(raw), source)
            if not given:
                continue
            value = setting.flag_value
        else:
            value = (setting.plugin_parse or setting.parse)(str(raw), source)
        if setting.attr is not None:
            setattr(resolved, setting.attr, value)
        elif setting.field is not None:
            overrides[setting.field] = value
    resolved.overrides = PartialRunConfig.of(overrides)
    if environ is not None and resolved.overrides.launcher is None:
        # a multinode session inside an allocation launches through srun (the CLI's rule)
        nnodes = resolved.overrides.nnodes or RunConfig.nnodes  # RunConfig's default
        if default_launcher(nnodes, environ) == "slurm":
            resolved.overrides = replace(resolved.overrides, launcher="slurm")
    return resolved


def default_run_id(now: float | None = None, pid: int | None = None) -> str:
    """The walkthrough's single-node default: UTC timestamp and process ID."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{os.getpid() if pid is None else pid}"


def in_slurm_allocation(environ: Mapping[str, str]) -> bool:
    """Inside a Slurm allocation (a batch script, an salloc shell), not inside one of its steps:
    a step's tasks are the per-node processes themselves and must not srun again."""
    return environ.get("SLURM_JOB_ID", "") != "" and environ.get("SLURM_STEP_ID", "") == ""


def default_launcher(nnodes: int, environ: Mapping[str, str]) -> LauncherKind:
    """slurm for a multinode run inside an allocation, else local."""
    return "slurm" if nnodes > 1 and in_slurm_allocation(environ) else "local"


def shared_run_id(
    nnodes: int, launcher: str, environ: Mapping[str, str], given: str | None = None
) -> str | None:
    """The run ID every node of a run started node by node must share: ``given``
    (--run-id), else NVRX_RUN_ID, else the Slurm job's ID; ConfigError when there is none.
    None where one start launches every node (one node, or the slurm launcher) and a fresh ID
    will do. The CLI (resolve) and the plugin (one run ID per scenario) both ask this."""
    if nnodes <= 1 or launcher == "slurm":
        return given
    base = given or environ.get("NVRX_RUN_ID", "") or environ.get("SLURM_JOB_ID", "")
    if not base:
        raise ConfigError.naming(
            lambda entry: (
                "a multinode run needs the same run ID on all nodes: set "
                f"{option_hint('run-id', entry)} (or run inside a Slurm job, whose SLURM_JOB_ID is "
                "used)"
            )
        )
    return base


def resolve(
    explicit: PartialRunConfig,
    environ: Mapping[str, str] | None = None,
) -> RunConfig:
    """Build a RunConfig: ``explicit`` values win over the walkthrough's environment variables.

    Environment values are parsed and their errors name the variable. Only the shape of the
    values is checked here; :func:`pytest_nvrx.settings.validate` checks the rules between them
    and :func:`pytest_nvrx.launch.run_dir_setup.check_run_paths` the file system.
    """
    env = os.environ if environ is None else environ
    given = explicit.given()
    from_env = {
        name: parse_value(name, env[var], f"environment variable {var}")
        for name, var in ENV_VARS.items()
        if name not in given and env.get(var, "") != ""
    }
    values = explicit.over(PartialRunConfig.of(from_env))
    if values.work_dir is None:
        raise ConfigError.naming(
            lambda entry: f"no work directory: pass {option_hint('work-dir', entry)}"
        )
    nnodes = values.nnodes or RunConfig.nnodes  # RunConfig's default where not given
    launcher = default_launcher(nnodes, env) if values.launcher is None else values.launcher
    run_id = values.run_id
    if run_id is None:
        run_id = shared_run_id(nnodes, launcher, env) or default_run_id()
    return replace(values, launcher=launcher).config(values.work_dir, run_id)
