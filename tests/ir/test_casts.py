"""CAST: JAX's float casts lift to it, so a spec computes in jax.jit's dtypes (its own-precision run is
jax.jit's answer for every bundled program); the op rounds in own precision, in generated CUDA on the CPU
harness and in registers feeding a 16-bit MMA, is the identity in float64, and round-trips through JSON."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mugraph import generality, ir, workloads
from mugraph.codegen import generate, run_on_cpu
from mugraph.ir import DType, TOp
from mugraph.ir.errors import UnsupportedOp
from mugraph.verify import check
from mugraph.verify.float_diff import OWN_TOLERANCE, compare
from mugraph.verify.special_values import finfo

F16, F32 = jnp.float16, jnp.float32
PROGRAMS = [("workload", n) for n in workloads.names()] + [("generality", n) for n in generality.names()]


def _program(kind: str, name: str):
    return (workloads if kind == "workload" else generality).get(name).small()


@pytest.mark.parametrize("kind,name", PROGRAMS, ids=[n for _, n in PROGRAMS])
def test_the_lifted_spec_in_its_own_dtypes_is_what_jax_jit_computes(kind, name):
    p = _program(kind, name)
    spec, xs = p.spec(), p.random_inputs(seed=5)
    outs = jax.jit(p.fn)(*xs)
    outs = outs if isinstance(outs, (tuple, list)) else [outs]
    for node, own, jitted in zip(spec.outputs, ir.interpret(spec, xs, dtype="own"), outs):
        assert own.dtype == np.dtype(jitted.dtype), name   # the spec's dtypes are jax.jit's
        d = compare(np.asarray(jitted, np.float64).reshape(node.shape), own,
                    floor=float(finfo(node.dtype).smallest_normal))
        assert d.error <= OWN_TOLERANCE[node.dtype], (name, d)


def _rms_norm(x):
    xf = x.astype(F32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def test_an_fp16_rmsnorm_past_65504_stays_finite_as_in_jax_and_reducing_in_fp16_is_not_equivalent():
    spec = ir.from_jax(_rms_norm, jax.ShapeDtypeStruct((4, 256), F16), input_names=["x"])
    x = (300 + np.random.default_rng(1).standard_normal((4, 256))).astype(np.float16)
    assert (x.astype(np.float64) ** 2).min() > 65504            # x * x alone overflows fp16
    (own,) = ir.interpret(spec, [x], dtype="own")
    np.testing.assert_array_equal(own, np.asarray(jax.jit(_rms_norm)(x)))
    assert np.isfinite(own).all()
    X = ir.input("x", (4, 256), "float16")
    eps = float(np.float32(1e-6))
    in_fp16 = X * ((X * X).sum(1) / 256.0 + eps).rsqrt()
    report = check(spec, ir.KernelGraph([in_fp16]), seed=0, formal=False)
    assert not report.equivalent and report.finite_field.passed and "own: FAILED" in report.reason
    fused = X.cast("float32").rms_norm(1, eps).cast("float16")
    assert check(spec, ir.KernelGraph([fused]), seed=0, formal=False).equivalent


def test_a_cast_rounds_in_own_precision_and_is_the_identity_in_float64():
    x = ir.input("x", (1, 4), "float32")
    graph = ir.KernelGraph([x.cast("float16"), x.cast("bfloat16"), x.cast("float16").cast("float32")])
    a = np.array([[1 / 3, 70000.0, -1e-6, 2.0 ** -30]])
    exact = ir.interpret(graph, [a])
    with np.errstate(over="ignore"):
        own = ir.interpret(graph, [a], dtype="own")
        rounded = [np.float32(a).astype(np.float16), np.float32(a).astype(DType.BFLOAT16.numpy)]
    for e in exact:
        np.testing.assert_array_equal(e, np.float32(a).astype(np.float64))
    assert [o.dtype for o in own] == [np.float16, DType.BFLOAT16.numpy, np.float32]
    np.testing.assert_array_equal(own[0], rounded[0])   # 70000 -> inf
    np.testing.assert_array_equal(own[1], rounded[1])
    np.testing.assert_array_equal(own[2], rounded[0].astype(np.float32))
    assert np.isinf(own[0][0, 1]) and np.isfinite(own[1][0, 1])
    assert "cast(%0, f16)" in str(graph)


def test_casts_round_trip_through_json_at_both_levels_and_in_thread_graphs():
    X, W = ir.input("X", (16, 64), "float16"), ir.input("W", (64, 32), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    x, w = b.input(X), b.input(W)
    unit = ir.thread.TNode(TOp.CAST, (ir.thread.TNode(TOp.EXP, (ir.thread.param(0),)),),
                           DType.BFLOAT16)
    y = ir.thread.apply(unit, x.rms_norm(1, 1e-6))
    assert y.dtype is DType.BFLOAT16 and "cast(exp(p0), bf16)" in str(unit)
    (out,) = b.finish([((y.cast("float32") @ w.cast("float32")).acc_sum(), (None,))])
    graph = ir.KernelGraph([out.cast("float32"), X.cast("bfloat16")], [X, W])
    assert ir.from_json(ir.to_json(graph)) is graph
    with pytest.raises(ir.InvalidGraph, match="cast needs a target DType"):
        ir.KNode(TOp.CAST, (X,), "float16")
    with pytest.raises(ir.InvalidGraph, match="unknown dtype"):
        ir.from_json(ir.to_json(graph).replace('"bfloat16"', '"float8"', 1))


def _qk_norm_kernel(cast: bool):
    """Both operands normalised in the block, Q scaled by 1/8, rounded to fp16 (or not) before
    the product: Q by a thread unit ending in a cast, K by a lone cast."""
    Q, K = ir.input("Q", (64, 64), "float16"), ir.input("K", (64, 64), "float16")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=1)
    q, k = b.input(Q).rms_norm(1, 1e-6), b.input(K).rms_norm(0, 1e-6)
    T = ir.thread.TNode
    scaled = T(TOp.MUL, (ir.thread.param(0), ir.thread.const(0.125)))
    if cast:
        q, k = ir.thread.apply(T(TOp.CAST, (scaled,), DType.FLOAT16), q), k.cast("float16")
    else:
        q = ir.thread.apply(scaled, q)
    (out,) = b.finish([((q @ k).acc_sum(), (None,))])
    return ir.KernelGraph([out], [Q, K])


def test_operands_cast_to_fp16_feed_one_fp16_mma_and_the_harness_rounds_where_the_interpreter_does():
    casted, plain = _qk_norm_kernel(True), _qk_norm_kernel(False)
    assert "3 bf16 products" in generate(plain, "sm_80").source
    source = generate(casted, "sm_80").source
    assert "3 bf16 products" not in source and "on tensor cores" in source and "mg_cast_f16" in source
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((64, 64)).astype(np.float16) for _ in range(2)]
    (got,) = run_on_cpu(casted, xs)
    (want,) = ir.interpret(casted, xs, dtype="own")
    (exact,) = ir.interpret(casted, xs)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    assert np.abs(want - exact).max() > 10 * np.abs(got - want).max()  # the rounding is there


def test_library_casts_on_the_harness_round_as_the_interpreter_does():
    x = ir.input("x", (4, 64), "float32")
    graph = ir.KernelGraph([(x * 3000.0).cast("float16"), x.cast("bfloat16").exp()])
    a = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32) * 8
    for got, want in zip(run_on_cpu(graph, [a]), ir.interpret(graph, [a], dtype="own")):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_a_wider_preferred_element_type_multiplies_the_operands_casts():
    def fn(a, b):
        return jnp.matmul(a, b, preferred_element_type=F32)
    spec = ir.from_jax(fn, jax.ShapeDtypeStruct((8, 64), F16), jax.ShapeDtypeStruct((64, 16), F16))
    (out,) = spec.outputs
    assert out.dtype is DType.FLOAT32 and all(s.op is TOp.CAST for s in out.srcs)
    rng = np.random.default_rng(3)
    xs = [(rng.standard_normal(s) * 30).astype(np.float16) for s in ((8, 64), (64, 16))]
    (own,) = ir.interpret(spec, xs, dtype="own")
    np.testing.assert_allclose(own, np.asarray(jax.jit(fn)(*xs)), rtol=1e-5)


def test_reduce_precision_is_a_round_trip_through_the_narrower_dtype():
    def fn(x):
        return jax.lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10) * 2.0
    spec = ir.from_jax(fn, jax.ShapeDtypeStruct((4, 8), F32), input_names=["x"])
    x = ir.input("x", (4, 8), "float32")
    assert spec.outputs[0].srcs[0] is x.cast("float16").cast("float32")
    with pytest.raises(UnsupportedOp, match="6 exponent and 3 mantissa"):
        ir.from_jax(lambda v: jax.lax.reduce_precision(v, exponent_bits=6, mantissa_bits=3),
                    jax.ShapeDtypeStruct((4, 8), F32))


def test_an_index_beyond_fp16s_exact_integers_is_rounded_as_jax_rounds_it():
    def fn(x):
        return x * jnp.arange(4096).astype(F16)
    spec = ir.from_jax(fn, jax.ShapeDtypeStruct((2, 4096), F16), input_names=["x"])
    assert any(n.op is TOp.CAST and n.dtype is DType.FLOAT16 for n in spec.nodes)
    x = np.ones((2, 4096), np.float16)
    (own,) = ir.interpret(spec, [x], dtype="own")
    np.testing.assert_array_equal(own, np.asarray(jax.jit(fn)(x)))


def test_the_formal_check_proves_casts_in_real_arithmetic_and_says_so():
    from mugraph.verify.abstract import prove_equivalent
    x = ir.input("x", (8, 16), "float16")
    with_casts = ir.KernelGraph([(x.cast("float32").exp() * 2.0).cast("float16")])
    plain = ir.KernelGraph([x.exp() * 2.0])
    proof = prove_equivalent(with_casts, plain)
    assert proof.proved and "proved in real arithmetic" in proof.detail
    assert not prove_equivalent(with_casts, ir.KernelGraph([x.exp() * 3.0])).proved
    report = check(with_casts, plain, seed=0)
    assert report.formal_status == "proved"
    assert "in real arithmetic, rounding only where the program rounds" in str(report)
