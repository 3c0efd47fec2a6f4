"""Workloads that pytest-nvrx launches under ft_launcher.

``reference`` is a tiny GPT in plain torch on CPU (gloo) that stands in for Megatron's
``pretrain_gpt.py`` where there is no GPU. It is not imported here: importing this package must
stay cheap (no torch) for the plugin and the injector.
"""

from __future__ import annotations
