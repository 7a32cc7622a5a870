"""The testing kit for users' CI: IEEE special-value strategies that shrink to the smallest
failing case, and assert_kernel_matches running the emitted kernel on the CPU harness against
jax.jit(fn)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import find, given, settings

import mugraph
from mugraph import ir
from mugraph.api import Kernel
from mugraph.testing import assert_kernel_matches, ieee_arrays, kernel_inputs

S = jax.ShapeDtypeStruct
FIND = settings(database=None, max_examples=2000)


@pytest.mark.parametrize("what, holds", [
    ("NaN", lambda a: np.isnan(a).any()),
    ("+inf", lambda a: np.isposinf(a).any()),
    ("-inf", lambda a: np.isneginf(a).any()),
    ("a masked row", lambda a: np.isneginf(a).all(axis=1).any()),
    ("a value near the limit", lambda a: np.nanmax(np.abs(a[np.isfinite(a)]), initial=0) > 1e4),
    ("a subnormal", lambda a: ((a != 0) & (np.abs(a) < np.finfo(np.float16).smallest_normal)).any()),
])
def test_every_special_value_is_drawn_and_shrinks_to_a_small_case(what, holds):
    a = find(ieee_arrays((4, 6), "float16"), holds, settings=FIND)
    assert a.shape == (4, 6) and a.dtype == np.float16 and holds(a)
    if what in ("NaN", "+inf"):  # (-inf may also come as a masked row)
        assert (~np.isfinite(a)).sum() == 1, "shrunk to one special value"


@given(kernel_inputs(ir.KernelGraph([ir.input("x", (4, 8), "bfloat16") * 2.0])))
@settings(max_examples=10)
def test_kernel_inputs_follow_the_graphs_inputs(arrays):
    (x,) = arrays
    assert x.shape == (4, 8) and str(x.dtype) == "bfloat16"


def relu_layer(x, w):
    return jax.nn.relu(x @ w) * 2.0


@pytest.fixture(scope="module")
def kernel():
    args = [S((16, 64), jnp.float16), S((64, 64), jnp.float16)]
    return mugraph.superoptimize(relu_layer, *args, progress=False,
                                 config={"max_kernel_ops": 1, "budget_seconds": 60})


def test_a_kernel_that_agrees_with_jax_passes(kernel):
    assert kernel.graph.custom_ops(), "the emitted kernel is a generated one"
    assert_kernel_matches(relu_layer, kernel, "harness", examples=10)


def test_a_kernel_that_disagrees_on_special_values_fails_with_the_smallest_input():
    fn = lambda x: x * 0.0  # noqa: E731  inf * 0 and NaN * 0 are NaN in JAX
    spec = ir.from_jax(fn, S((8, 32), jnp.float32))
    zeros = Kernel(ir.KernelGraph([ir.constant(0.0, (8, 32), "float32")], spec.inputs), spec)
    with pytest.raises(AssertionError) as caught:
        assert_kernel_matches(fn, zeros, "harness", examples=50)
    message = str(caught.value)
    assert "differs from jax.jit(fn)" in message and "jax.jit nan" in message
    assert "inputs: #0" in message


def test_a_kernel_of_another_function_fails_on_ordinary_inputs(kernel):
    def other(x, w):
        return relu_layer(x, w) * 1.5

    with pytest.raises(AssertionError, match="relative error"):
        assert_kernel_matches(other, kernel, "harness", examples=5, specials=False,
                              masked_rows=False, regimes=("normal",))


@pytest.mark.xfail(strict=True, reason="fp32 tensor-core matmuls split operands into bf16 "
                                       "halves (codegen/mma.py): inf - inf makes the low half "
                                       "NaN, so an inf input gives NaN where jax.jit gives inf")
def test_fp32_matmul_kernels_keep_infinities():
    args = [S((16, 64), jnp.float32), S((64, 32), jnp.float32)]  # as tests/test_jax_integration
    k = mugraph.superoptimize(relu_layer, *args, progress=False,
                              config={"max_kernel_ops": 1, "budget_seconds": 60})
    if not k.graph.custom_ops():
        pytest.skip("the search found no fused kernel to test")
    x, w = np.ones((16, 64), np.float32), np.ones((64, 32), np.float32)
    x[0, 0] = np.inf
    assert np.isposinf(k.run_on_cpu(x, w)[0]).all()
