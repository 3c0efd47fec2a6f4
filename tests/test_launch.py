"""The launcher wrapper kills whole process trees on every exit path, and reports progress."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from pytest_nvrx.launch import Launch, Progress, RunTimeout, kill_tree
from pytest_nvrx.recipe import Recipe, prepare_run_dir
from pytest_nvrx.settings import RunConfig

SPAWNER = Path(__file__).parent / "helpers" / "tree_spawner.py"


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def fake_recipe(tmp_path: Path, mode: str) -> tuple[Recipe, Path]:
    config = RunConfig(work_dir=tmp_path, run_id=f"fake-{mode}", workload="reference")
    layout = prepare_run_dir(config)
    pidfile = tmp_path / f"{mode}.pids"
    argv = (sys.executable, str(SPAWNER), mode, str(pidfile), str(layout.run_dir))
    recipe = Recipe(
        config=config,
        layout=layout,
        launcher_argv=argv,
        workload_argv=(),
        env={"TMPDIR": str(layout.tmp)},
        log_server_port=0,
        profile="default",
    )
    return recipe, pidfile


def read_pids(pidfile: Path, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            return [int(p) for p in pidfile.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("spawner wrote no PIDs")


def test_orphans_in_other_sessions_are_killed_after_exit(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "exit-orphans")
    with Launch(recipe) as launch:
        result = launch.wait(30, poll_s=0.05)
    pids = read_pids(pidfile)
    assert result.exit_code == 0
    assert wait_gone(pids), "orphaned children in their own sessions survived"
    assert not recipe.layout.tmp.exists(), "per-run TMPDIR left behind"
    saved = json.loads((recipe.layout.run_dir / "result.json").read_text())
    assert saved["exit_code"] == 0 and saved["timed_out"] is False
    assert json.loads(recipe.layout.manifest.read_text())["run_id"] == "fake-exit-orphans"


def test_timeout_kills_tree_and_explains(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")
    with Launch(recipe) as launch, pytest.raises(RunTimeout, match="Hint:") as info:
        read_pids(pidfile)
        launch.wait(0.5, poll_s=0.05)
    pids = [launch.pid or -1, *read_pids(pidfile)]
    assert wait_gone(pids)
    assert "did not finish within" in str(info.value)
    assert json.loads((recipe.layout.run_dir / "result.json").read_text())["timed_out"] is True


def test_exception_inside_context_kills_tree(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")
    with pytest.raises(KeyError), Launch(recipe) as launch:
        read_pids(pidfile)
        raise KeyError("internal error")
    assert wait_gone([launch.pid or -1, *read_pids(pidfile)])


def test_keyboard_interrupt_kills_tree(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")

    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), Launch(recipe) as launch:
        read_pids(pidfile)
        launch.wait(30, sleep=interrupt)
    assert wait_gone([launch.pid or -1, *read_pids(pidfile)])
    assert json.loads((recipe.layout.run_dir / "result.json").read_text())["interrupted"]


def test_stopped_process_is_killed(tmp_path: Path) -> None:
    recipe, pidfile = fake_recipe(tmp_path, "hang")
    with Launch(recipe) as launch:
        pids = read_pids(pidfile)
        os.kill(pids[0], 19)  # SIGSTOP, like an injected hang
    assert wait_gone([launch.pid or -1, *pids])


def test_progress_is_reported(tmp_path: Path) -> None:
    recipe, _ = fake_recipe(tmp_path, "progress")
    seen: list[Progress] = []
    with Launch(recipe) as launch:
        launch.wait(30, on_progress=seen.append, poll_s=0.05)
    assert seen, "no progress reported"
    assert any(p.iteration is not None and p.total == 3 for p in seen)
    assert "cycle 0" in seen[-1].describe()


def test_kill_tree_with_nothing_to_kill() -> None:
    assert kill_tree(None, "no-such-tag", grace_s=0.1) == set()
