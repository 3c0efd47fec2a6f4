"""Checkpoints of the reference workload: Megatron's async-save lifecycle over torch DCP, the
tracker and the ranks' agreement on it, DCP's persistent checkpoint worker, and the resume from
the tracker's iteration (with the restore breaks ``--break-restore`` asks for).

A submitted save is not a checkpoint: the tracker ``<save>/latest_checkpointed_iteration.txt``
moves only when the save is finalized, after all ranks agree.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save

from pytest_nvrx.evidence.tracker import read_tracker as read_core_tracker
from pytest_nvrx.layout import TRACKER_NAME, iteration_dir_name, iteration_of_dir_name
from pytest_nvrx.worker.plant_hook.nvrx_plants import ITERATION_JUMP
from pytest_nvrx.worker.plant_hook.nvrx_plants import record as record_plant
from pytest_nvrx.workloads.ref_sections import Monitor, section
from pytest_nvrx.workloads.ref_trainer import (
    BREAKABLE_PARTS,
    LOADED_PARTS,
    LoadError,
    Trainer,
)

#: The other ``--break-restore`` values: not a part left out but a wrong restore point.
#: ``previous``: the last rank restores the newest complete checkpoint before the tracker's;
#: ``iteration``: the restored iteration counter jumps by the save interval.
RESTORE_BREAKS: tuple[str, ...] = ("previous", "iteration")
#: ``--break-save`` values (every cycle): ``tracker-at-submit``: rank 0 writes the tracker when a
#: save is submitted, not when it is finalized (the durability bug the walkthrough warns about).
SAVE_BREAKS: tuple[str, ...] = ("tracker-at-submit",)
#: Where the background write runs (``--async-writer``): a DCP thread in the rank, or DCP's
#: persistent worker process per rank (a ``spawn`` child, like Megatron's persistent worker).
ASYNC_WRITERS: tuple[str, ...] = tuple(t.value for t in AsyncCheckpointerType)
#: How long a normal shutdown waits for the persistent worker to leave before killing it.
WORKER_STOP_TIMEOUT_S = 10.0


class SaveError(RuntimeError):
    """An async save failed on at least one rank."""


def read_tracker(checkpoint_dir: Path) -> int | None:
    """The last finalized iteration; None when there is no tracker. Empty/invalid: LoadError.

    Read by the core's one reader (evidence/tracker.py); a release tracker is no iteration.
    """
    tracker = checkpoint_dir / TRACKER_NAME
    read = read_core_tracker(tracker, checkpoint_dir)
    if not read.exists:
        return None
    if read.iteration is not None:
        return read.iteration
    # every rank must reach the agreement all-reduce: no error may escape as another type
    if read.refused or read.text is None:
        raise LoadError(f"cannot read {tracker}: {read.error}")
    if read.text.startswith("-") and read.text[1:].isascii() and read.text[1:].isdigit():
        raise LoadError(f"{tracker} holds a negative iteration {read.text}")
    raise LoadError(f"{tracker} holds {read.text!r}, not an iteration number")


def agreed_tracker(checkpoint_dir: Path) -> int | None:
    """Read the tracker on every rank and make sure all ranks saw the same value."""
    try:
        value: int | None = read_tracker(checkpoint_dir)
        code = -1 if value is None else value
    except LoadError:
        value, code = None, -2
    codes = torch.tensor([code, -code], dtype=torch.int64)
    dist.all_reduce(codes, op=dist.ReduceOp.MAX)
    if int(codes[0]) != -int(codes[1]):
        raise LoadError(f"ranks read different trackers in {checkpoint_dir} (this rank: {code})")
    if code == -2:
        read_tracker(checkpoint_dir)  # re-raise this rank's own error
    return value


@dataclass
class PendingSave:
    iteration: int
    future: Future[Any]


def checkpoint_worker() -> BaseProcess | None:
    """DCP's persistent checkpoint worker of this process (``--async-writer process``), or None
    before the first save scheduled it. A ``multiprocessing`` ``spawn`` child, daemonic, in the
    rank's process group and session; it holds its own gloo group with the other ranks' workers.
    Private torch state (2.15): ``_async_process_executor._CHECKPOINT_PROCESS._save_process``."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    worker = executor._CHECKPOINT_PROCESS
    if worker is None:
        return None
    process: BaseProcess = worker._save_process
    return process


def start_checkpoint_worker(group: dist.ProcessGroup) -> BaseProcess:
    """Start this process's persistent checkpoint worker now (``--async-writer process``), as
    Megatron's ``initialize_megatron`` starts its persistent async worker before training
    (``--use-persistent-ckpt-worker``). DCP would start it inside the first save's background
    write, so that save's finalization (a ``checkpointing`` section) would include a spawned
    interpreter importing torch and its gloo group's setup (issue #23: 15.3 s on a loaded 2-core
    host without bytecode, past the 15 s deadline). A collective: every rank calls it. Private
    torch state (2.15), as :func:`checkpoint_worker`."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    if executor._CHECKPOINT_PROCESS is None:
        info = executor._ProcessGroupInitInfo(group)
        executor._CHECKPOINT_PROCESS = executor._AsyncCheckpointProcess(pg_init_info=info)
    process = checkpoint_worker()
    assert process is not None
    return process


def stop_checkpoint_worker(timeout: float = WORKER_STOP_TIMEOUT_S) -> int | None:
    """Stop this process's persistent checkpoint worker, if any; returns its exit code.

    Asks it to leave (DCP's own TERMINATE request: it destroys its process group and returns),
    and kills it if it is still there after ``timeout`` (a worker stuck in a collective with a
    dead peer). torch itself only does this from a finalizer, or multiprocessing's exit handler
    sends SIGTERM: an explicit stop keeps the shutdown orderly and bounded."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    worker = executor._CHECKPOINT_PROCESS
    if worker is None:
        return None
    executor._CHECKPOINT_PROCESS = None
    process = worker._save_process
    if process.is_alive():
        with contextlib.suppress(OSError):  # a dead worker's pipe: nothing to ask
            worker._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join(timeout)
    code: int | None = process.exitcode
    return code


class AsyncCheckpointer:
    """Megatron's async-save lifecycle over torch DCP.

    ``save`` finalizes the previous save (own ``checkpointing`` section), then stages a snapshot
    and schedules background I/O (another ``checkpointing`` section). ``finalize`` waits for the
    background write, agrees across ranks, and only then rank 0 writes the tracker. The write
    runs in a DCP thread of the rank (``thread``) or in DCP's persistent worker process of the
    rank (``process``); the lifecycle is the same.
    """

    def __init__(
        self,
        checkpoint_dir: Path,
        group: dist.ProcessGroup,
        monitor: Monitor,
        log: Callable[[str], None],
        writer: AsyncCheckpointerType = AsyncCheckpointerType.THREAD,
        *,
        tracker_at_submit: bool = False,
        planted_at_submit: bool = False,
    ) -> None:
        self.checkpoint_dir = checkpoint_dir
        # --break-save tracker-at-submit: publish N as soon as its save is submitted (broken);
        # the self-test's plant of the same name does it without a word (its record says it)
        self.tracker_at_submit = tracker_at_submit or planted_at_submit
        self.planted_at_submit = planted_at_submit
        self.group = group
        self.monitor = monitor
        self.log = log
        self.writer = writer
        self.rank = dist.get_rank()
        self.pending: PendingSave | None = None
        self.last_scheduled: int | None = None

    def save(self, iteration: int, state: Callable[[], dict[str, Any]]) -> None:
        self.finalize()
        with section(self.monitor, "checkpointing"):
            path = self.checkpoint_dir / iteration_dir_name(iteration)
            future = dcp_async_save(
                state(),
                checkpoint_id=str(path),
                process_group=self.group,
                async_checkpointer_type=self.writer,
            )
            assert isinstance(future, Future)  # no async stager: a Future, either writer
            self.pending = PendingSave(iteration, future)
            self.last_scheduled = iteration
            if self.rank == 0:
                self.log(f"save scheduled iteration {iteration} path {path}")
            if self.tracker_at_submit:
                if self.rank == 0:
                    self._write_tracker(iteration)
                    if self.planted_at_submit:
                        record_plant(
                            f"wrote the tracker {iteration} when save {iteration} was submitted,"
                            " before its finalization",
                            iteration=iteration,
                        )
                    else:
                        self.log(
                            f"tracker written at submit of iteration {iteration} on purpose "
                            "(--break-save tracker-at-submit)"
                        )
                # Every rank goes on only once the tracker names N (Megatron's barrier after its
                # tracker write): what each rank reads next is the same, not a race with rank 0.
                # The default group: the checkpoint group belongs to the background write.
                dist.barrier()

    def finalize(self) -> None:
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        with section(self.monitor, "checkpointing"):
            error: BaseException | None = None
            try:
                pending.future.result()
            except Exception as exc:
                error = exc
                # Drop the writer's finished frames: after a process writer's send to a dead
                # worker failed, they hold an exported pickle buffer whose release at
                # interpreter exit crashed the rank (SIGSEGV instead of exit 1, measured).
                traceback.clear_frames(exc.__traceback__)
            ok = torch.tensor([0 if error else 1])
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if not int(ok):
                reason = f"{error!r}" if error else "failed on another rank"
                self.log(f"save failed iteration {pending.iteration}: {reason}")
                raise SaveError(f"async save of iteration {pending.iteration} failed: {reason}")
            if self.rank == 0:
                self._write_tracker(pending.iteration)
                self.log(f"save completed iteration {pending.iteration}")

    def _write_tracker(self, iteration: int) -> None:
        # Plain open/write, as Megatron: a poller may briefly read it empty.
        with open(self.checkpoint_dir / TRACKER_NAME, "w") as f:
            f.write(str(iteration))

    def abandon(self) -> None:
        """Wait for an in-flight write without finalizing it (tests, error paths)."""
        if self.pending is not None:
            with contextlib.suppress(Exception):
                self.pending.future.result()
            self.pending = None

    def start_worker(self) -> None:
        """Start the persistent worker (``process``) before training; no-op otherwise."""
        if self.writer is AsyncCheckpointerType.PROCESS:
            start_checkpoint_worker(self.group)

    def close(self) -> None:
        """Stop the persistent worker (``process``) once no save is pending; no-op otherwise."""
        if self.writer is AsyncCheckpointerType.PROCESS:
            stop_checkpoint_worker()


def load_checkpoint(
    trainer: Trainer,
    checkpoint_dir: Path,
    group: dist.ProcessGroup,
    log: Callable[[str], None],
    *,
    skip: Sequence[str] = (),
    restarts: int = 0,
    jump: int = 1,
    plant: str | None = None,
) -> int | None:
    """Restore from the tracker's iteration; returns it, or None when starting from scratch.

    The load line lists only the parts restored; each part in ``skip`` is left out and one
    more line says so (``restore skipped ...``). The restore breaks in ``skip`` (RESTORE_BREAKS)
    each say what they did in a line of their own: ``previous`` (the last rank loads the newest
    complete checkpoint before the tracker's, and its load line says so; its iteration and
    ``consumed_samples`` counters are the tracker's, so that the ranks stay in step) and
    ``iteration`` (the iteration counter jumps by ``jump`` past the loaded one).

    ``plant`` (the self-test's, from ``PYTEST_NVRX_PLANT``) plants the same bugs silently, as a
    real one would: the load line says what a correct load says, and only the plant's record
    (:func:`pytest_nvrx.worker.plant_hook.nvrx_plants.record`) tells what it did."""
    iteration = agreed_tracker(checkpoint_dir)
    if iteration is None:
        log(f"no checkpoint found at {checkpoint_dir / TRACKER_NAME}, starting from scratch")
        return None
    if plant is not None:
        return _planted_load(trainer, checkpoint_dir, iteration, group, log, plant)
    parts_skipped = [p for p in skip if p in BREAKABLE_PARTS]
    source = iteration
    if "previous" in skip and trainer.rank == trainer.world_size - 1:
        older = previous_checkpoint(checkpoint_dir, iteration)
        if older is None:
            raise LoadError(
                f"--break-restore previous: no complete checkpoint before iteration {iteration}"
                f" in {checkpoint_dir}"
            )
        source = older
    parts = trainer.load(checkpoint_dir, source, group, skip=parts_skipped)
    log(
        f"load checkpoint iteration {source} ({', '.join(parts)}) consumed_samples "
        f"{trainer.consumed_samples} path {checkpoint_dir / iteration_dir_name(source)}"
    )
    skipped = [p for p in BREAKABLE_PARTS if p in skip]
    if skipped:
        log(
            f"restore skipped {', '.join(skipped)} of iteration {iteration} on purpose "
            f"(--break-restore, restart_count {restarts})"
        )
    if source != iteration:
        trainer.consumed_samples += (iteration - source) * trainer.global_batch_size
        trainer.iteration = iteration
        log(
            f"restore broke previous on purpose: loaded iteration {source}, not the tracker's "
            f"{iteration}; counters set to iteration {iteration} consumed_samples "
            f"{trainer.consumed_samples} (--break-restore, restart_count {restarts})"
        )
    if "iteration" in skip:
        trainer.iteration += jump
        log(
            f"restore broke iteration on purpose: counter set to {trainer.iteration} after "
            f"loading iteration {source} (--break-restore, restart_count {restarts})"
        )
    return iteration


def previous_checkpoint(checkpoint_dir: Path, iteration: int) -> int | None:
    """The newest complete checkpoint (``iter_N/.metadata`` on disk) before ``iteration``."""
    found = [
        n
        for path in checkpoint_dir.glob("iter_*/.metadata")
        if (n := iteration_of_dir_name(path.parent.name)) is not None
    ]
    older = [n for n in found if n < iteration]
    return max(older) if older else None


#: Restore plants that leave one part of the checkpoint out (the part of the same name).
_PLANTED_SKIPS = {"rng": "rng", "data": "data", "scheduler": "scheduler"}


def _planted_load(
    trainer: Trainer,
    checkpoint_dir: Path,
    iteration: int,
    group: dist.ProcessGroup,
    log: Callable[[str], None],
    plant: str,
) -> int:
    """A replacement's restore with the self-test's ``plant`` in it; the load line is the one a
    correct load prints (of the checkpoint it read), the record says what was done."""
    source = iteration
    if plant == "previous-checkpoint" or (
        plant == "rank-checkpoint"
        and trainer.world_size > 1
        and trainer.rank == trainer.world_size - 1
    ):
        older = previous_checkpoint(checkpoint_dir, iteration)
        if older is None:
            record_plant(
                f"cannot plant: no complete checkpoint before iteration {iteration}", applied=False
            )
        else:
            source = older
    skip = tuple(part for name, part in _PLANTED_SKIPS.items() if name == plant)
    trainer.load(checkpoint_dir, source, group, skip=skip)
    if plant == "rank-checkpoint" and source != iteration:
        # the ranks stay in step: the other checkpoint's weights under the tracker's counters
        trainer.consumed_samples += (iteration - source) * trainer.global_batch_size
        trainer.iteration = iteration
    log(
        f"load checkpoint iteration {source} ({LOADED_PARTS}) consumed_samples "
        f"{trainer.consumed_samples} path {checkpoint_dir / iteration_dir_name(source)}"
    )
    if skip:
        record_plant(f"restore of iteration {source} left out the {skip[0]} state", loaded=source)
    elif source != iteration:
        record_plant(
            f"read the tracker's iteration {iteration} as {source}, the complete checkpoint before"
            " it",
            tracker=iteration,
            loaded=source,
        )
    elif plant == "optimizer-reset":
        tensors = trainer.reset_optimizer_moments()
        record_plant(
            f"after a complete load of iteration {source}, zeroed AdamW's moments ({tensors}"
            " tensors) and step",
            loaded=source,
            tensors=tensors,
        )
    elif plant == "iteration":
        trainer.iteration += ITERATION_JUMP
        record_plant(
            f"restored iteration counter set to {trainer.iteration} after loading iteration"
            f" {source}",
            loaded=source,
            counter=trainer.iteration,
        )
    return iteration
