"""The CPU reference workload's checkpoint semantics, CLI and log format.

Checkpoint tests run in this process on a world-size-1 gloo group; one test starts the workload
the way the injector does (``runpy.run_module(..., run_name="__main__")``) in a subprocess. The
real 2-rank ft_launcher runs are recorded by scripts/record_reference_runs.py into
tests/data/cpu/; the last tests check that their lines follow the documented formats.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from pytest_nvrx.layout import RESULT_NAME, TRACKER_NAME
from pytest_nvrx.workloads import reference as ref
from tests.helpers.sessions import ONE_RANK_STORE_PORT

DATA = Path(__file__).parents[1] / "data" / "cpu"
REPO = Path(__file__).resolve().parents[2]

# The formats documented in docs/reference-workload.md (keep both in step).
# A float as Python's repr prints it (5.0, 0.0055000000000000005, 1e-05, nan, -inf).
FLOAT_REPR = r"-?(?:\d+\.\d+(?:e[+-]\d+)?|\d+e[+-]\d+|nan|inf)"
PARTS = r"model(?:, (?:optimizer|scheduler|rng|data))*"
BREAKABLE = r"(?:optimizer|rng|data|scheduler)(?:, (?:optimizer|rng|data|scheduler))*"
LINE_RE = re.compile(
    r"^\[ref\] (?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00) "
    r"rank (?P<rank>\d+) (?P<event>.+)$"
)
EVENT_RES = {
    # restart_count is absent from the lines recorded in tests/data/cpu (written before it)
    # and cpus from the lines before #23 (what the rank may run on)
    "started": r"started pid (?P<pid>\d+) world_size (?P<world_size>\d+)"
    r"(?: restart_count (?P<restart_count>\d+))?(?: cpus (?P<cpus>\d+))?",
    "ft": r"ft monitoring (?:initialized sections (?P<sections>\S+) out_of_section (?P<oos>\S+)"
    r"|disabled \(--no-ft\)|failed: .*)",
    "no_checkpoint": r"no checkpoint found at (?P<tracker>\S+), starting from scratch",
    "loaded": r"load checkpoint iteration (?P<iteration>\d+) "
    rf"\((?P<parts>{PARTS})\) "
    r"consumed_samples (?P<consumed>\d+) path (?P<path>\S+)",
    "skipped": rf"restore skipped (?P<parts>{BREAKABLE}) of iteration (?P<iteration>\d+) "
    r"on purpose \(--break-restore, restart_count (?P<restart_count>\d+)\)",
    "broke_previous": r"restore broke previous on purpose: loaded iteration (?P<loaded>\d+), not"
    r" the tracker's (?P<iteration>\d+); counters set to iteration \d+ consumed_samples \d+"
    r" \(--break-restore, restart_count (?P<restart_count>\d+)\)",
    "broke_iteration": r"restore broke iteration on purpose: counter set to (?P<counter>\d+)"
    r" after loading iteration (?P<iteration>\d+)"
    r" \(--break-restore, restart_count (?P<restart_count>\d+)\)",
    "tracker_at_submit": r"tracker written at submit of iteration (?P<iteration>\d+) on purpose"
    r" \(--break-save tracker-at-submit\)",
    "load_failed": r"load failed: (?P<reason>.+)",
    "iteration": r"iteration (?P<iteration>\d+)/(?P<train_iters>\d+) "
    rf"consumed_samples (?P<consumed>\d+) loss (?P<loss>{FLOAT_REPR}) lr (?P<lr>{FLOAT_REPR}) "
    rf"grad_norm (?P<grad_norm>{FLOAT_REPR})",
    # the lines recorded in tests/data/cpu, before the values were printed exactly
    "iteration_legacy": r"iteration (?P<iteration>\d+)/(?P<train_iters>\d+) "
    r"consumed_samples (?P<consumed>\d+) loss (?P<loss>\d+\.\d{4}) lr (?P<lr>\d\.\d{3}e-\d\d)",
    "save_scheduled": r"save scheduled iteration (?P<iteration>\d+) path (?P<path>\S+)",
    "save_completed": r"save completed iteration (?P<iteration>\d+)",
    "save_failed": r"save failed iteration (?P<iteration>\d+): (?P<reason>.+)",
    "sections": r"longest sections \(s\) (?P<sections>\w+ \d+\.\d{3}(?: \w+ \d+\.\d{3})*|-)",
    "finished": r"training finished iteration (?P<iteration>\d+)",
    "aborted": r"aborted (?P<exc>\w+): (?P<message>.*)",
    "exit": r"exit code (?P<code>\d+)",
}
EVENT_COMPILED = {k: re.compile(f"^{v}$") for k, v in EVENT_RES.items()}


def classify(line: str) -> tuple[str, dict[str, str]] | None:
    """(event kind, fields) of one workload line; None for other lines (torch, injector)."""
    line = re.sub(r"^\d+: ", "", line)  # ft_launcher's per-cycle logs prefix the local rank
    m = LINE_RE.match(line)
    if m is None:
        return None
    for kind, rx in EVENT_COMPILED.items():
        e = rx.match(m["event"])
        if e is not None:
            return kind, {**m.groupdict(), **{k: v for k, v in e.groupdict().items() if v}}
    raise AssertionError(f"undocumented workload event: {line!r}")


class ListLog:
    def __init__(self) -> None:
        self.events: list[str] = []

    def __call__(self, event: str) -> None:
        self.events.append(event)


class RecordingMonitor:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start_section(self, section: str) -> None:
        self.calls.append(f"+{section}")

    def end_section(self, section: str) -> None:
        self.calls.append(f"-{section}")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dist.ProcessGroup]:
    """A world-size-1 gloo default group and a checkpoint group, as the workload makes them."""
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)
    yield group
    dist.destroy_process_group()


MODEL = ref.ModelConfig(hidden_size=16, num_layers=1, num_attention_heads=2, seq_length=16)
TRAIN = ref.TrainConfig(train_iters=6, micro_batch_size=2)


def trainer() -> ref.Trainer:
    return ref.Trainer(MODEL, TRAIN)


def tracker(ckpt: Path) -> str | None:
    path = ckpt / TRACKER_NAME
    return path.read_text() if path.exists() else None


def test_tracker_moves_only_when_a_save_is_finalized(
    gloo: dist.ProcessGroup, tmp_path: Path
) -> None:
    t, log, mon = trainer(), ListLog(), RecordingMonitor()
    ckpt = ref.AsyncCheckpointer(tmp_path, gloo, mon, log)
    t.train_step()
    t.train_step()
    ckpt.save(2, t.checkpoint_state)
    assert ckpt.pending is not None
    ckpt.pending.future.result()  # the bytes are on disk ...
    assert (tmp_path / "iter_0000002" / ".metadata").is_file()
    assert tracker(tmp_path) is None  # ... but a submitted save is not a checkpoint yet
    assert mon.calls == ["+checkpointing", "-checkpointing"]

    t.train_step()
    t.train_step()
    mon.calls.clear()
    ckpt.save(4, t.checkpoint_state)  # finalizes 2 first, then schedules 4
    assert tracker(tmp_path) == "2"
    assert mon.calls == ["+checkpointing", "-checkpointing"] * 2
    ckpt.finalize()
    assert tracker(tmp_path) == "4"
    assert log.events == [
        f"save scheduled iteration 2 path {tmp_path / 'iter_0000002'}",
        "save completed iteration 2",
        f"save scheduled iteration 4 path {tmp_path / 'iter_0000004'}",
        "save completed iteration 4",
    ]
    ckpt.finalize()  # nothing pending: no-op, no section
    assert tracker(tmp_path) == "4"


def _run_and_interrupt(
    ckpt_dir: Path, gloo: dist.ProcessGroup
) -> tuple[list[ref.StepResult], ref.Trainer]:
    """Six iterations, saves at 3 and 6; the save of 6 is never finalized (as if killed)."""
    t = trainer()
    ckpt = ref.AsyncCheckpointer(ckpt_dir, gloo, ref.NullMonitor(), ListLog())
    steps = []
    for _ in range(6):
        steps.append(t.train_step())
        if t.iteration % 3 == 0:
            ckpt.save(t.iteration, t.checkpoint_state)
    ckpt.abandon()
    assert tracker(ckpt_dir) == "3"
    return steps, t


def test_restore_continues_exactly_like_an_uninterrupted_run(
    gloo: dist.ProcessGroup, tmp_path: Path
) -> None:
    steps, uninterrupted = _run_and_interrupt(tmp_path, gloo)
    log = ListLog()
    resumed = trainer()
    assert ref.load_checkpoint(resumed, tmp_path, gloo, log, restarts=1) == 3
    assert (resumed.iteration, resumed.consumed_samples) == (3, 3 * TRAIN.micro_batch_size)
    assert log.events == [
        f"load checkpoint iteration 3 ({ref.LOADED_PARTS}) consumed_samples 6 "
        f"path {tmp_path / 'iter_0000003'}"
    ]
    # bitwise: loss, LR and gradient norm of every replayed step
    assert [resumed.train_step() for _ in range(3)] == steps[3:]
    for (name, a), b in zip(
        uninterrupted.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert resumed.scheduler.get_last_lr() == uninterrupted.scheduler.get_last_lr()
    assert resumed.sampler.state_dict() == uninterrupted.sampler.state_dict()


# The first step after the restore (iteration 4) computes its loss with the restored weights
# before any update: a fresh optimizer shows only from the second step on.
BROKEN_RESUMES = {
    # part: (what differs, at which replayed step: 0 = iteration 4)
    "optimizer": ("loss", 1),
    "rng": ("loss", 0),  # other dropout masks
    "data": ("loss", 0),  # other samples
    "scheduler": ("learning_rate", 0),
}


@pytest.mark.parametrize("part", sorted(BROKEN_RESUMES))
def test_break_restore_leaves_one_part_out_and_it_shows(
    gloo: dist.ProcessGroup, tmp_path: Path, part: str
) -> None:
    """Each part matters: leaving it out changes the printed values of the replayed steps,
    and where it first shows is what the broken-resume runs rely on."""
    steps, _ = _run_and_interrupt(tmp_path, gloo)
    log = ListLog()
    resumed = trainer()
    assert ref.load_checkpoint(resumed, tmp_path, gloo, log, skip=(part,), restarts=2) == 3
    parts = ", ".join(p for p in ref.RESTORED_PARTS if p != part)
    assert log.events == [
        f"load checkpoint iteration 3 ({parts}) consumed_samples 6 "
        f"path {tmp_path / 'iter_0000003'}",
        f"restore skipped {part} of iteration 3 on purpose (--break-restore, restart_count 2)",
    ]
    assert (resumed.iteration, resumed.consumed_samples) == (3, 6)  # counters always restored
    replay = [resumed.train_step() for _ in range(3)]
    value, first = BROKEN_RESUMES[part]
    differs = [i for i, (a, b) in enumerate(zip(replay, steps[3:], strict=True)) if a != b]
    assert differs and differs[0] == first, (differs, replay, steps[3:])
    assert getattr(replay[first], value) != getattr(steps[3 + first], value)
    if part == "scheduler":
        # a schedule at its start: the first warm-up step's LR, the weights' loss unchanged
        assert replay[0].learning_rate == TRAIN.lr / TRAIN.lr_warmup_iters
        assert replay[0].loss == steps[3].loss
    else:
        assert [r.learning_rate for r in replay] == [s.learning_rate for s in steps[3:]]


def test_break_restore_of_several_parts(gloo: dist.ProcessGroup, tmp_path: Path) -> None:
    _run_and_interrupt(tmp_path, gloo)
    log = ListLog()
    ref.load_checkpoint(trainer(), tmp_path, gloo, log, skip=("scheduler", "rng"), restarts=1)
    assert "(model, optimizer, data)" in log.events[0]
    assert log.events[1].startswith("restore skipped rng, scheduler of iteration 3 ")


def test_only_breakable_parts_can_be_skipped(gloo: dist.ProcessGroup, tmp_path: Path) -> None:
    _run_and_interrupt(tmp_path, gloo)
    with pytest.raises(ValueError, match="cannot skip"):
        trainer().load(tmp_path, 3, gloo, skip=("model",))


def _train(argv: list[str], restarts: int) -> tuple[int, list[str]]:
    """The workload's training loop in this process (world size 1, no monitor)."""
    log = ListLog()
    args = ref.parse_args(["--no-ft", "--step-time=0", "--hidden-size=16", *argv])
    code = ref._train(args, ref.SectionClock(ref.NullMonitor()), log, restarts)
    return code, log.events


def test_break_restore_acts_in_replacements_only(gloo: dist.ProcessGroup, tmp_path: Path) -> None:
    """Cycle 0 accepts the flag and restores everything (even from an existing checkpoint);
    a replacement leaves the part out and logs it."""
    ckpt = tmp_path / "checkpoints"
    common = ["--save-interval=2", f"--save={ckpt}", f"--load={ckpt}"]
    broken = ["--break-restore", "optimizer", "--break-restore=data"]
    code, first = _train(["--train-iters=2", *common, *broken], restarts=0)
    assert code == 0 and first[0].startswith("no checkpoint found")
    code, cycle0 = _train(["--train-iters=3", *common, *broken], restarts=0)
    assert code == 0
    assert cycle0[0].startswith(f"load checkpoint iteration 2 ({ref.LOADED_PARTS}) ")
    assert not any("skipped" in e for e in cycle0)
    code, replacement = _train(["--train-iters=4", *common, *broken], restarts=1)
    assert code == 0
    assert replacement[0].startswith("load checkpoint iteration 3 (model, scheduler, rng) ")
    assert replacement[1] == (
        "restore skipped optimizer, data of iteration 3 on purpose "
        "(--break-restore, restart_count 1)"
    )
    for event in [*first, *cycle0, *replacement]:
        assert classify(f"[ref] 2026-11-30T00:00:00.000+00:00 rank 0 {event}") is not None
    iterations = [classify(f"[ref] 2026-11-30T00:00:00.000+00:00 rank 0 {e}") for e in first]
    assert [k for k, _ in filter(None, iterations)].count("iteration") == 2


def _iterations(events: list[str]) -> list[int]:
    return [int(e.split()[1].split("/")[0]) for e in events if e.startswith("iteration ")]


def test_break_restore_iteration_jumps_the_counter(gloo: dist.ProcessGroup, tmp_path: Path) -> None:
    """#21 item 10b: the replacement loads 2 but its counter says 4: iterations 3 and 4 are never
    trained, and the first line after the restore is 5 (restored + save interval + 1)."""
    ckpt = tmp_path / "checkpoints"
    common = ["--save-interval=2", f"--save={ckpt}", f"--load={ckpt}"]
    code, cycle0 = _train(["--train-iters=2", *common, "--break-restore=iteration"], restarts=0)
    assert code == 0 and not any("broke" in e for e in cycle0)
    code, events = _train(["--train-iters=6", *common, "--break-restore=iteration"], restarts=1)
    assert code == 0
    assert events[0].startswith(f"load checkpoint iteration 2 ({ref.LOADED_PARTS}) ")
    assert events[1] == (
        "restore broke iteration on purpose: counter set to 4 after loading iteration 2"
        " (--break-restore, restart_count 1)"
    )
    assert _iterations(events) == [5, 6]
    for event in events:
        assert classify(f"[ref] 2026-11-30T00:00:00.000+00:00 rank 0 {event}") is not None


def test_break_restore_previous_loads_the_checkpoint_before_the_trackers(
    gloo: dist.ProcessGroup, tmp_path: Path
) -> None:
    """#21 item 10a: the last rank (here the only one) loads 2 while the tracker names 4; its
    counters are the tracker's (the ranks must stay in step), so training goes on at 5."""
    ckpt = tmp_path / "checkpoints"
    common = ["--save-interval=2", f"--save={ckpt}", f"--load={ckpt}"]
    code, _ = _train(["--train-iters=4", *common], restarts=0)
    assert code == 0 and tracker(ckpt) == "4"
    code, events = _train(["--train-iters=6", *common, "--break-restore=previous"], restarts=1)
    assert code == 0
    assert events[0] == (
        f"load checkpoint iteration 2 ({ref.LOADED_PARTS}) consumed_samples 4 "
        f"path {ckpt / 'iter_0000002'}"
    )
    assert events[1] == (
        "restore broke previous on purpose: loaded iteration 2, not the tracker's 4; counters"
        " set to iteration 4 consumed_samples 8 (--break-restore, restart_count 1)"
    )
    assert _iterations(events) == [5, 6]
    for event in events:
        assert classify(f"[ref] 2026-11-30T00:00:00.000+00:00 rank 0 {event}") is not None


def test_break_restore_previous_needs_an_older_checkpoint(
    gloo: dist.ProcessGroup, tmp_path: Path
) -> None:
    ckpt = tmp_path / "checkpoints"
    common = ["--save-interval=2", f"--save={ckpt}", f"--load={ckpt}"]
    assert _train(["--train-iters=2", *common], restarts=0)[0] == 0
    code, events = _train(["--train-iters=4", *common, "--break-restore=previous"], restarts=1)
    assert code == 1
    assert events == [
        "load failed: --break-restore previous: no complete checkpoint before iteration 2"
        f" in {ckpt}"
    ]


class TrackerAtEvent(ListLog):
    """Reads the tracker as each event is logged: what a poller sees at that moment."""

    def __init__(self, ckpt: Path) -> None:
        super().__init__()
        self.ckpt = ckpt
        self.trackers: list[str | None] = []

    def __call__(self, event: str) -> None:
        super().__call__(event)
        self.trackers.append(tracker(self.ckpt))


def test_break_save_tracker_at_submit(gloo: dist.ProcessGroup, tmp_path: Path) -> None:
    """#21 item 10c: the tracker names 2 as soon as its save is submitted, before the save is
    finalized (its 'save completed' line comes at the next save); in every cycle."""
    t, log = trainer(), TrackerAtEvent(tmp_path)
    ckpt = ref.AsyncCheckpointer(tmp_path, gloo, ref.NullMonitor(), log, tracker_at_submit=True)
    t.train_step()
    t.train_step()
    ckpt.save(2, t.checkpoint_state)
    assert ckpt.pending is not None  # not finalized ...
    assert tracker(tmp_path) == "2"  # ... and already published
    t.train_step()
    t.train_step()
    ckpt.save(4, t.checkpoint_state)
    ckpt.finalize()
    assert list(zip(log.events, log.trackers, strict=True)) == [
        (f"save scheduled iteration 2 path {tmp_path / 'iter_0000002'}", None),
        (
            "tracker written at submit of iteration 2 on purpose (--break-save tracker-at-submit)",
            "2",
        ),
        ("save completed iteration 2", "2"),
        (f"save scheduled iteration 4 path {tmp_path / 'iter_0000004'}", "2"),
        (
            "tracker written at submit of iteration 4 on purpose (--break-save tracker-at-submit)",
            "4",
        ),
        ("save completed iteration 4", "4"),
    ]
    for event in log.events:
        assert classify(f"[ref] 2026-11-30T00:00:00.000+00:00 rank 0 {event}") is not None
    args = ref.parse_args(["--train-iters=2", "--break-save=tracker-at-submit"])
    assert args.break_save == ["tracker-at-submit"]


def test_restart_count_comes_from_the_environment() -> None:
    assert ref.restart_count({}) == 0
    assert ref.restart_count({ref.RESTART_COUNT_ENV: "2"}) == 2
    with pytest.raises(SystemExit, match="not a non-negative integer"):
        ref.restart_count({ref.RESTART_COUNT_ENV: "x"})
    with pytest.raises(SystemExit, match="not a non-negative integer"):
        ref.restart_count({ref.RESTART_COUNT_ENV: "-1"})


def test_iteration_line_prints_values_exactly() -> None:
    """repr: the printed text reads back as the same float, and the next float prints
    differently (the 4-decimal format hid changes in the 5th significant digit)."""
    step = ref.StepResult(
        loss=4.797312259674072, learning_rate=0.0055000000000000005, grad_norm=1.0
    )
    line = ref.iteration_event(11, 40, 44, step)
    assert line == (
        "iteration 11/40 consumed_samples 44 loss 4.797312259674072 "
        "lr 0.0055000000000000005 grad_norm 1.0"
    )
    kind, fields = classify(f"[ref] 2026-11-30T00:00:00.000+00:00 rank 0 {line}") or ("", {})
    assert kind == "iteration"
    assert float(fields["loss"]) == step.loss and float(fields["lr"]) == step.learning_rate
    nearby = ref.StepResult(math.nextafter(step.loss, 0.0), step.learning_rate, step.grad_norm)
    assert ref.iteration_event(11, 40, 44, nearby) != line


def test_sampler_reads_a_seeded_shuffle_per_epoch() -> None:
    s = ref.ShuffledSampler(10, seed=1)
    first = s.take(4) + s.take(4)
    spanning = s.take(4)  # 2 from epoch 0, 2 from epoch 1
    epoch0 = first + spanning[:2]
    assert sorted(epoch0) == list(range(10)) and epoch0 != list(range(10))
    assert s.state_dict() == {"epoch": 1, "position": 2}
    rest = s.take(8)
    epoch1 = spanning[2:] + rest
    assert sorted(epoch1) == list(range(10)) and epoch1 != epoch0  # reshuffled
    assert ref.ShuffledSampler(10, seed=2).take(10) != epoch0  # the seed matters
    # the restored position continues the same order
    again = ref.ShuffledSampler(10, seed=1)
    again.load_state_dict({"epoch": 1, "position": 2})
    assert again.take(8) == rest
    with pytest.raises(ValueError, match="outside 10 samples"):
        again.load_state_dict({"epoch": 0, "position": 11})


def test_each_rank_reads_its_slice_of_each_global_batch(gloo: dist.ProcessGroup) -> None:
    t = trainer()
    t.rank, t.world_size = 1, 2  # rank 1 of two, as far as the data order is concerned
    order = ref.ShuffledSampler(TRAIN.data_samples, TRAIN.seed).take(8)
    for mine in (order[2:4], order[6:8]):
        expected = torch.stack([ref.mock_sample(TRAIN.seed, i, MODEL) for i in mine])
        assert torch.equal(t._batch(), expected)


def test_a_save_is_a_snapshot_of_the_moment_it_was_scheduled(
    gloo: dist.ProcessGroup, tmp_path: Path
) -> None:
    t = trainer()
    t.train_step()
    expected = {k: v.clone() for k, v in t.model.state_dict().items()}
    ckpt = ref.AsyncCheckpointer(tmp_path, gloo, ref.NullMonitor(), ListLog())
    ckpt.save(1, t.checkpoint_state)
    with torch.no_grad():
        for p in t.model.parameters():
            p.add_(1000.0)  # training goes on while the background write runs
    ckpt.finalize()
    resumed = trainer()
    ref.load_checkpoint(resumed, tmp_path, gloo, ListLog())
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_absent_tracker_starts_from_scratch(gloo: dist.ProcessGroup, tmp_path: Path) -> None:
    log = ListLog()
    t = trainer()
    assert ref.load_checkpoint(t, tmp_path, gloo, log) is None
    assert (t.iteration, t.consumed_samples) == (0, 0)
    assert log.events == [
        f"no checkpoint found at {tmp_path / TRACKER_NAME}, starting from scratch"
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds '', not an iteration number"),
        ("ten", "holds 'ten', not an iteration number"),
        ("-3", "negative iteration -3"),
        ("7", "tracker names iteration 7 but"),
    ],
)
def test_bad_tracker_is_refused(
    gloo: dist.ProcessGroup, tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / TRACKER_NAME).write_text(content)
    with pytest.raises(ref.LoadError, match=re.escape(message)):
        ref.load_checkpoint(trainer(), tmp_path, gloo, ListLog())


def test_non_utf8_tracker_is_a_load_error(tmp_path: Path) -> None:
    """Not a UnicodeDecodeError: every rank must reach the agreement all-reduce."""
    (tmp_path / TRACKER_NAME).write_bytes(b"\xff\xfe")
    with pytest.raises(ref.LoadError, match="cannot read"):
        ref.read_tracker(tmp_path)


def test_checkpoint_of_another_configuration_is_refused(
    gloo: dist.ProcessGroup, tmp_path: Path
) -> None:
    _run_and_interrupt(tmp_path, gloo)
    other = ref.Trainer(MODEL, ref.TrainConfig(train_iters=6, micro_batch_size=3))
    with pytest.raises(ref.LoadError, match="different configuration"):
        ref.load_checkpoint(other, tmp_path, gloo, ListLog())


def test_mock_data_is_a_function_of_seed_and_index() -> None:
    a = ref.mock_sample(1, 5, MODEL)
    assert torch.equal(a, ref.mock_sample(1, 5, MODEL))
    assert not torch.equal(a, ref.mock_sample(1, 6, MODEL))
    assert not torch.equal(a, ref.mock_sample(2, 5, MODEL))
    assert a.shape == (MODEL.seq_length + 1,)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--train-iters", "4", "--bogus"], "unrecognized arguments: --bogus"),
        (["--train-iters", "4", "--save-int", "2"], "unrecognized arguments"),  # no abbreviations
        (["--train-iters", "4", "--save", "/x"], "--save needs --save-interval"),
        (["--train-iters", "4", "--save-interval", "2"], "--save-interval needs --save"),
        (["--train-iters", "0"], "must be a positive integer"),
        (["--train-iters", "4", "--hidden-size", "30"], "divisible by --num-attention-heads"),
        (["--train-iters", "4", "--async-writer", "fork"], "must be one of thread, process"),
        (["--train-iters", "4", "--async-writer", "PROCESS"], "must be one of thread, process"),
        ([], "--train-iters"),
    ],
)
def test_command_line_is_strict(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        ref.parse_args(argv)
    assert exc.value.code == 2
    assert error in capsys.readouterr().err


def test_async_writer_is_a_thread_unless_asked() -> None:
    assert ref.parse_args(["--train-iters=4"]).async_writer is AsyncCheckpointerType.THREAD
    args = ref.parse_args(["--train-iters=4", "--async-writer", "process"])
    assert args.async_writer is AsyncCheckpointerType.PROCESS
    assert ref.ASYNC_WRITERS == ("thread", "process")


def _proc_stat(pid: int) -> tuple[int, int, int]:
    """(parent pid, process group, session) from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]), int(fields[2]), int(fields[3])


@pytest.fixture
def process_writer(
    gloo: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dist.ProcessGroup]:
    """The checkpoint group, with DCP's persistent worker stopped after the test (it is global
    to this process). The worker's own group meets over a TCPStore at MASTER_ADDR."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert ref.checkpoint_worker() is None
    try:
        yield gloo
    finally:
        ref.stop_checkpoint_worker()


def test_process_writer_saves_through_one_persistent_worker_of_the_rank(
    process_writer: dist.ProcessGroup, tmp_path: Path
) -> None:
    """The worker the fault ``ckpt-worker`` kills: a spawn child of the rank, in its process
    group and session (the launcher's tree kill reaches it), started before training (in
    setup, as Megatron's persistent worker: never inside a save's ``checkpointing`` section),
    reused by every save, gone after close(). Its pid is read from torch's module state, as the
    injector reads it."""
    t, log = trainer(), ListLog()
    ckpt = ref.AsyncCheckpointer(
        tmp_path, process_writer, ref.NullMonitor(), log, AsyncCheckpointerType.PROCESS
    )
    ckpt.start_worker()
    worker = ref.checkpoint_worker()
    assert worker is not None and worker.pid is not None and worker.is_alive()
    ckpt.start_worker()  # once
    assert ref.checkpoint_worker() is worker
    t.train_step()
    ckpt.save(1, t.checkpoint_state)
    ckpt.finalize()
    assert ref.checkpoint_worker() is worker
    from torch.distributed.checkpoint import _async_process_executor as executor

    assert executor._CHECKPOINT_PROCESS is not None
    assert executor._CHECKPOINT_PROCESS._save_process.pid == worker.pid
    cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[0] == sys.executable.encode()
    assert any(b"spawn_main" in arg for arg in cmdline), cmdline
    ppid, pgid, sid = _proc_stat(worker.pid)
    assert (ppid, pgid, sid) == (os.getpid(), os.getpgid(0), os.getsid(0))

    with torch.no_grad():
        for param in t.model.parameters():
            param.add_(1000.0)  # the snapshot of 1 was taken at submission
    t.train_step()
    ckpt.save(2, t.checkpoint_state)
    assert tracker(tmp_path) == "1"  # submitted is not completed, with either writer
    ckpt.finalize()
    assert tracker(tmp_path) == "2"
    assert ref.checkpoint_worker() is worker  # the same process wrote both
    assert log.events[-1] == "save completed iteration 2"

    ckpt.close()
    assert ref.checkpoint_worker() is None
    assert worker.exitcode == 0  # it left when asked (not killed after the timeout)
    resumed = trainer()
    assert ref.load_checkpoint(resumed, tmp_path, process_writer, ListLog()) == 2
    assert resumed.iteration == 2


def test_a_killed_worker_fails_the_next_finalization_at_once(
    process_writer: dist.ProcessGroup, tmp_path: Path
) -> None:
    """SIGKILL of the persistent worker: the rank's next save fails (its request cannot reach
    the worker), the finalization says so and raises SaveError without waiting for anything,
    the tracker keeps the last completed save."""
    t, log = trainer(), ListLog()
    ckpt = ref.AsyncCheckpointer(
        tmp_path, process_writer, ref.NullMonitor(), log, AsyncCheckpointerType.PROCESS
    )
    t.train_step()
    ckpt.save(1, t.checkpoint_state)
    ckpt.finalize()
    worker = ref.checkpoint_worker()
    assert worker is not None and worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    assert worker.exitcode == -signal.SIGKILL
    t.train_step()
    start = time.monotonic()
    ckpt.save(2, t.checkpoint_state)
    with pytest.raises(ref.SaveError, match="async save of iteration 2 failed"):
        ckpt.finalize()
    assert time.monotonic() - start < 10
    assert tracker(tmp_path) == "1"
    assert log.events[-1].startswith("save failed iteration 2: ")
    ckpt.close()  # a dead worker: nothing to stop, no error
    assert ref.checkpoint_worker() is None


def test_runs_as_main_through_runpy_and_logs_documented_lines(tmp_path: Path) -> None:
    """The injector's way of starting it: runpy.run_module(..., run_name="__main__")."""
    ckpt = tmp_path / "checkpoints"
    argv = ["--no-ft", "--train-iters=3", "--save-interval=2", f"--save={ckpt}", f"--load={ckpt}"]
    code = (
        "import runpy, sys; sys.argv = ['reference', *sys.argv[1:]]; "
        "runpy.run_module('pytest_nvrx.workloads.reference', run_name='__main__')"
    )
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": ONE_RANK_STORE_PORT,
    }
    proc = subprocess.run(
        [sys.executable, "-c", code, "--step-time=0", *argv],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [e for e in map(classify, proc.stdout.splitlines()) if e is not None]
    assert [kind for kind, _ in events] == [
        "started",
        "ft",
        "no_checkpoint",
        "iteration",
        "iteration",
        "save_scheduled",
        "iteration",
        "save_completed",
        "save_scheduled",  # final save at the last iteration
        "save_completed",
        "sections",
        "finished",
        "exit",
    ]
    assert tracker(ckpt) == "3"


RECORDED = ["reference-baseline", "reference-kill", "reference-hang"]


@pytest.mark.parametrize("run", RECORDED)
def test_recorded_runs_follow_the_documented_formats(run: str) -> None:
    run_dir = DATA / run
    if not run_dir.is_dir():
        pytest.skip(f"{run_dir} not recorded (scripts/record_reference_runs.py)")
    cycles = sorted((run_dir / "logs").glob("train_cycle*.log"))
    kinds: list[list[str]] = []
    for log in cycles:
        events = [e for e in map(classify, log.read_text().splitlines()) if e is not None]
        assert events, f"no workload lines in {log}"
        kinds.append([kind for kind, _ in events])
        its = [int(f["iteration"]) for kind, f in events if kind.startswith("iteration")]
        assert its == list(range(its[0], its[-1] + 1)), f"gap in iterations of {log}"
    assert "finished" in kinds[-1]
    assert (run_dir / "checkpoints" / TRACKER_NAME).read_text() == "40"
    if run == "reference-baseline":
        assert len(cycles) == 1
    else:
        assert len(cycles) == 2
        assert "finished" not in kinds[0]
        assert "no_checkpoint" not in kinds[1]
        assert "loaded" in kinds[1]


def _iteration_lines(log: Path) -> dict[int, str]:
    out = {}
    for kind, f in filter(None, map(classify, log.read_text().splitlines())):
        if kind.startswith("iteration"):
            out[int(f["iteration"])] = f"{f['consumed']} {f['loss']} {f['lr']}"
    return out


@pytest.mark.parametrize("run", ["reference-kill", "reference-hang"])
def test_recorded_recovery_continues_exactly_like_the_baseline(run: str) -> None:
    """Under the real launcher, the replacement's losses equal the uninterrupted run's."""
    baseline, recovered = DATA / "reference-baseline", DATA / run
    if not (baseline.is_dir() and recovered.is_dir()):
        pytest.skip("recorded runs missing (scripts/record_reference_runs.py)")
    expected = _iteration_lines(baseline / "logs" / "train_cycle0.log")
    after = _iteration_lines(recovered / "logs" / "train_cycle1.log")
    assert min(after) > 1  # resumed from a checkpoint, not from scratch
    assert after == {i: expected[i] for i in after}


# A worker's own log lines (torch's DCP logger in the spawn child, on stderr), as ft_launcher's
# per-cycle logs hold them: "<local rank>: [<rank>] <date> <time>,<ms> - root - INFO - <message>".
WORKER_LINE = re.compile(r"^(?P<local>\d+): \[(?P<rank>\d+)\] \S+ \S+ - root - \w+ - (?P<msg>.*)$")


@pytest.mark.real_run
def test_process_writer_under_ft_launcher_recovers_and_leaves_no_worker(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A real kill run (2 ranks, rank 1 killed) with ``--async-writer process``: every rank of
    every cycle writes through its persistent worker, the replacement resumes from a completed
    checkpoint and finishes, each worker of the last cycle is told to leave before its rank
    exits, and nothing of the run is left afterwards."""
    from pytest_nvrx.criteria import judge_run_dir
    from pytest_nvrx.launch.launcher import Launch
    from pytest_nvrx.launch.planning import plan_run
    from pytest_nvrx.launch.process_tree import tagged
    from pytest_nvrx.launch.run import find_launcher
    from pytest_nvrx.launch.run_dir_setup import prepare_run_dir
    from pytest_nvrx.settings import ConfigError, RunConfig, SectionTimeouts

    config = RunConfig(
        work_dir=tmp_path_factory.mktemp("process-writer"),
        run_id="process-writer-kill",
        workload="reference",
        gpus_per_node=2,
        train_iters=12,
        save_interval=4,
        fault="kill",
        fault_rank=1,
        section_timeouts=SectionTimeouts(setup=180, step=60, checkpointing=120),
        out_of_section_timeout=120.0,
        workload_check_interval=1.0,
        max_restarts=2,
        extra_args=("--async-writer=process",),
    )
    try:
        launcher = find_launcher()
    except ConfigError as exc:
        pytest.skip(str(exc))
    layout = prepare_run_dir(config)
    plan = plan_run(config, launcher_exe=launcher, probe=False)
    with Launch(plan.recipe) as launch:
        launch.wait(360)
    assert not tagged(launch.tag), f"processes of {layout.run_dir} survived"
    result = json.loads((layout.run_dir / RESULT_NAME).read_text())
    judgement = judge_run_dir(layout.run_dir)
    verdicts = "\n".join(v.render() for v in judgement.verdicts)
    assert result["exit_code"] == 0, verdicts
    assert judgement.passed, verdicts

    cycles = sorted(
        (layout.run_dir / "logs").glob("train_cycle*.log"),
        key=lambda p: int(p.stem.removeprefix("train_cycle")),
    )
    assert len(cycles) == 2, cycles
    for log in cycles:
        lines = log.read_text().splitlines()
        running = {
            m["rank"]
            for m in map(WORKER_LINE.match, lines)
            if m and m["msg"] == "Checkpoint background process is running..."
        }
        assert running == {"0", "1"}, f"{log}: not every rank wrote through a worker process"
    lines = cycles[-1].read_text().splitlines()
    loads = [f for k, f in filter(None, map(classify, lines)) if k == "loaded"]
    assert loads and all(int(f["iteration"]) >= 4 for f in loads), loads
    for rank in ("0", "1"):
        stopped = [
            i
            for i, line in enumerate(lines)
            if (m := WORKER_LINE.match(line))
            and m["rank"] == rank
            and m["msg"] == "Terminating the checkpoint background process."
        ]
        exited = [
            i
            for i, line in enumerate(lines)
            if (event := classify(line)) and event[0] == "exit" and event[1]["rank"] == rank
        ]
        assert stopped and exited and stopped[-1] < exited[-1], (rank, stopped, exited)
    assert tracker(layout.run_dir / "checkpoints") == "12"


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"release", "holds 'release', not an iteration number"), (b"\xff\xfe", "not UTF-8 text")],
)
def test_tracker_without_an_iteration_is_a_load_error(
    tmp_path: Path, content: bytes, message: str
) -> None:
    (tmp_path / TRACKER_NAME).write_bytes(content)
    with pytest.raises(ref.LoadError, match=re.escape(message)):
        ref.read_tracker(tmp_path)


def test_the_collector_is_off_only_while_the_imports_load() -> None:
    """The module turns the cyclic collector off for its imports (they allocate millions of
    objects, none garbage) and on again after, also in a process that had it off already only
    if it was off before; main() freezes what the imports left."""
    probe = (
        "import gc, sys\n"
        "off = sys.argv[1] == 'off'\n"
        "if off: gc.disable()\n"
        "import pytest_nvrx.workloads.reference as ref\n"
        "assert gc.isenabled() is (not off), gc.isenabled()\n"
        "before = gc.get_freeze_count()\n"
        "try:\n"
        "    ref.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert gc.get_freeze_count() > before + 100_000, (before, gc.get_freeze_count())\n"
        "print('ok')\n"
    )
    for state in ("on", "off"):
        done = subprocess.run(
            [sys.executable, "-c", probe, state], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.splitlines()[-1] == "ok", done.stdout[-2000:]
