"""Resolution: explicit values (CLI options, pytest options) > walkthrough environment >
defaults; the plugin's resolved settings; the run ID and launcher when none is given."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pytest_nvrx.settings.record import WORKLOAD_KINDS, LauncherKind, RunConfig
from pytest_nvrx.settings.setting import Setting
from pytest_nvrx.settings.table import ENV_VARS, PLUGIN_SETTINGS, parse_value
from pytest_nvrx.settings.values import ConfigError, parse_bool


@dataclass(slots=True)
class NvrxSettings:
    """The plugin's resolved settings: the scenarios' RunConfig overrides and the session's own.

    Each attribute is a row's ``attr`` (slots: a row naming an attribute that is not here fails
    at once)."""

    overrides: dict[str, Any] = field(default_factory=dict)  # RunConfig fields the user set
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
    #: the HTML report's path (report.json beside it)
    report: Path | None = None
    #: the downtime gate's limit, seconds
    max_downtime: float | None = None
    #: the downtime gate's limits per recovery phase, seconds
    max_phases: dict[str, float] | None = None
    #: hold runs that shared a GPU to the gate anyway
    gate_shared_gpu: bool = False


#: Where a plugin setting was found: (raw value, source for messages), or None where not given.
Lookup = Callable[[Setting], "tuple[Any, str] | None"]


def resolve_plugin_settings(lookup: Lookup, environ: Mapping[str, str] | None) -> NvrxSettings:
    """Read and parse every plugin setting through ``lookup`` (option > env > ini); ConfigError
    names the source. ``environ`` None: the environment is not consulted (nor the launcher's
    default derived from it)."""
    resolved = NvrxSettings()
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
            resolved.overrides[setting.field] = value
    if environ is not None and "launcher" not in resolved.overrides:
        # a multinode session inside an allocation launches through srun (the CLI's rule)
        nnodes = int(resolved.overrides.get("nnodes", 1))
        if default_launcher(nnodes, environ) == "slurm":
            resolved.overrides["launcher"] = "slurm"
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
        raise ConfigError(
            "a multinode run needs the same run ID on all nodes: set NVRX_RUN_ID "
            "(or run inside a Slurm job, whose SLURM_JOB_ID is used)"
        )
    return base


def resolve(
    explicit: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> RunConfig:
    """Build a RunConfig: ``explicit`` values win over the walkthrough's environment variables.

    ``explicit`` holds already-typed values keyed by RunConfig field name (None = not given).
    Environment values are parsed and their errors name the variable. Only the shape of the
    values is checked here; :func:`pytest_nvrx.settings.validate` checks the rules between them
    and :func:`pytest_nvrx.run_dir.check_run_paths` the file system.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {k: v for k, v in explicit.items() if v is not None}
    for name, var in ENV_VARS.items():
        if name not in values and env.get(var, "") != "":
            values[name] = parse_value(name, env[var], f"environment variable {var}")

    if "work_dir" not in values:
        raise ConfigError("no work directory: set NVRX_WORK_DIR or pass --work-dir")
    nnodes = int(values.get("nnodes", 1))
    if "launcher" not in values:
        values["launcher"] = default_launcher(nnodes, env)
    if "run_id" not in values:
        values["run_id"] = shared_run_id(nnodes, values["launcher"], env) or default_run_id()
    if "extra_args" in values:
        values["extra_args"] = tuple(values["extra_args"])
    known = {f.name for f in fields(RunConfig)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
    return RunConfig(**values)
