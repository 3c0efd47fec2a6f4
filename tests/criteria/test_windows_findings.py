"""The evidence behind docs/findings.md, re-read from the committed GPU runs.

``tests/data/windows/gpu-stacks``: two real 2x H200 Megatron runs made after the injector learned
to dump every thread's stack (faulthandler, one shot) when the faulted rank is still running a
while after its fault: 10 s after raising the ``exception`` fault, 20 s after killing the
checkpoint worker (``ckpt-worker``). Both recovered and pass all six criteria; the stacks say
where the rank was instead of exiting (exception) or failing (ckpt-worker).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_nvrx.criteria.judgement import judge_run_dir

STACKS = Path(__file__).resolve().parents[1] / "data" / "windows" / "gpu-stacks"
EXCEPTION = STACKS / "g2-exception-step-stacks"
WORKER = STACKS / "g2-ckpt-worker-finalize-stacks"


def _rank_lines(run: Path, rank: int) -> list[str]:
    prefix = f"{rank}: "
    text = (run / "logs" / "train_cycle0.log").read_text(errors="replace")
    return [line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)]


def _dumped_threads(lines: list[str], timeout_line: str) -> list[list[str]]:
    """The thread stacks of the one faulthandler dump that follows ``timeout_line``."""
    start = lines.index(timeout_line)
    threads: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("Thread 0x"):
            threads.append([])
        elif line.startswith("  File ") and threads:
            threads[-1].append(line.strip())
        elif line.strip() and not line.startswith("  <no Python frame>"):
            break  # the dump is over (or was cut short when the process ended)
    return threads


def _thread_with(threads: list[list[str]], *needles: str) -> list[str]:
    hits = [t for t in threads if all(any(n in f for f in t) for n in needles)]
    assert len(hits) == 1, f"{len(hits)} threads with {needles}: {threads}"
    return hits[0]


@pytest.mark.parametrize("run", [EXCEPTION, WORKER], ids=lambda p: p.name)
def test_the_stack_runs_recover_and_pass_all_six(run: Path) -> None:
    judgement = judge_run_dir(run)
    assert [v.id for v in judgement.verdicts if not v.passed] == []


def test_a_megatron_rank_that_raised_waits_for_its_data_loader_workers() -> None:
    """Finding 1: after the uncaught InjectedFault, rank 1's main thread is in torch's
    DataLoader shutdown, joining a worker process with a timeout (torch waits up to
    MP_STATUS_CHECK_INTERVAL, 5 s, per worker), 10 s after the raise."""
    lines = _rank_lines(EXCEPTION, 1)
    raised = [i for i, line in enumerate(lines) if "InjectedFault: pytest-nvrx injected" in line]
    assert len(raised) == 1
    dump = lines.index("Timeout (0:00:10)!")
    assert dump > raised[0]
    main = _thread_with(_dumped_threads(lines, "Timeout (0:00:10)!"), "_clean_up_worker")
    # Process.join with a timeout (a select on the child's sentinel), called by the DataLoader
    assert "selectors.py" in main[0] and "in select" in main[0]
    assert "multiprocessing/popen_fork.py" in main[2] and "in wait" in main[2]
    assert "multiprocessing/process.py" in main[3] and "in join" in main[3]
    assert "torch/utils/data/dataloader.py" in main[4] and "_clean_up_worker" in main[4]
    # the launcher acted only at the step section's deadline, ~30 s after the raise
    launcher = (EXCEPTION / "logs" / "launcher.log").read_text()
    assert "Section 'step' has been open for 3" in launcher


def test_a_megatron_rank_whose_checkpoint_worker_died_waits_for_it_forever() -> None:
    """Finding 2: 20 s after its persistent checkpoint worker was killed (save 10 in flight),
    rank 1 is blocked in NVRx's PersistentAsyncCaller.schedule_async_call (the preload queue's
    join) for the next save, inside Megatron's save_checkpoint; only the checkpointing section
    timeout ends it."""
    marker = json.loads((WORKER / "fault_injected.json").read_text())
    assert (marker["fault"], marker["window"], marker["in_flight_iteration"]) == (
        "ckpt-worker",
        "finalize",
        10,
    )
    lines = _rank_lines(WORKER, 1)
    main = _thread_with(
        _dumped_threads(lines, "Timeout (0:00:20)!"), "schedule_async_call", "save_checkpoint"
    )
    assert "multiprocessing/synchronize.py" in main[0] and "in wait" in main[0]
    assert "multiprocessing/queues.py" in main[1] and "in join" in main[1]  # JoinableQueue.join
    assert "nvidia_resiliency_ext/checkpointing/async_ckpt/core.py" in main[2]
    assert "schedule_async_call" in main[2]
    assert any("megatron/training/async_utils.py" in f and "schedule_async_save" in f for f in main)
    launcher = (WORKER / "logs" / "launcher.log").read_text()
    assert "[workload:?(1) infra:?(?)] rank_monitor_server.py" in launcher
    assert "Section 'checkpointing' has been open for 3" in launcher
