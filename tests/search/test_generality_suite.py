"""The generality suite is well-formed: every program runs under jax.jit at both sizes with finite
outputs, keeps its structure between the two sizes, and has a unique name."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from mugraph import generality


def test_names_are_unique_and_the_suite_is_large_enough():
    names = generality.names()
    assert len(names) == len(set(names)) >= 25


@pytest.mark.parametrize("name", generality.names())
def test_program_runs_finite_under_jax_jit_at_small_shapes(name):
    p = generality.get(name).small()
    out = jax.jit(p.fn)(*p.random_inputs(seed=1))
    assert np.all(np.isfinite(np.asarray(out, dtype=np.float32)))


@pytest.mark.parametrize("name", generality.names())
def test_small_shapes_keep_the_rank_of_every_input(name):
    p = generality.get(name)
    assert list(p.shapes) == list(p.small_shapes)
    assert all(len(p.shapes[k]) == len(p.small_shapes[k]) for k in p.shapes)


def test_unknown_program_is_a_typed_error_naming_the_choices():
    from mugraph.errors import InvalidInput
    with pytest.raises(InvalidInput, match="layernorm_linear"):
        generality.get("no_such_program")


@pytest.mark.parametrize("name", generality.names())
def test_the_xla_like_baseline_is_never_slower_than_the_unfused_program(name):
    from mugraph.search.baseline import xla_estimate
    from mugraph.search.cost import estimate
    from mugraph.search.cost import Launch
    spec = generality.get(name).small().spec()
    # the same charge per kernel on both sides: under jax.jit's rule 4 kernels launch from C++ (1 us each) while
    # 5 replay as a command buffer (0.5 us each), so the unfused program can be cheaper to launch (swiglu_down)
    xla, unfused = xla_estimate(spec, launch=Launch.GRAPH), estimate(spec, launch=Launch.GRAPH)
    assert xla.launches <= unfused.launches and xla.seconds <= unfused.seconds * (1 + 1e-9)


def test_a_reduction_without_keepdims_is_one_kernel_in_the_xla_like_baseline():
    """jnp.max(y, axis=0) lifts as reduce_max(keepdim) + reshape; the reshape is XLA's bitcast."""
    from mugraph.search.baseline import xla_fusions
    spec = generality.get("max_over_rows_linear").small().spec()
    assert [f.kind for f in xla_fusions(spec)] == ["gemm", "reduction"]
