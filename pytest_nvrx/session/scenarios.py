"""Qualification scenarios (workload x fault x window), the matrices, their default settings.

No pytest here. A scenario is launched once and judged by all the criteria. Its markers are the
fault's and the window's names (``kill``, ``finalize``; ``baseline`` for no fault) plus ``gpu``
for Megatron, so marker expressions pick matrices: ``-m "gpu and finalize"``,
``-m "kill and not step"``.

Two matrices of fault scenarios, each run after the workload's baseline: the *default* one
covers every fault and every window at least once (six runs per workload); the *full* one is
every fault in every window it exists in (16 runs per workload). Selecting windows (the plugin's
``--nvrx-window``) takes every fault in those windows, whatever the matrix.

Defaults differ by workload (declared in the settings table, pytest_nvrx.settings.SETTINGS): the
Megatron ones are the walkthrough's (with a hang-friendly step timeout); the CPU reference ones
are short so that a qualification fits in minutes on 2 cores. Both use a 30 s ``checkpointing``
deadline: a ``hang`` in the ``save`` or ``finalize`` window stops the rank inside that section,
and the deadline is what detects it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from pytest_nvrx.layout import (
    INJECTED_FAULTS,
    FaultKind,
    FaultWindow,
    window_allowed,
    windows_of,
)
from pytest_nvrx.settings import (
    MATRICES,
    WORKLOAD_KINDS,
    ConfigError,
    NvrxSettings,
    ScheduledFault,
    WorkloadKind,
    parse_schedule,
    plugin_setting,
    quote,
)

#: Workloads in the order their scenarios run (the CPU one first: it fails fastest).
WORKLOAD_ORDER: tuple[WorkloadKind, ...] = ("reference", "megatron")


@dataclass(frozen=True)
class Scenario:
    """One run to qualify: a workload, a fault (``none`` for the baseline) and its window."""

    workload: WorkloadKind
    fault: FaultKind
    window: FaultWindow | None = None
    #: a self-test run (``selftest``): the control (``plant`` None) or one planted bug
    selftest: bool = False
    plant: str | None = None
    #: a fault schedule (issue #26): several faults, one per cycle; ``fault`` and ``window``
    #: are its first's. ``max_restarts``: the launcher's budget when the scenario sets one
    schedule: tuple[ScheduledFault, ...] = ()
    max_restarts: int | None = None

    @classmethod
    def scheduled(
        cls,
        workload: WorkloadKind,
        schedule: tuple[ScheduledFault, ...],
        max_restarts: int | None = None,
    ) -> Scenario:
        first = schedule[0]
        return cls(
            workload,
            cast(FaultKind, first.fault),
            cast(FaultWindow, first.window),
            schedule=schedule,
            max_restarts=max_restarts,
        )

    def __post_init__(self) -> None:
        if self.plant is not None and not self.selftest:
            raise ValueError(f"plant {self.plant!r} outside a self-test scenario")
        first = self.schedule[0] if self.schedule else None
        if first is not None and (
            self.selftest or (self.fault, self.window) != (first.fault, first.window)
        ):
            raise ValueError(f"a schedule's scenario is its first fault's, got {self!r}")
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
        """``<workload>-<fault>-<window>``, or ``<workload>-baseline``; a self-test's
        ``<workload>-selftest-<plant>`` (``-control`` for the unplanted one)."""
        if self.selftest:
            return f"{self.workload}-selftest-{self.plant or 'control'}"
        if self.schedule:
            faults = "_".join(f"{e.fault}-{e.window}" for e in self.schedule)
            budget = f"-restarts{self.max_restarts}" if self.max_restarts is not None else ""
            return f"{self.workload}-schedule-{faults}{budget}"
        if self.window is None:
            return f"{self.workload}-{self.kind}"
        return f"{self.workload}-{self.kind}-{self.window}"

    @property
    def needs_gpu(self) -> bool:
        return self.workload == "megatron"

    @property
    def markers(self) -> tuple[str, ...]:
        if self.selftest:
            names: tuple[str, ...] = ("selftest",)
        elif self.schedule:
            # every fault and window the schedule holds, so that ``-m kill`` or ``-m restore``
            # selects each schedule with one, as it selects the one-fault scenarios
            kinds = dict.fromkeys(e.fault for e in self.schedule)
            windows = dict.fromkeys(e.window for e in self.schedule)
            names = ("schedule", *kinds, *windows)
        else:
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


#: The default schedule matrix (issue #26), small enough for CI: a fault in a replacement's
#: restore after a step fault; two finalize-window faults in a row (the second the checkpoint
#: worker's, which must have survived the first restart); and more faults than restarts (the
#: launcher must give up after max-restarts + 1 cycles).
DEFAULT_SCHEDULES: tuple[tuple[str, int | None], ...] = (
    ("kill@step,kill@restore", None),
    ("hang@finalize,ckpt-worker@finalize", None),
    ("kill@step,kill@restore,kill@restore", 1),
)
#: The plugin's schedule choices besides a schedule of one's own.
SCHEDULE_CHOICES = ("default", "none")


def schedule_scenarios(
    workload: WorkloadKind, schedules: str | tuple[ScheduledFault, ...] = "default"
) -> tuple[Scenario, ...]:
    """The workload's schedule scenarios: the default matrix, none, or one given schedule."""
    if schedules == "none":
        return ()
    if schedules == "default":
        return tuple(
            Scenario.scheduled(workload, parse_schedule(text, "DEFAULT_SCHEDULES"), restarts)
            for text, restarts in DEFAULT_SCHEDULES
        )
    if isinstance(schedules, str):
        raise ConfigError(f"schedules must be default, none or a schedule, got {quote(schedules)}")
    return (Scenario.scheduled(workload, schedules),)


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
    schedules: str | tuple[ScheduledFault, ...] = "none",
) -> tuple[Scenario, ...]:
    """Per workload its baseline first (the continuity reference of the fault scenarios judged
    after it), then the fault scenarios of the matrix, then its schedule scenarios."""
    pairs = fault_pairs(matrix, windows)
    wanted = set(workloads)
    out: list[Scenario] = []
    for workload in WORKLOAD_ORDER:
        if workload in wanted:
            out.append(Scenario(workload, "none"))
            out += [Scenario(workload, fault, window) for fault, window in pairs]
            out += schedule_scenarios(workload, schedules)
    return tuple(out)


def session_scenarios(settings: NvrxSettings) -> tuple[Scenario, ...]:
    """The scenarios a session's settings choose: :func:`matrix_scenarios` of its matrix,
    windows and workloads, and its schedule scenarios. Chosen windows (--nvrx-window) leave the
    default schedule matrix out, whose faults lie in other windows too; a schedule given runs
    all the same."""
    schedules = settings.schedules
    if settings.windows is not None and schedules == "default":
        schedules = "none"
    return matrix_scenarios(settings.matrix, settings.windows, settings.workloads, schedules)


#: The default matrix of both workloads.
SCENARIOS: tuple[Scenario, ...] = matrix_scenarios("default")
#: Every scenario the plugin can run (the full matrix of both workloads, the default schedules).
ALL_SCENARIOS: tuple[Scenario, ...] = matrix_scenarios("full", schedules="default")


#: Wall-clock limit of one scenario run, seconds (the tree is killed when it is exceeded).
RUN_TIMEOUTS: dict[WorkloadKind, float] = {
    workload: float(value)
    for workload, value in (plugin_setting("run_timeout").defaults or {}).items()
}
