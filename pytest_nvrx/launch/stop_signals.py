"""Stop signals: SIGTERM (CI cancel, Slurm timeout) and SIGHUP (a closed terminal) stop a run
like Ctrl-C. Inside :func:`interrupt_on_stop_signals` each raises :class:`Interrupted`, a
``KeyboardInterrupt``; a launch's cleanup runs with those signals held back
(:func:`deferred_stop_signals`), so a second one cannot cut it short. No pytest here.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

#: Signals that stop a run the way Ctrl-C does.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived. A ``KeyboardInterrupt``, so pytest (exit 2, teardown and report)
    and every ``except KeyboardInterrupt`` treat SIGTERM and SIGHUP like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(self.signal.name)

    @property
    def exit_status(self) -> int:
        """What a shell reports for a process ended by this signal: 128 + its number."""
        return 128 + int(self.signal)


def interrupt_signal(exc: BaseException) -> signal.Signals:
    """The signal behind an interruption (a plain KeyboardInterrupt is SIGINT)."""
    return exc.signal if isinstance(exc, Interrupted) else signal.SIGINT


@dataclass
class _StopSignalState:
    """Process-wide: signal handlers are process-wide too."""

    installed: bool = False
    #: the signal that interrupted, once one did: later ones are absorbed
    interrupted: int | None = None
    #: open deferred_stop_signals blocks, and a signal that arrived in one
    defer_depth: int = 0
    held: int | None = None


_STATE = _StopSignalState()


def _on_stop_signal(signum: int, frame: object) -> None:
    if _STATE.interrupted is not None:
        return  # the first one's cleanup is under way: never cut it short
    if _STATE.defer_depth:
        # only reached when another thread took the signal (the main thread blocks them)
        _STATE.held = _STATE.held or signum
        return
    _interrupt(signum)


def _interrupt(signum: int) -> None:
    """The first stop signal: from now on the process is stopping. Further stop signals are
    ignored by the kernel itself, which also holds while the interpreter shuts down (it resets
    Python-level handlers to the default action, which would end a cleanly stopped process
    by the signal after all)."""
    _STATE.interrupted = signum
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupt_on_stop_signals() -> Iterator[None]:
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted`.

    SIGINT is handled whatever this process inherited: started with SIGINT ignored (a script's
    background job and some CI runners ignore it without anyone asking), it still stops on
    SIGINT. SIGTERM and SIGHUP inherited as ignored stay ignored: that is a request (``nohup``:
    survive the terminal's hangup) and the launched tree inherits it. Children started in the
    block get default dispositions for the handled signals (a handled signal is reset on exec,
    an ignored one would stay ignored). Only the first signal raises; from then on the stop signals
    are ignored, also after the block ends: what follows (result.json, pytest's teardown and
    report, the CLI's last line, the interpreter's exit) is cleanup too, and the process is on
    its way out. Without an interruption the previous handlers come back. A no-op outside the
    main thread or when already active.
    """
    if _STATE.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    _STATE.interrupted = _STATE.held = None
    previous = {
        sig: signal.signal(sig, _on_stop_signal)
        for sig in STOP_SIGNALS
        if sig == signal.SIGINT or signal.getsignal(sig) != signal.SIG_IGN
    }
    _STATE.installed = True
    try:
        yield
    finally:
        with deferred_stop_signals():
            if _STATE.interrupted is None:
                for sig, handler in previous.items():
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            _STATE.installed = False


@contextlib.contextmanager
def deferred_stop_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back while the block runs (a run's cleanup must finish);
    one that arrived meanwhile acts when the block ends.

    Blocked in the main thread (so a default handler cannot fire either); never around starting
    a child, which would inherit the blocked mask.
    """
    main = threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS) if main else None
    _STATE.defer_depth += 1
    try:
        yield
    finally:
        if old is not None:
            # a pending signal is handled here, while defer_depth still holds it back
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        _STATE.defer_depth -= 1
        held = _STATE.held if not _STATE.defer_depth else None
        if held is not None:
            _STATE.held = None
            if _STATE.installed and _STATE.interrupted is None:
                _interrupt(held)
