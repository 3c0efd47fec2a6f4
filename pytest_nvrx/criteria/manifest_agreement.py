"""run.json against what the run printed: wherever the run printed a fact run.json records, the
two agree, or the run cannot be judged (fatal, both lines quoted).

run.json is the harness's record of what it launched (config, the workload's argv, the stack it
probed); the launcher and the workers print some of the same facts as they start:

* the launcher's launch-config block (``Starting elastic_operator with launch configs``):
  ``max_restarts`` (and each ``n/M attempts left``: M), ``nproc_per_node``, ``min_nodes`` and
  ``max_nodes``, ``run_id`` against config's ``max_restarts``, ``gpus_per_node``, ``nnodes``,
  ``run_id``; and the launcher never starts more cycles than ``max_restarts`` + 1;
* Megatron's argument dump, in every cycle: ``world_size``, ``tensor_model_parallel_size``,
  ``pipeline_model_parallel_size``, ``train_iters``, ``save_interval``,
  ``use_distributed_optimizer``, ``save`` and ``load`` against config's ``world_size``, ``tp``,
  ``pp``, ``train_iters``, ``save_interval``, ``distributed_optimizer``, ``checkpoint_dir``; and
  every option of run.json's ``workload_argv`` that names a dump entry (``--lr=0.0001`` and
  ``lr ... 0.0001``, numbers compared as numbers; a bare ``--bf16`` is ``True``, a bare
  ``--no-persist-layer-norm`` makes ``persist_layer_norm`` ``False``);
* the versions Megatron prints (``> PyTorch version``, ``> Megatron-Core version``,
  ``> Transformer Engine version``) against ``stack.torch``, ``stack.megatron`` (the version
  before Megatron's ``+<hash>``: that hash is the git revision of the directory it was started
  from, not the checkout's) and ``stack.transformer_engine`` (``0.0.0`` is Megatron's word for
  none); torch's ``+cuNNN`` against ``stack.cuda``;
* the fault-tolerance deadlines every cycle's workers print as their rank monitors start
  (Megatron's ``FT: initialized. Timeouts=...``, the reference workload's ``ft monitoring
  initialized sections ...``) against config's ``section_timeouts`` and
  ``out_of_section_timeout``, and against the other cycles' (in a hand-made run too);
* the reference workload's ``started ... world_size W restart_count R`` line of every rank:
  W against config's ``world_size`` (before run.json recorded one: the launcher's
  ``nproc_per_node`` times its ``max_nodes``), R against the cycle whose log holds it
  (ft_launcher sets ``TORCHELASTIC_RESTART_COUNT`` to the number of the cycle it starts).

Measured on every committed run (111 with run.json): all of them agree. What no line of a run
prints cannot be cross-checked and is not: ``stack``'s ``nvrx``, ``cudnn``, ``nccl``, ``gpu``,
``driver``, ``python`` and ``megatron_rev``; the reference workload prints no versions at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.manifest import Manifest, Setting
from pytest_nvrx.evidence.refs import EvidenceRef, Problem, clip_line
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import (
    FtTimeoutsReported,
    ProcessStarted,
    SettingReported,
    VersionReported,
)

_ATTEMPTS = re.compile(r"(?P<left>\d{1,9})/(?P<max>\d{1,9}) attempts left")
_CUDA_BUILD = re.compile(r"\+cu(?P<digits>\d{2,4})$")
#: Megatron's version of a component it did not find
_TE_ABSENT = "0.0.0"


def manifest_problems(run: RunEvidence) -> tuple[Problem, ...]:
    """Each fact run.json records that a line of the run contradicts (module doc)."""
    manifest = run.manifest
    if manifest is None:
        # a run made by hand: its cycles still agree with each other
        return tuple(_ft_timeouts(run, None)[:1])
    found: list[Problem] = []
    found += _launcher_block(run, manifest)
    found += _host(run, manifest)
    world = _world(run, manifest)
    for log in run.cycle_logs:
        found += _dump(log, manifest)
        found += _started(log, world)
    found += _versions(run, manifest)
    found += _ft_timeouts(run, manifest)
    return tuple(found[:1])


def _host(run: RunEvidence, manifest: Manifest) -> list[Problem]:
    """run.json's host is one the launcher's own lines name (NVRx prints its host on each)."""
    host, hosts = manifest.host, run.launcher.hosts
    if host is None or not hosts or host.value in hosts:
        return []
    return [
        Problem(
            "fatal",
            f"{host.ref.location} records host {host.value!r}, but the launcher's lines"
            f" ({run.launcher.file}) name only {', '.join(map(repr, sorted(hosts)))}: run.json is"
            " not the record of the run that printed them",
            host.ref,
        )
    ]


def _disagree(ours: EvidenceRef, said: str, theirs: EvidenceRef, what: str) -> Problem:
    return Problem(
        "fatal",
        f"{theirs.location} says {clip_line(said, 80)}, but {ours.location} records {what}:"
        " run.json is not the record of the run that printed it",
        theirs,
    )


def _settings_printed(
    recorded: Iterable[tuple[Setting | None, str]],
    printed: Mapping[str, tuple[str, EvidenceRef]],
    agree: Callable[[str, object], bool],
) -> list[Problem]:
    """Each setting run.json records (None: not recorded) that the run printed, under the name
    beside it (``printed``: the text and its line), where ``agree`` says the two differ."""
    out: list[Problem] = []
    for setting, name in recorded:
        said = printed.get(name)
        if setting is None or said is None:
            continue
        text, ref = said
        if not agree(text, setting.value):
            out.append(_disagree(setting.ref, f"{name} {text}", ref, f"{setting.value}"))
    return out


def _launcher_block(run: RunEvidence, manifest: Manifest) -> list[Problem]:
    launcher = run.launcher
    config, refs = launcher.config, launcher.config_refs
    pairs: list[tuple[Setting | None, str]] = [
        (manifest.max_restarts, "max_restarts"),
        (manifest.gpus_per_node, "nproc_per_node"),
        (manifest.nnodes, "min_nodes"),
        (manifest.nnodes, "max_nodes"),
        (manifest.run_id, "run_id"),
    ]
    printed = {key: (config[key], ref) for key, ref in refs.items() if key in config}
    out = _settings_printed(pairs, printed, lambda text, value: text == str(value))
    restarts = manifest.max_restarts
    if restarts is not None and isinstance(restarts.value, int):
        for event in launcher.events:
            m = _ATTEMPTS.search(event.ref.text)
            if m is not None and int(m["max"]) != restarts.value:
                out.append(
                    _disagree(
                        restarts.ref,
                        f"{m[0]} (a budget of {m['max']} restarts)",
                        event.ref,
                        f"max_restarts {restarts.value}",
                    )
                )
                break
        over = [r for r in run.cycles if r.cycle > restarts.value]
        if over:
            out.append(
                _disagree(
                    restarts.ref,
                    f"cycle {over[0].cycle} ran (restart {over[0].cycle})",
                    over[0].ref,
                    f"max_restarts {restarts.value}: the launcher restarts no more often",
                )
            )
    return out


def _same(printed: str, recorded: object) -> bool:
    if isinstance(recorded, bool):
        return printed == str(recorded)
    text = str(recorded)
    if printed == text:
        return True
    try:
        return float(printed) == float(text)
    except ValueError:
        return False


def _dump(log: CycleLog, manifest: Manifest) -> list[Problem]:
    dump = {e.name: e for e in reversed(log.settings)}
    if not dump:
        return []
    config: list[tuple[Setting | None, str]] = [
        (manifest.world_size, "world_size"),
        (manifest.tp, "tensor_model_parallel_size"),
        (manifest.pp, "pipeline_model_parallel_size"),
        (manifest.train_iters, "train_iters"),
        (manifest.save_interval, "save_interval"),
        (manifest.distributed_optimizer, "use_distributed_optimizer"),
        (manifest.checkpoint_dir, "save"),
        (manifest.checkpoint_dir, "load"),
    ]
    printed = {name: (entry.value, entry.ref) for name, entry in dump.items()}
    # a directory with or without its trailing slash is the same directory
    out = _settings_printed(
        config, printed, lambda text, value: _same(text.rstrip("/"), str(value).rstrip("/"))
    )
    out += _argv_against_dump(manifest, dump)
    return out


def _argv_options(argv: Sequence[str]) -> Iterable[tuple[str, str | None]]:
    """``(dest, value)`` of each ``--option[=value]`` (None: a bare flag), as argparse names its
    destination (dashes to underscores)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--") or arg == "--":
            continue
        name, eq, value = arg[2:].partition("=")
        if not eq and i < len(argv) and not argv[i].startswith("-"):
            value, eq = argv[i], "="
            i += 1
        yield name.replace("-", "_"), value if eq else None


def _argv_against_dump(manifest: Manifest, dump: dict[str, SettingReported]) -> list[Problem]:
    ref = manifest.workload_argv_ref
    if ref is None:
        return []
    for dest, value in _argv_options(manifest.workload_argv):
        if value is not None:
            entry, want = dump.get(dest), value
        elif dest in dump:
            entry, want = dump[dest], "True"
        elif dest.startswith("no_") and dest[3:] in dump:
            entry, want = dump[dest[3:]], "False"
        else:
            continue
        if entry is not None and not _same(entry.value, want):
            option = f"--{dest.replace('_', '-')}" + (f"={value}" if value is not None else "")
            return [
                _disagree(
                    ref,
                    f"{entry.name} {entry.value}",
                    entry.ref,
                    f"the workload's option {clip_line(option, 60)}",
                )
            ]
    return []


def _world(run: RunEvidence, manifest: Manifest) -> Setting | None:
    """The run's world size and the line that says it: run.json's, else (a run recorded before
    run.json named it) the launcher's ``nproc_per_node`` times its ``max_nodes``."""
    if manifest.world_size is not None:
        return manifest.world_size
    config, refs = run.launcher.config, run.launcher.config_refs
    per, nodes = config.get("nproc_per_node", ""), config.get("max_nodes", "1")
    ref = refs.get("nproc_per_node")
    if per.isdigit() and nodes.isdigit() and ref is not None and len(per + nodes) < 12:
        return Setting(int(per) * int(nodes), ref)
    return None


def _started(log: CycleLog, world: Setting | None) -> list[Problem]:
    for event in log.of_type(ProcessStarted):
        if event.restart_count is not None and event.restart_count != log.cycle:
            return [
                Problem(
                    "fatal",
                    f"{event.ref.location} says restart_count {event.restart_count} in the log"
                    f" of cycle {log.cycle}: ft_launcher starts cycle {log.cycle}'s workers with"
                    f" restart count {log.cycle}, so the line is not this cycle's",
                    event.ref,
                )
            ]
        if world is not None and event.world_size != world.value:
            return [
                _disagree(world.ref, f"world_size {event.world_size}", event.ref, f"{world.value}")
            ]
    return []


def _versions(run: RunEvidence, manifest: Manifest) -> list[Problem]:
    stack = manifest.stack
    if not stack:
        return []
    for log in run.cycle_logs:
        for event in log.of_type(VersionReported):
            recorded = stack.get(event.component, "(absent)")
            printed = event.version
            key = "megatron" if event.component == "megatron_core" else event.component
            where = manifest.stack_refs.get(key, EvidenceRef(manifest.file, None, "(stack)"))
            if event.component == "megatron_core":
                recorded = stack.get("megatron", "(absent)")
                printed = printed.split("+", 1)[0] if printed is not None else None
            if event.component == "transformer_engine" and printed == _TE_ABSENT:
                printed = None
            if recorded == "(absent)":
                continue
            if printed != recorded:
                return [
                    _disagree(
                        where,
                        f"{event.component} {printed or 'none'}",
                        event.ref,
                        f"stack {event.component} {recorded or 'none'}",
                    )
                ]
            if event.component == "torch" and printed is not None:
                m = _CUDA_BUILD.search(printed)
                cuda = stack.get("cuda")
                if m is not None and isinstance(cuda, str) and cuda.replace(".", "") != m["digits"]:
                    return [
                        _disagree(
                            manifest.stack_refs.get("cuda", where),
                            f"torch {printed} (built for CUDA {m['digits']})",
                            event.ref,
                            f"stack cuda {cuda}",
                        )
                    ]
    return []


def _deadlines(manifest: Manifest | None) -> tuple[tuple[tuple[str, float], ...], float] | None:
    """run.json's ``section_timeouts`` (``setup:120,step:10,checkpointing:30``, what the
    launcher is given) and ``out_of_section_timeout`` as the workers print them; None where
    either is not recorded or not in that form."""
    if manifest is None:
        return None
    spec, out = manifest.section_timeouts, manifest.out_of_section_timeout
    if spec is None or out is None or not isinstance(spec.value, str):
        return None
    sections: list[tuple[str, float]] = []
    for part in spec.value.split(","):
        name, colon, value = part.strip().partition(":")
        try:
            seconds = float(value) if value.isascii() else None
        except ValueError:
            seconds = None
        if not colon or seconds is None:
            return None
        sections.append((name, seconds))
    return tuple(sorted(sections)), float(out.value)


def _render(sections: tuple[tuple[str, float], ...], out: float) -> str:
    return ",".join(f"{n}:{v:g}" for n, v in sections) + f" out_of_section {out:g}"


def _ft_timeouts(run: RunEvidence, manifest: Manifest | None) -> list[Problem]:
    """The deadlines each cycle's workers say their rank monitors run with (FtTimeoutsReported)
    against run.json's and against each other: NVRx gives every cycle's ranks the launcher's
    ``--ft-rank-section-timeouts`` and ``--ft-rank-out-of-section-timeout``, so a cycle that
    printed others ran under another launch (its hang deadlines, the detection the recovery
    clock measures, are not the ones judged). A line where NVRx says it calculated them itself
    (Megatron's ``--calc-ft-timeouts``: ``calculated_sections`` not empty) is not the launcher's
    and is compared with nothing."""
    wanted = _deadlines(manifest)
    first: FtTimeoutsReported | None = None
    for log in run.cycle_logs:
        for event in log.of_type(FtTimeoutsReported):
            if event.calculated:
                continue
            said = _render(event.sections, event.out_of_section)
            if wanted is not None and (event.sections, event.out_of_section) != wanted:
                assert manifest is not None and manifest.section_timeouts is not None
                return [
                    _disagree(
                        manifest.section_timeouts.ref,
                        f"fault-tolerance deadlines {said}",
                        event.ref,
                        f"section_timeouts {_render(*wanted)}",
                    )
                ]
            if first is None:
                first = event
            elif (event.sections, event.out_of_section) != (first.sections, first.out_of_section):
                return [
                    Problem(
                        "fatal",
                        f"{event.ref.location} says the fault-tolerance deadlines are {said},"
                        f" but {first.ref.location} says"
                        f" {_render(first.sections, first.out_of_section)}: ft_launcher gives"
                        " every rank of every cycle the same ones, so these lines are not of"
                        " one launch",
                        event.ref,
                    )
                ]
    return []
