"""Search checkpoints: the enumeration's frontier (depth, round, tasks left) with the verified
structures found so far, saved in the result cache as the search runs so a stopped search resumes
where it was."""
from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field


@dataclass
class SearchState:
    """Where the iterative deepening stands: `todo` are the current round's tasks not yet run,
    `unfinished` the ones that reached their share (they run again next round)."""

    depth: int
    cap: int
    share: int | None
    todo: list | None                # None: all of this depth's root tasks
    unfinished: list
    counters: object                 # context.Counters
    seen: list                       # structures already tested at the reduced shapes
    candidates: list                 # result.Candidate: verified structures sized for real shapes
    first_found: dict
    misfits: int
    searched: float                  # seconds of enumeration, all runs together
    runs: int = 1
    saved: float = field(default_factory=time.time)

    def where(self) -> str:
        """One line: how far the search had come."""
        left = "every task" if self.todo is None else f"{len(self.todo)} task(s)"
        return (f"depth {self.depth}, {left} left in the round, "
                f"{self.counters.states} states, {self.counters.verified} verified, "
                f"{self.searched:.1f} s of search")

    def best(self):
        """The fastest verified candidate so far, or None."""
        return min(self.candidates, key=lambda c: c.seconds, default=None)


class Checkpointer:
    """Saves a search's state under its cache key at most every `every` seconds (and when it
    stops); `resume()` gives the state a previous run left."""

    def __init__(self, store, key: str, every: float = 1.0, continuing: str = ""):
        self.store, self.key, self.every = store, key, every
        self.continuing = continuing    # what a larger budget continues (search.cached.lookup)
        self.latest: SearchState | None = None
        self.resumed: SearchState | None = None
        self._last = 0.0

    def resume(self) -> SearchState | None:
        row = self.store.checkpoint(self.key)
        if row is None:
            return None
        try:
            state = pickle.loads(row[1])
            if not isinstance(state, SearchState):
                raise TypeError(type(state).__name__)
        except Exception as e:  # damaged or from another layout: start afresh, say so once
            self.store.warn_once(self.key, f"search checkpoint {self.key[:12]} is unreadable "
                                           f"({type(e).__name__}); starting the search afresh")
            self.store.drop_checkpoint(self.key)
            return None
        self.resumed = self.latest = state
        return state

    def resume_note(self) -> str:
        """One line for the report: where the resumed (or continued) search took up."""
        state = self.resumed
        if state is None:
            return ""
        saved = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(state.saved))
        if self.continuing:
            return f"{self.continuing}, from its checkpoint saved {saved} at {state.where()}"
        return f"resumed from a checkpoint saved {saved} at {state.where()}"

    def save(self, state: SearchState, force: bool = False) -> None:
        self.latest = state
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        state.saved = time.time()
        self.store.save_checkpoint(self.key, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL),
                                   state.where())

    def drop(self) -> None:
        self.store.drop_checkpoint(self.key)
