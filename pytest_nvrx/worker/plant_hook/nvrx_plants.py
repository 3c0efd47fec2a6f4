"""Known recovery bugs planted into a real workload for the self-test (stdlib only).

``python -m pytest_nvrx selftest`` runs each plant of the catalogue
(``pytest_nvrx.settings.plants``) once and requires the normal criteria to catch it. A plant is
chosen by ``PYTEST_NVRX_PLANT`` in the workers' environment and acts silently, as a real bug would:
it prints nothing. What it did is written, by the process that did it, as one JSON record per act
into the directory named by ``PYTEST_NVRX_PLANT_RECORDS`` (the run directory's ``plant-records/``).
A planted run without a record was not planted: the self-test says "plant not applied", never
"caught".

Megatron-LM is patched without touching the checkout: this directory goes first on the workers'
``PYTHONPATH``, its ``sitecustomize`` calls :func:`install`, which puts an import hook in front of
``sys.meta_path``. The hook lets each target module load as it is and then replaces the patched
names in it, before any other module imports them by name (``megatron.training.training`` does
``from megatron.training.checkpointing import load_checkpoint``). Every patch point is looked up
by name; a missing one is recorded as "cannot plant" and the plant does nothing.

The CPU reference workload does not need the hook: it reads the same variable and plants the same
bugs itself (``pytest_nvrx.workloads.ref_checkpoints``), recording them through :func:`record`.

Restore plants act in a replacement only (``TORCHELASTIC_RESTART_COUNT`` >= 1): cycle 0 restores
nothing. ``tracker-at-submit`` acts in every cycle.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final

PLANT_ENV: Final = "PYTEST_NVRX_PLANT"
RECORDS_ENV: Final = "PYTEST_NVRX_PLANT_RECORDS"
RESTART_COUNT_ENV: Final = "TORCHELASTIC_RESTART_COUNT"
#: The catalogue's names, repeated from pytest_nvrx.settings.plants (this module imports nothing of
#: ours; a test holds the two equal).
PLANT_NAMES: Final = (
    "rng",
    "optimizer-reset",
    "data",
    "scheduler",
    "previous-checkpoint",
    "iteration",
    "tracker-at-submit",
    "rank-checkpoint",
)
#: Plants that act when a save is submitted, in every cycle; the others act in a replacement's
#: restore.
SUBMIT_PLANTS: Final = ("tracker-at-submit",)
RESTORE_PLANTS: Final = tuple(name for name in PLANT_NAMES if name not in SUBMIT_PLANTS)
#: How far the ``iteration`` plant moves the restored iteration counter.
ITERATION_JUMP: Final = 5
#: A complete Megatron checkpoint directory holds one of these (torch_dist: both).
COMPLETE_FILES: Final = (".metadata", "metadata.json")
_ITER_DIR = re.compile(r"iter_(\d{7})")

#: Megatron patch points per plant: (module, dotted name in it). Checked by name before a run
#: (pytest_nvrx.settings.plants.missing_patch_points) and again when the module loads.
MEGATRON_POINTS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "rng": (("megatron.training.checkpointing", "load_checkpoint"),),
    "optimizer-reset": (("megatron.training.checkpointing", "load_checkpoint"),),
    "data": (("megatron.training.datasets.data_samplers", "build_pretraining_data_loader"),),
    "scheduler": (
        ("megatron.core.optimizer_param_scheduler", "OptimizerParamScheduler.load_state_dict"),
    ),
    "previous-checkpoint": (
        ("megatron.training.checkpointing", "load_checkpoint"),
        ("megatron.training.checkpointing", "read_metadata"),
    ),
    "iteration": (("megatron.training.checkpointing", "load_checkpoint"),),
    "tracker-at-submit": (
        ("megatron.training.checkpointing", "save_checkpoint"),
        ("megatron.training.checkpointing", "get_checkpoint_tracker_filename"),
    ),
    "rank-checkpoint": (
        ("megatron.training.checkpointing", "load_checkpoint"),
        ("megatron.training.checkpointing", "read_metadata"),
    ),
}


def active_plant() -> str | None:
    """The plant named in this process's environment, or None."""
    return os.environ.get(PLANT_ENV) or None


def restart_count() -> int:
    try:
        return int(os.environ.get(RESTART_COUNT_ENV, "0"))
    except ValueError:
        return 0


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def record(action: str, *, applied: bool = True, **details: Any) -> None:
    """Write one record of what this process's plant did (or could not do), atomically.

    Without ``PYTEST_NVRX_PLANT_RECORDS`` nothing is written: such a run is "plant not applied".
    """
    folder = os.environ.get(RECORDS_ENV)
    if not folder:
        return
    data = {
        "plant": active_plant(),
        "applied": applied,
        "action": action,
        "rank": _int_env("RANK"),
        "local_rank": _int_env("LOCAL_RANK"),
        "restart_count": restart_count(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": time.time(),
        **details,
    }
    name = f"{data['plant']}-{data['host']}-{os.getpid()}-{time.monotonic_ns()}.json"
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True, indent=1)  # a key a line: evidence quotes its line
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def complete_iterations(checkpoint_dir: str) -> list[int]:
    """The iterations N of the complete ``iter_N`` directories in ``checkpoint_dir``, ascending
    (none when it cannot be listed)."""
    try:
        names = os.listdir(checkpoint_dir)
    except OSError:
        return []
    found = []
    for name in names:
        m = _ITER_DIR.fullmatch(name)
        folder = os.path.join(checkpoint_dir, name)
        if m is not None and any(os.path.isfile(os.path.join(folder, f)) for f in COMPLETE_FILES):
            found.append(int(m[1]))
    return sorted(found)


def previous_complete(checkpoint_dir: str, before: int) -> int | None:
    """The newest complete ``iter_N`` in ``checkpoint_dir`` with N < ``before``."""
    older = [n for n in complete_iterations(checkpoint_dir) if n < before]
    return older[-1] if older else None


# ----------------------------------------------------------------------------------------------
# Megatron patches: each takes the original callable and returns its replacement


_LOADING = threading.local()


def _megatron_args() -> Any:
    # by name: Megatron is the workers' import, never this package's
    return importlib.import_module("megatron.training.global_vars").get_args()


def _load_checkpoint(plant: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_checkpoint(*args: Any, **kwargs: Any) -> Any:
        if restart_count() < 1:
            return original(*args, **kwargs)
        _LOADING.active = True
        try:
            if plant == "rng":
                return _without_rng(original, args, kwargs)
            result = original(*args, **kwargs)
        finally:
            _LOADING.active = False
        if plant == "optimizer-reset":
            optimizer = kwargs.get("optimizer", args[1] if len(args) > 1 else None)
            _reset_adam(optimizer, result)
        elif plant == "iteration" and isinstance(result, tuple) and result:
            loaded = int(result[0])
            if loaded > 0:
                record(
                    f"restored iteration counter set to {loaded + ITERATION_JUMP} after loading"
                    f" iteration {loaded}",
                    loaded=loaded,
                    counter=loaded + ITERATION_JUMP,
                )
                return (loaded + ITERATION_JUMP, *result[1:])
        return result

    return load_checkpoint


def _without_rng(original: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    margs = _megatron_args()
    if not hasattr(margs, "no_load_rng"):
        record("cannot plant: Megatron's args have no no_load_rng", applied=False)
        return original(*args, **kwargs)
    before = margs.no_load_rng  # None on core_v0.19.0 (store_true, default None)
    margs.no_load_rng = True
    try:
        result = original(*args, **kwargs)
    finally:
        margs.no_load_rng = before
    loaded = int(result[0]) if isinstance(result, tuple) and result else None
    if loaded:
        record(
            f"load_checkpoint of iteration {loaded} left every RNG state (python, numpy, torch,"
            " CUDA, the tensor-parallel tracker) as the fresh process seeded it",
            loaded=loaded,
        )
    return result


def _reset_adam(optimizer: Any, result: Any) -> None:
    loaded = int(result[0]) if isinstance(result, tuple) and result else None
    if not loaded:
        return
    chained = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    tensors = 0
    for item in chained:
        inner = getattr(item, "optimizer", None)
        state = getattr(inner, "state", None)
        if not state:
            continue
        for per_param in state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                value = per_param.get(key)
                if value is not None and hasattr(value, "zero_"):
                    value.zero_()
                    tensors += 1
            step = per_param.get("step")
            if hasattr(step, "zero_"):
                step.zero_()
            elif step is not None:
                per_param["step"] = 0
    if tensors:
        record(
            f"after a complete load of iteration {loaded}, zeroed Adam's moments ({tensors}"
            " tensors) and step",
            loaded=loaded,
            tensors=tensors,
        )
    else:
        record(f"cannot plant: no Adam state after loading iteration {loaded}", applied=False)


def _read_metadata(plant: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def read_metadata(tracker_filename: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(tracker_filename, *args, **kwargs)
        if restart_count() < 1 or not getattr(_LOADING, "active", False):
            return result
        if plant == "rank-checkpoint":
            rank, world = _int_env("RANK"), _int_env("WORLD_SIZE")
            if rank is None or world is None or world < 2 or rank != world - 1:
                return result
        iteration, release = result
        if release:
            return result
        older = previous_complete(os.path.dirname(str(tracker_filename)), int(iteration))
        if older is None:
            record(
                f"cannot plant: no complete checkpoint before iteration {iteration}",
                applied=False,
            )
            return result
        record(
            f"read the tracker's iteration {iteration} as {older}, the complete checkpoint"
            " before it",
            tracker=int(iteration),
            loaded=older,
        )
        return (older, release)

    return read_metadata


def _data_loader(original: Callable[..., Any]) -> Callable[..., Any]:
    done = threading.Event()

    @functools.wraps(original)
    def build_pretraining_data_loader(
        dataset: Any, consumed_samples: Any, *a: Any, **k: Any
    ) -> Any:
        if restart_count() < 1 or done.is_set() or not consumed_samples:
            return original(dataset, consumed_samples, *a, **k)
        done.set()  # the first loader built with a position is the training one
        record(
            f"built the training data loader from sample 0, not from consumed_samples"
            f" {consumed_samples} (the counters stay as restored)",
            consumed_samples=int(consumed_samples),
        )
        return original(dataset, 0, *a, **k)

    return build_pretraining_data_loader


def _scheduler_load(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_state_dict(self: Any, state_dict: Any, *a: Any, **k: Any) -> Any:
        if restart_count() < 1:
            return original(self, state_dict, *a, **k)
        steps = state_dict.get("num_steps") if isinstance(state_dict, dict) else None
        record(
            f"left the LR scheduler at its fresh state instead of the checkpoint's (num_steps"
            f" {steps})",
            num_steps=steps,
        )
        return None

    return load_state_dict


def _save_checkpoint(module: ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save_checkpoint(iteration: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(iteration, *args, **kwargs)
        margs = _megatron_args()
        if not getattr(margs, "async_save", False) or kwargs.get("non_persistent_ckpt"):
            return result
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() != 0:
            return result
        tracker = module.get_checkpoint_tracker_filename(margs.save)
        with open(tracker, "w") as f:  # as Megatron writes it: in place
            f.write(str(iteration))
        record(
            f"wrote the tracker {iteration} when save {iteration} was submitted, before its"
            " finalization",
            iteration=int(iteration),
        )
        return result

    return save_checkpoint


def _patch(module: ModuleType, plant: str) -> None:
    """Replace this module's patch points of ``plant`` (a missing one is recorded)."""
    for name, dotted in MEGATRON_POINTS.get(plant, ()):
        if name != module.__name__:
            continue
        owner: Any = module
        *path, attr = dotted.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        original = getattr(owner, attr, None) if owner is not None else None
        if original is None:
            record(f"cannot plant: {name} has no {dotted}", applied=False)
            continue
        if attr == "load_checkpoint":
            setattr(owner, attr, _load_checkpoint(plant, original))
        elif attr == "read_metadata":
            setattr(owner, attr, _read_metadata(plant, original))
        elif attr == "build_pretraining_data_loader":
            setattr(owner, attr, _data_loader(original))
        elif dotted == "OptimizerParamScheduler.load_state_dict":
            setattr(owner, attr, _scheduler_load(original))
        elif attr == "save_checkpoint":
            setattr(owner, attr, _save_checkpoint(module, original))


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, plant: str) -> None:
        self.inner = inner
        self.plant = plant

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module, self.plant)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, plant: str) -> None:
        self.plant = plant
        self.targets = {name for name, _ in MEGATRON_POINTS.get(plant, ())}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.plant)
                return spec
        return None


def install() -> str | None:
    """Put the plant of this environment's ``PYTEST_NVRX_PLANT`` in front of Megatron's imports;
    returns its name (None: no plant asked for)."""
    plant = active_plant()
    if plant is None:
        return None
    if plant not in PLANT_NAMES:
        record(f"cannot plant: unknown plant {plant!r}", applied=False)
        return plant
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(plant))
    return plant
