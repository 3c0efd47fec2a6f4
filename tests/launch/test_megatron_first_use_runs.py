"""A fresh checkout is built once before anything launches, whatever runs at once (issue #35).

Several real sessions (``python -m pytest_nvrx run --workload megatron``, each through the real
ft_launcher) start together on one fresh checkout. The checkout is a Megatron-shaped stand-in
(tests/helpers/megatron_checkouts.py): its Makefile is real and slow (the artifact is written in
five pieces 0.5 s apart, each run of the recipe logged), and its ``pretrain_gpt.py`` does what
Megatron's does at first use: rank 0 runs ``compile_helpers()`` (make in the helpers'
directory), then the worker imports what was built, recording whether it was whole.

What it proves: the recipe ran once for all the sessions; every worker imported the artifact
whole; each worker's own make (Megatron's rank 0) found it up to date ("Nothing to be done"),
so it was built before any launch; each session said in one line what it did; and the checkout
gained only the artifact. The control runs the same stand-in's workers without the harness,
as jobs not run by us would: they race, and the logs show it, so the assertions above can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.files import snapshot
from tests.helpers.megatron_checkouts import DATASETS, slow_checkout
from tests.helpers.processes import MARK_VAR, kill_marked, new_mark

SESSIONS = 3
ARTIFACT = f"{DATASETS}/helpers_data.py"


def stand_in_env(tmp_path: Path, mark: str, piece_s: float) -> dict[str, str]:
    return {
        **os.environ,
        MARK_VAR: mark,
        "NVRX_TEST_BUILD_LOG": str(tmp_path / "builds.log"),
        "NVRX_TEST_IMPORT_LOG": str(tmp_path / "imports.log"),
        "NVRX_TEST_PIECE_S": str(piece_s),
        # the stand-in's modules are imported by the workers: no __pycache__ in the checkout
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.real_run
@pytest.mark.timeout(420)
def test_sessions_started_together_build_once_and_no_worker_imports_it_half_built(
    tmp_path: Path, clean_env: None
) -> None:
    root = slow_checkout(tmp_path / "Megatron-LM")
    before = snapshot(root)
    mark = new_mark()
    env = stand_in_env(tmp_path, mark, piece_s=0.5)
    work = tmp_path / "work"
    sessions = []
    try:
        for i in range(SESSIONS):
            argv = [
                sys.executable, "-m", "pytest_nvrx", "run", "--workload", "megatron",
                "--megatron-path", str(root), "--fault", "none", "--gpus-per-node", "1",
                "--work-dir", str(work), "--run-id", f"first-use-{i}", "--timeout", "240",
            ]  # fmt: skip
            sessions.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        outputs = [session.communicate(timeout=360) for session in sessions]
    finally:
        kill_marked(mark)
    for session, (out, err) in zip(sessions, outputs, strict=True):
        assert session.returncode == 0, out + err
    # the recipe ran once, before the launches; every worker imported the whole artifact
    assert len(lines(tmp_path / "builds.log")) == 1
    imports = lines(tmp_path / "imports.log")
    assert len(imports) == SESSIONS and all(line.endswith(" whole") for line in imports), imports
    for i in range(SESSIONS):
        cycle = (work / "runs" / f"first-use-{i}" / "logs" / "train_cycle0.log").read_text()
        assert "make: Nothing to be done for 'default'." in cycle, cycle  # Megatron's rank 0
        assert "fake megatron: helpers imported whole" in cycle
    # one line per session: one built it, the others waited for it or found it built
    said = [
        [line for line in err.splitlines() if line.startswith("nvrx: megatron build: ")]
        for _, err in outputs
    ]
    assert all(len(one) == 1 for one in said), said
    built = [one[0] for one in said if " built in " in one[0]]
    assert len(built) == 1 and built[0].startswith(f"nvrx: megatron build: {ARTIFACT} built in ")
    for (line,) in said:
        assert line in built or line.startswith(
            (f"nvrx: megatron build: {ARTIFACT} built by pid ", f"nvrx: megatron build: {ARTIFACT}"
             " already built")
        ), line  # fmt: skip
    # the checkout gained the artifact alone: no claim left, no temp file, nothing changed
    after = snapshot(root)
    assert set(after) - set(before) == {ARTIFACT}
    assert {k: v for k, v in after.items() if k in before and not v[0]} == {
        k: v for k, v in before.items() if not v[0]
    }


def test_without_the_harness_the_stand_in_races(tmp_path: Path) -> None:
    """The control: three jobs' rank 0 run the stand-in's pretrain_gpt.py on a fresh copy, as
    jobs not run by pytest-nvrx would. The second starts while the first's make writes the
    artifact: its make calls the half-written file up to date and the import finds it cut."""
    root = slow_checkout(tmp_path / "Megatron-LM")
    mark = new_mark()
    env = stand_in_env(tmp_path, mark, piece_s=1.0)
    artifact = root / ARTIFACT
    jobs = []
    try:
        for _ in range(3):
            jobs.append(
                subprocess.Popen(
                    [sys.executable, str(root / "pretrain_gpt.py")],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
            deadline = time.monotonic() + 30
            while not artifact.exists():  # the first make has begun writing it
                assert time.monotonic() < deadline
                time.sleep(0.01)
        for job in jobs:
            job.communicate(timeout=60)
    finally:
        kill_marked(mark)
    imports = lines(tmp_path / "imports.log")
    half = [line for line in imports if " HALF " in line]
    assert half, imports
    assert any(job.returncode != 0 for job in jobs)
