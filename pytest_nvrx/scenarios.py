"""Qualification scenarios (workload x fault) and their default settings. No pytest here.

A scenario is launched once and judged by all the criteria. Defaults differ by workload: the
Megatron ones are the walkthrough's (with a hang-friendly step timeout); the CPU reference ones
are short so that a whole baseline + kill + hang qualification fits in minutes on 2 cores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_nvrx.settings import FaultKind, SectionTimeouts, WorkloadKind


@dataclass(frozen=True)
class Scenario:
    workload: WorkloadKind
    fault: FaultKind

    @property
    def kind(self) -> str:
        """The marker name of the fault: ``baseline``, ``kill`` or ``hang``."""
        return "baseline" if self.fault == "none" else self.fault

    @property
    def id(self) -> str:
        return f"{self.workload}-{self.kind}"

    @property
    def needs_gpu(self) -> bool:
        return self.workload == "megatron"

    @property
    def markers(self) -> tuple[str, ...]:
        return ("gpu", self.kind) if self.needs_gpu else (self.kind,)


FAULTS: tuple[FaultKind, ...] = ("none", "kill", "hang")
SCENARIOS: tuple[Scenario, ...] = tuple(
    Scenario(workload, fault) for workload in ("reference", "megatron") for fault in FAULTS
)

#: Settings a scenario uses unless the user gives them (option > env > ini > these).
DEFAULTS: dict[WorkloadKind, dict[str, Any]] = {
    "reference": {
        "gpus_per_node": 2,
        "fault_rank": 1,
        "train_iters": 30,
        "save_interval": 5,
        "section_timeouts": SectionTimeouts(setup=120, step=10, checkpointing=60),
        "out_of_section_timeout": 60.0,
        "workload_check_interval": 1.0,
    },
    "megatron": {
        # The walkthrough's values, but a 30 s step deadline so a hang is detected in ~30 s
        # rather than 120 s (measured on the H200: first step well under that).
        "section_timeouts": SectionTimeouts(setup=900, step=30, checkpointing=600),
        "workload_check_interval": 1.0,
    },
}

#: Wall-clock limit of one scenario run, seconds (the tree is killed when it is exceeded).
RUN_TIMEOUTS: dict[WorkloadKind, float] = {"reference": 600.0, "megatron": 1800.0}
