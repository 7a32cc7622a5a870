"""Abstract expressions: interned, immutable terms that keep a tensor program's algebra and forget indices.

One record type, `Expr(op, args, param)`. Leaves are kernel inputs (one variable per name and
shape) and constants (the exact rational value of the float). Subtraction, negation and division
have one canonical encoding each: `a - b = a + (-1)*b`, `-a = (-1)*a`, `a / b = a * inv(b)`.
`SUM(n, x)` and `MAXR(n, x)` reduce n elements; everything without algebraic laws is an opaque
`FN` application. Structurally equal terms are the same object, so they are free cache keys.
The index-aware formal check (`prove.py`) adds two heads that keep indices: `ACCESS` (one input
element) and `REDUCE` (a sum or max over index variables); the search never builds them.
"""
from __future__ import annotations

import hashlib
import math
import weakref
from enum import Enum
from fractions import Fraction


class Op(Enum):
    """The heads of abstract expressions."""

    VAR = "var"          # param: (name, shape)
    CONST = "const"      # param: Fraction, or "inf" / "-inf" / "nan"
    ADD = "add"          # n-ary (>= 2 args)
    MUL = "mul"          # n-ary (>= 2 args)
    INV = "inv"          # 1 / x
    EXP = "exp"
    SUM = "sum"          # param: n, the number of elements reduced
    MAXR = "maxr"        # param: n; max-reduction
    MAX = "max"          # binary elementwise max
    MIN = "min"
    POW = "pow"          # x ** y
    FN = "fn"            # param: (Fn, *extra); an opaque function of its args
    CONCAT = "concat"    # ordered, opaque: each element comes from one of its args
    ACCESS = "access"    # param: (tensor name, tuple of indices.Aff); one element (index-aware check)
    REDUCE = "reduce"    # param: (kind "sum"/"max", height, bound IVars); args: (body,)


class Fn(Enum):
    """Opaque functions: no algebraic laws, only "each argument is a subexpression"."""

    OPAQUE = "op"                  # extra: (op name, its argument): an op the tables do not model
    SQRT = "sqrt"
    LOG = "log"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    ERF = "erf"
    GELU = "gelu"
    LEAKY_RELU = "leaky_relu"      # (x, slope)
    GT = "gt"                      # (a, b): the predicate a > b; lt, ge, le are written with it
    EQ = "eq"
    IS_FINITE = "is_finite"
    SELECT = "select"              # (c, a, b)
    RESCALED_SUM = "rescaled_sum"  # (x, m), param n: a rescaling accumulator the abstraction cannot read


_DIGEST_BYTES = 8


def stable_digest(*parts) -> int:
    """A process-independent hash (Python's str hash is salted): orders terms deterministically."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=_DIGEST_BYTES).digest(),
                          "little")


class Interned:
    """Base of interned records: one instance per key, compared by identity, hashed once."""

    __slots__ = ("_key", "_hash", "__weakref__")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls._cache = weakref.WeakValueDictionary()

    @classmethod
    def _intern(cls, key: tuple, build):
        found = cls._cache.get(key)
        if found is not None:
            return found
        obj = object.__new__(cls)
        object.__setattr__(obj, "_key", key)
        object.__setattr__(obj, "_hash", hash(key))
        build(obj)
        cls._cache[key] = obj
        return obj

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other

    def __reduce__(self):
        return (type(self)._rebuild, self._key)


class Expr(Interned):
    """An abstract expression: `op`, `args` (Exprs), `param`; `digest` is a stable structural hash."""

    __slots__ = ("op", "args", "param", "digest")

    def __new__(cls, op: Op, args: tuple = (), param=None):
        args = tuple(args)

        def build(obj):
            digest = stable_digest(op.value, _param_text(param), tuple(a.digest for a in args))
            for name, value in (("op", op), ("args", args), ("param", param), ("digest", digest)):
                object.__setattr__(obj, name, value)

        return cls._intern((op, args, param), build)

    @classmethod
    def _rebuild(cls, op, args, param):
        return cls(op, args, param)

    def __repr__(self) -> str:
        return f"Expr({format_expr(self)})"

    def __str__(self) -> str:
        return format_expr(self)

    # builder sugar, for tests and hand-written expressions
    def __add__(self, o): return add(self, lift(o))
    def __radd__(self, o): return add(lift(o), self)
    def __sub__(self, o): return sub(self, lift(o))
    def __rsub__(self, o): return sub(lift(o), self)
    def __mul__(self, o): return mul(self, lift(o))
    def __rmul__(self, o): return mul(lift(o), self)
    def __truediv__(self, o): return div(self, lift(o))
    def __rtruediv__(self, o): return div(lift(o), self)
    def __neg__(self): return neg(self)


def _param_text(param) -> str:
    if isinstance(param, tuple):
        return "(" + ",".join(_param_text(p) for p in param) + ")"
    if isinstance(param, Enum):
        return param.value
    return repr(param)


# ---- constructors ---------------------------------------------------------------------------------
def var(name: str, shape=()) -> Expr:
    """The variable of one kernel input: inputs of equal shape still get distinct variables."""
    return Expr(Op.VAR, (), (str(name), tuple(int(d) for d in shape)))


def const(value) -> Expr:
    """A constant with the exact rational value of the float (non-finite values stay symbolic)."""
    if isinstance(value, Fraction):
        return Expr(Op.CONST, (), value)
    value = float(value)
    if math.isfinite(value):
        return Expr(Op.CONST, (), Fraction(value))
    return Expr(Op.CONST, (), "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


def lift(value) -> Expr:
    return value if isinstance(value, Expr) else const(value)


def add(*xs: Expr) -> Expr:
    return xs[0] if len(xs) == 1 else Expr(Op.ADD, xs)


def mul(*xs: Expr) -> Expr:
    return xs[0] if len(xs) == 1 else Expr(Op.MUL, xs)


def neg(x: Expr) -> Expr:
    return mul(const(-1), x)


def sub(a: Expr, b: Expr) -> Expr:
    return add(a, neg(b))


def inv(x: Expr) -> Expr:
    return Expr(Op.INV, (x,))


def div(a: Expr, b: Expr) -> Expr:
    return mul(a, inv(b))


def exp(x: Expr) -> Expr:
    return Expr(Op.EXP, (x,))


def reduce_sum(n: int, x: Expr) -> Expr:
    """The sum of n elements of x (the abstraction forgets which)."""
    return Expr(Op.SUM, (x,), int(n))


def reduce_max(n: int, x: Expr) -> Expr:
    return Expr(Op.MAXR, (x,), int(n))


def maximum(a: Expr, b: Expr) -> Expr:
    return Expr(Op.MAX, (a, b))


def minimum(a: Expr, b: Expr) -> Expr:
    return Expr(Op.MIN, (a, b))


def power(a: Expr, b: Expr) -> Expr:
    return Expr(Op.POW, (a, b))


def fn(kind: Fn, *args: Expr, extra: tuple = ()) -> Expr:
    return Expr(Op.FN, args, (kind, *extra))


def sqrt(x: Expr) -> Expr:
    return fn(Fn.SQRT, x)


def concat(*xs: Expr) -> Expr:
    return xs[0] if len(xs) == 1 else Expr(Op.CONCAT, xs)


# ---- walking and printing -------------------------------------------------------------------------
def subterms(roots) -> list[Expr]:
    """Every distinct subterm of `roots`, arguments before the terms built from them."""
    order, seen, stack = [], set(), [(r, False) for r in roots]
    while stack:
        e, expanded = stack.pop()
        if expanded:
            order.append(e)
        elif e not in seen:
            seen.add(e)
            stack.append((e, True))
            stack.extend((a, False) for a in e.args if a not in seen)
    return order


def variables(e: Expr) -> set[Expr]:
    return {t for t in subterms([e]) if t.op is Op.VAR}


_INFIX = {Op.ADD: " + ", Op.MUL: "*"}


def format_expr(e: Expr) -> str:
    """Readable infix text, e.g. `sum(64, x*w) * inv(sqrt(...))`."""
    if e.op is Op.VAR:
        return e.param[0]
    if e.op is Op.CONST:
        return _format_const(e.param)
    if e.op is Op.ACCESS:
        return f"{e.param[0]}[{', '.join(map(repr, e.param[1]))}]"
    if e.op is Op.REDUCE:
        kind, _, bound = e.param
        return f"{kind}[{', '.join(map(repr, bound))}]({format_expr(e.args[0])})"
    if e.op in _INFIX:
        return "(" + _INFIX[e.op].join(map(format_expr, e.args)) + ")"
    head = e.param[0].value if e.op is Op.FN else e.op.value
    extra = e.param[1:] if e.op is Op.FN else ((e.param,) if e.op in (Op.SUM, Op.MAXR) else ())
    return f"{head}({', '.join([*map(str, extra), *map(format_expr, e.args)])})"


def _format_const(value) -> str:
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"
    return value
