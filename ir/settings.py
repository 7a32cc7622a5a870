"""Every knob of mugraph in one place: each declared once with its default and environment variable.

Read a knob as `settings.cache_dir`; values come from the environment at the time of reading, so
tests can set variables with monkeypatch. Re-exported as `mugraph.settings`.
"""
from __future__ import annotations

import os
import re
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
    parse_default: bool = False   # the default is text parsed at each read (a share of free memory)


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


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}


def _memory(text: str) -> int:
    """Bytes from "64GB", "512MiB", "2e9", or "50%" (a share of the memory available now)."""
    t = text.strip().lower()
    if t.endswith("%"):
        share = float(t[:-1]) / 100
        if not 0 < share <= 1:
            raise ValueError(text)
        from mugraph.ir.memory import available_bytes
        return int(share * available_bytes())
    found = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)", t)
    if found is None or found.group(2) not in _UNITS:
        raise ValueError(text)
    value = float(found.group(1)) * _UNITS[found.group(2)]
    if not 1 <= value < float("inf"):
        raise ValueError(text)
    return int(value)


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
    "memory_limit": Knob("MUGRAPH_MEMORY_LIMIT", "50%", _memory,
                         "host memory one call may use for checks, sizing and reference runs "
                         "(64GB, 512MiB, or a share of the memory available: 50%; at least "
                         "64 MiB); past it a check is sampled or refused with a ResourceError",
                         parse_default=True),
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
            return knob.parse(knob.default) if knob.parse_default else knob.default
        try:
            return knob.parse(raw)
        except ValueError:
            raise InvalidInput(f"{knob.env}={raw!r} is not a valid value",
                               hint=f"{knob.doc}; default {knob.default!r}") from None

    def describe(self) -> str:
        return "\n".join(f"{k.env:<24} {getattr(self, n)!r:<28} {k.doc}" for n, k in KNOBS.items())


settings = _Settings()
