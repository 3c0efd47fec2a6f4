"""How often the CLI's orchestration enters each module of ours, measured on a real call.

:func:`trace_entries` runs a callable (``cli.main([...])``) under :func:`sys.setprofile` and
records every call made *from the spine* into another module of ``pytest_nvrx``. The spine
(:data:`SPINE`) is the code whose job is to sequence the stages of ``python -m pytest_nvrx
run`` and ``verify``: ``cli.py`` (parse, plan, launch and wait, print the launcher's exit),
``launch/run.py`` (plan: validate, claim, build the recipe; launch and wait) and ``verify.py``
(load, judge, report). A module the spine calls is a stage; what a stage calls inside itself is
its own business.

One entry into module M is one place in the spine (its file and line, and the function of M
called) whose call runs code of M, once or many times (a loop over the settings table is one
visit). Calls through code that is not ours (argparse calling the ``type=`` the spine gave it,
contextlib entering a ``@contextmanager``) are the spine's calls. Not counted:

* a spine function calling another of its own module (``cli.py`` calling ``launch/run.py`` is
  an entry into ``launch/run.py``);
* ``@property`` and ``functools.cached_property`` getters (an attribute read, not a step) and a
  module's body run by its first import;
* :data:`LEAF_UTILITIES`, used by every stage for one small thing and holding no step of the
  flow: ``evidence/refs.py``'s ``printable`` (untrusted text escaped for a terminal) and
  ``outputs.py``'s ``write_atomic`` and ``write_output`` (a file written whole or not at all,
  the latter making its parent directories: every file a command writes).

Only the calling thread is traced: the spine runs there (the launcher's reader threads run none
of it).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_nvrx

PKG = str(Path(pytest_nvrx.__file__).resolve().parent) + os.sep

#: the orchestration spine: the modules that sequence the stages (paths in the package)
SPINE = frozenset({"cli.py", "launch/run.py", "verify.py"})

#: (module, function) of utilities every stage uses for one small thing (module docstring)
LEAF_UTILITIES = frozenset(
    {
        ("evidence/refs.py", "printable"),
        ("outputs.py", "write_atomic"),
        ("outputs.py", "write_output"),
    }
)


@dataclass(frozen=True)
class Entry:
    """One place in the spine that enters another module: ``caller:line`` calls ``callee``."""

    caller: str
    line: int
    callee: str

    def __str__(self) -> str:
        return f"{self.caller}:{self.line} -> {self.callee}"


@dataclass(frozen=True)
class Entries:
    """Per entered module, the places in the spine that entered it."""

    by_module: dict[str, frozenset[Entry]]

    def counts(self) -> dict[str, int]:
        return {module: len(places) for module, places in sorted(self.by_module.items())}

    def over(self, limit: int) -> dict[str, list[str]]:
        """The modules entered more than ``limit`` times, each with its entries."""
        return {
            module: sorted(map(str, places))
            for module, places in sorted(self.by_module.items())
            if len(places) > limit
        }


def _ours(filename: str) -> str | None:
    return filename[len(PKG) :] if filename.startswith(PKG) else None


def _spine_caller(frame: types.FrameType, spine: frozenset[str]) -> types.FrameType | None:
    """The nearest frame of ours that led to ``frame``'s call, when it is the spine's."""
    back = frame.f_back
    while back is not None:
        module = _ours(back.f_code.co_filename)
        if module is not None:
            return back if module in spine else None
        back = back.f_back
    return None


def _property_codes() -> frozenset[types.CodeType]:
    """The code of every property getter of ours that is loaded now."""
    codes: set[types.CodeType] = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith("pytest_nvrx") or module is None:
            continue
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != name:
                continue
            for attr in vars(cls).values():
                getter = (
                    attr.fget
                    if isinstance(attr, property)
                    else attr.func
                    if isinstance(attr, functools.cached_property)
                    else None
                )
                code = getattr(getter, "__code__", None)
                if code is not None:
                    codes.add(code)
    return frozenset(codes)


def trace_entries[T](call: Callable[[], T], spine: frozenset[str] = SPINE) -> tuple[T, Entries]:
    """``call()``'s result and the entries of ``spine`` (module paths in the package) into
    other modules while it ran."""
    seen: dict[tuple[str, int, types.CodeType], str] = {}

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = _ours(frame.f_code.co_filename)
        if callee is None:
            return
        caller = _spine_caller(frame, spine)
        if caller is None:
            return
        caller_module = _ours(caller.f_code.co_filename)
        if caller_module is None or caller_module == callee:
            return
        seen.setdefault((caller_module, caller.f_lineno, frame.f_code), callee)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(previous)
    properties = _property_codes()
    by_module: defaultdict[str, set[Entry]] = defaultdict(set)
    for (caller_module, line, code), callee in seen.items():
        if (
            code in properties
            or code.co_name == "<module>"
            or (callee, code.co_name) in LEAF_UTILITIES
        ):
            continue
        by_module[callee].add(Entry(caller_module, line, f"{callee}:{code.co_qualname}"))
    return result, Entries({m: frozenset(p) for m, p in by_module.items()})


def report(entries: Entries) -> Iterator[str]:
    """One line per entered module (its count), its entries indented under it."""
    for module, places in sorted(entries.by_module.items()):
        yield f"{module}: {len(places)}"
        yield from (f"    {place}" for place in sorted(map(str, places)))


if __name__ == "__main__":
    # python -m tests.helpers.spine_trace run ... --work-dir W --run-id R [--then-verify]: the
    # measure by hand (verify --json of the run dir after a run that exited 0)
    from pytest_nvrx import cli

    args = sys.argv[1:]
    then_verify = "--then-verify" in args
    args = [a for a in args if a != "--then-verify"]
    run_dir = Path(args[args.index("--work-dir") + 1], "runs", args[args.index("--run-id") + 1])

    def flow() -> int:
        status = cli.main(args)
        if not then_verify or status != 0:
            return status
        return cli.main(["verify", str(run_dir), "--json", str(run_dir.parent / "verify.json")])

    status, found = trace_entries(flow)
    print(f"exit {status}", file=sys.stderr)
    for text in report(found):
        print(text, file=sys.stderr)
