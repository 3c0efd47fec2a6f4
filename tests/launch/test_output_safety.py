"""Outputs never land in evidence; a full disk is an ordinary error (issue #22 items 1 and 2).

``report -o``, ``report --json``, ``verify --json``, ``--nvrx-report`` (and its report.json) and
``--junitxml`` are refused when they resolve (links followed) into a run dir being judged or onto
each other. Every file we write goes through a temp file and a rename: a failed write leaves the
old file whole and no temp file. ENOSPC/EDQUOT: exit 2 before a launch, one line, no traceback,
and a claim that could not be written does not block the run ID.

The full-disk cases run twice: simulated in-process (os.write / os.fdopen raise ENOSPC), and on
a real 64 KiB tmpfs where mounting one works (root), skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.launch import recipe as recipes
from pytest_nvrx.launch.launcher import Launch
from pytest_nvrx.launch.recipe import Recipe
from pytest_nvrx.launch.run_dir_setup import prepare_run_dir
from pytest_nvrx.outputs import reserve_of, write_atomic
from pytest_nvrx.report import report_main
from pytest_nvrx.settings import ConfigError, RunConfig
from pytest_nvrx.verify import verify_main

pytest_plugins = ["pytester"]

DATA = Path(__file__).parents[1] / "data"
KILL = DATA / "cpu" / "reference-kill"
SUITE_ARGS = ["--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "reference-kill"
    shutil.copytree(KILL, run)
    return run


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def strays(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".tmp"))


def cli(main: Any, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out, err)
    return code, out.getvalue(), err.getvalue()


def one_line(text: str) -> str:
    assert text.count("\n") == 1 and "Traceback" not in text, text
    return text


# -- item 1: outputs never land in evidence ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "target"),
    [
        (["-o", "{run}/run.json"], "run.json"),
        (["--json", "{run}/fault_injected.json"], "fault_injected.json"),
        (["-o", "{run}/logs/new.html"], None),
        (["-o", "{run}/checkpoints/report.html"], None),
        (["-o", "{run}/report.html"], None),  # report.json beside it: in the run dir too
        (["-o", "{tmp}/out.html", "--json", "{run}/result.json"], "result.json"),
    ],
)
def test_report_output_in_the_run_dir_is_refused(
    run_dir: Path, tmp_path: Path, args: list[str], target: str | None
) -> None:
    before = snapshot(run_dir)
    argv = [a.format(run=run_dir, tmp=tmp_path) for a in args]
    if "-o" not in argv:
        argv += ["-o", str(tmp_path / "out.html")]
    code, out, err = cli(report_main, str(run_dir), *argv)
    assert code == 2, out + err
    assert "write it outside that directory" in one_line(err) and str(run_dir) in err
    assert snapshot(run_dir) == before, f"{target or 'a file'} in the run dir was written"
    assert not (tmp_path / "out.html").exists()


def test_report_output_through_a_link_into_the_run_dir_is_refused(
    run_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "innocent.html").symlink_to(run_dir / "run.json")
    (tmp_path / "outdir").symlink_to(run_dir / "logs")
    before = snapshot(run_dir)
    for out_path in (tmp_path / "innocent.html", tmp_path / "outdir" / "r.html"):
        code, _, err = cli(report_main, str(run_dir), "-o", str(out_path),
                           "--json", str(tmp_path / "r.json"))  # fmt: skip
        assert code == 2 and "resolves into" in one_line(err), err
    assert snapshot(run_dir) == before


@contextlib.contextmanager
def mounted(at: Path, *mount_args: str) -> Iterator[Path]:
    """``mount MOUNT_ARGS AT`` (a new directory), unmounted on exit; skips where mounting is
    not allowed (no root)."""
    at.mkdir()
    done = subprocess.run(
        ["mount", *mount_args, str(at)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount here ({' '.join(mount_args)}): {done.stderr.strip()}")
    try:
        yield at
    finally:
        subprocess.run(["umount", "-l", str(at)], check=False)


@pytest.fixture
def bind_of_run(run_dir: Path, tmp_path: Path) -> Iterator[Path]:
    """The run dir mounted a second time (``mount --bind``): the same directory by another
    path, which no realpath leads back to."""
    with mounted(tmp_path / "bind", "--bind", str(run_dir)) as bind:
        yield bind


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "{run}", "--json", "{bind}/run.json"],
        ["report", "{run}", "-o", "{bind}/run.json", "--json", "{tmp}/r.json"],
        ["report", "{run}", "-o", "{tmp}/r.html", "--json", "{bind}/logs/new.json"],
    ],
    ids=["verify-json", "report-o", "report-json"],
)
def test_an_output_into_a_bind_mount_of_the_run_dir_is_refused(
    run_dir: Path, bind_of_run: Path, tmp_path: Path, argv: list[str]
) -> None:
    """By directory identity, not by name (the adversarial sweep of #22: verify exited 0 and
    run.json became the verdict JSON)."""
    before = snapshot(run_dir)
    main = verify_main if argv[0] == "verify" else report_main
    args = [a.format(run=run_dir, bind=bind_of_run, tmp=tmp_path) for a in argv[1:]]
    code, _, err = cli(main, *args)
    assert code == 2 and "it would overwrite the evidence" in one_line(err), err
    assert snapshot(run_dir) == before


@pytest.mark.parametrize(
    "args",
    [
        ["-o", "{tmp}/same", "--json", "{tmp}/same"],
        ["-o", "{tmp}/report.json"],  # the default report.json beside it is the page itself
        ["-o", "{tmp}/a.html", "--json", "{tmp}/link"],  # link -> a.html
    ],
)
def test_report_outputs_onto_each_other_are_refused(
    run_dir: Path, tmp_path: Path, args: list[str]
) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "a.html")
    code, _, err = cli(report_main, str(run_dir), *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and "give them different paths" in one_line(err), err
    assert not (tmp_path / "same").exists() and not (tmp_path / "a.html").exists()
    assert not (tmp_path / "report.json").exists()


@pytest.mark.parametrize(
    "inside", ["logs/launcher.log", "run.json", "fault_injected.json", "new.json", "checkpoints/x"]
)
def test_verify_json_in_the_run_dir_is_refused(run_dir: Path, inside: str) -> None:
    before = snapshot(run_dir)
    code, out, err = cli(verify_main, str(run_dir), "--json", str(run_dir / inside))
    assert code == 2 and "write it outside that directory" in one_line(err), out + err
    assert out == "", "judged although the output is refused"
    assert snapshot(run_dir) == before


def test_verify_json_in_the_checkpoint_or_baseline_dir_is_refused(
    run_dir: Path, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run_dir / "checkpoints", ckpt)
    base = tmp_path / "base"
    shutil.copytree(DATA / "cpu" / "reference-baseline", base)
    link = tmp_path / "link.json"
    link.symlink_to(base / "run.json")
    for args in (
        ["--checkpoint-dir", str(ckpt), "--json", str(ckpt / "latest_checkpointed_iteration.txt")],
        ["--baseline", str(base), "--json", str(link)],
    ):
        before = snapshot(tmp_path)
        code, _, err = cli(verify_main, str(run_dir), *args)
        assert code == 2 and "verify: error:" in one_line(err), err
        assert snapshot(tmp_path) == before


def test_verify_json_outside_still_written(run_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "verdicts.json"
    code, _, err = cli(verify_main, str(run_dir), "--json", str(target))
    assert code == 0, err
    assert json.loads(target.read_text())["exit_status"] == 0
    assert strays(tmp_path) == []


def test_outputs_make_their_missing_parents_as_junitxml_does(run_dir: Path, tmp_path: Path) -> None:
    """``report -o`` and ``verify --json`` create missing parent directories like the plugin's
    ``--nvrx-report`` and pytest's ``--junitxml`` (``report -o`` refused them: the sweep of
    #22); a new directory inside the run dir is still refused and never made."""
    html = tmp_path / "out" / "deeper" / "report.html"
    code, _, err = cli(report_main, str(run_dir), "-o", str(html))
    assert code == 0, err
    assert html.is_file() and (html.parent / "report.json").is_file()
    verdicts = tmp_path / "v" / "w" / "verdicts.json"
    code, _, err = cli(verify_main, str(run_dir), "--json", str(verdicts))
    assert code == 0 and json.loads(verdicts.read_text())["exit_status"] == 0, err
    before = snapshot(run_dir)
    for main, flag in ((report_main, "-o"), (verify_main, "--json")):
        code, _, err = cli(main, str(run_dir), flag, str(run_dir / "new" / "out.html"))
        assert code == 2 and not (run_dir / "new").exists(), err
    assert snapshot(run_dir) == before


def test_plugin_report_into_the_run_dir_or_onto_itself_is_a_usage_error(
    pytester: pytest.Pytester, run_dir: Path, tmp_path: Path
) -> None:
    before = snapshot(run_dir)
    cases = [
        (["--nvrx-report", str(run_dir / "run.json")], "inside --nvrx-run-dir"),
        (["--nvrx-report", str(run_dir / "logs" / "r.html")], "inside --nvrx-run-dir"),
        (["--nvrx-report", str(tmp_path / "out" / "report.json")], "give them different paths"),
        ([f"--junitxml={run_dir / 'logs' / 'launcher.log'}"], "inside --nvrx-run-dir"),
        (
            # r.html's JSON is r.json (named after the page)
            ["--nvrx-report", str(tmp_path / "r.html"), f"--junitxml={tmp_path / 'r.json'}"],
            "give them different paths",
        ),
    ]
    for args, why in cases:
        result = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(run_dir), *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (args, result.stdout.str())
        result.stderr.fnmatch_lines([f"*pytest-nvrx: *{why}*"])
    assert snapshot(run_dir) == before


def test_pytests_cache_dir_is_never_in_the_run_dir(run_dir: Path, tmp_path: Path) -> None:
    """pytest's cache is an output: a cache_dir inside the judged run dir is refused naming
    both fixes (from inside the run dir, pytest is refused altogether: the test below)."""
    before = snapshot(run_dir)
    base = [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "-q"]
    base += ["--nvrx-run-dir", str(run_dir), "-p", "no:randomly", "-p", "no:xdist"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)

    def pytest_beside(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )

    refused = pytest_beside("-o", f"cache_dir={run_dir / '.pytest_cache'}")
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout + refused.stderr
    assert "pytest's cache dir" in refused.stderr and "-p no:cacheprovider" in refused.stderr
    for extra in (["-p", "no:cacheprovider"], ["-o", f"cache_dir={tmp_path / 'cache'}"]):
        judged = pytest_beside(*extra)
        assert judged.returncode == 0, judged.stdout + judged.stderr
    assert (tmp_path / "cache").is_dir()
    assert snapshot(run_dir) == before and not (run_dir / ".pytest_cache").exists()


def test_plugin_report_into_the_work_dirs_runs_is_a_usage_error(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    result = pytester.runpytest(
        *SUITE_ARGS, "--collect-only", "--nvrx-work-dir", str(work),
        "--nvrx-report", str(work / "runs" / "some-run" / "run.json"),
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*pytest-nvrx: --nvrx-report * the scenarios' run dirs *"])


# -- atomic writes: whole or not at all ----------------------------------------------------


@contextlib.contextmanager
def disk_full_under(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """os.write raises ENOSPC for files under ``folder`` (other fds write as usual)."""
    real_write = os.write
    root = str(folder.resolve())

    def write(fd: int, data: Any) -> int:
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = ""
        if where.startswith(root):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    with monkeypatch.context() as m:
        m.setattr(os, "write", write)
        yield


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_write_atomic_failure_keeps_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    target = tmp_path / "result.json"
    target.write_text("old\n")

    def fail(fd: int, data: Any) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", fail)
    with pytest.raises(OSError) as info:
        write_atomic(target, "new\n" * 1000)
    monkeypatch.undo()
    assert info.value.errno == code and info.value.filename == str(target)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_write_atomic_uses_the_reserve_when_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "result.json"
    recipes_reserve = reserve_of(target)
    from pytest_nvrx.outputs import reserve_space

    reserve_space(target, 4096)
    assert recipes_reserve.stat().st_size == 4096
    real_write = os.write
    calls: list[int] = []

    def full_until_freed(fd: int, data: Any) -> int:
        calls.append(fd)
        if recipes_reserve.exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_until_freed)
    write_atomic(target, '{"exit_code": 0}\n')
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"exit_code": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_report_on_a_full_disk_keeps_the_old_report(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("<old page>")
    (out / "report.json").write_text("{}")
    with disk_full_under(out, monkeypatch):
        code, _, err = cli(report_main, str(run_dir), "-o", str(out / "report.html"))
    assert code == 2 and "No space left on device" in one_line(err), err
    assert (out / "report.html").read_text() == "<old page>"
    assert (out / "report.json").read_text() == "{}"
    assert strays(out) == []


def test_verify_json_on_a_full_disk_keeps_the_old_file(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "v.json").write_text('{"old": true}')
    with disk_full_under(out, monkeypatch):
        code, _, err = cli(verify_main, str(run_dir), "--json", str(out / "v.json"))
    assert code == 2 and "cannot write --json" in err and "No space left" in err, err
    assert err.count("verify: error:") == 1 and "Traceback" not in err
    assert (out / "v.json").read_text() == '{"old": true}'
    assert strays(out) == []


# -- item 2: a full disk before and during a run -------------------------------------------


def config(work: Path, run_id: str = "full") -> RunConfig:
    return RunConfig(work_dir=work, run_id=run_id, workload="reference")


def test_claim_write_failure_claims_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that could not be written (ENOSPC at its first write) is an exit-2 error and
    leaves no claim: once there is room the same run ID starts."""
    real_fdopen = os.fdopen

    class FullFile(io.RawIOBase):
        def __init__(self, fd: int) -> None:
            self.fd = fd

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self) -> None:
            if not self.closed:
                os.close(self.fd)
            super().close()

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        raw = FullFile(fd)
        return io.TextIOWrapper(io.BufferedWriter(raw)) if "b" not in mode else raw

    cfg = config(tmp_path)
    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(ConfigError, match="No space left on device"):
        prepare_run_dir(cfg)
    monkeypatch.setattr(os, "fdopen", real_fdopen)
    assert list(cfg.run_dir.glob("*.claim")) == [], "an unwritten claim was left behind"
    prepare_run_dir(cfg)  # the run ID is free
    assert json.loads((cfg.run_dir / "run.claim").read_text())["pid"] == os.getpid()


def test_no_room_for_result_json_refuses_before_launch_and_frees_the_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path)
    real_write = os.write

    def full(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".reserve"):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(ConfigError, match="no space left for run dir") as info:
        prepare_run_dir(cfg)
    monkeypatch.undo()
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in cfg.run_dir.iterdir() if p.is_file()) == []
    prepare_run_dir(cfg)
    assert reserve_of(cfg.run_dir / "result.json").is_file()


FILL_DISK = """
import os, sys
fd = os.open(os.path.join(sys.argv[1], "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"x" * 1024)
except OSError:
    pass
"""


def launch_filling(cfg: RunConfig) -> tuple[Recipe, Any]:
    layout = prepare_run_dir(cfg)
    recipe = Recipe(
        config=cfg,
        layout=layout,
        launcher_argv=(sys.executable, "-c", FILL_DISK, str(layout.checkpoint_dir)),
        workload_argv=(),
        env={"TMPDIR": str(layout.tmp)},
        log_server_port=0,
        profile="default",
    )
    with Launch(recipe) as launch:
        result = launch.wait(60, poll_s=0.05)
    return recipe, result


def test_result_json_written_after_a_run_filled_the_disk_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher filled the disk: result.json is still written (from the reserved space)."""
    cfg = config(tmp_path)
    layout = prepare_run_dir(cfg)
    reserve = reserve_of(layout.run_dir / "result.json")
    real_write = os.write

    def full_until_freed(fd: int, data: Any) -> int:
        if reserve.exists() and "result.json" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_until_freed)
    recipes.write_json_atomic(layout.run_dir / "result.json", {"exit_code": 0})
    monkeypatch.undo()
    assert json.loads((layout.run_dir / "result.json").read_text()) == {"exit_code": 0}
    assert strays(layout.run_dir) == [] and not reserve.exists()


# -- the same on a real full filesystem (a 64 KiB tmpfs; needs mount rights) ----------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    with mounted(tmp_path / "tiny", "-t", "tmpfs", "-o", "size=64k", "tmpfs") as mnt:
        yield mnt


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the filesystem of ``folder``, then free ``leave`` bytes (whole pages)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with contextlib.suppress(OSError):
        while True:
            os.write(fd, b"x" * 1024)
    os.close(fd)
    if leave:
        with open(filler, "r+b") as f:
            f.truncate(max(0, filler.stat().st_size - leave))
    return filler


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "leave",
    [0, 4096, 8192, 12288, 16384, 20480, 24576],
    ids=lambda n: f"{n // 1024}KiB-free" if n else "full",
)
def test_run_on_a_full_tmpfs_exits_2_and_leaves_the_id_free(tiny_fs: Path, leave: int) -> None:
    """At each amount of free space a different write fails first (the run claim, the reserve
    for result.json, the checkpoint claim, run.json: 20 and 24 KiB left a stray reserve and a
    claim that refused the run ID for ever, exit 1); each is one line, exit 2, nothing left."""
    work = tiny_fs / "work"
    work.mkdir()
    filler = fill(tiny_fs, leave)
    args = ["run", "--workload", "reference", "--work-dir", str(work), "--run-id", "full"]
    done = run_cli(*args)
    assert done.returncode == 2, done.stdout + done.stderr
    # one error line (after the stack line where the plan got that far), no traceback
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, done.stderr
    assert "No space left on device" in done.stderr.splitlines()[-1], done.stderr
    run = work / "runs" / "full"
    assert list(run.glob("*.claim")) == [], "a claim that failed to be written was left"
    assert strays(run) == [] and not reserve_of(run / "result.json").exists()
    filler.unlink()
    prepare_run_dir(config(work))  # the run ID is not blocked


@pytest.mark.parametrize(
    "argv",
    [["verify", "{run}"], ["verify", "{run}", "--json", "-"], ["report", "{run}", "-o", "{html}"]],
    ids=["verify", "verify-json-stdout", "report"],
)
def test_stdout_on_a_full_tmpfs_is_one_line_exit_2(
    tiny_fs: Path, run_dir: Path, tmp_path: Path, argv: list[str]
) -> None:
    """Our own output that cannot be written (stdout redirected onto a full disk) is one line on
    stderr and exit 2, not a traceback."""
    fill(tiny_fs)
    args = [a.format(run=run_dir, html=tmp_path / "r.html") for a in argv]
    with open(tiny_fs / "out.txt", "w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "pytest_nvrx", *args],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    # (with --json - the text report goes to stderr, before the error)
    shown = done.stderr.splitlines()[-1] if "-" in args else one_line(done.stderr).rstrip("\n")
    assert shown.endswith("cannot write its output: [Errno 28] No space left on device"), shown


def test_report_and_verify_on_a_full_tmpfs_keep_the_old_files(tiny_fs: Path, run_dir: Path) -> None:
    html, rjson, vjson = tiny_fs / "report.html", tiny_fs / "report.json", tiny_fs / "v.json"
    html.write_text("<old page>")
    rjson.write_text("{}")
    vjson.write_text('{"old": true}')
    fill(tiny_fs)
    done = run_cli("report", str(run_dir), "-o", str(html))
    assert done.returncode == 2 and "No space left" in one_line(done.stderr), done.stderr
    done = run_cli("verify", str(run_dir), "--json", str(vjson))
    assert done.returncode == 2 and "No space left" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert html.read_text() == "<old page>" and rjson.read_text() == "{}"
    assert vjson.read_text() == '{"old": true}'
    assert strays(tiny_fs) == []


def test_result_json_written_after_the_launcher_filled_a_tmpfs(tiny_fs: Path) -> None:
    cfg = config(tiny_fs / "work")
    recipe, result = launch_filling(cfg)
    run = recipe.layout.run_dir
    assert (run / "checkpoints" / "filler").stat().st_size > 0
    assert result.exit_code == 0
    assert json.loads((run / "result.json").read_text())["exit_code"] == 0
    assert strays(run) == [] and not reserve_of(run / "result.json").exists()


# -- the second sweep of #22 ----------------------------------------------------------------


def test_dotdot_after_a_link_is_resolved_as_the_kernel_does(
    tmp_path: Path, pytester: pytest.Pytester
) -> None:
    """``w/L/../RUN/x`` with ``L`` a link into ``a/``: on disk it is ``a/RUN/x``; the check
    collapsed ``L/..`` by name to ``w/RUN/x`` and let it through (exit 0, written into RUN)."""
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "L").symlink_to(tmp_path / "a" / "sub")
    run = tmp_path / "a" / "RUN"
    shutil.copytree(KILL, run)
    base = tmp_path / "a" / "BASE"
    shutil.copytree(DATA / "cpu" / "reference-baseline", base)
    before = snapshot(tmp_path / "a")
    via = tmp_path / "w" / "L" / ".."
    for main, args in (
        (verify_main, [str(run), "--json", str(via / "RUN" / "v.json")]),
        (
            verify_main,
            [str(run), "--baseline", str(base), "--json", str(via / "BASE" / "run.json")],
        ),
        (report_main, [str(run), "-o", str(via / "RUN" / "x.html")]),
        (report_main, [str(run), "-o", str(via / "RUN" / "new" / "x.html")]),
    ):
        code, _, err = cli(main, *args)
        assert code == 2 and "resolves into" in one_line(err), (args, err)
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run), "--nvrx-report", str(via / "RUN" / "p.html")
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert snapshot(tmp_path / "a") == before and not (run / "new").exists()


def test_a_run_dirs_checkpoints_are_evidence_wherever_a_link_takes_them(
    tmp_path: Path,
) -> None:
    run = tmp_path / "RUN"
    shutil.copytree(KILL, run)
    outside = tmp_path / "ext"
    (run / "checkpoints").rename(outside)
    (run / "checkpoints").symlink_to(outside)
    before = snapshot(outside)
    for main, flag in ((verify_main, "--json"), (report_main, "-o")):
        code, _, err = cli(main, str(run), flag, str(outside / "v.out"))
        assert code == 2 and "checkpoints" in one_line(err), err
    assert snapshot(outside) == before


def test_junitxml_is_checked_where_pytest_will_write_it(
    pytester: pytest.Pytester, run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest expands ``$VAR`` and ``~`` in --junitxml, and truncates the file in place: the
    check expands them too, and refuses a hard link of a file in the run dir (run.json became
    XML); a parent that is a file is one line, not pytest's INTERNALERROR."""
    before = snapshot(run_dir)
    monkeypatch.setenv("RUNV", str(run_dir))
    monkeypatch.setenv("HOME", str(run_dir))
    link = tmp_path / "out.xml"
    os.link(run_dir / "run.json", link)
    (tmp_path / "afile").write_text("x")
    cases = [
        ("--junitxml=$RUNV/j.xml", "inside --nvrx-run-dir"),
        ("--junitxml=~/j.xml", "inside --nvrx-run-dir"),
        (f"--junitxml={link}", "is a hard link of"),
        (f"--junitxml={tmp_path / 'afile' / 'j.xml'}", "is not a directory"),
    ]
    for arg, why in cases:
        result = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(run_dir), arg)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (arg, result.stdout.str())
        result.stderr.fnmatch_lines([f"*pytest-nvrx: *{why}*"])
    assert snapshot(run_dir) == before


def test_a_run_dir_is_never_judged_from_inside_it(run_dir: Path) -> None:
    """Its conftest.py would run (code from the run under judgement) and pytest and its
    plugins would write into it (.pytest_cache, .benchmarks, --debug logs): refused before pytest
    reads anything there; the same run judged from outside passes."""
    (run_dir / "conftest.py").write_text(f"open({str(run_dir / 'PWNED')!r}, 'w').close()\n")
    before = snapshot(run_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    base = [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "-q"]
    for cwd, where in ((run_dir, "."), (run_dir / "logs", "..")):
        done = subprocess.run(
            [*base, "--debug", "--nvrx-run-dir", where],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
        assert "holds the directory pytest runs in" in done.stderr
    outside = subprocess.run(
        [*base, "-p", "no:cacheprovider", "--nvrx-run-dir", str(run_dir)],
        cwd=run_dir.parent, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert outside.returncode == 0, outside.stdout + outside.stderr
    assert snapshot(run_dir) == before and not (run_dir / "PWNED").exists()


def test_parents_made_for_an_output_are_removed_when_its_write_fails(tiny_fs: Path) -> None:
    from pytest_nvrx.outputs import write_output

    fill(tiny_fs)
    with pytest.raises(OSError):
        write_output(tiny_fs / "new" / "dir" / "v.json", "x" * 100_000)
    assert not (tiny_fs / "new").exists()


def test_a_baseline_refusal_shows_the_runs_text_escaped(run_dir: Path, tmp_path: Path) -> None:
    baseline = tmp_path / "base"
    shutil.copytree(DATA / "cpu" / "reference-baseline", baseline)
    manifest = json.loads((baseline / "run.json").read_text())
    manifest["workload_argv"] = [*manifest["workload_argv"], "--seed=1\x1b]0;owned\x07\r"]
    (baseline / "run.json").write_text(json.dumps(manifest))
    code, _, err = cli(verify_main, str(run_dir), "--baseline", str(baseline))
    assert code == 2 and "cannot use --baseline" in err, err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err and "\\x1b" in err


def test_a_run_dir_never_configures_its_own_judgement(run_dir: Path, tmp_path: Path) -> None:
    """pytest takes ``--nvrx-run-dir X``'s value for a path of the session before our option
    exists, so X's pytest.ini configured the judging session (``addopts =
    --nvrx-gate-shared-gpu`` made a gated run QUALIFIED: the adversarial review of #23); so
    did ``--rootdir X``. Both refused; ``--nvrx-run-dir=X`` with pytest's own rootdir judges."""
    (run_dir / "pytest.ini").write_text("[pytest]\naddopts = --nvrx-gate-shared-gpu\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    base = [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "-q"]
    base += ["-p", "no:cacheprovider"]
    for extra in (
        ["--nvrx-run-dir", str(run_dir)],
        ["--rootdir", str(run_dir), f"--nvrx-run-dir={run_dir}"],
    ):
        done = subprocess.run(
            [*base, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )
        assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
        assert "from the run dir it judges" in done.stderr, done.stderr
    ok = subprocess.run(
        [*base, f"--nvrx-run-dir={run_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr


# -- issue #36 item 14: an output replaces only a regular file -----------------------------


def special(kind: str, path: Path, elsewhere: Path) -> Iterator[None]:
    """Make a ``kind`` of non-regular file at ``path`` (a symlink leads to ``elsewhere``)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        elsewhere.write_text("someone's file\n")
        path.symlink_to(elsewhere)
    elif kind == "dangling-symlink":
        path.symlink_to(elsewhere / "nothing")
    elif kind == "device":  # /dev/full's numbers: the device the review turned into a file
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        try:
            yield
        finally:
            server.close()
        return
    yield


SPECIAL_KINDS = ["fifo", "directory", "symlink", "dangling-symlink", "device", "socket"]
SHOWN_KIND = {
    "fifo": "a FIFO",
    "directory": "a directory",
    "symlink": "a symlink",
    "dangling-symlink": "a symlink",
    "device": "a character device",
    "socket": "a socket",
}


def identity(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_ino, stat.S_IFMT(st.st_mode), st.st_rdev


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (an AF_UNIX socket's must fit in 108 bytes)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp", prefix="o36-") as folder:
        yield Path(folder)


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize(
    ("command", "flags", "named"),
    [
        ("verify", ["--json", "{p}"], "--json {p}"),
        ("report", ["-o", "{p}"], "-o {p}"),
        ("report", ["-o", "{d}/r.html", "--json", "{p}"], "--json {p}"),
        # the JSON beside the HTML page, named after it, where -o puts it
        ("report", ["-o", "{d}/out/r.html"], "--json (default) {d}/out/r.json"),
    ],
    ids=["verify-json", "report-o", "report-json", "report-json-beside"],
)
def test_an_output_onto_anything_but_a_regular_file_is_refused_and_nothing_written(
    run_dir: Path, short_dir: Path, kind: str, command: str, flags: list[str], named: str
) -> None:
    """Before, the rename replaced it (``--json /dev/full`` left a regular file where the
    device was) and the command exited 0."""
    target = short_dir / "out" / "r.json" if "{d}/out" in flags[-1] else short_dir / "p"
    target.parent.mkdir(exist_ok=True)
    maker = special(kind, target, short_dir / "elsewhere")
    next(maker)
    try:
        before = identity(target)
        main = verify_main if command == "verify" else report_main
        args = [f.format(p=target, d=short_dir) for f in flags]
        code, out, err = cli(main, str(run_dir), *args)
        assert code == 2, out + err
        line = one_line(err)
        shown = named.format(p=target, d=short_dir)
        assert f"{shown} is {SHOWN_KIND[kind]}, not a regular file" in line, line
        assert identity(target) == before
        assert strays(short_dir) == [] and not (short_dir / "r.html").exists()
        if kind == "symlink":
            assert (short_dir / "elsewhere").read_text() == "someone's file\n"
    finally:
        next(maker, None)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "device"])
def test_write_atomic_refuses_anything_but_a_regular_file(short_dir: Path, kind: str) -> None:
    """The writer of every file (run.json, result.json, reports) checks again before it
    renames: nothing is written, no temp file is left."""
    from pytest_nvrx.outputs import NotAnOutputFile

    target = short_dir / "result.json"
    maker = special(kind, target, short_dir / "elsewhere")
    next(maker)
    before = identity(target)
    with pytest.raises(NotAnOutputFile, match=f"is {SHOWN_KIND[kind]}, not a regular file"):
        write_atomic(target, '{"exit_code": 0}\n')
    assert identity(target) == before and strays(short_dir) == []
    write_atomic(short_dir / "new.json", "{}\n")  # a new path is fine
    (short_dir / "old.json").write_text("old\n")
    write_atomic(short_dir / "old.json", "{}\n")  # and so is a regular file
    assert (short_dir / "old.json").read_text() == "{}\n"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "device"])
@pytest.mark.parametrize("beside", [False, True], ids=["report", "report-json"])
def test_plugin_report_onto_anything_but_a_regular_file_is_a_usage_error(
    pytester: pytest.Pytester, run_dir: Path, short_dir: Path, kind: str, beside: bool
) -> None:
    target = short_dir / ("r.json" if beside else "r.html")  # the page's JSON: named after it
    maker = special(kind, target, short_dir / "elsewhere")
    next(maker)
    before = identity(target)
    report = short_dir / "r.html"
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(run_dir), "--nvrx-report", str(report)
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    flag = "--nvrx-report's JSON" if beside else "--nvrx-report"
    result.stderr.fnmatch_lines([f"*pytest-nvrx: {flag} {target} is {SHOWN_KIND[kind]}*"])
    assert identity(target) == before


# -- issue #36 item 16: a full disk is named --------------------------------------------------


#: NVRx's line on a real run on a full 1.2 MB tmpfs, after its own line's stamp and level
DISK_FULL_MESSAGE = (
    " [WARNING] [vm] [workload:?(?) infra:?(?)] cycle_info_writer.py:306 Failed to update cycle"
    " info in /tmp/w/runs/x/cycle_infos/cycle_info..0.1: [Errno 28] No space left on device"
)
#: what a worker whose checkpoint write hit the full disk prints last (its traceback's line)
WORKER_LINE = (
    "1: [rank1]: OSError: [Errno 122] Disk quota exceeded: '/ckpt/iter_0000010/__1_0.distcp'"
)

FULL_DISK_RUNS = sorted(
    p for group in ("windows/cpu", "windows/gpu") for p in (DATA / group).iterdir()
    if (p / "run.json").is_file()
)  # fmt: skip


@pytest.mark.parametrize("src", FULL_DISK_RUNS, ids=lambda p: p.name)
def test_a_run_that_says_its_disk_filled_cannot_be_judged_and_says_so(
    src: Path, tmp_path: Path
) -> None:
    """NVRx's own line (seen on a real run on a full 1.2 MB tmpfs: verify said only that a
    cycle record held no time) leads: verify names "No space left on device" in one line."""
    run = tmp_path / src.name
    shutil.copytree(src, run)
    log = run / "logs" / "launcher.log"
    lines = log.read_text().splitlines(keepends=True)
    # in the middle of the log, stamped as the NVRx line before it
    at = next(i for i in range(len(lines) // 2, len(lines)) if lines[i][:4].isdigit()) + 1
    lines.insert(at, lines[at - 1][:23] + DISK_FULL_MESSAGE + "\n")
    log.write_text("".join(lines))
    code, out, err = cli(verify_main, str(run))
    assert code == 2, out + err
    assert err.splitlines()[0] == (
        f"verify: error: cannot judge {run}: logs/launcher.log:{at + 1} says No space left on"
        " device: a write of the run failed for a full disk or quota, so its logs, records and"
        " checkpoints may be cut short and it cannot be judged; free space where it writes and"
        " run it again"
    ), err
    assert "Traceback" not in err


def test_a_worker_error_of_a_full_quota_is_named_too(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(DATA / "windows" / "gpu" / "g2-kill-save", run)
    log = run / "logs" / "train_cycle0.log"
    log.write_text(log.read_text() + WORKER_LINE + "\n")
    code, out, err = cli(verify_main, str(run))
    assert code == 2, out + err
    assert "logs/train_cycle0.log:" in err and "says Disk quota exceeded:" in err, err


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: more free than a full disk leaves until a run fills it."""
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=4m", "tmpfs") as mnt:
        yield mnt


def test_the_harness_names_a_disk_the_run_filled(small_fs: Path) -> None:
    """The launcher filled the disk (a real tmpfs): the harness's note names it, in the words
    a write there fails with; with the space given back, no note."""
    from pytest_nvrx.outputs import full_disk_note

    tiny_fs = small_fs
    cfg = config(tiny_fs / "work")
    recipe, _ = launch_filling(cfg)
    note = full_disk_note([recipe.layout.run_dir, recipe.layout.checkpoint_dir])
    assert note is not None and note.startswith("No space left on device: the file system of")
    assert str(recipe.layout.run_dir) in note
    (recipe.layout.checkpoint_dir / "filler").unlink()
    assert full_disk_note([recipe.layout.run_dir, recipe.layout.checkpoint_dir]) is None


def test_the_run_command_prints_the_full_disk_note(
    small_fs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m pytest_nvrx run`` on a disk its run filled: after the launcher's exit, one
    line naming "No space left on device" (its launcher a stand-in that fills the disk)."""
    from pytest_nvrx import cli as cli_module
    from pytest_nvrx.launch import run as launch_path

    tiny_fs = small_fs
    monkeypatch.setattr(launch_path, "find_launcher", lambda: _filling_launcher(tiny_fs))
    work = tiny_fs / "work"
    status = cli_module.main(
        ["run", "--workload", "reference", "--work-dir", str(work), "--run-id", "full",
         "--timeout", "60"],
        {},
    )  # fmt: skip
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "No space left on device" in line]
    assert len(lines) == 1 and lines[0].startswith("pytest-nvrx run: No space left on device"), err
    assert status == 0, err


def _filling_launcher(tiny_fs: Path) -> str:
    """A stand-in for ft_launcher (beside the tmpfs, not on it) that fills the tmpfs and exits
    0, as a run whose checkpoints took the last byte would."""
    script = tiny_fs.parent / "filling-launcher"
    script.write_text(
        f"#!{sys.executable}\n" + FILL_DISK.replace("sys.argv[1]", repr(str(tiny_fs / "work")))
    )
    script.chmod(0o755)
    return str(script)
