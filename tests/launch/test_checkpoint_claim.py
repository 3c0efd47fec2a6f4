"""A checkpoint directory belongs to one run at a time (#22 item 4).

Measured on 476a6ee: two runs with different run IDs and one ``--checkpoint-dir`` both
launched; the second's first cycle loaded the first's checkpoint 5, and the first then PASSED on
a directory another run was writing into. Now the checkpoint dir is claimed like the run dir
(``checkpoint.claim``, ``O_EXCL``), released at the run's end, and a claim whose process is gone
is named as such in the refusal.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx import cli
from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.launch import checkpoint_claim as claims
from pytest_nvrx.launch import claims as run_claims
from pytest_nvrx.launch import run as runs
from pytest_nvrx.launch.retention import prune_checkpoint_payload
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.settings import ConfigError, RunConfig
from tests.helpers.processes import kill_marked, marked, marked_env, new_mark, wait_none_marked

HOST = socket.gethostname()
DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(autouse=True)
def _release_what_the_test_claimed() -> Any:
    yield
    claims.release_all()


def claim(ckpt: Path, run_id: str, **kw: Any) -> Path:
    return claims.claim_checkpoint_dir(ckpt, run_id=run_id, run_dir=ckpt.parent / run_id, **kw)


def write_claim(path: Path, **fields: Any) -> None:
    record = {"run_id": "other", "run_dir": "/w/runs/other", "host": HOST, "pid": 1,
              "time": "2026-01-02T03:04:05.000+00:00", **fields}  # fmt: skip
    path.write_text(json.dumps(record) + "\n")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- the claim ---------------------------------------------------------------------------------


def test_concurrent_claims_of_one_checkpoint_dir_one_wins(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    starters = 8
    barrier = threading.Barrier(starters)
    won: list[str] = []
    refused: list[str] = []

    def start(i: int) -> None:
        barrier.wait()
        try:
            claim(ckpt, f"run{i}")
        except ConfigError as exc:
            refused.append(str(exc))
        else:
            won.append(f"run{i}")

    threads = [threading.Thread(target=start, args=(i,)) for i in range(starters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1, f"{len(won)} of {starters} simultaneous claims were accepted"
    assert len(refused) == starters - 1
    holder = json.loads((ckpt / "checkpoint.claim").read_text())
    assert holder["run_id"] == won[0] and holder["pid"] == os.getpid() and holder["host"] == HOST
    assert holder["pid_start"] is not None and holder["time"] and holder["run_dir"]
    for msg in refused:
        # the other run named, one line; or, mid-write, 'another run' (still a refusal)
        assert msg.startswith(f"checkpoint dir {ckpt} is in use by "), msg
        assert "\n" not in msg and "another --checkpoint-dir" in msg
    assert any(f"run {won[0]} (pid {os.getpid()} on host {HOST}, started " in m for m in refused)


def test_live_claim_refuses_naming_the_other_run(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    claim(ckpt, "first")
    before = sorted(p.name for p in ckpt.iterdir())
    with pytest.raises(ConfigError) as info:
        claim(ckpt, "second")
    assert str(info.value).startswith(f"checkpoint dir {ckpt} is in use by run first (pid ")
    assert sorted(p.name for p in ckpt.iterdir()) == before  # nothing written by the refusal


def test_stale_claim_of_a_dead_process_is_explained(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    pid = dead_pid()
    write_claim(ckpt / "checkpoint.claim", pid=pid)
    with pytest.raises(ConfigError) as info:
        claim(ckpt, "mine")
    assert str(info.value) == (
        f"checkpoint dir {ckpt} is claimed by run other (pid {pid} on host {HOST}, started "
        f"2026-01-02T03:04:05.000+00:00), which is no longer running: remove "
        f"{ckpt / 'checkpoint.claim'} if that run is gone"
    )
    assert (ckpt / "checkpoint.claim").exists(), "a stale claim is explained, never removed"
    (ckpt / "checkpoint.claim").unlink()  # what the message says to do
    claim(ckpt, "mine")


def test_reused_pid_is_not_the_claiming_run(tmp_path: Path) -> None:
    """The claim's pid is alive but started at another time: another process got the pid."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    start = claims.pid_start(os.getpid())
    assert start is not None
    write_claim(ckpt / "checkpoint.claim", pid=os.getpid(), pid_start=start - 1)
    with pytest.raises(ConfigError, match="which is no longer running: remove "):
        claim(ckpt, "mine")
    write_claim(ckpt / "checkpoint.claim", pid=os.getpid(), pid_start=start)
    with pytest.raises(ConfigError, match="is in use by run other"):
        claim(ckpt, "mine")


def test_claim_of_another_host_cannot_be_checked(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_claim(ckpt / "checkpoint.claim", host="elsewhere", pid=dead_pid())
    with pytest.raises(ConfigError, match="cannot be checked from this host: wait for it"):
        claim(ckpt, "mine")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "is empty"),
        ("\n", "is empty"),
        ("{", "holds no claim record"),
        ('{"run_id": "a", "run_d', "holds no claim record"),
        ("[]", "holds no claim record"),
        ('{"pid": "1"}', "holds no claim record"),
    ],
)
def test_unreadable_claim_counts_as_held_and_says_how_to_clear_it(
    tmp_path: Path, content: str, why: str
) -> None:
    """A run that died between creating its claim and writing it, or not ours: refused, never
    taken over, and the refusal says what to remove when no run uses the directory (the
    adversarial sweep of #22: an empty claim said only 'in use by another run ... wait')."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "checkpoint.claim").write_text(content)
    with pytest.raises(ConfigError) as info:
        claim(ckpt, "mine")
    said = str(info.value)
    assert f"holds a claim {ckpt / 'checkpoint.claim'} that {why}" in said
    assert f"if no run uses {ckpt}, remove {ckpt / 'checkpoint.claim'}" in said
    assert (ckpt / "checkpoint.claim").read_text() == content


def test_claim_never_follows_a_planted_link(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (ckpt / "checkpoint.claim").symlink_to(victim)
    with pytest.raises(ConfigError, match="that could not be opened"):
        claim(ckpt, "mine")
    assert victim.read_text() == "keep\n"


def test_release_removes_only_our_claim(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    path = claim(ckpt, "mine")
    claims.release(path)
    assert not path.exists()
    claims.release(path)  # twice: a no-op
    write_claim(path, pid=os.getpid() + 1)
    claims.release(path)  # not ours (never claimed by this process)
    claims.release_dir(ckpt)
    claims.release_all()
    assert path.exists(), "another run's claim was removed"


def test_claim_that_could_not_be_written_blocks_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()

    def full(fd: int, *args: Any, **kwargs: Any) -> Any:
        os.close(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdopen", full)
    with pytest.raises(ConfigError, match=r"cannot claim checkpoint dir .*No space left"):
        claim(ckpt, "mine")
    monkeypatch.undo()
    assert list(ckpt.iterdir()) == []
    claim(ckpt, "mine")


def test_nodes_of_one_run_share_it_another_run_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    claim(ckpt, "multi", nnodes=2, node_index=0)
    claim(ckpt, "multi", nnodes=2, node_index=1)
    with pytest.raises(ConfigError, match="in use by run multi"):
        claim(ckpt, "intruder", nnodes=2, node_index=0)
    with pytest.raises(ConfigError, match="in use by run multi"):
        claim(ckpt, "single")  # checkpoint.claim is free, but the dir is not
    with pytest.raises(ConfigError, match="in use by run multi"):
        # the same run ID in another work dir is another run
        claims.claim_checkpoint_dir(
            ckpt, run_id="multi", run_dir=tmp_path / "w2" / "multi", nnodes=3, node_index=2
        )
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "checkpoint.node0.claim",
        "checkpoint.node1.claim",
    ]


def test_checkpoint_dir_inside_another_runs_run_dir_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "work" / "runs" / "other"
    (other / "checkpoints" / "iter_0000005").mkdir(parents=True)
    (other / "run.claim").write_text("{}")
    for ckpt in (other / "checkpoints", other / "checkpoints" / "iter_0000005", other):
        with pytest.raises(ConfigError, match=f"is inside the run dir {other} of another run"):
            claim(ckpt, "mine")
    # the default: checkpoints/ inside the run's own run dir
    own = tmp_path / "work" / "runs" / "mine"
    (own / "checkpoints").mkdir(parents=True)
    (own / "run.claim").write_text("{}")
    claims.claim_checkpoint_dir(own / "checkpoints", run_id="mine", run_dir=own)


@pytest.mark.parametrize("name", ["run.node1.claim", "run.gpu-host-7.claim"])
def test_a_multinode_runs_run_dir_is_another_runs_too(tmp_path: Path, name: str) -> None:
    """A run on several nodes claims its run dir once per node, by index or by host: any of
    those claims makes the directory another run's (no run.json written yet)."""
    other = tmp_path / "work" / "runs" / "other"
    (other / "checkpoints").mkdir(parents=True)
    (other / name).write_text("{}")
    with pytest.raises(ConfigError, match=f"is inside the run dir {other} of another run"):
        claim(other / "checkpoints", "mine")


def test_refusals_name_the_setting_in_the_entry_points_spelling(tmp_path: Path) -> None:
    """The CLI is told of --checkpoint-dir; a pytest user, who has no such option (a scenario's
    checkpoints are under its run dir), of --nvrx-work-dir."""
    other = tmp_path / "work" / "runs" / "other"
    (other / "checkpoints").mkdir(parents=True)
    (other / "run.claim").write_text("{}")
    with pytest.raises(ConfigError) as refused:
        claim(other / "checkpoints", "mine")
    assert "pass another --checkpoint-dir (NVRX_CHECKPOINT_DIR)" in refused.value.message_for("cli")
    plugin = refused.value.message_for("plugin")
    assert "pass another --nvrx-work-dir (NVRX_WORK_DIR, ini nvrx_work_dir)" in plugin
    assert "checkpoint-dir" not in plugin


# --- the planned launch: refused before anything, released on every exit -------------------


def cfg(tmp_path: Path, run_id: str, ckpt: Path) -> RunConfig:
    return RunConfig(
        work_dir=tmp_path / "work", run_id=run_id, workload="reference", checkpoint_dir=ckpt
    )


def test_refused_run_writes_nothing(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    claim(ckpt, "first")
    args = ["run", "--workload", "reference", "--work-dir", str(tmp_path / "work"),
            "--run-id", "second", "--checkpoint-dir", str(ckpt)]  # fmt: skip
    for extra in ([], ["--dry-run"]):
        assert cli.main([*args, *extra], {}) == 2
        assert not (tmp_path / "work" / "runs" / "second").exists()
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint.claim"]


def test_plan_that_fails_after_the_claim_releases_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt"

    def missing() -> str:
        raise ConfigError("ft_launcher not found")

    monkeypatch.setattr(runs, "find_launcher", missing)
    with pytest.raises(ConfigError, match="not found"):
        runs.plan_launch(cfg(tmp_path, "one", ckpt))
    assert not (ckpt / "checkpoint.claim").exists()
    assert claims.held() == frozenset()


def test_lost_race_for_the_checkpoint_dir_gives_the_run_id_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused at the atomic claim (another run claimed between check and claim): the run dir's
    claim is given back, so the same run ID may start once the checkpoint dir is free."""
    ckpt = tmp_path / "ckpt"
    monkeypatch.setattr(run_claims, "check_checkpoint_dir", lambda *a, **k: None)
    ckpt.mkdir()
    claim(ckpt, "first")
    with pytest.raises(ConfigError, match="in use by run first"):
        runs.plan_launch(cfg(tmp_path, "second", ckpt))
    assert not (tmp_path / "work" / "runs" / "second" / "run.claim").exists()
    claims.release_all()
    runs.plan_launch(cfg(tmp_path, "second", ckpt), dry_run=True)


def test_the_claims_of_a_run_are_taken_and_given_back_as_one(tmp_path: Path) -> None:
    """launch/claims.py: claim takes the run dir and the checkpoint dir; check then refuses
    both a second run on that checkpoint dir and the same run ID; give_back frees both, release
    only the checkpoint dir (the run dir stays claimed: one run dir holds one run)."""
    ckpt = tmp_path / "ckpt"
    config = cfg(tmp_path, "one", ckpt)
    layout = run_claims.claim(config)
    assert (layout.run_dir / "run.claim").is_file() and (ckpt / "checkpoint.claim").is_file()
    with pytest.raises(ConfigError, match="in use by run one"):
        run_claims.check(cfg(tmp_path, "two", ckpt))
    with pytest.raises(ConfigError, match="already claimed"):
        run_claims.check(config)
    run_claims.give_back(config)
    assert not (layout.run_dir / "run.claim").exists() and claims.held() == frozenset()
    run_claims.check(config)  # the run ID and the checkpoint dir are free again
    run_claims.claim(config)
    run_claims.release(layout)
    assert not (ckpt / "checkpoint.claim").exists()
    assert (layout.run_dir / "run.claim").is_file()
    run_claims.check(cfg(tmp_path, "two", ckpt))


def test_a_claim_interrupted_after_the_run_dir_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anything raised between the two claims (here Ctrl-C) leaves the run ID free."""

    def interrupted(*_a: Any, **_k: Any) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(run_claims, "claim_checkpoint_dir", interrupted)
    config = cfg(tmp_path, "one", tmp_path / "ckpt")
    with pytest.raises(KeyboardInterrupt):
        run_claims.claim(config)
    assert not (config.layout.run_dir / "run.claim").exists()


def test_launch_holds_the_claim_until_the_tree_is_stopped(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    planned = runs.plan_launch(cfg(tmp_path, "held", ckpt))
    recipe = planned.recipe
    stand_in = (sys.executable, "-c", "import time; time.sleep(0.3)")
    planned = type(planned)(**{**planned.__dict__, "recipe": type(recipe)(
        **{**recipe.__dict__, "launcher_argv": stand_in, "workload_argv": ()})})  # fmt: skip
    seen: list[bool] = []
    outcome = runs.launch_run(
        planned, 30, on_start=lambda _l: seen.append((ckpt / "checkpoint.claim").exists())
    )
    assert outcome.result is not None and outcome.result.exit_code == 0
    assert seen == [True] and not (ckpt / "checkpoint.claim").exists()


def test_a_dry_run_claims_nothing(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    runs.plan_launch(cfg(tmp_path, "dry", ckpt), dry_run=True)
    assert not ckpt.exists()  # a dry run writes nothing at all (#23 item 6)
    ckpt.mkdir()
    claim(ckpt, "real")


# --- the claim is no evidence -----------------------------------------------------------------


def test_evidence_and_retention_ignore_the_claim(tmp_path: Path) -> None:
    run_dir = tmp_path / "ref-kill-save"
    shutil.copytree(DATA / "windows" / "cpu" / "ref-kill-save", run_dir)
    before = judge_run_dir(run_dir)
    write_claim(run_dir / "checkpoints" / "checkpoint.claim", pid=dead_pid())
    after = judge_run_dir(run_dir)
    assert [(v.id, v.status, v.reason) for v in after.verdicts] == [
        (v.id, v.status, v.reason) for v in before.verdicts
    ]
    assert after.judgeable and after.passed
    prune_checkpoint_payload(RunLayout.for_run(run_dir), tmp_path)
    assert (run_dir / "checkpoints" / "checkpoint.claim").exists()


# --- two real runs, one checkpoint dir ------------------------------------------------------


def run_argv(work: Path, run_id: str, ckpt: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest_nvrx", "run", "--workload", "reference",
        "--work-dir", str(work), "--run-id", run_id, "--checkpoint-dir", str(ckpt),
        "--fault", "kill", "--window", "save", "--train-iters", "10", "--save-interval", "2",
        "--section-timeouts", "setup:120,step:10,checkpointing:30",
        "--workload-check-interval", "1", "--timeout", "200", *extra,
    ]  # fmt: skip


@pytest.mark.real_run
@pytest.mark.timeout(300)
def test_second_run_on_a_busy_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    """A trains with ``--checkpoint-dir D``; B with the same D exits 2 with one line naming A,
    before it makes its run dir or starts a launcher; A recovers and verify passes; once A has
    ended D is no longer claimed (a dry run of C with D is refused for A's checkpoints alone)."""
    work, ckpt = tmp_path / "work", tmp_path / "ckpt"
    a_dir, b_dir = work / "runs" / "a", work / "runs" / "b"
    mark_a, mark_b = new_mark(), new_mark()
    out_a = tmp_path / "a.out"
    started = time.monotonic()
    try:
        with out_a.open("wb") as fh:
            a = subprocess.Popen(
                run_argv(work, "a", ckpt), stdout=fh, stderr=subprocess.STDOUT,
                env=marked_env(mark_a),
            )  # fmt: skip
        deadline = time.monotonic() + 120
        while not (a_dir / "logs" / "train_cycle0.log").is_file() and a.poll() is None:
            assert time.monotonic() < deadline, out_a.read_text(errors="replace")
            time.sleep(0.2)
        assert a.poll() is None, out_a.read_text(errors="replace")
        assert (ckpt / "checkpoint.claim").is_file()

        b = subprocess.run(
            run_argv(work, "b", ckpt), capture_output=True, text=True, timeout=60,
            env=marked_env(mark_b),
        )  # fmt: skip
        assert b.returncode == 2, b.stdout + b.stderr
        assert b.stdout == "", b.stdout  # not even "Run artifacts: ..."
        lines = b.stderr.splitlines()
        assert len(lines) == 1, b.stderr
        assert lines[0].startswith(
            f"pytest-nvrx run: error: checkpoint dir {ckpt} is in use by run a (pid {a.pid} on "
            f"host {HOST}, started "
        ), lines[0]
        assert not b_dir.exists(), sorted(str(p) for p in b_dir.rglob("*"))
        assert marked(mark_b) == {}, "B left a process"

        assert a.wait(timeout=200) == 0, out_a.read_text(errors="replace")
        a_wall = time.monotonic() - started
        assert wait_none_marked(mark_a, timeout=10.0) == {}
    finally:
        kill_marked(mark_a)
        kill_marked(mark_b)
    assert not (ckpt / "checkpoint.claim").exists(), "A's claim outlived A"
    verify = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "verify", str(a_dir), "--checkpoint-dir", str(ckpt)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # C on D after A: not refused for A's claim, but for A's checkpoints (issue #36)
    c = subprocess.run(
        run_argv(work, "c", ckpt, "--dry-run"), capture_output=True, text=True, timeout=60
    )
    assert c.returncode == 2, c.stdout + c.stderr
    assert "is in use" not in c.stderr and "holds another run's checkpoints" in c.stderr
    print(f"run A took {a_wall:.1f} s")


@pytest.mark.parametrize("pid", [(1 << 22) + 1, 1 << 31, 1 << 40, 1 << 63])
def test_a_claim_naming_an_impossible_pid_is_no_claim_record(tmp_path: Path, pid: int) -> None:
    """os.kill overflowed on it: an OverflowError traceback (the sweep of #22)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_claim(ckpt / "checkpoint.claim", pid=pid)
    with pytest.raises(ConfigError, match="that holds no claim record: if no run uses"):
        claim(ckpt, "mine")


@pytest.mark.parametrize("inside", ["sub", "iter_0000005", "iter_0000005/deeper"])
def test_a_checkpoint_dir_inside_or_around_a_claimed_one_is_refused(
    tmp_path: Path, inside: str
) -> None:
    """Two runs would write into one tree of checkpoints: a dir below another run's claimed
    checkpoint dir, or one that holds it (the sweep of #22 found both accepted)."""
    outer = tmp_path / "ckpt"
    (outer / inside).mkdir(parents=True)
    write_claim(
        outer / "checkpoint.claim", pid=os.getpid(), pid_start=claims.pid_start(os.getpid())
    )
    with pytest.raises(ConfigError, match=f"is inside checkpoint dir {outer}: .*is in use by run"):
        claim(outer / inside, "mine")
    assert not (outer / inside / "checkpoint.claim").exists()
    # the other way round: the claimed dir is below the one asked for
    other = tmp_path / "around"
    (other / inside).mkdir(parents=True)
    write_claim(
        other / inside / "checkpoint.claim",
        pid=os.getpid(),
        pid_start=claims.pid_start(os.getpid()),
    )
    with pytest.raises(ConfigError, match=f"holds checkpoint dir {other / inside}: .*is in use"):
        claim(other, "mine")
    # a sibling is free
    free = tmp_path / "free"
    free.mkdir()
    claims.release(claim(free, "mine"))


def test_a_dry_run_refuses_a_claimed_run_dir_as_a_real_run_does(tmp_path: Path) -> None:
    """The adversarial review of #23: the dry run printed its command for a run ID whose run
    dir another launch had claimed; the real run refuses it."""
    config = cfg(tmp_path, "live", tmp_path / "ckpt")
    config.layout.run_dir.mkdir(parents=True)
    (config.layout.run_dir / "run.claim").write_text('{"pid": 1}')
    for dry in (True, False):
        with pytest.raises(ConfigError, match="is already claimed by"):
            runs.plan_launch(config, dry_run=dry)
