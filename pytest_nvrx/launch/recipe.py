"""The GPT recovery recipe: ft_launcher argv, workload argv, environment and manifest.

What the walkthrough's ``run_megatron_gpt.sh`` does, as data. The only I/O here is writing
``run.json``; the run directory (its checks, claim and creation, a launch's TMPDIR) is
:mod:`pytest_nvrx.launch.run_dir_setup`, launching is :mod:`pytest_nvrx.launch.launcher`.
"""

from __future__ import annotations

import datetime as _dt
import enum
import json
import os
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_nvrx import __version__, worker
from pytest_nvrx.launch.ports import free_port, shared_port
from pytest_nvrx.layout import MANIFEST_SCHEMA, PLANT_RECORDS_DIR, RunLayout
from pytest_nvrx.outputs import write_atomic
from pytest_nvrx.settings import (
    REFERENCE_ASYNC_WRITER_FLAG,
    RunConfig,
    check_port,
    faults_of,
    format_seconds,
)
from pytest_nvrx.settings.schedule import render_schedule
from pytest_nvrx.worker.plant_hook import nvrx_plants
from pytest_nvrx.worker.plant_hook.nvrx_plants import PLANT_ENV, RECORDS_ENV

if TYPE_CHECKING:
    from pytest_nvrx.megatron.source import MegatronFlags

#: run as a script by ft_launcher (never imported: stdlib only, a worker's own interpreter)
INJECTOR_PATH = Path(worker.__file__).resolve().parent / "injector.py"
REFERENCE_MODULE = "pytest_nvrx.workloads.reference"


class Profile(enum.StrEnum):
    """The Megatron flag set a run uses (``run.json``'s ``profile``)."""

    DEFAULT = "default"
    NO_TE = "no-te"


@dataclass(frozen=True)
class ProfileFlag:
    """One Megatron option of a profile; ``value`` None for a switch."""

    option: str
    value: str | None = None

    @property
    def arg(self) -> str:
        return self.option if self.value is None else f"{self.option}={self.value}"


#: Megatron flags for a stack without Transformer Engine and Apex (measured on the H200, see
#: docs/gpu.md): local transformer layers, no fused kernels that only TE/Apex provide.
NO_TE_PROFILE: tuple[ProfileFlag, ...] = (
    ProfileFlag("--transformer-impl", "local"),
    ProfileFlag("--no-gradient-accumulation-fusion"),
    ProfileFlag("--no-persist-layer-norm"),
    ProfileFlag("--no-masked-softmax-fusion"),
)


def no_te_profile_args(flags: MegatronFlags | None = None) -> tuple[str, ...]:
    """The no-TE profile as argv items; with ``flags``, only those this checkout accepts."""
    return tuple(
        f.arg
        for f in NO_TE_PROFILE
        if flags is None
        or (flags.has(f.option) if f.value is None else flags.accepts(f.option, f.value))
    )


class EnvOrigin(enum.StrEnum):
    """Who chose a worker environment value."""

    RECIPE = "pytest-nvrx"
    USER = "user environment"


@dataclass(frozen=True)
class WorkerEnvVar:
    """A variable the workers need because the checkout's validation demands it."""

    name: str
    value: str
    origin: EnvOrigin
    #: the check that demands it: "megatron/training/arguments.py:1437", or the documented rule
    where: str
    #: the check's condition, as source
    condition: str
    #: why the condition holds for this run (the args it read; what is unknown before launch)
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {**asdict(self), "origin": str(self.origin)}


@dataclass(frozen=True)
class Recipe:
    """One run, fully specified: what to execute, where, with which environment."""

    config: RunConfig
    layout: RunLayout
    launcher_argv: tuple[str, ...]
    workload_argv: tuple[str, ...]
    env: Mapping[str, str]
    log_server_port: int
    #: a Profile (typed str: recipes built by hand in tests pass the plain value)
    profile: str
    profile_flags: tuple[str, ...] = field(default=())
    #: what of ``env`` the checkout's own validation demands, and why (run.json's worker_env)
    worker_env: tuple[WorkerEnvVar, ...] = field(default=())
    #: ``log_server_port`` was chosen here, not given (--log-server-port): a Slurm launch
    #: chooses it again on the node that hosts the log server
    log_server_port_chosen: bool = False

    @property
    def argv(self) -> list[str]:
        return [*self.launcher_argv, *self.workload_argv]

    @property
    def worker_args(self) -> tuple[str, ...]:
        """The workload's own arguments: what follows the injector's ``--``."""
        argv = self.workload_argv
        return argv[argv.index("--") + 1 :] if "--" in argv else argv

    def with_worker_env(self, variables: Sequence[WorkerEnvVar]) -> Recipe:
        """This recipe with ``variables`` in the workers' environment and recorded."""
        env = {**self.env, **{v.name: v.value for v in variables}}
        return replace(self, env=env, worker_env=(*self.worker_env, *variables))

    def shell_command(self) -> str:
        """The exact command, shell-quoted, with its environment additions in front."""
        env = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join([*env, *(shlex.quote(a) for a in self.argv)])


def log_server_port_for(config: RunConfig) -> int:
    """A distinct ``--ft-log-server-port`` per run.

    ft_launcher's log server defaults to 50051 on every host, so two launchers mix their logs.
    On one node any free port will do (:func:`pytest_nvrx.launch.ports.free_port`); across nodes
    every launcher must agree, so the port is derived from the shared run ID.
    """
    if config.nnodes == 1:
        return free_port()
    return shared_port(config.run_id)


#: NVRx refuses two launchers of one run on one host unless this is set (a simulation of nodes:
#: its rendezvous closes on two participants with one address)
MULTI_LAUNCHERS_VAR = "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE"
#: Names of this host as a rendezvous endpoint may give it.
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "::1"})


def rdzv_host_option(is_host: bool | str) -> str:
    """ft_launcher's ``--rdzv-conf=is_host=...``: whether this node hosts the c10d store, NVRx's
    gRPC log server (the only writer of launcher.log and the cycle logs) and the cycle records.

    Explicit, because NVRx guesses it from the endpoint's host name: several nodes on one host
    would all guess true. A str is a placeholder replaced on each node (the Slurm shim).
    """
    value = ("true" if is_host else "false") if isinstance(is_host, bool) else is_host
    return f"--rdzv-conf=is_host={value}"


def endpoint_host(endpoint: str) -> str:
    """The host of ``host:port`` (``[::1]:29500`` too), lower case, without brackets."""
    host = endpoint.rpartition(":")[0] if ":" in endpoint else endpoint
    return host.strip("[]").lower()


def is_this_host(host: str) -> bool:
    """Whether ``host`` names this machine: loopback, or its host name (short or full)."""
    if host in _LOOPBACK_NAMES or host.startswith("127."):
        return True
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    names |= {name.split(".")[0] for name in names}
    return host in names


#: NVRx's infrastructure rank of a node outside Slurm (SLURM_PROCID wins inside a step): the
#: rendezvous orders nodes by it, so node I's workers are ranks I*GPUS_PER_NODE.. (without it,
#: by node name: host and launcher PID, which is no order at all on one host)
INFRA_RANK_VAR = "GROUP_RANK"


def node_env(config: RunConfig) -> dict[str, str]:
    """What a by-hand node's launcher needs in its environment: its index as NVRx's
    infrastructure rank, and NVRx's permission for several launchers on one host when this
    node and the rendezvous share the host (an endpoint on this host; nodes on other hosts
    would name another one)."""
    if config.node_index is None:
        return {}
    env = {INFRA_RANK_VAR: str(config.node_index)}
    if config.nnodes > 1 and is_this_host(endpoint_host(config.rdzv_endpoint)):
        env[MULTI_LAUNCHERS_VAR] = "1"
    return env


def node_options(config: RunConfig) -> list[str]:
    """The launcher options of a by-hand node (``--node-index``): node 0 hosts the rendezvous.
    Without a node index NVRx guesses from the host name, as before."""
    if config.node_index is None:
        return []
    return [rdzv_host_option(config.node_index == 0)]


def launcher_argv(config: RunConfig, layout: RunLayout, port: int, exe: str) -> list[str]:
    argv = [
        exe,
        f"--nnodes={config.nnodes}",
        f"--nproc-per-node={config.gpus_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={config.rdzv_endpoint}",
        f"--rdzv-id={config.run_id}",
        f"--max-restarts={config.max_restarts}",
        f"--ft-rank-section-timeouts={config.section_timeouts.render()}",
        f"--ft-rank-out-of-section-timeout={format_seconds(config.out_of_section_timeout)}",
        f"--ft-checkpoint-iteration-file={layout.tracker}",
        f"--ft-cycle-info-dir={layout.cycle_infos}",
        f"--ft-per-cycle-applog-prefix={layout.applog_prefix}",
        f"--ft-nvrx-logfile={layout.launcher_log}",
        f"--ft-log-server-port={port}",
    ]
    if config.workload_check_interval is not None:
        argv.append(
            f"--ft-workload-check-interval={format_seconds(config.workload_check_interval)}"
        )
    return [*argv, *node_options(config)]


def injector_argv(config: RunConfig, layout: RunLayout) -> list[str]:
    """The once-only fault wrapper and the entry point it runs."""
    if config.workload == "megatron":
        assert config.megatron_path is not None
        entry = ["--script", str(config.megatron_path / "pretrain_gpt.py")]
    else:
        entry = ["--module", REFERENCE_MODULE]
    window = config.fault_window
    # a schedule names every fault and window; one fault is always explicit about its window on
    # a fault run (the manifest's argv says where it fired), and a baseline has no window
    faults = (
        [f"--schedule={render_schedule(config.schedule)}"]
        if config.schedule
        else [f"--fault={config.fault}", *([f"--window={window}"] if window is not None else [])]
    )
    return [
        str(INJECTOR_PATH),
        f"--checkpoint-dir={layout.checkpoint_dir}",
        f"--fault-marker={layout.marker}",
        *faults[:1],
        f"--fault-rank={config.fault_rank}",
        *faults[1:],
        *entry,
        "--",
    ]


def megatron_args(config: RunConfig, layout: RunLayout, profile_flags: Sequence[str]) -> list[str]:
    """The walkthrough's Megatron arguments, plus what real runs required."""
    ckpt = str(layout.checkpoint_dir)
    args = [
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
        f"--tensor-model-parallel-size={config.tp}",
        f"--pipeline-model-parallel-size={config.pp}",
        "--micro-batch-size=1",
        f"--global-batch-size={config.world_size}",
        f"--train-iters={config.train_iters}",
        "--lr=0.0001",
        *(SELFTEST_LR if config.selftest else ("--lr-decay-style=constant",)),
        "--bf16",
    ]
    if config.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    args += [
        f"--load={ckpt}",
        f"--save={ckpt}",
        f"--save-interval={config.save_interval}",
        "--ckpt-format=torch_dist",
        "--async-save",
        "--use-persistent-ckpt-worker",
        "--eval-iters=0",
        "--log-interval=1",
        # core 0.19 divides by eval_interval even with --eval-iters=0 (TypeError without it).
        f"--eval-interval={config.train_iters}",
    ]
    args += profile_flags
    return args


def reference_args(config: RunConfig, layout: RunLayout) -> list[str]:
    ckpt = str(layout.checkpoint_dir)
    args = [
        f"--train-iters={config.train_iters}",
        f"--save-interval={config.save_interval}",
        f"--save={ckpt}",
        f"--load={ckpt}",
        "--log-interval=1",
    ]
    if "ckpt-worker" in faults_of(config):
        # The reference writes from a thread by default: there is no worker process to kill.
        # Megatron always has one (--use-persistent-ckpt-worker above).
        args.append(f"{REFERENCE_ASYNC_WRITER_FLAG}=process")
    return args


#: A self-test's learning rate (control and plants alike): warmup, then cosine decay to the
#: minimum at the last iteration, so that a replacement with a fresh scheduler trains with
#: another learning rate from its first step.
SELFTEST_LR: tuple[str, ...] = (
    "--lr-decay-style=cosine",
    "--lr-warmup-iters=2",
    "--min-lr=0.00001",
)


def plant_env(config: RunConfig, layout: RunLayout) -> dict[str, str]:
    """The workers' environment of a planted self-test run: the plant, where its records go,
    and for Megatron the import hook first on PYTHONPATH (the rest as the harness has it)."""
    if config.plant is None:
        return {}
    env = {PLANT_ENV: config.plant, RECORDS_ENV: str(layout.run_dir / PLANT_RECORDS_DIR)}
    if config.workload == "megatron":
        hook = str(Path(nvrx_plants.__file__).parent)
        rest = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([hook, rest]) if rest else hook
    return env


def build_recipe(
    config: RunConfig,
    *,
    no_te: bool = False,
    launcher_exe: str = "ft_launcher",
    port: int | None = None,
    profile_flags: Sequence[str] | None = None,
) -> Recipe:
    """Assemble the run. ``no_te`` is the stack's verdict; ``config.no_te_profile`` overrides it.

    ``profile_flags``: the no-TE flags this Megatron revision accepts (default: all of them).
    """
    layout = config.layout
    use_no_te = config.no_te_profile if config.no_te_profile is not None else no_te
    available = no_te_profile_args() if profile_flags is None else tuple(profile_flags)
    profile_flags = available if (config.workload == "megatron" and use_no_te) else ()
    profile = Profile.NO_TE if profile_flags else Profile.DEFAULT
    if config.workload == "megatron":
        work = megatron_args(config, layout, profile_flags)
    else:
        work = reference_args(config, layout)
    chosen = port is None
    port = log_server_port_for(config) if port is None else check_port(port, "--log-server-port")
    env = {
        "TMPDIR": str(layout.tmp),
        "NVRX_RUN_ID": config.run_id,
        "PYTHONUNBUFFERED": "1",
        **node_env(config),
        **plant_env(config, layout),
    }
    return Recipe(
        config=config,
        layout=layout,
        launcher_argv=tuple(launcher_argv(config, layout, port, launcher_exe)),
        workload_argv=(*injector_argv(config, layout), *work, *config.extra_args),
        env=env,
        log_server_port=port,
        log_server_port_chosen=chosen,
        profile=profile,
        profile_flags=tuple(profile_flags),
    )


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def manifest(recipe: Recipe, *, stack: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a later verifier needs besides the logs."""
    return {
        "schema": MANIFEST_SCHEMA,
        "tool": {"name": "pytest-nvrx", "version": __version__},
        "run_id": recipe.config.run_id,
        "config": recipe.config.as_dict(),
        "profile": str(recipe.profile),
        "profile_flags": list(recipe.profile_flags),
        "launcher_argv": list(recipe.launcher_argv),
        "workload_argv": list(recipe.workload_argv),
        "command": recipe.shell_command(),
        "env": dict(recipe.env),
        "worker_env": [v.as_dict() for v in recipe.worker_env],
        # the injector (worker/injector.py) logs rank 0's tracker readings in every cycle and says
        # so first: a verifier then requires them (runs recorded before it said so have none)
        "tracker_readings": True,
        "log_server_port": recipe.log_server_port,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start_time": utc_now(),
        "stack": dict(stack) if stack is not None else None,
    }


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """run.json, result.json: whole or not at all (pytest_nvrx.outputs.write_atomic)."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
