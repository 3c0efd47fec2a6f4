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

This module holds the event log, the command line and the training loop; the rest lives by
subject beside it, and every name is importable from here too: ``ref_sections`` (NVRx
sections), ``ref_model`` (model and mock data), ``ref_trainer`` (a rank's training state, its
step and its restore), ``ref_checkpoints`` (async saves, the tracker, the resume).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

# A worker's imports (torch, its DCP, sympy) allocate a few million objects, none of them
# garbage, and the cyclic collector walked them again and again while they loaded: about 0.4
# of the 3 CPU-seconds a worker process spends importing (each run starts four). It is off
# while they load; main() freezes what they left, so later full collections skip it too.
_collecting = gc.isenabled()
gc.disable()
try:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    from pytest_nvrx.worker.plant_hook.nvrx_plants import RESTORE_PLANTS, active_plant
    from pytest_nvrx.workloads.ref_checkpoints import (
        ASYNC_WRITERS,
        RESTORE_BREAKS,
        SAVE_BREAKS,
        WORKER_STOP_TIMEOUT_S,
        AsyncCheckpointer,
        PendingSave,
        SaveError,
        agreed_tracker,
        checkpoint_worker,
        load_checkpoint,
        previous_checkpoint,
        read_tracker,
        start_checkpoint_worker,
        stop_checkpoint_worker,
    )
    from pytest_nvrx.workloads.ref_model import (
        Block,
        ModelConfig,
        ShuffledSampler,
        TinyGPT,
        mock_sample,
    )
    from pytest_nvrx.workloads.ref_sections import (
        FtMonitor,
        Monitor,
        NullMonitor,
        SectionClock,
        section,
    )
    from pytest_nvrx.workloads.ref_trainer import (
        BREAKABLE_PARTS,
        LOADED_PARTS,
        RESTORED_PARTS,
        LoadError,
        StepResult,
        TrainConfig,
        Trainer,
    )
finally:
    if _collecting:
        gc.enable()

__all__ = [
    "ASYNC_WRITERS",
    "BREAKABLE_PARTS",
    "LOADED_PARTS",
    "LOG_PREFIX",
    "RESTART_COUNT_ENV",
    "RESTORED_PARTS",
    "RESTORE_BREAKS",
    "SAVE_BREAKS",
    "WORKER_STOP_TIMEOUT_S",
    "AsyncCheckpointer",
    "Block",
    "EventLog",
    "FtMonitor",
    "LoadError",
    "ModelConfig",
    "Monitor",
    "NullMonitor",
    "PendingSave",
    "SaveError",
    "SectionClock",
    "ShuffledSampler",
    "StepResult",
    "TinyGPT",
    "TrainConfig",
    "Trainer",
    "agreed_tracker",
    "build_parser",
    "checkpoint_worker",
    "iteration_event",
    "load_checkpoint",
    "main",
    "mock_sample",
    "parse_args",
    "previous_checkpoint",
    "read_tracker",
    "restart_count",
    "run",
    "section",
    "start_checkpoint_worker",
    "stop_checkpoint_worker",
]

LOG_PREFIX = "[ref]"
#: Set by torchelastic and ft_launcher in every worker: 0 in the first cycle, then 1, 2, ...
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"


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


# --- command line --------------------------------------------------------------------------------


#: Seconds slept inside every step, a stand-in for GPU compute (``--step-time``). Faults land
#: by the probes on NVRx sections and the checkpoint calls, not by the clock, so a short sleep
#: only makes a run shorter: with 0.05 s a 20-iteration kill run takes about 3 s less than with
#: the 0.2 s it was (measured 18.4 s against 21.6 s; CI runs some seventy such runs).
STEP_TIME_S = 0.05


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


def _add_config_options(
    group: argparse._ArgumentGroup,
    config: type,
    options: Mapping[str, tuple[Callable[[str], Any], str]],
) -> None:
    """An option per field of the dataclass ``config`` in ``options`` (field: type and help):
    ``--field-name``, its default the field's (the way back: :func:`_options_for`)."""
    for name, (kind, text) in options.items():
        flag = "--" + name.replace("_", "-")
        group.add_argument(flag, type=kind, default=getattr(config, name), help=text)


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
    _add_config_options(
        t,
        TrainConfig,
        {
            "micro_batch_size": (
                _positive_int,
                "samples per rank and iteration (global batch = this x world size)",
            ),
            "lr": (float, "peak learning rate"),
            "min_lr": (float, "cosine floor at --train-iters"),
            "lr_warmup_iters": (int, "linear warm-up"),
            "seed": (int, "weights, dropout and mock data"),
            "data_samples": (
                _positive_int,
                "mock dataset size: each epoch reads a new seeded permutation of it",
            ),
        },
    )
    t.add_argument(
        "--log-interval", type=_positive_int, default=1, help="iteration line every N iterations"
    )
    t.add_argument(
        "--step-time",
        type=_non_negative_float,
        default=STEP_TIME_S,
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
        "--load-delay",
        type=_non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="in a replacement only (restart count >= 1), sleep this long inside the checkpoint "
        "load, before reading it: a slower checkpoint load of a known size (compare's planted "
        "regression)",
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
    _add_config_options(
        p.add_argument_group("model"),
        ModelConfig,
        {
            "vocab_size": (_positive_int, "tokens"),
            "seq_length": (_positive_int, "tokens/sample"),
            "hidden_size": (_positive_int, "model width"),
            "num_layers": (_positive_int, "blocks"),
            "num_attention_heads": (_positive_int, "must divide --hidden-size"),
            "dropout": (_non_negative_float, "makes the RNG state matter for an exact resume"),
        },
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
    # Each config field from the option of its name (TrainConfig's weight_decay and clip_grad
    # have none: their defaults stand).
    model_cfg = ModelConfig(**_options_for(ModelConfig, args))
    cfg = TrainConfig(**_options_for(TrainConfig, args))
    trainer = Trainer(model_cfg, cfg)
    # the self-test's plant (PYTEST_NVRX_PLANT), planted as silently as a real bug
    plant = active_plant()
    if args.load is not None:
        try:
            # --break-restore acts in replacements only: cycle 0 has nothing to resume anyway,
            # and a first cycle that resumes a previous run's checkpoint is not a replacement.
            skip = tuple(args.break_restore) if restarts >= 1 else ()
            if restarts >= 1 and args.load_delay > 0:
                # inside the load's phase: after the workers started, before the load line
                time.sleep(args.load_delay)
            load_checkpoint(
                trainer,
                args.load,
                ckpt_group,
                log,
                skip=skip,
                restarts=restarts,
                jump=args.save_interval or 1,
                plant=plant if restarts >= 1 and plant in RESTORE_PLANTS else None,
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
            planted_at_submit=plant == "tracker-at-submit",
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


def _options_for(config: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The options in ``args`` named as fields of the dataclass ``config`` (the way there:
    :func:`_add_config_options`)."""
    return {f.name: getattr(args, f.name) for f in fields(config) if hasattr(args, f.name)}


def iteration_event(iteration: int, train_iters: int, consumed: int, step: StepResult) -> str:
    """The iteration line's event. Floats are printed with ``repr``: the shortest text that
    reads back as the same float, so two lines print the same text exactly when the values are
    bitwise equal (an exact replay prints the same line)."""
    return (
        f"iteration {iteration}/{train_iters} consumed_samples {consumed} "
        f"loss {step.loss!r} lr {step.learning_rate!r} grad_norm {step.grad_norm!r}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    gc.freeze()  # the imports' objects: never garbage, never walked again
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
