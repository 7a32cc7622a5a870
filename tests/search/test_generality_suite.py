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
