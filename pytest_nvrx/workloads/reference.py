"""CPU reference workload: a tiny GPT trained over gloo, launched by ft_launcher like Megatron.

It stands in for Megatron-LM's ``pretrain_gpt.py`` where there is no GPU, and keeps the parts of
Megatron's behaviour that fault-recovery qualification looks at:

* NVRx sections with Megatron's names: ``setup`` (opened before distributed init, closed before
  the first step), ``step`` (around every training step), ``checkpointing`` (around save
  preparation and, separately, around async finalization).
* Asynchronous checkpoints (torch DCP ``async_save`` on a gloo group of their own) into
  ``<save>/iter_%07d/``. A submitted save is not a checkpoint: the tracker
  ``<save>/latest_checkpointed_iteration.txt`` moves only when the save is finalized, which
  happens when the next save is scheduled and at the end of training, after all ranks agree.
* ``--load`` restores model, optimizer, scheduler, RNG and data position from the tracker's
  iteration; an absent tracker starts from scratch, an empty or invalid one fails loudly.
* Every part of that state matters to the numbers it prints: dropout draws from the restored
  RNG on every rank, the data order is a seeded shuffle read from a restored position, the LR
  schedule moves every step, and AdamW's moments shape every update. Each iteration line prints
  loss, LR and gradient norm exactly (``repr``), so a resume that loses any part shows.
* ``--break-restore PART`` makes a replacement (restart count >= 1) deliberately skip restoring
  one part, restore the previous checkpoint on its last rank (``previous``) or jump the restored
  iteration counter (``iteration``), and say so; ``--break-save tracker-at-submit`` makes rank 0
  write the tracker when a save is submitted (every cycle): the broken resumes the criteria must
  catch, produced for real.

Its log lines (``[ref] <UTC time> rank <r> <event>``) are documented in
``docs/reference-workload.md``; the evidence adapter parses exactly those.

Run as ``python -m pytest_nvrx.workloads.reference`` (or via ``runpy.run_module(...,
run_name="__main__")``) in every worker that ft_launcher (or torchrun) starts.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save

from pytest_nvrx.evidence.tracker import read_tracker as read_core_tracker
from pytest_nvrx.layout import TRACKER_NAME, iteration_dir_name

LOG_PREFIX = "[ref]"
#: What a restore brings back, in the order the load line lists it.
RESTORED_PARTS: tuple[str, ...] = ("model", "optimizer", "scheduler", "rng", "data")
LOADED_PARTS = ", ".join(RESTORED_PARTS)
#: Parts ``--break-restore`` may leave out (the model is always restored).
BREAKABLE_PARTS: tuple[str, ...] = ("optimizer", "rng", "data", "scheduler")
#: The other ``--break-restore`` values: not a part left out but a wrong restore point.
#: ``previous``: the last rank restores the newest complete checkpoint before the tracker's;
#: ``iteration``: the restored iteration counter jumps by the save interval.
RESTORE_BREAKS: tuple[str, ...] = ("previous", "iteration")
#: ``--break-save`` values (every cycle): ``tracker-at-submit``: rank 0 writes the tracker when a
#: save is submitted, not when it is finalized (the durability bug the walkthrough warns about).
SAVE_BREAKS: tuple[str, ...] = ("tracker-at-submit",)
#: Set by torchelastic and ft_launcher in every worker: 0 in the first cycle, then 1, 2, ...
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
#: Where the background write runs (``--async-writer``): a DCP thread in the rank, or DCP's
#: persistent worker process per rank (a ``spawn`` child, like Megatron's persistent worker).
ASYNC_WRITERS: tuple[str, ...] = tuple(t.value for t in AsyncCheckpointerType)
#: How long a normal shutdown waits for the persistent worker to leave before killing it.
WORKER_STOP_TIMEOUT_S = 10.0


class EventLog:
    """One timestamped line per event on stdout, flushed: ft_launcher captures it per cycle."""

    def __init__(self, rank: int, stream: TextIO | None = None) -> None:
        self.rank = rank
        self._stream = stream

    def __call__(self, event: str) -> None:
        ts = datetime.now(UTC).isoformat(timespec="milliseconds")
        stream = self._stream if self._stream is not None else sys.stdout
        # One write per line, its newline included: under PYTHONUNBUFFERED print() writes the
        # text and the newline apart, and the rank's persistent checkpoint worker (same stdout)
        # once wrote its own log line in between ("... grad_norm 0.54[0] 2026-... Completed
        # checkpoint save request"), a replayed value no longer equal (a CI flake).
        stream.write(f"{LOG_PREFIX} {ts} rank {self.rank} {event}\n")
        stream.flush()


# --- NVRx sections -------------------------------------------------------------------------------


class Monitor(Protocol):
    def start_section(self, section: str) -> None: ...
    def end_section(self, section: str) -> None: ...
    def shutdown(self) -> None: ...


class NullMonitor:
    """No monitoring (``--no-ft``): outside ft_launcher, e.g. under torchrun or in tests."""

    def start_section(self, section: str) -> None:
        pass

    def end_section(self, section: str) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def describe(self) -> str:
        return "ft monitoring disabled (--no-ft)"


class FtMonitor:
    """NVRx ``RankMonitorClient`` connected to this rank's monitor, as Megatron's ft_integration."""

    def __init__(self) -> None:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        self._client = RankMonitorClient()
        self._client.init_workload_monitoring()

    def start_section(self, section: str) -> None:
        self._client.start_section(section)

    def end_section(self, section: str) -> None:
        self._client.end_section(section)

    def shutdown(self) -> None:
        self._client.shutdown_workload_monitoring()

    def describe(self) -> str:
        timeouts = self._client.section_timeouts
        sections = ",".join(f"{k}:{v}" for k, v in sorted(timeouts.section.items()))
        return (
            f"ft monitoring initialized sections {sections or '-'} "
            f"out_of_section {timeouts.out_of_section}"
        )


class SectionClock:
    """A monitor that also times each section (monotonic): the longest of each kind goes into
    the rank's last line, the measurement behind the reference deadlines (docs/options.md)."""

    def __init__(self, inner: Monitor) -> None:
        self.inner = inner
        self.longest: dict[str, float] = {}
        self._opened: dict[str, float] = {}

    def start_section(self, section: str) -> None:
        self._opened[section] = time.monotonic()
        self.inner.start_section(section)

    def end_section(self, section: str) -> None:
        self.inner.end_section(section)
        began = self._opened.pop(section, None)
        if began is not None:
            took = time.monotonic() - began
            self.longest[section] = max(took, self.longest.get(section, 0.0))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def summary(self) -> str:
        kinds = " ".join(f"{name} {took:.3f}" for name, took in sorted(self.longest.items()))
        return f"longest sections (s) {kinds or '-'}"


@contextlib.contextmanager
def section(monitor: Monitor, name: str) -> Iterator[None]:
    monitor.start_section(name)
    try:
        yield
    finally:
        monitor.end_section(name)


# --- model and data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 128
    seq_length: int = 32
    hidden_size: int = 32
    num_layers: int = 2
    num_attention_heads: int = 4
    dropout: float = 0.1


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.dropout = cfg.dropout
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, s, h)))
        out: torch.Tensor = x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))
        return out


class TinyGPT(nn.Module):
    """Token + position embedding, pre-LN transformer blocks, LM head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = nn.Embedding(cfg.seq_length, cfg.hidden_size)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1])
        x = self.drop(self.tok(tokens) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


def mock_sample(seed: int, index: int, cfg: ModelConfig) -> torch.Tensor:
    """Sample ``index`` of the mock dataset: a function of (seed, index) only. Arithmetic
    sequences with 10 % noise give the model something to learn (the loss falls visibly)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + index) % (2**63))
    n = cfg.seq_length + 1
    start = int(torch.randint(cfg.vocab_size, (1,), generator=g))
    stride = int(torch.randint(1, 8, (1,), generator=g))
    tokens = (start + stride * torch.arange(n)) % cfg.vocab_size
    noise = torch.rand(n, generator=g) < 0.1
    return torch.where(noise, torch.randint(cfg.vocab_size, (n,), generator=g), tokens)


class ShuffledSampler:
    """The order in which the dataset is read: a seeded shuffle per epoch, as Megatron's random
    sampler. Epoch ``e`` reads a permutation drawn from ``(seed, e)``; the state is where the
    reader stands (``epoch``, ``position`` in that epoch's permutation), saved and restored as
    the data loader's own state, apart from the ``consumed_samples`` progress counter. Every rank
    holds the same sampler and reads its slice of each global batch.
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed((self.seed * 7_919 + epoch) % (2**63))
        return [int(i) for i in torch.randperm(self.num_samples, generator=g)]

    def take(self, count: int) -> list[int]:
        """The next ``count`` sample indices; an epoch boundary starts the next permutation."""
        out: list[int] = []
        while len(out) < count:
            if self.position == self.num_samples:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            step = min(count - len(out), self.num_samples - self.position)
            out += self._order[self.position : self.position + step]
            self.position += step
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.num_samples:
            raise ValueError(f"data position {state} is outside {self.num_samples} samples")
        self.epoch, self.position = epoch, position
        self._order = self._permutation(epoch)


# --- training ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig:
    train_iters: int
    seed: int = 1234
    micro_batch_size: int = 2
    lr: float = 1e-2
    min_lr: float = 1e-3
    lr_warmup_iters: int = 2
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    step_time: float = 0.0
    data_samples: int = 100


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step reports: the loss averaged over ranks (before the update), the
    learning rate the update used, and the global gradient norm before clipping."""

    loss: float
    learning_rate: float
    grad_norm: float


class LoadError(RuntimeError):
    """The checkpoint named by the tracker cannot be restored."""


class SaveError(RuntimeError):
    """An async save failed on at least one rank."""


class Trainer:
    """Model, optimizer, scheduler, data order and progress of one rank; the default group
    must exist."""

    def __init__(self, model_cfg: ModelConfig, cfg: TrainConfig) -> None:
        self.model_cfg = model_cfg
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = TinyGPT(model_cfg)
        self.optimizer = self._new_optimizer()
        self.scheduler = self._new_scheduler()
        self.sampler = ShuffledSampler(cfg.data_samples, cfg.seed)
        self._seed_rng()
        self.iteration = 0
        self.consumed_samples = 0

    def _new_optimizer(self) -> torch.optim.AdamW:
        return torch.optim.AdamW(
            self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )

    def _new_scheduler(self) -> torch.optim.lr_scheduler.LambdaLR:
        """A schedule at its start; it sets the optimizer's LR to the first step's."""
        return torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)

    def _seed_rng(self) -> None:
        """The fresh-start RNG state: dropout differs per data-parallel rank."""
        torch.manual_seed(self.cfg.seed + 1 + self.rank)

    @property
    def global_batch_size(self) -> int:
        return self.cfg.micro_batch_size * self.world_size

    def _lr_factor(self, step: int) -> float:
        """Linear warm-up, then cosine decay to ``min_lr`` at ``train_iters`` (Megatron-style)."""
        cfg = self.cfg
        if step < cfg.lr_warmup_iters:
            return (step + 1) / cfg.lr_warmup_iters
        span = max(1, cfg.train_iters - cfg.lr_warmup_iters)
        progress = min(1.0, (step - cfg.lr_warmup_iters) / span)
        min_factor = cfg.min_lr / cfg.lr
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * progress))

    def _batch(self) -> torch.Tensor:
        """This rank's micro-batch: its slice of the next global batch in the shuffled order."""
        indices = self.sampler.take(self.global_batch_size)
        mine = indices[self.rank * self.cfg.micro_batch_size :][: self.cfg.micro_batch_size]
        return torch.stack([mock_sample(self.cfg.seed, i, self.model_cfg) for i in mine])

    def train_step(self) -> StepResult:
        """One optimizer step over the global batch."""
        if self.cfg.step_time > 0:
            # Stand-in for GPU compute, so a short run lasts long enough to be interrupted.
            time.sleep(self.cfg.step_time)
        tokens = self._batch()
        self.model.train()
        logits = self.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        params = [p for p in self.model.parameters() if p.grad is not None]
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
        dist.all_reduce(flat)  # data-parallel gradient and loss average in one collective
        flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_grad)
        lr = float(self.optimizer.param_groups[0]["lr"])  # what this update uses
        self.optimizer.step()
        self.scheduler.step()
        self.iteration += 1
        self.consumed_samples += self.global_batch_size
        return StepResult(loss=float(flat[-1]), learning_rate=lr, grad_norm=float(grad_norm))

    def _rng_key(self) -> str:
        return f"rng_rank{self.rank}"

    def _fingerprint(self) -> dict[str, Any]:
        """What must match between the checkpoint and this run for an exact resume."""
        return {
            **asdict(self.model_cfg),
            "world_size": self.world_size,
            "seed": self.cfg.seed,
            "micro_batch_size": self.cfg.micro_batch_size,
            "data_samples": self.cfg.data_samples,
        }

    def checkpoint_state(self) -> dict[str, Any]:
        """DCP state dict. Replicated entries are written once; RNG is per rank (own key)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_sd,
            "optimizer": optim_sd,
            "scheduler": self.scheduler.state_dict(),
            "data": self.sampler.state_dict(),
            "progress": {"iteration": self.iteration, "consumed_samples": self.consumed_samples},
            "config": self._fingerprint(),
            self._rng_key(): {"torch": torch.get_rng_state()},
        }

    def load(
        self,
        checkpoint_dir: Path,
        iteration: int,
        group: dist.ProcessGroup,
        skip: Collection[str] = (),
    ) -> tuple[str, ...]:
        """Restore the checkpoint of ``iteration``; returns the parts restored, in
        RESTORED_PARTS order. A part in ``skip`` is left as a fresh start has it (fresh AdamW,
        schedule at its start, fresh-start RNG, data order from its beginning); the iteration
        and ``consumed_samples`` counters are always restored."""
        unknown = set(skip) - set(BREAKABLE_PARTS)
        if unknown:
            raise ValueError(f"cannot skip {sorted(unknown)}; breakable: {BREAKABLE_PARTS}")
        path = checkpoint_dir / iteration_dir_name(iteration)
        if not (path / ".metadata").is_file():
            raise LoadError(f"tracker names iteration {iteration} but {path}/.metadata is missing")
        state = self.checkpoint_state()  # template: DCP loads in place into these objects
        try:
            dcp_load(state, checkpoint_id=str(path), process_group=group)
        except Exception as exc:
            raise LoadError(f"cannot read {path}: {exc!r}") from exc
        if state["config"] != self._fingerprint():
            raise LoadError(
                f"{path} was written by a different configuration: {state['config']} "
                f"!= {self._fingerprint()}"
            )
        if state["progress"]["iteration"] != iteration:
            raise LoadError(
                f"{path} holds iteration {state['progress']['iteration']}, not {iteration}"
            )
        set_model_state_dict(self.model, state["model"])
        if "optimizer" in skip:
            # DCP loaded the template in place, into this optimizer's own state: replace it.
            self.optimizer = self._new_optimizer()
            self.scheduler = self._new_scheduler()
        else:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        if "scheduler" in skip:
            self.scheduler = self._new_scheduler()
        else:
            self.scheduler.load_state_dict(state["scheduler"])
            # As Megatron's scheduler on load: the LR comes from the schedule, whatever the
            # optimizer's param groups held (the same value when both were restored).
            for param_group, lr in zip(
                self.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True
            ):
                param_group["lr"] = lr
        if "rng" not in skip:
            torch.set_rng_state(state[self._rng_key()]["torch"])
        else:
            self._seed_rng()
        if "data" not in skip:
            try:
                self.sampler.load_state_dict(state["data"])
            except ValueError as exc:
                raise LoadError(f"{path}: {exc}") from None
        else:
            self.sampler = ShuffledSampler(self.cfg.data_samples, self.cfg.seed)
        self.iteration = int(state["progress"]["iteration"])
        self.consumed_samples = int(state["progress"]["consumed_samples"])
        return tuple(p for p in RESTORED_PARTS if p not in skip)


# --- checkpoints ---------------------------------------------------------------------------------


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
    ) -> None:
        self.checkpoint_dir = checkpoint_dir
        # --break-save tracker-at-submit: publish N as soon as its save is submitted (broken)
        self.tracker_at_submit = tracker_at_submit
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


# --- command line --------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _async_writer(text: str) -> AsyncCheckpointerType:
    try:
        return AsyncCheckpointerType(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(ASYNC_WRITERS)}, got {text!r}"
        ) from None


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pytest_nvrx.workloads.reference",
        description="Tiny GPT on CPU (gloo) with NVRx sections and async checkpoints; "
        "run one process per rank under ft_launcher (or torchrun with --no-ft). "
        "Unknown arguments are an error.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    t = p.add_argument_group("training")
    t.add_argument("--train-iters", type=_positive_int, required=True, help="last iteration")
    t.add_argument(
        "--micro-batch-size",
        type=_positive_int,
        default=TrainConfig.micro_batch_size,
        help="samples per rank and iteration (global batch = this x world size)",
    )
    t.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate")
    t.add_argument(
        "--min-lr", type=float, default=TrainConfig.min_lr, help="cosine floor at --train-iters"
    )
    t.add_argument(
        "--lr-warmup-iters", type=int, default=TrainConfig.lr_warmup_iters, help="linear warm-up"
    )
    t.add_argument(
        "--seed", type=int, default=TrainConfig.seed, help="weights, dropout and mock data"
    )
    t.add_argument(
        "--data-samples",
        type=_positive_int,
        default=TrainConfig.data_samples,
        help="mock dataset size: each epoch reads a new seeded permutation of it",
    )
    t.add_argument(
        "--log-interval", type=_positive_int, default=1, help="iteration line every N iterations"
    )
    t.add_argument(
        "--step-time",
        type=_non_negative_float,
        default=0.2,
        help="seconds slept inside every step (stand-in for GPU compute)",
    )
    t.add_argument(
        "--distributed-timeout-minutes",
        type=_positive_int,
        default=10,
        help="gloo collective timeout (keep it above the step section timeout)",
    )
    c = p.add_argument_group("checkpointing")
    c.add_argument("--save", type=Path, help="checkpoint root: iter_NNNNNNN/ and the tracker")
    c.add_argument(
        "--save-interval", type=_positive_int, help="async save every N iterations (with --save)"
    )
    c.add_argument("--load", type=Path, help="checkpoint root to resume from (its tracker)")
    c.add_argument(
        "--async-writer",
        type=_async_writer,
        default=AsyncCheckpointerType.THREAD.value,
        metavar="{" + ",".join(ASYNC_WRITERS) + "}",
        help="where the background write runs: a DCP thread in the rank, or DCP's persistent "
        "checkpoint worker process per rank (a spawn child, as Megatron's persistent worker)",
    )
    c.add_argument(
        "--break-restore",
        action="append",
        choices=BREAKABLE_PARTS + RESTORE_BREAKS,
        default=[],
        metavar="PART",
        help="in a replacement only (restart count >= 1, from $"
        + RESTART_COUNT_ENV
        + "), do not restore this part of the checkpoint ("
        + ", ".join(BREAKABLE_PARTS)
        + "), or restore the previous checkpoint on the last rank (previous), or jump the "
        "restored iteration counter by the save interval (iteration); repeatable",
    )
    c.add_argument(
        "--break-save",
        action="append",
        choices=SAVE_BREAKS,
        default=[],
        metavar="WHAT",
        help="in every cycle: rank 0 writes the tracker when a save is submitted, not when it "
        "is finalized (tracker-at-submit)",
    )
    m = p.add_argument_group("model")
    m.add_argument(
        "--vocab-size", type=_positive_int, default=ModelConfig.vocab_size, help="tokens"
    )
    m.add_argument(
        "--seq-length", type=_positive_int, default=ModelConfig.seq_length, help="tokens/sample"
    )
    m.add_argument(
        "--hidden-size", type=_positive_int, default=ModelConfig.hidden_size, help="model width"
    )
    m.add_argument(
        "--num-layers", type=_positive_int, default=ModelConfig.num_layers, help="blocks"
    )
    m.add_argument(
        "--num-attention-heads",
        type=_positive_int,
        default=ModelConfig.num_attention_heads,
        help="must divide --hidden-size",
    )
    m.add_argument(
        "--dropout",
        type=_non_negative_float,
        default=ModelConfig.dropout,
        help="makes the RNG state matter for an exact resume",
    )
    p.add_argument(
        "--no-ft",
        action="store_true",
        help="do not connect to NVRx rank monitors (outside ft_launcher)",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)  # strict: unknown arguments are an error
    if args.save is not None and args.save_interval is None:
        parser.error("--save needs --save-interval")
    if args.save_interval is not None and args.save is None:
        parser.error("--save-interval needs --save")
    if args.hidden_size % args.num_attention_heads:
        parser.error("--hidden-size must be divisible by --num-attention-heads")
    if not 0 < args.min_lr <= args.lr:
        parser.error("need 0 < --min-lr <= --lr")
    if args.lr_warmup_iters < 0:
        parser.error("--lr-warmup-iters must be >= 0")
    return args


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        raise SystemExit(
            f"reference workload: environment variable {name} is missing or not an integer; "
            "start it with ft_launcher or torchrun"
        ) from None


def restart_count(environ: Mapping[str, str]) -> int:
    """Which cycle this worker belongs to: 0 for the first, N after N restarts (ft_launcher and
    torchelastic set it in every worker; absent, e.g. a plain process in a test: 0)."""
    text = environ.get(RESTART_COUNT_ENV, "0").strip() or "0"
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise SystemExit(
            f"reference workload: {RESTART_COUNT_ENV}={text!r} is not a non-negative integer"
        )
    return value


def run(args: argparse.Namespace) -> int:
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    restarts = restart_count(os.environ)
    log = EventLog(rank)
    # cpus: what this rank may run on (a launcher bound to one core binds its ranks there too)
    cpus = len(os.sched_getaffinity(0))
    log(f"started pid {os.getpid()} world_size {world_size} restart_count {restarts} cpus {cpus}")
    torch.set_num_threads(1)
    monitor: FtMonitor | NullMonitor
    try:
        monitor = NullMonitor() if args.no_ft else FtMonitor()
    except Exception as exc:
        log(f"ft monitoring failed: {exc}")
        raise SystemExit(
            f"reference workload: cannot connect to the NVRx rank monitor ({exc}); "
            "run under ft_launcher, or pass --no-ft"
        ) from exc
    if rank == 0:
        log(monitor.describe())
    clock = SectionClock(monitor)
    clock.start_section("setup")  # as Megatron: opened before distributed init
    dist.init_process_group("gloo", timeout=timedelta(minutes=args.distributed_timeout_minutes))
    try:
        code = _train(args, clock, log, restarts)
    except Exception as exc:
        log(f"aborted {type(exc).__name__}: {_first_line(exc)}")
        raise
    finally:
        dist.destroy_process_group()
        clock.shutdown()
    log(f"exit code {code}")
    return code


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else "(no message)"


def _train(
    args: argparse.Namespace, monitor: SectionClock, log: Callable[[str], None], restarts: int
) -> int:
    # Checkpoint I/O runs in a background thread: give it its own group so its collectives
    # never interleave with the training all-reduces on the default group.
    ckpt_group = dist.new_group(backend="gloo")
    assert isinstance(ckpt_group, dist.ProcessGroup)
    model_cfg = ModelConfig(
        vocab_size=args.vocab_size,
        seq_length=args.seq_length,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_attention_heads=args.num_attention_heads,
        dropout=args.dropout,
    )
    cfg = TrainConfig(
        train_iters=args.train_iters,
        seed=args.seed,
        micro_batch_size=args.micro_batch_size,
        lr=args.lr,
        min_lr=args.min_lr,
        lr_warmup_iters=args.lr_warmup_iters,
        step_time=args.step_time,
        data_samples=args.data_samples,
    )
    trainer = Trainer(model_cfg, cfg)
    if args.load is not None:
        try:
            # --break-restore acts in replacements only: cycle 0 has nothing to resume anyway,
            # and a first cycle that resumes a previous run's checkpoint is not a replacement.
            skip = tuple(args.break_restore) if restarts >= 1 else ()
            load_checkpoint(
                trainer,
                args.load,
                ckpt_group,
                log,
                skip=skip,
                restarts=restarts,
                jump=args.save_interval or 1,
            )
        except LoadError as exc:
            log(f"load failed: {exc}")
            return 1
    checkpointer = None
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        checkpointer = AsyncCheckpointer(
            args.save,
            ckpt_group,
            monitor,
            log,
            args.async_writer,
            tracker_at_submit="tracker-at-submit" in args.break_save,
        )
        checkpointer.start_worker()  # inside setup, as Megatron's persistent worker
    start_iteration = trainer.iteration
    monitor.end_section("setup")  # as Megatron: closed before the first step

    try:
        while trainer.iteration < cfg.train_iters:
            with section(monitor, "step"):
                step = trainer.train_step()
            it = trainer.iteration
            if trainer.rank == 0 and (it % args.log_interval == 0 or it == cfg.train_iters):
                log(iteration_event(it, cfg.train_iters, trainer.consumed_samples, step))
            if checkpointer is not None and it % args.save_interval == 0:
                checkpointer.save(it, trainer.checkpoint_state)
        if checkpointer is not None:
            # As Megatron: a final save unless the last iteration was just saved or restored.
            if trainer.iteration not in (start_iteration, checkpointer.last_scheduled):
                checkpointer.save(trainer.iteration, trainer.checkpoint_state)
            checkpointer.finalize()
    except SaveError:
        return 1
    finally:
        if checkpointer is not None:
            checkpointer.close()
    log(monitor.summary())
    if trainer.rank == 0:
        log(f"training finished iteration {trainer.iteration}")
    return 0


def iteration_event(iteration: int, train_iters: int, consumed: int, step: StepResult) -> str:
    """The iteration line's event. Floats are printed with ``repr``: the shortest text that
    reads back as the same float, so two lines print the same text exactly when the values are
    bitwise equal (an exact replay prints the same line)."""
    return (
        f"iteration {iteration}/{train_iters} consumed_samples {consumed} "
        f"loss {step.loss!r} lr {step.learning_rate!r} grad_norm {step.grad_norm!r}"
    )


def load_checkpoint(
    trainer: Trainer,
    checkpoint_dir: Path,
    group: dist.ProcessGroup,
    log: Callable[[str], None],
    *,
    skip: Sequence[str] = (),
    restarts: int = 0,
    jump: int = 1,
) -> int | None:
    """Restore from the tracker's iteration; returns it, or None when starting from scratch.

    The load line lists only the parts restored; each part in ``skip`` is left out and one
    more line says so (``restore skipped ...``). The restore breaks in ``skip`` (RESTORE_BREAKS)
    each say what they did in a line of their own: ``previous`` (the last rank loads the newest
    complete checkpoint before the tracker's, and its load line says so; its iteration and
    ``consumed_samples`` counters are the tracker's, so that the ranks stay in step) and
    ``iteration`` (the iteration counter jumps by ``jump`` past the loaded one)."""
    iteration = agreed_tracker(checkpoint_dir)
    if iteration is None:
        log(f"no checkpoint found at {checkpoint_dir / TRACKER_NAME}, starting from scratch")
        return None
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
        int(m[1])
        for path in checkpoint_dir.glob("iter_*/.metadata")
        if (m := re.fullmatch(r"iter_([0-9]+)", path.parent.name)) is not None
    ]
    older = [n for n in found if n < iteration]
    return max(older) if older else None


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
