"""What the replacement was told at start, against what the failed cycle ran with.

Megatron prints nothing when it skips optimizer state (``--no-load-optim``) or restarts the
iteration count (``--finetune``): only its startup argument dump says so. The integration guide
asks a replacement to restore the optimizer with the weights, from the checkpoints the failed
cycle wrote, on the same world size and TP/PP shape. :func:`resume_settings_problem` finds the
first setting of the replacement that contradicts that, with the lines that prove it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.manifest import Setting
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.workload import LoadCompleted, SaveScheduled, SettingReported

# Settings that must not change across a replacement (the parallel shape).
SHAPE = (
    "world_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)
# Boolean settings whose truth means "this resume does not restore the training state".
SKIPS = {
    "no_load_optim": "to skip the optimizer state",
    "finetune": "to finetune (iteration count reset, optimizer and RNG state not loaded)",
}
_TRUE = frozenset({"true", "1", "yes"})


@dataclass(frozen=True, slots=True)
class SettingsProblem:
    reason: str
    refs: tuple[EvidenceRef, ...]


def settings_of(log: CycleLog | None) -> dict[str, SettingReported]:
    """The settings a cycle printed at start (first report of each name)."""
    found: dict[str, SettingReported] = {}
    if log is not None:
        for event in log.of_type(SettingReported):
            found.setdefault(event.name, event)
    return found


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
    new = settings_of(replacement)
    if not new:
        return _load_path_problem(failed, replacement, checkpoint_dir)
    cycle = replacement.cycle if replacement is not None else "?"
    for name, what in SKIPS.items():
        setting = new.get(name)
        if setting is not None and setting.value.strip().lower() in _TRUE:
            return SettingsProblem(
                f"replacement cycle {cycle} was told {what}: {name} = {setting.value}",
                (setting.ref,),
            )
    old = settings_of(failed)
    before = failed.cycle if failed is not None else "?"
    load, save = new.get("load"), old.get("save")
    if load is not None and save is not None and _path(load.value) != _path(save.value):
        return SettingsProblem(
            f"replacement cycle {cycle} loads from {load.value}, not from {save.value} where"
            f" cycle {before} saved its checkpoints",
            (load.ref, save.ref),
        )
    for name in SHAPE:
        a, b = old.get(name), new.get(name)
        if a is not None and b is not None and a.value != b.value:
            return SettingsProblem(
                f"{name} changed across the replacement: {a.value} in cycle {before},"
                f" {b.value} in cycle {cycle}",
                (b.ref, a.ref),
            )
    return _load_path_problem(failed, replacement, checkpoint_dir)


def _load_path_problem(
    failed: CycleLog | None, replacement: CycleLog | None, checkpoint_dir: Setting | None
) -> SettingsProblem | None:
    """A load line that names its checkpoint (the reference workload's, on every rank) must
    name one in the directory the failed cycle saved to, as Megatron's ``load`` must be its
    ``save``; when the failed cycle printed no save path, run.json's checkpoint directory."""
    if replacement is None:
        return None
    cycle, before = replacement.cycle, failed.cycle if failed is not None else "?"
    saves = [e for e in failed.of_type(SaveScheduled) if e.path] if failed is not None else []
    if saves:
        where = {_parent(s.path) for s in saves if s.path}
        shown, ref = _parent(saves[0].path or ""), saves[0].ref
        told = f" where cycle {before} saved its checkpoints"
    elif checkpoint_dir is not None and isinstance(checkpoint_dir.value, str):
        shown, ref = _path(checkpoint_dir.value), checkpoint_dir.ref
        where, told = {shown}, ", the run's checkpoint directory (run.json)"
    else:
        return None
    for load in replacement.of_type(LoadCompleted):
        if load.path is not None and _parent(load.path) not in where:
            return SettingsProblem(
                f"replacement cycle {cycle} loads from {_parent(load.path)}, not from"
                f" {shown}{told}",
                (load.ref, ref),
            )
    return None


def _parent(path: str) -> str:
    """The directory of a checkpoint path as printed on the run host (a POSIX path)."""
    return posixpath.dirname(_path(path)) or "/"
