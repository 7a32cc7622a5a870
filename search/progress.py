"""Watching a search: a live line on a terminal, a log line every few seconds elsewhere (a pipe, a
notebook, a CI log). Both show states, structures verified, the best estimate and elapsed time
against the budget; a ticker thread keeps them coming while a long task runs."""
from __future__ import annotations

import sys
import threading
import time

LIVE_EVERY = 0.5        # seconds between redraws of the terminal line
LOG_EVERY = 5.0         # seconds between log lines


class Progress:
    """The runner calls it after every task with (counters, best seconds, elapsed); `close()`
    ends the line. `in_flight()` (optional) gives (task token, states) of a task still running,
    whose states are added until the runner reports them merged."""

    def __init__(self, budget_seconds: float, stream=None, live: bool | None = None,
                 in_flight=None):
        self.stream = stream or sys.stderr
        self.live = _is_terminal(self.stream) if live is None else live
        self.every = LIVE_EVERY if self.live else LOG_EVERY
        self.budget = budget_seconds
        self.in_flight = in_flight or (lambda: (0, 0))
        self.merged = None          # the in-flight task whose states `states` already includes
        self.started = time.monotonic()
        self.states = self.verified = 0
        self.best: float | None = None
        self.shown = 0.0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)
        self.ticker.start()

    def __call__(self, counters, best, elapsed) -> None:
        with self.lock:
            self.states, self.verified, self.best = counters.states, counters.verified, best
            self.merged = self.in_flight()[0]
        self._maybe_show()

    def _tick(self) -> None:
        while not self.done.wait(self.every):
            self._maybe_show()

    def _maybe_show(self) -> None:
        with self.lock:
            elapsed = time.monotonic() - self.started
            if elapsed - self.shown < self.every or self.done.is_set():
                return
            self.shown = elapsed
            line = self.line(elapsed)
        if self.live:
            print(f"\r{line}   ", end="", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)

    def line(self, elapsed: float) -> str:
        best = f"best estimate {self.best * 1e6:.2f} us" if self.best is not None \
            else "no verified structure yet"
        task, running = self.in_flight()
        states = self.states + (running if task != self.merged else 0)
        return (f"mugraph search: {elapsed:5.1f} s of {self.budget:.0f} s, {states:,} states, "
                f"{self.verified} verified, {best}")

    def close(self) -> None:
        self.done.set()
        self.ticker.join(timeout=1.0)
        if self.live and self.shown:
            print(file=self.stream, flush=True)


class Silent:
    def __call__(self, *args) -> None:
        pass

    def close(self) -> None:
        pass


def default_progress(budget_seconds: float, in_flight=None):
    """`Progress` unless the MUGRAPH_PROGRESS setting turns it off."""
    from mugraph.ir.settings import settings
    if not settings.progress:
        return Silent()
    return Progress(budget_seconds, in_flight=in_flight)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
