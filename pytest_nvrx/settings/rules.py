"""The walkthrough's rules between a run's settings: pure, no file system (the run directory's
checks are :func:`pytest_nvrx.launch.run_dir_setup.check_run_paths`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pytest_nvrx.layout import FAULT_WINDOWS, window_allowed, windows_of
from pytest_nvrx.settings.record import (
    DEFAULT_RDZV_ENDPOINT,
    FAULT_KINDS,
    LAUNCHER_KINDS,
    REFERENCE_ASYNC_WRITER_FLAG,
    REFERENCE_NO_FT_FLAG,
    SECTION_NAMES,
    WORKLOAD_KINDS,
    RunConfig,
)
from pytest_nvrx.settings.schedule import (
    NVRX_NO_PROGRESS_LIMIT,
    reference_iterations_needed,
    render_schedule,
    schedule_ending,
    windows_at,
)
from pytest_nvrx.settings.table import option_hint
from pytest_nvrx.settings.values import (
    INT64_MAX,
    MAX_SECONDS,
    ConfigError,
    check_path_text,
    quote,
)
from pytest_nvrx.worker.plant_hook.nvrx_plants import PLANT_NAMES

#: The walkthrough model: four layers, eight attention heads.
MODEL_LAYERS = 4
MODEL_HEADS = 8
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
#: The run ID names the run's directory: one path component.
RUN_ID_MAX = 255


#: Workload arguments the recipe sets itself: (the workload's option, the setting that sets it,
#: a row name of the settings table). An extra argument may not override one: the injector
#: watches the recipe's tracker and the criteria judge the recipe's values, so
#: ``-- --save=/elsewhere`` would make a run that injects nothing.
RECIPE_OWNED_ARGS: dict[str, tuple[str, str]] = {
    "--save": ("--save", "checkpoint-dir"),
    "--load": ("--load", "checkpoint-dir"),
    "--save-interval": ("--save-interval", "save-interval"),
    # Megatron's alias of --save-interval
    "--persistent-save-interval": ("--save-interval", "save-interval"),
    "--train-iters": ("--train-iters", "train-iters"),
    "--tensor-model-parallel-size": ("--tensor-model-parallel-size", "tp"),
    # Megatron's deprecated spelling, still copied into the tensor-parallel size
    "--model-parallel-size": ("--tensor-model-parallel-size", "tp"),
    "--pipeline-model-parallel-size": ("--pipeline-model-parallel-size", "pp"),
}


def validate(config: RunConfig) -> None:
    """Check every rule of the walkthrough between the settings; raise ConfigError with a fix-it
    message (one that names options is spelled for the entry point that shows it:
    :meth:`ConfigError.message_for`).

    Pure: reads no file system. A real run also needs
    :func:`pytest_nvrx.launch.run_dir_setup.check_run_paths` (the checkout, the directories, the
    marker, the tracker) right after this; :func:`pytest_nvrx.launch.run_dir_setup.validate_run`
    runs both, in that order.
    """
    for name in ("nnodes", "gpus_per_node", "tp", "pp", "train_iters", "save_interval"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {quote(repr(value))}")
        if value > INT64_MAX:
            raise ConfigError(f"{name} must be at most {INT64_MAX} (64 bits)")
    for name in ("max_restarts", "fault_rank"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{name} must be >= 0, got {quote(repr(value))}")
        if value > INT64_MAX:
            raise ConfigError(f"{name} must be at most {INT64_MAX} (64 bits)")
    if config.fault not in FAULT_KINDS:
        raise ConfigError(
            f"fault must be one of {', '.join(FAULT_KINDS)}, got {quote(repr(config.fault))}"
        )
    if config.workload not in WORKLOAD_KINDS:
        raise ConfigError(
            f"workload must be one of {', '.join(WORKLOAD_KINDS)}, "
            f"got {quote(repr(config.workload))}"
        )
    check_window(config.fault, config.window)
    check_schedule(config)
    check_plant(config)
    if config.launcher not in LAUNCHER_KINDS:
        raise ConfigError(
            f"launcher must be one of {', '.join(LAUNCHER_KINDS)}, "
            f"got {quote(repr(config.launcher))}"
        )
    check_node_index(config)
    seconds = {
        "out-of-section timeout": config.out_of_section_timeout,
        "workload check interval": config.workload_check_interval,
        **{f"section timeout {n!r}": getattr(config.section_timeouts, n) for n in SECTION_NAMES},
    }
    for what, value in seconds.items():
        if value is not None and not (0 < value <= MAX_SECONDS):  # also refuses nan
            raise ConfigError(
                f"{what} must be a positive number of seconds (at most {MAX_SECONDS}), "
                f"got {value!r}"
            )

    world = config.world_size
    if world > INT64_MAX:
        raise ConfigError(
            f"world size (nnodes {config.nnodes} x gpus per node {config.gpus_per_node}) is "
            f"beyond 64 bits; give the real number of nodes and processes per node"
        )
    if world % (config.tp * config.pp) != 0:
        raise ConfigError(
            f"world size {world} (nnodes {config.nnodes} x gpus per node "
            f"{config.gpus_per_node}) must be divisible by TP x PP = {config.tp * config.pp}"
        )
    if MODEL_LAYERS % config.pp != 0:
        raise ConfigError(f"PP={config.pp} must divide the model's {MODEL_LAYERS} layers")
    if MODEL_HEADS % config.tp != 0:
        raise ConfigError(f"TP={config.tp} must divide the model's {MODEL_HEADS} attention heads")
    if config.fault != "none" and not 0 <= config.fault_rank < world:
        rank = config.fault_rank
        raise ConfigError.naming(
            lambda entry: (
                f"fault rank {rank} is not a rank of a world of size {world}"
                + (
                    f"; on one GPU set the fault rank to 0: {option_hint('fault-rank', entry, '0')}"
                    if world == 1
                    else ""
                )
            )
        )
    if config.workload == "reference" and world < 2:
        raise ConfigError.naming(
            lambda entry: (
                "the CPU reference workload needs at least 2 ranks: set the processes "
                f"per node to 2 or more: {option_hint('gpus-per-node', entry, '2')}"
            )
        )
    if config.fault != "none" and config.save_interval >= config.train_iters:
        interval, iters, fault = config.save_interval, config.train_iters, config.fault
        raise ConfigError.naming(
            lambda entry: (
                f"save interval {interval} >= train iterations {iters}: no checkpoint "
                f"is saved before training ends, so the {fault} fault would never be injected; use "
                "a save interval below the train iterations, e.g. "
                f"{option_hint('save-interval', entry, str(max(1, iters // 2)))}, or more train "
                "iterations"
            )
        )
    if (
        config.workload == "reference"
        and config.fault_window == "step"
        and config.train_iters <= 2 * config.save_interval
        and REFERENCE_NO_FT_FLAG not in config.extra_args
    ):
        # The reference finalizes save N (its tracker moves to N) only when it saves again, at
        # N + interval or at the end: with no step after that, a step fault has no step to land
        # in. (Without NVRx sections, --no-ft, the injector falls back to watching the tracker.)
        interval, iters = config.save_interval, config.train_iters
        raise ConfigError.naming(
            lambda entry: (
                "window step on the reference workload needs a training step after its "
                "tracker first moves, which happens at its second save: train iterations "
                f"{iters} <= 2 x save interval {interval}; use more than {2 * interval} train "
                "iterations, a smaller save interval, or window save or finalize: "
                f"{option_hint('train-iters', entry)}, {option_hint('save-interval', entry)}, "
                f"{option_hint('window', entry)}"
            )
        )

    if (
        config.workload == "reference"
        and config.schedule
        and REFERENCE_NO_FT_FLAG not in config.extra_args
    ):
        check_reference_schedule(config)

    for what, path in (
        ("work dir", config.work_dir),
        ("checkpoint dir", config.checkpoint_dir),
        ("Megatron path", config.megatron_path),
    ):
        if path is not None:
            check_path_text(path, what)
    if not config.work_dir.is_absolute():
        raise ConfigError(f"work dir must be an absolute path, got {quote(str(config.work_dir))}")
    if config.checkpoint_dir is not None and not config.checkpoint_dir.is_absolute():
        raise ConfigError(
            f"checkpoint dir must be an absolute path, got {quote(str(config.checkpoint_dir))}"
        )
    if not RUN_ID_PATTERN.fullmatch(config.run_id):
        raise ConfigError(
            f"run ID {quote(config.run_id)}: use only letters, digits, underscores or hyphens"
        )
    if len(config.run_id) > RUN_ID_MAX:
        raise ConfigError(
            f"run ID {quote(config.run_id)} names a directory: use at most {RUN_ID_MAX} "
            f"characters, not {len(config.run_id)}"
        )
    if not (config.launcher == "slurm" and config.rdzv_endpoint == DEFAULT_RDZV_ENDPOINT):
        # with slurm and no endpoint given, the launch chooses one in the allocation
        check_rdzv_endpoint(config.rdzv_endpoint, config.nnodes)
    check_extra_args(config.extra_args)
    if config.workload == "reference" and "ckpt-worker" in faults_of(config):
        for arg in config.extra_args:
            if arg.partition("=")[0] == REFERENCE_ASYNC_WRITER_FLAG:
                raise ConfigError(
                    f"extra argument {quote(arg)}: fault ckpt-worker kills the reference "
                    f"workload's persistent checkpoint worker, so the recipe sets "
                    f"{REFERENCE_ASYNC_WRITER_FLAG}=process itself; drop the argument"
                )

    if config.workload == "megatron" and config.megatron_path is None:
        raise ConfigError.naming(
            lambda entry: (
                "the megatron workload needs a Megatron-LM checkout: pass "
                f"{option_hint('megatron-path', entry)}, or use "
                f"{option_hint('workload', entry, 'reference')} on a machine without GPUs"
            )
        )


_HOST = re.compile(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")


def check_node_index(config: RunConfig) -> None:
    """A by-hand node's index: below NNODES, and only where each node is started by hand."""
    index = config.node_index
    if index is None:
        return
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ConfigError(f"node index must be >= 0, got {quote(repr(index))}")
    if index >= config.nnodes:
        raise ConfigError(
            f"node index {index} is not below NNODES {config.nnodes}: number the nodes "
            f"0..{config.nnodes - 1} (node 0 hosts the rendezvous)"
        )
    if config.launcher == "slurm":
        raise ConfigError.naming(
            lambda entry: (
                "node index is for nodes started one by one (launcher local); the "
                "slurm launcher starts and numbers every node itself: drop "
                f"{option_hint('node-index', entry)}"
            )
        )


def check_rdzv_endpoint(endpoint: str, nnodes: int) -> None:
    """``host:port`` as torch's c10d rendezvous reads it; several nodes need a real port.

    One node may keep port 0 (any free port); every node of a multinode run must reach the same
    explicit ``host:port``. An empty endpoint or a host alone, which torch would read its own
    way, is refused: the endpoint given is the one the run uses and records.
    """
    multinode = nnodes > 1
    if multinode and endpoint in ("", DEFAULT_RDZV_ENDPOINT):
        raise ConfigError.naming(
            lambda entry: (
                "a multinode run needs a rendezvous endpoint reachable from all nodes: "
                f"set {option_hint('rdzv-endpoint', entry, 'host:port')}, or launch through Slurm, "
                f"which chooses one: {option_hint('launcher', entry, 'slurm')}"
            )
        )
    host, _, port = endpoint.rpartition(":")
    if not (_HOST.fullmatch(host) and re.fullmatch(r"[0-9]{1,5}", port)):
        raise ConfigError.naming(
            lambda entry: (
                f"rendezvous endpoint {quote(endpoint)} is not host:port (a host name "
                "or IPv4 address, or an IPv6 address in brackets: [addr]:port), e.g. "
                f"{option_hint('rdzv-endpoint', entry, 'node001:29400')}"
            )
        )
    lowest = 1 if multinode else 0
    if not lowest <= int(port) <= 65535:
        why = " for a multinode run (every node must find the same port)" if multinode else ""
        raise ConfigError(
            f"rendezvous endpoint {quote(endpoint)}: the port must be from {lowest} to 65535{why}"
        )


def faults_of(config: RunConfig) -> tuple[str, ...]:
    """Every fault the run injects: its schedule's, else its one fault (none for a baseline)."""
    if config.schedule:
        return tuple(f.fault for f in config.schedule)
    return (config.fault,) if config.fault != "none" else ()


def check_schedule(config: RunConfig) -> None:
    """A schedule's run is its first fault's (as PartialRunConfig.config sets it), every entry
    one the injector takes (parse_schedule's rules, held again for a RunConfig built in code)."""
    if not config.schedule:
        return
    first = config.schedule[0]
    if (config.fault, config.fault_window) != (first.fault, first.window):
        raise ConfigError(
            f"fault {config.fault} in window {config.fault_window} is not the fault schedule's "
            f"first, {first}: give either the schedule or one fault"
        )
    for position, entry in enumerate(config.schedule, start=1):
        if entry.window not in windows_at(entry.fault, position):
            raise ConfigError(
                f"fault schedule {render_schedule(config.schedule)}: entry {position} {entry} "
                f"cannot be injected (windows of {entry.fault} as fault {position}: "
                f"{', '.join(windows_at(entry.fault, position)) or 'none'})"
            )


def check_reference_schedule(config: RunConfig) -> None:
    """Every fault the reference workload's run of the schedule must see (those its restart
    budget and NVRx's no-progress stop allow) has its window open before training ends."""
    due, _ = schedule_ending(config.schedule, config.max_restarts, NVRX_NO_PROGRESS_LIMIT)
    needed = reference_iterations_needed(config.schedule[:due], config.save_interval)
    worst = max(needed, default=0)
    if worst <= config.train_iters:
        return
    position = needed.index(worst) + 1
    entry, iters = config.schedule[position - 1], config.train_iters
    raise ConfigError.naming(
        lambda entry_point: (
            f"fault schedule {render_schedule(config.schedule)} on the reference workload: fault"
            f" {position} ({entry}) opens its window only at iteration {worst} (each fault's"
            f" replacement resumes one save interval later), but training ends at {iters}; use"
            f" {option_hint('train-iters', entry_point, str(worst))} or more, or a smaller"
            f" {option_hint('save-interval', entry_point)}"
        )
    )


def check_window(fault: str, window: str | None) -> None:
    """A window only on a fault run, a known one, and one the fault exists in."""
    if window is None:
        return
    if window not in FAULT_WINDOWS:
        raise ConfigError(
            f"window must be one of {', '.join(FAULT_WINDOWS)}, got {quote(repr(window))}"
        )
    if fault == "none":
        raise ConfigError.naming(
            lambda entry: (
                f"window {window} given for fault none: a baseline injects nothing, so "
                f"it has no window; drop {option_hint('window', entry)} or choose a fault: "
                f"{option_hint('fault', entry)}"
            )
        )
    if not window_allowed(fault, window):
        allowed = windows_of(fault)
        why = (
            " (it kills the persistent checkpoint worker while a save is in flight)"
            if fault == "ckpt-worker"
            else ""
        )
        raise ConfigError.naming(
            lambda entry: (
                f"fault {fault} is injected only in window {' or '.join(allowed)}, "
                f"not {window}{why}; use {option_hint('window', entry, allowed[0])}"
            )
        )


def check_extra_args(extra_args: Sequence[str]) -> None:
    """Extra workload arguments may add to the recipe but not override what it sets."""
    for arg in extra_args:
        flag = arg.partition("=")[0]
        if flag in RECIPE_OWNED_ARGS:
            raise _overriding(arg, *RECIPE_OWNED_ARGS[flag])


def _overriding(arg: str, owned: str, setting: str) -> ConfigError:
    return ConfigError.naming(
        lambda entry: (
            f"extra argument {quote(arg)} overrides the recipe's {owned} (the fault "
            "injector and the criteria follow the recipe's value); set it with "
            f"{option_hint(setting, entry)} instead"
        )
    )


def check_plant(config: RunConfig) -> None:
    """A planted run is a self-test's fault run; nothing but the self-test sets it up."""
    if config.plant is None and config.seed_checkpoint is None:
        return
    if not config.selftest:
        raise ConfigError("a plant or a seed checkpoint belongs to a self-test run (selftest)")
    if config.plant is not None and config.plant not in PLANT_NAMES:
        raise ConfigError(
            f"plant must be one of {', '.join(PLANT_NAMES)}, got {quote(repr(config.plant))}"
        )
    if config.fault == "none":
        raise ConfigError("a planted run needs a fault: a plant acts in the recovery from it")
