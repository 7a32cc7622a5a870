"""The calibration table: every per-target constant of the cost model and of codegen's sizing, each with where
it came from (``calibration.json`` next to this file; ``$MUGRAPH_CALIBRATION`` names another). A GPU run
(``bench/gpu.py --calibrate``) rewrites the numbers it measures."""
from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from mugraph.ir.errors import InvalidInput

DEFAULT_PATH = Path(__file__).with_name("calibration.json")
# The GPU whose numbers size each arch's kernels (stages, splits): the most demanding target of that arch.
SIZING_TARGET: Mapping[str, str] = MappingProxyType({"sm_80": "a100", "sm_90": "h200", "sm_90a": "h200"})


def table_path() -> Path:
    return Path(os.environ.get("MUGRAPH_CALIBRATION") or DEFAULT_PATH)


@lru_cache(maxsize=None)
def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidInput(f"cannot read the calibration table {path}: {e}",
                           hint="restore codegen/calibration.json or unset $MUGRAPH_CALIBRATION") from None
    return {name: entry for name, entry in data.items() if not name.startswith("_")}


def targets() -> list[str]:
    return sorted(_load(table_path()))


def constants(target: str) -> Mapping[str, float]:
    """Every constant of ``target`` (value only)."""
    entry = _entry(target)
    return MappingProxyType({k: v["value"] for k, v in entry.items()})


def source(target: str, field: str) -> str:
    """Where ``target``'s ``field`` came from."""
    return _entry(target)[field]["source"]


def _entry(target: str) -> dict:
    table = _load(table_path())
    if target not in table:
        raise InvalidInput(f"the calibration table {table_path()} has no target {target!r}",
                           hint=f"targets: {', '.join(sorted(table))}")
    return table[target]


def updated(target: str, values: Mapping[str, float], why: str, path: Path | None = None) -> Path:
    """Write ``values`` for ``target`` into the table (each with source ``why``); returns the file written."""
    path = Path(path or table_path())
    data = json.loads(path.read_text(encoding="utf-8"))
    if target not in data:
        raise InvalidInput(f"no target {target!r} in {path}", hint=f"one of {', '.join(sorted(data))}")
    for field, value in values.items():
        if field not in data[target]:
            raise InvalidInput(f"{field!r} is not a constant of {target} in {path}")
        data[target][field] = {"value": value, "source": why}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    _load.cache_clear()
    return path


def reload() -> None:
    """Forget the cached table (after the file changed)."""
    _load.cache_clear()
