"""A run directory someone sent you is untrusted: judging it reads it safely and boundedly.

Each case doctors a copy of a real run (tests/data) the way issue #9 found it misjudged, hung or
blew up, and runs the real CLI in a subprocess under a wall-clock timeout and a 2 GiB address
space limit, so that a regression hangs or fails here instead of taking the machine with it:

* special files where a file is expected (FIFO, device, directory, socket) are never opened for
  reading and make the run "cannot judge" (exit 2), naming the path and what it is;
* a symlink leaving the run directory is reported as such, its target never quoted whole;
* every read is capped; no message quotes more than 80 characters of a file;
* a crafted ``.metadata`` pickle executes nothing (item 1).
"""

from __future__ import annotations

import os
import pickle
import pickletools
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.doctor import Doctor, copy_run
from tests.helpers.recipe_runs import whole

DATA = Path(__file__).parents[1] / "data"
REFERENCE_KILL = DATA / "cpu" / "reference-kill"
MEGATRON_KILL = DATA / "gpu-recipe" / "megatron-kill-40"
TRACKER = "checkpoints/latest_checkpointed_iteration.txt"
PASSWD = Path("/etc/passwd")
MEMORY_LIMIT = 2 << 30
# issue #9 item 5: no message quotes more of a file than this
EXCERPT_CHARS = 80
TIMEOUT_S = 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli(*argv: str | Path, limit_memory: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m pytest_nvrx ARGV``; a hang raises TimeoutExpired (the child is killed)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", *map(str, argv)],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=TIMEOUT_S,
        preexec_fn=_limit_memory if limit_memory else None,
        cwd=Path(__file__).parents[2],
        check=False,
    )


def _socket_at(path: Path) -> None:
    # AF_UNIX paths are limited to 108 bytes: bind by a relative name from the parent.
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path.name)
        sock.close()
    finally:
        os.chdir(here)


def replace_with(path: Path, kind: str) -> None:
    """Put a ``kind`` where ``path`` is: fifo, dir, file, socket, sparse:<bytes>, or a link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "file":
        path.write_text("not a directory\n")
    elif kind == "socket":
        _socket_at(path)
    elif kind.startswith("sparse:"):
        with path.open("wb") as f:  # a hole: no disk used, every byte reads as NUL
            f.truncate(int(kind.split(":", 1)[1]))
    else:
        path.symlink_to(kind)


# (what to replace, by what, a phrase the "cannot judge" message must hold)
SPECIAL_CASES = [
    # issue #9: "a FIFO at the marker path hangs verify forever"
    ("fault_injected.json", "fifo", "fault_injected.json is a FIFO"),
    # issue #9: "a marker linked to /dev/zero → MemoryError at 7.4 GB"
    ("fault_injected.json", "/dev/zero", "fault_injected.json is a symlink leaving run/ (to"),
    ("fault_injected.json", "dir", "fault_injected.json is a directory"),
    ("fault_injected.json", "socket", "fault_injected.json is a socket"),
    ("fault_injected.json", str(PASSWD), "json is a symlink leaving run/ (to '/etc/passwd')"),
    ("run.json", "fifo", "run.json is a FIFO"),
    ("run.json", "/dev/zero", "run.json is a symlink leaving run/ (to '/dev/zero')"),
    ("result.json", "fifo", "result.json is a FIFO"),
    ("result.json", "dir", "result.json is a directory"),
    # issue #9: "tracker a folder / FIFO / link to /etc/passwd" (all judged PASS)
    (TRACKER, "fifo", "latest_checkpointed_iteration.txt is a FIFO"),
    (TRACKER, "dir", "latest_checkpointed_iteration.txt is a directory"),
    (TRACKER, str(PASSWD), "iteration.txt is a symlink leaving checkpoints/ (to '/etc/passwd')"),
    (TRACKER, "/dev/zero", "iteration.txt is a symlink leaving checkpoints/ (to '/dev/zero')"),
    (TRACKER, "sparse:200000000", "latest_checkpointed_iteration.txt is 200000000 bytes"),
    # issue #9: "checkpoint dir a file" (judged PASS)
    ("checkpoints", "file", "checkpoints is a regular file, not a directory"),
    ("cycle_infos", "file", "cycle_infos is a regular file, not a directory"),
    ("cycle_infos/cycle_info..0.1", "fifo", "cycle_infos/cycle_info..0.1 is a FIFO"),
    ("logs", "file", "logs is a regular file, not a directory"),
    ("logs/launcher.log", "fifo", "logs/launcher.log is a FIFO"),
    ("logs/launcher.log", str(PASSWD), "logs/launcher.log is a symlink leaving run/ (to"),
    ("logs/train_cycle0.log", "/dev/zero", "logs/train_cycle0.log is a symlink leaving run/"),
    ("logs/train_cycle1.log", "fifo", "logs/train_cycle1.log is a FIFO"),
    ("logs/train_cycle1.log", "dir", "logs/train_cycle1.log is a directory"),
]


@pytest.mark.parametrize(
    ("rel", "kind", "says"), SPECIAL_CASES, ids=[f"{r}={k}" for r, k, _ in SPECIAL_CASES]
)
def test_special_file_cannot_be_judged(tmp_path: Path, rel: str, kind: str, says: str) -> None:
    run = copy_run(REFERENCE_KILL, tmp_path / "run")
    assert run.path(rel).exists(), rel
    replace_with(run.path(rel), kind)
    done = cli("verify", run.root)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "verify: CANNOT JUDGE" in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("verify: error:")]
    assert any(says in line for line in errors), done.stderr
    assert "Traceback" not in done.stderr
    # a refused file is never read: nothing of what a link points at is echoed
    first_account = PASSWD.read_text(errors="replace").split(":", 1)[0] + ":x:"
    assert first_account not in done.stdout + done.stderr
    assert "\\x00" * 20 not in done.stdout + done.stderr


def test_symlink_inside_the_run_dir_is_still_evidence(tmp_path: Path) -> None:
    """A link that stays in the run dir is followed (only links leaving it are refused)."""
    run = copy_run(REFERENCE_KILL, tmp_path / "run")
    run.path("fault_injected.json").rename(run.path("marker-copy.json"))
    run.path("fault_injected.json").symlink_to("marker-copy.json")
    done = cli("verify", run.root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify: PASSED (6 of 6)" in done.stdout


# ---- item 1: a malicious checkpoint metadata pickle executes nothing -------------------------


class _Touch:
    """Unpickling this runs ``touch <target>`` (a stand-in for any command)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.target}",))


def malicious_metadata(real: bytes, target: Path) -> bytes:
    """A pickle that runs a command and then yields the real metadata (verdicts unchanged)."""
    evil = pickletools.optimize(pickle.dumps(_Touch(target), protocol=2))
    assert evil.endswith(b".") and b"system" in evil
    return evil[:-1] + pickle.POP + real


def test_malicious_metadata_executes_nothing(tmp_path: Path) -> None:
    # a whole run: with the result.json the device packer dropped (tests/helpers/recipe_runs.py)
    run = Doctor(whole(MEGATRON_KILL, tmp_path))
    meta = run.path("checkpoints/iter_0000005/.metadata")
    proof = tmp_path / "code-ran"
    meta.write_bytes(malicious_metadata(meta.read_bytes(), proof))
    done = cli("verify", run.root, limit_memory=False)  # torch may be imported: no AS limit
    assert not proof.exists(), "unpickling the run's .metadata executed a command"
    # verify still judged: every criterion has a verdict; the doctored metadata is named
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL optimizer_state_load:" in done.stdout
    assert "refused global 'posix.system'" in done.stdout
    assert sum(line.startswith(("PASS ", "FAIL ")) for line in done.stdout.splitlines()) == 6


# ---- run --dry-run reads the tracker of the user's checkpoint dir ----------------------------


@pytest.fixture
def dry_run_dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    work, ckpt = tmp_path / "work", tmp_path / "ckpt"
    ckpt.mkdir()
    yield work, ckpt


def dry_run(work: Path, ckpt: Path) -> subprocess.CompletedProcess[str]:
    return cli(
        "run",
        "--dry-run",
        "--workload",
        "reference",
        "--work-dir",
        work,
        "--run-id",
        "untrusted",
        "--checkpoint-dir",
        ckpt,
    )


TRACKER_CASES = [
    # issue #9: "a FIFO tracker hangs run --dry-run (settings.py:366)"
    ("fifo", "is a FIFO, not a regular file"),
    # issue #9: "a 200 MB tracker takes 2.7 GB and is echoed into an 839 MB error message"
    ("sparse:200000000", "is 200000000 bytes"),
    # issue #9: "a tracker linked to /etc/passwd is printed whole"
    (str(PASSWD), "does not hold an integer"),
    ("/dev/zero", "is a character device, not a regular file"),
    ("dir", "is a directory, not a regular file"),
]


@pytest.mark.parametrize(("kind", "says"), TRACKER_CASES, ids=[k for k, _ in TRACKER_CASES])
def test_dry_run_refuses_unsafe_tracker(
    dry_run_dirs: tuple[Path, Path], kind: str, says: str
) -> None:
    work, ckpt = dry_run_dirs
    replace_with(ckpt / "latest_checkpointed_iteration.txt", kind)
    done = dry_run(work, ckpt)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    # the message names the tracker and quotes at most EXCERPT_CHARS of it
    assert len(done.stderr) < len(str(ckpt)) + 300, done.stderr[:1000]
    if kind == str(PASSWD):
        _, sep, quoted = done.stderr.strip().partition("does not hold an integer: ")
        assert sep and quoted.startswith("'root:"), done.stderr
        assert len(quoted) <= EXCERPT_CHARS + len(" (4096 characters)"), quoted


def test_dry_run_reads_a_good_tracker_as_another_run_s_checkpoints(
    dry_run_dirs: tuple[Path, Path],
) -> None:
    """A tracker that reads well names checkpoints another run left: refused (issue #36)."""
    work, ckpt = dry_run_dirs
    (ckpt / "latest_checkpointed_iteration.txt").write_text("15\n")
    done = dry_run(work, ckpt)
    assert done.returncode == 2, done.stderr
    assert "holds another run's checkpoints (its tracker" in done.stderr


# ---- the primitives -------------------------------------------------------------------------


def test_quote_is_bounded() -> None:
    from pytest_nvrx.settings.values import QUOTE_MAX, quote

    assert QUOTE_MAX == EXCERPT_CHARS
    assert quote("abc") == "'abc'"
    long = quote("x" * 10_000)
    assert len(long) <= QUOTE_MAX + len(" (10000 characters)") and long.startswith("'xxx")


@pytest.mark.parametrize("kind", ["fifo", "dir", "socket", "/dev/zero", "/dev/null"])
def test_open_regular_refuses_without_blocking(kind: str) -> None:
    from pytest_nvrx.evidence.refs import file_refusal, open_regular

    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # AF_UNIX needs a short path
        path = Path(short) / "f"
        path.write_text("")
        replace_with(path, kind)
        why = file_refusal(path)
        assert why is not None and "not a regular file" in why
        with pytest.raises(OSError, match="not a regular file"):
            open_regular(path)


def test_open_regular_refuses_a_link_leaving_its_root(tmp_path: Path) -> None:
    from pytest_nvrx.evidence.refs import file_refusal, open_regular

    (tmp_path / "inside").write_text("ok")
    (tmp_path / "link-in").symlink_to("inside")
    (tmp_path / "link-out").symlink_to(PASSWD)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with open_regular(tmp_path / "link-in", root=tmp_path) as f:
        assert f.read() == b"ok"
    with pytest.raises(OSError, match="symlink leaving"):
        open_regular(tmp_path / "link-out", root=tmp_path)
    with pytest.raises(OSError, match="symlink to nothing"):
        open_regular(tmp_path / "dangling", root=tmp_path)
    assert file_refusal(tmp_path / "absent") is None


def test_cycle_log_swapped_for_a_fifo_after_the_check_does_not_block(tmp_path: Path) -> None:
    """The race between parse_cycle_log's is_file() and its open: the open itself refuses."""
    fifo = tmp_path / "train_cycle0.log"
    os.mkfifo(fifo)
    code = (
        "import pathlib, sys\n"
        "pathlib.Path.is_file = lambda self: True  # the path was a file when checked\n"
        "from pytest_nvrx.evidence.cycle_log import parse_cycle_log\n"
        "from pytest_nvrx.evidence.megatron import MEGATRON\n"
        "print(parse_cycle_log(pathlib.Path(sys.argv[1]), 0, MEGATRON).read_error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(fifo)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "is a FIFO, not a regular file" in done.stdout
