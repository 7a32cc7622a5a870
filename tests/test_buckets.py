"""Shape buckets: a winner found for one shape is re-sized for another shape of the same program
by the cost model and checked there, without a search; the report and the kernel say so; a
program of another structure, or a winner that fails the check, is searched."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import ir
from mugraph.search.buckets import resize_winner, structure

S = jax.ShapeDtypeStruct
CONFIG = {"max_kernel_ops": 1, "budget_seconds": 60}


def layer(x, w):
    return jax.nn.relu(x @ w) * 2.0


def _args(batch):
    return S((batch, 64), jnp.float16), S((64, 64), jnp.float16)


@pytest.fixture
def fresh_cache(tmp_path):
    """A fresh result cache (the CPU-harness builds stay shared with the other tests)."""
    return tmp_path / "results"


def _computes_spec(kernel, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [(rng.standard_normal(n.shape) / 4).astype(n.dtype.numpy) for n in kernel.spec.inputs]
    got = kernel.run_reference(*arrays)
    want = ir.interpret(kernel.spec, arrays)[0]
    return np.abs(got - want).max() <= 1e-3 * np.abs(want).max()


def test_a_new_batch_size_is_resized_not_searched(fresh_cache):
    first = mugraph.superoptimize(layer, *_args(8), config=CONFIG, progress=False,
                                  cache=fresh_cache)
    assert first.origin.startswith("searched") and first.graph.custom_ops()
    again = mugraph.superoptimize(layer, *_args(48), config=CONFIG, progress=False,
                                  cache=fresh_cache)
    assert again.origin.startswith("re-sized from the structure found for x:f16[8,64]")
    assert "re-sized from" in str(again.report) and again.report.verification.equivalent
    assert again.graph.inputs[0].shape == (48, 64) and again.graph.custom_ops()
    assert _computes_spec(again)
    odd = mugraph.superoptimize(layer, *_args(5), config=CONFIG, progress=False, cache=fresh_cache)
    assert odd.origin.startswith("re-sized") and _computes_spec(odd, seed=1)


def test_another_program_is_searched(fresh_cache):
    mugraph.superoptimize(layer, *_args(8), config=CONFIG, progress=False, cache=fresh_cache)
    other = mugraph.superoptimize(lambda x, w: jax.nn.relu(x @ w) + 2.0, *_args(16),
                                  config=CONFIG, progress=False, cache=fresh_cache)
    assert other.origin.startswith("searched")
    scaled = mugraph.superoptimize(lambda x, w: jax.nn.relu(x @ w) * 3.0, *_args(16),
                                   config=CONFIG, progress=False, cache=fresh_cache)
    assert scaled.origin.startswith("re-sized"), "the same structure with another constant"
    assert _computes_spec(scaled)


def test_structures_ignore_extents_but_not_ops():
    a, b = ir.from_jax(layer, *_args(8)), ir.from_jax(layer, *_args(32))
    assert structure(a) == structure(b)
    c = ir.from_jax(lambda x, w: jax.nn.gelu(x @ w) * 2.0, *_args(8))
    assert structure(a) != structure(c)


def test_a_winner_that_fails_at_the_new_shapes_is_not_used():
    old_spec, new_spec = ir.from_jax(layer, *_args(8)), ir.from_jax(layer, *_args(16))
    kernel = mugraph.superoptimize(old_spec, config=CONFIG, progress=False, cache=False)
    assert resize_winner(old_spec, kernel.graph, new_spec, "h100") is not None
    wrong = ir.KernelGraph([o * 2.0 for o in kernel.graph.outputs], kernel.graph.inputs)
    assert resize_winner(old_spec, wrong, new_spec, "h100") is None


def test_jit_resizes_for_a_new_batch_and_runs_the_kernel(fresh_cache):
    f = mugraph.jit(layer, backend="harness", config=CONFIG, cache=fresh_cache)
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((64, 64)) / 8, jnp.float16)
    for batch in (16, 24):
        x = jnp.asarray(rng.standard_normal((batch, 64)), jnp.float16)
        got = np.asarray(f(x, w), np.float32)
        want = np.asarray(layer(x, w), np.float32)
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    origins = [k.origin for k in f.kernels.values()]
    assert origins[0].startswith("searched") and origins[1].startswith("re-sized")


def test_a_winner_that_cannot_be_resized_here_is_searched_not_an_error(fresh_cache, monkeypatch):
    """Re-sizing a stored winner can refuse these shapes with a typed error (a mask whose dims
    the old shapes did not tie to the rest): the search runs, and the report says why."""
    import mugraph.search.buckets as buckets
    from mugraph.ir.errors import ShapeError
    mugraph.superoptimize(layer, *_args(8), config=CONFIG, progress=False, cache=fresh_cache)

    def refuse(*args, **kwargs):
        raise ShapeError("select of [512,512] and [1,32,128,128]: dim -1 is 512 vs 128")

    monkeypatch.setattr(buckets, "resize_winner", refuse)
    again = mugraph.superoptimize(layer, *_args(48), config=CONFIG, progress=False, cache=fresh_cache)
    assert "does not re-size to these shapes (select of [512,512]" in again.origin
    assert "searched; stored as cache entry" in again.origin
    assert again.graph.custom_ops() and _computes_spec(again)
