"""Lifting what model code writes: head split and merge reshapes, 3-D/4-D transposes, slices and
concatenations (rotate-half RoPE), jnp.split (fused QKV), jnp.repeat (GQA), batched and grouped
dot_generals (einsum over heads, Flax's LinearGeneral), masks built inside the function, folded
constant tables (RoPE's cos/sin), 0-d inputs and outputs; and every layer of the model suite.

Each construct is lifted, run by the float64 reference interpreter and compared with `jax.jit(fn)`
on random inputs; structural assertions say how it was lifted (a view, a TABLE, ...).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mugraph import ir, models
from mugraph.ir import KOp, UnsupportedOp
from mugraph.ir.layout import strided_view
from mugraph.ir.origin import traced_outputs

S = jax.ShapeDtypeStruct
F32 = jnp.float32


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def lifted(fn, *args, rtol=1e-5):
    """Lift fn at `args`, check the graph (float64 reference) against jax.jit(fn) on them."""
    graph = ir.from_jax(fn, *args)
    flat = jax.tree_util.tree_leaves(args)
    want = [np.asarray(w, np.float64) for w in jax.tree_util.tree_leaves(jax.jit(fn)(*args))]
    got = traced_outputs(graph, ir.interpret(graph, flat))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, float(np.abs(w).max())))
    return graph


def ops(graph) -> set:
    return {n.op for n in graph.nodes}


def views_of_inputs(graph) -> list:
    """Layout nodes over inputs that read them as strided views (no copy)."""
    return [n for n in graph.nodes if n.op in (KOp.RESHAPE, KOp.SLICE, KOp.TRANSPOSE)
            and strided_view(n) is not None and strided_view(n).root.op is KOp.INPUT]


# ---- reshapes and transposes ---------------------------------------------------------------------
def test_head_split_of_an_input_is_a_reshape_view():
    g = lifted(lambda x: jnp.tanh(x.reshape(2, 8, 4, 16)), rand(2, 8, 64))
    assert any(n.op is KOp.RESHAPE and n.shape == (2, 8, 4, 16) for n in views_of_inputs(g))


def test_head_merge_after_a_transpose_is_a_copy_not_a_view():
    g = lifted(lambda x: jnp.transpose(x, (0, 2, 1, 3)).reshape(2, 8, 64) * 2.0, rand(2, 4, 8, 16))
    merge = next(n for n in g.nodes if n.op is KOp.RESHAPE)
    assert strided_view(merge) is None


def test_transposes_of_3d_and_4d_arrays():
    lifted(lambda x: jnp.transpose(x, (2, 0, 1)) + 1.0, rand(3, 4, 5))
    lifted(lambda x: jnp.transpose(x, (0, 2, 3, 1)) * 2.0, rand(2, 3, 4, 5))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([(2, 3, 4), (6, 4), (4, 2, 3), (2, 12), (24,), (3, 8), (2, 2, 2, 3)]),
       st.integers(0, 3))
def test_reshape_of_a_computed_tensor_matches_jax(target, seed):
    x = rand(4, 6, seed=seed)
    lifted(lambda x: jnp.exp(x).reshape(target) + 1.0, x)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 3), st.integers(1, 4), st.integers(0, 7), st.integers(1, 8))
def test_slices_match_jax(a, n, b, m):
    x = rand(8, 8, seed=a + b)
    lifted(lambda x: x[a:a + n, b:min(8, b + m)] * 2.0, x)


# ---- slices, concatenation, split, repeat ----------------------------------------------------------
def test_rotate_half_rope_lifts_with_slice_views_and_a_concat():
    x = rand(1, 8, 2, 16)
    g = lifted(models.rotate_half, x)
    assert KOp.CONCAT in ops(g)
    assert sum(n.op is KOp.SLICE for n in views_of_inputs(g)) == 2


def test_split_of_a_fused_qkv_is_three_windows():
    def fn(x, w):
        q, k, v = jnp.split(x @ w, 3, axis=-1)
        return q * k + v
    g = lifted(fn, rand(4, 8), rand(8, 24))
    assert sum(n.op is KOp.SLICE for n in g.nodes) == 3


@pytest.mark.parametrize("batch", [1, 2])
def test_repeat_of_kv_heads_for_gqa_is_a_view_with_a_repeated_dim(batch):
    g = lifted(lambda k: jnp.repeat(k, 2, axis=2) * 2.0, rand(batch, 6, 2, 4))
    repeat = next(n for n in g.nodes if n.op is KOp.RESHAPE and n.srcs[0].op is KOp.BROADCAST)
    assert strided_view(repeat).repeats[-2:] == (2, 1)


def test_strided_slices_are_a_typed_error_naming_the_strides():
    with pytest.raises(UnsupportedOp, match="strides"):
        ir.from_jax(lambda x: x[::2] * 2.0, rand(4, 8))


# ---- dot_general forms ------------------------------------------------------------------------------
DOTS = {
    "batched_einsum_4d": ("bhsd,bhtd->bhst", (2, 2, 8, 4), (2, 2, 6, 4)),
    "einsum_heads_in_place": ("bshd,bthd->bhst", (2, 8, 2, 4), (2, 6, 2, 4)),
    "attention_values": ("bhst,bthd->bshd", (2, 2, 8, 6), (2, 6, 2, 4)),
    "linear_general": ("bsd,dhk->bshk", (2, 8, 16), (16, 2, 4)),
    "out_projection_two_contracting": ("bshk,hkd->bsd", (2, 8, 2, 4), (2, 4, 16)),
    "experts": ("td,edf->tef", (8, 16), (3, 16, 4)),
    "experts_down": ("tef,efd->ted", (8, 3, 4), (3, 4, 16)),
    "expert_combine": ("te,ted->td", (8, 3), (8, 3, 16)),
    "free_dims_both_sides": ("abk,kcd->abcd", (2, 3, 8), (8, 2, 3)),
}


@pytest.mark.parametrize("name", sorted(DOTS))
def test_dot_general_forms_match_jax(name):
    spec, a, b = DOTS[name]
    lifted(lambda x, y: jnp.einsum(spec, x, y), rand(*a), rand(*b, seed=1))


def test_tensordot_over_two_dims():
    lifted(lambda x, y: jnp.tensordot(x, y, 2).reshape(1), rand(4, 8), rand(4, 8, seed=1))


def test_flax_linear_general_kernel_is_read_as_a_2d_view():
    g = lifted(lambda x, w: jnp.einsum("bsd,dhk->bshk", x, w), rand(1, 8, 16), rand(16, 2, 4))
    assert {n.shape for n in views_of_inputs(g)} >= {(8, 16), (16, 8)}


# ---- masks, constants, tables -----------------------------------------------------------------------
def test_causal_attention_4d_with_tril_built_inside_and_finfo_min():
    def fn(q, k, v):
        s = q.shape[1]
        return models.attention(q, k, v, jnp.tril(jnp.ones((s, s), dtype=bool))[None, None])
    g = lifted(fn, rand(2, 8, 2, 4), rand(2, 8, 2, 4, seed=1), rand(2, 8, 2, 4, seed=2))
    assert KOp.IOTA in ops(g) and KOp.TABLE not in ops(g), "the mask is computed, not stored"


def test_arange_mask_against_a_position():
    def fn(x):
        i = jnp.arange(x.shape[-1])
        return jnp.where(i[None, :] <= i[:, None], x, jnp.finfo(x.dtype).min)
    lifted(fn, rand(8, 8))


def test_rope_tables_built_inside_are_folded_into_tables():
    def fn(x):
        cos, sin = models.rope_tables(jnp.arange(x.shape[1]), x.shape[-1])
        return models.apply_rope(x, cos, sin)
    g = lifted(fn, rand(1, 8, 2, 16), rtol=1e-5)
    assert sum(n.op is KOp.TABLE for n in g.nodes) == 2


def test_closed_over_constant_arrays_become_tables():
    table = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
    mask = np.random.default_rng(0).uniform(size=(4, 4)) > 0.5
    g = lifted(lambda x: x * table, rand(4, 8))
    assert KOp.TABLE in ops(g)
    g = lifted(lambda x: jnp.where(mask, x, -1e9), rand(4, 4))
    assert KOp.TABLE in ops(g)


@pytest.mark.parametrize("band", [np.tril, np.triu])
@pytest.mark.parametrize("k", [-2, 0, 3])
def test_a_folded_causal_mask_is_rebuilt_from_iotas(band, k):
    """The mask mugraph.jit's trace sees as a constant array (jnp.tril(jnp.ones(...)) folded)
    lifts as the iota comparison it is: computed in the kernel, not stored."""
    mask = band(np.ones((1, 1, 6, 8), bool), k)
    g = lifted(lambda x: jnp.where(mask, x, jnp.finfo(x.dtype).min), rand(2, 3, 6, 8))
    assert KOp.IOTA in ops(g) and KOp.TABLE not in ops(g)


@pytest.mark.parametrize("fn", [
    lambda x: x * (jnp.arange(8) // 2),
    lambda x: jnp.where((jnp.arange(8) & 1) == 0, x, 0.0),
    lambda x: x * (jnp.arange(8) * 10_000_000),
    lambda x: (x, jnp.asarray(np.linspace(0.0, 1.0, 8, dtype=np.float32))),
], ids=["floor_div", "bitwise", "large_ints", "constant_output"])
def test_index_arithmetic_without_ir_ops_is_folded_as_jax_computes_it(fn):
    lifted(fn, rand(4, 8))


# ---- 0-d inputs and outputs ----------------------------------------------------------------------
def test_a_learned_scalar_input_and_a_scalar_loss_output():
    def loss(x, w, scale):
        return jnp.mean(jnp.square(x @ w * scale))
    args = (rand(8, 16), rand(16, 4, seed=1), np.float32(0.5))
    g = lifted(loss, *args)
    assert g.inputs[2].shape == (1,) and g.outputs[0].shape == (1,)
    out = traced_outputs(g, ir.interpret(g, list(args)))
    assert out[0].shape == ()


def test_a_scalar_mean_of_a_rank_4_tensor():
    lifted(lambda x: jnp.mean(x), rand(2, 3, 4, 5))


# ---- serialisation of the new ops ----------------------------------------------------------------
def test_graphs_with_tables_slices_and_reshapes_round_trip_through_json():
    def fn(x):
        cos, sin = models.rope_tables(jnp.arange(x.shape[1]), 16)
        return models.apply_rope(x.reshape(1, 8, 2, 16), cos, sin)
    g = ir.from_jax(fn, S((1, 8, 32), F32))
    assert {KOp.TABLE, KOp.SLICE, KOp.RESHAPE, KOp.CONCAT} <= ops(g)
    assert ir.from_json(ir.to_json(g)) is g


# ---- the model suite: every layer lifts whole (its int / top-k parts cut out) -------------------
WHOLE = ["llama3_prefill", "gpt2_block", "bert_block", "soft_moe", "single_head_block",
         "nnx_block", "eqx_block"]


def _layer_check(fn, args, rtol):
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    graph = ir.from_jax(fn, *args)
    want = [np.asarray(w, np.float64) for w in jax.tree_util.tree_leaves(jax.jit(fn)(*args))]
    got = ir.interpret(graph, leaves)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(np.abs(w).max()))
    return graph


TOLERANCE = {"bfloat16": 3e-2, "float16": 5e-3, "float32": 1e-5}


@pytest.mark.parametrize("name", WHOLE)
def test_model_layer_lifts_whole_at_small_dims(name):
    layer = models.get(name)
    if not layer.available():
        pytest.skip(f"{layer.extra} is not installed")
    inst = layer.at("small")
    graph = _layer_check(inst.fn, inst.args(0), TOLERANCE[inst.dims.get("dtype", "float32")])
    assert len(graph.nodes) > 20


def _decode_parts(dims):
    """llama_decode with its int-position parts cut out, as the partitioner cuts them: RoPE's
    cos/sin and the validity mask come in as inputs, and the KV cache update is JAX's (the
    projections are one region, the attention over the updated cache and the MLP another)."""
    heads, kv = dims["heads"], dims["kv_heads"]

    def project(params, x, cos, sin):
        b, _, d = x.shape
        hd = d // heads
        h = models.rms_norm(x, params["attn_norm"])
        q = (h @ params["wq"]).reshape(b, 1, heads, hd)
        k = (h @ params["wk"]).reshape(b, 1, kv, hd)
        v = (h @ params["wv"]).reshape(b, 1, kv, hd)
        return models.apply_rope(q, cos, sin), models.apply_rope(k, cos, sin), v

    def attend(params, x, q, k_cache, v_cache, valid):
        b, _, d = x.shape
        keys = jnp.repeat(k_cache, heads // kv, axis=2)
        values = jnp.repeat(v_cache, heads // kv, axis=2)
        o = models.attention(q, keys, values, valid[None, None, None, :] > 0).reshape(b, 1, d)
        x = x + o @ params["wo"]
        h = models.rms_norm(x, params["mlp_norm"])
        return x + models.swiglu(h, params["w_gate"], params["w_up"], params["w_down"])
    return project, attend


def test_llama_decode_lifts_whole_but_its_int_position_parts():
    inst = models.get("llama3_decode").at("small")
    params, x, k_cache, v_cache, pos = inst.args(0)
    project, attend = _decode_parts(inst.dims)
    hd = inst.dims["d"] // inst.dims["heads"]
    cos, sin = models.rope_tables(jnp.reshape(pos, (1,)), hd, dtype=x.dtype)
    cos, sin = np.asarray(cos), np.asarray(sin)
    _layer_check(project, (params, x, cos, sin), 3e-2)
    q, k, v = project(params, x, cos, sin)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, pos, 0, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, pos, 0, 0))
    valid = (np.arange(k_cache.shape[1]) <= pos).astype(x.dtype)
    _layer_check(attend, (params, x, np.asarray(q), np.asarray(k_cache), np.asarray(v_cache),
                          valid), 3e-2)


def test_moe_layer_lifts_whole_but_its_top_k():
    inst = models.get("moe_top2").at("small")
    params, x = inst.args(0)

    def router(params, x):
        return jax.nn.softmax((x @ params["router"]).astype(jnp.float32), axis=-1)

    def experts(params, x, gates, keep, top_sum):
        weights = (gates * keep / top_sum).astype(x.dtype)
        hidden = jax.nn.silu(jnp.einsum("td,edf->tef", x, params["w_gate"])) * \
            jnp.einsum("td,edf->tef", x, params["w_up"])
        out = jnp.einsum("tef,efd->ted", hidden, params["w_down"])
        return jnp.einsum("te,ted->td", weights, out)
    _layer_check(router, (params, x), 1e-5)
    gates = np.asarray(router(params, x))
    top, idx = jax.lax.top_k(gates, 2)
    keep = np.asarray(jnp.sum(jax.nn.one_hot(idx, gates.shape[-1], dtype=gates.dtype), axis=-2))
    top_sum = np.asarray(jnp.sum(top, axis=-1, keepdims=True))
    _layer_check(experts, (params, x, gates, keep, top_sum), 3e-2)
    want = np.asarray(models.moe_layer(params, x, top_k=2), np.float64)
    got = np.asarray(experts(params, x, gates, keep, top_sum), np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)   # the cut is the layer


def test_mean_loss_of_a_block_is_a_scalar_output():
    inst = models.get("single_head_block").at("small")

    def loss(params, x):
        return jnp.mean(jnp.square(models.single_head_block(params, x)))
    params, x = inst.args(0)
    g = lifted(loss, params, x, rtol=1e-5)
    assert g.outputs[0].shape == (1,)
    assert math.isfinite(float(traced_outputs(g, ir.interpret(g, jax.tree_util.tree_leaves(
        (params, x))))[0]))
