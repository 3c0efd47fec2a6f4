"""Training state of one rank of the reference workload: model, optimizer, LR schedule, RNG, data
position and progress counters; one optimizer step over the global batch; and restoring all of it
(or all but the parts ``--break-restore`` leaves out) from one DCP checkpoint."""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from pytest_nvrx.layout import iteration_dir_name
from pytest_nvrx.workloads.ref_model import ModelConfig, ShuffledSampler, TinyGPT, mock_sample

#: What a restore brings back, in the order the load line lists it.
RESTORED_PARTS: tuple[str, ...] = ("model", "optimizer", "scheduler", "rng", "data")
LOADED_PARTS = ", ".join(RESTORED_PARTS)
#: Parts ``--break-restore`` may leave out (the model is always restored).
BREAKABLE_PARTS: tuple[str, ...] = ("optimizer", "rng", "data", "scheduler")


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

    def reset_optimizer_moments(self) -> int:
        """Zero AdamW's moments and step in place (the self-test's ``optimizer-reset`` plant);
        returns how many moment tensors were zeroed."""
        tensors = 0
        for state in self.optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                value = state.get(key)
                if isinstance(value, torch.Tensor):
                    value.zero_()
                    tensors += 1
            step = state.get("step")
            if isinstance(step, torch.Tensor):
                step.zero_()
        return tensors

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
