"""Numbers from element expressions: evaluates an `Expr` over input arrays at concrete index values.

The independent side of the index-aware check's tests: an element expression evaluated here
must equal the reference interpreter's output at that index (the lowering is right), and a
canonical reduction must evaluate as the literal sum or max it was built from (each
canonicalisation step is an identity). Opaque functions take the NumPy meaning of the
elementwise op of the same name.
"""
from __future__ import annotations

import itertools
import math
import numpy as np

from mugraph.ir.errors import InvalidInput
from mugraph.ir.ops import TOp
from mugraph.ir.semantics import NUMPY_ELEMENTWISE
from mugraph.verify.abstract.expr import Expr, Fn, Op, stable_digest, subterms


def _fn(e: Expr, args: list[float]) -> float:
    kind = e.param[0]
    op = TOp(e.param[1]) if kind is Fn.OPAQUE else _op_named(kind.value)
    extra = None if kind is not Fn.OPAQUE or e.param[2] == "None" else eval_arg(e.param[2])
    with np.errstate(all="ignore"):
        return float(NUMPY_ELEMENTWISE[op](*map(np.float64, args), extra))


def eval_arg(text: str):
    """The argument of an uninterpreted op, from its repr (a float or a tuple of floats)."""
    return tuple(float(v) for v in text.strip("()").split(",") if v.strip())


def _op_named(name: str) -> TOp:
    try:
        return TOp(name)
    except ValueError:
        raise InvalidInput(f"no elementwise op named {name!r} to evaluate opaque {name!r} with",
                           hint="name Fn members after the TOp whose meaning they carry") from None


def _const(value) -> float:
    return float(value)            # a Fraction, or "inf" / "-inf" / "nan"


EVAL = {
    Op.ADD: lambda e, a: math.fsum(a),
    Op.MUL: lambda e, a: float(np.prod(a)),
    Op.INV: lambda e, a: 1.0 / a[0] if a[0] else math.inf,
    Op.EXP: lambda e, a: math.exp(a[0]) if a[0] < 700 else math.inf,
    Op.CONCAT: lambda e, a: math.nan,
    Op.MAX: lambda e, a: max(a),
    Op.MIN: lambda e, a: min(a),
    Op.POW: lambda e, a: float(np.power(np.float64(a[0]), a[1])),
    Op.FN: _fn,
}


def evaluate(e: Expr, arrays: dict, env: dict) -> float:
    """The value of `e` with inputs `arrays` (by name) and index variables bound by `env`."""
    memo: dict = {}
    return _eval(e, arrays, dict(env), memo)


def _eval(e: Expr, arrays: dict, env: dict, memo: dict) -> float:
    key = (e, tuple(sorted((v.key, x) for v, x in env.items())))
    if key in memo:
        return memo[key]
    if e.op is Op.CONST:
        value = _const(e.param)
    elif e.op is Op.ACCESS:
        name, index = e.param
        at = tuple(a.value(env) for a in index)
        value = float(at[0]) if name == ("iota",) else \
            float(name[1].array(name[2])[at]) if name[0] == "table" else float(arrays[name][at])
    elif e.op is Op.REDUCE:
        value = _reduce(e, arrays, env, memo)
    elif e.op in EVAL:
        value = EVAL[e.op](e, [_eval(a, arrays, env, memo) for a in e.args])
    else:
        raise InvalidInput(f"cannot evaluate {e.op.value} at an index", hint="element expressions only")
    memo[key] = value
    return value


def _reduce(e: Expr, arrays: dict, env: dict, memo: dict) -> float:
    kind, _, bound = e.param
    values = []
    for point in itertools.product(*(range(v.size) for v in bound)):
        inner = dict(env)
        inner.update(zip(bound, point))
        if all(v.limit is None or inner[v] < v.limit.value(inner) for v in bound):
            values.append(_eval(e.args[0], arrays, inner, memo))
    return math.fsum(values) if kind == "sum" else max(values)


# ---- evaluation with opaque leaves ------------------------------------------------------------------
LEAVES = frozenset({Op.VAR, Op.ACCESS, Op.REDUCE, Op.FN, Op.CONCAT})


def at_random_point(e: Expr, seed: int) -> float:
    """`e` with every input element, reduction and opaque function an independent value in
    [0.5, 1.5) (drawn from its digest and `seed`): the normal form as a function of its leaves."""
    memo: dict = {}
    for t in subterms([e]):
        if t.op in LEAVES:
            memo[t] = 0.5 + (stable_digest(t.digest, seed) % (1 << 30)) / float(1 << 30)
        elif t.op is Op.CONST:
            memo[t] = _const(t.param)
        else:
            with np.errstate(all="ignore"):
                memo[t] = EVAL[t.op](t, [memo[a] for a in t.args])
    return memo[e]
