"""One run dir, one run; a fresh private TMPDIR per launch.

The run dir is claimed atomically (an ``O_EXCL`` claim file) before anything is written, so the
same run ID started twice at once refuses the second start instead of mixing two runs' evidence.
The launcher's TMPDIR is made by ``mkdtemp`` for each launch (mode 0700, never an existing path,
so a symlink planted at a predictable name is not followed) and stays short enough for
ft_launcher's Unix socket paths (108 bytes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from pytest_nvrx import cli
from pytest_nvrx.launch import run_dir_setup as recipes
from pytest_nvrx.launch.launcher import Launch
from pytest_nvrx.launch.recipe import Recipe
from pytest_nvrx.launch.run_dir_setup import prepare_run_dir
from pytest_nvrx.settings import ConfigError, RunConfig
from tests.helpers.processes import kill_marked, marked_env, new_mark, wait_none_marked

# Stands in for ft_launcher: reports the TMPDIR it was given, and puts a file there (as the
# launcher puts its sockets).
REPORT_TMPDIR = """
import json, os, stat, sys
tmp = os.environ["TMPDIR"]
st = os.lstat(tmp)
open(os.path.join(tmp, "launcher.sock"), "w").close()
json.dump({"path": tmp, "mode": stat.S_IMODE(st.st_mode), "is_link": stat.S_ISLNK(st.st_mode),
           "uid": st.st_uid}, open(sys.argv[1], "w"))
"""


def config(tmp_path: Path, run_id: str = "twice") -> RunConfig:
    return RunConfig(work_dir=tmp_path, run_id=run_id, workload="reference")


def test_concurrent_claims_of_one_run_id_one_wins(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    starters = 8
    barrier = threading.Barrier(starters)
    won: list[int] = []
    refused: list[str] = []

    def start(i: int) -> None:
        barrier.wait()
        try:
            prepare_run_dir(cfg)
        except ConfigError as exc:
            refused.append(str(exc))
        else:
            won.append(i)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(starters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1, f"{len(won)} of {starters} simultaneous starts were accepted"
    assert len(refused) == starters - 1
    assert all(str(cfg.run_dir) in msg and "new run ID" in msg for msg in refused), refused


def test_claimed_run_dir_refuses_a_second_run(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    prepare_run_dir(cfg)
    claim = json.loads(next(cfg.run_dir.glob("run*.claim")).read_text())
    assert claim["pid"] == os.getpid()
    with pytest.raises(ConfigError, match="claimed") as info:
        prepare_run_dir(cfg)
    assert str(cfg.run_dir) in str(info.value) and f"pid {os.getpid()}" in str(info.value)


def test_claim_refused_writes_nothing(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg.run_dir.mkdir(parents=True)
    recipes.claim_run_dir(cfg.layout, nnodes=1)
    before = sorted(p.name for p in cfg.run_dir.rglob("*"))
    with pytest.raises(ConfigError):
        prepare_run_dir(cfg)
    assert sorted(p.name for p in cfg.run_dir.rglob("*")) == before


def test_claim_never_follows_a_planted_link(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg.run_dir.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (cfg.run_dir / "run.claim").symlink_to(victim)
    with pytest.raises(ConfigError, match="claimed"):
        recipes.claim_run_dir(cfg.layout, nnodes=1)
    assert victim.read_text() == "keep\n"


def test_multinode_claims_once_per_host(tmp_path: Path) -> None:
    """On several nodes all launches share the run dir: one claim per host."""
    layout = config(tmp_path).layout
    layout.run_dir.mkdir(parents=True)
    recipes.claim_run_dir(layout, nnodes=2, host="node-a")
    recipes.claim_run_dir(layout, nnodes=2, host="node-b")
    with pytest.raises(ConfigError, match="node-a"):
        recipes.claim_run_dir(layout, nnodes=2, host="node-a")


def test_dry_run_does_not_claim(tmp_path: Path) -> None:
    """A dry run leaves only empty directories: the real run of that ID may follow it."""
    args = ["run", "--workload", "reference", "--work-dir", str(tmp_path), "--run-id", "twice"]
    assert cli.main([*args, "--dry-run"], {}) == 0
    prepare_run_dir(config(tmp_path))  # does not raise


def launch_reporting_tmpdir(tmp_path: Path, run_id: str) -> tuple[Recipe, dict[str, object]]:
    cfg = config(tmp_path, run_id)
    layout = prepare_run_dir(cfg)
    report = tmp_path / f"{run_id}.tmpdir.json"
    recipe = Recipe(
        config=cfg,
        layout=layout,
        launcher_argv=(sys.executable, "-c", REPORT_TMPDIR, str(report)),
        workload_argv=(),
        env={"TMPDIR": str(layout.tmp)},  # what build_recipe gives (and a dry run prints)
        log_server_port=0,
        profile="default",
    )
    with Launch(recipe) as launch:
        result = launch.wait(30, poll_s=0.05)
    assert result.exit_code == 0, (layout.logs / "launcher.console.log").read_text()
    return recipe, json.loads(report.read_text())


def test_tmpdir_is_fresh_private_short_and_removed(tmp_path: Path) -> None:
    recipe, seen = launch_reporting_tmpdir(tmp_path, "fresh")
    path = str(seen["path"])
    old_name = f"/tmp/nvrx-{zlib.crc32(str(recipe.layout.run_dir).encode()):08x}"
    assert path != old_name, "the predictable per-run name is still used"
    assert seen["mode"] == 0o700 and seen["is_link"] is False and seen["uid"] == os.getuid()
    assert len(path) < 60 and len(path) + len("/_ft_launcher4194304_rmon127.socket") < 108
    assert not Path(path).exists(), "TMPDIR left behind"
    # the manifest records the TMPDIR this launch really used
    assert json.loads(recipe.layout.manifest.read_text())["env"]["TMPDIR"] == path
    _, again = launch_reporting_tmpdir(tmp_path, "fresh2")
    assert again["path"] != path


def test_planted_symlink_at_old_tmpdir_name_is_not_followed(tmp_path: Path) -> None:
    cfg = config(tmp_path, "planted")
    victim = tmp_path / "someone-elses-dir"
    victim.mkdir()
    planted = Path(f"/tmp/nvrx-{zlib.crc32(str(cfg.run_dir).encode()):08x}")
    planted.symlink_to(victim)
    try:
        _, seen = launch_reporting_tmpdir(tmp_path, "planted")
        assert list(victim.iterdir()) == [], "the launcher wrote through the planted link"
        assert seen["is_link"] is False and Path(str(seen["path"])) != planted
        assert planted.is_symlink(), "the planted link was replaced or removed"
    finally:
        planted.unlink()


@pytest.mark.real_run
@pytest.mark.timeout(300)
def test_same_run_id_started_twice_at_once(tmp_path: Path) -> None:
    """Two CLI runs of one run ID: one launches, the other exits 2 naming the run dir."""
    work = tmp_path / "work"
    run_dir = work / "runs" / "twice"
    mark = new_mark()
    argv = [
        sys.executable, "-m", "pytest_nvrx", "run", "--workload", "reference",
        "--work-dir", str(work), "--run-id", "twice", "--fault", "none",
        "--train-iters", "4", "--save-interval", "2",
        "--section-timeouts", "setup:120,step:30,checkpointing:60",
        "--workload-check-interval", "1", "--timeout", "200",
    ]  # fmt: skip
    outs = [tmp_path / f"cli{i}.out" for i in range(2)]
    procs = []
    try:
        for out in outs:
            with out.open("wb") as fh:
                procs.append(
                    subprocess.Popen(
                        argv, stdout=fh, stderr=subprocess.STDOUT, env=marked_env(mark)
                    )
                )
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        codes = [p.poll() for p in procs]
        left = wait_none_marked(mark, timeout=5.0)
    finally:
        kill_marked(mark)
    texts = [o.read_text(errors="replace") for o in outs]
    assert sorted(c for c in codes if c is not None) == [0, 2], (codes, texts)
    loser = codes.index(2)
    winner = 1 - loser
    # Which refusal depends on how far the winner got: still holding only the claim ("claimed"),
    # or already past it with run.json written ("was used before"; since the stack probe takes
    # 0.14 s, not 3 s, on this machine the winner is often that far). The O_EXCL race itself:
    # test_concurrent_claims_of_one_run_id_one_wins.
    assert f"run dir {run_dir}" in texts[loser], texts[loser]
    assert "claimed" in texts[loser] or "was used before" in texts[loser], texts[loser]
    assert "Traceback" not in texts[loser]
    assert json.loads((run_dir / "run.json").read_text())["pid"] == procs[winner].pid
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 0
    assert left == {}
