"""The generality suite's winners at its small shapes, stored for the path matrix (tests/test_paths.py), which
cannot afford a search per program. They are what the quality tier (tests/search/test_generality.py) finds with
its own configs; rewrite them after a change to the search or the IR's JSON with

    python -m tests.generality_winners            # every program
    python -m tests.generality_winners NAME ...   # only these (the others stay as stored)

The path matrix runs each stored graph through every path and compares the paths with each other and with the
graph's own reference run; it also checks that each winner still computes its program (a fresh finite-field
test), so a stale file fails loudly instead of testing the wrong program.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from mugraph import generality, ir

FILE = Path(__file__).resolve().parent / "generality_winners.json"


def load() -> dict:
    """Program name -> its stored winner (a KernelGraph at the program's small shapes)."""
    stored = json.loads(FILE.read_text(encoding="utf-8"))
    return {name: ir.from_json(json.dumps(graph)) for name, graph in stored.items()}


def regenerate(names=None, log=print) -> dict:
    """Search the programs `names` (default: every program) with the quality tier's config and
    write their winners beside the stored ones."""
    from tests.search.test_generality import _config
    winners = json.loads(FILE.read_text(encoding="utf-8")) if names else {}
    for name in names or generality.names():
        outcome = generality.evaluate(generality.get(name).small(), _config(name))
        if outcome.winner is None:
            log(f"{name}: no winner ({outcome.lift_error or outcome.search_error})")
            continue
        winners[name] = json.loads(ir.to_json(outcome.winner))
        log(f"{name}: {outcome.structure} ({outcome.states} states, {outcome.stop_reason})")
    FILE.write_text(json.dumps(winners, indent=None, sort_keys=True) + "\n", encoding="utf-8")
    return winners


if __name__ == "__main__":
    regenerate(sys.argv[1:] or None)
    sys.exit(0)
