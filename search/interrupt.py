"""Stopping a search on Ctrl-C or SIGTERM: the first signal sets a flag that the enumerator reads
at every state (it stops at once and the runner returns what it verified); if the search is in a
phase that does not read it, a KeyboardInterrupt follows within half a second and is repeated
until the search has left. It is never raised inside a GC callback, where Python would print and
drop it (JAX's GC hook swallowed Ctrl-C that way). A second signal raises at once.
"""
from __future__ import annotations

import _thread
import contextlib
import gc
import signal
import threading
import time

ESCALATE_AFTER = 0.4      # seconds between the flag and the KeyboardInterrupt that follows it
RETRY_EVERY = 0.1         # ... and between repeats, while the search has not left
RETRY_SOON = 0.005        # ... after one that arrived inside a GC callback (and was held back)
_STOP = threading.Event()
_STATE = {"signal": None, "at": None, "active": False}


def requested() -> bool:
    """True once a stop was asked for inside the current `stoppable()` block."""
    return _STOP.is_set()


@contextlib.contextmanager
def stoppable(on_stop=None):
    """Turn SIGINT and SIGTERM into a stop request while the block runs (main thread only;
    elsewhere signals keep their handlers). `on_stop()` runs once when the KeyboardInterrupt
    follows (e.g. to terminate worker processes)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread() or _STATE["active"]:
        yield request
        return
    _STOP.clear()
    _STATE.update(signal=None, at=None, active=True)
    escalation = _Escalation(on_stop)
    previous = {s: signal.signal(s, escalation.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        escalation.finish()
        for s, handler in previous.items():
            signal.signal(s, handler)
        request.signal = _STATE["signal"]
        _STOP.clear()                       # searches outside this block must not see it
        _STATE.update(signal=None, at=None, active=False)


class StopRequest:
    """What `stoppable()` saw: `signal` is the name of the signal that asked to stop, or None."""

    signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None


class _Escalation:
    """The signal handler, and the timer that follows an unheeded stop flag with KeyboardInterrupts
    (through `_thread.interrupt_main`, which calls the same handler as a second signal)."""

    def __init__(self, on_stop):
        self.on_stop = on_stop
        self.lock = threading.Lock()
        self.ended = threading.Event()
        self.soon = threading.Event()
        self.done = False
        self.timer: threading.Thread | None = None
        self.signals = 0
        self.stopped = False

    def handle(self, signum, frame) -> None:
        if self.done:
            return                              # a nudge that arrived as the block ended
        self.signals += 1
        if self.signals == 1:
            _STATE.update(signal=signal.Signals(signum).name, at=time.monotonic())
            _STOP.set()
            self.timer = threading.Thread(target=self._nudge, daemon=True)
            self.timer.start()
            return
        if _in_gc_callback(frame):
            self.soon.set()                     # raised here it would be printed and dropped
            return
        if not self.stopped and self.on_stop is not None:
            self.stopped = True
            self.on_stop()
        raise KeyboardInterrupt

    def _nudge(self) -> None:
        wait = ESCALATE_AFTER
        while not self.ended.wait(wait):
            wait = RETRY_SOON if self.soon.is_set() else RETRY_EVERY
            self.soon.clear()
            with self.lock:
                if self.done:
                    return
                _thread.interrupt_main(signal.SIGINT)

    def finish(self) -> None:
        with self.lock:
            self.done = True
        self.ended.set()
        if self.timer is not None:
            self.timer.join(timeout=2 * ESCALATE_AFTER)
        for _ in range(3):
            time.sleep(0)                       # let a pending nudge reach the (now inert) handler


def _in_gc_callback(frame) -> bool:
    """True when `frame` runs inside a `gc.callbacks` function, where Python prints an exception
    and drops it (JAX registers one, which swallowed Ctrl-C before)."""
    codes = set()
    for callback in gc.callbacks:
        function = getattr(callback, "__func__", callback)
        if hasattr(function, "__code__"):
            codes.add(function.__code__)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False
