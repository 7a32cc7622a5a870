"""Golden-file comparison for tests: exact text against a checked-in file, regenerated on request.

Run with MUGRAPH_UPDATE_GOLDEN=1 to (re)write the files instead of comparing, then review the diff.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

UPDATE_ENV = "MUGRAPH_UPDATE_GOLDEN"


def check_golden(path, text: str) -> None:
    """Assert that `text` equals the file at `path` (a trailing newline is added to both)."""
    path = Path(path)
    text = text if text.endswith("\n") else text + "\n"
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        raise AssertionError(f"golden file {path} is missing; run the test with {UPDATE_ENV}=1 "
                             "to create it, then review it")
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            f"{path} (golden)", "actual"))
        raise AssertionError(f"text differs from golden file {path} (rerun with {UPDATE_ENV}=1 "
                             f"to accept the new text):\n{diff}")
