"""Tracing, classifying and cutting programs into regions (no search): search/flatten.py,
search/classify.py, search/partition.py, and the stitcher's JAX path (mugraph/stitch.py)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mugraph import models
from mugraph.ir.ops import KOp
from mugraph.search.classify import PROGRAM_OUTPUT, Kind, classify
from mugraph.search.flatten import flatten_program
from mugraph.search.partition import Limits, partition
from mugraph.stitch import Plan, host_program

S = jax.ShapeDtypeStruct
LAYERS = [n for n in models.names() if models.get(n).available()]


@functools.cache
def _small(name: str):
    inst = models.get(name).at("small")
    return inst, partition(flatten_program(inst.fn, inst.example_args))


def _tree_close(got, want, rtol):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.nanmax(np.abs(w)))


def test_nested_calls_are_inlined_and_dead_steps_dropped():
    @jax.jit
    def inner(x):
        return jax.nn.relu(x) * 2.0          # relu is a custom_jvp call inside a jit

    def fn(x, w):
        _ = jnp.sin(x)                       # dead: never reaches an output
        return inner(x) @ w

    p = flatten_program(fn, [S((8, 16), jnp.float32), S((16, 4), jnp.float32)])
    names = [s.primitive for s in p.steps]
    assert not {"pjit", "jit", "custom_jvp_call"} & set(names)
    assert "sin" not in names and "dot_general" in names
    assert [p.value(v).name for v in p.inputs] == ["x", "w"]


def test_custom_vjp_and_remat_bodies_are_inlined_and_run_as_written():
    @jax.custom_vjp
    def scaled(x):
        return x * 3.0

    scaled.defvjp(lambda x: (scaled(x), None), lambda _, g: (g * 3.0,))

    @jax.checkpoint
    def block(x, w):
        return jnp.tanh(scaled(x) @ w)

    def fn(x, w):
        return jnp.sort(block(x, w), axis=-1)

    args = [S((8, 16), jnp.float32), S((16, 16), jnp.float32)]
    part = partition(flatten_program(fn, args))
    prims = {s.primitive for s in part.program.steps}
    assert not prims & {"custom_vjp_call", "checkpoint", "remat", "pjit"}
    assert [s.primitive for s in part.jax_steps()] == ["sort"]
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(a.shape).astype(np.float32) for a in args)
    got = host_program(Plan(part, {}), None)(x, w)
    np.testing.assert_allclose(got[0], jax.jit(fn)(x, w), rtol=1e-6)


def test_top_k_and_the_integer_ops_after_it_stay_jax_with_reasons():
    _, part = _small("moe_top2")
    c = part.classification
    by_prim = {}
    for s in c.program.steps:
        by_prim.setdefault(s.primitive, []).append(c.kind(s.index))
    assert by_prim["top_k"] == [Kind.JAX]
    assert Kind.LIFT in by_prim["dot_general"]
    reasons = [c.reasons[s.index] for s in part.jax_steps()]
    assert any("cannot lift `top_k`" in r for r in reasons)
    assert any("int32" in r and "only JAX computes" in r for r in reasons)


def test_a_closed_over_constant_array_is_fed_into_the_region():
    table = np.arange(64, dtype=np.float32).reshape(16, 4) / 64.0   # not uniform

    def fn(x):
        return jnp.tanh(x @ table) + 1.0

    part = partition(flatten_program(fn, [S((8, 16), jnp.float32)]))
    assert not part.jax_steps()
    (region,) = part.regions
    assert len(region.spec.inputs) == 2 and region.matmuls == 1
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    out = host_program(Plan(part, {}), None)(x)
    np.testing.assert_allclose(np.asarray(out[0]), np.asarray(jax.jit(fn)(x)), rtol=1e-6)


def test_a_mask_jax_reads_is_computed_by_jax():
    def fn(x):
        positive = x > 0.0
        return jnp.sort(positive, axis=-1).astype(jnp.float32) * jnp.exp(x)

    c = classify(flatten_program(fn, [S((8, 16), jnp.float32)]))
    gt = next(s for s in c.program.steps if s.primitive == "gt")
    assert c.kind(gt.index) is Kind.JAX
    assert "cannot leave" in c.reasons[gt.index]
    exp = next(s for s in c.program.steps if s.primitive == "exp")
    assert c.kind(exp.index) is Kind.LIFT


@pytest.mark.parametrize("name", LAYERS)
def test_regions_cover_the_lifted_steps_once_in_a_runnable_order(name):
    _, part = _small(name)
    c = part.classification
    in_regions = [s.index for r in part.regions for s in r.steps]
    lifted = [s.index for s in c.program.steps if c.kind(s.index) is Kind.LIFT]
    assert sorted(in_regions) == sorted(lifted)
    made = set(c.program.inputs) | set(c.program.consts)
    made |= {o for s in c.program.steps if c.kind(s.index) is Kind.CONST for o in s.outs}
    for kind, x in part.items:
        steps = part.regions[x].steps if kind == "region" else [x]
        inside = {o for s in steps for o in s.outs}
        for s in steps:
            assert all(v in made or v in inside for v in s.value_ins()), (name, s.primitive)
        made |= inside
    for r in part.regions:
        assert r.matmuls <= part.limits.max_matmuls and r.ops <= part.limits.max_ops
        for vid in (*r.inputs, *r.outputs):
            if c.producer.get(vid) is not None and c.kind(c.producer[vid]) is Kind.LIFT:
                assert c.exportable(vid) is None


@pytest.mark.parametrize("name", LAYERS)
def test_the_plan_with_every_region_as_jax_is_the_layer(name):
    inst, part = _small(name)
    args = inst.args(0)
    leaves = jax.tree_util.tree_leaves(args)
    got = host_program(Plan(part, {}), None)(*leaves)
    want = jax.tree_util.tree_leaves(jax.jit(inst.fn)(*args))
    _tree_close(got, want, rtol=0)


def test_limits_bound_every_region():
    inst = models.get("single_head_block").at("small")
    program = flatten_program(inst.fn, inst.example_args)
    tight = partition(program, Limits(max_matmuls=1, max_ops=6, max_outputs=1))
    loose = partition(program)
    assert all(r.matmuls <= 1 and r.ops <= 6 for r in tight.regions)
    assert len(tight.regions) > len(loose.regions)
    assert sum(r.matmuls for r in tight.regions) == sum(r.matmuls for r in loose.regions) == 9


@pytest.mark.parametrize("name", LAYERS)
def test_a_step_larger_than_the_limits_is_a_region_of_its_own_not_a_reason_to_split_all(name):
    """Every region holds at most the limits' matmuls and ops unless it is one step (a multi-head
    einsum lowers to several matmuls and cannot be cut); the layer's lifted steps gather into
    regions of several steps, never one region per step (the fallback when no cutting fits)."""
    _, p = _small(name)
    limits = Limits()
    for r in p.regions:
        assert len(r.steps) == 1 or (r.matmuls <= limits.max_matmuls and r.ops <= limits.max_ops), \
            describe(r)
    lifted = sum(len(r.steps) for r in p.regions)
    assert len(p.regions) * 3 <= lifted, f"{len(p.regions)} regions for {lifted} lifted steps"


def describe(region) -> str:
    from mugraph.search.partition import describe_region
    return f"region {region.index}: {describe_region(region)} ({region.matmuls} matmuls, {region.ops} ops)"


@pytest.mark.parametrize("name", ["single_head_block", "moe_top2", "llama3_decode"])
def test_identical_layers_cut_into_identical_regions(name):
    from mugraph.bench_models import stack_layers
    one = models.get(name).at("small")      # moe_top2, decode: JAX steps inside every layer
    three = stack_layers(one, 3)            # decode: each layer with its own KV caches
    single = partition(flatten_program(one.fn, one.example_args))
    stacked = partition(flatten_program(three.fn, three.example_args))
    assert len(stacked.regions) == 3 * len(single.regions)
    assert {r.spec for r in stacked.regions} == {r.spec for r in single.regions}


def test_a_cut_never_separates_a_mask_from_its_use():
    def fn(x, w):
        keep = (x > 0).astype(jnp.float32)       # x * mask lifts as where(mask, x, 0)
        h = jnp.exp(x) * keep
        return (h @ w) @ w.T

    part = partition(flatten_program(fn, [S((8, 16), jnp.float32), S((16, 16), jnp.float32)]),
                     Limits(max_matmuls=1, max_ops=3, max_outputs=1))
    c = part.classification
    for r in part.regions:
        for vid in r.inputs:
            producer = c.producer.get(vid)
            assert producer is None or c.kind(producer) is not Kind.LIFT or \
                c.exportable(vid) is None


def test_program_outputs_are_marked():
    inst, part = _small("soft_moe")
    c = part.classification
    (out,) = c.program.outputs
    assert PROGRAM_OUTPUT in c.consumers[out]
    assert any(r.spec is not None and any(n.op is KOp.MATMUL for n in r.spec.nodes)
               for r in part.regions)


def test_never_slower_returns_regions_to_jax_until_the_whole_is_no_slower():
    from mugraph.search.baseline import xla_estimate
    from mugraph.search.regions import Outcome, never_slower, whole_estimates
    inst = models.get("single_head_block").at("small")
    part = partition(flatten_program(inst.fn, inst.example_args),
                     Limits(max_matmuls=1, max_ops=3, max_outputs=1))
    # each region "fused" by a kernel 1% faster than jax.jit's launches for it alone: the whole
    # loses, since XLA fuses across the (many) cuts
    outcomes = [Outcome(r, True, "", None, 0.99 * xla_estimate(r.spec).seconds,
                        xla_estimate(r.spec).seconds) if r.spec is not None else Outcome(r, False)
                for r in part.regions]
    before = whole_estimates(part, outcomes, "h100")
    assert before.stitched > before.baseline
    kept, after = never_slower(part, outcomes, "h100")
    assert after.stitched <= after.baseline and after.speedup >= 1.0
    assert all(o.reason for o in kept if not o.fused)
    nothing = whole_estimates(part, [Outcome(r, False) for r in part.regions], "h100")
    assert nothing.stitched == pytest.approx(nothing.baseline)      # all JAX: fn itself, 1.0x
    # the ceiling: the whole lifted program's roofline; no stitching here goes below it
    for e in (before, after, nothing):
        assert e.floor <= e.stitched and e.ceiling >= e.speedup
    assert nothing.ceiling > 1.0


def test_the_program_picture_has_a_box_per_row_and_an_edge_per_read():
    from mugraph.ir.picture import ProgramRow, program_svg
    from mugraph.ir.node import kernel_input
    from mugraph.ir.graph import KernelGraph
    x = kernel_input("in0", (8, 16), "float32")
    graph = KernelGraph([x.exp()])
    rows = [ProgramRow("row0", "custom", ("R0 fused", "exp"), graph),
            ProgramRow("row1", "jax", ("JAX: 1 steps", "sort"), None, ("row0",)),
            ProgramRow("row2", "jax", ("R1 kept as JAX", "tanh"), None, ("row0", "row1"))]
    svg = program_svg(rows)
    assert svg.count('class="node custom"') == 1 and svg.count('class="node jax"') == 2
    assert svg.count('data-from="row.row0"') == 2 and 'data-to="row.row2"' in svg
    assert "exp" in svg.split("R0 fused")[1]      # the fused row holds its kernel graph
