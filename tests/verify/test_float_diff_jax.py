"""Own precision against `jax.jit(fn)` when the spec was traced from JAX: the origin is remembered beside the
graph (not in it), the float test runs the real jax.jit, and an fp16 layernorm keeps the range jax.jit keeps
(a candidate that reduces it in fp16 does not, and is not equivalent)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mugraph import ir
from mugraph.ir.origin import jax_origin, record_jax_origin
from mugraph.verify import check, float_diff
from tests.codegen.test_special_values_harness import _fused_layernorm


def _softmax(s):
    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def _layernorm(x):
    m = jnp.mean(x, axis=-1, keepdims=True)
    d = x - m
    return d * jax.lax.rsqrt(jnp.mean(d * d, axis=-1, keepdims=True) + 1e-5)


S16 = jax.ShapeDtypeStruct((8, 64), jnp.float16)


def test_the_origin_is_kept_beside_the_graph_without_changing_it():
    spec = ir.from_jax(_softmax, S16, input_names=["S"])
    assert jax_origin(spec).fn is _softmax
    text, digest = ir.to_json(spec), spec.digest()
    assert ir.from_json(text) is spec and "softmax" not in text   # interned, nothing added
    hand = ir.KernelGraph([ir.input("S", (8, 64), "float16").exp()])
    assert jax_origin(hand) is None
    record_jax_origin(spec, _softmax, (S16,))
    assert spec.digest() == digest


def test_own_precision_runs_the_real_jax_jit():
    spec = ir.from_jax(_softmax, S16, input_names=["S"])
    result = float_diff(spec, spec, seed=0)
    assert result.passed and result.reference == "jax.jit(fn)"
    record_jax_origin(spec, lambda s: _softmax(s) * 1.5, (S16,))      # a different jax.jit(fn) ...
    try:
        other = float_diff(spec, spec, seed=0)
        assert other.mode("float64").passed and not other.mode("own").passed  # ... fails own only
        assert "the spec is not the program jax.jit runs" in other.mode("own").worst.message
    finally:
        record_jax_origin(spec, _softmax, (S16,))


def test_a_searched_softmax_with_a_redundant_shift_is_not_equivalent_to_the_jax_program():
    spec = ir.from_jax(_softmax, S16, input_names=["S"])
    s = ir.input("S", (8, 64), "float16")
    e = (s - (s - (s - s.amax(1)))).exp()
    report = check(spec, ir.KernelGraph([e / e.sum(1)]), seed=0, formal=False)
    assert not report.equivalent and report.finite_field.passed
    assert "float differential test failed" in report.reason


def test_an_fp16_layernorm_keeps_the_range_jax_jit_keeps():
    spec = ir.from_jax(_layernorm, jax.ShapeDtypeStruct((4, 256), jnp.float16), input_names=["x"])
    fused = _fused_layernorm()
    x = (300 + np.random.default_rng(0).standard_normal((4, 256))).astype(np.float16)
    assert (x.astype(np.float64).sum(axis=1) > 65504).all()
    (own,) = ir.interpret(fused, [x], dtype="own")
    (exact,) = ir.interpret(spec, [x])
    assert np.isfinite(own).all() and np.isfinite(np.asarray(jax.jit(_layernorm)(x))).all()
    np.testing.assert_allclose(own.astype(np.float64), exact, atol=1e-2)
    assert float_diff(spec, fused, seed=0).passed
    # jnp.mean's casts are CASTs: the lifted spec sums in fp32 where jax.jit does, so its own
    # precision keeps jax.jit's range and values, and the float test compares every element
    (lifted,) = ir.interpret(spec, [x], dtype="own")
    np.testing.assert_array_equal(lifted, np.asarray(jax.jit(_layernorm)(x)))
    itself = float_diff(spec, spec, seed=0)
    assert itself.passed and not any(m.skipped for m in itself.modes)


def test_a_candidate_that_reduces_the_fp16_layernorm_in_fp16_is_not_equivalent():
    spec = ir.from_jax(_layernorm, jax.ShapeDtypeStruct((4, 256), jnp.float16), input_names=["x"])
    x = ir.input("x", (4, 256), "float16")
    d = x - x.sum(1) / 256.0                      # the row sum stored in fp16: inf past 65504
    eps = float(np.float16(1e-5))
    in_fp16 = ir.KernelGraph([d * ((d * d).sum(1) / 256.0 + eps).rsqrt()])
    report = check(spec, in_fp16, seed=0, formal=False)
    assert not report.equivalent and report.finite_field.passed
    assert "large own: FAILED" in report.reason and "non-finite value from the candidate" in report.reason
    xf = x.cast("float32")                        # the same program reducing in fp32, as JAX does
    d = x - (xf.sum(1) / 256.0).cast("float16")
    var = ((d * d).cast("float32").sum(1) / 256.0).cast("float16")
    in_fp32 = ir.KernelGraph([d * (var + eps).rsqrt()])
    assert check(spec, in_fp32, seed=0, formal=False).equivalent


def test_a_jax_function_that_cannot_run_falls_back_to_the_spec_and_says_so():
    spec = ir.from_jax(_softmax, S16, input_names=["S"])

    def broken(s):
        raise RuntimeError("no device")
    record_jax_origin(spec, broken, (S16,))
    try:
        result = float_diff(spec, spec, seed=0)
        assert result.passed and "jax.jit(fn) failed: RuntimeError: no device" in result.reference
        record_jax_origin(spec, lambda s: (_softmax(s), s), (S16,))     # one output too many
        assert "not the graph's outputs" in float_diff(spec, spec, seed=0).reference
    finally:
        record_jax_origin(spec, _softmax, (S16,))


def _biased_attention(q, k, v, b):
    return jax.nn.softmax(q @ k.T * 0.125 + b, axis=-1) @ v


def test_bf16_roundings_of_jax_jit_are_not_taken_for_another_program():
    """In bfloat16 jax.jit rounds the scores, the probabilities and the product to 8-bit
    significands, about 1% off the float64 spec on random inputs; that used to read as "the spec
    is not the program jax.jit runs" at some seeds, failing a kernel that computes in fp32 as a
    fused kernel does. A program scaled by 1.2 still reads as another program."""
    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in [(64, 64), (256, 64), (256, 64), (64, 256)]]
    spec = ir.from_jax(_biased_attention, *args)
    def in_fp32_fn(q, k, v, b):
        return _biased_attention(*(x.astype(jnp.float32) for x in (q, k, v, b))).astype(jnp.bfloat16)
    in_fp32 = ir.from_jax(in_fp32_fn, *args)
    for seed in range(4):
        result = float_diff(spec, in_fp32, seed=seed)
        assert result.passed and result.reference == "jax.jit(fn)", result.mode("own").worst
    record_jax_origin(spec, lambda *a: _biased_attention(*a) * 1.2, tuple(args))
    try:
        other = float_diff(spec, in_fp32, seed=0)
        assert "the spec is not the program jax.jit runs" in other.mode("own").worst.message
    finally:
        record_jax_origin(spec, _biased_attention, tuple(args))
