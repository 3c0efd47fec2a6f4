"""Slurm: one ft_launcher per node, as the tasks of one srun step (:class:`SlurmLaunch`).

The rendezvous host is the step's first node; the allocation is the caller's (inside a batch
script or an salloc shell) or one made here with ``salloc`` and cancelled when the launch ends.
Used by :class:`pytest_nvrx.launch.launcher.Launch` for ``config.launcher == "slurm"``. No pytest
here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_nvrx.launch.ports import PORTS_SCRIPT
from pytest_nvrx.launch.recipe import MULTI_LAUNCHERS_VAR, Recipe, rdzv_host_option
from pytest_nvrx.launch.run_dir_setup import check_fresh_run_dir
from pytest_nvrx.layout import node_console_log_name
from pytest_nvrx.settings import DEFAULT_RDZV_ENDPOINT, ConfigError

#: In a node's launcher argv: replaced on each node by ``true`` on the rendezvous host (the
#: step's first node, which hosts the c10d store, NVRx's log server and the cycle records) and
#: ``false`` elsewhere. Explicit, because NVRx guesses it from the host name, and several nodes
#: on one host (a test cluster) would all guess true.
IS_HOST_PLACEHOLDER = "@NVRX_IS_HOST@"
#: the rendezvous host's Slurm node name, for the shim
RDZV_NODE_VAR = "NVRX_RDZV_NODE"
#: Extra arguments for salloc / srun (a partition, an account, a container), shell-quoted.
SALLOC_ARGS_VAR = "NVRX_SALLOC_ARGS"
SRUN_ARGS_VAR = "NVRX_SRUN_ARGS"
#: Slurm commands that answer at once; a stuck controller must not hang the launch.
SLURM_QUERY_TIMEOUT_S = 30.0
#: How long salloc may wait for nodes.
SALLOC_TIMEOUT_S = 600.0

#: Run on each node by srun (``bash -c NODE_SHIM nvrx-node <argv>``): a TMPDIR of the node's own
#: below the launch's (two launchers on one host must not share torchelastic's files), the
#: rendezvous-host flag, then exec the node's ft_launcher.
NODE_SHIM = (
    'node="${SLURMD_NODENAME:?not a task of a Slurm step}"; '
    'is_host=false; [ "$node" = "${' + RDZV_NODE_VAR + ':?}" ] && is_host=true; '
    'export TMPDIR="$TMPDIR/$node"; mkdir -p -m 700 "$TMPDIR" || exit 1; '
    "args=(); "
    'for a in "$@"; do args+=("${a//' + IS_HOST_PLACEHOLDER + '/$is_host}"); done; '
    'exec "${args[@]}"'
)
_JOB_ALLOCATION = re.compile(r"job allocation (\d+)")
_NODE_ADDR = re.compile(r"(?:^|\s)NodeAddr=(\S+)")


class SlurmError(RuntimeError):
    """A Slurm command failed or the allocation cannot hold the run; the message names it."""


def _slurm(argv: list[str], *, timeout: float = SLURM_QUERY_TIMEOUT_S) -> str:
    """Run a Slurm client command and return its stdout; any failure is a SlurmError."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{shlex.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise SlurmError(
            f"{shlex.join(argv)} exited with {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return done.stdout


def parse_job_id(salloc_stderr: str) -> str | None:
    """The job ID salloc names (``salloc: Granted job allocation 12``; pending ones too)."""
    m = _JOB_ALLOCATION.search(salloc_stderr)
    return m.group(1) if m else None


def parse_node_addr(scontrol_line: str) -> str | None:
    """``NodeAddr=`` of one ``scontrol -o show node`` line (the address its slurmd is reached
    at: the node's host name on most clusters)."""
    m = _NODE_ADDR.search(scontrol_line)
    return m.group(1) if m else None


def shared_hosts(addresses: Sequence[str]) -> bool:
    """Several nodes of the step on one host (Slurm nodes simulated by several slurmd)."""
    return len(set(addresses)) < len(addresses)


def srun_argv(
    *,
    srun: str,
    job_id: str,
    nodes: Sequence[str],
    step_name: str,
    console_dir: Path,
    node_argv: Sequence[str],
    extra: Sequence[str] = (),
) -> list[str]:
    """One task per node, each running the shim and then that node's ft_launcher.

    ``--kill-on-bad-exit``: a node's launcher that gives up ends the others (they would wait
    in the rendezvous until its timeout). ``--cpu-bind=none``: the launcher and its ranks get
    every CPU of the step (measured on the local Slurm with ``CpuBind=cores``: one CPU each
    without it). Each node's console goes to its own file. ``extra`` comes last: it wins.
    """
    n = len(nodes)
    return [
        srun,
        f"--jobid={job_id}",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        f"--job-name={step_name}",
        "--kill-on-bad-exit=1",
        # the node's launcher and every rank it starts share whatever the task is bound to: no
        # binding, so a site's default (CpuBind=cores) cannot pin them all to one core
        "--cpu-bind=none",
        f"--output={console_dir / node_console_log_name('%n')}",
        *extra,
        "bash",
        "-c",
        NODE_SHIM,
        "nvrx-node",
        *node_argv,
    ]


def node_launcher_argv(
    launcher_argv: Sequence[str], endpoint: str, log_server_port: int | str
) -> list[str]:
    """The launcher argv for every node: the endpoint and log server port chosen, and who hosts
    the rendezvous."""
    replace = {"--rdzv-endpoint=": endpoint, "--ft-log-server-port=": str(log_server_port)}
    out = []
    for arg in launcher_argv:
        option = next((o for o in replace if arg.startswith(o)), None)
        out.append(arg if option is None else option + replace[option])
    return [*out, rdzv_host_option(IS_HOST_PLACEHOLDER)]


def step_name(run_id: str) -> str:
    return f"nvrx-{run_id}"[:128]


class SlurmLaunch:
    """The Slurm side of one launch: its allocation, its endpoint, its srun step, its release.

    :meth:`prepare` finds or makes the allocation and picks the rendezvous endpoint;
    :meth:`release` (every exit path, also after a failed prepare) cancels the step if it still
    runs and the allocation if it was made here.
    """

    def __init__(self, recipe: Recipe, environ: Mapping[str, str]) -> None:
        self.recipe = recipe
        self.environ = environ
        self.srun = shutil.which("srun", path=environ.get("PATH"))
        self.job_id: str | None = None
        #: made here with salloc: cancelled at release
        self.owned = False
        self.nodes: tuple[str, ...] = ()
        self.addresses: tuple[str, ...] = ()
        self.endpoint = ""
        self.step_name = step_name(recipe.config.run_id)
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.released = False

    # -- prepare

    def prepare(self) -> None:
        config = self.recipe.config
        if self.srun is None or shutil.which("salloc") is None:
            raise SlurmError(
                "launcher slurm: srun/salloc not found on PATH; run where Slurm's clients are "
                "installed (scripts/slurm_local.sh up starts a local cluster), or use "
                "--launcher local"
            )
        try:
            # only this process writes the run dir's top level on a Slurm launch: a used one
            # is refused as on one node
            check_fresh_run_dir(self.recipe.layout)
        except ConfigError as exc:
            raise SlurmError(str(exc)) from None
        if self.environ.get("SLURM_JOB_ID"):
            self.job_id = self.environ["SLURM_JOB_ID"]
            nodelist = self.environ.get("SLURM_JOB_NODELIST", "")
            if not nodelist:
                nodelist = _slurm(["squeue", "-h", "-j", self.job_id, "-o", "%N"]).strip()
        else:
            self.job_id = self._salloc(config.nnodes)
            self.owned = True
            nodelist = _slurm(["squeue", "-h", "-j", self.job_id, "-o", "%N"]).strip()
        hosts = _slurm(["scontrol", "show", "hostnames", nodelist]).split()
        if len(hosts) < config.nnodes:
            raise SlurmError(
                f"allocation {self.job_id} has {len(hosts)} node(s) ({nodelist}) but the run "
                f"needs {config.nnodes} (NNODES); allocate {config.nnodes} nodes "
                f"(sbatch/salloc --nodes={config.nnodes}) or lower --nnodes"
            )
        self.nodes = tuple(hosts[: config.nnodes])
        self.addresses = tuple(self._node_addr(node) for node in self.nodes)
        # the first node hosts the rendezvous store and NVRx's log server: the ports we choose
        # for them are checked free there (build_recipe checked its log server port here, on
        # the controller)
        choose_endpoint = config.rdzv_endpoint == DEFAULT_RDZV_ENDPOINT
        log_port = self.recipe.log_server_port
        self.endpoint = config.rdzv_endpoint
        if choose_endpoint or self.recipe.log_server_port_chosen:
            first = self._free_ports_on(self.nodes[0], count=2)
            if choose_endpoint:
                self.endpoint = f"{self.addresses[0]}:{first}"
            if self.recipe.log_server_port_chosen:
                log_port = first + 1
        self.recipe = dataclasses.replace(
            self.recipe,
            config=dataclasses.replace(config, rdzv_endpoint=self.endpoint),
            launcher_argv=tuple(
                node_launcher_argv(self.recipe.launcher_argv, self.endpoint, log_port)
            ),
            log_server_port=log_port,
        )
        self.env = {RDZV_NODE_VAR: self.nodes[0]}
        if shared_hosts(self.addresses):
            self.env[MULTI_LAUNCHERS_VAR] = "1"
        self.argv = srun_argv(
            srun=self.srun,
            job_id=self.job_id,
            nodes=self.nodes,
            step_name=self.step_name,
            console_dir=self.recipe.layout.logs,
            node_argv=self.recipe.argv,
            extra=shlex.split(self.environ.get(SRUN_ARGS_VAR, "")),
        )

    def _salloc(self, nnodes: int) -> str:
        config = self.recipe.config
        # a request for more nodes than the cluster has would pend for ever
        known = set(_slurm(["sinfo", "-h", "-N", "-o", "%N"]).split())
        if len(known) < nnodes:
            raise SlurmError(
                f"the cluster has {len(known)} node(s), the run needs {config.nnodes} (NNODES): "
                f"lower --nnodes"
            )
        argv = [
            "salloc",
            "--no-shell",
            # give up (and withdraw the request) when the nodes do not come in time
            f"--immediate={int(SALLOC_TIMEOUT_S)}",
            f"--nodes={nnodes}",
            "--ntasks-per-node=1",
            "--exclusive",
            f"--job-name={self.step_name}",
        ]
        if config.workload == "megatron":
            argv.append(f"--gpus-per-node={config.gpus_per_node}")
        argv += shlex.split(self.environ.get(SALLOC_ARGS_VAR, ""))
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=SALLOC_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)
            raise SlurmError(
                f"{shlex.join(argv)}: no allocation after {SALLOC_TIMEOUT_S + 30:.0f} s"
            ) from None
        except BaseException:
            # a pending salloc revokes its request when stopped; a granted one is cancelled
            # by release() once its job ID is known
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                _, err = proc.communicate(timeout=10)
                self.job_id = parse_job_id(err or "")
                self.owned = self.job_id is not None
            raise
        job_id = parse_job_id(err)
        if proc.returncode != 0 or job_id is None:
            raise SlurmError(
                f"{shlex.join(argv)} exited with {proc.returncode}: {err.strip()[-2000:]}"
            )
        return job_id

    def _node_addr(self, node: str) -> str:
        line = _slurm(["scontrol", "-o", "show", "node", node])
        return parse_node_addr(line) or node

    def _free_ports_on(self, node: str, count: int) -> int:
        """The first of ``count`` ports free right now on ``node``, outside its ephemeral range
        (asked there: the controller may be elsewhere; :mod:`pytest_nvrx.launch.ports` runs there as
        a script)."""
        assert self.srun is not None and self.job_id is not None
        out = _slurm(
            [
                self.srun,
                f"--jobid={self.job_id}",
                "--nodes=1",
                "--ntasks=1",
                f"--nodelist={node}",
                "--overlap",
                "--quiet",
                f"--job-name={self.step_name}-port",
                sys.executable,
                str(PORTS_SCRIPT),
                "",
                str(count),
            ]
        )
        try:
            return int(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SlurmError(f"no free port from node {node}: {out[-200:]!r}") from None

    def describe(self) -> dict[str, Any]:
        """For run.json: where and how the nodes' launchers ran."""
        return {
            "job_id": self.job_id,
            "allocated_here": self.owned,
            "step_name": self.step_name,
            "nodes": list(self.nodes),
            "node_addresses": list(self.addresses),
            "rdzv_node": self.nodes[0] if self.nodes else None,
            "rdzv_endpoint": self.endpoint,
            "nodes_share_a_host": shared_hosts(self.addresses),
            "env": dict(self.env),
            "srun_argv": list(self.argv),
        }

    # -- release

    def release(self) -> None:
        """Cancel what is left of the step, and the allocation if it was made here. Never
        raises: it runs on every exit path."""
        if self.released or self.job_id is None:
            return
        self.released = True
        with contextlib.suppress(SlurmError):
            if self.owned:
                _slurm(["scancel", self.job_id])
            else:
                steps = _slurm(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j"])
                ours = [
                    line.split()[0]
                    for line in steps.splitlines()
                    if line.split()[1:2] in ([self.step_name], [f"{self.step_name}-port"])
                ]
                if ours:
                    _slurm(["scancel", *ours])


def slurm_preview(recipe: Recipe) -> str:
    """What a dry run shows for a Slurm launch: the srun step with the values chosen at launch
    (job, nodes, endpoint, log server port) as placeholders."""
    endpoint = (
        "<first node>:<free port>"
        if recipe.config.rdzv_endpoint == DEFAULT_RDZV_ENDPOINT
        else recipe.config.rdzv_endpoint
    )
    log_port = (
        "<free port on the first node>"
        if recipe.log_server_port_chosen
        else str(recipe.log_server_port)
    )
    argv = srun_argv(
        srun="srun",
        job_id="<job>",
        nodes=[f"<node {i}>" for i in range(recipe.config.nnodes)],
        step_name=step_name(recipe.config.run_id),
        console_dir=recipe.layout.logs,
        node_argv=[
            *node_launcher_argv(recipe.launcher_argv, endpoint, log_port),
            *recipe.workload_argv,
        ],
    )
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(recipe.env.items())]
    return " ".join([*env, f"{RDZV_NODE_VAR}='<node 0>'", shlex.join(argv)])
