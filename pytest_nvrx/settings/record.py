"""The run record: what one recovery run is (RunConfig, SectionTimeouts), the values a user gave
for one (PartialRunConfig), and its kinds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pytest_nvrx.layout import RUNS_DIR, FaultKind, FaultWindow, RunLayout, windows_of
from pytest_nvrx.settings.schedule import ScheduledFault, render_schedule
from pytest_nvrx.settings.values import ConfigError, format_seconds, named_seconds, quote

WorkloadKind = Literal["megatron", "reference"]
#: How the run's ft_launchers start: one here (local; on several nodes the user starts one per
#: node), or one per node through ``srun`` inside a Slurm allocation (slurm).
LauncherKind = Literal["local", "slurm"]
LAUNCHER_KINDS: tuple[str, ...] = get_args(LauncherKind)
#: The rendezvous endpoint when none is given; with the slurm launcher on several nodes it means
#: "choose one at launch" (the allocation's first node and a free port there).
DEFAULT_RDZV_ENDPOINT = "localhost:0"
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
#: The window when none is given (the injector's --window default), for faults that have it.
DEFAULT_WINDOW: FaultWindow = "step"
#: The reference workload's async-writer option; fault ckpt-worker needs its persistent worker
#: process (the recipe adds ``--async-writer=process``).
REFERENCE_ASYNC_WRITER_FLAG = "--async-writer"
#: The reference workload's option to run without NVRx sections (the injector then watches the
#: tracker instead of the section probes).
REFERENCE_NO_FT_FLAG = "--no-ft"
WORKLOAD_KINDS: tuple[str, ...] = get_args(WorkloadKind)

SECTION_NAMES = ("setup", "step", "checkpointing")


@dataclass(frozen=True)
class SectionTimeouts:
    """NVRx section deadlines in seconds, keyed by Megatron's section names."""

    setup: float = 900.0
    step: float = 120.0
    checkpointing: float = 600.0

    @classmethod
    def parse(cls, text: str) -> SectionTimeouts:
        """Parse ``setup:900,step:120,checkpointing:600`` (every section, each exactly once)."""
        values = named_seconds(
            text,
            ":",
            SECTION_NAMES,
            refused=lambda part: (
                f"section timeouts {quote(text)}: expected name:seconds pairs for "
                f"{', '.join(SECTION_NAMES)}, e.g. setup:900,step:120,checkpointing:600"
            ),
            twice=lambda name: f"section timeouts {quote(text)}: {name!r} given twice",
            what=lambda name: f"section timeout {name!r}",
        )
        missing = [n for n in SECTION_NAMES if n not in values]
        if missing:
            raise ConfigError(f"section timeouts {quote(text)}: missing {', '.join(missing)}")
        return cls(**values)

    def render(self) -> str:
        return ",".join(f"{n}:{format_seconds(getattr(self, n))}" for n in SECTION_NAMES)


#: RunConfig fields only the self-test sets (python -m pytest_nvrx selftest, --nvrx-selftest):
#: no option, variable or ini value of `run` or of the scenarios gives them.
SELFTEST_FIELDS: tuple[str, ...] = ("selftest", "plant", "seed_checkpoint")


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
    #: local: ft_launcher started here; slurm: one per node through srun
    #: (pytest_nvrx.launch.launcher, pytest_nvrx.launch.slurm)
    launcher: LauncherKind = "local"
    #: This launch's node of a multinode run started by hand (one CLI start per node, several
    #: maybe on one host): 0 hosts the rendezvous. None: the node is not named (one node, a
    #: Slurm launch, or per-host starts as before: claim by host name, NVRx guesses the host).
    node_index: int | None = None
    #: A self-test run (``python -m pytest_nvrx selftest``): the learning rate moves (warmup +
    #: decay) so that a lost scheduler state shows; never a qualification run's setting.
    selftest: bool = False
    #: The self-test's planted bug (pytest_nvrx.settings.plants) in the workers' environment; None:
    #: none.
    plant: str | None = None
    #: A complete checkpoint directory (``iter_N``) copied into the run's checkpoint dir, with a
    #: tracker naming N, before the launch: the self-test's runs that need two completed
    #: checkpoints before the fault start from the control's first one.
    seed_checkpoint: Path | None = None
    #: Several faults, one per cycle, in order (pytest_nvrx.settings.schedule): empty = the one
    #: fault of ``fault``/``window``. With a schedule, ``fault`` and ``window`` are its first
    #: fault's (:meth:`PartialRunConfig.config` sets them).
    schedule: tuple[ScheduledFault, ...] = ()

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
        return self.work_dir / RUNS_DIR / self.run_id

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
                value = [str(v) for v in value] if f.name == "schedule" else list(value)
            out[f.name] = value
        out["world_size"] = self.world_size
        out["checkpoint_dir"] = str(self.layout.checkpoint_dir)
        # the window in force (the injector's), null for a baseline: what the evidence reads
        out["window"] = self.fault_window
        return out


@dataclass(frozen=True)
class PartialRunConfig:
    """Some of a RunConfig's values: those a user, an environment or a scenario's defaults gave,
    typed as RunConfig types them; None = not given here.

    It mirrors RunConfig field for field (a dataclass cannot derive typed optional fields from
    another's); tests/settings/test_settings.py holds the two equal, names, order and types."""

    work_dir: Path | None = None
    run_id: str | None = None
    workload: WorkloadKind | None = None
    megatron_path: Path | None = None
    nnodes: int | None = None
    gpus_per_node: int | None = None
    tp: int | None = None
    pp: int | None = None
    train_iters: int | None = None
    save_interval: int | None = None
    fault: FaultKind | None = None
    window: FaultWindow | None = None
    fault_rank: int | None = None
    checkpoint_dir: Path | None = None
    rdzv_endpoint: str | None = None
    section_timeouts: SectionTimeouts | None = None
    out_of_section_timeout: float | None = None
    max_restarts: int | None = None
    workload_check_interval: float | None = None
    distributed_optimizer: bool | None = None
    no_te_profile: bool | None = None
    extra_args: tuple[str, ...] | None = None
    launcher: LauncherKind | None = None
    node_index: int | None = None
    selftest: bool | None = None
    plant: str | None = None
    seed_checkpoint: Path | None = None
    schedule: tuple[ScheduledFault, ...] | None = None

    @classmethod
    def of(cls, values: Mapping[str, object]) -> PartialRunConfig:
        """From values by RunConfig field name, as the settings table's rows name their fields
        (each value its row's parser's, of the field's type); None = not given."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        by_name: dict[str, Any] = dict(values)  # where names meet types: the table's rows
        return cls(**by_name)

    def given(self) -> dict[str, object]:
        """The values given, by field name."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None}

    def over(self, base: PartialRunConfig) -> PartialRunConfig:
        """These values where given, else ``base``'s."""
        return PartialRunConfig.of({**base.given(), **self.given()})

    def config(self, work_dir: Path, run_id: str) -> RunConfig:
        """The RunConfig of these values, RunConfig's defaults for the rest."""
        # field for field RunConfig's types (tests/settings/test_settings.py holds them equal)
        given: dict[str, Any] = self.given()
        if self.schedule:
            given.update(_schedule_first(self.schedule, self.fault, self.window))
        return RunConfig(**{**given, "work_dir": work_dir, "run_id": run_id})


def _schedule_first(
    schedule: tuple[ScheduledFault, ...], fault: str | None, window: str | None
) -> dict[str, Any]:
    """A schedule's run has its first fault's fault and window; one given besides that says
    something else is refused (which of the two was meant is not ours to guess)."""
    first = schedule[0]
    for what, given, wanted in (("fault", fault, first.fault), ("window", window, first.window)):
        if given is not None and given != wanted:
            raise ConfigError(
                f"{what} {given} was given with the fault schedule "
                f"{quote(render_schedule(schedule))}, whose first fault is {first}: give "
                "either the schedule or one fault, not both"
            )
    return {"fault": first.fault, "window": first.window}
