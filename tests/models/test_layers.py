"""Whole layers through mugraph.jit and superoptimize: programs of regions, stitched inside
jax.jit on the CPU harness, equal to jax.jit(fn); small dims and small search budgets (a
deterministic state budget per region), one result cache per module."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import models
from mugraph.errors import UnsupportedOp
from mugraph.models import rms_norm
from mugraph.program import Program
from mugraph.search import SearchConfig
from mugraph.verify.float_diff import disagreement_tolerance
from mugraph.whole_check import special_axis, special_rows
from mugraph.ir.dtypes import DType

S = jax.ShapeDtypeStruct
CHEAP = SearchConfig(budget_seconds=20, budget_states=300, max_kernel_ops=1)
LAYER = SearchConfig(budget_seconds=4, budget_states=50, max_kernel_ops=1)   # every region 1 s
LAYERS = [n for n in models.names() if models.get(n).available()]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("regions-cache")


def assert_matches(got, want):
    """Every result within the float test's tolerance for its dtype; NaN and inf where jax.jit
    has them."""
    got, want = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        w_dtype = w.dtype
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.where(np.isinf(w), g, 0), np.where(np.isinf(w), w, 0))
        finite = np.isfinite(w)
        scale = max(np.abs(w[finite]).max(initial=0.0), 1e-30)
        tol = disagreement_tolerance(DType.parse(np.dtype(w_dtype).name)) \
            if _is_float(np.zeros(0, w_dtype)) else 0
        assert np.abs(g[finite] - w[finite]).max(initial=0.0) <= tol * scale


def with_special_rows(args):
    """A row of +inf, a row of NaN and a row of zeros in the activations (the first float
    argument after the parameters with a dim of 3 or more)."""
    args = list(args)
    i = next(i for i, a in enumerate(args[1:], 1)
             if _is_float(a) and special_axis(np.shape(a)) is not None)
    args[i] = special_rows(args[i])
    return tuple(args)


def _is_float(a) -> bool:
    return np.asarray(a).dtype.name in ("float16", "bfloat16", "float32")


@pytest.mark.parametrize("name", LAYERS)
def test_every_layer_runs_through_jit_on_the_harness_as_jax_jit_does(name, cache):
    inst = models.get(name).at("small")
    fn = mugraph.jit(inst.fn, backend="harness", config=LAYER, cache=cache)
    args = inst.args(0)
    want = jax.jit(inst.fn)(*args)
    assert_matches(fn(*args), want)
    assert_matches(jax.jit(fn)(*args), want)
    special = with_special_rows(args)
    assert_matches(jax.jit(fn)(*special), jax.jit(inst.fn)(*special))
    (program,) = fn.kernels.values()
    text = str(program.report)
    assert "whole-program check:" in text and "estimated end to end" in text
    for _, why in program.report.jax_steps:
        assert why and why in text     # every step left to JAX is listed with why
    for _, why in program.report.kept_as_jax:
        assert why
    assert program.speedup is None or program.speedup >= 1.0


def _norm_then_sort(x, g, w):
    """RMSNorm -> matmul (fuses) and a sort (stays JAX)."""
    return jnp.sort(rms_norm(x, g) @ w, axis=-1)


NORM_ARGS = [S((16, 64), jnp.float32), S((64,), jnp.float32), S((64, 64), jnp.float32)]


@pytest.fixture(scope="module")
def fused(cache):
    return mugraph.superoptimize(_norm_then_sort, *NORM_ARGS, config=CHEAP, cache=cache,
                                 progress=False)


def _norm_args(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(a.shape).astype(np.float32) for a in NORM_ARGS]


def test_a_fused_region_runs_beside_jax_steps_on_every_path(fused, cache):
    assert isinstance(fused, Program)
    assert len(fused.fused) == 1 and fused.report.jax_steps[0][0] == "sort"
    assert fused.check.status == "EQUIVALENT"
    args = _norm_args(1)
    want = jax.jit(_norm_then_sort)(*args)
    assert_matches(fused.run_reference(*args), want)
    assert_matches(fused.run_on_cpu(*args), want)
    assert_matches(jax.jit(fused.as_jax("harness"))(*args), want)
    assert fused.speedup >= 1.0
    assert "sort" in fused.show("svg") and "R0 fused" in fused.show("svg")
    assert "kernel graph" in fused.show("html")
    again = mugraph.superoptimize(_norm_then_sort, *NORM_ARGS, config=CHEAP, cache=cache,
                                  progress=False)
    assert again.check.status == "EQUIVALENT" and "kept beside the result cache" in again.check.text


def test_the_cuda_backend_is_one_program_with_a_custom_call_per_fused_region(fused):
    from mugraph.jax_integration import as_jax
    from mugraph.stitch import as_jax_program
    fns = {i: as_jax(k, "cuda", require_device=False) for i, k in fused.kernels.items()}
    f = as_jax_program(fused.plan, fns, fused.fn)
    text = f.trace(*NORM_ARGS).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @mugraph_launch" in line]
    assert len(calls) == sum(len(k.graph.custom_ops()) for k in fused.kernels.values())
    assert "sort" in text


def test_grad_and_vmap_of_a_program_of_regions(fused):
    f = fused.as_jax("harness")
    x, g, w = _norm_args(2)

    def loss(fn, g):
        return jnp.sum(fn(x, g, w) ** 2)

    got = jax.grad(lambda g: loss(f, g))(g)
    want = jax.grad(lambda g: loss(_norm_then_sort, g))(g)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    xs = np.stack([x, 2 * x])
    assert_matches(jax.vmap(f, in_axes=(0, None, None))(xs, g, w),
                   jax.vmap(_norm_then_sort, in_axes=(0, None, None))(xs, g, w))


def test_grad_and_vmap_through_jit_of_a_layer(cache):
    inst = models.get("single_head_block").at("small")
    fn = mugraph.jit(inst.fn, backend="harness", config=LAYER, cache=cache)
    params, x = inst.args(0)

    def loss(f, params):
        return jnp.sum(f(params, x) ** 2)

    got = jax.grad(lambda p: loss(fn, p))(params)
    want = jax.grad(lambda p: loss(inst.fn, p))(params)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3,
                                   atol=1e-3 * np.abs(want[name]).max())
    xs = np.stack([x, -x])
    assert_matches(jax.vmap(fn, in_axes=(None, 0))(params, xs),
                   jax.vmap(inst.fn, in_axes=(None, 0))(params, xs))


def test_identical_layers_are_searched_once(cache):
    one = models.get("soft_moe").at("small")
    three = models.stack(one, 3)
    single = mugraph.superoptimize(one.fn, *one.example_args, config=CHEAP, cache=cache,
                                   progress=False)
    stacked = mugraph.superoptimize(three.fn, *three.example_args, config=CHEAP, cache=cache,
                                    progress=False)
    assert len(stacked.outcomes) == 3 * len(single.outcomes)
    assert stacked.report.searched == single.report.searched
    searched = sum(o.answer is not None for o in single.outcomes)   # regions of one op are not
    assert 0 < searched < len(single.outcomes)
    assert sum(o.same_as is not None for o in stacked.outcomes) == 2 * searched
    assert f"{2 * searched} shared here" in str(stacked.report)
    args = three.args(0)
    assert_matches(stacked.run_reference(*args), jax.jit(three.fn)(*args))


def test_a_region_whose_search_fails_stays_jax_and_says_why(cache):
    def too_big(x, w):         # inputs beyond the device: the region's search refuses it
        return jnp.sort(jnp.tanh(x @ w), axis=-1)

    program = mugraph.superoptimize(too_big, S((2**20, 2**16), jnp.float16),
                                    S((2**16, 2**16), jnp.float16), config=CHEAP, cache=cache,
                                    progress=False)
    (outcome,) = program.outcomes
    assert not outcome.fused and "search failed: ResourceError" in outcome.reason
    assert program.speedup == pytest.approx(1.0)
    assert "nothing is fused" in str(program.report)


def test_a_program_with_nothing_to_lift_is_one_typed_error_but_jit_runs_it(cache):
    with pytest.raises(UnsupportedOp, match="no part of sort lifts.*cannot lift `sort`"):
        mugraph.superoptimize(jnp.sort, S((8, 16), jnp.float32), config=CHEAP, cache=cache)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    fn = mugraph.jit(jnp.sort, backend="harness", config=CHEAP, cache=cache)
    np.testing.assert_array_equal(fn(x), jnp.sort(x))


def test_one_front_end_one_answer_whatever_the_entry_point(cache):
    inst = models.get("single_head_block").at("small")
    program = mugraph.superoptimize(inst.fn, *inst.example_args, config=LAYER, cache=cache,
                                    progress=False)
    assert program.report.equations[1] == 0          # the jnp.tril mask lifted: no JAX step
    eager = mugraph.jit(inst.fn, backend="harness", config=LAYER, cache=cache)
    inside = mugraph.jit(inst.fn, backend="harness", config=LAYER, cache=cache)
    args = inst.args(0)
    eager(*args)
    jax.jit(inside)(*args)
    for compiled in (eager, inside):
        (found,) = compiled.kernels.values()
        assert [o.region.spec for o in found.outcomes] == \
            [o.region.spec for o in program.outcomes]


def _sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def test_a_kernel_estimated_slower_than_jax_jit_is_said_so_and_not_used(cache):
    config = CHEAP.replace(budget_states=1)       # the spec itself: one launch per op
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = mugraph.superoptimize(_sigmoid, S((64, 64), jnp.float32), config=config,
                                       cache=cache, progress=False)
    assert kernel.slower_than_jax and kernel.speedup < 1.0
    assert any("slower than jax.jit" in str(c.message) for c in caught)
    assert "mugraph.jit runs the JAX function instead" in kernel.show()
    fn = mugraph.jit(_sigmoid, backend="harness", config=config, cache=cache)
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_array_equal(fn(x), jax.jit(_sigmoid)(x))


def _two_regions(x, w):
    """exp(x @ w), a sort (JAX), tanh(. @ w): two distinct regions around a JAX step."""
    return jnp.tanh(jnp.sort(jnp.exp(x @ w), axis=-1) @ w)


def test_regions_searched_by_a_process_pool_give_the_in_process_answer():
    from mugraph.program import prepare
    from mugraph.search.executors import InProcess, ProcessPool
    from mugraph.search.regions import search_regions
    args = [S((16, 32), jnp.float16), S((32, 32), jnp.float16)]
    p = prepare(_two_regions, args).partition
    config = SearchConfig(max_kernel_ops=1, budget_seconds=60, budget_states=300)
    alone = search_regions(p, config, executor=InProcess())
    pool = ProcessPool(2)
    try:
        parallel = search_regions(p, config, executor=pool)
    finally:
        pool.close()
    assert len({o.region.spec for o in alone}) == 2
    assert [o.fused for o in parallel] == [o.fused for o in alone] == [True, True]
    assert [o.kernel for o in parallel] == [o.kernel for o in alone]
    assert [o.answer.result.report.states for o in parallel] == \
        [o.answer.result.report.states for o in alone]


def test_bench_models_prints_a_row_per_layer(tmp_path, capsys):
    import json
    from mugraph.cli import main as cli
    out = tmp_path / "rows.json"
    rc = cli(["bench", "models", "--layers", "soft_moe", "--budget", "2", "--cache",
              str(tmp_path / "cache"), "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "speedup" in text and "soft_moe" in text and "mugraph bench models" in text
    (row,) = json.loads(out.read_text())
    assert row["layer"] == "soft_moe" and row["lifted"].startswith("24/24")
    assert row["speedup"] >= 1.0 and row["cold_s"] > 0 and row["warm_s"] > 0
    assert row["ceiling"] >= row["speedup"] and "ceiling" in text
    assert cli(["bench", "models", "--layers", "nope"]) == 2


def _masked_by_length(x, w, n):
    """Attention-like: keys past a length `n` (an int32 JAX holds) masked with -inf, softmax,
    then a projection. The mask is a boolean JAX computes from `n`."""
    keep = jnp.arange(x.shape[-1]) < n
    s = jnp.where(keep, x, -jnp.inf)
    return jax.nn.softmax(s, axis=-1) @ w


def _zeroed_past_length(x, w, n):
    """Columns of x past a length `n` zeroed before a projection."""
    return jax.nn.relu(jnp.where(jnp.arange(x.shape[-1]) < n, x, 0.0) @ w)


def test_a_boolean_jax_computes_enters_the_region_that_uses_it(cache):
    """The comparison with the int32 length stays JAX; its boolean result enters the region of
    the select as a float 0/1 tensor (not a reason to cut the softmax from its select), and the
    stitched program equals jax.jit(fn), masked keys included."""
    from mugraph.program import prepare
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 64), jnp.float32)
    w = jax.random.normal(jax.random.PRNGKey(1), (64, 32), jnp.float32)
    n = jnp.int32(37)
    p = prepare(_masked_by_length, (x, w, n)).partition
    (select_region,) = [r for r in p.regions if any(s.primitive == "select_n" for s in r.steps)]
    assert {"select_n", "reduce_max", "exp", "div"} <= {s.primitive for s in select_region.steps}
    assert select_region.spec is not None
    for f in (_masked_by_length, _zeroed_past_length):
        fn = mugraph.jit(f, backend="harness", config=CHEAP, cache=cache)
        for length in (37, 1, 64):
            assert_matches(fn(x, w, jnp.int32(length)), jax.jit(f)(x, w, jnp.int32(length)))
    (program,) = fn.kernels.values()
    assert "(1 fused, 0 kept as JAX)" in str(program.report), str(program.report)
    for length in (37, 1):   # the host paths feed the boolean the same way
        want = jax.jit(_zeroed_past_length)(x, w, jnp.int32(length))
        assert_matches(program.run_reference(x, w, jnp.int32(length)), want)
        assert_matches(program.run_on_cpu(x, w, jnp.int32(length)), want)
