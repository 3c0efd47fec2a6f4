"""Every validation rule of the walkthrough: refused with a clear message, nothing written."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.evidence.tracker import read_tracker
from pytest_nvrx.launch.run_dir_setup import file_system_at, prepare_run_dir, read_baseline
from pytest_nvrx.launch.run_dir_setup import validate_run as validate
from pytest_nvrx.settings import (
    INT64_MAX,
    ConfigError,
    PartialRunConfig,
    RunConfig,
    SectionTimeouts,
    check_extra_args,
    check_port,
    check_rdzv_endpoint,
    dry_run_requested,
    parse_bool,
    parse_port,
    parse_seconds,
    parse_value,
    quote,
    resolve,
)
from tests.helpers.files import snapshot


def make(tmp_path: Path, megatron: Path, **kw: Any) -> RunConfig:
    base: dict[str, Any] = {
        "work_dir": tmp_path / "work",
        "run_id": "r1",
        "megatron_path": megatron,
    }
    base.update(kw)
    return RunConfig(**base)


def test_defaults_are_the_walkthroughs(tmp_path: Path, megatron_stub: Path) -> None:
    c = make(tmp_path, megatron_stub)
    assert (c.nnodes, c.gpus_per_node, c.tp, c.pp) == (1, 2, 1, 1)
    assert (c.train_iters, c.save_interval, c.fault, c.fault_rank) == (100, 5, "kill", 1)
    assert c.section_timeouts.render() == "setup:900,step:120,checkpointing:600"
    assert c.out_of_section_timeout == 180 and c.max_restarts == 3
    assert c.rdzv_endpoint == "localhost:0"
    assert c.layout.checkpoint_dir == tmp_path / "work" / "runs" / "r1" / "checkpoints"
    validate(c)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"nnodes": 0}, "nnodes must be a positive integer"),
        ({"gpus_per_node": -1}, "gpus_per_node must be a positive integer"),
        ({"tp": 0}, "tp must be a positive integer"),
        ({"pp": 0}, "pp must be a positive integer"),
        ({"train_iters": 0}, "train_iters must be a positive integer"),
        ({"save_interval": 0}, "save_interval must be a positive integer"),
        ({"gpus_per_node": 3, "tp": 2}, "must be divisible by TP x PP = 2"),
        ({"gpus_per_node": 3, "pp": 3}, "PP=3 must divide the model's 4 layers"),
        ({"gpus_per_node": 3, "tp": 3}, "TP=3 must divide the model's 8 attention heads"),
        ({"work_dir": Path("relative/work")}, "work dir must be an absolute path"),
        ({"checkpoint_dir": Path("ckpt")}, "checkpoint dir must be an absolute path"),
        ({"run_id": "bad id"}, "use only letters, digits, underscores or hyphens"),
        ({"run_id": "../escape"}, "use only letters, digits, underscores or hyphens"),
        ({"run_id": ""}, "use only letters, digits, underscores or hyphens"),
        ({"nnodes": 2}, "needs a rendezvous endpoint"),
        ({"fault_rank": 2}, "fault rank 2 is not a rank of a world of size 2"),
        ({"gpus_per_node": 1}, "on one GPU set the fault rank to 0"),
        ({"megatron_path": None}, "needs a Megatron-LM checkout"),
        ({"fault": "crash"}, "fault must be one of none, kill, hang, term, segv, exception, ckpt"),
        # issue #10: windows
        ({"window": "during"}, "window must be one of step, save, finalize, got \"'during'\""),
        ({"fault": "none", "window": "step"}, "window step given for fault none"),
        ({"fault": "ckpt-worker", "window": "step"}, "only in window finalize, not step"),
        ({"fault": "ckpt-worker", "window": "save"}, "use --window finalize"),
        (
            {"workload": "reference", "train_iters": 10},
            "window step on the reference workload needs a training step after its tracker",
        ),
        (
            {"workload": "reference", "fault": "segv", "window": "step", "train_iters": 8},
            "train iterations 8 <= 2 x save interval 5; use more than 10 train iterations",
        ),
        (
            {
                "workload": "reference",
                "fault": "ckpt-worker",
                "extra_args": ("--async-writer=thread",),
            },
            "the recipe sets --async-writer=process itself",
        ),
        ({"workload": "bert"}, "workload must be one of megatron, reference"),
        ({"workload": "reference", "gpus_per_node": 1, "fault": "none"}, "at least 2 ranks"),
        ({"out_of_section_timeout": 0.0}, "out-of-section timeout"),
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
        # issue #9: numbers beyond 64 bits, seconds that are not finite, rules between values
        ({"train_iters": 2**63}, "train_iters must be at most 9223372036854775807"),
        ({"fault_rank": 2**70}, "fault_rank must be at most"),
        ({"nnodes": 2**62, "gpus_per_node": 4, "rdzv_endpoint": "h:1"}, "beyond 64 bits"),
        ({"out_of_section_timeout": math.nan}, "out-of-section timeout must be a positive"),
        ({"workload_check_interval": 0.0}, "workload check interval must be a positive"),
        ({"section_timeouts": SectionTimeouts(step=math.inf)}, "section timeout 'step'"),
        ({"save_interval": 100}, "save interval 100 >= train iterations 100"),
        ({"save_interval": 7, "train_iters": 3, "fault": "hang"}, "the hang fault would never"),
        ({"run_id": "r" * 256}, "use at most 255 characters, not 256"),
        ({"nnodes": 2, "rdzv_endpoint": "node1"}, "is not host:port"),
        ({"extra_args": ("--seed", "1", "--load", "/x")}, "overrides the recipe's --load"),
        ({"megatron_path": Path("Megatron-LM")}, "Megatron path must be an absolute path"),
    ],
)
def test_bad_settings_are_refused_without_writing(
    tmp_path: Path, megatron_stub: Path, changes: dict[str, Any], message: str
) -> None:
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare_run_dir(make(tmp_path, megatron_stub, **changes))
    assert snapshot(tmp_path) == before


def test_window_defaults_and_records(tmp_path: Path, megatron_stub: Path) -> None:
    """A fault run without a window gets the fault's default; run.json's config records the
    window in force (null for a baseline)."""
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({}, "step"),
        ({"window": "save"}, "save"),
        ({"fault": "exception", "window": "finalize"}, "finalize"),
        ({"fault": "ckpt-worker"}, "finalize"),
        ({"fault": "none"}, None),
        # a second save (the final one at the end included) opens save and finalize; only the
        # reference's step window needs a step after its second save
        ({"train_iters": 6}, "step"),
        ({"window": "save", "train_iters": 6}, "save"),
        ({"workload": "reference", "window": "save", "train_iters": 6}, "save"),
        ({"workload": "reference", "fault": "ckpt-worker", "train_iters": 6}, "finalize"),
        ({"workload": "reference", "train_iters": 11}, "step"),
        # without NVRx sections the injector watches the tracker instead of the steps
        ({"workload": "reference", "train_iters": 10, "extra_args": ("--no-ft",)}, "step"),
        ({"workload": "reference", "fault": "none", "train_iters": 10}, None),
    ]
    for changes, window in cases:
        c = make(tmp_path, megatron_stub, **changes)
        validate(c)
        assert c.fault_window == window and c.as_dict()["window"] == window, changes


def test_fault_and_window_lists_agree() -> None:
    from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS, windows_of
    from pytest_nvrx.settings import FAULT_KINDS

    assert ("none", *INJECTED_FAULTS) == FAULT_KINDS
    assert FAULT_WINDOWS == ("step", "save", "finalize")
    assert windows_of("none") == () and windows_of("explode") == ()
    assert windows_of("ckpt-worker") == ("finalize",)
    assert all(windows_of(f) == FAULT_WINDOWS for f in INJECTED_FAULTS if f != "ckpt-worker")
    assert parse_value("window", "finalize", "X") == "finalize"
    with pytest.raises(ConfigError, match="X must be one of step, save, finalize"):
        parse_value("window", "Finalize", "X")


def test_baseline_ignores_fault_rank(tmp_path: Path, megatron_stub: Path) -> None:
    validate(make(tmp_path, megatron_stub, gpus_per_node=1, fault="none"))


def test_megatron_path_without_pretrain_gpt(tmp_path: Path) -> None:
    empty = tmp_path / "not-megatron"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"pretrain_gpt.py not found"):
        validate(make(tmp_path, empty))


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "work" / "runs" / "r1"
    (run / "checkpoints").mkdir(parents=True)
    return run


def test_existing_marker_refused(tmp_path: Path, megatron_stub: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "fault_injected.json").write_text("{}")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="already has an injection marker"):
        prepare_run_dir(make(tmp_path, megatron_stub))
    assert snapshot(tmp_path) == before


def test_dangling_marker_symlink_refused(tmp_path: Path, megatron_stub: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "fault_injected.json").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="already has an injection marker"):
        validate(make(tmp_path, megatron_stub))


def test_ft_state_refused(tmp_path: Path, megatron_stub: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "checkpoints" / "ft_state.json").write_text("{}")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"ft_state\.json"):
        prepare_run_dir(make(tmp_path, megatron_stub))
    assert snapshot(tmp_path) == before


def test_ft_state_in_user_checkpoint_dir_refused(tmp_path: Path, megatron_stub: Path) -> None:
    user_ckpt = tmp_path / "existing-ckpt"
    user_ckpt.mkdir()
    (user_ckpt / "ft_state.json").write_text("{}")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"ft_state\.json"):
        prepare_run_dir(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("   \n", "is empty"),
        ("five\n", "does not hold an integer"),
        ("-3", "does not hold an integer"),
        ("5.0", "does not hold an integer"),
        (b"\xff\xfe", "unreadable"),
    ],
)
def test_bad_existing_tracker_refused(
    tmp_path: Path, megatron_stub: Path, content: str | bytes, message: str
) -> None:
    user_ckpt = tmp_path / "existing-ckpt"
    user_ckpt.mkdir()
    tracker = user_ckpt / "latest_checkpointed_iteration.txt"
    if isinstance(content, bytes):
        tracker.write_bytes(content)
    else:
        tracker.write_text(content)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=message):
        prepare_run_dir(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))
    assert snapshot(tmp_path) == before


def test_unreadable_tracker_refused(tmp_path: Path, megatron_stub: Path) -> None:
    user_ckpt = tmp_path / "existing-ckpt"
    (user_ckpt / "latest_checkpointed_iteration.txt").mkdir(parents=True)  # EISDIR on read
    with pytest.raises(ConfigError, match="unreadable"):
        validate(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))


def test_existing_tracker_gives_baseline(tmp_path: Path) -> None:
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    assert read_baseline(tracker) == 0
    tracker.write_text("15\n")
    assert read_baseline(tracker) == 15


@pytest.mark.parametrize("tracker", [True, False], ids=["tracker", "iter-dir-alone"])
def test_a_checkpoint_dir_holding_another_run_s_checkpoints_is_refused_untouched(
    tmp_path: Path, megatron_stub: Path, tracker: bool
) -> None:
    """Its first cycle would resume them (issue #36): refused before anything is written."""
    user_ckpt = tmp_path / "existing-ckpt"
    user_ckpt.mkdir()
    if tracker:
        (user_ckpt / "latest_checkpointed_iteration.txt").write_text("10")
    (user_ckpt / "iter_0000010").mkdir()
    before = snapshot(tmp_path)
    found = "its tracker" if tracker else "iter_0000010/"
    with pytest.raises(ConfigError, match=f"holds another run's checkpoints \\({found}"):
        prepare_run_dir(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))
    assert snapshot(tmp_path) == before


def test_an_empty_checkpoint_dir_of_the_user_is_not_modified(
    tmp_path: Path, megatron_stub: Path
) -> None:
    user_ckpt = tmp_path / "existing-ckpt"
    user_ckpt.mkdir()
    (user_ckpt / "README").write_text("mine\n")
    before = snapshot(user_ckpt)
    layout = prepare_run_dir(make(tmp_path, megatron_stub, checkpoint_dir=user_ckpt))
    assert layout.checkpoint_dir == user_ckpt
    assert snapshot(user_ckpt) == before


def test_reused_run_dir_refused(tmp_path: Path, megatron_stub: Path) -> None:
    run = _run_dir(tmp_path)
    (run / "logs").mkdir()
    (run / "logs" / "train_cycle0.log").write_text("old run\n")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="was used before"):
        prepare_run_dir(make(tmp_path, megatron_stub))
    assert snapshot(tmp_path) == before


def test_dry_run_dirs_can_be_reused(tmp_path: Path, megatron_stub: Path) -> None:
    config = make(tmp_path, megatron_stub)
    prepare_run_dir(config, claim=False)  # a dry run
    prepare_run_dir(config)  # empty artifact dirs from a dry run are fine
    with pytest.raises(ConfigError, match="already claimed"):
        prepare_run_dir(config)  # but one run dir holds one run (#9 item 7)


# --- resolution -------------------------------------------------------------------------------


def test_env_is_read_and_explicit_wins(tmp_path: Path, megatron_stub: Path) -> None:
    env = {
        "MEGATRON_PATH": str(megatron_stub),
        "NVRX_WORK_DIR": str(tmp_path),
        "NVRX_RUN_ID": "from-env",
        "NNODES": "1",
        "GPUS_PER_NODE": "4",
        "TP": "2",
        "PP": "2",
        "TRAIN_ITERS": "40",
        "SAVE_INTERVAL": "10",
        "NVRX_DEMO_FAULT": "hang",
        "NVRX_FAULT_RANK": "3",
        "NVRX_CHECKPOINT_DIR": str(tmp_path / "ck"),
        "RDZV_ENDPOINT": "host:29400",
    }
    c = resolve(PartialRunConfig(tp=1, run_id="explicit"), env)
    assert c.run_id == "explicit" and c.tp == 1
    assert (c.gpus_per_node, c.pp, c.train_iters, c.save_interval) == (4, 2, 40, 10)
    assert (c.fault, c.fault_rank, c.rdzv_endpoint) == ("hang", 3, "host:29400")
    assert c.checkpoint_dir == tmp_path / "ck" and c.megatron_path == megatron_stub


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("TP", "0", "environment variable TP must be a positive integer"),
        ("TRAIN_ITERS", "ten", "environment variable TRAIN_ITERS must be a positive integer"),
        ("NNODES", "1.5", "environment variable NNODES must be a positive integer"),
        (
            "NVRX_DEMO_FAULT",
            "explode",
            "NVRX_DEMO_FAULT must be one of none, kill, hang, term, segv",
        ),
        ("NVRX_FAULT_RANK", "-1", "NVRX_FAULT_RANK must be a non-negative integer"),
    ],
)
def test_bad_env_values_name_the_variable(
    tmp_path: Path, var: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(PartialRunConfig(), {"NVRX_WORK_DIR": str(tmp_path), var: value})


def test_work_dir_required() -> None:
    with pytest.raises(ConfigError, match="NVRX_WORK_DIR"):
        resolve(PartialRunConfig(), {})


def test_default_run_id_single_node(tmp_path: Path) -> None:
    c = resolve(PartialRunConfig(), {"NVRX_WORK_DIR": str(tmp_path)})
    assert c.run_id.endswith(f"-{os.getpid()}")
    assert len(c.run_id.split("-")[0]) == len("20261129T120000")


def test_multinode_needs_shared_run_id(tmp_path: Path) -> None:
    env = {"NVRX_WORK_DIR": str(tmp_path), "NNODES": "2", "RDZV_ENDPOINT": "h:1"}
    with pytest.raises(ConfigError, match="same run ID on all nodes"):
        resolve(PartialRunConfig(), env)
    # each node's own start inside a step of a Slurm job agrees on the job's ID
    in_step = {**env, "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
    assert resolve(PartialRunConfig(), in_step).run_id == "4242"
    assert resolve(PartialRunConfig(), in_step).launcher == "local"


def test_launcher_defaults_and_sources(tmp_path: Path) -> None:
    env = {"NVRX_WORK_DIR": str(tmp_path)}
    assert resolve(PartialRunConfig(), env).launcher == "local"
    # two nodes inside an allocation (a batch script, an salloc shell): one srun step from here,
    # and the run ID is this process's own (it alone starts every node)
    batch = {**env, "NNODES": "2", "SLURM_JOB_ID": "77"}
    c = resolve(PartialRunConfig(workload="reference"), batch)
    assert c.launcher == "slurm" and c.run_id != "77"
    validate(c)  # the default endpoint means "chosen at launch"
    # one node inside an allocation stays local
    assert resolve(PartialRunConfig(), {**env, "SLURM_JOB_ID": "77"}).launcher == "local"
    # asked for, outside any allocation; the option wins over the variable
    assert resolve(PartialRunConfig(), {**env, "NVRX_LAUNCHER": "slurm"}).launcher == "slurm"
    local_asked = PartialRunConfig(launcher="local")
    assert resolve(local_asked, {**batch, "NVRX_LAUNCHER": "slurm"}).launcher == "local"
    with pytest.raises(ConfigError, match="environment variable NVRX_LAUNCHER"):
        resolve(PartialRunConfig(), {**env, "NVRX_LAUNCHER": "pbs"})
    # local on several nodes still needs a real endpoint, and says how to avoid it
    local = resolve(
        PartialRunConfig(launcher="local", run_id="r", workload="reference"),
        {**env, "NNODES": "2"},
    )
    with pytest.raises(ConfigError, match="--launcher slurm"):
        validate(local)
    slurm = resolve(PartialRunConfig(launcher="slurm"), {**env, "NNODES": "2"})
    assert slurm.as_dict()["launcher"] == "slurm"


@pytest.mark.parametrize(
    "text",
    [
        "setup:900,step:120",
        "setup:900,step:120,checkpointing:0",
        "setup:900,step:x,checkpointing:600",
        "init:900,step:120,checkpointing:600",
        "setup:900,setup:900,step:1,checkpointing:1",
        "setup=900",
    ],
)
def test_bad_section_timeouts(text: str) -> None:
    with pytest.raises(ConfigError):
        SectionTimeouts.parse(text)


def test_section_timeouts_round_trip() -> None:
    t = SectionTimeouts.parse("step:30,setup:600,checkpointing:300.5")
    assert t.render() == "setup:600,step:30,checkpointing:300.5"


# --- issue #9: one parser per kind of value, bounded messages ---------------------------------


@pytest.mark.parametrize("word", ["1", "true", "yes", "on", "TRUE", " Yes ", "On"])
def test_one_boolean_parser_true(word: str) -> None:
    assert parse_bool(word, "X") is True
    assert dry_run_requested({"NVRX_DRY_RUN": word}) is True


@pytest.mark.parametrize("word", ["0", "false", "no", "off", "", " OFF "])
def test_one_boolean_parser_false(word: str) -> None:
    assert parse_bool(word, "X") is False
    assert dry_run_requested({"NVRX_DRY_RUN": word}) is False
    assert dry_run_requested({}) is False


@pytest.mark.parametrize("word", ["maybe", "2", "y", "t", "enable", "1.0"])
def test_one_boolean_parser_refuses_the_rest(word: str) -> None:
    with pytest.raises(ConfigError, match="environment variable NVRX_DRY_RUN must be one of"):
        dry_run_requested({"NVRX_DRY_RUN": word})
    with pytest.raises(ConfigError, match=r"^--x must be one of 1/true/yes/on"):
        parse_bool(word, "--x")


def test_quote_is_bounded() -> None:
    assert quote("abc") == "'abc'"
    long = quote("7" * 5000)
    assert len(long) <= 80 + len(" (5000 characters)") and long.endswith("(5000 characters)")


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("tp", "7" * 5000, "at most 9223372036854775807 (64 bits), got '777"),
        ("train_iters", str(INT64_MAX + 1), "at most 9223372036854775807"),
        ("fault_rank", "1" + "0" * 19, "at most 9223372036854775807"),
        ("max_restarts", "\u0663", "must be a non-negative integer"),
        ("out_of_section_timeout", "1e12", "at most 9223372036 seconds"),
        ("out_of_section_timeout", "7" * 5000, "must be a positive number of seconds"),
        ("workload_check_interval", "-inf", "must be a positive number of seconds"),
    ],
)
def test_numbers_are_bounded(name: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        parse_value(name, raw, "X")
    assert len(str(e.value)) < 200


def test_numbers_within_64_bits() -> None:
    assert parse_value("train_iters", str(INT64_MAX), "X") == INT64_MAX
    assert parse_value("fault_rank", " 0 ", "X") == 0
    assert parse_seconds("9223372036", "X") == 9223372036.0


@pytest.mark.parametrize("raw", ["-1", "0", "65536", "70000", "http", "", "7" * 5000, "1.5"])
def test_bad_ports(raw: str) -> None:
    with pytest.raises(ConfigError, match="must be a port number from 1 to 65535"):
        parse_port(raw, "--log-server-port")


@pytest.mark.parametrize("port", [0, -1, 65536, 2**5000, True])
def test_bad_port_values(port: int) -> None:
    with pytest.raises(ConfigError, match="from 1 to 65535") as e:
        check_port(port, "port")
    assert len(str(e.value)) < 100


def test_good_ports() -> None:
    assert parse_port(" 1 ", "p") == 1 and parse_port("65535", "p") == 65535
    assert check_port(50051, "p") == 50051


@pytest.mark.parametrize(
    ("endpoint", "nnodes"),
    [
        ("localhost:0", 1),
        ("node-1.cluster:29400", 2),
        ("10.0.0.1:1", 8),
        ("[fe80::1]:29400", 2),
    ],
)
def test_good_rendezvous_endpoints(endpoint: str, nnodes: int) -> None:
    check_rdzv_endpoint(endpoint, nnodes)


@pytest.mark.parametrize(
    ("endpoint", "nnodes", "message"),
    [
        ("localhost:0", 2, "reachable from all nodes"),
        # torch would read these its own way (any port; its default 29400): issue #36
        ("", 1, "is not host:port"),
        ("node1", 1, "is not host:port"),
        ("node1", 2, "is not host:port"),
        ("node1:", 2, "is not host:port"),
        (":29400", 1, "is not host:port"),
        ("node1:http", 1, "is not host:port"),
        ("node 1:29400", 2, "is not host:port"),
        ("fe80::1:29400", 2, r"in brackets: \[addr\]:port"),
        ("node1:0", 2, "from 1 to 65535 for a multinode run"),
        ("node1:65536", 1, "from 0 to 65535"),
        ("n" * 5000 + ":x", 2, r"\(5002 characters\)"),
    ],
)
def test_bad_rendezvous_endpoints(endpoint: str, nnodes: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_rdzv_endpoint(endpoint, nnodes)


@pytest.mark.parametrize(
    ("extra", "owned"),
    [
        (["--save=/x"], "--save"),
        (["--seed", "3", "--save", "/x"], "--save"),
        (["--load=/x"], "--load"),
        (["--save-interval", "2"], "--save-interval"),
        (["--persistent-save-interval=2"], "--save-interval"),
        (["--train-iters=7"], "--train-iters"),
        (["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size"),
        (["--model-parallel-size=2"], "--tensor-model-parallel-size"),
        (["--pipeline-model-parallel-size=2"], "--pipeline-model-parallel-size"),
    ],
)
def test_extra_args_may_not_override_the_recipe(extra: list[str], owned: str) -> None:
    with pytest.raises(ConfigError, match=f"overrides the recipe's {owned} "):
        check_extra_args(extra)


def test_extra_args_that_only_look_alike_pass() -> None:
    check_extra_args(["--save-retain-interval", "3", "--load-main-params-from-ckpt", "--seed=1"])
    check_extra_args(["--saveX", "--loads", "--train-iters-extra"])


MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
proc /proc proc rw,relatime 0 0
sysfs /sys sysfs rw,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
udev /dev devtmpfs rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,relatime 0 0
/dev/vdb /mnt/my\\040disk xfs rw 0 0
/dev/vdc /mnt/my\\040disk ext4 rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "found"),
    [
        ("/", ("/", "ext4")),
        ("/work/main", ("/", "ext4")),
        ("/proc", ("/proc", "proc")),
        ("/proc/self/x", ("/proc", "proc")),
        ("/processes", ("/", "ext4")),
        ("/sys/kernel", ("/sys", "sysfs")),
        ("/sys/fs/cgroup/pids/runs", ("/sys/fs/cgroup/pids", "cgroup")),
        ("/dev/x", ("/dev", "devtmpfs")),
        ("/dev/shm/work", ("/dev/shm", "tmpfs")),
        ("/mnt/my disk/w", ("/mnt/my disk", "ext4")),  # the mount on top wins
    ],
)
def test_file_system_at(path: str, found: tuple[str, str]) -> None:
    assert file_system_at(path, MOUNTS) == found


def test_fifo_as_work_dir_refused(tmp_path: Path, megatron_stub: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"work dir .*/fifo is a FIFO, not a directory"):
        prepare_run_dir(make(tmp_path, megatron_stub, work_dir=fifo))
    assert snapshot(tmp_path) == before


def test_checkpoint_dir_through_a_link_is_fine(tmp_path: Path, megatron_stub: Path) -> None:
    (tmp_path / "real-ck").mkdir()
    (tmp_path / "ck").symlink_to(tmp_path / "real-ck")
    validate(make(tmp_path, megatron_stub, checkpoint_dir=tmp_path / "ck"))


def test_a_phase_given_twice_is_a_usage_error() -> None:
    """``detection=0.001,detection=100`` kept the last and dropped the first limit silently
    (the adversarial review of #23)."""
    from pytest_nvrx.settings import parse_phase_limits

    with pytest.raises(ConfigError, match="gives phase detection twice"):
        parse_phase_limits("detection=0.001,detection=100", "--nvrx-max-phase")
    assert parse_phase_limits("detection=1,gpu_reclaim=2", "x") == {
        "detection": 1.0,
        "gpu_reclaim": 2.0,
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"release", "does not hold an integer: 'release'"),
        (b"\xff\xfe", "unreadable: not UTF-8 text"),
        (b"7" * 5000, "is unreadable (it is 5000 bytes, over the 4096-byte cap"),
    ],
)
def test_baseline_goes_through_the_core_tracker_reader(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """read_baseline words the one reader's Tracker (evidence/tracker.py): a release tracker
    names no iteration to start from."""
    tracker = tmp_path / "latest_checkpointed_iteration.txt"
    tracker.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(message)):
        read_baseline(tracker)


def test_a_baseline_tracker_may_link_out_of_its_directory(tmp_path: Path) -> None:
    """A user's checkpoint directory is theirs to lay out (a run's evidence is confined)."""
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("10\n")
    (tmp_path / "ckpt").mkdir()
    tracker = tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    tracker.symlink_to(elsewhere)
    assert read_baseline(tracker) == 10
    assert read_tracker(tracker, tmp_path).refused  # as a run's evidence: refused


def test_partial_run_config_mirrors_run_config() -> None:
    """PartialRunConfig is RunConfig field for field, each typed as RunConfig types it or None
    (not given): a field added to one and not the other fails here."""
    from dataclasses import fields
    from typing import get_type_hints

    assert [f.name for f in fields(PartialRunConfig)] == [f.name for f in fields(RunConfig)]
    whole, partial = get_type_hints(RunConfig), get_type_hints(PartialRunConfig)
    for name, hint in whole.items():
        assert partial[name] == hint | None, name
    assert all(f.default is None for f in fields(PartialRunConfig))


def test_partial_run_config_over_and_config(tmp_path: Path) -> None:
    user = PartialRunConfig(tp=2, train_iters=30)
    defaults = PartialRunConfig(train_iters=20, save_interval=5)
    merged = user.over(defaults)
    assert merged == PartialRunConfig(tp=2, train_iters=30, save_interval=5)
    assert merged.given() == {"tp": 2, "train_iters": 30, "save_interval": 5}
    config = merged.config(tmp_path, "r1")
    assert (config.tp, config.train_iters, config.save_interval) == (2, 30, 5)
    assert config.pp == RunConfig.pp  # RunConfig's default for what is not given
    assert PartialRunConfig.of({"tp": 2}) == PartialRunConfig(tp=2)
    with pytest.raises(ConfigError, match="unknown settings: bogus"):
        PartialRunConfig.of({"bogus": 1})
