"""Argv construction against the walkthrough's script, the manifest, and the `run` CLI."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx import cli
from pytest_nvrx.launch.ports import ephemeral_range
from pytest_nvrx.launch.recipe import (
    INJECTOR_PATH,
    NO_TE_PROFILE,
    EnvOrigin,
    WorkerEnvVar,
    build_recipe,
    manifest,
)
from pytest_nvrx.launch.run_dir_setup import check_fresh_run_dir
from pytest_nvrx.settings import ConfigError, RunConfig
from tests.helpers.files import snapshot


def walkthrough_command(
    *,
    nnodes: int,
    gpus: int,
    tp: int,
    pp: int,
    run_id: str,
    rdzv: str,
    run_dir: Path,
    megatron: Path,
    fault: str = "kill",
    fault_rank: int = 1,
    iters: int = 100,
    save: int = 5,
) -> tuple[list[str], list[str], list[str]]:
    """Our transcription of run_megatron_gpt.sh's arrays: launcher, wrapper, Megatron args."""
    ckpt = run_dir / "checkpoints"
    launcher = [
        "ft_launcher",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={gpus}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv}",
        f"--rdzv-id={run_id}",
        "--max-restarts=3",
        "--ft-rank-section-timeouts=setup:900,step:120,checkpointing:600",
        "--ft-rank-out-of-section-timeout=180",
        f"--ft-checkpoint-iteration-file={ckpt}/latest_checkpointed_iteration.txt",
        f"--ft-cycle-info-dir={run_dir}/cycle_infos",
        f"--ft-per-cycle-applog-prefix={run_dir}/logs/train.log",
        f"--ft-nvrx-logfile={run_dir}/logs/launcher.log",
    ]
    wrapper = [
        f"--checkpoint-dir={ckpt}",
        f"--fault-marker={run_dir}/fault_injected.json",
        f"--fault={fault}",
        f"--fault-rank={fault_rank}",
    ]
    if fault != "none":
        # our addition (issue #10): the fault's window, explicit even at its default
        wrapper.append("--window=step")
    world = nnodes * gpus
    megatron_args = [
        "--enable-ft-package",
        "--ft-num-warmup-iters=0",
        "--mock-data",
        "--tokenizer-type=NullTokenizer",
        "--vocab-size=1024",
        "--num-layers=4",
        "--hidden-size=512",
        "--num-attention-heads=8",
        "--seq-length=256",
        "--max-position-embeddings=256",
        f"--tensor-model-parallel-size={tp}",
        f"--pipeline-model-parallel-size={pp}",
        "--micro-batch-size=1",
        f"--global-batch-size={world}",
        f"--train-iters={iters}",
        "--lr=0.0001",
        "--lr-decay-style=constant",
        "--bf16",
        "--use-distributed-optimizer",
        f"--load={ckpt}",
        f"--save={ckpt}",
        f"--save-interval={save}",
        "--ckpt-format=torch_dist",
        "--async-save",
        "--use-persistent-ckpt-worker",
        "--eval-iters=0",
        "--log-interval=1",
    ]
    return launcher, wrapper, megatron_args


def split_ours(argv: list[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """Split our argv into launcher / wrapper / entry / workload parts."""
    i = argv.index(str(INJECTOR_PATH))
    launcher, rest = argv[:i], argv[i + 1 :]
    dashdash = rest.index("--")
    head, workload = rest[:dashdash], rest[dashdash + 1 :]
    entry_at = head.index("--script") if "--script" in head else head.index("--module")
    return launcher, head[:entry_at], head[entry_at:], workload


SHAPES = [
    pytest.param({"nnodes": 1, "gpus": 2, "tp": 1, "pp": 1}, id="default"),
    pytest.param({"nnodes": 1, "gpus": 1, "tp": 1, "pp": 1, "fault_rank": 0}, id="one-gpu"),
    pytest.param({"nnodes": 2, "gpus": 4, "tp": 2, "pp": 2}, id="tp2-pp2-multinode"),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_argv_matches_walkthrough(
    tmp_path: Path, megatron_stub: Path, shape: dict[str, int]
) -> None:
    rdzv = "node0:29400" if shape["nnodes"] > 1 else "localhost:0"
    config = RunConfig(
        work_dir=tmp_path,
        run_id="gpt-recovery-001",
        megatron_path=megatron_stub,
        nnodes=shape["nnodes"],
        gpus_per_node=shape["gpus"],
        tp=shape["tp"],
        pp=shape["pp"],
        fault_rank=shape.get("fault_rank", 1),
        rdzv_endpoint=rdzv,
    )
    recipe = build_recipe(config, port=45678)
    want_launcher, want_wrapper, want_megatron = walkthrough_command(
        nnodes=shape["nnodes"],
        gpus=shape["gpus"],
        tp=shape["tp"],
        pp=shape["pp"],
        run_id="gpt-recovery-001",
        rdzv=rdzv,
        run_dir=config.run_dir,
        megatron=megatron_stub,
        fault_rank=shape.get("fault_rank", 1),
    )
    launcher, wrapper, entry, workload = split_ours(recipe.argv)
    # documented addition: each run gets its own log server port
    assert launcher == [*want_launcher, "--ft-log-server-port=45678"]
    assert wrapper == want_wrapper
    assert entry == ["--script", str(megatron_stub / "pretrain_gpt.py")]
    # documented addition: core 0.19 needs --eval-interval
    assert workload == [*want_megatron, "--eval-interval=100"]
    assert recipe.env["TMPDIR"] == str(config.layout.tmp)
    assert len(recipe.env["TMPDIR"]) + len("/_ft_launcher4194304_rmon127.socket") < 108
    assert recipe.profile == "default"


def test_no_te_profile_and_no_distributed_optimizer(tmp_path: Path, megatron_stub: Path) -> None:
    config = RunConfig(
        work_dir=tmp_path, run_id="r", megatron_path=megatron_stub, distributed_optimizer=False
    )
    recipe = build_recipe(config, no_te=True, port=1)
    assert recipe.profile == "no-te"
    assert list(recipe.workload_argv[-len(NO_TE_PROFILE) :]) == [
        "--transformer-impl=local",
        "--no-gradient-accumulation-fusion",
        "--no-persist-layer-norm",
        "--no-masked-softmax-fusion",
    ]
    assert "--use-distributed-optimizer" not in recipe.workload_argv
    # an explicit setting beats the stack's verdict
    forced = RunConfig(
        work_dir=tmp_path, run_id="r", megatron_path=megatron_stub, no_te_profile=False
    )
    assert build_recipe(forced, no_te=True, port=1).profile == "default"


def test_reference_workload_argv(tmp_path: Path) -> None:
    config = RunConfig(work_dir=tmp_path, run_id="r", workload="reference", train_iters=30)
    recipe = build_recipe(config, port=1)
    _, _, entry, workload = split_ours(recipe.argv)
    assert entry == ["--module", "pytest_nvrx.workloads.reference"]
    assert "--train-iters=30" in workload
    assert f"--save={config.layout.checkpoint_dir}" in workload


@pytest.mark.parametrize(
    ("fault", "window", "want"),
    [
        ("kill", None, ["--fault=kill", "--fault-rank=1", "--window=step"]),
        ("hang", "finalize", ["--fault=hang", "--fault-rank=1", "--window=finalize"]),
        ("exception", "save", ["--fault=exception", "--fault-rank=1", "--window=save"]),
        ("ckpt-worker", "finalize", ["--fault=ckpt-worker", "--fault-rank=1", "--window=finalize"]),
        ("none", None, ["--fault=none", "--fault-rank=1"]),
    ],
)
def test_injector_gets_the_window(
    tmp_path: Path, megatron_stub: Path, fault: str, window: str | None, want: list[str]
) -> None:
    config = RunConfig(
        work_dir=tmp_path,
        run_id="r",
        megatron_path=megatron_stub,
        fault=fault,  # type: ignore[arg-type]
        window=window,  # type: ignore[arg-type]
    )
    recipe = build_recipe(config, port=1)
    _, wrapper, _, workload = split_ours(recipe.argv)
    assert wrapper[2:] == want
    # Megatron always writes through NVRx's persistent worker; the reference option is not
    # Megatron's
    assert "--use-persistent-ckpt-worker" in workload
    assert not any(a.startswith("--async-writer") for a in workload)
    assert manifest(recipe)["config"]["window"] == (None if fault == "none" else want[-1][9:])


@pytest.mark.parametrize(
    ("fault", "window", "writer"),
    [
        ("ckpt-worker", "finalize", ["--async-writer=process"]),
        ("kill", "finalize", []),
        ("none", None, []),
    ],
)
def test_reference_writes_through_a_worker_process_for_ckpt_worker(
    tmp_path: Path, fault: str, window: str | None, writer: list[str]
) -> None:
    config = RunConfig(
        work_dir=tmp_path,
        run_id="r",
        workload="reference",
        fault=fault,  # type: ignore[arg-type]
        window=window,  # type: ignore[arg-type]
    )
    _, _, _, workload = split_ours(build_recipe(config, port=1).argv)
    assert [a for a in workload if a.startswith("--async-writer")] == writer


def test_ckpt_worker_defaults_to_its_only_window(tmp_path: Path) -> None:
    config = RunConfig(work_dir=tmp_path, run_id="r", workload="reference", fault="ckpt-worker")
    assert config.fault_window == "finalize"
    assert "--window=finalize" in build_recipe(config, port=1).workload_argv
    assert RunConfig(work_dir=tmp_path, run_id="r", fault="exception").fault_window == "step"
    assert RunConfig(work_dir=tmp_path, run_id="r", fault="none").fault_window is None


def test_dry_run_shows_the_window(
    tmp_path: Path, megatron_stub: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**WALKTHROUGH_ENV, "MEGATRON_PATH": str(megatron_stub), "NVRX_WORK_DIR": str(tmp_path)}
    argv = ["run", "--workload", "reference", "--fault", "ckpt-worker", "--window", "finalize"]
    assert cli.main(argv, env) == 0
    words = shlex.split(capsys.readouterr().out.splitlines()[2])
    _, wrapper, entry, workload = split_ours(words[3:])
    assert wrapper[2:] == ["--fault=ckpt-worker", "--fault-rank=1", "--window=finalize"]
    assert entry == ["--module", "pytest_nvrx.workloads.reference"]
    assert workload[-1] == "--async-writer=process"


def test_extra_args_come_last(tmp_path: Path, megatron_stub: Path) -> None:
    config = RunConfig(
        work_dir=tmp_path, run_id="r", megatron_path=megatron_stub, extra_args=("--seed", "7")
    )
    assert build_recipe(config, port=1).argv[-2:] == ["--seed", "7"]


def test_multinode_port_is_shared_by_run_id(tmp_path: Path, megatron_stub: Path) -> None:
    def port(run_id: str) -> int:
        c = RunConfig(
            work_dir=tmp_path,
            run_id=run_id,
            megatron_path=megatron_stub,
            nnodes=2,
            rdzv_endpoint="h:1",
        )
        return build_recipe(c).log_server_port

    assert port("job-1") == port("job-1")
    # below Linux's default ephemeral range (32768-60999): no connection on a node takes it
    assert 20000 <= port("job-2") < 32768


def test_one_node_log_server_port_is_free_and_outside_the_ephemeral_range(
    tmp_path: Path, megatron_stub: Path
) -> None:
    """The launcher binds it moments later: no connection on this host may take it meanwhile."""
    low, high = ephemeral_range()
    config = RunConfig(work_dir=tmp_path, run_id="r", megatron_path=megatron_stub)
    for _ in range(20):
        port = build_recipe(config).log_server_port
        assert not low <= port <= high, (port, low, high)


def test_manifest_holds_what_a_verifier_needs(tmp_path: Path, megatron_stub: Path) -> None:
    config = RunConfig(work_dir=tmp_path, run_id="r", megatron_path=megatron_stub)
    recipe = build_recipe(config, port=4)
    man = manifest(recipe, stack={"torch": "2.x"})
    json.dumps(man)  # JSON-ready
    assert man["config"]["train_iters"] == 100
    assert man["config"]["fault"] == "kill"
    assert man["config"]["checkpoint_dir"] == str(config.run_dir / "checkpoints")
    assert man["launcher_argv"] == list(recipe.launcher_argv)
    assert man["workload_argv"] == list(recipe.workload_argv)
    assert shlex.split(man["command"])[3:] == recipe.argv
    assert man["host"] and man["start_time"].endswith("+00:00")
    assert man["stack"] == {"torch": "2.x"}
    assert man["profile"] == "default" and man["worker_env"] == []
    # the injector logs rank 0's tracker readings: a verifier requires them (required_evidence)
    assert man["tracker_readings"] is True


def test_manifest_records_the_worker_env(tmp_path: Path, megatron_stub: Path) -> None:
    config = RunConfig(work_dir=tmp_path, run_id="r", megatron_path=megatron_stub, tp=2)
    demanded = WorkerEnvVar(
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "1",
        EnvOrigin.RECIPE,
        "megatron/training/arguments.py:1437",
        "args.tensor_model_parallel_size > 1",
        "tensor_model_parallel_size=2",
    )
    recipe = build_recipe(config, port=4).with_worker_env([demanded])
    assert recipe.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert recipe.shell_command().startswith("CUDA_DEVICE_MAX_CONNECTIONS=1 NVRX_RUN_ID=r ")
    man = json.loads(json.dumps(manifest(recipe)))
    assert man["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert man["worker_env"] == [
        {
            "name": "CUDA_DEVICE_MAX_CONNECTIONS",
            "value": "1",
            "origin": "pytest-nvrx",
            "where": "megatron/training/arguments.py:1437",
            "condition": "args.tensor_model_parallel_size > 1",
            "reason": "tensor_model_parallel_size=2",
        }
    ]
    # the workload's own arguments are what the validation sees
    assert recipe.worker_args[0] == "--enable-ft-package"
    assert "--tensor-model-parallel-size=2" in recipe.worker_args


# --- the `run` command -------------------------------------------------------------------------

WALKTHROUGH_ENV = {
    "NVRX_RUN_ID": "gpt-recovery-001",
    "GPUS_PER_NODE": "2",
    "NVRX_DRY_RUN": "1",
}


def test_dry_run_with_walkthrough_env(
    tmp_path: Path, megatron_stub: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**WALKTHROUGH_ENV, "MEGATRON_PATH": str(megatron_stub), "NVRX_WORK_DIR": str(tmp_path)}
    assert cli.main(["run"], env) == 0
    out = capsys.readouterr().out.splitlines()
    run_dir = tmp_path / "runs" / "gpt-recovery-001"
    assert out[0] == f"Run artifacts: {run_dir}"
    assert out[1] == f"Checkpoint directory: {run_dir / 'checkpoints'}"
    words = shlex.split(out[2])
    assert words[:3] == [
        "NVRX_RUN_ID=gpt-recovery-001",
        "PYTHONUNBUFFERED=1",
        f"TMPDIR={RunConfig(work_dir=tmp_path, run_id='gpt-recovery-001').layout.tmp}",
    ]
    want_launcher, want_wrapper, want_megatron = walkthrough_command(
        nnodes=1,
        gpus=2,
        tp=1,
        pp=1,
        run_id="gpt-recovery-001",
        rdzv="localhost:0",
        run_dir=run_dir,
        megatron=megatron_stub,
    )
    launcher, wrapper, _, workload = split_ours(words[3:])
    assert launcher[:-1] == want_launcher and launcher[-1].startswith("--ft-log-server-port=")
    assert wrapper == want_wrapper
    assert workload == [*want_megatron, "--eval-interval=100"]
    # the walkthrough's script makes the artifact dirs before its dry-run exit; ours writes
    # nothing (#23: verify then called the empty tree "not a run directory")
    assert list(tmp_path.iterdir()) == [megatron_stub]


def test_options_override_env(
    tmp_path: Path,
    megatron_stub: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    env = {**WALKTHROUGH_ENV, "MEGATRON_PATH": str(megatron_stub), "NVRX_WORK_DIR": str(tmp_path)}
    argv = ["run", "--tp", "2", "--fault", "hang", "--train-iters", "20", "--", "--seed", "3"]
    assert cli.main(argv, env) == 0
    cmd = capsys.readouterr().out.splitlines()[2]
    assert "--tensor-model-parallel-size=2" in cmd and "--fault=hang" in cmd
    assert "--train-iters=20" in cmd and cmd.endswith("--seed 3")
    # TP=2: the workers' environment has what Megatron's validation demands (the stub checkout
    # cannot be read: the documented rule of core_v0.19.0), in front of the command
    assert shlex.split(cmd)[0] == "CUDA_DEVICE_MAX_CONNECTIONS=1"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["run", "--tp", "0"], {}, "--tp must be a positive integer"),
        (["run"], {"TP": "x"}, "environment variable TP must be a positive integer"),
        (["run", "--work-dir", "relative"], {}, "work dir must be an absolute path"),
        (["run", "--run-id", "a/b"], {}, "letters, digits"),
        (["run", "--gpus-per-node", "1"], {}, "set the fault rank to 0"),
        (["run", "--nnodes", "2", "--run-id", "x"], {}, "rendezvous endpoint"),
        (["run", "--fault", "kill", "--window", "during"], {}, "invalid choice: 'during'"),
        (["run", "--fault", "none", "--window", "save"], {}, "fault none: a baseline"),
        (["run", "--fault", "ckpt-worker", "--window", "step"], {}, "only in window finalize"),
    ],
)
def test_bad_input_exits_2_and_launches_nothing(
    tmp_path: Path,
    megatron_stub: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    import pytest_nvrx.launch.launcher

    def refuse(*a: Any, **k: Any) -> None:
        raise AssertionError("launched despite bad input")

    monkeypatch.setattr(pytest_nvrx.launch.launcher, "Launch", refuse)
    monkeypatch.setattr(cli, "Launch", refuse)
    full_env = {"MEGATRON_PATH": str(megatron_stub), "NVRX_WORK_DIR": str(tmp_path / "w"), **env}
    before = snapshot(tmp_path)
    try:
        status = cli.main(argv, full_env)
    except SystemExit as exc:  # argparse's own refusals (choices)
        status = exc.code  # type: ignore[assignment]
    assert status == 2
    assert message in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_module_entry_point_dry_run(tmp_path: Path, megatron_stub: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "MEGATRON_PATH": str(megatron_stub),
        "NVRX_WORK_DIR": str(tmp_path),
        "NVRX_RUN_ID": "x1",
        "NVRX_DRY_RUN": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "run"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "ft_launcher --nnodes=1" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "run", "--save-interval", "0"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--save-interval must be a positive integer" in bad.stderr


# --- issue #9: file-system errors are ConfigErrors, bad ports refused ----------------------------


@pytest.mark.parametrize("kind", ["fifo", "dangling-link", "empty-dir"])
def test_anything_at_run_json_means_used(tmp_path: Path, kind: str) -> None:
    """A FIFO, a link or a folder where run.json goes is another launch's leftover, not a
    fresh run dir (before: only a regular file counted, and the launch failed later)."""
    layout = RunConfig(work_dir=tmp_path, run_id="r").layout
    layout.run_dir.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(layout.manifest)
    elif kind == "dangling-link":
        layout.manifest.symlink_to(tmp_path / "nowhere")
    else:
        layout.manifest.mkdir()
    with pytest.raises(ConfigError, match=r"was used before \(run\.json\)"):
        check_fresh_run_dir(layout)


def test_empty_artifact_dirs_are_fresh(tmp_path: Path) -> None:
    layout = RunConfig(work_dir=tmp_path, run_id="r").layout
    for d in (layout.logs, layout.cycle_infos):
        d.mkdir(parents=True)
    check_fresh_run_dir(layout)
    (layout.logs / "train_cycle0.log").write_text("x")
    with pytest.raises(ConfigError, match=r"was used before \(logs\)"):
        check_fresh_run_dir(layout)


@pytest.mark.parametrize("port", [0, -1, 65536, 70000])
def test_bad_log_server_port_refused(tmp_path: Path, megatron_stub: Path, port: int) -> None:
    config = RunConfig(work_dir=tmp_path, run_id="r", megatron_path=megatron_stub)
    with pytest.raises(ConfigError, match="--log-server-port must be a port number from 1 to"):
        build_recipe(config, port=port)
