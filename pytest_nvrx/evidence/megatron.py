"""Megatron-LM's application-log lines as normalized workload events.

Formats are those of ``megatron/training`` (core 0.19), as seen in real H200 runs
(tests/data/gpu): iteration lines from ``training.training_log``, save and load lines from
``training.checkpointing``. Megatron prints no positive "optimizer loaded" line, only
``Unable to load optimizer ...`` on failure; the checkpoint's own metadata is the positive proof
(see :mod:`pytest_nvrx.evidence.checkpoint`).
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_nvrx.evidence.refs import LineCursor
from pytest_nvrx.evidence.workload import (
    IterationCommitted,
    LoadCompleted,
    LoadFailed,
    LoadStarted,
    Milestone,
    OptimizerLoadFailed,
    RngLoadFailed,
    SaveCompleted,
    SaveScheduled,
    StartedFromScratch,
    VersionReported,
    WorkloadError,
    WorkloadEvent,
    register_adapter,
)

_TS = r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]"
#  [2026-11-29 11:03:47.596636] iteration        1/     100 | consumed samples:            1 | ...
_ITERATION = re.compile(
    r"\s*" + _TS + r" iteration\s+(?P<it>\d+)/\s*(?P<total>\d+) \|"
    r"(?: consumed samples:\s*(?P<consumed>\d+) \|)?"
)
_ITERATION_NO = re.compile(r"\s*\[[^\]]*\] iteration\s+(\d+)/\s*\d+ \|")
_LM_LOSS = re.compile(r"\| lm loss: (?P<loss>[-+0-9.eEnaifNAIF]+) \|")
#   [ts] scheduled an async checkpoint save at iteration      10 to /ckpt
_SCHEDULED = re.compile(
    r"\s*(?:" + _TS + r" )?scheduled an async checkpoint save at iteration\s+(?P<it>\d+)"
)
#   [ts] successfully saved checkpoint from iteration       5 to /ckpt [ t 1/1, ... ]
_SAVED = re.compile(
    r"\s*(?:" + _TS + r" )?successfully saved checkpoint from iteration\s+(?P<it>\d+)"
)
#  loading distributed checkpoint from /ckpt at iteration 5
_LOADING = re.compile(r"\s*loading (?:distributed )?checkpoint from .* at iteration\s+(?P<it>\d+)")
#   successfully loaded checkpoint from /ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 5
_LOADED = re.compile(r"\s*successfully loaded checkpoint from .* at iteration\s+(?P<it>\d+)")
# [after model, optimizer, and learning rate scheduler are built] datetime: 2026-11-29 11:04:19.48
_MILESTONE = re.compile(r"\[(?P<what>[^\]]+)\] datetime: (?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\S*)")
_MILESTONES = {
    "after model, optimizer, and learning rate scheduler are built": "setup_done",
    "before the start of training step": "training_start",
    "after training is done": "training_done",
}
# > PyTorch version ................ 2.11.0+cu130
_VERSION = re.compile(r"> (?P<what>[\w -]+?) version \.+ (?P<version>\S+)")
_COMPONENTS = {
    "PyTorch": "torch",
    "Megatron-Core": "megatron_core",
    "Transformer Engine": "transformer_engine",
}
# megatron.core.utils.get_te_version() without Transformer Engine installed
_TE_ABSENT = "0.0.0"
# An exception line: "AssertionError", "KeyError: 'x'", "[rank0]: torch.distributed.DistError: ..."
_EXCEPTION = re.compile(
    r"(?:\[rank\d+\]:\s*)?(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::|\s*$)"
)


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None else None


def _float_or_none(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


class MegatronLogAdapter:
    """:class:`~pytest_nvrx.evidence.workload.WorkloadLogAdapter` for ``pretrain_gpt.py``."""

    name = "megatron"
    # traceback frames are shown from the package on (the checkout's path is the run host's)
    source_roots = ("megatron",)

    def iteration_of(self, text: str) -> int | None:
        if "] iteration " not in text:
            return None
        m = _ITERATION_NO.match(text)
        return int(m[1]) if m is not None else None

    def parse_line(self, text: str, at: LineCursor) -> WorkloadEvent | None:
        # Cheap substring tests first: almost every line of a big log fails all of them.
        if "] iteration " in text:
            m = _ITERATION.match(text)
            if m is not None:
                loss = _LM_LOSS.search(text, m.end())
                return IterationCommitted(
                    iteration=int(m["it"]),
                    total=int(m["total"]),
                    consumed_samples=_int_or_none(m["consumed"]),
                    loss=_float_or_none(loss["loss"]) if loss is not None else None,
                    time=at.local_time(m["ts"]),
                    ref=at.ref(),
                )
            return None
        if "checkpoint" in text:
            event = self._checkpoint_line(text, at)
            if event is not None:
                return event
        if "Unable to load" in text:
            if "Unable to load optimizer" in text:
                return OptimizerLoadFailed(at.ref())
            if "Unable to load rng" in text:
                return RngLoadFailed(at.ref())
        if "Traceback (most recent call last)" in text:
            return WorkloadError(at.ref())
        if ("Error" in text or "Exception" in text) and _EXCEPTION.match(text):
            return WorkloadError(at.ref())
        if "] datetime: " in text:
            m = _MILESTONE.search(text)
            if m is not None and m["what"] in _MILESTONES:
                return Milestone(_MILESTONES[m["what"]], at.local_time(m["ts"]), at.ref())
            return None
        if " version ." in text:
            m = _VERSION.match(text)
            if m is not None and m["what"] in _COMPONENTS:
                component, version = _COMPONENTS[m["what"]], m["version"]
                if component == "transformer_engine" and version == _TE_ABSENT:
                    return VersionReported(component, None, at.ref())
                return VersionReported(component, version, at.ref())
        return None

    def _checkpoint_line(self, text: str, at: LineCursor) -> WorkloadEvent | None:
        if "successfully saved checkpoint" in text:
            m = _SAVED.match(text)
            if m is not None:
                ts = m["ts"]
                return SaveCompleted(int(m["it"]), at.local_time(ts) if ts else None, at.ref())
        elif "scheduled an async checkpoint save" in text:
            m = _SCHEDULED.match(text)
            if m is not None:
                ts = m["ts"]
                return SaveScheduled(int(m["it"]), at.local_time(ts) if ts else None, at.ref())
        elif "successfully loaded checkpoint" in text:
            m = _LOADED.match(text)
            if m is not None:
                return LoadCompleted(int(m["it"]), at.ref())
        elif "checkpoint from" in text:
            m = _LOADING.match(text)
            if m is not None:
                return LoadStarted(int(m["it"]), at.ref())
        elif "will start from random" in text:
            return StartedFromScratch(at.ref())
        elif "could not load the checkpoint" in text:
            return LoadFailed(at.ref())
        return None

    def checkpoint_path(self, checkpoint_dir: Path, iteration: int) -> Path:
        return checkpoint_dir / f"iter_{iteration:07d}"


MEGATRON = MegatronLogAdapter()
register_adapter(MEGATRON)
