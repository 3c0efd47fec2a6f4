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
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pytest_nvrx.layout import PHASE_IDS, FaultKind, RunLayout, window_allowed, windows_of

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


# --------------------------------------------------------------------------------------------
# The settings table: every setting declared once. The plugin's --nvrx-* options and nvrx_* ini
# values (plugin.py), the arguments of ``python -m pytest_nvrx run`` (cli.py), the parsers and
# walkthrough variables of :func:`resolve`, the scenarios' per-workload defaults and the options
# table of docs/options.md (:func:`options_table`) are all generated from it.

#: The plugin's environment variables for the matrix and the windows (no walkthrough names).
MATRIX_ENV = "NVRX_FAULT_MATRIX"
WINDOW_ENV = "NVRX_FAULT_WINDOW"
MATRICES = ("default", "full")


def parse_matrix(raw: str, what: str) -> str:
    """``default`` or ``full``; errors name ``what`` (the option, variable or ini value)."""
    text = raw.strip()
    if text not in MATRICES:
        raise ConfigError(
            f"{what} must be one of {', '.join(MATRICES)} (default: every fault and every window "
            f"at least once; full: every fault in every window), got {quote(raw)}"
        )
    return text


def parse_windows(raw: str, what: str) -> tuple[FaultWindow, ...]:
    """A comma-separated list of windows, e.g. ``save,finalize`` (repeats dropped)."""
    names = [part.strip() for part in raw.split(",")]
    bad = [name for name in names if name not in FAULT_WINDOW_KINDS]
    if not raw.strip() or bad:
        shown = f"{quote(bad[0])} in {quote(raw)}" if bad and bad[0] != raw else quote(raw)
        raise ConfigError(
            f"{what} must be one or more of {', '.join(FAULT_WINDOW_KINDS)}, separated by "
            f"commas (e.g. save,finalize), got {shown}"
        )
    return tuple(cast(FaultWindow, name) for name in dict.fromkeys(names))


def _one_workload(raw: str, what: str) -> tuple[str, ...]:
    if raw not in WORKLOAD_KINDS:
        raise ConfigError(f"{what}: must be one of {', '.join(WORKLOAD_KINDS)}, got {raw!r}")
    return (raw,)


def _megatron_checkout(raw: str, what: str) -> Path:
    path = _path(raw, what).resolve()
    if not (path / "pretrain_gpt.py").is_file():
        raise ConfigError(
            f"{what}: pretrain_gpt.py not found in {path}; point it at a Megatron-LM checkout"
        )
    return path


def _absolute_dir(raw: str, what: str) -> Path:
    path = _path(raw, what)
    if not path.is_absolute():
        raise ConfigError(f"{what}: must be an absolute path, got {path!r}")
    return path


def parse_parallel(raw: str, what: str) -> int | None:
    """``auto`` (None: as many as fit) or a positive number of scenarios at once."""
    if raw.strip().lower() == "auto":
        return None
    return _positive_int(raw, what)


def _existing_dir(raw: str, what: str) -> Path:
    path = Path(raw).resolve()
    if not path.is_dir():
        raise ConfigError(f"{what}: {path} is not a directory")
    return path


def parse_phase_limits(raw: str, what: str) -> dict[str, float]:
    """``PHASE=S[,PHASE=S...]``: seconds per phase of the recovery report."""
    ids = list(PHASE_IDS)
    out: dict[str, float] = {}
    for part in raw.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in ids:
            raise ConfigError(
                f"{what} must be PHASE=SECONDS[,PHASE=SECONDS...] with PHASE one of "
                f"{', '.join(ids)}; got {quote(part.strip())}"
            )
        if name in out:
            raise ConfigError(f"{what} gives phase {name} twice; give each phase one limit")
        out[name] = parse_seconds(value, f"{what} {name}")
    return out


def _section_timeouts(raw: str, what: str) -> SectionTimeouts:
    return SectionTimeouts.parse(raw)


#: Where a setting is given: the pytest plugin (``--nvrx-<name>``, ini ``nvrx_<name>``), the
#: CLI's ``run`` (``--<name>``), or both.
SettingWhere = Literal["both", "plugin", "cli"]
#: How the CLI reads a value: text parsed after argparse like an environment value (its error
#: names the option), parsed by argparse itself (``typed``: an argparse error), a path, a choice.
CliForm = Literal["text", "typed", "path", "choice"]
#: The order in which per-workload defaults are shown.
DEFAULTS_SHOWN: tuple[WorkloadKind, ...] = ("megatron", "reference")


@dataclass(frozen=True)
class Setting:
    """One setting: where it is given, how its text is read, what it means, its defaults.

    ``field`` is the RunConfig field it sets; a plugin setting without ``attr`` puts its value
    in :attr:`NvrxSettings.overrides` (the scenarios' RunConfig), one with ``attr`` sets that
    attribute of NvrxSettings. A new option is a new row (plus the attribute it sets)."""

    name: str  # the option without its prefix: --nvrx-<name>, --<name>, ini nvrx_<name>
    help: str
    field: str | None = None
    #: text (environment, ini, option) -> value; errors name the source given as second argument
    parse: Callable[[str, str], Any] = _text
    env: str | None = None
    where: SettingWhere = "both"
    choices: tuple[str, ...] = ()
    #: an option without a value; given, it sets ``flag_value``
    flag: bool = False
    flag_value: Any = True
    attr: str | None = None
    #: the plugin's parser where it checks more than the field's (a checkout, an absolute dir)
    plugin_parse: Callable[[str, str], Any] | None = None
    #: the scenarios' defaults where they are not RunConfig's (the walkthrough's)
    defaults: Mapping[WorkloadKind, Any] | None = None
    #: the plugin's help ends with ``(default: ...)``
    show_default: bool = False
    #: the default as shown, where it is not one value per workload
    default_note: str | None = None
    cli_help: str | None = None
    #: what the CLI's help shows in brackets; None: the variable and the walkthrough's default,
    #: "": nothing
    cli_note: str | None = None
    cli_form: CliForm = "text"
    cli_default: Any = None
    #: (name, help) of a second CLI flag that sets the opposite value (mutually exclusive)
    cli_off: tuple[str, str] | None = None
    #: the docs' table: what follows the option, its meaning (default: help), its default
    doc_value: str = ""
    doc: str | None = None
    doc_default: str | None = None

    @property
    def in_plugin(self) -> bool:
        return self.where != "cli"

    @property
    def in_cli(self) -> bool:
        return self.where != "plugin"

    @property
    def plugin_option(self) -> str:
        return f"--nvrx-{self.name}"

    @property
    def cli_option(self) -> str:
        return f"--{self.name}"

    @property
    def ini(self) -> str:
        """The ini name, also the plugin option's dest."""
        return "nvrx_" + self.name.replace("-", "_")

    @property
    def ini_type(self) -> Literal["string", "int", "float", "bool"]:
        """The ini value's pytest type: a native ``[tool.pytest]`` table takes ``5``, not only
        ``"5"`` (pytest 9 refuses a number for a string value)."""
        if self.flag:
            return "bool"
        if self.parse in (_positive_int, _non_negative_int):
            return "int"
        if self.parse in (parse_seconds, parse_rtol):
            return "float"
        return "string"

    @property
    def metavar(self) -> str:
        """What follows the option in ``--help`` (the docs' value, ``S`` spelled out)."""
        value = self.doc_value.replace("\\|", "|")
        return {"S": "SECONDS", "": self.name.split("-")[-1].upper()}.get(value, value)

    @property
    def cli_dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def key(self) -> str:
        """What the setting sets: its NvrxSettings attribute, else its RunConfig field."""
        return self.attr or self.field or self.name.replace("-", "_")

    def walkthrough_default(self) -> Any:
        """RunConfig's default (the walkthrough's, what the CLI uses), or the CLI's own."""
        if self.field is None:
            return self.cli_default
        return _RUN_CONFIG_DEFAULTS.get(self.field)

    def default_text(self) -> str:
        """The scenarios' default as ``--help`` and docs/options.md show it: one value, or one
        per workload where they differ (``megatron 100, reference 20``)."""
        if self.default_note is not None:
            return self.default_note
        base = self.walkthrough_default()
        defaults = self.defaults or {}
        shown = {w: _show_value(defaults.get(w, base)) for w in DEFAULTS_SHOWN}
        if len(set(shown.values())) == 1:
            return shown[DEFAULTS_SHOWN[0]]
        return ", ".join(f"{w} {v}" for w, v in shown.items())

    def plugin_help(self) -> str:
        text = self.help
        if self.show_default:
            text += f" (default: {self.default_text()})"
        if self.env and not self.flag:
            text += f" [env {self.env}]"
        return text

    def cli_help_text(self) -> str:
        text = self.cli_help or self.help
        note = self.cli_note
        if note is None:
            default = None if self.flag else self.walkthrough_default()
            parts = [part for part in (self.env, _show_value(default)) if part]
            note = ", ".join(parts)
            reference = (self.defaults or {}).get("reference")
            if self.field is not None and reference is not None and reference != default:
                # `run --workload reference` takes the plugin's reference scenario default
                note = f"{note}; reference: {_show_value(reference)}".lstrip("; ")
        return f"{text} [{note}]" if note else text

    def doc_row(self) -> str:
        option = f"`{self.plugin_option}{' ' + self.doc_value if self.doc_value else ''}`"
        env = f"`{self.env}`" if self.env else "—"
        if self.doc_default is not None:
            default = self.doc_default
        elif self.show_default or self.defaults:
            default = self.default_text()
        else:
            default = "—"
        return f"| {option} | {env} | {default} | {self.doc or self.help} |"


def _show_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, SectionTimeouts):
        return value.render()
    if isinstance(value, float):
        return format_seconds(value)
    return str(value)


_RUN_CONFIG_DEFAULTS: dict[str, Any] = {
    **{f.name: f.default for f in fields(RunConfig) if f.default is not MISSING},
    **{f.name: f.default_factory() for f in fields(RunConfig) if f.default_factory is not MISSING},
}


def _count(name: str, help: str, env: str, **more: Any) -> Setting:
    """A walkthrough integer of both entry points (``--tp``, ``TP``), its default in the help."""
    more.setdefault("parse", _positive_int)
    return Setting(
        name, help, name.replace("-", "_"), env=env, show_default=True, doc_value="N", **more
    )


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "megatron-path",
        "Megatron-LM checkout to qualify (enables the gpu scenarios)",
        "megatron_path",
        _path,
        env="MEGATRON_PATH",
        attr="megatron_path",
        plugin_parse=_megatron_checkout,
        cli_help="Megatron-LM checkout",
        cli_form="path",
        doc_value="PATH",
        doc="Megatron-LM checkout (must hold `pretrain_gpt.py`); enables the `gpu` scenarios",
    ),
    Setting(
        "work-dir",
        "absolute directory for run dirs (default: pytest's tmp dir)",
        "work_dir",
        _path,
        env="NVRX_WORK_DIR",
        attr="work_dir",
        plugin_parse=_absolute_dir,
        cli_help="absolute work directory",
        cli_form="path",
        doc_value="DIR",
        doc="absolute directory; runs go to `DIR/runs/<scenario>-<time>-<n>/` and are always kept",
        doc_default="pytest's tmp dir",
    ),
    Setting(
        "workload",
        "megatron | reference: only this workload's scenarios (default: both; "
        "megatron ones skip without a GPU and --nvrx-megatron-path)",
        parse=_one_workload,
        where="plugin",
        attr="workloads",
        doc_value="megatron\\|reference",
        doc="only this workload's scenarios",
        doc_default="both",
    ),
    Setting(
        "workload",
        "megatron (default) or the CPU reference",
        "workload",
        _choice(WORKLOAD_KINDS),
        where="cli",
        choices=WORKLOAD_KINDS,
        cli_note="",
        cli_form="choice",
    ),
    Setting(
        "matrix",
        "default | full: the fault scenarios per workload (default: every fault and every "
        "window at least once; full: every fault in every window it exists in)",
        parse=parse_matrix,
        env=MATRIX_ENV,
        where="plugin",
        attr="matrix",
        doc_value="default\\|full",
        doc="the fault scenarios per workload: `default` covers every fault and every window at "
        "least once (6 runs), `full` is every fault in every window it exists in (16 runs); see "
        "[Matrices](#matrices)",
        doc_default="`default`",
    ),
    Setting(
        "window",
        "step,save,finalize (one or more, comma-separated): every fault in these windows "
        "instead of the matrix (baselines stay)",
        parse=parse_windows,
        env=WINDOW_ENV,
        where="plugin",
        attr="windows",
        doc_value="W[,W...]",
        doc="`step`, `save`, `finalize`, comma-separated: every fault in these windows instead "
        "of the matrix (the baselines stay)",
    ),
    Setting(
        "run-id",
        "unique run ID, [A-Za-z0-9_-]+",
        "run_id",
        env="NVRX_RUN_ID",
        where="cli",
    ),
    _count("nnodes", "number of nodes", "NNODES"),
    # one GPU per Megatron scenario unless the user gives a shape (the plugin's 1-GPU matrix)
    _count(
        "gpus-per-node",
        "processes per node",
        "GPUS_PER_NODE",
        defaults={"reference": 2, "megatron": 1},
    ),
    _count(
        "tp",
        "tensor-parallel size",
        "TP",
        doc="tensor-parallel size; the world must divide by TP x PP and TP divide the 8 heads",
    ),
    _count(
        "pp",
        "pipeline-parallel size",
        "PP",
        doc="pipeline-parallel size; the world must divide by TP x PP and PP divide the 4 layers",
    ),
    # the reference's step window needs a step after its second save: > 2 x save interval
    _count("train-iters", "training iterations", "TRAIN_ITERS", defaults={"reference": 20}),
    _count(
        "save-interval",
        "checkpoint interval in iterations",
        "SAVE_INTERVAL",
        defaults={"reference": 5},
    ),
    Setting(
        "fault",
        "fault to inject",
        "fault",
        _choice(FAULT_KINDS),
        env="NVRX_DEMO_FAULT",
        where="cli",
        choices=FAULT_KINDS,
        cli_form="choice",
    ),
    Setting(
        "window",
        "where the fault lands: a training step, a save's preparation, or while its "
        "background write is finalized",
        "window",
        _choice(FAULT_WINDOW_KINDS),
        where="cli",
        choices=FAULT_WINDOW_KINDS,
        cli_note="step; ckpt-worker: finalize only; none for --fault none",
        cli_form="choice",
    ),
    _count(
        "fault-rank",
        "rank that receives the fault",
        "NVRX_FAULT_RANK",
        parse=_non_negative_int,
        defaults={"reference": 1},
        default_note="1 (0 when the run has one rank in all)",
    ),
    Setting(
        "checkpoint-dir",
        "checkpoint dir",
        "checkpoint_dir",
        _path,
        env="NVRX_CHECKPOINT_DIR",
        where="cli",
        cli_form="path",
    ),
    Setting(
        "section-timeouts",
        "NVRx section deadlines, all three names, seconds",
        "section_timeouts",
        _section_timeouts,
        # Megatron: a 30 s step deadline so that a hang is detected in ~30 s rather than 120 s
        # (measured on the H200: the first step well under that). Both: a 30 s checkpointing
        # deadline (the walkthrough's 600) for a hang while a save is prepared or finalized: a
        # hang in the save/finalize window stops the rank inside that section. Reference: 15 s,
        # still 125x its longest checkpointing section under CI load (0.12 s of 282 measured).
        defaults={
            "reference": SectionTimeouts(setup=120, step=10, checkpointing=15),
            "megatron": SectionTimeouts(setup=900, step=30, checkpointing=30),
        },
        show_default=True,
        cli_form="typed",
        doc_value="setup:S,step:S,checkpointing:S",
        doc="NVRx section deadlines (all three names, seconds)",
    ),
    Setting(
        "out-of-section-timeout",
        "seconds allowed outside sections",
        "out_of_section_timeout",
        parse_seconds,
        defaults={"reference": 60.0},
        show_default=True,
        doc_value="S",
        doc="seconds outside any section",
    ),
    Setting(
        "rdzv-endpoint",
        "rendezvous host:port for multinode runs",
        "rdzv_endpoint",
        env="RDZV_ENDPOINT",
        show_default=True,
        doc_value="H:P",
        doc="rendezvous endpoint (needed for `nnodes > 1` with the local launcher; the slurm "
        "launcher picks the first node and a free port)",
    ),
    Setting(
        "node-index",
        "this session's node in a multinode run started by hand, one session per node with the "
        "same NVRX_RUN_ID and --nvrx-rdzv-endpoint (0 hosts the rendezvous)",
        "node_index",
        _non_negative_int,
        env="NVRX_NODE_INDEX",
        cli_help="this start's node of a multinode run started by hand, 0..NNODES-1; node 0 "
        "hosts the rendezvous, each node claims and writes its own files, and nodes sharing the "
        "endpoint's host may run side by side",
        cli_note="NVRX_NODE_INDEX; unset: one start per host",
        doc_value="I",
        doc="this session's node of a multinode run started by hand, `0 <= I < NNODES`, one "
        "session per node with the same `NVRX_RUN_ID` and rendezvous endpoint (node 0 hosts the "
        "rendezvous; [slurm.md](slurm.md))",
        doc_default="unset: one node, or one start per host",
    ),
    Setting(
        "launcher",
        "local | slurm: ft_launcher started here, or one per node through srun in this "
        "allocation (or one made with salloc); default slurm when --nvrx-nnodes > 1 inside an "
        "allocation, else local",
        "launcher",
        _choice(LAUNCHER_KINDS),
        env="NVRX_LAUNCHER",
        choices=LAUNCHER_KINDS,
        cli_help="local: ft_launcher here; slurm: one per node through srun, in this allocation "
        "or one made with salloc",
        cli_note="NVRX_LAUNCHER; slurm with --nnodes > 1 inside an allocation, else local",
        cli_form="choice",
        doc_value="local\\|slurm",
        doc="`slurm`: one `ft_launcher` per node through one `srun` step, in this allocation or "
        "one made with `salloc` ([slurm.md](slurm.md))",
        doc_default="slurm when `nnodes > 1` inside an allocation (not inside a step), else local",
    ),
    Setting(
        "max-restarts",
        "launcher restarts",
        "max_restarts",
        _non_negative_int,
        where="cli",
    ),
    Setting(
        "workload-check-interval",
        "ft_launcher's workload check interval, seconds",
        "workload_check_interval",
        parse_seconds,
        where="cli",
        defaults={"reference": 1.0, "megatron": 1.0},
    ),
    Setting(
        "log-server-port",
        "ft_launcher log server port",
        parse=parse_port,
        where="cli",
        cli_note="a free one",
        cli_form="typed",
    ),
    Setting(
        "no-distributed-optimizer",
        "qualify without Megatron's --use-distributed-optimizer",
        "distributed_optimizer",
        parse_bool,
        flag=True,
        flag_value=False,
        doc="drop Megatron's `--use-distributed-optimizer` (see [gpu.md](gpu.md))",
        doc_default="off",
    ),
    Setting(
        "no-te-profile",
        "force the Megatron flags for a stack without Transformer Engine/Apex",
        "no_te_profile",
        parse_bool,
        where="cli",
        flag=True,
        cli_off=("default-profile", "force the walkthrough's flags even where TE/Apex are missing"),
    ),
    Setting(
        "run-dir",
        "judge this existing run directory instead of launching",
        parse=_existing_dir,
        where="plugin",
        attr="run_dir",
        doc_value="DIR",
    ),
    Setting(
        "run-timeout",
        "seconds before a scenario run is killed",
        parse=parse_seconds,
        where="plugin",
        attr="run_timeout",
        defaults={"reference": 600.0, "megatron": 1800.0},
        show_default=True,
        doc_value="S",
        doc="wall-clock limit of one scenario run; the whole process tree is killed after it",
    ),
    Setting(
        "keep",
        "keep the checkpoint shards too (run dirs are always kept; without it their checkpoint "
        "payload is removed, metadata and tracker stay)",
        where="plugin",
        flag=True,
        attr="keep",
        doc="keep the checkpoint shards too; without it every scenario's run dir is kept but its "
        "checkpoint payload (`*.distcp`) is removed ([Run directories after the "
        "session](#run-directories-after-the-session))",
        doc_default="off",
    ),
    Setting(
        "continuity-rtol",
        "relative tolerance of training_continuity for stacks that are not bitwise "
        "deterministic (default 0: exact)",
        parse=parse_rtol,
        where="plugin",
        attr="continuity_rtol",
        doc_value="R",
        doc="relative tolerance of `training_continuity` for stacks that are not bitwise "
        "deterministic (0 <= R < 1); reported in the verdict. A passed baseline scenario of the "
        "session is the continuity reference of the same workload's fault scenarios (every fault "
        "and window) judged after it",
        doc_default="0 (exact)",
    ),
    Setting(
        "parallel",
        "scenarios of one workload run at once: a number, or auto (GPU scenarios: as many as "
        "the visible GPUs hold, see --nvrx-gpu-share; reference: 3, or half the CPUs)",
        parse=parse_parallel,
        where="plugin",
        attr="parallel",
        doc_value="N\\|auto",
        doc="how many scenarios of one workload run at once; each GPU scenario gets GPUs of its "
        "own (`CUDA_VISIBLE_DEVICES`, one file lock per GPU slot, shared with other sessions and "
        "xdist workers), its own ports, TMPDIR and run dir. `auto`: GPU scenarios as many as the "
        "visible GPUs hold, reference scenarios 3 at once (half the CPUs on hosts with more than "
        "6) ([Scenarios side by side](#scenarios-side-by-side))",
        doc_default="auto",
    ),
    Setting(
        "gpu-share",
        "GPU scenarios that may use one GPU at once (default 1: every scenario on GPUs of its own)",
        parse=_positive_int,
        where="plugin",
        attr="gpu_share",
        doc_value="K",
        doc="how many GPU scenarios may use one GPU at once; 1 keeps scenarios on disjoint GPUs. "
        "A small GPT run leaves most of an H200 idle: 2 runs a 3-scenario 1-GPU matrix at once "
        "on a 2-GPU host",
        doc_default="1",
    ),
    Setting(
        "report",
        "write the recovery report of the session's scenarios: one offline HTML page at PATH "
        "and report.json beside it",
        parse=_path,
        where="plugin",
        attr="report",
        doc_value="PATH",
        doc="write the recovery report of the session's scenarios: one self-contained offline "
        "HTML page at `PATH` (matrix, timelines, recovery cost, loss curves) and `report.json` "
        "beside it ([report.md](report.md)); also under pytest-xdist",
    ),
    Setting(
        "max-downtime",
        "fail a fault scenario whose downtime (fault to the first step committed after the "
        "restore) exceeds S seconds, or cannot be measured (test_recovery_downtime)",
        parse=parse_seconds,
        where="plugin",
        attr="max_downtime",
        doc_value="S",
        doc="the downtime gate: each fault scenario gets a `test_recovery_downtime` test that "
        "fails when its downtime (the fault's instant to the first step committed after the "
        "restore, report.json's `downtime_s`) exceeds `S` seconds or cannot be measured; the "
        "message has the measured value, the limit and the breakdown ([Downtime "
        "gate](#downtime-gate))",
        doc_default="none (no gate)",
    ),
    Setting(
        "max-phase",
        "fail a fault scenario whose recovery phase takes longer than its limit, or cannot be "
        "measured: PHASE=S[,PHASE=S...] with PHASE detection, termination, gpu_reclaim, "
        "rendezvous, worker_start, checkpoint_load, first_step",
        parse=parse_phase_limits,
        where="plugin",
        attr="max_phases",
        doc_value="P=S[,P=S...]",
        doc="per-phase limits of the downtime gate, seconds per phase of the recovery report "
        "(`detection`, `termination`, `gpu_reclaim`, `rendezvous`, `worker_start`, "
        "`checkpoint_load`, `first_step`); a phase the evidence cannot measure fails its "
        "limit ([Downtime gate](#downtime-gate))",
        doc_default="none",
    ),
    Setting(
        "gate-shared-gpu",
        "hold scenarios that shared their GPU (--nvrx-gpu-share > 1) to --nvrx-max-downtime / "
        "--nvrx-max-phase anyway (by default refused: their timings include the other runs')",
        where="plugin",
        flag=True,
        attr="gate_shared_gpu",
        doc="hold scenarios that shared a GPU (`--nvrx-gpu-share` above 1) to the downtime gate "
        "anyway. Without it the gate refuses them: NVRx waits until the whole GPU's memory is "
        "reclaimed, the other runs' included, and the runs load each other, so their recovery "
        "timings are not the stack's ([Downtime gate](#downtime-gate))",
        doc_default="off",
    ),
    Setting(
        "dry-run",
        "print the command and stop",
        env=DRY_RUN_ENV,
        where="cli",
        flag=True,
        cli_note=f"{DRY_RUN_ENV}=1/true/yes/on",
    ),
    Setting(
        "timeout",
        "kill the run after this many seconds",
        parse=parse_seconds,
        where="cli",
        cli_form="typed",
        cli_default=3600.0,
    ),
)
PLUGIN_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.in_plugin)
CLI_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.in_cli)

#: How a text value (from the environment, an ini file or a CLI string) becomes a field value.
PARSERS: dict[str, Callable[[str, str], Any]] = {
    s.field: s.parse for s in SETTINGS if s.field is not None
}
#: The walkthrough's environment variables (and pytest-nvrx's own), by RunConfig field.
ENV_VARS: dict[str, str] = {
    s.field: s.env for s in SETTINGS if s.field is not None and s.env is not None
}


def parse_value(name: str, raw: str, source: str) -> Any:
    """Parse one text value for field ``name``; errors name the ``source`` (e.g. ``TP``)."""
    return PARSERS[name](raw, source)


def plugin_setting(key: str) -> Setting:
    """The plugin's row that sets ``key`` (a RunConfig field or an NvrxSettings attribute)."""
    for setting in PLUGIN_SETTINGS:
        if key in (setting.field, setting.attr):
            return setting
    raise KeyError(key)


def default_text(key: str) -> str:
    """A setting's default in the scenarios, as ``--help`` and docs/options.md show it."""
    return plugin_setting(key).default_text()


def scenario_defaults() -> dict[WorkloadKind, dict[str, Any]]:
    """RunConfig values a scenario of each workload uses unless the user gives them
    (option > env > ini > these)."""
    out: dict[WorkloadKind, dict[str, Any]] = {}
    for workload in cast(tuple[WorkloadKind, ...], WORKLOAD_KINDS):
        out[workload] = {
            s.field: s.defaults[workload]
            for s in SETTINGS
            if s.field is not None and s.defaults and workload in s.defaults
        }
    return out


OPTIONS_TABLE_HEAD = "| option | env | default | meaning |\n|---|---|---|---|"


def options_table() -> str:
    """docs/options.md's table of the plugin's options (tests/test_settings_table.py holds the
    committed one equal to this)."""
    return "\n".join([OPTIONS_TABLE_HEAD, *(s.doc_row() for s in PLUGIN_SETTINGS)])


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


def read_baseline(tracker: Path) -> int:
    """The tracker's iteration at start: absent → 0; empty, invalid or unreadable → ConfigError.

    Read by the core's one reader (evidence/tracker.py): only a small regular file, so a FIFO
    cannot block the run, a device or a huge file cannot fill memory, and a message quotes at
    most a short excerpt of what it holds.
    """
    # imported here: the evidence package is not needed to resolve settings otherwise
    from pytest_nvrx.evidence.refs import excerpt
    from pytest_nvrx.evidence.tracker import read_tracker

    read = read_tracker(tracker, tracker.parent)
    if not read.exists:
        return 0
    if read.iteration is not None:
        return read.iteration
    if read.refused:
        raise ConfigError(f"checkpoint tracker {tracker} is unreadable (it {read.error})")
    if read.text is None:  # an OSError, or not UTF-8 text
        raise ConfigError(f"checkpoint tracker {tracker} is unreadable: {read.error}")
    if not read.text:
        raise ConfigError(
            f"checkpoint tracker {tracker} is empty; only an absent tracker starts at iteration 0"
        )
    shown = excerpt(read.text)
    raise ConfigError(f"checkpoint tracker {tracker} does not hold an integer: {shown}")
