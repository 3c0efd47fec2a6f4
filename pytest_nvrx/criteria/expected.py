"""Which fault a run was meant to see, in which window, and where that was learned: what the
criteria judge by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.layout import (
    FAULT_WINDOWS,
    INJECTED_FAULTS,
    MANIFEST_NAME,
    MARKER_NAME,
    FaultKind,
)

#: What a judgement expects: one fault (FaultKind, ``none`` for a baseline) or ``any``.
FaultExpectation = FaultKind | Literal["any"]
FAULT_CHOICES = (*INJECTED_FAULTS, "none")
WINDOW_CHOICES = FAULT_WINDOWS


@dataclass(frozen=True, slots=True)
class ExpectedFault:
    """Which fault the run was supposed to see, and where that was learned."""

    kind: FaultExpectation
    source: str
    ref: EvidenceRef

    @property
    def baseline(self) -> bool:
        return self.kind == "none"


def expected_fault(
    run: RunEvidence, override: str | None = None, source: str = "caller"
) -> ExpectedFault:
    """An explicit ``override`` > run.json's ``config.fault`` > the marker's ``fault`` >
    "some fault" (verify exists to judge fault runs; a baseline must say so)."""
    if override is not None:
        if override not in FAULT_CHOICES:
            raise ValueError(
                f"expected fault {override!r}: choose one of {', '.join(FAULT_CHOICES)}"
            )
        kind: FaultExpectation = override  # type: ignore[assignment]
        return ExpectedFault(
            kind, source, EvidenceRef(f"({source})", None, f"expected fault: {kind}")
        )
    manifest = run.manifest
    if manifest is not None and manifest.fault is not None:
        value = manifest.fault.value
        if value in FAULT_CHOICES:
            return ExpectedFault(value, MANIFEST_NAME, manifest.fault.ref)
    marker = run.marker
    if marker is not None and marker.ok and marker.fault in INJECTED_FAULTS:
        return ExpectedFault(marker.fault, MARKER_NAME, marker.ref("fault"))  # type: ignore[arg-type]
    return ExpectedFault(
        "any",
        "default",
        EvidenceRef(MANIFEST_NAME, None, "(no run.json fault setting: a fault run is expected)"),
    )


@dataclass(frozen=True, slots=True)
class ExpectedWindow:
    """The fault window the run asked for (``step``, ``save``, ``finalize``), and where that was
    learned; ``window`` None: none was asked for (a run made before fault windows, a baseline,
    or a caller that does not say), so the marker's own window, if it records one, is judged."""

    window: str | None
    source: str
    ref: EvidenceRef


def expected_window(
    run: RunEvidence, override: str | None = None, source: str = "caller"
) -> ExpectedWindow:
    """An explicit ``override`` > run.json's ``config.window`` > none requested."""
    if override is not None:
        if override not in WINDOW_CHOICES:
            raise ValueError(
                f"expected window {override!r}: choose one of {', '.join(WINDOW_CHOICES)}"
            )
        return ExpectedWindow(
            override, source, EvidenceRef(f"({source})", None, f"expected window: {override}")
        )
    manifest = run.manifest
    if manifest is not None and manifest.window is not None:
        value = manifest.window.value
        if value in WINDOW_CHOICES:
            return ExpectedWindow(value, MANIFEST_NAME, manifest.window.ref)
    return ExpectedWindow(
        None,
        "default",
        EvidenceRef(MANIFEST_NAME, None, "(no run.json window setting: none was requested)"),
    )
