"""Model and mock data of the reference workload: a tiny GPT in plain torch, a mock dataset that
is a function of (seed, index), and the seeded shuffle that orders it (its position is part of
the checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


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
