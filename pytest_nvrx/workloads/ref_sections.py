"""NVRx sections of the reference workload, named as Megatron names them.

``setup`` (opened before distributed init, closed before the first step), ``step`` (around every
training step), ``checkpointing`` (around save preparation and, separately, around async
finalization). Sections go through NVRx's ``RankMonitorClient`` (:class:`FtMonitor`) or nowhere
(:class:`NullMonitor`, ``--no-ft``). Imports no torch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Protocol


class Monitor(Protocol):
    def start_section(self, section: str) -> None: ...
    def end_section(self, section: str) -> None: ...
    def shutdown(self) -> None: ...


class NullMonitor:
    """No monitoring (``--no-ft``): outside ft_launcher, e.g. under torchrun or in tests."""

    def start_section(self, section: str) -> None:
        pass

    def end_section(self, section: str) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def describe(self) -> str:
        return "ft monitoring disabled (--no-ft)"


class FtMonitor:
    """NVRx ``RankMonitorClient`` connected to this rank's monitor, as Megatron's ft_integration."""

    def __init__(self) -> None:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        self._client = RankMonitorClient()
        self._client.init_workload_monitoring()

    def start_section(self, section: str) -> None:
        self._client.start_section(section)

    def end_section(self, section: str) -> None:
        self._client.end_section(section)

    def shutdown(self) -> None:
        self._client.shutdown_workload_monitoring()

    def describe(self) -> str:
        timeouts = self._client.section_timeouts
        sections = ",".join(f"{k}:{v}" for k, v in sorted(timeouts.section.items()))
        return (
            f"ft monitoring initialized sections {sections or '-'} "
            f"out_of_section {timeouts.out_of_section}"
        )


class SectionClock:
    """A monitor that also times each section (monotonic): the longest of each kind goes into
    the rank's last line, the measurement behind the reference deadlines (docs/options.md)."""

    def __init__(self, inner: Monitor) -> None:
        self.inner = inner
        self.longest: dict[str, float] = {}
        self._opened: dict[str, float] = {}

    def start_section(self, section: str) -> None:
        self._opened[section] = time.monotonic()
        self.inner.start_section(section)

    def end_section(self, section: str) -> None:
        self.inner.end_section(section)
        began = self._opened.pop(section, None)
        if began is not None:
            took = time.monotonic() - began
            self.longest[section] = max(took, self.longest.get(section, 0.0))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def summary(self) -> str:
        kinds = " ".join(f"{name} {took:.3f}" for name, took in sorted(self.longest.items()))
        return f"longest sections (s) {kinds or '-'}"


@contextlib.contextmanager
def section(monitor: Monitor, name: str) -> Iterator[None]:
    monitor.start_section(name)
    try:
        yield
    finally:
        monitor.end_section(name)
