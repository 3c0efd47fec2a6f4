"""The CPU reference workload's log lines as normalized workload events.

The workload (:mod:`pytest_nvrx.workloads.reference`, formats in docs/reference-workload.md)
writes one event per line, ``[ref] <UTC ISO time> rank <r> <event>``; NVRx's per-cycle logs add
the ``N: `` rank prefix, which the cycle-log parser strips before this adapter sees the line.
Unlike Megatron's, these timestamps carry their offset (``+00:00``): they are read as written,
never shifted by the host zone the launcher log implies.

Unlike Megatron, the workload says what a restore brought back: the load line lists its parts
(``model, optimizer, scheduler, rng, data``; fewer when ``--break-restore`` left one out), which
:class:`LoadCompleted` carries to the criteria as a positive "optimizer state restored" signal.
Its checkpoints are torch DCP directories ``iter_%07d/`` whose optimizer state is stored under
``optimizer.state.<param>.*`` (AdamW's ``step``, ``exp_avg``, ``exp_avg_sq``) and
``optimizer.param_groups.*``: the ``optimizer.*`` keys :mod:`pytest_nvrx.evidence.checkpoint`
looks for.

This module must stay light (no torch): ``verify`` imports it for every reference run.
"""

from __future__ import annotations

import re
from pathlib import Path

from pytest_nvrx.evidence.refs import (
    LineCursor,
    read_int,
    read_loss,
)
from pytest_nvrx.evidence.workload import (
    FtTimeoutsReported,
    IterationCommitted,
    LoadCompleted,
    LoadFailed,
    Milestone,
    MilestoneLookalike,
    ProcessExited,
    ProcessStarted,
    SaveCompleted,
    SaveScheduled,
    StartedFromScratch,
    WorkloadError,
    WorkloadEvent,
    register_adapter,
)
from pytest_nvrx.layout import iteration_dir_name

_TAG = "[ref] "
# [ref] 2026-11-29T11:52:52.917+00:00 rank 0 <event>; any ISO offset is accepted and honoured
_HEAD = re.compile(
    r"\[ref\] (?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z))"
    r" rank (?P<rank>\d+) "
)
# Only the event part (after the head) is matched below. Current lines print the floats with
# repr and end with grad_norm; lines recorded before that (``loss 4.7973 lr 9.051e-03``) match
# too, their values as printed.
_ITERATION = re.compile(
    r"iteration (?P<it>\d+)/(?P<total>\d+) consumed_samples (?P<consumed>\d+) loss (?P<loss>\S+)"
    r"(?: lr (?P<lr>\S+))?(?: grad_norm (?P<grad_norm>\S+))?"
)
# printed name -> IterationCommitted.values name, in the order the line prints them
_VALUE_NAMES = (
    ("consumed", "consumed_samples"),
    ("loss", "loss"),
    ("lr", "learning_rate"),
    ("grad_norm", "grad_norm"),
)
_ITERATION_NO = re.compile(r"\[ref\] \S+ rank \d+ iteration (\d+)/\d+ ")
_SAVE_SCHEDULED = re.compile(r"save scheduled iteration (?P<it>\d+)(?: |$)")
# the path a save or load line ends with ("... path /ckpt/iter_0000005")
_PATH = re.compile(r" path (?P<path>\S+)$")
# the whole event, as reference.py prints it after its last iteration (rank 0)
_FINISHED = re.compile(r"training finished iteration (?P<it>\d+)")
_FINISHED_WHY = "the workload prints 'training finished iteration N', nothing more or else"
_SAVE_COMPLETED = re.compile(r"save completed iteration (?P<it>\d+)$")
_LOADED = re.compile(
    r"load checkpoint iteration (?P<it>\d+) \((?P<parts>[^)]*)\)"
    r"(?: consumed_samples (?P<consumed>\d+))?"
)
# the rank the head states ("[ref] <time> rank 1 ..."): it must be the line's NVRx prefix
_STATED_RANK = re.compile(r"\[ref\] \S+ rank (\d+) ")
_EXIT = re.compile(r"exit code (?P<code>-?\d+)$")
# "started pid 539 world_size 2 restart_count 0" (later lines add " cpus N"; the first recorded
# runs' print no restart count)
_STARTED = re.compile(
    r"started pid (?P<pid>\d{1,12}) world_size (?P<world>\d{1,9})"
    r"(?: restart_count (?P<restarts>\d{1,9}))?(?: |$)"
)

# "ft monitoring initialized sections checkpointing:30.0,setup:120.0,step:10.0 out_of_section
# 60.0" (ref_sections.NvrxMonitor.describe: the rank monitor's own section_timeouts)
_FT_INITIALIZED = re.compile(
    r"ft monitoring initialized sections (?P<sections>\S+) out_of_section (?P<oos>\S+)$"
)


def _ft_timeouts(event: str, at: LineCursor) -> FtTimeoutsReported | None:
    m = _FT_INITIALIZED.match(event)
    if m is None:
        return None
    sections: list[tuple[str, str] | None] = []
    if m["sections"] != "-":
        for part in m["sections"].split(","):
            name, colon, value = part.partition(":")
            sections.append((name, value) if colon else None)
    return FtTimeoutsReported.read(sections, m["oos"], False, at)


def _path(event: str) -> str | None:
    m = _PATH.search(event)
    return m["path"] if m is not None else None


def _parts(text: str) -> tuple[str, ...]:
    return tuple(p for p in (part.strip() for part in text.split(",")) if p)


class ReferenceLogAdapter:
    """:class:`~pytest_nvrx.evidence.workload.WorkloadLogAdapter` for the CPU reference workload.

    Mapping (event → normalized event): ``iteration N/M ...`` → IterationCommitted, its printed
    ``consumed_samples``, ``loss``, ``lr`` and ``grad_norm`` texts as the values
    ``consumed_samples``, ``loss``, ``learning_rate``, ``grad_norm``; ``save
    scheduled`` → SaveScheduled; ``save completed`` (logged after the tracker write) →
    SaveCompleted; ``load checkpoint iteration N (parts) consumed_samples C path P`` →
    LoadCompleted with its parts, data position and path; ``no
    checkpoint found ..., starting from scratch`` → StartedFromScratch; ``load failed: ...`` →
    LoadFailed; ``training finished iteration N`` (the whole event) → Milestone ``training_done``
    naming N, any other event that starts ``training finished`` → MilestoneLookalike;
    ``aborted``, ``save failed``, ``ft monitoring failed``, a non-zero ``exit code`` and Python
    tracebacks → WorkloadError; ``exit code 0`` → ProcessExited;
    ``started pid P world_size W restart_count R`` → ProcessStarted (run.json's world size and
    the cycle are checked against it); ``ft monitoring initialized sections S out_of_section
    O`` → FtTimeoutsReported (run.json's deadlines and the other cycles' are checked against
    it). ``ft monitoring disabled`` and ``restore skipped ...`` (its load line already leaves the
    part out) are not evidence; neither is any line without the ``[ref]`` head (the injector's,
    torch's warnings).
    """

    name = "reference"
    # every rank prints its own load line: a rank of a restoring cycle without one did not load
    loads_on_every_rank = True
    # every rank prints "started pid P world_size W restart_count R" first (reference.py main)
    starts_on_every_rank = True
    # every rank prints "exit code 0" last after a clean return (reference.py main)
    exits_on_every_rank = True
    # rank 0 alone prints its saves, FT deadlines and "training finished" (ref_checkpoints.py,
    # reference.py)
    rank_0_only = (SaveScheduled, SaveCompleted, FtTimeoutsReported, "training_done")
    # traceback frames are shown from the package on (the checkout's path is the run host's)
    source_roots = ("pytest_nvrx",)
    # live progress reads iteration lines by the patterns parse_line reads them by, in bytes:
    # the head, then the event after it
    iteration_line = re.compile((_HEAD.pattern + _ITERATION.pattern).encode())

    def stated_rank(self, text: str) -> int | None:
        """The rank every ``[ref]`` line states in its head (None: not such a line)."""
        if not text.startswith(_TAG):
            return None
        m = _STATED_RANK.match(text)
        return read_int(m[1]) if m is not None else None

    def iteration_of(self, text: str) -> int | None:
        if not text.startswith(_TAG) or " iteration " not in text:
            return None
        m = _ITERATION_NO.match(text)
        return read_int(m[1]) if m is not None else None

    def parse_line(self, text: str, at: LineCursor) -> WorkloadEvent | None:
        if not text.startswith(_TAG):
            if "Traceback (most recent call last)" in text:
                return WorkloadError(at.ref())
            return None
        head = _HEAD.match(text)
        if head is None:
            return None
        read_int(head["rank"])  # a rank no count reads is no evidence (stated_rank reads it)
        event = text[head.end() :]
        time = at.aware_time(head["ts"])  # None: no clock reads it (year 9999)
        first = event[:4]
        if first == "iter":
            m = _ITERATION.match(event)
            if m is None:
                return None
            return IterationCommitted(
                iteration=read_int(m["it"]),
                total=read_int(m["total"]),
                consumed_samples=read_int(m["consumed"]),
                loss=read_loss(m["loss"]),
                time=time,
                ref=at.ref(),
                values=tuple((name, m[group]) for group, name in _VALUE_NAMES if m[group]),
            )
        if first == "save":
            if (m := _SAVE_SCHEDULED.match(event)) is not None:
                return SaveScheduled(read_int(m["it"]), time, at.ref(), path=_path(event))
            if (m := _SAVE_COMPLETED.match(event)) is not None:
                return SaveCompleted(read_int(m["it"]), time, at.ref())
            if event.startswith("save failed "):
                return WorkloadError(at.ref())
            return None
        if first == "load":
            if (m := _LOADED.match(event)) is not None:
                return LoadCompleted(
                    read_int(m["it"]),
                    at.ref(),
                    parts=_parts(m["parts"]),
                    path=_path(event),
                    time=time,
                    consumed_samples=read_int(m["consumed"]) if m["consumed"] else None,
                )
            if event.startswith("load failed: "):
                return LoadFailed(at.ref())
            return None
        if event.startswith("no checkpoint found at ") and event.endswith(
            ", starting from scratch"
        ):
            return StartedFromScratch(at.ref())
        if event.startswith("started "):
            m = _STARTED.match(event)
            if m is None:
                return None
            restarts = read_int(m["restarts"]) if m["restarts"] is not None else None
            return ProcessStarted(
                read_int(m["world"]), restarts, at.ref(), time, pid=read_int(m["pid"])
            )
        if event.startswith("training finished"):
            m = _FINISHED.fullmatch(event)
            if m is None:
                return MilestoneLookalike("training_done", _FINISHED_WHY, at.ref())
            return Milestone("training_done", time, at.ref(), iteration=read_int(m["it"]))
        if event.startswith("ft monitoring initialized "):
            return _ft_timeouts(event, at)
        if event.startswith("aborted ") or event.startswith("ft monitoring failed: "):
            return WorkloadError(at.ref(), time=time)
        if first == "exit":
            m = _EXIT.match(event)
            if m is not None:
                code = read_int(m["code"])
                return (
                    WorkloadError(at.ref(), time=time, exit_code=code)
                    if code
                    else ProcessExited(at.ref(), time=time)
                )
        return None

    def checkpoint_path(self, checkpoint_dir: Path, iteration: int) -> Path:
        return checkpoint_dir / iteration_dir_name(iteration)


REFERENCE = ReferenceLogAdapter()
register_adapter(REFERENCE)
