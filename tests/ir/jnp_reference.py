"""An independent evaluator of kernel graphs in jax.numpy (float32), one entry per op.

The reference interpreter is checked against it: the two share nothing but the op enums.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from mugraph.ir import KOp, TOp

JNP_ELEMENTWISE = {
    TOp.EXP: lambda x, arg: jnp.exp(x),
    TOp.LOG: lambda x, arg: jnp.log(x),
    TOp.SQUARE: lambda x, arg: jnp.square(x),
    TOp.SQRT: lambda x, arg: jnp.sqrt(x),
    TOp.RSQRT: lambda x, arg: jax.lax.rsqrt(x),
    TOp.SILU: lambda x, arg: jax.nn.silu(x),
    TOp.GELU: lambda x, arg: jax.nn.gelu(x, approximate=False),
    TOp.RELU: lambda x, arg: jax.nn.relu(x),
    TOp.SIGMOID: lambda x, arg: jax.nn.sigmoid(x),
    TOp.TANH: lambda x, arg: jnp.tanh(x),
    TOp.ERF: lambda x, arg: jsp.erf(x),
    TOp.NEG: lambda x, arg: jnp.negative(x),
    TOp.CLAMP: lambda x, arg: jnp.clip(x, arg[0], arg[1]),
    TOp.ADD: lambda x, y, arg: jnp.add(x, y),
    TOp.SUB: lambda x, y, arg: jnp.subtract(x, y),
    TOp.MUL: lambda x, y, arg: jnp.multiply(x, y),
    TOp.DIV: lambda x, y, arg: jnp.divide(x, y),
    TOp.POW: lambda x, y, arg: jnp.power(x, y),
    TOp.MAX: lambda x, y, arg: jnp.maximum(x, y),
    TOp.MIN: lambda x, y, arg: jnp.minimum(x, y),
    TOp.ABS: lambda x, arg: jnp.abs(x),
    TOp.LOG1P: lambda x, arg: jnp.log1p(x),
    TOp.EXPM1: lambda x, arg: jnp.expm1(x),
    TOp.SOFTPLUS: lambda x, arg: jax.nn.softplus(x),
    TOp.LEAKY_RELU: lambda x, slope, arg: jnp.where(x >= 0, x, slope * x),
    TOp.GT: lambda x, y, arg: (x > y).astype(jnp.float32),
    TOp.GE: lambda x, y, arg: (x >= y).astype(jnp.float32),
    TOp.LT: lambda x, y, arg: (x < y).astype(jnp.float32),
    TOp.LE: lambda x, y, arg: (x <= y).astype(jnp.float32),
    TOp.EQ: lambda x, y, arg: (x == y).astype(jnp.float32),
    TOp.NE: lambda x, y, arg: (x != y).astype(jnp.float32),
    TOp.IS_FINITE: lambda x, arg: jnp.isfinite(x).astype(jnp.float32),
    TOp.SELECT: lambda c, a, b, arg: jnp.where(c != 0, a, b),
    TOp.CAST: lambda x, arg: x,   # its real value, as the float64 interpreter computes it
}


def _rms_norm(x, arg):
    dim, eps = arg
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=dim, keepdims=True) + eps)


JNP_KERNEL = {
    KOp.CONSTANT: lambda arg: jnp.full(arg[1], arg[0], jnp.float32),
    KOp.IOTA: lambda arg: jax.lax.broadcasted_iota(jnp.float32, arg[0], arg[1]),
    KOp.TABLE: lambda arg: jnp.asarray(arg[0].array(arg[1]), jnp.float32),
    KOp.MATMUL: lambda a, b, arg: jnp.matmul(a, b),
    KOp.REDUCE_SUM: lambda x, arg: jnp.sum(x, axis=arg, keepdims=True),
    KOp.REDUCE_MAX: lambda x, arg: jnp.max(x, axis=arg, keepdims=True),
    KOp.RMS_NORM: _rms_norm,
    KOp.CONCAT: lambda *xs_arg: jnp.concatenate(xs_arg[:-1], axis=xs_arg[-1]),
    KOp.TRANSPOSE: lambda x, arg: jnp.transpose(x, arg),
    KOp.RESHAPE: lambda x, arg: jnp.reshape(x, arg),
    KOp.BROADCAST: lambda x, arg: jnp.broadcast_to(x, arg),
    KOp.SLICE: lambda x, arg: jax.lax.slice(x, arg[0], arg[1]),
}

JNP_EVAL = JNP_KERNEL | JNP_ELEMENTWISE  # INPUT is bound by the caller; CUSTOM is not evaluated


def evaluate(graph, arrays) -> list[np.ndarray]:
    """Every output of a kernel graph without custom ops, in float32 via jax.numpy."""
    values = {n: jnp.asarray(np.asarray(a, n.dtype.numpy), jnp.float32)
              for n, a in zip(graph.inputs, arrays)}
    for node in graph.nodes:
        if node not in values:
            srcs = [values[s] for s in node.srcs]
            values[node] = JNP_EVAL[node.op](*srcs, node.arg)
    return [np.asarray(values[o], np.float64) for o in graph.outputs]
