"""Python tracebacks in cycle logs: one error event each, quoting the exception, the innermost
frame and its source line, and the frame that was loading a checkpoint.

On the real device log of a replacement that died restoring (tests/data/gpu-recipe), and on
doctored logs: interleaved ranks and warnings, chained exceptions, a traceback cut short, more
tracebacks than are kept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx.evidence.cycle_log import MAX_ERRORS, parse_cycle_log
from pytest_nvrx.evidence.megatron import MEGATRON
from pytest_nvrx.evidence.reference import REFERENCE
from pytest_nvrx.evidence.refs import LineCursor
from pytest_nvrx.evidence.tracebacks import (
    MAX_IDLE,
    MAX_OPEN,
    TracebackAssembler,
    half_built,
    is_checkpoint_load,
    short_path,
)
from pytest_nvrx.evidence.workload import (
    IterationCommitted,
    LoadStarted,
    WorkloadError,
    WorkloadLogAdapter,
)

DISTOPT = Path(__file__).parents[1] / "data" / "gpu-recipe" / "megatron-kill-40-distopt"
MEGATRON_ROOT = "/work/main/.megatron"


def errors(path: Path, adapter: WorkloadLogAdapter = MEGATRON) -> tuple[WorkloadError, ...]:
    log = parse_cycle_log(path, 1, adapter, file="logs/x.log")
    return log.of_type(WorkloadError)


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "train_cycle1.log"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def frame(path: str, line: int, func: str, prefix: str = "0: [rank0]: ") -> str:
    return f'{prefix}  File "{path}", line {line}, in {func}'


# ---------------------------------------------------------------------------------------------
# the real log


@pytest.mark.parametrize("cycle", [1, 2, 3])
def test_real_load_death_on_the_device(cycle: int) -> None:
    rel = f"logs/train_cycle{cycle}.log"
    log = parse_cycle_log(DISTOPT / rel, cycle, MEGATRON, file=rel)
    (error,) = log.of_type(WorkloadError)  # one event for the whole traceback
    assert error.ref.location == f"{rel}:989" and error.exception == "AssertionError"
    assert error.traceback is not None and error.traceback.location == f"{rel}:955"
    assert error.frames == 14 and error.in_checkpoint_load
    inner = error.innermost
    assert inner is not None
    assert inner.path == f"{MEGATRON_ROOT}/megatron/core/optimizer/distrib_optimizer.py"
    assert inner.where == "megatron/core/optimizer/distrib_optimizer.py:839"
    assert (inner.function, inner.code) == ("state_dict", "assert len(steps) == 1")
    assert inner.ref.location == f"{rel}:986"
    assert inner.source is not None and inner.source.location == f"{rel}:987"
    load = error.load_frame
    assert load is not None and load.function == "load_checkpoint"
    assert load.where == "megatron/training/checkpointing.py:2311"
    assert load.ref.location == f"{rel}:974"
    # its lines were the traceback's: none of them became another event
    assert log.of_type(LoadStarted) == () and log.of_type(IterationCommitted) == ()


# ---------------------------------------------------------------------------------------------
# doctored logs


def test_interleaved_ranks_and_warnings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "0: [rank0]: Traceback (most recent call last):",
        "1: [rank1]: Traceback (most recent call last):",
        frame("/c/megatron/training/checkpointing.py", 2311, "load_checkpoint"),
        frame("/c/megatron/training/training.py", 900, "train", "1: [rank1]: "),
        "0: /c/megatron/core/optimizer/__init__.py:25: UserWarning: Falling back to Torch.",
        "0:   warnings.warn(",
        "0: [rank0]:     state_dict = generate_state_dict(",
        "1: [rank1]:     loss.backward()",
        "0: [rank0]:                  ^^^^^^^^^^^^^^^^^^^^",
        "0: [rank0]: KeyError: 'optimizer'",
        "1: [rank1]: torch.distributed.DistBackendError: NCCL error: remote process exited",
    )
    first, second = errors(path)
    assert (first.ref.line, first.exception) == (10, "KeyError: 'optimizer'")
    assert (
        first.innermost is not None and first.innermost.code == "state_dict = generate_state_dict("
    )
    assert first.innermost.source is not None and first.innermost.source.line == 7
    assert first.load_frame == first.innermost  # the innermost frame was the load itself
    assert second.ref.line == 11 and not second.in_checkpoint_load
    assert second.exception is not None and second.exception.startswith("torch.distributed.")
    assert (
        second.innermost is not None
        and second.innermost.where == "megatron/training/training.py:900"
    )


def test_chained_exceptions_are_one_event_each_and_unprefixed_lines_work(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "Traceback (most recent call last):",
        '  File "/repo/pytest_nvrx/workloads/reference.py", line 330, in load',
        "    raise LoadError(f'cannot read {path}')",
        "pytest_nvrx.workloads.reference.LoadError: cannot read /ckpt/iter_0000010",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/repo/pytest_nvrx/workloads/reference.py", line 700, in load_checkpoint',
        "    ckpt.load(checkpoint_dir, iteration, group)",
        "SystemExit: 1",
    )
    first, second = errors(path, REFERENCE)
    assert first.ref.line == 4 and second.ref.line == 11
    # the adapter names its package root: frames are shown from there
    assert first.innermost is not None
    assert first.innermost.where == "pytest_nvrx/workloads/reference.py:330"
    assert not first.in_checkpoint_load  # "load" of a module that does not say checkpoint
    assert second.load_frame is not None and second.load_frame.function == "load_checkpoint"
    assert second.exception == "SystemExit: 1"


def test_a_traceback_cut_short_is_kept_with_its_head(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "0: [rank0]: Traceback (most recent call last):",
        frame("/c/megatron/training/checkpointing.py", 2311, "load_checkpoint"),
        "0: [rank0]:     load_kwargs['sharded_state_dict'] = generate_state_dict(",
    )
    (error,) = errors(path)
    assert error.ref.line == 1 and error.exception is None and error.in_checkpoint_load


def test_a_traceback_without_an_end_gives_way_to_other_lines(tmp_path: Path) -> None:
    filler = [f"0: [rank0]: not a traceback line {i}" for i in range(MAX_IDLE + 1)]
    path = write(
        tmp_path,
        "0: [rank0]: Traceback (most recent call last):",
        *filler,
        "0: [rank0]: RuntimeError: a line of its own",
    )
    first, second = errors(path)
    assert first.ref.line == 1 and first.exception is None
    # after the give-up the adapter sees lines again: its own exception-line rule applies
    assert second.ref.line == MAX_IDLE + 3 and second.traceback is None


def test_only_the_first_errors_are_kept_and_the_rest_counted(tmp_path: Path) -> None:
    one = [
        "0: [rank0]: Traceback (most recent call last):",
        frame("/c/megatron/x.py", 1, "f"),
        "0: [rank0]:     boom()",
        "0: [rank0]: RuntimeError: boom",
    ]
    path = write(tmp_path, *(one * (MAX_ERRORS + 5)))
    log = parse_cycle_log(path, 0, MEGATRON)
    assert len(log.of_type(WorkloadError)) == MAX_ERRORS and log.errors_not_kept == 5


def test_open_tracebacks_are_bounded() -> None:
    tracebacks = TracebackAssembler()
    cursor = LineCursor("logs/x.log")
    closed: list[WorkloadError] = []
    for rank in range(MAX_OPEN + 3):
        cursor.lineno = rank + 1
        cursor.raw = f"{rank}: Traceback (most recent call last):"
        consumed, done = tracebacks.feed(str(rank), "Traceback (most recent call last):", cursor)
        assert consumed
        closed += done
    assert [e.ref.line for e in closed] == [1, 2, 3]  # the oldest gave way
    assert len(tracebacks.finish()) == MAX_OPEN and not tracebacks.active


def test_a_long_traceback_keeps_constant_state(tmp_path: Path) -> None:
    frames = [
        line
        for i in range(5000)
        for line in (frame(f"/c/megatron/m{i}.py", i + 1, f"f{i}"), f"0: [rank0]:     f{i + 1}()")
    ]
    path = write(
        tmp_path,
        "0: [rank0]: Traceback (most recent call last):",
        *frames,
        "0: [rank0]: RecursionError",
    )
    (error,) = errors(path)
    assert error.frames == 5000 and error.innermost is not None
    assert error.innermost.where == "megatron/m4999.py:5000" and error.innermost.code == "f5000()"


def test_plain_exception_lines_stay_errors(tmp_path: Path) -> None:
    (error,) = errors(write(tmp_path, "0: [rank0]: torch.distributed.DistBackendError: NCCL"))
    assert error.traceback is None and error.innermost is None and error.ref.line == 1


# ---------------------------------------------------------------------------------------------
# helpers


@pytest.mark.parametrize(
    ("path", "roots", "shown"),
    [
        (
            f"{MEGATRON_ROOT}/megatron/core/optimizer/distrib_optimizer.py",
            ("megatron",),
            "megatron/core/optimizer/distrib_optimizer.py",
        ),
        (
            "/a/megatron/Megatron-LM/megatron/training/checkpointing.py",
            ("megatron",),
            "megatron/training/checkpointing.py",
        ),
        (
            "/opt/venv/lib/python3.12/site-packages/torch/distributed/checkpoint/state_dict_loader.py",
            ("megatron",),
            "torch/distributed/checkpoint/state_dict_loader.py",
        ),
        ("/usr/lib/python3/dist-packages/megatron/core/utils.py", (), "megatron/core/utils.py"),
        (f"{MEGATRON_ROOT}/pretrain_gpt.py", ("megatron",), f"{MEGATRON_ROOT}/pretrain_gpt.py"),
        ("<frozen runpy>", ("megatron",), "<frozen runpy>"),
        ("/x/megatron", ("megatron",), "/x/megatron"),  # a file named like the root is no root
    ],
)
def test_short_path(path: str, roots: tuple[str, ...], shown: str) -> None:
    assert short_path(path, roots) == shown


@pytest.mark.parametrize(
    ("path", "function", "loading"),
    [
        ("/c/megatron/training/checkpointing.py", "load_checkpoint", True),
        ("/c/megatron/training/checkpointing.py", "_load_base_checkpoint", True),
        ("/c/megatron/core/dist_checkpointing/serialization.py", "load", True),
        (
            "/v/site-packages/torch/distributed/checkpoint/state_dict_loader.py",
            "load_state_dict",
            True,
        ),
        ("/c/megatron/training/checkpointing.py", "save_checkpoint", False),
        ("/c/megatron/training/checkpointing.py", "generate_state_dict", False),
        ("/c/megatron/core/optimizer/distrib_optimizer.py", "load_state_dict", False),
        ("/c/megatron/training/training.py", "setup_model_and_optimizer", False),
        ("/v/site-packages/torch/utils/checkpoint.py", "checkpoint", False),  # activations
        ("/repo/pytest_nvrx/workloads/reference.py", "load_checkpoint", True),
    ],
)
def test_checkpoint_load_frames(path: str, function: str, loading: bool) -> None:
    assert is_checkpoint_load(path, function) is loading


# ---------------------------------------------------------------------------------------------
# the criteria on another workload: the CPU reference workload's own traceback


def test_reference_workload_death_while_loading_is_quoted(tmp_path: Path) -> None:
    from pytest_nvrx.criteria import judge_run_dir
    from tests.helpers.doctor import copy_run

    run = copy_run(Path(__file__).parents[1] / "data" / "cpu" / "reference-kill", tmp_path / "r")
    cycle1 = "logs/train_cycle1.log"
    run.delete(cycle1, "load checkpoint iteration 10")
    src = "/workspace/pytest-nvrx/pytest_nvrx/workloads/reference.py"
    torch_c10d = "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
    at = run.insert_after(
        cycle1,
        "rank 0 ft monitoring initialized",
        "0: [ref] 2026-11-29T11:52:52.917+00:00 rank 0 aborted RuntimeError: Connection closed by"
        " peer [127.0.0.1]:41234",
        "0: Traceback (most recent call last):",
        f'0:   File "{src}", line 601, in run',
        "0:     code = _train(args, monitor, log)",
        f'0:   File "{src}", line 642, in _train',
        "0:     load_checkpoint(trainer, args.load, ckpt_group, log)",
        f'0:   File "{src}", line 680, in load_checkpoint',
        "0:     iteration = agreed_tracker(checkpoint_dir)",
        f'0:   File "{torch_c10d}", line 2950, in all_reduce',
        "0:     work = group.allreduce([tensor], opts)",
        "0: RuntimeError: Connection closed by peer [127.0.0.1]:41234",
    )
    v = judge_run_dir(run.root).verdict("optimizer_state_load")
    assert v.status == "FAIL"
    assert v.reason == (
        "cycle 1 died loading checkpoint iteration 10: RuntimeError: Connection closed by peer"
        " [127.0.0.1]:41234 at torch/distributed/distributed_c10d.py:2950"
        " (work = group.allreduce([tensor], opts))"
    )
    assert [r.location for r in v.evidence][:4] == [
        f"{cycle1}:{at + 6}",  # load_checkpoint (shown as pytest_nvrx/workloads/reference.py)
        f"{cycle1}:{at + 8}",
        f"{cycle1}:{at + 9}",
        f"{cycle1}:{at + 10}",
    ]


SO = "/m/megatron/core/datasets/helpers_cpp.cpython-312-x86_64-linux-gnu.so"


EOF_WORDS = "ELF load command past end of file"
IO_WORDS = "cannot read file data: Input/output error"
MISSING_LIB = "libcudart.so.13: cannot open shared object file: No such file or directory"


@pytest.mark.parametrize(
    ("exception", "why"),
    [
        (f"ImportError: {SO}: file too short", "file too short"),
        (f"ImportError: {SO}: invalid ELF header", "invalid ELF header"),
        (f"ImportError: {SO}: {EOF_WORDS}", EOF_WORDS),
        (f"ImportError: {SO}: {IO_WORDS}", IO_WORDS),
        ("ImportError: /with space/helpers.so: file too short", "file too short"),
        (f"ImportError: {MISSING_LIB}", None),
        ("ImportError: No module named 'megatron.core.datasets.helpers_cpp'", None),
        (f"OSError: {SO}: file too short", None),
        (None, None),
    ],
)
def test_a_compiled_module_imported_half_built(exception: str | None, why: str | None) -> None:
    found = half_built(exception)
    assert (found.why if found is not None else None) == why
    if found is not None:
        assert found.name in ("helpers_cpp.cpython-312-x86_64-linux-gnu.so", "helpers.so")
