"""Megatron-LM's application-log lines as normalized workload events.

Formats are those of ``megatron/training`` (core 0.19), as seen in real H200 runs
(tests/data/gpu): iteration lines from ``training.training_log``, save and load lines from
``training.checkpointing``. Megatron prints no positive "optimizer loaded" line, only
``Unable to load optimizer ...`` on failure; the checkpoint's own metadata is the positive proof
(see :mod:`pytest_nvrx.evidence.checkpoint`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from pytest_nvrx.evidence.refs import (
    LineCursor,
    check_numbers,
    is_ascii_number,
    read_float,
    read_int,
    read_loss,
)
from pytest_nvrx.evidence.replay import PrintModel
from pytest_nvrx.evidence.workload import (
    FtTimeoutsReported,
    IterationCommitted,
    LoadCompleted,
    LoadFailed,
    LoadStarted,
    Milestone,
    MilestoneLookalike,
    OptimizerLoadFailed,
    RngLoadFailed,
    SaveCompleted,
    SaveScheduled,
    SettingReported,
    StartedFromScratch,
    VersionReported,
    WorkloadError,
    WorkloadEvent,
    register_adapter,
)
from pytest_nvrx.layout import iteration_dir_name

_TS = r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]"
#  [2026-11-29 11:03:47.596636] iteration        1/     100 | consumed samples:            1 | ...
_ITERATION = re.compile(
    r"\s*" + _TS + r" iteration\s+(?P<it>\d+)/\s*(?P<total>\d+) \|"
    r"(?: consumed samples:\s*(?P<consumed>\d+) \|)?"
)
_ITERATION_NO = re.compile(r"\s*\[[^\]]*\] iteration\s+(\d+)/\s*\d+ \|")
_LM_LOSS = re.compile(r"\| lm loss: (?P<loss>[-+0-9.eEnaifNAIF]+) \|")
# " name: value |" fields of an iteration line (values as printed, compared as text); possessive
# (no character a quantifier takes can start what follows it), so nothing is tried twice
_FIELD = re.compile(r" (?P<key>[a-z][a-z ()]*+):\s++(?P<value>[^|\s]++) \|")
_FIELDS = {
    "consumed samples": "consumed_samples",
    "elapsed time per iteration (ms)": "elapsed_ms",
    "learning rate": "learning_rate",
    "lm loss": "loss",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
}
#   no_load_optim ................................... True   (the startup argument dump: every
#   entry is a SettingReported, compared between cycles by criteria/resume_settings.py)
_SETTING = re.compile(r"\s+(?P<name>[a-z][a-z0-9_]*) \.{3,} (?P<value>.*?)\s*$")
#: The dump's entries that lay the model out over the ranks.
PARALLEL_LAYOUT = (
    "world_size",
    "data_parallel_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)
#   [ts] scheduled an async checkpoint save at iteration      10 to /ckpt
_SCHEDULED = re.compile(
    r"\s*(?:" + _TS + r" )?scheduled an async checkpoint save at iteration\s+(?P<it>\d+)"
)
#   [ts] successfully saved checkpoint from iteration       5 to /ckpt [ t 1/1, ... ]
_SAVED = re.compile(
    r"\s*(?:" + _TS + r" )?successfully saved checkpoint from iteration\s+(?P<it>\d+)"
)
#  loading distributed checkpoint from /ckpt at iteration 5
_LOADING = re.compile(
    r"\s*loading (?:distributed )?checkpoint from (?P<dir>.+?) at iteration\s+(?P<it>\d+)"
)
#   successfully loaded checkpoint from /ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 5
_LOADED = re.compile(
    r"\s*successfully loaded checkpoint from (?P<dir>.+?)(?: \[[^\]]*\])? at iteration"
    r"\s+(?P<it>\d+)"
)
# "[after model, optimizer, and learning rate scheduler are built] datetime: 2026-11-29
# 11:04:19.480012 ", the whole line as training.print_datetime prints it (print_rank_0, a
# strftime('%Y-%m-%d %H:%M:%S.%f') time and a space); _MILESTONE_WORDS finds a milestone's
# label in a line of another form, which is no milestone (a MilestoneLookalike)
_MILESTONE = re.compile(
    r"\[(?P<what>[^\]]+)\] datetime: (?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}) "
)
_MILESTONE_WORDS = re.compile(r"\[(?P<what>[^\]]+)\] datetime: ")
_MILESTONE_WHY = (
    "print_datetime prints '[<label>] datetime: <%Y-%m-%d %H:%M:%S.%f> ' alone on its line"
)
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

# FT: initialized. Timeouts=SectionTimeouts(out_of_section=60.00, sections=[setup=900.00,
# step=30.00, checkpointing=30.00, ], calculated_sections=set(), is_out_of_section_calculated=False)
# (megatron/training/ft_integration.py prints NVRx's SectionTimeouts as the rank monitor has them)
_FT_INITIALIZED = re.compile(
    r"FT: initialized\. Timeouts=SectionTimeouts\(out_of_section=(?P<oos>[^,\s]+),"
    r" sections=\[(?P<sections>[^\]]*)\], calculated_sections=(?P<calc>.*?),"
    r" is_out_of_section_calculated=(?P<oos_calc>True|False)\)"
)
_FT_SECTION = re.compile(r"(?P<name>[A-Za-z_]\w*)=(?P<value>[^,\s]+)")


def _ft_timeouts(m: re.Match[str], at: LineCursor) -> FtTimeoutsReported | None:
    found = [_FT_SECTION.fullmatch(p) for p in (p.strip() for p in m["sections"].split(",")) if p]
    sections = [(f["name"], f["value"]) if f is not None else None for f in found]
    calculated = m["calc"] != "set()" or m["oos_calc"] == "True"
    return FtTimeoutsReported.read(sections, m["oos"], calculated, at)


def _int_or_none(value: str | None) -> int | None:
    return read_int(value) if value is not None else None


_RefOnly = (
    type[StartedFromScratch]
    | type[OptimizerLoadFailed]
    | type[RngLoadFailed]
    | type[LoadFailed]
    | type[WorkloadError]
)


def _recognize(text: str) -> tuple[type, re.Match[str] | None] | None:
    """Which event a line is and the match its values come from (None: the line itself).

    One decision for :meth:`MegatronLogAdapter.parse_line` and ``event_kind``. Cheap substring
    tests first: almost every line of a big log fails all of them.
    """
    if "] iteration " in text:
        m = _ITERATION.match(text)
        return None if m is None else (IterationCommitted, m)
    if " ...." in text:
        m = _SETTING.match(text)
        if m is not None:
            return SettingReported, m
    if "checkpoint" in text:
        found = _checkpoint_line(text)
        if found is not None:
            return found
    if "Unable to load" in text:
        if "Unable to load optimizer" in text:
            return OptimizerLoadFailed, None
        if "Unable to load rng" in text:
            return RngLoadFailed, None
    if "Traceback (most recent call last)" in text:
        return WorkloadError, None
    if ("Error" in text or "Exception" in text) and _EXCEPTION.match(text):
        return WorkloadError, None
    if "] datetime: " in text:
        m = _MILESTONE.fullmatch(text)
        if m is not None:
            return (Milestone, m) if m["what"] in _MILESTONES else None
        words = _MILESTONE_WORDS.search(text)
        if words is not None and words["what"] in _MILESTONES:
            return MilestoneLookalike, words
        return None
    if "FT: initialized. Timeouts=" in text:
        m = _FT_INITIALIZED.search(text)
        return (FtTimeoutsReported, m) if m is not None else None
    if " version ." in text:
        m = _VERSION.match(text)
        if m is not None and m["what"] in _COMPONENTS:
            return VersionReported, m
    return None


#: Checkpoint lines: (phrase, the pattern that reads its values or None, the evidence type).
_CHECKPOINT_LINES: tuple[tuple[str, re.Pattern[str] | None, type], ...] = (
    ("successfully saved checkpoint", _SAVED, SaveCompleted),
    ("scheduled an async checkpoint save", _SCHEDULED, SaveScheduled),
    ("successfully loaded checkpoint", _LOADED, LoadCompleted),
    ("checkpoint from", _LOADING, LoadStarted),
    ("will start from random", None, StartedFromScratch),
    ("could not load the checkpoint", None, LoadFailed),
)


def _checkpoint_line(text: str) -> tuple[type, re.Match[str] | None] | None:
    """The first phrase the line holds decides its kind; its pattern must then match."""
    for phrase, pattern, kind in _CHECKPOINT_LINES:
        if phrase in text:
            if pattern is None:
                return kind, None
            m = pattern.match(text)
            return None if m is None else (kind, m)
    return None


class MegatronLogAdapter:
    """:class:`~pytest_nvrx.evidence.workload.WorkloadLogAdapter` for ``pretrain_gpt.py``."""

    name = "megatron"
    # traceback frames are shown from the package on (the checkout's path is the run host's)
    source_roots = ("megatron",)
    # pretrain() prints the argument dump (print_rank_0) before it loads, saves or trains
    dumps_settings = True
    # pretrain_gpt.py's __main__ prints the PyTorch, Megatron-Core and Transformer Engine versions
    # (print_rank_0) before anything else from Megatron-Core 0.19 on (core_v0.19.0; every cycle
    # of the committed runs of that revision has them, core_v0.18.2's none)
    prints_versions_from = (0, 19)
    version_components = tuple(_COMPONENTS.values())
    # its load and save lines are print_rank_0's too, and print_datetime's "after training is done"
    rank_0_only = (LoadStarted, LoadCompleted, SaveScheduled, SaveCompleted, "training_done")
    # live progress reads iteration lines by the pattern parse_line reads them by, in bytes
    iteration_line = re.compile(_ITERATION.pattern.encode())

    def iteration_of(self, text: str) -> int | None:
        if "] iteration " not in text:
            return None
        m = _ITERATION_NO.match(text)
        return read_int(m[1]) if m is not None else None

    def event_kind(self, text: str) -> type | None:
        """The type of event :meth:`parse_line` makes of ``text`` (None: none), without making
        it: the parser counts the saves it does not keep."""
        found = _recognize(text)
        return None if found is None else found[0]

    def parse_line(self, text: str, at: LineCursor) -> WorkloadEvent | None:
        found = _recognize(text)
        if found is None:
            return None
        kind, m = found
        if kind is IterationCommitted:
            assert m is not None
            # its fields are read as ASCII numbers (_LM_LOSS) or compared as text: a value in
            # other digits is no number Megatron printed, not a field to leave out
            check_numbers(text)
            loss = _LM_LOSS.search(text, m.end())
            values = tuple(
                (_FIELDS[f["key"]], f["value"])
                for f in _FIELD.finditer(text, m.start("it"))
                if f["key"] in _FIELDS
            )
            return IterationCommitted(
                iteration=read_int(m["it"]),
                total=read_int(m["total"]),
                consumed_samples=_int_or_none(m["consumed"]),
                loss=read_loss(loss["loss"]) if loss is not None else None,
                time=at.local_time(m["ts"]),
                ref=at.ref(),
                values=values,
            )
        if m is None:  # the line itself is the event
            return cast(_RefOnly, kind)(at.ref())
        if kind is SaveCompleted or kind is SaveScheduled:
            ts = m["ts"]
            return kind(read_int(m["it"]), at.local_time(ts) if ts else None, at.ref())
        if kind is LoadCompleted or kind is LoadStarted:
            # the line names the --load directory, not the iter_N checkpoint in it
            return kind(read_int(m["it"]), at.ref(), directory=m["dir"])
        if kind is SettingReported:
            value = m["value"]
            if m["name"] not in ("load", "save"):  # read as numbers later (log_interval, ...)
                check_numbers(value)
            return SettingReported(m["name"], value, at.ref())
        if kind is FtTimeoutsReported:
            return _ft_timeouts(m, at)
        if kind is Milestone:
            return Milestone(_MILESTONES[m["what"]], at.local_time(m["ts"]), at.ref())
        if kind is MilestoneLookalike:
            return MilestoneLookalike(_MILESTONES[m["what"]], _MILESTONE_WHY, at.ref())
        component, version = _COMPONENTS[m["what"]], m["version"]
        if component == "transformer_engine" and version == _TE_ABSENT:
            return VersionReported(component, None, at.ref())
        return VersionReported(component, version, at.ref())

    def checkpoint_path(self, checkpoint_dir: Path, iteration: int) -> Path:
        return checkpoint_dir / iteration_dir_name(iteration)

    def print_model(
        self,
        cycles: Sequence[Sequence[IterationCommitted]],
        settings: Mapping[str, str],
    ) -> PrintModel:
        """How ``training_log`` prints: losses are means over the logging window; a line at
        every ``--log-interval`` and at a process's first iteration. Whether that first line
        resets the accumulators (fixed upstream by Megatron-LM PR #7092; core <= 0.19 does not,
        issue #6237) is read from the timer the same accumulators drive: the second line's
        ``elapsed time per iteration`` is, without the reset, the mean over both windows."""
        text = settings.get("log_interval", "1")
        interval = int(text) if is_ascii_number(text) and int(text) > 0 else 1
        votes = [v for v in (_first_print_resets(c, interval) for c in cycles) if v is not None]
        if votes and all(v == votes[0] for v in votes):
            resets = votes[0]
            basis = (
                "a process's second line "
                + ("is its own window" if resets else "averages its first two (#6237)")
                + ", read from the timers"
            )
        else:
            resets = False
            basis = (
                "a process's second line averages its first two (#6237, as in Megatron core"
                " <= 0.19: the timers do not tell)"
            )
        return PrintModel(
            averaged=frozenset({"loss"}),
            log_interval=interval,
            first_print_resets=resets,
            basis=f"losses are window means; {basis}",
        )


def _first_print_resets(prints: Sequence[IterationCommitted], interval: int) -> bool | None:
    """From one process's first two iteration lines: True when the second line's elapsed time
    covers only its own iterations, False when it also averages in the first line's; None when
    the lines cannot tell (no timer, readings too close to call, or a first line off the
    interval boundary, which no rule resets)."""
    if len(prints) < 2 or prints[0].iteration % interval != 0:
        return None
    first, second = prints[0], prints[1]
    n = second.iteration - first.iteration
    e1_text, e2_text = first.value("elapsed_ms"), second.value("elapsed_ms")
    if n <= 0 or first.time is None or second.time is None or not e1_text or not e2_text:
        return None
    try:
        e1, e2 = read_float(e1_text), read_float(e2_text)
    except ValueError:
        return None
    gap_ms = (second.time - first.time).total_seconds() * 1000.0
    if not (e1 > 0 and e2 > 0 and gap_ms > 0):
        return None
    kept = (e1 + gap_ms) / (n + 1)  # no reset: the first iteration stays in the window
    own = gap_ms / n  # reset: the window holds only the iterations since the first line
    if max(kept, own) / min(kept, own) < 1.5:
        return None
    return abs(math.log(e2 / own)) < abs(math.log(e2 / kept))


MEGATRON = MegatronLogAdapter()
register_adapter(MEGATRON)
