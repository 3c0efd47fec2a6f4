"""A scenario's loss curve as plain data: every cycle's printed losses, replayed iterations and
Megatron-LM #6237's window means marked, thinned to a size a report can carry."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.replay import PrintModel, windows

#: at most this many loss points per run are kept (replayed iterations always are)
MAX_LOSS_POINTS = 2000


@dataclass(frozen=True, slots=True)
class LossPoint:
    cycle: int
    iteration: int
    loss: float
    replayed: bool  # an earlier cycle had committed this iteration already
    # the line printed the mean over iterations mean_from..iteration, not this iteration's loss
    # (Megatron-LM #6237: a process's second line); None: its own window, as printed normally
    mean_from: int | None = None


@dataclass(frozen=True, slots=True)
class LossSeries:
    points: tuple[LossPoint, ...]
    dropped: int  # points left out to keep the report small (never replayed or #6237 ones)

    def as_dict(self) -> dict[str, Any]:
        return {
            "columns": ["cycle", "iteration", "loss", "replayed"],
            "points": [[p.cycle, p.iteration, p.loss, p.replayed] for p in self.points],
            "dropped": self.dropped,
            # a key of its own, not a fifth column: readers of the four columns read on
            "window_means": [
                [p.cycle, p.iteration, p.mean_from] for p in self.points if p.mean_from is not None
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LossSeries:
        means = {(int(c), int(i)): int(f) for c, i, f in data.get("window_means", [])}
        return cls(
            points=tuple(
                LossPoint(int(c), int(i), float(v), bool(r), means.get((int(c), int(i))))
                for c, i, v, r in data["points"]
            ),
            dropped=int(data["dropped"]),
        )


def _window_means(log: CycleLog, model: PrintModel) -> dict[int, int]:
    """The iterations of one cycle whose printed loss is a mean over more iterations than the
    workload's own print rule gives, each with its window's first iteration: Megatron core
    <= 0.19 does not reset its loss accumulators at a process's first print (Megatron-LM
    #6237), so with ``--log-interval 1`` its second line prints the mean of its first two. The
    same windows ``training_continuity`` compares by (:func:`print_model`), read here so that
    the chart does not draw such a mean as the iteration's loss."""
    if "loss" not in model.averaged or model.first_print_resets:
        return {}
    fixed = {
        p.iteration: p.first
        for p in windows(log.iterations, replace(model, first_print_resets=True), log.cycle)
    }
    return {
        p.iteration: p.first
        for p in windows(log.iterations, model, log.cycle)
        if p.first != fixed.get(p.iteration, p.first)
    }


def loss_series(logs: tuple[CycleLog, ...], model: PrintModel | None = None) -> LossSeries:
    points: list[LossPoint] = []
    done = 0  # the highest iteration an earlier cycle committed
    for log in logs:
        means = _window_means(log, model) if model is not None else {}
        seen: set[int] = set()
        for it in log.iterations:
            if it.loss is None or it.iteration in seen:
                continue
            seen.add(it.iteration)
            points.append(
                LossPoint(
                    log.cycle,
                    it.iteration,
                    it.loss,
                    it.iteration <= done,
                    means.get(it.iteration),
                )
            )
        done = max([done, *seen])
    return _thin(points)


def _thin(points: list[LossPoint]) -> LossSeries:
    """At most :data:`MAX_LOSS_POINTS`: every k-th point, all replayed ones, each cycle's ends."""
    if len(points) <= MAX_LOSS_POINTS:
        return LossSeries(tuple(points), 0)
    step = -(-len(points) // MAX_LOSS_POINTS)
    kept = [
        p
        for i, p in enumerate(points)
        if p.replayed
        or p.mean_from is not None
        or i % step == 0
        or i == len(points) - 1
        or points[i - 1].cycle != p.cycle
        or points[min(i + 1, len(points) - 1)].cycle != p.cycle
    ]
    return LossSeries(tuple(kept), len(points) - len(kept))
