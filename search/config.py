"""The search's configuration: a frozen, JSON-serialisable record of op sets, limits and budget."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

from mugraph.ir.errors import SearchError
from mugraph.ir.ops import BOp, KOp, TOp

TARGETS = ("a100", "h100", "h200")


@dataclass(frozen=True)
class SearchConfig:
    """What the search may build and how long it may look.

    Op sets are names (as in the JSON schema); empty means "every op the spec uses" (plus the
    accumulators its reductions need). Limits bound the μGraphs enumerated; the budget bounds
    the whole call (`budget_seconds`, the final check included) and the enumeration
    (`budget_states`); the report's stop reason is exhausted, time, states or candidate cap.
    """

    kernel_ops: tuple[str, ...] = ()
    block_ops: tuple[str, ...] = ()
    max_kernel_ops: int = 3          # kernel-level ops per candidate (custom ops included)
    max_custom_ops: int = 3          # graph-defined kernels per candidate
    max_block_ops: int = 9           # ops in one block graph, inputs and constants excluded
    max_block_inputs: int = 4
    max_block_outputs: int = 3
    max_candidates: int = 4096       # verified structures; reaching it stops the enumeration
    budget_seconds: float = 300.0
    budget_states: int = 2_000_000
    target: str = "h100"
    seed: int = 0
    workers: int = 1                 # 1: in-process; >1: local process pool
    verify_tests: int = 2            # finite-field tests per structure at reduced shapes
    reduced_extent: int = 128        # labels longer than this are shrunk to it for the structure search

    def __post_init__(self):
        for f in fields(self):
            value = _check_number(f.name, f.type, getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        for name, enums in (("kernel_ops", (KOp, TOp)), ("block_ops", (BOp, TOp))):
            object.__setattr__(self, name, _op_set(name, getattr(self, name), enums))
        if self.target not in TARGETS:
            raise SearchError(f"unknown target {self.target!r}", hint=f"one of {', '.join(TARGETS)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SearchConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SearchError(f"SearchConfig JSON is malformed: {e}") from None
        if not isinstance(data, dict):
            raise SearchError(f"SearchConfig JSON must be an object of fields, got "
                              f"{type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise SearchError(f"unknown SearchConfig fields {sorted(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def replace(self, **changes) -> "SearchConfig":
        return SearchConfig(**(asdict(self) | changes))


def _op_set(field: str, names, enums) -> tuple[str, ...]:
    """The op names as a sorted tuple without repeats: a set, so that configs that allow the same
    ops are equal (and share a cache key) whatever order they list them in."""
    if isinstance(names, str) or not isinstance(names, (list, tuple, set, frozenset)):
        what = "one string" if isinstance(names, str) else "not a list of op names"
        raise SearchError(f"SearchConfig.{field}={names!r} is {what}",
                          hint=f"give a list of op names, e.g. {field}=['matmul', 'exp']")
    for name in names:
        if not isinstance(name, str) or not _known(name, enums):
            raise SearchError(f"unknown {field.split('_')[0]} op {name!r} in SearchConfig.{field}")
    return tuple(sorted(set(names)))


# the smallest value of each numeric field that still describes a search (default 1)
_MINIMUM = {"max_custom_ops": 0, "seed": 0, "reduced_extent": 2}


def _check_number(name: str, kind: str, value):
    """The value (a whole float becomes an int for an int field), or a typed error naming the
    field, the value and the fix."""
    if kind not in ("int", "float"):
        return value
    low = _MINIMUM.get(name, 1)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok and kind == "int":
        ok = value == math.floor(value)
        value = int(value) if ok else value
    if not ok or value < low or (kind == "float" and value <= 0):
        what = "a positive, finite number" if kind == "float" else f"a whole number >= {low}"
        default = SearchConfig.__dataclass_fields__[name].default
        raise SearchError(f"SearchConfig.{name}={value!r} must be {what}",
                          hint=f"e.g. SearchConfig({name}={default!r})")
    return float(value) if kind == "float" else value   # 30 and 30.0: one config, one cache key


def _known(name: str, enums) -> bool:
    for enum in enums:
        try:
            enum(name)
            return True
        except ValueError:
            continue
    return False
