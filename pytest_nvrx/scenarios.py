"""Qualification scenarios (workload x fault x window), the matrices, their default settings.

No pytest here. A scenario is launched once and judged by all the criteria. Its markers are the
fault's and the window's names (``kill``, ``finalize``; ``baseline`` for no fault) plus ``gpu``
for Megatron, so marker expressions pick matrices: ``-m "gpu and finalize"``,
``-m "kill and not step"``.

Two matrices of fault scenarios, each run after the workload's baseline: the *default* one
covers every fault and every window at least once (six runs per workload); the *full* one is
every fault in every window it exists in (16 runs per workload). Selecting windows (the plugin's
``--nvrx-window``) takes every fault in those windows, whatever the matrix.

Defaults differ by workload: the Megatron ones are the walkthrough's (with a hang-friendly step
timeout); the CPU reference ones are short so that a qualification fits in minutes on 2 cores.
Both use a 30 s ``checkpointing`` deadline: a ``hang`` in the ``save`` or ``finalize`` window
stops the rank inside that section, and the deadline is what detects it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Any, cast

from pytest_nvrx.layout import INJECTED_FAULTS, FaultKind, window_allowed, windows_of
from pytest_nvrx.settings import (
    FAULT_WINDOW_KINDS,
    WORKLOAD_KINDS,
    ConfigError,
    FaultWindow,
    RunConfig,
    SectionTimeouts,
    WorkloadKind,
    format_seconds,
    quote,
)

#: The plugin's environment variables for the matrix and the windows (no walkthrough names).
MATRIX_ENV = "NVRX_FAULT_MATRIX"
WINDOW_ENV = "NVRX_FAULT_WINDOW"
MATRICES = ("default", "full")
#: Workloads in the order their scenarios run (the CPU one first: it fails fastest).
WORKLOAD_ORDER: tuple[WorkloadKind, ...] = ("reference", "megatron")


@dataclass(frozen=True)
class Scenario:
    """One run to qualify: a workload, a fault (``none`` for the baseline) and its window."""

    workload: WorkloadKind
    fault: FaultKind
    window: FaultWindow | None = None

    def __post_init__(self) -> None:
        if self.fault == "none":
            if self.window is not None:
                raise ValueError(f"a baseline scenario has no window, got {self.window!r}")
        elif self.window is None or not window_allowed(self.fault, self.window):
            raise ValueError(
                f"fault {self.fault!r} needs one of the windows {windows_of(self.fault)}, "
                f"got {self.window!r}"
            )

    @property
    def kind(self) -> str:
        """The marker name of the fault: ``baseline``, ``kill``, ``ckpt-worker``, ..."""
        return "baseline" if self.fault == "none" else self.fault

    @property
    def id(self) -> str:
        """``<workload>-<fault>-<window>``, or ``<workload>-baseline``."""
        if self.window is None:
            return f"{self.workload}-{self.kind}"
        return f"{self.workload}-{self.kind}-{self.window}"

    @property
    def needs_gpu(self) -> bool:
        return self.workload == "megatron"

    @property
    def markers(self) -> tuple[str, ...]:
        names = (self.kind,) if self.window is None else (self.kind, self.window)
        return ("gpu", *names) if self.needs_gpu else names


Pair = tuple[FaultKind, FaultWindow]

#: Every fault once and every window at least once: save (kill), finalize (hang: detected by the
#: checkpointing deadline; term: is the outstanding save honoured; ckpt-worker: the only window
#: it has), step (segv, exception).
DEFAULT_PAIRS: tuple[Pair, ...] = (
    ("kill", "save"),
    ("hang", "finalize"),
    ("term", "finalize"),
    ("segv", "step"),
    ("exception", "step"),
    ("ckpt-worker", "finalize"),
)
#: Every fault in every window it exists in.
FULL_PAIRS: tuple[Pair, ...] = tuple(
    (cast(FaultKind, fault), cast(FaultWindow, window))
    for fault in INJECTED_FAULTS
    for window in windows_of(fault)
)


def fault_pairs(matrix: str = "default", windows: Iterable[str] | None = None) -> tuple[Pair, ...]:
    """The (fault, window) pairs of ``matrix``; with ``windows``, every fault in those windows."""
    if matrix not in MATRICES:
        raise ConfigError(f"matrix must be one of {', '.join(MATRICES)}, got {quote(matrix)}")
    if windows is not None:
        chosen = set(windows)
        return tuple(pair for pair in FULL_PAIRS if pair[1] in chosen)
    return DEFAULT_PAIRS if matrix == "default" else FULL_PAIRS


def matrix_scenarios(
    matrix: str = "default",
    windows: Iterable[str] | None = None,
    workloads: Iterable[str] = WORKLOAD_KINDS,
) -> tuple[Scenario, ...]:
    """Per workload its baseline first (the continuity reference of the fault scenarios judged
    after it), then the fault scenarios of the matrix."""
    pairs = fault_pairs(matrix, windows)
    wanted = set(workloads)
    out: list[Scenario] = []
    for workload in WORKLOAD_ORDER:
        if workload in wanted:
            out.append(Scenario(workload, "none"))
            out += [Scenario(workload, fault, window) for fault, window in pairs]
    return tuple(out)


#: The default matrix of both workloads.
SCENARIOS: tuple[Scenario, ...] = matrix_scenarios("default")
#: Every scenario the plugin can run (the full matrix of both workloads).
ALL_SCENARIOS: tuple[Scenario, ...] = matrix_scenarios("full")


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


#: Settings a scenario uses unless the user gives them (option > env > ini > these).
DEFAULTS: dict[WorkloadKind, dict[str, Any]] = {
    "reference": {
        "gpus_per_node": 2,
        "fault_rank": 1,
        "train_iters": 20,  # > 2 x save_interval: the step window needs a step after save 2
        "save_interval": 5,
        # checkpointing 30 s: a hang in the save/finalize window is detected in ~30 s
        "section_timeouts": SectionTimeouts(setup=120, step=10, checkpointing=30),
        "out_of_section_timeout": 60.0,
        "workload_check_interval": 1.0,
    },
    "megatron": {
        # one GPU per scenario unless the user gives a shape (the plugin's 1-GPU matrix)
        "gpus_per_node": 1,
        # The walkthrough's values, but a 30 s step deadline so a hang is detected in ~30 s
        # rather than 120 s (measured on the H200: first step well under that), and a 30 s
        # checkpointing deadline (the walkthrough's 600) for a hang while a save is prepared or
        # finalized: the walkthrough model's saves take seconds.
        "section_timeouts": SectionTimeouts(setup=900, step=30, checkpointing=30),
        "workload_check_interval": 1.0,
    },
}


def default_text(name: str) -> str:
    """A setting's default in the scenarios, as ``--help`` and docs/options.md show it: one value,
    or one per workload where they differ (``megatron 100, reference 20``). The one place the
    plugin's help and the options table take their defaults from."""
    base = {f.name: f.default for f in fields(RunConfig) if f.default is not MISSING}
    base.update(
        {f.name: f.default_factory() for f in fields(RunConfig) if f.default_factory is not MISSING}
    )
    shown: dict[str, str] = {}
    order: tuple[WorkloadKind, ...] = ("megatron", "reference")
    for workload in order:
        value = DEFAULTS[workload].get(name, base.get(name))
        if isinstance(value, SectionTimeouts):
            text = value.render()
        elif isinstance(value, float):
            text = format_seconds(value)
        else:
            text = str(value)
        shown[workload] = text
    if name == "fault_rank":
        return "1 (0 when the run has one rank in all)"
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()))
    return ", ".join(f"{w} {v}" for w, v in shown.items())


#: Wall-clock limit of one scenario run, seconds (the tree is killed when it is exceeded).
RUN_TIMEOUTS: dict[WorkloadKind, float] = {"reference": 600.0, "megatron": 1800.0}
