"""Workload-agnostic events of an application (per-cycle) log, and the adapter seam.

The criteria never look at a workload's log format. A :class:`WorkloadLogAdapter` turns one line
of one workload's log into one of the normalized events below (a committed iteration, a save
scheduled or completed, a checkpoint load or a fresh start, a load failure, an error). Python
tracebacks are assembled for every workload alike (:mod:`pytest_nvrx.evidence.tracebacks`).
Megatron's adapter lives in :mod:`pytest_nvrx.evidence.megatron`, the CPU reference workload's in
:mod:`pytest_nvrx.evidence.reference`. Another workload registers its own adapter
with :func:`register_adapter` under the name its run manifest gives as ``workload`` (module
``pytest_nvrx.evidence.<workload>`` is imported on first use).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from pytest_nvrx.evidence.refs import EvidenceRef, LineCursor, read_deadline


@dataclass(frozen=True, slots=True)
class IterationCommitted:
    """An optimizer step the workload reports as done (``iteration N/M``).

    ``values`` are the numbers the line prints, as printed (exact replay comparison compares
    these texts), under workload-agnostic names: ``loss``, ``learning_rate``,
    ``consumed_samples``, ``loss_scale``, ``grad_norm`` (only those the line has), and
    ``elapsed_ms`` (the time per iteration the line reports: never compared, it tells how the
    workload averages what it prints).
    """

    iteration: int
    total: int | None
    consumed_samples: int | None
    loss: float | None
    time: datetime | None
    ref: EvidenceRef
    values: tuple[tuple[str, str], ...] = ()

    def value(self, name: str) -> str | None:
        """The printed text of one value, None when the line does not print it."""
        for key, text in self.values:
            if key == name:
                return text
        return None


@dataclass(frozen=True, slots=True)
class SaveScheduled:
    """A checkpoint save was submitted. Not recoverable yet: it may never be finalized.

    ``path`` is where the workload says it writes it, as printed (a path on the run host, never
    opened); None when its line does not say (Megatron prints its ``--save`` in the argument
    dump instead)."""

    iteration: int
    time: datetime | None
    ref: EvidenceRef
    path: str | None = None


@dataclass(frozen=True, slots=True)
class SaveCompleted:
    """A checkpoint save was finalized (for Megatron: written and the tracker updated)."""

    iteration: int
    time: datetime | None
    ref: EvidenceRef


@dataclass(frozen=True, slots=True)
class LoadStarted:
    """The workload began loading the checkpoint of ``iteration``.

    ``directory``: the checkpoint directory the line names, as printed (Megatron's ``--load``,
    a path on the run host, never opened); None when the line does not say."""

    iteration: int
    ref: EvidenceRef
    directory: str | None = None


@dataclass(frozen=True, slots=True)
class LoadCompleted:
    """The workload reports the checkpoint of ``iteration`` loaded.

    ``parts`` is what it says it restored, in its own words (the reference workload lists
    ``model, optimizer, scheduler, rng, data``); None when its log does not say (Megatron).
    ``path``: the checkpoint it says it loaded, as printed (a path on the run host, never
    opened); None when the line does not say. ``directory``: the checkpoint directory the line
    names instead (Megatron's load lines name their ``--load``, not the ``iter_N`` in it).
    ``consumed_samples``: the data position it says it restored; None when the line does not say
    (Megatron).
    """

    iteration: int
    ref: EvidenceRef
    parts: tuple[str, ...] | None = None
    path: str | None = None
    # when the line says it was printed (the reference workload); None: Megatron's load lines
    # carry no time
    time: datetime | None = None
    directory: str | None = None
    consumed_samples: int | None = None


@dataclass(frozen=True, slots=True)
class LineFact:
    """A fact that its line states whole, with no value to read from it (the kinds below)."""

    ref: EvidenceRef


class StartedFromScratch(LineFact):
    """No checkpoint was found or used: training starts from random initialization."""

    __slots__ = ()


class OptimizerLoadFailed(LineFact):
    """Optimizer state could not be restored from the checkpoint."""

    __slots__ = ()


class RngLoadFailed(LineFact):
    """RNG state could not be restored from the checkpoint."""

    __slots__ = ()


class LoadFailed(LineFact):
    """The checkpoint load failed in another way the workload names."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class TracebackFrame:
    """One ``File "...", line N, in func`` frame of a Python traceback, with its source line.

    ``path`` is as printed: an absolute path on the run host (or ``<frozen runpy>``), never used
    to open anything; ``short_path`` is what a verdict shows: the part after ``site-packages/``
    or from the adapter's package root on (``megatron/core/optimizer/distrib_optimizer.py``).
    """

    path: str
    short_path: str
    line: int
    function: str
    ref: EvidenceRef
    source: EvidenceRef | None = None  # the source line printed under the frame
    code: str | None = None  # that source line's code, stripped of prefixes and indentation

    @property
    def where(self) -> str:
        return f"{self.short_path}:{self.line}"


@dataclass(frozen=True, slots=True)
class WorkloadError:
    """A traceback, an exception line, or the workload's own word that it failed.

    ``ref`` is the line that says what went wrong. For a Python traceback (assembled by
    :mod:`pytest_nvrx.evidence.tracebacks`) that is its final exception line (``AssertionError``,
    ``RuntimeError: ...``), or its ``Traceback (most recent call last):`` head when the exception
    line never came; ``exception`` is that line's text without prefixes, ``innermost`` the frame
    that raised, ``load_frame`` the outermost frame in checkpoint loading (None when the
    traceback never passed through a checkpoint load).
    """

    ref: EvidenceRef
    exception: str | None = None
    traceback: EvidenceRef | None = None
    innermost: TracebackFrame | None = None
    load_frame: TracebackFrame | None = None
    frames: int = 0
    # its stamp, where the line has one (the reference workload's own ``aborted ...``, ``exit
    # code N``)
    time: datetime | None = None
    # the status the line says the process exits with (the reference workload's ``exit code N``,
    # N not 0); None: the line says none
    exit_code: int | None = None

    @property
    def in_checkpoint_load(self) -> bool:
        return self.load_frame is not None


@dataclass(frozen=True, slots=True)
class Milestone:
    """A timestamped phase boundary (``setup_done`` after model/optimizer/checkpoint load,
    ``training_done``), read only from the whole line in the form the workload prints it; used
    for timings and, ``training_done``, as the proof that the log reached its end.
    ``iteration``: the iteration the line names (the reference workload's ``training finished
    iteration N``; None where the line names none)."""

    name: str
    time: datetime | None
    ref: EvidenceRef
    iteration: int | None = None


@dataclass(frozen=True, slots=True)
class MilestoneLookalike:
    """A line that holds a milestone's words but is not the line the workload prints (text
    before or after it, a value of another form): no milestone, and the line a missing
    milestone's verdict names (``why``: what differs)."""

    name: str
    why: str
    ref: EvidenceRef


@dataclass(frozen=True, slots=True)
class VersionReported:
    """A component version the workload prints at start (fallback for the stack report);
    ``version`` None: the workload says the component is absent."""

    component: str
    version: str | None
    ref: EvidenceRef


@dataclass(frozen=True, slots=True)
class ProcessExited:
    """A worker process's last line after a clean return from training: the reference workload's
    ``exit code 0`` on every rank (a non-zero code is a WorkloadError); ``time`` its stamp."""

    ref: EvidenceRef
    time: datetime | None = None


@dataclass(frozen=True, slots=True)
class ProcessStarted:
    """A worker process says it started: the world size it joined and its restart count
    (``TORCHELASTIC_RESTART_COUNT``: ft_launcher sets it to the number of the cycle it starts),
    as the reference workload's ``started`` line prints them (None: its line does not say)."""

    world_size: int
    restart_count: int | None
    ref: EvidenceRef
    # its stamp: the first its process stamped in the cycle, which a fault it took cannot precede
    time: datetime | None = None
    # the process id it printed (the reference workload's ``started pid N``)
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class SettingReported:
    """A training setting the workload prints at start (Megatron's argument dump), under its
    own name (``no_load_optim``, ``finetune``, ``load``, ``save``, ``world_size``,
    ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``, ``log_interval``...);
    ``value`` as printed (``True``, ``None``, ``/ckpt``)."""

    name: str
    value: str
    ref: EvidenceRef


@dataclass(frozen=True, slots=True)
class FtTimeoutsReported:
    """The fault-tolerance deadlines a worker says its NVRx rank monitor runs with, as it
    starts: ``sections`` (name, seconds), sorted by name, and ``out_of_section``; ``calculated``
    where NVRx says it calculated some of them itself (Megatron's ``--calc-ft-timeouts``) rather
    than taking the launcher's ``--ft-rank-section-timeouts`` and
    ``--ft-rank-out-of-section-timeout``."""

    sections: tuple[tuple[str, float], ...]
    out_of_section: float
    calculated: bool
    ref: EvidenceRef

    @classmethod
    def read(
        cls,
        sections: Iterable[tuple[str, str] | None],
        out_of_section: str,
        calculated: bool,
        at: LineCursor,
    ) -> FtTimeoutsReported | None:
        """The deadlines as a workload's line prints them: each section's (name, seconds as
        text), None for a part its pattern does not read; None where any part is not read or
        any deadline is no finite ASCII number (:func:`read_deadline`)."""
        read: list[tuple[str, float]] = []
        for part in sections:
            seconds = read_deadline(part[1]) if part is not None else None
            if part is None or seconds is None:
                return None
            read.append((part[0], seconds))
        outside = read_deadline(out_of_section)
        if outside is None:
            return None
        return cls(tuple(sorted(read)), outside, calculated, at.ref())


WorkloadEvent = (
    IterationCommitted
    | SaveScheduled
    | SaveCompleted
    | LoadStarted
    | LoadCompleted
    | StartedFromScratch
    | OptimizerLoadFailed
    | RngLoadFailed
    | LoadFailed
    | WorkloadError
    | Milestone
    | MilestoneLookalike
    | VersionReported
    | SettingReported
    | ProcessStarted
    | ProcessExited
    | FtTimeoutsReported
)

# Events that say a restore did not bring back the full training state.
LOAD_FAILURES = (OptimizerLoadFailed, RngLoadFailed, LoadFailed)


class WorkloadLogAdapter(Protocol):
    """Turns lines of one workload's application log into normalized events.

    ``parse_line`` gets the line with NVRx's rank prefix already removed and a cursor positioned
    on it; it returns ``None`` for the (vast majority of) lines it does not care about and must
    be cheap for them: logs run to gigabytes. It builds references with ``at.ref()`` and reads
    naive timestamps with ``at.local_time(...)``.
    """

    name: str

    def parse_line(self, text: str, at: LineCursor) -> WorkloadEvent | None: ...

    def iteration_of(self, text: str) -> int | None:
        """Fast path for the commonest line: the iteration number if ``text`` is an iteration
        line (``parse_line`` would return an IterationCommitted for it), else None."""
        ...

    def checkpoint_path(self, checkpoint_dir: Path, iteration: int) -> Path:
        """Directory holding the checkpoint of ``iteration``."""
        ...


# Optional adapter attributes, looked up with getattr (an adapter without them works as well):
# ``source_roots`` (see source_roots below), ``event_kind(text) -> type | None``: the type of
# event ``parse_line`` would make of ``text`` (None: none) without making it; the cycle-log
# parser then makes only the save events it keeps (Megatron's logs hold millions of saves);
# ``loads_on_every_rank`` (see loads_on_every_rank below); ``dumps_settings`` (see
# dumps_settings below); ``prints_versions_from`` and ``version_components`` (see versions_printed
# below); ``stated_rank(text) -> int | None`` (see stated_rank below); ``rank_0_only`` (see
# printed_by_rank_0_only below); and ``iteration_line`` (see iteration_line below).


def stated_rank(adapter: WorkloadLogAdapter, text: str) -> int | None:
    """The rank a line (its NVRx rank prefix removed) says it was printed by, or None.

    Optional: a workload that names its rank inside its lines (the reference workload's
    ``[ref] <time> rank <r> ...``) sets ``stated_rank(text)``, so a line under another rank's
    prefix is a contradiction; Megatron's lines state none."""
    method = getattr(adapter, "stated_rank", None)
    if not callable(method):
        return None
    rank = method(text)
    return rank if isinstance(rank, int) else None


def printed_by_rank_0_only(adapter: WorkloadLogAdapter, event: object) -> bool:
    """Whether the workload prints ``event``'s kind of line on rank 0 alone, so the same line
    under another rank's prefix is no line the workload printed (and rank 0's is missing).

    Optional: an adapter sets ``rank_0_only``, event types and Milestone names (the reference
    workload's saves, FT deadlines and ``training finished``; Megatron's ``print_rank_0`` load,
    save and FT lines)."""
    kinds = getattr(adapter, "rank_0_only", ())
    if isinstance(event, Milestone):
        return event.name in kinds
    return type(event) in kinds


def loads_on_every_rank(adapter: WorkloadLogAdapter) -> bool:
    """Whether every rank of a restoring cycle prints its own load line (the reference
    workload), so a rank without one did not load; Megatron prints its load lines on rank 0
    only (``print_rank_0``), so there only the lines printed can be compared."""
    return getattr(adapter, "loads_on_every_rank", False) is True


def starts_on_every_rank(adapter: WorkloadLogAdapter) -> bool:
    """Whether every rank of the workload prints a ProcessStarted line (its world size and
    restart count) before anything else: the reference workload's ``started`` line, which
    manifest_agreement compares with run.json and the cycle's index."""
    return getattr(adapter, "starts_on_every_rank", False) is True


def exits_on_every_rank(adapter: WorkloadLogAdapter) -> bool:
    """Whether every rank of the workload prints a ProcessExited line as the last thing it does
    after a clean return (the reference workload's ``exit code 0``), so a cycle that ended the
    run with exit 0 holds one from every rank that printed in it."""
    return getattr(adapter, "exits_on_every_rank", False) is True


def dumps_settings(adapter: WorkloadLogAdapter) -> bool:
    """Whether every process of the workload prints its settings (SettingReported) before it
    loads, saves or trains: Megatron's startup argument dump (``---- arguments ----``, rank 0,
    every argument), which the resume-settings and run.json checks compare; the reference
    workload prints none."""
    return getattr(adapter, "dumps_settings", False) is True


_RELEASE = re.compile(r"(\d{1,6})\.(\d{1,6})(?:[.+\-]|rc|a|b|$)", re.ASCII)


def versions_printed(adapter: WorkloadLogAdapter, version: object) -> tuple[str, ...]:
    """The components whose versions (VersionReported) every process of the workload prints as
    it starts at ``version`` (the package version run.json's stack records, ``0.19.1``); empty:
    none, or a version it cannot read. An adapter sets ``prints_versions_from`` to the first
    ``(major, minor)`` that prints them and ``version_components`` to their names (Megatron:
    pretrain_gpt.py's ``> PyTorch version ...`` lines, from core 0.19 on)."""
    since = getattr(adapter, "prints_versions_from", None)
    components = getattr(adapter, "version_components", ())
    if not isinstance(version, str) or not isinstance(since, tuple):
        return ()
    m = _RELEASE.match(version)
    if m is None or (int(m[1]), int(m[2])) < since:
        return ()
    return tuple(str(c) for c in components)


def source_roots(adapter: WorkloadLogAdapter) -> tuple[str, ...]:
    """The package directories an adapter names for shortening traceback paths.

    Optional: an adapter may set ``source_roots`` (Megatron: ``("megatron",)``) so that a frame
    in ``/any/checkout/megatron/core/x.py`` is shown as ``megatron/core/x.py``.
    """
    roots = getattr(adapter, "source_roots", ())
    return tuple(str(r) for r in roots) if isinstance(roots, tuple | list) else ()


def iteration_line(adapter: WorkloadLogAdapter) -> re.Pattern[bytes] | None:
    """The adapter's iteration line as a bytes pattern, or None.

    Optional: ``iteration_line`` is the pattern ``parse_line`` reads an iteration's number and
    total from (groups ``it`` and ``total``), compiled for bytes, matched at the start of a line
    whose NVRx rank prefix is removed. Live progress (:mod:`pytest_nvrx.evidence.progress`)
    reads a growing log's raw bytes with it; a workload without one shows no iteration there.
    """
    pattern = getattr(adapter, "iteration_line", None)
    if isinstance(pattern, re.Pattern) and isinstance(pattern.pattern, bytes):
        return pattern
    return None


_ADAPTERS: dict[str, WorkloadLogAdapter] = {}


def register_adapter(adapter: WorkloadLogAdapter) -> None:
    _ADAPTERS[adapter.name] = adapter


def get_adapter(name: str) -> WorkloadLogAdapter:
    """The adapter registered as ``name``; raises ``KeyError`` naming the known ones.

    An adapter not yet registered is looked for in ``pytest_nvrx.evidence.<name>`` (a module
    that calls :func:`register_adapter` on import, like :mod:`pytest_nvrx.evidence.megatron`;
    it must stay light: no torch).
    """
    if name not in _ADAPTERS and name.isidentifier():
        module = f"pytest_nvrx.evidence.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    try:
        return _ADAPTERS[name]
    except KeyError:
        known = ", ".join(sorted(_ADAPTERS)) or "none"
        raise KeyError(f"no log adapter for workload {name!r} (known: {known})") from None
