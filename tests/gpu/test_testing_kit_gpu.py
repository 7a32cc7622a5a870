"""The testing kit on a GPU: assert_kernel_matches(backend="cuda") launches the emitted kernel
through CuPy, passes the right kernel and catches the wrong ones, as on the CPU harness
(tests/test_testing_kit.py builds the module and the functions)."""
from __future__ import annotations

import pytest

from mugraph.api import Kernel
from mugraph.testing import assert_kernel_matches
from tests.test_testing_kit import _module, masked_rows_are_wrong, nan_to_zero_is_wrong, right


@pytest.fixture(scope="module")
def kernel():
    graph = _module()
    return Kernel(graph, graph)


def test_the_right_kernel_passes_on_the_gpu(kernel):
    assert_kernel_matches(right, kernel, "cuda", examples=20)
    assert_kernel_matches(right, kernel, "auto", examples=5)


def test_wrong_kernels_fail_on_the_gpu(kernel):
    with pytest.raises(AssertionError, match=r"output 1 of the kernel \(cuda\)"):
        assert_kernel_matches(nan_to_zero_is_wrong, kernel, "cuda", examples=25)
    with pytest.raises(AssertionError, match=r"output 2 of the kernel \(cuda\)"):
        assert_kernel_matches(masked_rows_are_wrong, kernel, "cuda", examples=25)
