"""Shared test setup: Hypothesis profiles and the `golden` fixture.

Hypothesis profiles: "ci" (the default: derandomised, so every run draws the same examples; no
deadline; a modest number of examples; failing examples printed as reproduction blobs) and
"dev" (random, more examples), chosen with HYPOTHESIS_PROFILE=dev (or pytest's
--hypothesis-profile=dev).

Golden files: the `golden` fixture compares text with `golden/<name>.txt` next to the test file,
`golden("name", text)`; outside fixtures use `tests.golden.check_golden(path, text)`. Set
MUGRAPH_UPDATE_GOLDEN=1 to rewrite the files, then review the diff.
"""
from __future__ import annotations

import os

# BLAS thread pools on a 2-core machine running two test workers make small matmuls 10-100x
# slower; the interpreter's tiles are small. Set before NumPy loads OpenBLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings

from tests.golden import check_golden

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25,
                          print_blob=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=200, print_blob=True)
settings.load_profile("dev" if os.environ.get("HYPOTHESIS_PROFILE") == "dev" else "ci")


@pytest.fixture
def golden(request):
    """`golden(name, text)`: assert `text` equals `golden/<name>.txt` beside the test module."""
    folder = request.path.parent / "golden"

    def check(name: str, text: str) -> None:
        check_golden(folder / f"{name}.txt", text)

    return check
