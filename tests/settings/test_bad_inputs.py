"""Every bad ``run`` input is refused before anything is written (issue #9, item 6).

One table holds the kinds of bad input an adversarial user tried: numbers, paths, file-system
traps, endpoints, ports, timeouts, arguments that override the recipe's own, boolean env values.
Each row runs ``python -m pytest_nvrx run`` in-process through :func:`pytest_nvrx.cli.main` and
must end with exit status 2, a message naming the fix, and the file system exactly as it was.
Nothing may be launched or probed for a bad input: both are guarded and fail the row.

A few good inputs must pass ``--dry-run`` (or reach the launch, for a real run).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx import cli
from tests.helpers.files import snapshot

INT64_MAX = 2**63 - 1
DIGITS_5000 = "7" * 5000
LONG_PATH_PARTS = "/d" * 2100  # 4200 bytes: beyond PATH_MAX (4096)


Cleanups = list[Callable[[], Any]]


class WouldLaunch(Exception):
    """Raised by the guards: the input got as far as probing the stack or launching."""


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...] = ()
    #: Added to the base environment; None removes the variable.
    env: dict[str, str | None] = field(default_factory=dict)
    #: Fragment of the error message (bad rows); None for good rows.
    message: str | None = None
    #: Name of a SETUPS entry that prepares the file system before the snapshot.
    setup: str | None = None
    #: Good rows: "dry-run" (exit 0, command printed) or "launch" (reaches the launcher).
    outcome: str = "refused"


def bad(
    id: str,
    argv: tuple[str, ...] | list[str] = (),
    message: str = "",
    *,
    env: dict[str, str | None] | None = None,
    setup: str | None = None,
) -> Case:
    return Case(id, tuple(argv), env or {}, message, setup)


def good(
    id: str,
    argv: tuple[str, ...] | list[str] = (),
    *,
    env: dict[str, str | None] | None = None,
    setup: str | None = None,
    outcome: str = "dry-run",
) -> Case:
    return Case(id, tuple(argv), env or {}, None, setup, outcome)


MULTINODE = ("--nnodes", "2", "--run-id", "job1")
#: The issue's stack: Megatron on one GPU (no peer whose collective timeout ends a hang sooner).
ONE_GPU = ("--gpus-per-node", "1", "--fault-rank", "0")
SETUP_900 = ("--section-timeouts", "setup:900,step:30,checkpointing:30")

BAD: list[Case] = [
    # --- integers: shape -----------------------------------------------------------------
    bad("tp-zero", ["--tp", "0"], "--tp must be a positive integer"),
    bad("tp-negative", ["--tp", "-1"], "--tp must be a positive integer"),
    bad("tp-word", ["--tp", "two"], "--tp must be a positive integer"),
    bad("tp-float", ["--tp", "1.5"], "--tp must be a positive integer"),
    bad("tp-non-ascii-digit", ["--tp", "\u0661"], "--tp must be a positive integer"),
    bad("pp-zero", ["--pp", "0"], "--pp must be a positive integer"),
    bad("nnodes-zero", ["--nnodes", "0"], "--nnodes must be a positive integer"),
    bad("gpus-zero", ["--gpus-per-node", "0"], "--gpus-per-node must be a positive integer"),
    bad("train-iters-zero", ["--train-iters", "0"], "--train-iters must be a positive integer"),
    bad("save-interval-zero", ["--save-interval", "0"], "--save-interval must be a positive"),
    bad("fault-rank-negative", ["--fault-rank", "-1"], "--fault-rank must be a non-negative"),
    bad("fault-rank-word", ["--fault-rank", "one"], "--fault-rank must be a non-negative"),
    bad("max-restarts-negative", ["--max-restarts", "-1"], "--max-restarts must be a non-neg"),
    bad("env-tp-zero", env={"TP": "0"}, message="environment variable TP must be a positive"),
    bad("env-iters-word", env={"TRAIN_ITERS": "ten"}, message="TRAIN_ITERS must be a positive"),
    bad("env-nnodes-float", env={"NNODES": "1.5"}, message="NNODES must be a positive integer"),
    bad(
        "env-fault",
        env={"NVRX_DEMO_FAULT": "explode"},
        message="must be one of none, kill, hang, term, segv, exception, ckpt-worker",
    ),
    bad("env-fault-rank", env={"NVRX_FAULT_RANK": "-1"}, message="NVRX_FAULT_RANK must be a"),
    # --- integers beyond 64 bits ---------------------------------------------------------
    bad("tp-5000-digits", ["--tp", DIGITS_5000], "--tp must be at most 9223372036854775807"),
    bad("iters-5000-digits", ["--train-iters", DIGITS_5000], "--train-iters must be at most"),
    bad(
        "env-iters-5000-digits",
        env={"TRAIN_ITERS": DIGITS_5000},
        message="environment variable TRAIN_ITERS must be at most",
    ),
    bad("fault-rank-5000-digits", ["--fault-rank", DIGITS_5000], "--fault-rank must be at most"),
    bad("restarts-5000-digits", ["--max-restarts", DIGITS_5000], "--max-restarts must be at"),
    bad("iters-2-pow-63", ["--train-iters", str(2**63)], "--train-iters must be at most"),
    bad(
        "world-beyond-64-bit",
        ["--nnodes", str(INT64_MAX), "--run-id", "job1", "--rdzv-endpoint", "h:1"],
        "world size",
    ),
    # --- seconds -------------------------------------------------------------------------
    bad("oos-zero", ["--out-of-section-timeout", "0"], "must be a positive number of seconds"),
    bad("oos-negative", ["--out-of-section-timeout", "-5"], "must be a positive number of sec"),
    bad("oos-nan", ["--out-of-section-timeout", "nan"], "must be a positive number of seconds"),
    bad("oos-inf", ["--out-of-section-timeout", "inf"], "must be a positive number of seconds"),
    bad("oos-5000-digits", ["--out-of-section-timeout", DIGITS_5000], "number of seconds"),
    bad("oos-beyond-64-bit-ns", ["--out-of-section-timeout", "1e12"], "at most 9223372036"),
    bad("check-interval-zero", ["--workload-check-interval", "0"], "must be a positive number"),
    bad("section-timeouts-missing", ["--section-timeouts", "setup:900"], "missing step"),
    bad("section-timeouts-zero", ["--section-timeouts", "setup:0,step:1,checkpointing:1"], "pos"),
    bad(
        "section-timeouts-5000-digits",
        ["--section-timeouts", f"setup:{DIGITS_5000},step:1,checkpointing:1"],
        "section timeout 'setup'",
    ),
    bad("timeout-negative", ["--timeout", "-1"], "--timeout must be a positive number of seconds"),
    bad("timeout-zero", ["--timeout", "0"], "--timeout must be a positive number of seconds"),
    bad("timeout-nan", ["--timeout", "nan"], "--timeout must be a positive number of seconds"),
    bad("timeout-inf", ["--timeout", "inf"], "--timeout must be a positive number of seconds"),
    # --- a run timeout its faults cannot fit (settings/feasibility.py) ----------------------
    bad(
        "timeout-below-hang-restore",
        [*ONE_GPU, "--schedule", "kill@step,hang@restore", *SETUP_900, "--timeout", "500"],
        "hang@restore (fault 2 of 2) is detected only by the setup section's timeout (900 s);"
        " the run timeout 500 s cannot fit it: raise --timeout above ~922 s or lower setup in"
        " --section-timeouts (a lower-bound estimate: ",
    ),
    bad(
        "timeout-below-hang-restore-dry-run",
        [
            "--dry-run",
            *ONE_GPU,
            "--schedule",
            "kill@step,hang@restore",
            *SETUP_900,
            "--timeout",
            "500",
        ],
        "the run timeout 500 s cannot fit it: raise --timeout above ~922 s",
    ),
    bad(
        "timeout-below-hang-restore-two-ranks",
        ["--schedule", "kill@step,hang@restore", *SETUP_900, "--timeout", "500"],
        "or, sooner, by the other ranks' collective timeout (600 s: the workload's"
        " --distributed-timeout-minutes); the run timeout 500 s cannot fit it: raise --timeout"
        " above ~622 s",
    ),
    bad(
        "timeout-below-hang-step",
        [
            "--fault",
            "hang",
            "--section-timeouts",
            "setup:900,step:120,checkpointing:30",
            "--timeout",
            "100",
        ],
        "hang@step is detected only by the step section's timeout (120 s); the run timeout 100 s"
        " cannot fit it: raise --timeout above ~141 s or lower step in --section-timeouts",
    ),
    bad(
        "timeout-below-start-ups",
        ["--timeout", "5"],
        "the run timeout 5 s cannot fit the run of kill@step: the megatron workload's start-ups"
        " and restarts need ~21 s; raise --timeout above ~21 s",
    ),
    # --- choices -------------------------------------------------------------------------
    bad("fault-choice", ["--fault", "crash"], "invalid choice: 'crash'"),
    bad("workload-choice", ["--workload", "bert"], "invalid choice: 'bert'"),
    bad("window-choice", ["--window", "during"], "invalid choice: 'during'"),
    bad("window-empty", ["--window", ""], "invalid choice: ''"),
    # --- fault windows (issue #10) -----------------------------------------------------------
    bad("window-for-baseline", ["--fault", "none", "--window", "save"], "given for fault none"),
    bad(
        "window-for-env-baseline",
        ["--window", "step"],
        "window step given for fault none",
        env={"NVRX_DEMO_FAULT": "none"},
    ),
    bad("ckpt-worker-step", ["--fault", "ckpt-worker", "--window", "step"], "only in window fin"),
    bad("ckpt-worker-save", ["--fault", "ckpt-worker", "--window", "save"], "--window finalize"),
    bad(
        "reference-step-without-a-step-after-the-tracker",
        ["--workload", "reference", "--train-iters", "10"],
        "window step on the reference workload needs a training step after its tracker",
    ),
    bad(
        "reference-ckpt-worker-thread-writer",
        ["--workload", "reference", "--fault", "ckpt-worker", "--", "--async-writer", "thread"],
        "the recipe sets --async-writer=process itself",
    ),
    # --- the walkthrough's rules -----------------------------------------------------------
    bad("world-not-divisible", ["--gpus-per-node", "3", "--tp", "2"], "divisible by TP x PP"),
    bad("pp-not-dividing-layers", ["--gpus-per-node", "3", "--pp", "3"], "4 layers"),
    bad("tp-not-dividing-heads", ["--gpus-per-node", "3", "--tp", "3"], "8 attention heads"),
    bad("fault-rank-outside-world", ["--fault-rank", "2"], "not a rank of a world of size 2"),
    bad("one-gpu-fault-rank-1", ["--gpus-per-node", "1"], "set the fault rank to 0"),
    bad(
        "reference-one-rank",
        ["--workload", "reference", "--gpus-per-node", "1", "--fault", "none"],
        "at least 2 ranks",
    ),
    bad(
        "save-interval-above-iters",
        ["--save-interval", "50", "--train-iters", "10"],
        "interval 50 >= train",
    ),
    bad(
        "save-interval-equals-iters",
        ["--save-interval", "10", "--train-iters", "10"],
        "interval 10 >= train",
    ),
    bad("env-save-interval-100", env={"SAVE_INTERVAL": "100"}, message="interval 100 >= train"),
    # --- run ID ------------------------------------------------------------------------------
    bad("run-id-slash", ["--run-id", "a/b"], "letters, digits"),
    bad("run-id-space", ["--run-id", "a b"], "letters, digits"),
    bad("run-id-dotdot", ["--run-id", "../escape"], "letters, digits"),
    bad("run-id-non-ascii", ["--run-id", "l\u00e4uft"], "letters, digits"),
    bad("run-id-300-chars", ["--run-id", "r" * 300], "at most 255 characters"),
    bad("env-run-id-256-chars", env={"NVRX_RUN_ID": "r" * 256}, message="at most 255 characters"),
    bad("multinode-no-run-id", ["--nnodes", "2"], "same run ID", env={"NVRX_RUN_ID": None}),
    # --- rendezvous endpoint (multinode) ----------------------------------------------------
    bad("multinode-no-endpoint", MULTINODE, "rendezvous endpoint reachable from all nodes"),
    bad("endpoint-no-port", [*MULTINODE, "--rdzv-endpoint", "node1"], "host:port"),
    bad("endpoint-empty-port", [*MULTINODE, "--rdzv-endpoint", "node1:"], "host:port"),
    bad("endpoint-no-host", [*MULTINODE, "--rdzv-endpoint", ":29400"], "host:port"),
    bad("endpoint-port-word", [*MULTINODE, "--rdzv-endpoint", "node1:http"], "host:port"),
    bad("endpoint-port-70000", [*MULTINODE, "--rdzv-endpoint", "node1:70000"], "1 to 65535"),
    bad("endpoint-port-zero", [*MULTINODE, "--rdzv-endpoint", "node1:0"], "1 to 65535"),
    bad("endpoint-space", [*MULTINODE, "--rdzv-endpoint", "node 1:29400"], "host:port"),
    bad("endpoint-ipv6-unbracketed", [*MULTINODE, "--rdzv-endpoint", "fe80::1:29400"], "[addr]"),
    # one node too: torch would read these its own way (issue #36)
    bad("endpoint-empty-one-node", ["--rdzv-endpoint", ""], "endpoint '' is not host:port"),
    bad("endpoint-host-alone", ["--rdzv-endpoint", "nohostport"], "'nohostport' is not host:port"),
    # --- numbers of seconds as the integers are: ASCII digits (issue #36) ------------------
    bad("timeout-arabic-digit", ["--timeout", "\u0663.5"], "--timeout must be a positive number"),
    bad("timeout-fullwidth", ["--timeout", "\uff13"], "--timeout must be a positive number"),
    bad("timeout-underscore", ["--timeout", "1_0"], "--timeout must be a positive number"),
    bad("timeout-infinity-word", ["--timeout", "infinity"], "--timeout must be a positive number"),
    bad(
        "out-of-section-arabic",
        ["--out-of-section-timeout", "\u0663"],
        "--out-of-section-timeout must be a positive number",
    ),
    bad(
        "section-timeouts-arabic",
        ["--section-timeouts", "setup:\u0661,step:1,checkpointing:1"],
        "must be a positive number of seconds",
    ),
    bad("workload-interval-arabic", ["--workload-check-interval", "\u0661"], "positive number"),
    # --- paths with a control character: refused, shown quoted (issue #36) ----------------
    bad("work-dir-newline", ["--work-dir", "{tmp}/a\nb"], "holds the control character '\\n'"),
    bad("work-dir-escape", ["--work-dir", "{tmp}/a\x1b[2Jb"], "the control character '\\x1b'"),
    bad("ckpt-dir-escape", ["--checkpoint-dir", "{tmp}/c\x1b]0;x\x07"], "control character"),
    bad("megatron-newline", ["--megatron-path", "{meg}\n"], "holds the control character"),
    bad(
        "env-work-dir-newline",
        env={"NVRX_WORK_DIR": "{tmp}/a\nb"},
        message="environment variable NVRX_WORK_DIR '",
    ),
    # --- a checkpoint dir another run filled: its first cycle would resume it (issue #36) ---
    bad(
        "existing-ckpt-dir",
        ["--checkpoint-dir", "{tmp}/ck"],
        "holds another run's checkpoints (its tracker",
        setup="tracker-10",
    ),
    bad(
        "existing-ckpt-iter-dir",
        ["--checkpoint-dir", "{tmp}/ck"],
        "holds another run's checkpoints (iter_0000010/)",
        setup="iter-dir",
    ),
    bad("env-endpoint-garbage", MULTINODE, "host:port", env={"RDZV_ENDPOINT": "a:b:c"}),
    # --- log server port -----------------------------------------------------------------
    bad("log-port-negative", ["--log-server-port", "-1"], "1 to 65535"),
    bad("log-port-70000", ["--log-server-port", "70000"], "1 to 65535"),
    bad("log-port-zero", ["--log-server-port", "0"], "1 to 65535"),
    bad("log-port-5000-digits", ["--log-server-port", DIGITS_5000], "--log-server-port must be"),
    # --- extra arguments that override the recipe's own ---------------------------------------
    bad("extra-save-eq", ["--", "--save=/elsewhere"], "overrides the recipe's --save"),
    bad("extra-save", ["--", "--save", "/elsewhere"], "overrides the recipe's --save"),
    bad("extra-load-eq", ["--", "--load=/elsewhere"], "overrides the recipe's --load"),
    bad("extra-load", ["--", "--load", "/elsewhere"], "overrides the recipe's --load"),
    bad("extra-save-interval", ["--", "--save-interval=1"], "overrides the recipe's --save-int"),
    bad("extra-persistent-save", ["--", "--persistent-save-interval", "3"], "--save-interval"),
    bad("extra-train-iters", ["--", "--train-iters", "5"], "overrides the recipe's --train-iters"),
    bad("extra-tp-eq", ["--", "--tensor-model-parallel-size=2"], "--tensor-model-parallel-size"),
    bad("extra-pp", ["--", "--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel"),
    bad("extra-mp", ["--", "--model-parallel-size", "2"], "--tensor-model-parallel-size"),
    bad(
        "extra-reference-save",
        ["--workload", "reference", "--", "--seed", "1", "--save={tmp}/other"],
        "overrides the recipe's --save",
    ),
    # --- boolean environment values --------------------------------------------------------
    bad("dry-run-env-maybe", env={"NVRX_DRY_RUN": "maybe"}, message="NVRX_DRY_RUN must be"),
    bad("dry-run-env-2", env={"NVRX_DRY_RUN": "2"}, message="NVRX_DRY_RUN must be"),
    # --- Megatron path ---------------------------------------------------------------------
    bad("no-megatron", env={"MEGATRON_PATH": None}, message="needs a Megatron-LM checkout"),
    bad(
        "megatron-without-pretrain",
        ["--megatron-path", "{tmp}/empty"],
        "pretrain_gpt.py not found",
        setup="empty-dir",
    ),
    bad(
        "env-megatron-relative",
        env={"MEGATRON_PATH": "Megatron-LM"},
        message="Megatron path must be an absolute path",
    ),
    bad("megatron-relative", ["--megatron-path", "./Megatron-LM"], "must be an absolute path"),
    bad(
        "megatron-path-over-4096",
        ["--megatron-path", "{tmp}" + LONG_PATH_PARTS],
        "bytes",
    ),
    # --- work dir / checkpoint dir / run dir on the file system -------------------------------
    bad("no-work-dir", env={"NVRX_WORK_DIR": None}, message="no work directory"),
    bad("work-relative", ["--work-dir", "rel/work"], "absolute path, got 'rel/work'"),
    bad("ckpt-relative", ["--checkpoint-dir", "ckpt"], "checkpoint dir must be an absolute path"),
    bad("work-is-file", ["--work-dir", "{tmp}/afile"], "not a directory", setup="file"),
    bad("work-under-file", ["--work-dir", "{tmp}/afile/w"], "not a directory", setup="file"),
    bad("ckpt-is-file", ["--checkpoint-dir", "{tmp}/afile"], "not a directory", setup="file"),
    bad("ckpt-under-file", ["--checkpoint-dir", "{tmp}/afile/c"], "not a directory", setup="file"),
    bad("work-symlink-loop", ["--work-dir", "{tmp}/loop"], "symbolic link loop", setup="loop"),
    bad("ckpt-symlink-loop", ["--checkpoint-dir", "{tmp}/loop/c"], "symbolic link", setup="loop"),
    bad("work-dangling-link", ["--work-dir", "{tmp}/dangling"], "dangling", setup="dangling"),
    bad("work-path-over-4096", ["--work-dir", "{tmp}" + LONG_PATH_PARTS], "bytes"),
    bad("ckpt-path-over-4096", ["--checkpoint-dir", "{tmp}" + LONG_PATH_PARTS], "bytes"),
    bad("work-component-over-255", ["--work-dir", "{tmp}/" + "c" * 300], "255 bytes"),
    bad("work-in-proc", ["--work-dir", "/proc/self/nvrx-work"], "pseudo file system"),
    bad("work-in-sys", ["--work-dir", "/sys/kernel/nvrx-work"], "pseudo file system"),
    bad("ckpt-in-proc", ["--checkpoint-dir", "/proc/nvrx-ckpt"], "pseudo file system"),
    bad("work-is-dev-null", ["--work-dir", "/dev/null"], "not a directory"),
    bad("work-immutable", ["--work-dir", "{tmp}/imm/w"], "not writable", setup="immutable"),
    bad("ckpt-immutable", ["--checkpoint-dir", "{tmp}/imm"], "not writable", setup="immutable"),
    bad("run-dir-is-file", [], "not a directory", setup="run-dir-file"),
    # --- what earlier runs left behind ---------------------------------------------------------
    bad("existing-marker", [], "already has an injection marker", setup="marker"),
    bad("existing-ft-state", [], "ft_state.json", setup="ft-state"),
    bad("reused-run-dir", [], "was used before", setup="used"),
    bad("tracker-empty", ["--checkpoint-dir", "{tmp}/ck"], "is empty", setup="tracker-empty"),
    bad("tracker-word", ["--checkpoint-dir", "{tmp}/ck"], "not hold an integer", setup="tracker"),
]

GOOD: list[Case] = [
    good("defaults", ["--dry-run"]),
    good("dry-run-env-1", env={"NVRX_DRY_RUN": "1"}),
    good("dry-run-env-true", env={"NVRX_DRY_RUN": "true"}),
    good("dry-run-env-yes", env={"NVRX_DRY_RUN": "yes"}),
    good("dry-run-env-on-upper", env={"NVRX_DRY_RUN": " ON "}),
    good("dry-run-flag-env-false", ["--dry-run"], env={"NVRX_DRY_RUN": "false"}),
    good("dry-run-flag-env-empty", ["--dry-run"], env={"NVRX_DRY_RUN": ""}),
    good("dry-run-env-no-launches", env={"NVRX_DRY_RUN": "no"}, outcome="launch"),
    good("dry-run-env-0-launches", env={"NVRX_DRY_RUN": "0"}, outcome="launch"),
    good("iters-int64-max", ["--dry-run", "--train-iters", str(INT64_MAX)]),
    good("save-interval-below-iters", ["--dry-run", "--save-interval", "9", "--train-iters", "10"]),
    good(
        "baseline-without-checkpoint",
        ["--dry-run", "--fault", "none", "--save-interval", "50", "--train-iters", "10"],
    ),
    good("run-id-255-chars", ["--dry-run", "--run-id", "r" * 255]),
    good("multinode-endpoint", ["--dry-run", *MULTINODE, "--rdzv-endpoint", "node1:29400"]),
    good("multinode-ipv6", ["--dry-run", *MULTINODE, "--rdzv-endpoint", "[fe80::1]:29400"]),
    good("single-node-endpoint", ["--dry-run", "--rdzv-endpoint", "localhost:29500"]),
    good("log-port", ["--dry-run", "--log-server-port", "65535"]),
    good("timeout", ["--dry-run", "--timeout", "60.5"]),
    good(
        "timeout-fits-hang-restore",
        [
            "--dry-run",
            *ONE_GPU,
            "--schedule",
            "kill@step,hang@restore",
            "--section-timeouts",
            "setup:150,step:30,checkpointing:30",
            "--timeout",
            "500",
        ],
    ),
    good(
        "timeout-fits-hang-restore-after-the-budget",
        [
            "--dry-run",
            *ONE_GPU,
            "--schedule",
            "kill@step,hang@restore",
            *SETUP_900,
            "--max-restarts",
            "0",
            "--timeout",
            "500",
        ],
    ),
    good("extra-args", ["--dry-run", "--", "--seed", "7", "--save-retain-interval", "10"]),
    good("extra-load-prefix", ["--dry-run", "--", "--load-main-params-from-ckpt"]),
    good("work-dir-symlink", ["--dry-run", "--work-dir", "{tmp}/link"], setup="dir-link"),
    good("reference", ["--dry-run", "--workload", "reference", "--train-iters", "12"]),
    good("window-finalize", ["--dry-run", "--window", "finalize"]),
    good("exception-save", ["--dry-run", "--fault", "exception", "--window", "save"]),
    good("ckpt-worker-default-window", ["--dry-run", "--fault", "ckpt-worker"]),
    good("save-window-final-save", ["--dry-run", "--window", "save", "--train-iters", "6"]),
    good(
        "reference-save-window-final-save",
        ["--dry-run", "--workload", "reference", "--window", "save", "--train-iters", "6"],
    ),
    good(
        "reference-step-no-ft",
        ["--dry-run", "--workload", "reference", "--train-iters", "10", "--", "--no-ft"],
    ),
    good(
        "reference-ckpt-worker",
        ["--dry-run", "--workload", "reference", "--fault", "ckpt-worker", "--window", "finalize"],
    ),
]


def _params(cases: list[Case]) -> list[Any]:
    return [pytest.param(c, id=c.id) for c in cases]


# --------------------------------------------------------------------------------------------
# the file-system situations


def _chattr(flag: str, path: Path) -> bool:
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    return subprocess.run([chattr, flag, str(path)], capture_output=True).returncode == 0


def _immutable(tmp: Path, cleanups: Cleanups) -> None:
    imm = tmp / "imm"
    imm.mkdir()
    if not _chattr("+i", imm):
        pytest.skip("chattr +i is not available here (needs CAP_LINUX_IMMUTABLE)")
    cleanups.append(lambda: _chattr("-i", imm))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _dir_link(tmp: Path, _: Cleanups) -> None:
    (tmp / "real").mkdir()
    (tmp / "link").symlink_to(tmp / "real")


RUN = Path("work") / "runs" / "r1"
TRACKER = Path("ck") / "latest_checkpointed_iteration.txt"

SETUPS: dict[str, Callable[[Path, Cleanups], None]] = {
    "file": lambda tmp, _: _write(tmp / "afile", "a file\n"),
    "empty-dir": lambda tmp, _: (tmp / "empty").mkdir(),
    "loop": lambda tmp, _: (tmp / "loop").symlink_to("loop"),
    "dangling": lambda tmp, _: (tmp / "dangling").symlink_to(tmp / "nowhere"),
    "dir-link": _dir_link,
    "immutable": _immutable,
    "run-dir-file": lambda tmp, _: _write(tmp / RUN, "x"),
    "marker": lambda tmp, _: _write(tmp / RUN / "fault_injected.json", "{}"),
    "ft-state": lambda tmp, _: _write(tmp / RUN / "checkpoints" / "ft_state.json", "{}"),
    "used": lambda tmp, _: _write(tmp / RUN / "logs" / "train_cycle0.log", "old\n"),
    "tracker-empty": lambda tmp, _: _write(tmp / TRACKER, ""),
    "tracker": lambda tmp, _: _write(tmp / TRACKER, "five\n"),
    "tracker-10": lambda tmp, _: _write(tmp / TRACKER, "10\n"),
    "iter-dir": lambda tmp, _: (tmp / "ck" / "iter_0000010").mkdir(parents=True),
}


# --------------------------------------------------------------------------------------------
# harness


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Guards: a bad input must never reach the stack probe or the launcher (each records its
    name and raises)."""
    import pytest_nvrx.launch.launcher
    import pytest_nvrx.launch.planning

    reached: list[str] = []

    def guard(name: str) -> Callable[..., Any]:
        def would_launch(*args: Any, **kwargs: Any) -> Any:
            reached.append(name)
            raise WouldLaunch(f"reached {name}")

        return would_launch

    monkeypatch.setattr(pytest_nvrx.launch.planning, "detect_stack", guard("the stack probe"))
    monkeypatch.setattr(pytest_nvrx.launch.launcher, "Launch", guard("the launcher"))
    monkeypatch.setattr(cli, "Launch", guard("the launcher"), raising=False)
    return reached


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths resolve in the test's own directory (where a Megatron-LM stub lives)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def cleanups() -> Iterator[Cleanups]:
    todo: Cleanups = []
    yield todo
    for undo in reversed(todo):
        undo()


def _fill(text: str, tmp: Path, megatron: Path) -> str:
    return text.replace("{tmp}", str(tmp)).replace("{meg}", str(megatron))


def _environ(case: Case, tmp: Path, megatron: Path) -> dict[str, str]:
    env: dict[str, str | None] = {
        "MEGATRON_PATH": str(megatron),
        "NVRX_WORK_DIR": str(tmp / "work"),
        "NVRX_RUN_ID": "r1",
        **case.env,
    }
    return {k: _fill(v, tmp, megatron) for k, v in env.items() if v is not None}


def run_cli(
    case: Case, tmp: Path, megatron: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int | str | None, str, str]:
    argv = ["run", *(_fill(a, tmp, megatron) for a in case.argv)]
    try:
        status: int | str | None = cli.main(argv, _environ(case, tmp, megatron))
    except SystemExit as exc:  # argparse refuses with SystemExit(2)
        status = exc.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("case", _params(BAD))
def test_bad_input_is_refused_before_anything_is_written(
    case: Case,
    tmp_path: Path,
    megatron_stub: Path,
    capsys: pytest.CaptureFixture[str],
    cleanups: Cleanups,
    launched: list[str],
) -> None:
    if case.setup is not None:
        SETUPS[case.setup](tmp_path, cleanups)
    before = snapshot(tmp_path)
    status, out, err = run_cli(case, tmp_path, megatron_stub, capsys)
    assert not launched, f"accepted: {launched[0]} was reached"
    assert status == 2, f"exit {status!r}; stderr: {err[-400:]}"
    assert case.message is not None and case.message in err, err[-600:]
    assert "Traceback" not in err
    # one short message: nothing echoes a 5000-digit value or a 4 kB path back whole
    assert len(err) < 2000, f"{len(err)} characters of stderr"
    assert out == ""
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", _params(GOOD))
def test_good_input_passes(
    case: Case,
    tmp_path: Path,
    megatron_stub: Path,
    capsys: pytest.CaptureFixture[str],
    cleanups: Cleanups,
    launched: list[str],
) -> None:
    if case.setup is not None:
        SETUPS[case.setup](tmp_path, cleanups)
    if case.outcome == "launch":
        with pytest.raises(WouldLaunch):
            run_cli(case, tmp_path, megatron_stub, capsys)
        assert launched
        return
    status, out, err = run_cli(case, tmp_path, megatron_stub, capsys)
    assert status == 0, err[-600:]
    assert not launched
    lines = out.splitlines()
    assert lines[0].startswith("Run artifacts: ") and "ft_launcher --nnodes=" in lines[2]


def test_table_holds_every_kind() -> None:
    """The issue's author tried 81 bad inputs; the table holds at least as many kinds."""
    assert len(BAD) >= 81
    assert len({c.id for c in BAD + GOOD}) == len(BAD) + len(GOOD)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--train-iters", DIGITS_5000], {}, "--train-iters must be at most"),
        ([], {"MEGATRON_PATH": "Megatron-LM"}, "Megatron path must be an absolute path"),
        (["--", "--save=/elsewhere"], {}, "overrides the recipe's --save"),
        (
            [*ONE_GPU, "--schedule", "kill@step,hang@restore", *SETUP_900, "--timeout", "500"],
            {},
            "the run timeout 500 s cannot fit it: raise --timeout above ~922 s or lower setup in"
            " --section-timeouts",
        ),
    ],
    ids=["5000-digits", "relative-megatron", "extra-save", "timeout-below-hang-restore"],
)
def test_module_entry_point_refuses(
    tmp_path: Path, megatron_stub: Path, argv: list[str], env: dict[str, str], message: str
) -> None:
    """The real entry point, in its own process: exit 2, one line, nothing written."""
    full_env = {
        "PATH": "/usr/bin:/bin",
        "MEGATRON_PATH": str(megatron_stub),
        "NVRX_WORK_DIR": str(tmp_path / "work"),
        "NVRX_RUN_ID": "r1",
        **env,
    }
    before = snapshot(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "run", *argv],
        cwd=tmp_path,
        env={**full_env, "PYTHONPATH": str(Path(cli.__file__).parents[1])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr[-600:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
    assert snapshot(tmp_path) == before
