"""Typed run configuration: resolution (options > walkthrough env > defaults) and validation.

Pure data plus checks. Validation never writes anything: every rule of the NVRx GPT walkthrough
is checked before a directory is created or a process is launched, so a refused run leaves the
user's file system exactly as it was.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pytest_nvrx.layout import FaultKind, RunLayout, window_allowed, windows_of

#: Where the fault lands (layout.FAULT_WINDOWS): a step, a save's preparation, its finalization.
FaultWindow = Literal["step", "save", "finalize"]
WorkloadKind = Literal["megatron", "reference"]
#: How the run's ft_launchers start: one here (local; on several nodes the user starts one per
#: node), or one per node through ``srun`` inside a Slurm allocation (slurm).
LauncherKind = Literal["local", "slurm"]
LAUNCHER_KINDS: tuple[str, ...] = get_args(LauncherKind)
#: The rendezvous endpoint when none is given; with the slurm launcher on several nodes it means
#: "choose one at launch" (the allocation's first node and a free port there).
DEFAULT_RDZV_ENDPOINT = "localhost:0"
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
FAULT_WINDOW_KINDS: tuple[str, ...] = get_args(FaultWindow)
#: The window when none is given (the injector's --window default), for faults that have it.
DEFAULT_WINDOW: FaultWindow = "step"
#: The reference workload's async-writer option; fault ckpt-worker needs its persistent worker
#: process (the recipe adds ``--async-writer=process``).
REFERENCE_ASYNC_WRITER_FLAG = "--async-writer"
#: The reference workload's option to run without NVRx sections (the injector then watches the
#: tracker instead of the section probes).
REFERENCE_NO_FT_FLAG = "--no-ft"
WORKLOAD_KINDS: tuple[str, ...] = get_args(WorkloadKind)

#: The walkthrough model: four layers, eight attention heads.
MODEL_LAYERS = 4
MODEL_HEADS = 8
SECTION_NAMES = ("setup", "step", "checkpointing")
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
#: The run ID names the run's directory: one path component.
RUN_ID_MAX = 255

#: Integers go to ft_launcher, torch and Megatron, which hold them in 64 bits.
INT64_MAX = 2**63 - 1
#: Seconds that still fit in 64-bit nanoseconds (threading.TIMEOUT_MAX, time.sleep).
MAX_SECONDS = INT64_MAX // 10**9
#: Linux limits: a whole path (with its NUL), one path component.
PATH_MAX = 4096
NAME_MAX = 255
#: Bytes kept free below PATH_MAX for what a run writes inside its run and checkpoint dirs
#: (``iter_0000005/__0_0.distcp``, ``logs/train_cycle12.log``, ``.run.json.<pid>.tmp``).
ARTIFACT_ROOM = 256
#: No message quotes more than this many characters of a value the user gave.
QUOTE_MAX = 80

#: File systems that hold no files of ours: mkdir there fails or, worse, does something else
#: (a directory in a cgroup file system is a new cgroup).
PSEUDO_FILE_SYSTEMS = frozenset(
    {
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "proc",
        "pstore",
        "rpc_pipefs",
        "securityfs",
        "selinuxfs",
        "sysfs",
        "tracefs",
    }
)
MOUNTS_FILE = Path("/proc/self/mounts")

#: Workload arguments the recipe sets itself, with the option that sets each. An extra argument
#: may not override one: the injector watches the recipe's tracker and the criteria judge the
#: recipe's values, so ``-- --save=/elsewhere`` would make a run that injects nothing.
RECIPE_OWNED_ARGS: dict[str, tuple[str, str]] = {
    "--save": ("--save", "--checkpoint-dir (NVRX_CHECKPOINT_DIR)"),
    "--load": ("--load", "--checkpoint-dir (NVRX_CHECKPOINT_DIR)"),
    "--save-interval": ("--save-interval", "--save-interval (SAVE_INTERVAL)"),
    # Megatron's alias of --save-interval
    "--persistent-save-interval": ("--save-interval", "--save-interval (SAVE_INTERVAL)"),
    "--train-iters": ("--train-iters", "--train-iters (TRAIN_ITERS)"),
    "--tensor-model-parallel-size": ("--tensor-model-parallel-size", "--tp (TP)"),
    # Megatron's deprecated spelling, still copied into the tensor-parallel size
    "--model-parallel-size": ("--tensor-model-parallel-size", "--tp (TP)"),
    "--pipeline-model-parallel-size": ("--pipeline-model-parallel-size", "--pp (PP)"),
}

#: The one reading of a boolean text value (environment variables, ini values).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


class ConfigError(ValueError):
    """A setting is invalid; the message says which one and how to fix it."""


def quote(text: str, limit: int = QUOTE_MAX) -> str:
    """``repr(text)``, cut to ``limit`` characters: no message echoes a huge value back."""
    shown = repr(text)
    if len(shown) <= limit:
        return shown
    return f"{shown[: limit - 3]}... ({len(text)} characters)"


def show_path(path: Path | str, limit: int = 200) -> str:
    """A path for a message: whole when reasonable, else its start and end and its length."""
    text = str(path)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-limit // 4 :]} ({len(os.fsencode(text))} bytes)"


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
                    f"section timeouts {quote(text)}: expected name:seconds pairs for "
                    f"{', '.join(SECTION_NAMES)}, e.g. setup:900,step:120,checkpointing:600"
                )
            if name in values:
                raise ConfigError(f"section timeouts {quote(text)}: {name!r} given twice")
            values[name] = parse_seconds(raw, f"section timeout {name!r}")
        missing = [n for n in SECTION_NAMES if n not in values]
        if missing:
            raise ConfigError(f"section timeouts {quote(text)}: missing {', '.join(missing)}")
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
    #: The fault's window; None = the fault's default (step; finalize for ckpt-worker) on a fault
    #: run, no window on a baseline (see :attr:`fault_window`). One with fault none is an error.
    window: FaultWindow | None = None
    fault_rank: int = 1
    checkpoint_dir: Path | None = None
    rdzv_endpoint: str = DEFAULT_RDZV_ENDPOINT
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
    #: local: ft_launcher started here; slurm: one per node through srun (pytest_nvrx.launch)
    launcher: LauncherKind = "local"
    #: This launch's node of a multinode run started by hand (one CLI start per node, several
    #: maybe on one host): 0 hosts the rendezvous. None: the node is not named (one node, a
    #: Slurm launch, or per-host starts as before: claim by host name, NVRx guesses the host).
    node_index: int | None = None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def fault_window(self) -> FaultWindow | None:
        """The window the injector is given: None for a baseline, else the chosen one or the
        fault's default (step; finalize for ckpt-worker, its only window)."""
        if self.window is not None or self.fault == "none":
            return self.window
        windows = windows_of(self.fault)
        if DEFAULT_WINDOW in windows or not windows:
            return DEFAULT_WINDOW
        return cast(FaultWindow, windows[0])

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
        # the window in force (the injector's), null for a baseline: what the evidence reads
        out["window"] = self.fault_window
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
    # not the walkthrough's: pytest-nvrx's own
    "launcher": "NVRX_LAUNCHER",
    "node_index": "NVRX_NODE_INDEX",
}
DRY_RUN_ENV = "NVRX_DRY_RUN"


def _int64(raw: str, what: str, pattern: str, kind: str) -> int:
    """ASCII digits only; the length is checked before ``int()`` (which refuses over 4300
    digits with a ValueError) so a 5000-digit value is a ConfigError like any other."""
    text = raw.strip()
    if not re.fullmatch(pattern, text):
        raise ConfigError(f"{what} must be a {kind} integer, got {quote(raw)}")
    if len(text) > len(str(INT64_MAX)) or int(text) > INT64_MAX:
        raise ConfigError(f"{what} must be at most {INT64_MAX} (64 bits), got {quote(raw)}")
    return int(text)


def _positive_int(raw: str, what: str) -> int:
    return _int64(raw, what, r"[1-9][0-9]*", "positive")


def _non_negative_int(raw: str, what: str) -> int:
    return _int64(raw, what, r"0|[1-9][0-9]*", "non-negative")


def parse_seconds(raw: str, what: str) -> float:
    """A positive, finite number of seconds that fits in 64-bit nanoseconds."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{what} must be a positive number of seconds, got {quote(raw)}")
    if value > MAX_SECONDS:
        raise ConfigError(
            f"{what} must be at most {MAX_SECONDS} seconds (64-bit nanoseconds), got {quote(raw)}"
        )
    return value


def parse_rtol(raw: str, what: str) -> float:
    """A relative tolerance 0 <= rtol < 1 (0: exact), or a ConfigError naming ``what``."""
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{what}: {quote(raw)} is not a number") from None
    if not 0.0 <= value < 1.0:  # also rejects nan
        raise ConfigError(f"{what}: {quote(raw)}: need 0 <= rtol < 1 (0 means exact)")
    return value


def argparse_type(parse: Callable[[str, str], Any], option: str) -> Callable[[str], Any]:
    """An argparse ``type`` from one of these parsers: one parser for every entry point, its
    error an argparse error (exit 2 before anything is done)."""

    def convert(text: str) -> Any:
        try:
            return parse(text, option)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def parse_port(raw: str, what: str) -> int:
    """A TCP port we connect to or listen on: 1-65535 (0 would be a random one)."""
    text = raw.strip()
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 65535:
        raise ConfigError(f"{what} must be a port number from 1 to 65535, got {quote(raw)}")
    return int(text)


def check_port(port: int, what: str) -> int:
    """:func:`parse_port` for a value that is already an int (API callers)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        if isinstance(port, int) and abs(port) <= INT64_MAX:
            shown = str(port)
        else:  # str() of a huge int raises ValueError (over 4300 digits)
            shown = "an integer beyond 64 bits" if isinstance(port, int) else quote(repr(port))
        raise ConfigError(f"{what} must be a port number from 1 to 65535, got {shown}")
    return port


def format_seconds(value: float) -> str:
    """Seconds as the launcher CLI takes them: ``180`` for whole numbers, else ``2.5``."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(raw: str, what: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{what} must be one of {', '.join(choices)}, got {quote(raw)}")
        return raw

    return parse


def _path(raw: str, what: str) -> Path:
    if not raw:
        raise ConfigError(f"{what} must not be empty")
    return Path(raw)


def _text(raw: str, what: str) -> str:
    return raw


def parse_bool(raw: str, what: str) -> bool:
    """The one boolean parser: 1/true/yes/on, 0/false/no/off or empty (any case, spaces
    ignored); anything else is an error that names ``what`` (e.g. the variable)."""
    lowered = raw.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ConfigError(
        f"{what} must be one of {'/'.join(TRUE_WORDS)} (true) or "
        f"{'/'.join(FALSE_WORDS[:-1])} or empty (false), got {quote(raw)}"
    )


def env_flag(environ: Mapping[str, str], var: str) -> bool:
    """A boolean environment variable, unset = false; errors name the variable."""
    return parse_bool(environ.get(var, ""), f"environment variable {var}")


def dry_run_requested(environ: Mapping[str, str]) -> bool:
    """``NVRX_DRY_RUN``: true/yes/on/1 ask for a dry run, like ``--dry-run``."""
    return env_flag(environ, DRY_RUN_ENV)


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
    "window": _choice(FAULT_WINDOW_KINDS),
    "fault_rank": _non_negative_int,
    "checkpoint_dir": _path,
    "rdzv_endpoint": _text,
    "section_timeouts": lambda raw, what: SectionTimeouts.parse(raw),
    "out_of_section_timeout": parse_seconds,
    "max_restarts": _non_negative_int,
    "workload_check_interval": parse_seconds,
    "distributed_optimizer": parse_bool,
    "no_te_profile": parse_bool,
    "launcher": _choice(LAUNCHER_KINDS),
    "node_index": _non_negative_int,
}


def parse_value(name: str, raw: str, source: str) -> Any:
    """Parse one text value for field ``name``; errors name the ``source`` (e.g. ``TP``)."""
    return PARSERS[name](raw, source)


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


# --------------------------------------------------------------------------------------------
# Validation (no writes)


def validate(config: RunConfig) -> None:
    """Check every rule of the walkthrough; raise ConfigError with a fix-it message.

    Reads the file system (stat, access, the mount table) but never writes: every reason a
    later ``mkdir`` or the launch would fail is found here, so a refused run leaves no trace.
    """
    for name in ("nnodes", "gpus_per_node", "tp", "pp", "train_iters", "save_interval"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {quote(repr(value))}")
        if value > INT64_MAX:
            raise ConfigError(f"{name} must be at most {INT64_MAX} (64 bits)")
    for name in ("max_restarts", "fault_rank"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{name} must be >= 0, got {quote(repr(value))}")
        if value > INT64_MAX:
            raise ConfigError(f"{name} must be at most {INT64_MAX} (64 bits)")
    if config.fault not in FAULT_KINDS:
        raise ConfigError(
            f"fault must be one of {', '.join(FAULT_KINDS)}, got {quote(repr(config.fault))}"
        )
    if config.workload not in WORKLOAD_KINDS:
        raise ConfigError(
            f"workload must be one of {', '.join(WORKLOAD_KINDS)}, "
            f"got {quote(repr(config.workload))}"
        )
    check_window(config.fault, config.window)
    if config.launcher not in LAUNCHER_KINDS:
        raise ConfigError(
            f"launcher must be one of {', '.join(LAUNCHER_KINDS)}, "
            f"got {quote(repr(config.launcher))}"
        )
    check_node_index(config)
    seconds = {
        "out-of-section timeout": config.out_of_section_timeout,
        "workload check interval": config.workload_check_interval,
        **{f"section timeout {n!r}": getattr(config.section_timeouts, n) for n in SECTION_NAMES},
    }
    for what, value in seconds.items():
        if value is not None and not (0 < value <= MAX_SECONDS):  # also refuses nan
            raise ConfigError(
                f"{what} must be a positive number of seconds (at most {MAX_SECONDS}), "
                f"got {value!r}"
            )

    world = config.world_size
    if world > INT64_MAX:
        raise ConfigError(
            f"world size (nnodes {config.nnodes} x gpus per node {config.gpus_per_node}) is "
            f"beyond 64 bits; give the real number of nodes and processes per node"
        )
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
    if config.fault != "none" and config.save_interval >= config.train_iters:
        raise ConfigError(
            f"save interval {config.save_interval} >= train iterations {config.train_iters}: "
            f"no checkpoint is saved before training ends, so the {config.fault} fault would "
            "never be injected; use a save interval below the train iterations "
            f"(e.g. --save-interval {max(1, config.train_iters // 2)}, SAVE_INTERVAL) or more "
            "train iterations"
        )
    if (
        config.workload == "reference"
        and config.fault_window == "step"
        and config.train_iters <= 2 * config.save_interval
        and REFERENCE_NO_FT_FLAG not in config.extra_args
    ):
        # The reference finalizes save N (its tracker moves to N) only when it saves again, at
        # N + interval or at the end: with no step after that, a step fault has no step to land
        # in. (Without NVRx sections, --no-ft, the injector falls back to watching the tracker.)
        raise ConfigError(
            f"window step on the reference workload needs a training step after its tracker "
            f"first moves, which happens at its second save: train iterations "
            f"{config.train_iters} <= 2 x save interval {config.save_interval}; use more than "
            f"{2 * config.save_interval} train iterations (--train-iters, TRAIN_ITERS), a smaller "
            "save interval, or --window save/finalize"
        )

    if not config.work_dir.is_absolute():
        raise ConfigError(f"work dir must be an absolute path, got {quote(str(config.work_dir))}")
    if config.checkpoint_dir is not None and not config.checkpoint_dir.is_absolute():
        raise ConfigError(
            f"checkpoint dir must be an absolute path, got {quote(str(config.checkpoint_dir))}"
        )
    if not RUN_ID_PATTERN.fullmatch(config.run_id):
        raise ConfigError(
            f"run ID {quote(config.run_id)}: use only letters, digits, underscores or hyphens"
        )
    if len(config.run_id) > RUN_ID_MAX:
        raise ConfigError(
            f"run ID {quote(config.run_id)} names a directory: use at most {RUN_ID_MAX} "
            f"characters, not {len(config.run_id)}"
        )
    if not (config.launcher == "slurm" and config.rdzv_endpoint == DEFAULT_RDZV_ENDPOINT):
        # with slurm and no endpoint given, the launch chooses one in the allocation
        check_rdzv_endpoint(config.rdzv_endpoint, config.nnodes)
    check_extra_args(config.extra_args)
    if config.workload == "reference" and config.fault == "ckpt-worker":
        for arg in config.extra_args:
            if arg.partition("=")[0] == REFERENCE_ASYNC_WRITER_FLAG:
                raise ConfigError(
                    f"extra argument {quote(arg)}: fault ckpt-worker kills the reference "
                    f"workload's persistent checkpoint worker, so the recipe sets "
                    f"{REFERENCE_ASYNC_WRITER_FLAG}=process itself; drop the argument"
                )

    if config.workload == "megatron":
        if config.megatron_path is None:
            raise ConfigError(
                "the megatron workload needs a Megatron-LM checkout: set MEGATRON_PATH or pass "
                "--megatron-path (or use --workload reference on a machine without GPUs)"
            )
        megatron = config.megatron_path
        if not megatron.is_absolute():
            raise ConfigError(
                f"Megatron path must be an absolute path, got {quote(str(megatron))} (with a "
                f"relative one the workers fail after starting); use "
                f"{show_path(_absolute(megatron))}"
            )
        _check_path_length(megatron, "Megatron path")
        if not _is_regular_file(megatron / "pretrain_gpt.py"):
            raise ConfigError(f"pretrain_gpt.py not found in Megatron path {show_path(megatron)}")

    layout = config.layout
    _check_writable_dir(config.work_dir, "work dir", "pass another --work-dir (NVRX_WORK_DIR)")
    _check_writable_dir(layout.run_dir, "run dir", "use another run ID or work dir")
    _check_writable_dir(
        layout.checkpoint_dir,
        "checkpoint dir",
        "pass another --checkpoint-dir (NVRX_CHECKPOINT_DIR)",
    )
    if _lexists(layout.marker):
        raise ConfigError(
            f"run ID {config.run_id!r} already has an injection marker ({layout.marker}); "
            "use a new run ID"
        )
    if _lexists(layout.ft_state):
        raise ConfigError(
            f"checkpoint dir {layout.checkpoint_dir} holds a calculated {layout.ft_state.name}; "
            "the fixed-timeout recipe needs a directory without it (archive it deliberately)"
        )
    read_baseline(layout.tracker)


_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")


def check_node_index(config: RunConfig) -> None:
    """A by-hand node's index: below NNODES, and only where each node is started by hand."""
    index = config.node_index
    if index is None:
        return
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ConfigError(f"node index must be >= 0, got {quote(repr(index))}")
    if index >= config.nnodes:
        raise ConfigError(
            f"node index {index} is not below NNODES {config.nnodes}: number the nodes "
            f"0..{config.nnodes - 1} (node 0 hosts the rendezvous)"
        )
    if config.launcher == "slurm":
        raise ConfigError(
            "node index is for nodes started one by one (launcher local); the slurm launcher "
            "starts and numbers every node itself: drop --node-index / NVRX_NODE_INDEX"
        )


def check_rdzv_endpoint(endpoint: str, nnodes: int) -> None:
    """``host:port`` as torch's c10d rendezvous reads it; several nodes need a real port.

    One node may keep torch's forms (empty, a host alone, port 0: any free port); every node of
    a multinode run must reach the same explicit ``host:port``.
    """
    multinode = nnodes > 1
    if multinode and endpoint in ("", DEFAULT_RDZV_ENDPOINT):
        raise ConfigError(
            "a multinode run needs a rendezvous endpoint reachable from all nodes: "
            "set RDZV_ENDPOINT=host:port, or launch through Slurm (--launcher slurm, "
            "NVRX_LAUNCHER=slurm), which chooses one"
        )
    if not multinode and endpoint == "":
        return
    host, sep, port = endpoint.rpartition(":")
    if not sep and not multinode:
        host, port = endpoint, "0"
    if not (_HOST.fullmatch(host) and re.fullmatch(r"[0-9]{1,5}", port)):
        raise ConfigError(
            f"rendezvous endpoint {quote(endpoint)} is not host:port (a host name or IPv4 "
            "address, or an IPv6 address in brackets: [addr]:port), e.g. RDZV_ENDPOINT="
            "node001:29400"
        )
    lowest = 1 if multinode else 0
    if not lowest <= int(port) <= 65535:
        why = " for a multinode run (every node must find the same port)" if multinode else ""
        raise ConfigError(
            f"rendezvous endpoint {quote(endpoint)}: the port must be from {lowest} to 65535{why}"
        )


def check_window(fault: str, window: str | None) -> None:
    """A window only on a fault run, a known one, and one the fault exists in."""
    if window is None:
        return
    if window not in FAULT_WINDOW_KINDS:
        raise ConfigError(
            f"window must be one of {', '.join(FAULT_WINDOW_KINDS)}, got {quote(repr(window))}"
        )
    if fault == "none":
        raise ConfigError(
            f"window {window} given for fault none: a baseline injects nothing, so it has no "
            "window; drop --window or choose a fault (--fault, NVRX_DEMO_FAULT)"
        )
    if not window_allowed(fault, window):
        allowed = windows_of(fault)
        raise ConfigError(
            f"fault {fault} is injected only in window {' or '.join(allowed)}, not {window}"
            + (
                " (it kills the persistent checkpoint worker while a save is in flight)"
                if fault == "ckpt-worker"
                else ""
            )
            + f"; use --window {allowed[0]}"
        )


def check_extra_args(extra_args: Sequence[str]) -> None:
    """Extra workload arguments may add to the recipe but not override what it sets."""
    for arg in extra_args:
        flag = arg.partition("=")[0]
        if flag in RECIPE_OWNED_ARGS:
            owned, option = RECIPE_OWNED_ARGS[flag]
            raise ConfigError(
                f"extra argument {quote(arg)} overrides the recipe's {owned} (the fault "
                f"injector and the criteria follow the recipe's value); set it with {option} "
                "instead"
            )


# --------------------------------------------------------------------------------------------
# The file system, read only: what a later mkdir or write would fail on


def _absolute(path: Path) -> Path:
    try:
        return Path(os.path.abspath(path))
    except OSError:  # the current directory is gone
        return path


def _lexists(path: Path) -> bool:
    """Whether anything (a dangling link too) is at ``path``; unreadable counts as present."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except (OSError, ValueError):
        return True
    return True


def _is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _check_path_length(path: Path, what: str, room: int = 0) -> None:
    size = len(os.fsencode(path))
    if size + room >= PATH_MAX:
        limit = PATH_MAX - 1 - room
        raise ConfigError(
            f"{what} {show_path(path)} is too long: {size} bytes, at most {limit} allowed "
            f"(PATH_MAX {PATH_MAX}{', less room for the files of a run' if room else ''}): "
            "use a shorter path"
        )
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ConfigError(
                f"{what} {show_path(path)} has a path component of {len(os.fsencode(part))} "
                f"bytes; each must be at most {NAME_MAX} bytes: use shorter names"
            )


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "of another kind"


def _unescape_mount_field(text: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def file_system_at(path: str, mounts: str) -> tuple[str, str] | None:
    """(mount point, file system type) of the mount that holds ``path`` (absolute, resolved),
    from the text of ``/proc/self/mounts``; the last of equal mount points wins (it is on top)."""
    best: tuple[str, str] | None = None
    for line in mounts.splitlines():
        fields_ = line.split()
        if len(fields_) < 3:
            continue
        point, fs_type = _unescape_mount_field(fields_[1]), fields_[2]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fs_type)
    return best


def _pseudo_file_system(path: Path) -> tuple[str, str] | None:
    """The pseudo file system (mount point, type) holding ``path``, if it is on one."""
    real = os.path.realpath(path)
    try:
        with open(MOUNTS_FILE, encoding="utf-8", errors="replace") as fh:
            mounts = fh.read(1 << 20)
    except OSError:
        mounts = ""
    found = file_system_at(real, mounts)
    if found is None:  # no mount table: the usual places
        for point, fs_type in (("/dev/shm", ""), ("/proc", "proc"), ("/sys", "sysfs")):
            if real == point or real.startswith(point + "/"):
                return (point, fs_type) if fs_type else None
        if real == "/dev" or real.startswith("/dev/"):
            return ("/dev", "devtmpfs")
        return None
    return found if found[1] in PSEUDO_FILE_SYSTEMS else None


def _check_writable_dir(path: Path, what: str, fix: str) -> None:
    """``path`` is a directory we write into, or one ``mkdir -p`` will create: refuse now what
    would make that fail (a file in the way, a link loop or dangling link, a path too long, a
    pseudo file system, no write permission, a read-only or immutable directory)."""
    _check_path_length(path, what, ARTIFACT_ROOM)
    shown = show_path(path)
    existing = path
    while True:
        try:
            st = os.stat(existing)
            break
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(existing):
                raise ConfigError(
                    f"{what} {shown}: {show_path(existing)} is a dangling symbolic link; "
                    f"remove it or {fix}"
                ) from None
            if existing == existing.parent:
                raise ConfigError(f"{what} {shown}: the file system root is missing") from None
            existing = existing.parent
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ConfigError(
                    f"{what} {shown} runs into a symbolic link loop (too many levels of "
                    f"symbolic links); {fix}"
                ) from None
            raise ConfigError(f"{what} {shown}: {exc.strerror or exc}; {fix}") from None
        except ValueError as exc:  # an embedded NUL
            raise ConfigError(f"{what} {quote(str(path))}: {exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        where = "" if existing == path else f": {show_path(existing)}"
        raise ConfigError(f"{what} {shown}{where} is {_kind(st.st_mode)}, not a directory; {fix}")
    pseudo = _pseudo_file_system(existing)
    if pseudo is not None:
        point, fs_type = pseudo
        raise ConfigError(
            f"{what} {shown} is on a {fs_type} pseudo file system (mounted at {point}), which "
            f"holds no files of a run; {fix}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        action = "write in it" if existing == path else f"create it in {show_path(existing)}"
        raise ConfigError(
            f"{what} {shown}: cannot {action}: not writable (permissions, a read-only file "
            f"system or the immutable attribute); {fix}"
        )


#: A tracker holds one iteration number; a larger file is not read (nor echoed).
TRACKER_MAX_BYTES = 4096


def read_baseline(tracker: Path) -> int:
    """The tracker's iteration at start: absent → 0; empty, invalid or unreadable → ConfigError.

    Only a small regular file is read: a FIFO would block the run forever, a device or a huge
    file would fill memory, and a message quotes at most a short excerpt of what it holds.
    """
    if not tracker.exists() and not tracker.is_symlink():
        return 0
    # imported here: the evidence package is not needed to resolve settings otherwise
    from pytest_nvrx.evidence.refs import FileTooLarge, excerpt, file_refusal, read_capped

    why = file_refusal(tracker)
    if why is not None:
        raise ConfigError(f"checkpoint tracker {tracker} is unreadable (it {why})")
    try:
        text = read_capped(tracker, TRACKER_MAX_BYTES).decode("utf-8")
    except FileTooLarge as exc:
        raise ConfigError(
            f"checkpoint tracker {tracker} is unreadable (it is {exc.size} bytes; a tracker holds"
            " one iteration number)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"checkpoint tracker {tracker} is unreadable: {exc}") from None
    stripped = text.strip()
    if not stripped:
        raise ConfigError(
            f"checkpoint tracker {tracker} is empty; only an absent tracker starts at iteration 0"
        )
    if not re.fullmatch(r"[0-9]+", stripped):
        raise ConfigError(
            f"checkpoint tracker {tracker} does not hold an integer: {excerpt(stripped)}"
        )
    return int(stripped)


def with_overrides(config: RunConfig, **changes: Any) -> RunConfig:
    """A copy with some fields changed (typed helper for fixtures and tests)."""
    return replace(config, **changes)


def coerce_fault(value: str) -> FaultKind:
    if value not in FAULT_KINDS:
        raise ConfigError(f"fault must be one of {', '.join(FAULT_KINDS)}, got {value!r}")
    return cast(FaultKind, value)


def coerce_window(value: str) -> FaultWindow:
    if value not in FAULT_WINDOW_KINDS:
        raise ConfigError(f"window must be one of {', '.join(FAULT_WINDOW_KINDS)}, got {value!r}")
    return cast(FaultWindow, value)
