"""Every knob of mugraph in one place: each declared once with its default and environment variable.

Read a knob as `settings.cache_dir`; values come from the environment at the time of reading, so
tests can set variables with monkeypatch. Re-exported as `mugraph.settings`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mugraph.ir.errors import InvalidInput


@dataclass(frozen=True)
class Knob:
    env: str
    default: object
    parse: Callable[[str], object]
    doc: str


GPU_TARGETS = ("a100", "h100", "h200")   # the cost model's targets (search/targets.py)


def _target(text: str) -> str:
    name = text.strip().lower()
    if name not in GPU_TARGETS:
        raise ValueError(text)
    return name


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(text)


KNOBS = {
    "cache_dir": Knob("MUGRAPH_CACHE_DIR", str(Path.home() / ".cache" / "mugraph"), str,
                      "where mugraph keeps its on-disk caches (compiled kernels, CPU-harness builds)"),
    "progress": Knob("MUGRAPH_PROGRESS", True, _bool, "show progress while a search runs"),
    "cpu_workers": Knob("MUGRAPH_CPU_WORKERS", 0, _count,
                        "OS threads of the CPU harness (0: one per core)"),
    "search_seconds": Knob("MUGRAPH_SEARCH_SECONDS", 300.0, _seconds,
                           "search budget in seconds when none is given (superoptimize, jit, "
                           "`mugraph search`)"),
    "z3_rlimit": Knob("MUGRAPH_Z3_RLIMIT", 200_000, int,
                      "deterministic Z3 resource limit per query (never wall-clock)"),
    "target": Knob("MUGRAPH_TARGET", "h100", _target,
                   "GPU the cost model ranks for when none is given (superoptimize, jit, "
                   "`mugraph search`): a100, h100, h200"),
}


class _Settings:
    """Attribute access to the knobs; each read consults the environment."""

    def __getattr__(self, name: str):
        knob = KNOBS.get(name)
        if knob is None:
            raise AttributeError(f"no setting {name!r}; known: {', '.join(KNOBS)}")
        raw = os.environ.get(knob.env)
        if raw is None:
            return knob.default
        try:
            return knob.parse(raw)
        except ValueError:
            raise InvalidInput(f"{knob.env}={raw!r} is not a valid value",
                               hint=f"{knob.doc}; default {knob.default!r}") from None

    def describe(self) -> str:
        return "\n".join(f"{k.env:<24} {getattr(self, n)!r:<28} {k.doc}" for n, k in KNOBS.items())


settings = _Settings()
