"""Parsers that turn a run directory into typed evidence (one module per artifact kind).

``load_run(run_dir)`` gathers all of it into a :class:`RunEvidence`; every fact carries the
:class:`EvidenceRef` (file, line, text) that proves it. Nothing here imports pytest or judges.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_nvrx.evidence.refs import EvidenceRef, Problem
    from pytest_nvrx.evidence.rundir import RunDirError, RunEvidence, load_run
    from pytest_nvrx.evidence.workload import WorkloadLogAdapter, get_adapter, register_adapter

# The package's names load with their module on first use: the training processes import
# pytest_nvrx.evidence.tracker alone, and need none of the parsers load_run brings.
_HOME = {
    "EvidenceRef": "refs",
    "Problem": "refs",
    "RunDirError": "rundir",
    "RunEvidence": "rundir",
    "load_run": "rundir",
    "WorkloadLogAdapter": "workload",
    "get_adapter": "workload",
    "register_adapter": "workload",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "EvidenceRef",
    "Problem",
    "RunDirError",
    "RunEvidence",
    "WorkloadLogAdapter",
    "get_adapter",
    "load_run",
    "register_adapter",
]
