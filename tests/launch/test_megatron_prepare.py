"""Megatron's first-use build, done once before launch (pytest_nvrx.launch.prepare_megatron).

Real make on Megatron-shaped checkouts (tests/helpers/megatron_checkouts.py): a real C++ build where
the host has g++, a slow build that writes its artifact in pieces for the lock. The claims are real
files contended for by real processes; a dead holder is a process that really exited.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.launch import prepare_megatron as prep
from pytest_nvrx.launch.checkpoint_claim import pid_start, read_holder
from pytest_nvrx.launch.prepare_megatron import (
    CLAIM_NAME,
    STALE_S,
    ClaimWaitTooLong,
    Outcome,
    acquire,
    break_claim,
    ensure_prepared,
    prepare_checkout,
)
from pytest_nvrx.megatron.build import elf_shortfall
from pytest_nvrx.settings import ConfigError
from tests.helpers.files import snapshot
from tests.helpers.megatron_checkouts import (
    DATASETS,
    EXT_SUFFIX,
    MAKEFILE_PATTERN,
    PYBIND_CPP,
    SLOW_TOOLS,
    env_with_path,
    have_compiler,
    megatron_checkout,
    slow_checkout,
    tool_bin,
)

needs_compiler = pytest.mark.skipif(not have_compiler(), reason="no g++ and make on this host")
ARTIFACT = f"helpers_cpp{EXT_SUFFIX}"


def tools(tmp_path: Path, **kwargs: object) -> dict[str, str]:
    return env_with_path(tool_bin(tmp_path / "bin", **kwargs))  # type: ignore[arg-type]


def slow_env(tmp_path: Path, piece_s: float = 0.3) -> dict[str, str]:
    return {
        **tools(tmp_path, compiler=False, extra=SLOW_TOOLS),
        "NVRX_TEST_BUILD_LOG": str(tmp_path / "builds.log"),
        "NVRX_TEST_PIECE_S": str(piece_s),
    }


def builds(tmp_path: Path) -> list[str]:
    log = tmp_path / "builds.log"
    return log.read_text().split() if log.exists() else []


def refusal(checkout: Path, env: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        prepare_checkout(checkout, who="test", environ=env)
    return info.value


# ----------------------------------------------------------------------------------------------
# Built once, whole, and Megatron's own make then does nothing


@needs_compiler
def test_built_once_before_launch_then_megatrons_make_does_nothing(tmp_path: Path) -> None:
    root = megatron_checkout(tmp_path / "Megatron-LM")
    env = tools(tmp_path)
    before = snapshot(root)
    prepared = prepare_checkout(root, who="test", environ=env)
    [done] = prepared.builds
    assert done.outcome is Outcome.BUILT and done.artifacts == (ARTIFACT,)
    assert prepared.line is not None
    assert prepared.line.startswith(f"nvrx: megatron build: {DATASETS}/{ARTIFACT} built in ")
    assert prepared.line.endswith(
        f" s, once, before launch (Megatron's first-use make -C {DATASETS}, {DATASETS}/utils.py:10)"
    )
    artifact = root / DATASETS / ARTIFACT
    assert elf_shortfall(artifact) is None  # a whole shared object, built by the real g++
    # the checkout gained the artifact alone: no claim, no temp file, nothing else touched
    after = snapshot(root)
    assert set(after) - set(before) == {f"{DATASETS}/{ARTIFACT}"}
    # (a directory's own mtime changes with what is added to it, claim and artifact)
    assert {k: v for k, v in after.items() if k in before and not v[0]} == {
        k: v for k, v in before.items() if not v[0]
    }
    # Megatron's rank 0 (compile_helpers: make -C <dir>) now finds nothing to do
    megatron = subprocess.run(
        ["make", "-C", str(root / DATASETS)], env=env, capture_output=True, text=True
    )
    assert megatron.returncode == 0 and "Nothing to be done for 'default'" in megatron.stdout
    again = prepare_checkout(root, who="test", environ=env)
    assert again.line == (
        f"nvrx: megatron build: {DATASETS}/{ARTIFACT} already built (Megatron's first-use make"
        f" -C {DATASETS}, {DATASETS}/utils.py:10: up to date)"
    )


@needs_compiler
def test_the_pattern_rule_revision_builds_its_own_name(tmp_path: Path) -> None:
    root = megatron_checkout(tmp_path / "m", makefile=MAKEFILE_PATTERN)
    [done] = prepare_checkout(root, who="test", environ=tools(tmp_path)).builds
    assert done.artifacts == (f"helpers{EXT_SUFFIX}",)
    assert elf_shortfall(root / DATASETS / f"helpers{EXT_SUFFIX}") is None


@needs_compiler
def test_a_half_built_artifact_in_place_is_rebuilt(tmp_path: Path) -> None:
    """A .so cut mid-write (a job killed while its make wrote it) is newer than its source, so
    make calls it up to date and every job would die importing it: it is built again."""
    root = megatron_checkout(tmp_path / "m")
    env = tools(tmp_path)
    prepare_checkout(root, who="test", environ=env)
    artifact = root / DATASETS / ARTIFACT
    whole = artifact.read_bytes()
    artifact.write_bytes(whole[: len(whole) // 3])
    prepared = prepare_checkout(root, who="test", environ=env)
    assert prepared.builds[0].outcome is Outcome.BUILT
    assert prepared.line is not None
    assert f"{ARTIFACT} was half built (file too short (" in prepared.line
    assert "): rebuilt in " in prepared.line
    assert elf_shortfall(artifact) is None


def test_a_checkout_that_builds_nothing_says_nothing(tmp_path: Path) -> None:
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "pretrain_gpt.py").write_text("")
    prepared = prepare_checkout(stub, who="test")
    assert prepared.builds == () and prepared.line is None


def test_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scenario's plan after its session prepared the checkout asks make nothing; a checkout
    whose artifact changed since is prepared again."""
    root = slow_checkout(tmp_path / "m")
    env = slow_env(tmp_path, piece_s=0)
    first = ensure_prepared(root, who="session", environ=env)
    assert first.builds[0].outcome is Outcome.BUILT
    calls: list[Path] = []
    real = prep.prepare_checkout

    def counted(path: Path, **kwargs: Any) -> prep.Preparation:
        calls.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(prep, "prepare_checkout", counted)
    later = ensure_prepared(root, who="scenario", environ=env)
    assert calls == [] and later.builds[0].outcome is Outcome.ALREADY
    (root / DATASETS / "helpers_data.py").unlink()
    rebuilt = ensure_prepared(root, who="scenario", environ=env)
    assert calls == [root] and rebuilt.builds[0].outcome is Outcome.BUILT
    assert builds(tmp_path) and len(builds(tmp_path)) == 2


# ----------------------------------------------------------------------------------------------
# Refusals: one line, before anything launches, naming what is missing


def test_no_make(tmp_path: Path) -> None:
    root = megatron_checkout(tmp_path / "m")
    message = str(refusal(root, tools(tmp_path, make=False)))
    assert message == (
        "this Megatron checkout builds at first use (megatron/core/datasets/utils.py:10"
        " compile_helpers() runs make -C megatron/core/datasets), but make is not on PATH: rank 0"
        " of every job would die there; install make, a C++ compiler and pybind11 for the python3"
        " on PATH"
    )


def test_no_compiler(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make on this host")
    root = megatron_checkout(tmp_path / "m")
    message = str(refusal(root, tools(tmp_path, compiler=False)))
    assert message.startswith(
        f"building {DATASETS}/{ARTIFACT} failed (make -C {root / DATASETS} exited 2): make: g++:"
        " No such file or directory"
    )
    assert "; install a C++ compiler (g++)" in message
    assert "; rank 0 of every job would fail the same way at first use" in message
    assert "\n" not in message
    assert not (root / DATASETS / CLAIM_NAME).exists()


@needs_compiler
def test_no_pybind11(tmp_path: Path) -> None:
    """Megatron's helpers need pybind11's headers; the python3 on PATH has no pybind11."""
    env = tools(tmp_path)
    found = subprocess.run(
        ["python3", "-c", "import pybind11"], env=env, capture_output=True, check=False
    )
    if found.returncode == 0:
        pytest.skip("the workers' Python has pybind11")
    root = megatron_checkout(tmp_path / "m", source=PYBIND_CPP)
    message = str(refusal(root, env))
    assert f"failed (make -C {root / DATASETS} exited 2): helpers.cpp:1:10: fatal error:" in message
    assert (
        f"pybind11/pybind11.h: No such file or directory (and {tmp_path}/bin/python3: No module"
        " named pybind11); install pybind11 for the python3 on PATH"
    ) in message
    assert not (root / DATASETS / ARTIFACT).exists()


@needs_compiler
def test_a_failing_build_quotes_the_compilers_error(tmp_path: Path) -> None:
    root = megatron_checkout(tmp_path / "m", source="this is not C++\n")
    message = str(refusal(root, tools(tmp_path)))
    assert "helpers.cpp:1:1: error: " in message
    assert message.endswith(
        "; rank 0 of every job would fail the same way at first use"
        f" ({DATASETS}/utils.py:10 compile_helpers() runs make -C {DATASETS})"
    )
    assert sorted(p.name for p in (root / DATASETS).iterdir()) == [
        "Makefile", "__init__.py", "helpers.cpp", "utils.py"
    ]  # fmt: skip


def test_an_extension_for_another_python(tmp_path: Path) -> None:
    """python3-config on PATH belongs to another Python: Megatron would build a module its
    workers cannot import."""
    if shutil.which("make") is None:
        pytest.skip("no make on this host")
    root = megatron_checkout(tmp_path / "m")
    env = tools(tmp_path, suffix=".cpython-39-x86_64-linux-gnu.so")
    message = str(refusal(root, env))
    assert message.startswith(
        f"make in {DATASETS} would build helpers_cpp.cpython-39-x86_64-linux-gnu.so, an"
        " extension for another Python (.cpython-39-x86_64-linux-gnu.so; python3-config on PATH:"
        f" {tmp_path / 'bin' / 'python3-config'}) than the workers' Python"
    )
    assert message.endswith(
        "Megatron's import of it would fail; put the bin directory of the workers' Python (with"
        " its python3 and python3-config) first on PATH"
    )


@needs_compiler
def test_a_source_from_the_future_is_refused_after_the_build(tmp_path: Path) -> None:
    """make -q still finds it out of date after the build: every job's rank 0 would rebuild it
    while the others import it."""
    root = megatron_checkout(tmp_path / "m")
    future = time.time() + 3600
    os.utime(root / DATASETS / "helpers.cpp", (future, future))
    message = str(refusal(root, tools(tmp_path)))
    assert message.startswith(
        f"after building {DATASETS}/{ARTIFACT}, make -q in {root / DATASETS} still finds it out"
        " of date"
    )
    assert not (root / DATASETS / CLAIM_NAME).exists()


UNSHARE = shutil.which("unshare") or "unshare"


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run([UNSHARE, "-m", "true"], capture_output=True, check=False)
    return probe.returncode == 0


READ_ONLY_PREPARE = """
import sys
from pathlib import Path
from pytest_nvrx.launch.prepare_megatron import prepare_checkout
from pytest_nvrx.settings import ConfigError
try:
    print(prepare_checkout(Path(sys.argv[1]), who="read-only").line)
except ConfigError as exc:
    print("ERROR", exc.message_for("cli"))
    print("ERROR", exc.message_for("plugin"))
"""


@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare -m (a read-only mount)")
def test_a_read_only_checkout(tmp_path: Path) -> None:
    """The checkout on a read-only mount (a mount namespace of its own): refused when it must be
    built, in each entry point's spelling; fine when already built."""
    root = slow_checkout(tmp_path / "m")
    env = slow_env(tmp_path, piece_s=0)
    mount = shutil.which("mount")
    script = (
        f"{mount} --bind {root} {root} && {mount} -o remount,bind,ro {root} && "
        f'exec {sys.executable} -c "$0" {root}'
    )

    def run() -> list[str]:
        done = subprocess.run(
            [UNSHARE, "-m", "--propagation", "private", "/bin/sh", "-c", script, READ_ONLY_PREPARE],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    cli, plugin = run()
    where = root / DATASETS
    assert cli == (
        f"ERROR {DATASETS}/helpers_data.py must be built before launch ({DATASETS}/utils.py:10"
        f" compile_helpers() runs make -C {DATASETS} at first use), but {where} is not writable"
        f" (Read-only file system): build it once where the checkout is writable (make -C"
        f" {where}) and give that checkout (--megatron-path (MEGATRON_PATH))"
    )
    assert plugin.startswith("ERROR ") and plugin.endswith(
        "(--nvrx-megatron-path (MEGATRON_PATH, ini nvrx_megatron_path))"
    )
    assert builds(tmp_path) == []
    prepare_checkout(root, who="writable", environ=env)
    assert run() == [
        f"nvrx: megatron build: {DATASETS}/helpers_data.py already built (Megatron's first-use"
        f" make -C {DATASETS}, {DATASETS}/utils.py:10: up to date)"
    ]


# ----------------------------------------------------------------------------------------------
# The claim: one build among processes, a dead holder taken over

PREPARE = """
import sys
from pathlib import Path
from pytest_nvrx.launch.prepare_megatron import prepare_checkout
prepared = prepare_checkout(Path(sys.argv[1]), who=sys.argv[2])
print(prepared.builds[0].outcome.value, flush=True)
print(prepared.line, flush=True)
"""


def start_preparing(root: Path, who: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PREPARE, str(root), who],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_processes_contending_build_once(tmp_path: Path) -> None:
    root = slow_checkout(tmp_path / "m")
    env = slow_env(tmp_path)
    procs = [start_preparing(root, f"session {i}", env) for i in range(4)]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outcomes.append(out.splitlines())
    assert len(builds(tmp_path)) == 1  # the recipe ran once
    kinds = sorted(o[0] for o in outcomes)
    assert kinds.count("built") == 1 and set(kinds) <= {"built", "waited", "already built"}
    for outcome, line in outcomes:
        if outcome == "waited":
            assert f"{DATASETS}/helpers_data.py built by pid " in line
            assert f" on host {socket.gethostname()} (session " in line
            assert "; waited " in line and line.endswith(" s for it")
    assert not (root / DATASETS / CLAIM_NAME).exists()
    text = (root / DATASETS / "helpers_data.py").read_text()
    assert text.endswith("COMPLETE = len(PIECES) == 5\n")


def _claim_record(path: Path, **fields: object) -> None:
    record = {
        "run_id": "run gone",
        "run_dir": str(path.parent),
        "host": socket.gethostname(),
        "pid": 1,
        "pid_start": None,
        "time": "2026-01-01T00:00:00.000000+00:00",
        **fields,
    }
    path.write_text(json.dumps(record) + "\n")


def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    root = slow_checkout(tmp_path / "m")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    claim = root / DATASETS / CLAIM_NAME
    _claim_record(claim, pid=gone.pid)
    started = time.monotonic()
    prepared = prepare_checkout(root, who="test", environ=slow_env(tmp_path, piece_s=0))
    assert time.monotonic() - started < STALE_S / 2
    assert prepared.builds[0].outcome is Outcome.BUILT
    assert len(builds(tmp_path)) == 1
    assert not claim.exists()
    assert [p.name for p in (root / DATASETS).iterdir() if p.name.startswith(".")] == []


def test_a_live_holder_is_waited_for(tmp_path: Path) -> None:
    """A second session that finds the first mid-build (its recipe started, the artifact not in
    place) waits for it, through the whole build, and does not build it again. The first one's
    recipe is held at a gate until the second is seen waiting on its claim, so the order is
    the test's, not the scheduler's."""
    root = slow_checkout(tmp_path / "m")
    piece_s = 0.4
    env = slow_env(tmp_path, piece_s=piece_s)
    gate = tmp_path / "gate"
    holder = start_preparing(root, "the first session", {**env, "NVRX_TEST_GATE": str(gate)})
    opened_at: list[int] = []

    def wait(seconds: float) -> None:
        if not opened_at:  # the second session waits on the claim: let the build go on
            opened_at.append(len(builds(tmp_path)))
            gate.touch()
        time.sleep(seconds)

    prepared = None
    try:
        deadline = time.monotonic() + 60
        while not builds(tmp_path) and holder.poll() is None:  # until its recipe has started
            assert time.monotonic() < deadline
            time.sleep(0.02)
        if holder.poll() is None:  # held at the gate, unless it failed before
            prepared = prepare_checkout(root, who="second", environ=env, sleep=wait)
    finally:
        gate.touch()
        try:
            out, err = holder.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.communicate()
            raise
    assert holder.returncode == 0, err
    assert out.splitlines()[0] == "built", out
    assert prepared is not None
    assert opened_at == [1]  # it waited while the first one's recipe ran
    [done] = prepared.builds
    assert done.outcome is Outcome.WAITED, done
    assert done.builder == f"pid {holder.pid} on host {socket.gethostname()} (the first session)"
    assert done.seconds >= 5 * piece_s  # the rest of the build, from the gate on
    assert len(builds(tmp_path)) == 1
    text = (root / DATASETS / "helpers_data.py").read_text()
    assert text.endswith("COMPLETE = len(PIECES) == 5\n")
    assert not (root / DATASETS / CLAIM_NAME).exists()


class FakeTime:
    """A clock that advances only when slept on; ``on_sleep`` runs at each sleep."""

    def __init__(self, on_sleep: object = None) -> None:
        self.now = 0.0
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if callable(self.on_sleep):
            self.on_sleep()


def test_a_claim_of_another_host_that_stopped_changing_is_stale(tmp_path: Path) -> None:
    claim = tmp_path / CLAIM_NAME
    _claim_record(claim, host="node-elsewhere", pid=4242)
    fake = FakeTime()
    held = acquire(
        tmp_path, who="me", building=("x",), clock=fake.clock, sleep=fake.sleep, poll_s=1.0
    )
    try:
        assert STALE_S <= fake.now <= STALE_S + 2.0
        assert read_holder(claim).run_id == "me"
        assert held.waited_for is not None and held.waited_for.host == "node-elsewhere"
    finally:
        held.release()
    assert not claim.exists()


def test_a_claim_of_another_host_kept_alive_is_waited_for_up_to_the_limit(tmp_path: Path) -> None:
    claim = tmp_path / CLAIM_NAME
    _claim_record(claim, host="node-elsewhere", pid=4242)
    beats = iter(range(1, 10**6))

    def heartbeat() -> None:  # the holder on the other node touches its claim
        stamp = 1_700_000_000 + next(beats)
        os.utime(claim, (stamp, stamp))

    fake = FakeTime(heartbeat)
    with pytest.raises(ClaimWaitTooLong) as info:
        acquire(
            tmp_path, who="me", building=("x",), clock=fake.clock, sleep=fake.sleep, poll_s=5.0,
            wait_limit_s=3 * STALE_S,
        )  # fmt: skip
    assert info.value.holder.host == "node-elsewhere"
    assert claim.exists() and read_holder(claim).pid == 4242  # never broken


def test_breaking_a_stale_claim_never_removes_a_fresh_one(tmp_path: Path) -> None:
    """Two waiters saw the same dead holder; one broke it and claimed: the other, renaming that
    fresh claim away, puts it back."""
    claim = tmp_path / CLAIM_NAME
    _claim_record(claim, pid=1)
    dead = read_holder(claim)
    _claim_record(claim, pid=os.getpid(), pid_start=pid_start(os.getpid()), time="fresh")
    assert not break_claim(claim, dead)
    assert read_holder(claim).time == "fresh"
    assert break_claim(claim, read_holder(claim))
    assert not claim.exists()
    assert list(tmp_path.iterdir()) == []


def test_the_holder_keeps_its_claim_alive(tmp_path: Path) -> None:
    held = acquire(tmp_path, who="me", building=("x",))
    claim = tmp_path / CLAIM_NAME
    os.utime(claim, (1_000_000, 1_000_000))
    held.start_heartbeat(every_s=0.05)
    deadline = time.monotonic() + 10
    while claim.stat().st_mtime == 1_000_000:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    held.release()
    assert not claim.exists()


def test_a_refusal_is_remembered_by_the_process(tmp_path: Path) -> None:
    """Each scenario of a session plans through ensure_prepared: a build that failed once is not
    run again for each of them."""
    failing = (
        "OUT = helpers_data.py\n\ndefault: $(OUT)\n\n$(OUT): helpers.src\n"
        '\techo $$$$ >> "$(NVRX_TEST_BUILD_LOG)"\n'
        "\t@echo 'helpers.src:1: error: broken on purpose' >&2; exit 3\n"
    )
    root = megatron_checkout(
        tmp_path / "m", makefile=failing, source="x\n", source_name="helpers.src"
    )
    env = slow_env(tmp_path)
    with pytest.raises(ConfigError) as first:
        ensure_prepared(root, who="session", environ=env)
    assert str(first.value).startswith(
        f"building {DATASETS}/helpers_data.py failed (make -C {root / DATASETS} exited 2):"
        " helpers.src:1: error: broken on purpose; rank 0 of every job would fail the same way"
    )
    with pytest.raises(ConfigError) as again:
        ensure_prepared(root, who="scenario", environ=env)
    assert again.value is first.value
    assert len(builds(tmp_path)) == 1


SPLIT_MAKEFILE = (
    "OUT = helpers_data.py\n\ndefault: $(OUT)\n\n"
    "$(OUT): src/helpers.src ../include/extra.src\n\tcat $^ > $@\n"
)


def test_a_build_reading_a_subdirectory_and_a_parent_include_is_built_once(
    tmp_path: Path,
) -> None:
    """The Makefile reads src/ below its directory and ../include/ beside it: the build finds
    both as make in place would, and only the artifact is published into the checkout."""
    checkout = megatron_checkout(
        tmp_path / "checkout",
        makefile=SPLIT_MAKEFILE,
        source="PIECES = [1]\n",
        source_name="src/helpers.src",
    )
    include = checkout / DATASETS.parent / "include"
    include.mkdir()
    (include / "extra.src").write_text("EXTRA = 2\n")
    before = sorted(p.relative_to(checkout) for p in checkout.rglob("*"))
    env = env_with_path(tool_bin(tmp_path / "bin", compiler=False) + os.pathsep + "/usr/bin:/bin")
    prepared = prepare_checkout(checkout, who="test", environ=env)
    assert [p.outcome for p in prepared.builds] == [Outcome.BUILT]
    built = checkout / DATASETS / "helpers_data.py"
    assert built.read_text() == "PIECES = [1]\nEXTRA = 2\n"
    after = sorted(p.relative_to(checkout) for p in checkout.rglob("*"))
    assert set(after) - set(before) == {DATASETS / "helpers_data.py"}


def test_a_directory_in_place_of_the_artifact_is_refused(tmp_path: Path) -> None:
    checkout = megatron_checkout(
        tmp_path / "checkout",
        makefile=SPLIT_MAKEFILE.replace(" ../include/extra.src", "").replace("$^", "$<"),
        source="PIECES = []\n",
        source_name="src/helpers.src",
    )
    (checkout / DATASETS / "helpers_data.py").mkdir()  # newer than the source: "up to date"
    with pytest.raises(ConfigError, match=r"helpers_data\.py is a directory"):
        prepare_checkout(checkout, who="test", environ=tools(tmp_path, compiler=False))


def test_a_killed_builds_temporary_directory_and_make_are_cleaned(tmp_path: Path) -> None:
    """A session killed with SIGKILL mid-build leaves its temporary directory and its make
    running: the next build kills that make's group and removes the directory; a live
    session's directory is left alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        stale = tmp_path / f"{prep.BUILD_DIR_PREFIX}{gone.pid}-12345-abc"
        stale.mkdir()
        (stale / "make.pid").write_text(f"{orphan.pid} {pid_start(orphan.pid)}\n")
        live = tmp_path / f"{prep.BUILD_DIR_PREFIX}{os.getpid()}-{pid_start(os.getpid())}-def"
        live.mkdir()
        other = tmp_path / "nvrx-megatron-build-notours"
        other.mkdir()
        assert prep.clean_stale_build_dirs(tmp_path) == [stale]
        assert orphan.wait(timeout=10) == -9
        assert live.is_dir() and other.is_dir() and not stale.exists()
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


@pytest.mark.parametrize("kind", ["garbage", "live pid without start", "other host"])
def test_a_wait_on_a_holder_that_cannot_be_told_dead_is_said_once(
    tmp_path: Path, kind: str
) -> None:
    """Never a silent wait: one line naming the claim, its holder and how long the wait lasts."""
    claim = tmp_path / CLAIM_NAME
    if kind == "garbage":
        claim.write_bytes(b"\x00not json")
    elif kind == "other host":
        _claim_record(claim, host="node-elsewhere", pid=4242)
    else:
        _claim_record(claim, pid=os.getpid(), pid_start=None)
    said: list[str] = []
    fake = FakeTime()
    try:
        held = acquire(
            tmp_path, who="me", building=("x",), clock=fake.clock, sleep=fake.sleep, poll_s=1.0,
            wait_limit_s=3 * STALE_S, say=said.append,
        )  # fmt: skip
        held.release()
    except ClaimWaitTooLong:
        assert kind == "live pid without start"
    assert fake.now >= STALE_S  # waited, on the clock it was given, until stale at the least
    assert len(said) == 1, said
    assert str(claim) in said[0] and "waiting" in said[0], said
    assert f"{3 * STALE_S:.0f} s" in said[0], said
    if kind == "live pid without start":
        assert f"pid {os.getpid()}" in said[0] and "no process start time" in said[0], said


def test_a_directory_in_place_of_the_claim_is_an_error_naming_it(tmp_path: Path) -> None:
    root = slow_checkout(tmp_path / "m")
    claim = root / DATASETS / CLAIM_NAME
    claim.mkdir()
    started = time.monotonic()
    with pytest.raises(ConfigError, match=CLAIM_NAME + r" is a directory"):
        prepare_checkout(root, who="test", environ=slow_env(tmp_path))
    assert time.monotonic() - started < 30
    assert claim.is_dir()
    assert not [p for p in (root / DATASETS).iterdir() if ".stale." in p.name]
