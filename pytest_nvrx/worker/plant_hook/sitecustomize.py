"""The self-test's import hook, loaded by Python's ``site`` at start-up in every process whose
``PYTHONPATH`` starts with this directory (the workers of a planted Megatron run, and the
checkpoint workers they spawn). It installs the plant named by ``PYTEST_NVRX_PLANT``
(:mod:`nvrx_plants`) and then runs the ``sitecustomize`` this one hides, if the environment has
one, so a container's own start-up code still runs."""

from __future__ import annotations

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

if os.environ.get("PYTEST_NVRX_PLANT"):
    importlib.import_module("nvrx_plants").install()  # the module beside this one


def _run_hidden_sitecustomize() -> None:
    ours = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        if importlib.util.find_spec("sitecustomize") is not None:
            importlib.import_module("sitecustomize")  # the next one on the path
    finally:
        sys.path[:] = saved
        if "sitecustomize" not in sys.modules and ours is not None:
            sys.modules["sitecustomize"] = ours


_run_hidden_sitecustomize()
