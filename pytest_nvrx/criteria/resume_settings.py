"""What the replacement was told at start, against what the failed cycle ran with.

Megatron prints nothing when it skips optimizer or RNG state (``--no-load-optim``,
``--no-load-rng``) or restarts the iteration count (``--finetune``): only its startup argument
dump says so. The integration guide asks a replacement to restore the optimizer with the weights,
from the checkpoints the failed cycle wrote, on the same world size and TP/PP shape, and to
train on as the failed cycle did. :func:`resume_settings_problem` finds the first setting of the
replacement that contradicts that, with the lines that prove it: one that skips restored state,
a load path that is not the failed cycle's save path, then **every entry of the argument dump**
that differs between the two cycles (the shape and the training's seed, batch and length first,
then any other: learning rate and its schedule, weight decay, clipping, Adam's betas, micro
batch, data-parallel size, precision, the distributed optimizer, the scheduler override...), or
that one cycle's dump has and the other's lacks, both values quoted. ft_launcher starts every
cycle with the same command line, so the dumps are equal entry for entry: measured on every
committed multi-cycle Megatron run (80), no entry differed.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.manifest import Setting
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.workload import (
    LoadCompleted,
    LoadStarted,
    SaveScheduled,
    SettingReported,
)

# Settings that must not change across a replacement (the parallel shape).
SHAPE = (
    "world_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)
# Settings that define the training being resumed: a replacement started with another seed,
# batch or length trains something else than the failed cycle did (the replay would disagree
# only where it compares, and a baseline only where one is given).
TRAINING = ("seed", "global_batch_size", "rampup_batch_size", "train_iters")
# Boolean settings whose truth means "this resume does not restore the training state".
SKIPS = {
    "no_load_optim": "to skip the optimizer state",
    "no_load_rng": "to skip the RNG state",
    "finetune": "to finetune (iteration count reset, optimizer and RNG state not loaded)",
}
_TRUE = frozenset({"true", "1", "yes"})


@dataclass(frozen=True, slots=True)
class SettingsProblem:
    reason: str
    refs: tuple[EvidenceRef, ...]


def settings_of(log: CycleLog | None) -> dict[str, SettingReported]:
    """The settings a cycle printed at start (first report of each name)."""
    if log is None:
        return {}
    # the first of a repeated name wins: built from the last one back
    return {event.name: event for event in reversed(log.of_type(SettingReported))}


def _path(value: str) -> str:
    return value.rstrip("/") or value


def resume_settings_problem(
    failed: CycleLog | None,
    replacement: CycleLog | None,
    *,
    checkpoint_dir: Setting | None = None,
) -> SettingsProblem | None:
    """The first way the replacement's settings contradict a full resume, or None.
    ``checkpoint_dir``: run.json's, for a load path when the failed cycle printed no save's."""
    new, old = settings_of(replacement), settings_of(failed)
    if not new:
        return _load_path_problem(failed, replacement, checkpoint_dir, new, old)
    cycle = replacement.cycle if replacement is not None else "?"
    for name, what in SKIPS.items():
        setting = new.get(name)
        if setting is not None and setting.value.strip().lower() in _TRUE:
            return SettingsProblem(
                f"replacement cycle {cycle} was told {what}: {name} = {setting.value}",
                (setting.ref,),
            )
    before = failed.cycle if failed is not None else "?"
    load, save = new.get("load"), old.get("save")
    if load is not None and save is not None and _path(load.value) != _path(save.value):
        return SettingsProblem(
            f"replacement cycle {cycle} loads from {load.value}, not from {save.value} where"
            f" cycle {before} saved its checkpoints",
            (load.ref, save.ref),
        )
    for name in (*SHAPE, *TRAINING):
        a, b = old.get(name), new.get(name)
        if a is not None and b is not None and a.value != b.value:
            return SettingsProblem(
                f"{name} changed across the replacement: {a.value} in cycle {before},"
                f" {b.value} in cycle {cycle}",
                (b.ref, a.ref),
            )
    problem = _load_path_problem(failed, replacement, checkpoint_dir, new, old)
    if problem is not None or not old:
        return problem
    return _dump_difference(old, new, before, cycle)


def _dump_difference(
    old: dict[str, SettingReported],
    new: dict[str, SettingReported],
    before: int | str,
    cycle: int | str,
) -> SettingsProblem | None:
    """The first entry (in the replacement's dump order) whose value differs between the two
    dumps, or that one of them lacks."""
    for name, b in new.items():
        a = old.get(name)
        if a is None:
            return SettingsProblem(
                f"{name} = {b.value} in replacement cycle {cycle}'s argument dump, absent from"
                f" cycle {before}'s: the replacement was started otherwise",
                (b.ref,),
            )
        if a.value != b.value:
            return SettingsProblem(
                f"{name} changed across the replacement: {a.value} in cycle {before},"
                f" {b.value} in cycle {cycle}",
                (b.ref, a.ref),
            )
    missing = next((a for name, a in old.items() if name not in new), None)
    if missing is not None:
        return SettingsProblem(
            f"{missing.name} = {missing.value} in cycle {before}'s argument dump, absent from"
            f" replacement cycle {cycle}'s: the replacement was started otherwise",
            (missing.ref,),
        )
    return None


def loaded_from(event: LoadStarted | LoadCompleted) -> str | None:
    """The directory a load line says it loaded from: the one it names (Megatron's), else the
    parent of the checkpoint it names (the reference workload's); None when it names neither."""
    if event.directory is not None:
        return _path(event.directory)
    path = event.path if isinstance(event, LoadCompleted) else None
    return _parent(path) if path is not None else None


def _load_path_problem(
    failed: CycleLog | None,
    replacement: CycleLog | None,
    checkpoint_dir: Setting | None,
    new: dict[str, SettingReported],
    old: dict[str, SettingReported],
) -> SettingsProblem | None:
    """A load line that names where it loads from (Megatron's name its directory, the reference
    workload's its checkpoint, on every rank) must name the replacement's ``load`` setting and
    the directory the failed cycle saved to (its ``save`` setting, else its save lines' paths);
    when the failed cycle printed neither, run.json's checkpoint directory."""
    if replacement is None:
        return None
    cycle, before = replacement.cycle, failed.cycle if failed is not None else "?"
    lines: list[LoadStarted | LoadCompleted] = sorted(
        (*replacement.of_type(LoadStarted), *replacement.of_type(LoadCompleted)),
        key=lambda e: e.ref.line or 0,
    )
    named = [(e, where) for e in lines if (where := loaded_from(e)) is not None]
    if not named:
        return None
    told, saved = new.get("load"), old.get("save")
    for setting, what in (
        (told, ", its own load setting"),
        (saved, f" where cycle {before} saved its checkpoints"),
    ):
        if setting is None:
            continue
        wrong = [(e, where) for e, where in named if where != _path(setting.value)]
        if wrong:
            return SettingsProblem(
                f"replacement cycle {cycle} loads from {wrong[0][1]}, not from"
                f" {setting.value}{what}",
                (wrong[0][0].ref, setting.ref, *(e.ref for e, _ in wrong[1:3])),
            )
    saves = [e for e in failed.of_type(SaveScheduled) if e.path] if failed is not None else []
    if saves:
        dirs = {_parent(s.path) for s in saves if s.path}
        shown, ref = _parent(saves[0].path or ""), saves[0].ref
        said = f" where cycle {before} saved its checkpoints"
    elif checkpoint_dir is not None and isinstance(checkpoint_dir.value, str):
        shown, ref = _path(checkpoint_dir.value), checkpoint_dir.ref
        dirs, said = {shown}, ", the run's checkpoint directory (run.json)"
    else:
        return None
    for event, where in named:
        if where not in dirs:
            return SettingsProblem(
                f"replacement cycle {cycle} loads from {where}, not from {shown}{said}",
                (event.ref, ref),
            )
    return None


def _parent(path: str) -> str:
    """The directory of a checkpoint path as printed on the run host (a POSIX path)."""
    return posixpath.dirname(_path(path)) or "/"
