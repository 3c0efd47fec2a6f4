"""The self-test's catalogue of planted recovery bugs. No pytest here.

A plant is a known recovery bug put into a real run on purpose (``PYTEST_NVRX_PLANT`` in the
workers' environment): the Megatron workers get it through the import hook in
``pytest_nvrx/worker/plant_hook/``, the CPU reference workload plants it itself. Each entry says
what real bug it models and which criterion must catch it; ``python -m pytest_nvrx selftest`` runs
them all and fails when one is not caught (docs/selftest.md).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from pytest_nvrx.worker.plant_hook.nvrx_plants import MEGATRON_POINTS, PLANT_ENV, RECORDS_ENV

__all__ = [
    "PLANTS",
    "PLANT_ENV",
    "RECORDS_ENV",
    "Plant",
    "missing_patch_points",
    "plant_named",
]


@dataclass(frozen=True)
class Plant:
    """One planted bug: ``name`` (``PYTEST_NVRX_PLANT``'s value), what it models, the criterion
    that must catch it, and what its run needs."""

    name: str
    title: str
    models: str
    caught_by: str
    #: ranks the run needs for the plant to mean anything (a smaller world skips it, saying so)
    min_world: int = 1
    #: the run starts from a copy of the control's first checkpoint, so that two checkpoints are
    #: complete before the fault (the first restore of a run has no older checkpoint to fall to)
    seeded: bool = False
    #: restore plants act in a replacement; the others in every cycle
    in_restore: bool = True


PLANTS: tuple[Plant, ...] = (
    Plant(
        "rng",
        "RNG state not restored",
        "a replacement that restores weights, optimizer and counters but leaves every random "
        "generator as the fresh process seeded it (dropout masks and data draws change)",
        "training_continuity",
    ),
    Plant(
        "optimizer-reset",
        "optimizer moments reset after a correct load",
        "a replacement whose load is complete and says so, after which Adam's moments and step "
        "are zeroed (an optimizer rebuilt or re-initialized after the restore)",
        "training_continuity",
    ),
    Plant(
        "data",
        "data position reset, counters right",
        "a replacement whose data loader starts again from sample 0 while its consumed-samples "
        "counters stay as restored (a sampler built before, or without, the restored position)",
        "training_continuity",
    ),
    Plant(
        "scheduler",
        "LR scheduler state not restored",
        "a replacement whose learning-rate schedule starts from its first step again (the "
        "self-test's runs use a learning rate that moves)",
        "training_continuity",
    ),
    Plant(
        "previous-checkpoint",
        "the previous checkpoint loaded",
        "a replacement that reads the tracker as the complete checkpoint before the newest one "
        "and loads that: progress the job had made durable is lost",
        "optimizer_state_load",
        seeded=True,
    ),
    Plant(
        "iteration",
        "restored iteration counter off",
        "a replacement that loads the right checkpoint but resumes its iteration counter 5 "
        "iterations too far (iterations never trained)",
        "progress_past_restore",
    ),
    Plant(
        "tracker-at-submit",
        "tracker published at submit",
        "rank 0 writing the tracker when an async save is submitted, not when it is finalized: "
        "a fault before finalization leaves the tracker naming a checkpoint that is not durable",
        "prior_checkpoint",
        in_restore=False,
    ),
    Plant(
        "rank-checkpoint",
        "one rank restores another checkpoint",
        "a replacement whose last rank loads the complete checkpoint before the tracker's while "
        "the others load the tracker's (a per-rank tracker read or a stale local cache)",
        "optimizer_state_load",
        min_world=2,
        seeded=True,
    ),
)


def plant_named(name: str) -> Plant:
    """The catalogue's plant ``name``; KeyError names the catalogue."""
    for plant in PLANTS:
        if plant.name == name:
            return plant
    raise KeyError(f"no plant {name!r}; the catalogue: {', '.join(p.name for p in PLANTS)}")


def _defines(tree: ast.Module, dotted: str) -> bool:
    """Whether ``tree`` defines ``name`` or ``Class.method`` at its top level."""
    *owner, name = dotted.split(".")
    body: list[ast.stmt] = tree.body
    if owner:
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == owner[0]]
        if not classes:
            return False
        body = classes[0].body
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found = node.name == name
        elif isinstance(node, ast.Assign):
            found = any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        else:
            found = False
        if found:
            return True
    return False


def missing_patch_points(megatron_path: Path, plant: Plant) -> tuple[str, ...]:
    """The patch points of ``plant`` that the checkout at ``megatron_path`` lacks, each as
    ``module.name`` (read from its source, never imported); empty when it can be planted."""
    missing: list[str] = []
    trees: dict[str, ast.Module | None] = {}
    for module, dotted in MEGATRON_POINTS.get(plant.name, ()):
        if module not in trees:
            path = megatron_path.joinpath(*module.split(".")).with_suffix(".py")
            try:
                trees[module] = ast.parse(path.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, ValueError):
                trees[module] = None
        tree = trees[module]
        if tree is None or not _defines(tree, dotted):
            missing.append(f"{module}.{dotted}")
    return tuple(missing)
