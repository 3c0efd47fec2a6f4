"""``run.json`` against itself: every setting it states twice must be stated once.

run.json (written by :mod:`pytest_nvrx.launch.recipe` from one recipe) states some settings twice,
and the two must agree (:attr:`pytest_nvrx.evidence.manifest.Manifest.contradictions`, fatal in
criteria/consistency.py, naming both lines): a top-level key and the same key under ``config``;
``workload_argv``'s ``--train-iters``/``--save-interval`` and config's
``train_iters``/``save_interval``; ``launcher_argv``'s ``--nproc-per-node``/``--nnodes`` and
config's ``gpus_per_node``/``nnodes``; config's ``world_size`` is ``nnodes * gpus_per_node``;
and the launcher's and the injector's arguments, the paths they name, ``env.NVRX_RUN_ID`` and
``command`` against config (:func:`_launch_contradictions`). A difference is an edited record,
never a run. Reading run.json (its fields and their types) is evidence/manifest.py's; this
module only compares what it states with itself, by the lines of its text.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath
from typing import Any, TypeGuard

from pytest_nvrx.evidence.refs import MAX_JSON_BYTES, EvidenceRef, Problem, clip_line, read_capped
from pytest_nvrx.layout import (
    APPLOG_PREFIX_NAME,
    CYCLE_INFOS_DIR,
    LAUNCHER_LOG_NAME,
    LOGS_DIR,
    MARKER_NAME,
    TRACKER_NAME,
)


def contradictions(
    data: dict[str, Any], path: Path, run_dir: Path, file: str
) -> tuple[Problem, ...]:
    """Each setting run.json (``data``, parsed from ``path``, shown as ``file``) states twice
    with two values (module doc), naming both lines."""
    return tuple(_contradictions(data, file, _key_lines(_text(path, run_dir, file))))


def _text(path: Path, run_dir: Path, file: str) -> str:
    """run.json's text again (already read and parsed once), for the line of a nested key."""
    try:
        return read_capped(path, MAX_JSON_BYTES, run_dir, shown=file).decode("utf-8", "replace")
    except OSError:
        return ""


_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[{}\[\]\n]')
_COLON = re.compile(r"\s*:")


def _key_lines(text: str) -> dict[tuple[str, ...], tuple[int, str]]:
    """The line of each object key, by its path (``("config", "run_id")``; the first of
    repeated ones): a top-level key and the same key under ``config`` are told apart."""
    found: dict[tuple[str, ...], tuple[int, str]] = {}
    rows = text.splitlines()
    path: list[str | None] = []  # the key each open container is the value of
    key: str | None = None
    line = 1
    for m in _TOKEN.finditer(text):
        token = m[0]
        if token == "\n":
            line += 1
        elif token in "{[":
            path.append(key)
            key = None
        elif token in "}]":
            if path:
                path.pop()
            key = None
        elif _COLON.match(text, m.end()) is not None:
            try:
                key = json.loads(token)
            except ValueError:
                key = None
            outer = [k for k in path[1:] if k is not None]
            if isinstance(key, str) and len(outer) == len(path[1:]):
                row = rows[line - 1] if line <= len(rows) else ""
                found.setdefault((*outer, key), (line, clip_line(row)))
    return found


def argv_option(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last ``--name=value`` or ``--name value`` of ``names`` (what argparse
    reads); None when none is given."""
    value: str | None = None
    for i, arg in enumerate(argv):
        name, eq, given = arg.partition("=")
        if name in names:
            value = given if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return value


def _shown(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _contradictions(
    data: dict[str, Any], file: str, lines: dict[tuple[str, ...], tuple[int, str]]
) -> list[Problem]:
    """Each setting run.json states twice with two values (module doc), naming both lines."""
    out: list[Problem] = []

    def ref(*path: str) -> EvidenceRef:
        found = lines.get(path)
        if found is None:
            return EvidenceRef(file, None, f"({'.'.join(path)})")
        return EvidenceRef(file, found[0], found[1])

    def say(text: str, at: EvidenceRef) -> None:
        out.append(Problem("fatal", f"{text}: run.json contradicts itself", at))

    config = data.get("config")
    config = config if isinstance(config, dict) else {}
    for key, value in data.items():
        other = config.get(key) if key != "config" else None
        if value is None or other is None or json.dumps(value) == json.dumps(other):
            continue
        top, inner = ref(key), ref("config", key)
        say(
            f"{top.location} says {key} {_shown(value)}, but {inner.location} (config.{key})"
            f" says {_shown(other)}",
            inner,
        )
    for name, options in (
        (
            "workload_argv",
            ((("--train-iters",), "train_iters"), (("--save-interval",), "save_interval")),
        ),
        (
            "launcher_argv",
            (
                (("--nproc-per-node", "--nproc_per_node"), "gpus_per_node"),
                (("--nproc-per-node", "--nproc_per_node"), "nproc_per_node"),
                (("--nnodes",), "nnodes"),
            ),
        ),
    ):
        argv = data.get(name)
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            continue
        if name == "workload_argv" and "--" in argv:
            argv = argv[argv.index("--") + 1 :]  # the workload's own options
        for names, key in options:
            _argv_against_config(argv, ref(name), config, ref, say, names, key)
    _launch_contradictions(data, config, ref, say)
    # runs recorded before gpus_per_node named it nproc_per_node
    per_node = "gpus_per_node" if config.get("gpus_per_node") is not None else "nproc_per_node"
    world, nnodes, gpus = (config.get(k) for k in ("world_size", "nnodes", per_node))
    if _is_int(world) and _is_int(nnodes) and _is_int(gpus) and world != nnodes * gpus:
        say(
            f"{ref('config', 'world_size').location} says world_size {world}, but"
            f" {ref('config', 'nnodes').location} and {ref('config', per_node).location}"
            f" say {nnodes} node(s) of {gpus} GPU(s): {nnodes * gpus} rank(s)",
            ref("config", "world_size"),
        )
    return out


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _argv_against_config(
    argv: Sequence[str],
    argv_ref: EvidenceRef,
    config: dict[str, Any],
    ref: Callable[..., EvidenceRef],
    say: Callable[[str, EvidenceRef], None],
    names: tuple[str, ...],
    key: str,
) -> None:
    """Says (``say``) when an option of ``argv`` is given a value other than config's ``key``
    (``--nnodes`` may be a ``MIN:MAX`` range that holds it)."""
    wanted = config.get(key)
    given = argv_option(argv, *names)
    if given is None or not _is_int(wanted):
        return
    assert isinstance(wanted, int)
    low, colon, high = given.partition(":")
    try:
        if colon and key == "nnodes":
            agrees = int(low) <= wanted <= int(high)
        else:
            agrees = given.isascii() and given.isdigit() and int(given) == wanted
    except ValueError:
        agrees = False
    if not agrees:
        inner = ref("config", key)
        say(
            f"{argv_ref.location} passes {names[0]} {given!r}, but {inner.location}"
            f" (config.{key}) says {wanted}",
            inner,
        )


#: what ft_launcher is given, each the ``launcher_argv`` option recipe.launcher_argv spells from
#: a config key (a number compared as one: ``60`` and ``60.0`` are the same deadline)
_LAUNCHER_FROM_CONFIG: tuple[tuple[str, str, bool], ...] = (
    ("--rdzv-id", "run_id", False),
    ("--rdzv-endpoint", "rdzv_endpoint", False),
    ("--max-restarts", "max_restarts", True),
    ("--ft-rank-section-timeouts", "section_timeouts", False),
    ("--ft-rank-out-of-section-timeout", "out_of_section_timeout", True),
    ("--ft-workload-check-interval", "workload_check_interval", True),
)

#: the injector's options (``workload_argv`` before its ``--``), each spelled by
#: recipe.injector_argv from a config key
_INJECTOR_FROM_CONFIG: tuple[tuple[str, str, bool], ...] = (
    ("--fault-rank", "fault_rank", True),
    ("--checkpoint-dir", "checkpoint_dir", False),
)


def _same_value(given: str, wanted: object, numeric: bool) -> bool:
    if numeric:
        if not (isinstance(wanted, int | float) and not isinstance(wanted, bool)):
            return False
        try:
            return given.isascii() and float(given) == float(wanted)
        except ValueError:
            return False
    return isinstance(wanted, str) and given == wanted


def _launch_contradictions(
    data: dict[str, Any],
    config: dict[str, Any],
    ref: Callable[..., EvidenceRef],
    say: Callable[[str, EvidenceRef], None],
) -> None:
    """run.json's record of the launch against its own config: the launcher's and the
    injector's arguments (recipe.launcher_argv, recipe.injector_argv spell them from config),
    the paths they name (all in one run directory), the environment, and ``command``, which is
    ``env`` and both argvs shell-quoted (recipe.Recipe.shell_command). The harness writes all
    of them from one recipe, so a difference is an edited record, never a run: the launcher or
    the injector would have been given something else than the config that is judged. A key
    that runs recorded before it existed (config.run_id, rdzv_endpoint, checkpoint_dir,
    work_dir; the injector of the first baselines) is compared only where recorded."""
    launcher = data.get("launcher_argv")
    workload = data.get("workload_argv")
    launcher = launcher if _strings(launcher) else None
    workload = workload if _strings(workload) else None
    run_id = config.get("run_id") if config.get("run_id") is not None else data.get("run_id")
    wanted = {**config, "run_id": run_id}

    def compare(
        argv: Sequence[str], argv_name: str, table: tuple[tuple[str, str, bool], ...]
    ) -> None:
        for option, key, numeric in table:
            given, value = argv_option(argv, option), wanted.get(key)
            if key not in wanted or (key == "run_id" and run_id is None):
                continue  # a run recorded before config held the key
            if value is None and given is None:
                continue
            if value is None or given is None or not _same_value(given, value, numeric):
                at = ref("config", key) if key in config else ref(key)
                passes = f"passes {option} {given!r}" if given is not None else f"has no {option}"
                say(
                    f"{ref(argv_name).location} {passes}, but {at.location} ({key}) says"
                    f" {_shown(value)}",
                    at,
                )

    if launcher is not None:
        compare(launcher, "launcher_argv", _LAUNCHER_FROM_CONFIG)
        port = data.get("log_server_port")
        given = argv_option(launcher, "--ft-log-server-port")
        if port is not None and (given is None or not _same_value(given, port, True)):
            say(
                f"{ref('launcher_argv').location} passes --ft-log-server-port {given!r}, but"
                f" {ref('log_server_port').location} says {_shown(port)}",
                ref("log_server_port"),
            )
    injector = workload[: workload.index("--")] if workload and "--" in workload else None
    if injector is not None:
        compare(injector, "workload_argv", _INJECTOR_FROM_CONFIG)
        _injector_fault(injector, config, ref, say)
    _one_run_dir(launcher or (), injector or (), config, run_id, ref, say)
    env = data.get("env")
    if isinstance(env, dict) and run_id is not None and env.get("NVRX_RUN_ID") != run_id:
        at = ref("config", "run_id") if "run_id" in config else ref("run_id")
        say(
            f"{ref('env', 'NVRX_RUN_ID').location} (env.NVRX_RUN_ID) says"
            f" {_shown(env.get('NVRX_RUN_ID'))}, but {at.location} (run_id) says"
            f" {_shown(run_id)}",
            ref("env", "NVRX_RUN_ID"),
        )
    command = data.get("command")
    if (
        isinstance(command, str)
        and isinstance(env, dict)
        and all(isinstance(v, str) for v in env.values())
        and launcher is not None
        and workload is not None
    ):
        spelled = " ".join(
            [
                *(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())),
                *(shlex.quote(a) for a in (*launcher, *workload)),
            ]
        )
        if command != spelled:
            say(
                f"{ref('command').location} (command) is not env, launcher_argv and"
                f" workload_argv as they are recorded ({_first_difference(command, spelled)})",
                ref("command"),
            )


def _strings(value: object) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(a, str) for a in value)


def _first_difference(one: str, other: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(one, other, strict=False)) if a != b), None)
    if at is None:
        at = min(len(one), len(other))
    return f"from character {at + 1}: {_shown(one[at : at + 30])} vs {_shown(other[at : at + 30])}"


def _injector_fault(
    injector: Sequence[str],
    config: dict[str, Any],
    ref: Callable[..., EvidenceRef],
    say: Callable[[str, EvidenceRef], None],
) -> None:
    """The fault the injector was launched for (``--schedule``, or ``--fault`` and
    ``--window``) against config's: the one the marker and the logs are judged by."""
    schedule = config.get("schedule")
    pairs: list[tuple[str, str, object]] = []
    if schedule:
        spelled = ",".join(schedule) if _strings(schedule) else schedule
        pairs.append(("--schedule", "schedule", spelled))
    else:
        pairs.append(("--fault", "fault", config.get("fault")))
        if config.get("window") is not None:
            # a window recorded: the injector is given it (a run before windows has neither)
            pairs.append(("--window", "window", config.get("window")))
    for option, key, value in pairs:
        given = argv_option(injector, option)
        if value is None and given is None:
            continue
        if given != value:
            at = ref("config", key)
            passes = f"passes {option} {given!r}" if given is not None else f"has no {option}"
            say(
                f"{ref('workload_argv').location} {passes}, but {at.location} (config.{key})"
                f" says {_shown(value)}",
                at,
            )


def _one_run_dir(
    launcher: Sequence[str],
    injector: Sequence[str],
    config: dict[str, Any],
    run_id: object,
    ref: Callable[..., EvidenceRef],
    say: Callable[[str, EvidenceRef], None],
) -> None:
    """The paths the launcher and the injector are given name one run directory (the
    walkthrough's layout: layout.RunLayout) under config's ``work_dir``/runs/<run id>, and
    the tracker NVRx watches is the one in config's (or the injector's) checkpoint dir."""
    infos = argv_option(launcher, "--ft-cycle-info-dir")
    run_dir = str(PurePath(infos).parent) if infos else None
    expected: list[tuple[Sequence[str], str, str, str | None]] = []
    if run_dir is not None:
        work_dir = config.get("work_dir")
        if isinstance(work_dir, str) and isinstance(run_id, str):
            at = str(PurePath(work_dir) / "runs" / run_id / CYCLE_INFOS_DIR)
            expected.append((launcher, "launcher_argv", "--ft-cycle-info-dir", at))
        logs = PurePath(run_dir) / LOGS_DIR
        expected += [
            (
                launcher,
                "launcher_argv",
                "--ft-per-cycle-applog-prefix",
                str(logs / APPLOG_PREFIX_NAME),
            ),
            (launcher, "launcher_argv", "--ft-nvrx-logfile", str(logs / LAUNCHER_LOG_NAME)),
            (injector, "workload_argv", "--fault-marker", str(PurePath(run_dir) / MARKER_NAME)),
        ]
    checkpoints = config.get("checkpoint_dir")
    if not isinstance(checkpoints, str):
        checkpoints = argv_option(injector, "--checkpoint-dir")
    if checkpoints:
        tracker = str(PurePath(checkpoints) / TRACKER_NAME)
        expected.append((launcher, "launcher_argv", "--ft-checkpoint-iteration-file", tracker))
    for argv, name, option, path in expected:
        if not argv:
            continue
        given = argv_option(argv, option)
        if given is not None and path is not None and PurePath(given) != PurePath(path):
            say(
                f"{ref(name).location} passes {option} {given!r}, not {path!r}: the run"
                f" directory and checkpoint dir the rest of run.json names",
                ref(name),
            )
