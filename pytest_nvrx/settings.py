"""Typed run configuration: resolution (options > walkthrough env > defaults) and validation.

Pure data plus checks. Validation never writes anything: every rule of the NVRx GPT walkthrough
is checked before a directory is created or a process is launched, so a refused run leaves the
user's file system exactly as it was.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pytest_nvrx.layout import RunLayout

FaultKind = Literal["none", "kill", "hang"]
WorkloadKind = Literal["megatron", "reference"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
WORKLOAD_KINDS: tuple[str, ...] = get_args(WorkloadKind)

#: The walkthrough model: four layers, eight attention heads.
MODEL_LAYERS = 4
MODEL_HEADS = 8
SECTION_NAMES = ("setup", "step", "checkpointing")
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigError(ValueError):
    """A setting is invalid; the message says which one and how to fix it."""


@dataclass(frozen=True)
class SectionTimeouts:
    """NVRx section deadlines in seconds, keyed by Megatron's section names."""

    setup: float = 900.0
    step: float = 120.0
    checkpointing: float = 600.0

    @classmethod
    def parse(cls, text: str) -> SectionTimeouts:
        """Parse ``setup:900,step:120,checkpointing:600`` (every section, each exactly once)."""
        values: dict[str, float] = {}
        for part in text.split(","):
            name, sep, raw = part.strip().partition(":")
            if not sep or name not in SECTION_NAMES:
                raise ConfigError(
                    f"section timeouts {text!r}: expected name:seconds pairs for "
                    f"{', '.join(SECTION_NAMES)}, e.g. setup:900,step:120,checkpointing:600"
                )
            if name in values:
                raise ConfigError(f"section timeouts {text!r}: {name!r} given twice")
            values[name] = _positive_float(raw, f"section timeout {name!r}")
        missing = [n for n in SECTION_NAMES if n not in values]
        if missing:
            raise ConfigError(f"section timeouts {text!r}: missing {', '.join(missing)}")
        return cls(**values)

    def render(self) -> str:
        return ",".join(f"{n}:{format_seconds(getattr(self, n))}" for n in SECTION_NAMES)


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one recovery run. Defaults are the walkthrough's."""

    work_dir: Path
    run_id: str
    workload: WorkloadKind = "megatron"
    megatron_path: Path | None = None
    nnodes: int = 1
    gpus_per_node: int = 2
    tp: int = 1
    pp: int = 1
    train_iters: int = 100
    save_interval: int = 5
    fault: FaultKind = "kill"
    fault_rank: int = 1
    checkpoint_dir: Path | None = None
    rdzv_endpoint: str = "localhost:0"
    section_timeouts: SectionTimeouts = field(default_factory=SectionTimeouts)
    out_of_section_timeout: float = 180.0
    max_restarts: int = 3
    #: Seconds between ft_launcher's workload checks; None keeps the launcher's default (5 s).
    workload_check_interval: float | None = None
    #: Keep Megatron's --use-distributed-optimizer (the walkthrough's default).
    distributed_optimizer: bool = True
    #: Megatron flags for a stack without Transformer Engine/Apex; None = decide from the stack.
    no_te_profile: bool | None = None
    extra_args: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def run_dir(self) -> Path:
        return self.work_dir / "runs" / self.run_id

    @property
    def layout(self) -> RunLayout:
        return RunLayout.for_run(self.run_dir, self.checkpoint_dir)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (paths as strings, timeouts in their CLI form)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, SectionTimeouts):
                value = value.render()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        out["world_size"] = self.world_size
        out["checkpoint_dir"] = str(self.layout.checkpoint_dir)
        return out


# --------------------------------------------------------------------------------------------
# Resolution: explicit values (CLI options, pytest options) > walkthrough environment > defaults


#: The walkthrough's environment variables, by RunConfig field.
ENV_VARS: dict[str, str] = {
    "megatron_path": "MEGATRON_PATH",
    "work_dir": "NVRX_WORK_DIR",
    "run_id": "NVRX_RUN_ID",
    "nnodes": "NNODES",
    "gpus_per_node": "GPUS_PER_NODE",
    "tp": "TP",
    "pp": "PP",
    "train_iters": "TRAIN_ITERS",
    "save_interval": "SAVE_INTERVAL",
    "fault": "NVRX_DEMO_FAULT",
    "fault_rank": "NVRX_FAULT_RANK",
    "checkpoint_dir": "NVRX_CHECKPOINT_DIR",
    "rdzv_endpoint": "RDZV_ENDPOINT",
}
DRY_RUN_ENV = "NVRX_DRY_RUN"


def _positive_int(raw: str, what: str) -> int:
    text = raw.strip()
    if not re.fullmatch(r"[1-9][0-9]*", text):
        raise ConfigError(f"{what} must be a positive integer, got {raw!r}")
    return int(text)


def _non_negative_int(raw: str, what: str) -> int:
    text = raw.strip()
    if not re.fullmatch(r"0|[1-9][0-9]*", text):
        raise ConfigError(f"{what} must be a non-negative integer, got {raw!r}")
    return int(text)


def _positive_float(raw: str, what: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{what} must be a positive number of seconds, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{what} must be a positive number of seconds, got {raw!r}")
    return value


def format_seconds(value: float) -> str:
    """Seconds as the launcher CLI takes them: ``180`` for whole numbers, else ``2.5``."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(raw: str, what: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{what} must be one of {', '.join(choices)}, got {raw!r}")
        return raw

    return parse


def _path(raw: str, what: str) -> Path:
    if not raw:
        raise ConfigError(f"{what} must not be empty")
    return Path(raw)


def _text(raw: str, what: str) -> str:
    return raw


def _bool(raw: str, what: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{what} must be true or false, got {raw!r}")


#: How a text value (from the environment, an ini file or a CLI string) becomes a field value.
PARSERS: dict[str, Callable[[str, str], Any]] = {
    "work_dir": _path,
    "run_id": _text,
    "workload": _choice(WORKLOAD_KINDS),
    "megatron_path": _path,
    "nnodes": _positive_int,
    "gpus_per_node": _positive_int,
    "tp": _positive_int,
    "pp": _positive_int,
    "train_iters": _positive_int,
    "save_interval": _positive_int,
    "fault": _choice(FAULT_KINDS),
    "fault_rank": _non_negative_int,
    "checkpoint_dir": _path,
    "rdzv_endpoint": _text,
    "section_timeouts": lambda raw, what: SectionTimeouts.parse(raw),
    "out_of_section_timeout": _positive_float,
    "max_restarts": _non_negative_int,
    "workload_check_interval": _positive_float,
    "distributed_optimizer": _bool,
    "no_te_profile": _bool,
}


def parse_value(name: str, raw: str, source: str) -> Any:
    """Parse one text value for field ``name``; errors name the ``source`` (e.g. ``TP``)."""
    return PARSERS[name](raw, source)


def default_run_id(now: float | None = None, pid: int | None = None) -> str:
    """The walkthrough's single-node default: UTC timestamp and process ID."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{os.getpid() if pid is None else pid}"


def resolve(
    explicit: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
) -> RunConfig:
    """Build a RunConfig: ``explicit`` values win over the walkthrough's environment variables.

    ``explicit`` holds already-typed values keyed by RunConfig field name (None = not given).
    Environment values are parsed and their errors name the variable. Only the shape of the
    values is checked here; :func:`validate` checks the rules between them and the file system.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {k: v for k, v in explicit.items() if v is not None}
    for name, var in ENV_VARS.items():
        if name not in values and env.get(var, "") != "":
            values[name] = parse_value(name, env[var], f"environment variable {var}")

    if "work_dir" not in values:
        raise ConfigError("no work directory: set NVRX_WORK_DIR or pass --work-dir")
    nnodes = int(values.get("nnodes", 1))
    if "run_id" not in values:
        if nnodes > 1:
            slurm_job = env.get("SLURM_JOB_ID", "")
            if not slurm_job:
                raise ConfigError(
                    "a multinode run needs the same run ID on all nodes: set NVRX_RUN_ID "
                    "(or run inside a Slurm job, whose SLURM_JOB_ID is used)"
                )
            values["run_id"] = slurm_job
        else:
            values["run_id"] = default_run_id()
    if "extra_args" in values:
        values["extra_args"] = tuple(values["extra_args"])
    known = {f.name for f in fields(RunConfig)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
    return RunConfig(**values)


# --------------------------------------------------------------------------------------------
# Validation (no writes)


def validate(config: RunConfig) -> None:
    """Check every rule of the walkthrough; raise ConfigError with a fix-it message."""
    for name in ("nnodes", "gpus_per_node", "tp", "pp", "train_iters", "save_interval"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if config.max_restarts < 0:
        raise ConfigError(f"max_restarts must be >= 0, got {config.max_restarts!r}")
    if config.fault not in FAULT_KINDS:
        raise ConfigError(f"fault must be one of {', '.join(FAULT_KINDS)}, got {config.fault!r}")
    if config.workload not in WORKLOAD_KINDS:
        raise ConfigError(
            f"workload must be one of {', '.join(WORKLOAD_KINDS)}, got {config.workload!r}"
        )
    if config.out_of_section_timeout <= 0:
        raise ConfigError("out-of-section timeout must be a positive number of seconds")

    world = config.world_size
    if world % (config.tp * config.pp) != 0:
        raise ConfigError(
            f"world size {world} (nnodes {config.nnodes} x gpus per node "
            f"{config.gpus_per_node}) must be divisible by TP x PP = {config.tp * config.pp}"
        )
    if MODEL_LAYERS % config.pp != 0:
        raise ConfigError(f"PP={config.pp} must divide the model's {MODEL_LAYERS} layers")
    if MODEL_HEADS % config.tp != 0:
        raise ConfigError(f"TP={config.tp} must divide the model's {MODEL_HEADS} attention heads")
    if config.fault != "none" and not 0 <= config.fault_rank < world:
        hint = " (on one GPU set the fault rank to 0)" if world == 1 else ""
        raise ConfigError(
            f"fault rank {config.fault_rank} is not a rank of a world of size {world}{hint}"
        )
    if config.workload == "reference" and world < 2:
        raise ConfigError(
            "the CPU reference workload needs at least 2 ranks: set GPUS_PER_NODE=2 "
            "(processes per node) or more"
        )

    if not config.work_dir.is_absolute():
        raise ConfigError(f"work dir must be an absolute path, got {str(config.work_dir)!r}")
    if config.checkpoint_dir is not None and not config.checkpoint_dir.is_absolute():
        raise ConfigError(
            f"checkpoint dir must be an absolute path, got {str(config.checkpoint_dir)!r}"
        )
    if not RUN_ID_PATTERN.fullmatch(config.run_id):
        raise ConfigError(
            f"run ID {config.run_id!r}: use only letters, digits, underscores or hyphens"
        )
    if config.nnodes > 1 and config.rdzv_endpoint in ("", "localhost:0"):
        raise ConfigError(
            "a multinode run needs a rendezvous endpoint reachable from all nodes: "
            "set RDZV_ENDPOINT=host:port"
        )

    if config.workload == "megatron":
        if config.megatron_path is None:
            raise ConfigError(
                "the megatron workload needs a Megatron-LM checkout: set MEGATRON_PATH or pass "
                "--megatron-path (or use --workload reference on a machine without GPUs)"
            )
        if not (config.megatron_path / "pretrain_gpt.py").is_file():
            raise ConfigError(f"pretrain_gpt.py not found in Megatron path {config.megatron_path}")

    layout = config.layout
    if layout.marker.exists() or layout.marker.is_symlink():
        raise ConfigError(
            f"run ID {config.run_id!r} already has an injection marker ({layout.marker}); "
            "use a new run ID"
        )
    if layout.ft_state.exists() or layout.ft_state.is_symlink():
        raise ConfigError(
            f"checkpoint dir {layout.checkpoint_dir} holds a calculated {layout.ft_state.name}; "
            "the fixed-timeout recipe needs a directory without it (archive it deliberately)"
        )
    read_baseline(layout.tracker)


def read_baseline(tracker: Path) -> int:
    """The tracker's iteration at start: absent → 0; empty, invalid or unreadable → ConfigError."""
    if not tracker.exists() and not tracker.is_symlink():
        return 0
    try:
        text = tracker.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"checkpoint tracker {tracker} is unreadable: {exc}") from None
    stripped = text.strip()
    if not stripped:
        raise ConfigError(
            f"checkpoint tracker {tracker} is empty; only an absent tracker starts at iteration 0"
        )
    if not re.fullmatch(r"[0-9]+", stripped):
        raise ConfigError(f"checkpoint tracker {tracker} does not hold an integer: {stripped!r}")
    return int(stripped)


def with_overrides(config: RunConfig, **changes: Any) -> RunConfig:
    """A copy with some fields changed (typed helper for fixtures and tests)."""
    return replace(config, **changes)


def coerce_fault(value: str) -> FaultKind:
    if value not in FAULT_KINDS:
        raise ConfigError(f"fault must be one of {', '.join(FAULT_KINDS)}, got {value!r}")
    return cast(FaultKind, value)
