"""Pairs that agree in real arithmetic but not as jax.jit computes them: at ±0, ±inf, underflow
and rounding. Each pair has a witness input on which jax.jit(spec) and jax.jit(candidate) differ
(so the pair really is two programs); `check` must not say EQUIVALENT, and `mugraph verify` must
exit 1. Beside them, pairs that differ only in roundings a kernel may skip stay EQUIVALENT."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mugraph import ir
from mugraph.cli import main
from mugraph.verify import check

F16, F32 = jnp.float16, jnp.float32


def _s(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def _softmax32(x, quantise=None):
    """An fp16 softmax computed in fp32 (casts at the ends), as mixed-precision code writes it."""
    xf = x.astype(F32)
    e = jnp.exp(xf - jnp.max(xf, -1, keepdims=True))
    if quantise is not None:
        e = quantise(e)
    return (e / jnp.sum(e, -1, keepdims=True)).astype(F16)


def _softmax16(x, quantise=None):
    e = jnp.exp(x - jnp.max(x, -1, keepdims=True))
    if quantise is not None:
        e = quantise(e)
    return e / jnp.sum(e, -1, keepdims=True)


@dataclass(frozen=True)
class Pair:
    spec: Callable
    candidate: Callable
    args: tuple
    witness: tuple          # inputs on which jax.jit(spec) and jax.jit(candidate) differ
    catches: str            # what rejects it: "float" (a concrete element) or "rounding"


def _w(*arrays):
    return tuple(np.asarray(a) for a in arrays)


X8 = np.linspace(-2, 2, 8 * 16).reshape(8, 16)
ZERO_IN_X = X8.copy()
ZERO_IN_X[3, 5] = 0.0
INF_IN_X = X8.copy()
INF_IN_X[0, 0] = np.inf

PAIRS = {
    # the issue's three
    "y + 0*tanh(x) vs tanh(x)/tanh(x)*y": Pair(
        lambda x, y: y + 0 * jnp.tanh(x), lambda x, y: jnp.tanh(x) / jnp.tanh(x) * y,
        (_s((8, 16), F32),) * 2, _w(ZERO_IN_X.astype(np.float32), X8.astype(np.float32)), "float"),
    "concat(x + 1e5, y) vs concat(x + 1e5, y*2^-156*2^156)": Pair(
        lambda x, y: jnp.concatenate([x + 1e5, y]),
        lambda x, y: jnp.concatenate([x + 1e5, y * 2.0**-78 * 2.0**-78 * 2.0**78 * 2.0**78]),
        (_s((8, 16), F32),) * 2, _w(X8.astype(np.float32), X8.astype(np.float32)), "float"),
    "fp16 softmax vs its exp quantised to 2^-6 by casts": Pair(
        _softmax32, lambda x: _softmax32(
            x, lambda e: (e * 2.0**-18).astype(F16).astype(F32) * 2.0**18),
        (_s((4, 64), F16),), _w(np.linspace(-4, 4, 256).reshape(4, 64).astype(np.float16)),
        "float"),
    "fp16 softmax vs its exp quantised to 2^-6 by reduce_precision": Pair(
        _softmax32, lambda x: _softmax32(x, lambda e: jax.lax.reduce_precision(
            e * 2.0**-18, exponent_bits=5, mantissa_bits=10) * 2.0**18),
        (_s((4, 64), F16),), _w(np.linspace(-4, 4, 256).reshape(4, 64).astype(np.float16)),
        "float"),
    "fp16 softmax vs its exp quantised through fp16 subnormals": Pair(
        _softmax16, lambda x: _softmax16(
            x, lambda e: e * F16(2.0**-9) * F16(2.0**-9) * F16(2.0**9) * F16(2.0**9)),
        (_s((4, 64), F16),), _w(np.linspace(-4, 4, 256).reshape(4, 64).astype(np.float16)),
        "float"),
    # a class like them
    "x/x*y vs y": Pair(
        lambda x, y: y, lambda x, y: x / x * y,
        (_s((8, 16), F32),) * 2, _w(ZERO_IN_X.astype(np.float32), X8.astype(np.float32)), "float"),
    "x - x + y vs y": Pair(
        lambda x, y: y, lambda x, y: x - x + y,
        (_s((8, 16), F16),) * 2, _w(INF_IN_X.astype(np.float16), X8.astype(np.float16)), "float"),
    "y + 0*x vs y": Pair(
        lambda x, y: y, lambda x, y: y + 0 * x,
        (_s((8, 16), F32),) * 2, _w(INF_IN_X.astype(np.float32), X8.astype(np.float32)), "float"),
    "exp(log(x)) vs x": Pair(
        lambda x: x * 1.0, lambda x: jnp.exp(jnp.log(x)),
        (_s((8, 16), F32),), _w(X8.astype(np.float32)), "float"),
    "(x*2^-20)*2^20 vs x in fp16": Pair(
        lambda x: x * F16(2.0), lambda x: x * F16(2.0**-10) * F16(2.0**-10) * F16(2.0**10)
        * F16(2.0**10) * F16(2.0),
        (_s((8, 16), F16),), _w(X8.astype(np.float16)), "float"),
    "x*y/y vs x (overflow, and y = 0)": Pair(
        lambda x, y: x * 1.0, lambda x, y: x * y / y,
        (_s((8, 16), F32),) * 2, _w((X8 * 1e30).astype(np.float32), (X8 * 1e30).astype(np.float32)),
        "float"),
    "sqrt(x*y) vs sqrt(x)*sqrt(y)": Pair(
        lambda x, y: jnp.sqrt(x * y), lambda x, y: jnp.sqrt(x) * jnp.sqrt(y),
        (_s((8, 16), F32),) * 2, _w(X8.astype(np.float32), X8.astype(np.float32)), "float"),
    "cast after the add vs casts before it": Pair(
        lambda x, y: (x + y).astype(F16), lambda x, y: x.astype(F16) + y.astype(F16),
        (_s((8, 16), F32),) * 2,
        _w(np.full((8, 16), 1 + 2.0**-12, np.float32), np.full((8, 16), -1, np.float32)),
        "rounding"),
    "cast after the exp vs cast before it": Pair(
        lambda x: jnp.exp(x).astype(F16), lambda x: jnp.exp(x.astype(F16)).astype(F16),
        (_s((8, 16), F32),), _w((X8 * 4 + 1e-3).astype(np.float32)), "rounding"),
}


def _jitted(fn, witness):
    return np.asarray(jax.jit(fn)(*witness), np.float64)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_the_pair_is_two_programs_under_jax_jit(name):
    """A float pair differs by more than 1% somewhere; a rounding pair in some bit (jax.jit on a
    CPU computes fp16 elementwise chains in fp32, so only explicit casts round there)."""
    pair = PAIRS[name]
    a, b = _jitted(pair.spec, pair.witness), _jitted(pair.candidate, pair.witness)
    slack = 1e-2 * np.abs(a) if pair.catches == "float" else 0.0
    same = (a == b) | (np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= slack)
    assert not same.all(), f"{name}: jax.jit gives the same answer on the witness"


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_check_does_not_call_the_pair_equivalent(name):
    pair = PAIRS[name]
    spec, candidate = ir.from_jax(pair.spec, *pair.args), ir.from_jax(pair.candidate, *pair.args)
    report = check(spec, candidate, seed=0)
    assert not report.equivalent and report.verdict != "EQUIVALENT", str(report)
    if pair.catches == "float":
        assert report.verdict == "NOT EQUIVALENT", str(report)
    else:   # the finite-field test sees the rounding the program does not make
        methods = {m.name: m for m in report.methods}
        assert methods["finite field"].status == "failed", str(report)
        assert methods["formal"].status != "proved", str(report)
    assert check(spec, spec, seed=0).equivalent


def test_special_values_are_not_called_skipped_when_an_earlier_case_failed():
    pair = PAIRS["concat(x + 1e5, y) vs concat(x + 1e5, y*2^-156*2^156)"]
    report = check(ir.from_jax(pair.spec, *pair.args), ir.from_jax(pair.candidate, *pair.args))
    special = {m.name: m for m in report.methods}["special values"]
    assert special.status == "not run" and "the random case failed" in special.why
    assert "no case applies" not in report.verdict_line()


@pytest.mark.parametrize("name", ["y + 0*tanh(x) vs tanh(x)/tanh(x)*y",
                                  "concat(x + 1e5, y) vs concat(x + 1e5, y*2^-156*2^156)",
                                  "fp16 softmax vs its exp quantised to 2^-6 by casts"])
def test_mugraph_verify_exits_1_on_the_issue_pairs(name, tmp_path, capsys):
    pair = PAIRS[name]
    spec_file = tmp_path / "spec.py"
    spec_file.write_text(
        "import jax, jax.numpy as jnp\n"
        "from tests.verify.test_adversarial_pairs import PAIRS\n"
        f"spec = PAIRS[{name!r}].spec\n"
        f"spec_args = PAIRS[{name!r}].args\n")
    candidate = tmp_path / "candidate.json"
    ir.save(ir.from_jax(pair.candidate, *pair.args), str(candidate))
    assert main(["verify", f"{spec_file}:spec", str(candidate)]) == 1
    assert main(["verify", f"{spec_file}:spec", str(_saved(tmp_path, pair))]) == 0
    assert "NOT EQUIVALENT" in capsys.readouterr().out


def _saved(tmp_path, pair):
    path = tmp_path / "itself.json"
    ir.save(ir.from_jax(pair.spec, *pair.args), str(path))
    return path


# ---- roundings a kernel may skip, or repeat --------------------------------------------------------
def _sum32(e):
    return jnp.sum(e.astype(F32), -1, keepdims=True).astype(F16)


LEGIT = {
    # the program stores the row sum in fp16; a fused kernel keeps it in fp32
    "softmax, sum kept in fp32": (
        lambda x: jnp.exp(x) / _sum32(jnp.exp(x)),
        lambda x: (jnp.exp(x.astype(F32)) / jnp.sum(jnp.exp(x.astype(F32)), -1,
                                                     keepdims=True)).astype(F16),
        (_s((4, 64), F16),)),
    # the same rounding of the same value, in another order
    "rms norm rounded to fp16, then scaled": (
        lambda x: (x.astype(F32) * jax.lax.rsqrt(jnp.mean(x.astype(F32) ** 2, -1, keepdims=True)
                                                 + 1e-6)).astype(F16) * F16(2.0),
        lambda x: (x.astype(F32) * jax.lax.rsqrt(jnp.mean(x.astype(F32) ** 2, -1, keepdims=True)
                                                 + 1e-6)).astype(F16) + (x.astype(F32) * jax.lax.rsqrt(
            jnp.mean(x.astype(F32) ** 2, -1, keepdims=True) + 1e-6)).astype(F16),
        (_s((4, 64), F16),)),
}


@pytest.mark.parametrize("name", sorted(LEGIT))
def test_skipping_or_repeating_the_programs_own_roundings_stays_equivalent(name):
    spec_fn, candidate_fn, args = LEGIT[name]
    report = check(ir.from_jax(spec_fn, *args), ir.from_jax(candidate_fn, *args), seed=0)
    assert report.equivalent, str(report)
