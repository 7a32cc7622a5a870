"""Immutable, interned, structurally hashed IR nodes: `KNode` (a device tensor) and `BNode` (a tile).

Constructing a node runs its shape rule, so an ill-shaped node never exists. Two structurally
equal nodes are the same object, which makes dedup tables and cache keys free. The arithmetic
methods here are the builder: `(x @ w).exp() * 0.5` builds nodes of the receiver's level.
"""
from __future__ import annotations

import weakref
from typing import Any

from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidGraph
from mugraph.ir.ops import BOp, KOp, TOp


class _Interned:
    """Base of interned records: instances are unique per key, compared by identity."""

    __slots__ = ("_key", "_hash", "__weakref__")
    _cache: weakref.WeakValueDictionary

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
        raise AttributeError(f"{type(self).__name__} is immutable; use replace()")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other

    def __reduce__(self):
        return (type(self), self._key)


class _Node(_Interned):
    """Fields shared by both levels: op, sources, argument, and the inferred shape and dtype."""

    __slots__ = ("op", "srcs", "arg", "shape", "dtype")
    _CONSTANT: Any = None
    _MATMUL: Any = None
    _REDUCE_SUM: Any = None
    _REDUCE_MAX: Any = None
    _RMS_NORM: Any = None

    def __new__(cls, op, srcs: tuple = (), arg: Any = None):
        srcs = tuple(srcs)
        for s in srcs:
            if type(s) is not cls:
                raise InvalidGraph(f"{op.value} takes {cls.__name__} operands, got {type(s).__name__}",
                                   hint="kernel tensors and block tiles cannot be mixed; load a "
                                        "kernel tensor into a block with BlockBuilder.input()")

        def build(obj):
            shape, dtype = cls._infer(op, srcs, arg)
            for name, value in (("op", op), ("srcs", srcs), ("arg", arg), ("shape", shape),
                                ("dtype", dtype)):
                object.__setattr__(obj, name, value)

        return cls._intern((op, srcs, arg), build)

    @classmethod
    def _infer(cls, op, srcs, arg) -> tuple[tuple[int, ...], DType]:
        raise NotImplementedError

    def replace(self, **changes):
        fields = {"op": self.op, "srcs": self.srcs, "arg": self.arg} | changes
        return type(self)(fields["op"], fields["srcs"], fields["arg"])

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        dims = ",".join(map(str, self.shape))
        return f"{type(self).__name__}({self.op.value} {self.dtype.short}[{dims}])"

    # ---- builder: elementwise -----------------------------------------------------------------
    def _lift(self, value):
        if isinstance(value, type(self)):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            arg = (float(value), (1,) * self.rank, self._scalar_dtype())
            return type(self)(self._CONSTANT, (), arg)
        raise InvalidGraph(f"cannot combine {self!r} with {value!r}",
                           hint=f"use a {type(self).__name__} or a Python number")

    def _scalar_dtype(self) -> DType:
        """The dtype a Python number takes next to this node."""
        return self.dtype

    def _binary(self, op: TOp, other, reverse: bool = False):
        other = self._lift(other)
        return type(self)(op, (other, self) if reverse else (self, other))

    def __add__(self, o): return self._binary(TOp.ADD, o)
    def __radd__(self, o): return self._binary(TOp.ADD, o, True)
    def __sub__(self, o): return self._binary(TOp.SUB, o)
    def __rsub__(self, o): return self._binary(TOp.SUB, o, True)
    def __mul__(self, o): return self._binary(TOp.MUL, o)
    def __rmul__(self, o): return self._binary(TOp.MUL, o, True)
    def __truediv__(self, o): return self._binary(TOp.DIV, o)
    def __rtruediv__(self, o): return self._binary(TOp.DIV, o, True)
    def __pow__(self, o): return self._binary(TOp.POW, o)
    def __neg__(self): return type(self)(TOp.NEG, (self,))
    def __matmul__(self, o): return type(self)(self._MATMUL, (self, self._lift(o)))

    def maximum(self, o): return self._binary(TOp.MAX, o)
    def minimum(self, o): return self._binary(TOp.MIN, o)
    def exp(self): return type(self)(TOp.EXP, (self,))
    def log(self): return type(self)(TOp.LOG, (self,))
    def square(self): return type(self)(TOp.SQUARE, (self,))
    def sqrt(self): return type(self)(TOp.SQRT, (self,))
    def rsqrt(self): return type(self)(TOp.RSQRT, (self,))
    def silu(self): return type(self)(TOp.SILU, (self,))
    def gelu(self): return type(self)(TOp.GELU, (self,))
    def relu(self): return type(self)(TOp.RELU, (self,))
    def sigmoid(self): return type(self)(TOp.SIGMOID, (self,))
    def tanh(self): return type(self)(TOp.TANH, (self,))
    def erf(self): return type(self)(TOp.ERF, (self,))
    def clamp(self, lo: float, hi: float): return type(self)(TOp.CLAMP, (self,), (float(lo), float(hi)))
    def abs(self): return type(self)(TOp.ABS, (self,))
    def log1p(self): return type(self)(TOp.LOG1P, (self,))
    def expm1(self): return type(self)(TOp.EXPM1, (self,))
    def softplus(self): return type(self)(TOp.SOFTPLUS, (self,))
    def is_finite(self): return type(self)(TOp.IS_FINITE, (self,))
    def leaky_relu(self, slope): return self._binary(TOp.LEAKY_RELU, slope)
    def cast(self, dtype): return type(self)(TOp.CAST, (self,), DType.parse(dtype))

    # ---- builder: predicates (0/1 masks; Python's == and < stay identity and ordering-free) -----
    def gt(self, o): return self._binary(TOp.GT, o)
    def ge(self, o): return self._binary(TOp.GE, o)
    def lt(self, o): return self._binary(TOp.LT, o)
    def le(self, o): return self._binary(TOp.LE, o)
    def eq(self, o): return self._binary(TOp.EQ, o)
    def ne(self, o): return self._binary(TOp.NE, o)

    def select(self, a, b):
        """`a` where this mask is nonzero, else `b` (jnp.where(mask, a, b)); numbers are lifted."""
        like = a if isinstance(a, type(self)) else b if isinstance(b, type(self)) else self
        return type(self)(TOp.SELECT, (self, like._lift(a), like._lift(b)))

    # ---- builder: reductions ------------------------------------------------------------------
    def _dim(self, dim: int) -> int:
        return dim + self.rank if isinstance(dim, int) and -self.rank <= dim < 0 else dim

    def sum(self, dim: int = -1): return type(self)(self._REDUCE_SUM, (self,), self._dim(dim))
    def amax(self, dim: int = -1): return type(self)(self._REDUCE_MAX, (self,), self._dim(dim))

    def rms_norm(self, dim: int = -1, eps: float = 0.0):
        return type(self)(self._RMS_NORM, (self,), (self._dim(dim), float(eps)))


class KNode(_Node):
    """A tensor in device memory, produced by a kernel-level op."""

    __slots__ = ()
    _CONSTANT, _MATMUL = KOp.CONSTANT, KOp.MATMUL
    _REDUCE_SUM, _REDUCE_MAX, _RMS_NORM = KOp.REDUCE_SUM, KOp.REDUCE_MAX, KOp.RMS_NORM

    @classmethod
    def _infer(cls, op, srcs, arg):
        from mugraph.ir.shapes import infer_kernel
        return infer_kernel(op, srcs, arg)

    def transpose(self, perm=None):
        perm = tuple(range(self.rank - 2)) + (self.rank - 1, self.rank - 2) if perm is None \
            else tuple(self._dim(p) for p in perm)
        return KNode(KOp.TRANSPOSE, (self,), perm)

    @property
    def T(self):
        return self.transpose()

    def reshape(self, shape): return KNode(KOp.RESHAPE, (self,), tuple(int(d) for d in shape))
    def broadcast_to(self, shape): return KNode(KOp.BROADCAST, (self,), tuple(int(d) for d in shape))

    def slice(self, starts, limits):
        """self[starts[0]:limits[0], ...] (strides 1; every dim given)."""
        return KNode(KOp.SLICE, (self,), (tuple(int(a) for a in starts),
                                          tuple(int(b) for b in limits)))


class BNode(_Node):
    """A tile of one thread block: an input tile, a body value, an accumulator or an epilogue value."""

    __slots__ = ()
    _CONSTANT, _MATMUL = BOp.CONSTANT, BOp.MATMUL
    _REDUCE_SUM, _REDUCE_MAX, _RMS_NORM = BOp.REDUCE_SUM, BOp.REDUCE_MAX, BOp.RMS_NORM

    @classmethod
    def _infer(cls, op, srcs, arg):
        from mugraph.ir.shapes import infer_block
        return infer_block(op, srcs, arg)

    def _scalar_dtype(self) -> DType:
        # block values live in fp32 registers, even next to a 16-bit input tile
        return DType.FLOAT32

    def acc_sum(self): return BNode(BOp.ACC_SUM, (self,))
    def acc_sum_last(self): return BNode(BOp.ACC_SUM_LAST, (self,))
    def acc_rms_last(self): return BNode(BOp.ACC_RMS_LAST, (self,))
    def acc_max(self): return BNode(BOp.ACC_MAX, (self,))
    def acc_max_last(self): return BNode(BOp.ACC_MAX_LAST, (self,))
    def acc_sum_rescale(self, running_max): return BNode(BOp.ACC_SUM_RESCALE, (self, running_max))

    def acc_sum_last_rescale(self, running_max):
        return BNode(BOp.ACC_SUM_LAST_RESCALE, (self, running_max))


def kernel_input(name: str, shape, dtype="float16") -> KNode:
    """A named input tensor of a kernel graph."""
    return KNode(KOp.INPUT, (), (str(name), tuple(int(d) for d in shape), DType.parse(dtype)))


def kernel_constant(value: float, shape=(1,), dtype="float32") -> KNode:
    """A tensor filled with one scalar value (broadcast where it is used)."""
    return KNode(KOp.CONSTANT, (), (float(value), tuple(int(d) for d in shape), DType.parse(dtype)))


def kernel_iota(shape, dim: int, dtype="float32") -> KNode:
    """A tensor whose every element is its own index along `dim` (0, 1, 2, ...)."""
    shape = tuple(int(d) for d in shape)
    dim = dim + len(shape) if isinstance(dim, int) and -len(shape) <= dim < 0 else dim
    return KNode(KOp.IOTA, (), (shape, dim, DType.parse(dtype)))


def kernel_table(values, dtype="float32") -> KNode:
    """A constant tensor holding `values` (an array; rounded to `dtype`)."""
    from mugraph.ir.table_values import table_arg
    return KNode(KOp.TABLE, (), table_arg(values, DType.parse(dtype)))


def concat(nodes, dim: int) -> KNode:
    """Kernel-level concatenation along `dim`."""
    nodes = tuple(nodes)
    return KNode(KOp.CONCAT, nodes, nodes[0]._dim(dim) if nodes else dim)


def toposort(roots) -> list:
    """Nodes reachable from `roots`, every node after its sources (iterative; deterministic)."""
    order, seen, stack = [], set(), [(r, False) for r in reversed(tuple(roots))]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((s, False) for s in reversed(node.srcs) if s not in seen)
    return order
