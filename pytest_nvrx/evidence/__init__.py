"""Parsers that turn a run directory into typed evidence (one module per artifact kind).

``load_run(run_dir)`` gathers all of it into a :class:`RunEvidence`; every fact carries the
:class:`EvidenceRef` (file, line, text) that proves it. Nothing here imports pytest or judges.
"""

from __future__ import annotations

from pytest_nvrx.evidence.refs import EvidenceRef, Problem
from pytest_nvrx.evidence.rundir import RunDirError, RunEvidence, load_run
from pytest_nvrx.evidence.workload import WorkloadLogAdapter, get_adapter, register_adapter

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
