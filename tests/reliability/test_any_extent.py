"""Any extent works (1, primes, 100, ...): the search chooses grids, tiles and trip counts that
divide, and never surfaces its own tiling error. Random small programs (matmuls, norms, softmax,
elementwise chains) at random extents get a verified kernel, possibly the unfused spec."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

import mugraph
from mugraph import ir
from mugraph.ir import BlockInput, KNode
from mugraph.ir.ops import KOp
from mugraph.search.labels import DimLabel, Label
from mugraph.search.schedules import input_maps, reduced_sizes, skeletons

S = jax.ShapeDtypeStruct


def _softmax(x):
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def _rms(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


# name -> (function, input shapes from extents (m, k, n))
PROGRAMS = {
    "relu(x @ w)": (lambda x, w: jax.nn.relu(x @ w), lambda m, k, n: [(m, k), (k, n)]),
    "rms(x) @ w": (lambda x, w: _rms(x) @ w, lambda m, k, n: [(m, k), (k, n)]),
    "softmax(x) @ w": (lambda x, w: _softmax(x) @ w, lambda m, k, n: [(m, k), (k, n)]),
    "softmax(q @ k.T) @ v": (lambda q, k, v: _softmax(q @ k.T) @ v,
                             lambda m, k, n: [(m, n), (k, n), (k, n)]),
    "silu(x) * y + x": (lambda x, y: jax.nn.silu(x) * y + x, lambda m, k, n: [(m, k), (m, k)]),
    "sum(x, 0)": (lambda x: jnp.sum(x, axis=0, keepdims=True), lambda m, k, n: [(m, k)]),
}
EXTENTS = st.sampled_from([1, 2, 3, 5, 7, 12, 13, 17, 31, 100, 130])


def test_a_schedule_whose_tiles_do_not_divide_a_tensor_is_not_offered():
    """The crash of relu(x @ w) with x 32 x 100: a first kernel summed the loop tiles of w
    (100 rows, two trips of 50) into a 50-row tensor that keeps the 100-row label; splitting
    that label in two blocks of two trips cut the 50 rows into tiles of 12.5."""
    k, n = Label(1, 100, "x.1"), Label(2, 64, "w.1")
    node = KNode(KOp.INPUT, (), ("t", (50, 64), ir.DType.FLOAT16))
    tensor = type("T", (), {"node": node, "labels": (DimLabel((k,)), DimLabel((n,)))})()
    offered = skeletons([tensor], lambda lab: lab is k)
    assert offered and all(not (sk.loop is k and k in sk.grid) for sk in offered)
    for sk in offered:     # each one cuts the tensor into whole tiles
        sizes = reduced_sizes(sk)
        imap, fmap = input_maps(tensor.labels, sk)
        BlockInput(0, node.shape, node.dtype, imap, fmap, sizes.grid, sizes.forloop)


@settings(max_examples=4, deadline=None)
@given(name=st.sampled_from(sorted(PROGRAMS)), m=EXTENTS, k=EXTENTS, n=EXTENTS,
       half=st.booleans())
def test_random_programs_at_random_extents_get_a_verified_kernel(name, m, k, n, half):
    fn, shapes = PROGRAMS[name]
    dtype = jnp.float16 if half else jnp.float32
    args = [S(s, dtype) for s in shapes(m, k, n)]
    kernel = mugraph.superoptimize(fn, *args, config={"budget_states": 1000, "budget_seconds": 60,
                                                      "max_kernel_ops": 2},
                                   progress=False, cache=False)
    assert kernel.report.verification.equivalent, kernel.result.summary()
    arrays = [np.random.default_rng(0).standard_normal(a.shape).astype(a.dtype) for a in args]
    got, want = kernel.run_reference(*arrays), ir.interpret(kernel.spec, arrays)[0]
    assert np.allclose(got, want, rtol=2e-2, atol=2e-2, equal_nan=True), kernel.result.summary()


def test_a_long_extent_that_is_no_multiple_of_the_limit_is_searched_reduced():
    """10000 or 1000 (not multiples of 128) were searched at their real extent: every check of
    a 10000^2 matmul structure then ran past the memory limit and was rejected. They shrink to
    128 like 4096 does; a mean's divisor 1000 follows the label there and back."""
    from mugraph.search import SearchConfig, search
    from mugraph.search.instantiate import reduced_extents
    from mugraph.search.labels import analyze
    spec = ir.from_jax(lambda x, w: _rms(x) @ w, S((16, 1000), jnp.float32), S((1000, 300), jnp.float32))
    extents, rescale = reduced_extents(analyze(spec), spec, 128)
    assert sorted(extents.values()) == [16, 128, 128]
    assert rescale == {128.0: 1000.0}     # the mean's divisor, re-derived at the real shapes
    result = search(spec, SearchConfig(budget_states=1500, max_kernel_ops=1), progress=False)
    assert result.report.reduced_shapes == {"x": (16, 128), "w": (128, 128)}
    assert result.report.verified > 0 and result.report.verification.equivalent


def test_a_concat_axis_is_as_long_as_its_parts_at_the_reduced_shapes():
    """concat([relu(x), y]) @ w: the concat's parts shrink, so its whole (the matmul's inner dim,
    w's rows) must shrink to their sum, not to the limit (that crashed: 256 against 128). Where a
    constant ties the whole (a mean over it), the concat's labels keep their extents."""
    from mugraph.search import SearchConfig, search
    for n, reduced in ((150, 128), (256, 128)):
        args = [S((8, n), jnp.float32), S((8, n), jnp.float32), S((2 * n, 8), jnp.float32)]
        spec = ir.from_jax(lambda x, y, w: jnp.concatenate([jax.nn.relu(x), y], axis=1) @ w, *args)
        report = search(spec, SearchConfig(budget_states=400, max_kernel_ops=1), progress=False).report
        assert report.reduced_shapes == {"x": (8, reduced), "y": (8, reduced), "w": (2 * reduced, 8)}
        assert report.verification.equivalent
    mean = ir.from_jax(lambda x, y: jnp.mean(jnp.concatenate([x, y], axis=1), axis=1, keepdims=True),
                       *[S((8, 256), jnp.float32)] * 2)
    report = search(mean, SearchConfig(budget_states=400, max_kernel_ops=1), progress=False).report
    assert report.reduced_shapes == {"x": (8, 256), "y": (8, 256)}
