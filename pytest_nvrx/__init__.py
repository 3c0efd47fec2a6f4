"""pytest-nvrx: qualify fault recovery of Megatron-LM GPT training under NVRx ft_launcher."""

from __future__ import annotations

__version__ = "0.1.0"
