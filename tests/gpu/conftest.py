"""GPU tests: everything in this folder needs a CUDA device. Where none exists the folder's tests are skipped,
with the reason; where a GPU exists but CuPy cannot use it, they run and fail loudly."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# JAX only traces specs in these tests: keep it from reserving most of the GPU's memory ahead of CuPy.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from mugraph.codegen.runtime_cupy import gpu_available  # noqa: E402

HERE = Path(__file__).resolve().parent
_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0")


def no_gpu_reason() -> str | None:
    """Why this machine has no GPU to test on, or None when it has one (usable by CuPy or not)."""
    if gpu_available() or any(Path(p).exists() for p in _DEVICE_NODES):
        return None
    return ("no CUDA device (cupy.cuda.is_available() is False and no /dev/nvidia*): the GPU tests run on a GPU "
            "machine, e.g. through bench/gpu_check.sh")


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    reason = no_gpu_reason()
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
