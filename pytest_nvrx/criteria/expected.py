"""Which fault a run was meant to see, in which window, and where that was learned: what the
criteria judge by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pytest_nvrx.evidence.manifest import Setting
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.layout import (
    FAULT_WINDOWS,
    INJECTED_FAULTS,
    MANIFEST_NAME,
    MARKER_NAME,
    SCHEDULE_WINDOWS,
    FaultKind,
)

#: What a judgement expects: one fault (FaultKind, ``none`` for a baseline) or ``any``.
FaultExpectation = FaultKind | Literal["any"]
FAULT_CHOICES = (*INJECTED_FAULTS, "none")
WINDOW_CHOICES = FAULT_WINDOWS
#: what run.json (or a schedule's fault, criteria/schedule_recoveries.py) may record as the window
RECORDED_WINDOWS = (*FAULT_WINDOWS, *SCHEDULE_WINDOWS)


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
        ref = _callers_choice("fault", override, FAULT_CHOICES, source)
        return ExpectedFault(override, source, ref)  # type: ignore[arg-type]
    recorded = _recorded(run.manifest.fault if run.manifest is not None else None, FAULT_CHOICES)
    if recorded is not None:
        return ExpectedFault(recorded[0], MANIFEST_NAME, recorded[1])  # type: ignore[arg-type]
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
        ref = _callers_choice("window", override, WINDOW_CHOICES, source)
        return ExpectedWindow(override, source, ref)
    recorded = _recorded(
        run.manifest.window if run.manifest is not None else None, RECORDED_WINDOWS
    )
    if recorded is not None:
        return ExpectedWindow(recorded[0], MANIFEST_NAME, recorded[1])
    return ExpectedWindow(
        None,
        "default",
        EvidenceRef(MANIFEST_NAME, None, "(no run.json window setting: none was requested)"),
    )


def _callers_choice(what: str, value: str, choices: tuple[str, ...], source: str) -> EvidenceRef:
    """The quote of a caller's explicit expectation; ValueError for one not among ``choices``."""
    if value not in choices:
        raise ValueError(f"expected {what} {value!r}: choose one of {', '.join(choices)}")
    return EvidenceRef(f"({source})", None, f"expected {what}: {value}")


def _recorded(setting: Setting | None, choices: tuple[str, ...]) -> tuple[str, EvidenceRef] | None:
    """run.json's setting, when it records one of ``choices``."""
    if setting is None or setting.value not in choices:
        return None
    return setting.value, setting.ref
