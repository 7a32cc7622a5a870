"""Search reach: everyday JAX programs come back as one fused kernel, and the real-shape check
never leaves the search without an answer.

Each program is a JAX function lifted with `from_jax`, searched at small shapes with a small
budget; a fused winner must be EQUIVALENT under `verify.check` and its generated CUDA, run on the
CPU harness, must agree with the interpreter.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from mugraph import ir
from mugraph.search import SearchConfig, search

QUIET = dict(progress=lambda *a: None)


def _spec(fn, *shapes, dtype=jnp.float16):
    return ir.from_jax(fn, *[jax.ShapeDtypeStruct(s, dtype) for s in shapes])


def _attention(q, k, v):
    s = q @ k.T / math.sqrt(q.shape[-1])
    e = jnp.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def test_the_program_itself_is_never_rejected_at_the_real_shapes():
    """bf16 attention: a float64-vs-bf16 test of the program against itself exceeds the 16-bit
    tolerance, which used to reject even the spec ("no candidate passed verification")."""
    spec = _spec(_attention, (64, 128), (1024, 128), (1024, 128), dtype=jnp.bfloat16)
    result = search(spec, SearchConfig(budget_seconds=1, budget_states=2_000, max_kernel_ops=1),
                    **QUIET)
    assert result.best is spec
    assert result.report.verification is None
