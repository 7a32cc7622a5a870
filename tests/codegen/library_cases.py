"""One small kernel graph per library op, with its operands and own-dtype result from the reference
interpreter: the library-op table is checked against these with NumPy here and with CuPy on a GPU."""
from __future__ import annotations

import numpy as np

from mugraph import ir
from mugraph.ir import KOp, TOp


def _x(shape=(4, 8), dtype="float16", name="x"):
    return ir.input(name, shape, dtype)


def _positive(x):
    return x.exp()  # keeps log/sqrt/pow operands in their domain: the graphs below take exp(x) as x


# One small graph per op; its last node is the op under test, its operands computed by the interpreter.
CASES = {
    TOp.EXP: lambda: _x().exp(), TOp.LOG: lambda: _positive(_x()).log(), TOp.SQUARE: lambda: _x().square(),
    TOp.SQRT: lambda: _positive(_x()).sqrt(), TOp.RSQRT: lambda: _positive(_x()).rsqrt(),
    TOp.SILU: lambda: _x().silu(), TOp.GELU: lambda: _x().gelu(), TOp.RELU: lambda: _x().relu(),
    TOp.SIGMOID: lambda: _x().sigmoid(), TOp.TANH: lambda: _x().tanh(), TOp.ERF: lambda: _x().erf(),
    TOp.NEG: lambda: -_x(), TOp.CLAMP: lambda: _x().clamp(-0.5, 0.25),
    TOp.ADD: lambda: _x() + _x(name="y"), TOp.SUB: lambda: _x() - _x((1, 8), name="y"),
    TOp.MUL: lambda: _x() * _x((4, 1), "float32", name="y"), TOp.DIV: lambda: _x() / _x(name="y"),
    TOp.POW: lambda: _positive(_x()) ** _x(name="y"), TOp.MAX: lambda: _x().maximum(_x(name="y")),
    TOp.MIN: lambda: _x().minimum(_x(name="y")),
    TOp.ABS: lambda: _x().abs(), TOp.LOG1P: lambda: _positive(_x()).log1p(), TOp.EXPM1: lambda: _x().expm1(),
    TOp.SOFTPLUS: lambda: _x().softplus(), TOp.LEAKY_RELU: lambda: _x().leaky_relu(0.125),
    TOp.GT: lambda: _x().gt(_x(name="y")), TOp.GE: lambda: _x().ge(_x().relu()),
    TOp.LT: lambda: _x().lt(_x((1, 8), name="y")), TOp.LE: lambda: _x().le(_x().relu()),
    TOp.EQ: lambda: _x().eq(_x().relu()), TOp.NE: lambda: _x().ne(_x().relu()),
    TOp.IS_FINITE: lambda: (_x() / _x().relu()).is_finite(),
    TOp.SELECT: lambda: _x().gt(0.0).select(_x(name="y"), float("-inf")),
    TOp.CAST: lambda: (_x((4, 8), "float32") * 1000.0).cast("float16"),   # rounds, some to inf
    KOp.IOTA: lambda: ir.iota((4, 8), 1, "float16"),
    KOp.CONSTANT: lambda: ir.constant(0.3, (4, 8), "float16"),
    KOp.MATMUL: lambda: _x((2, 4, 32)) @ _x((32, 8), name="w"),
    KOp.REDUCE_SUM: lambda: _x().sum(1), KOp.REDUCE_MAX: lambda: _x((2, 4, 8)).amax(0),
    KOp.RMS_NORM: lambda: _x((4, 64)).rms_norm(1, 1e-6),
    KOp.CONCAT: lambda: ir.concat([_x(), _x((4, 3), "float32", name="y")], 1),
    KOp.TRANSPOSE: lambda: _x((2, 4, 8)).transpose((2, 0, 1)), KOp.RESHAPE: lambda: _x().reshape((2, 16)),
    KOp.BROADCAST: lambda: _x((4, 1)).broadcast_to((4, 8)),
    KOp.SLICE: lambda: _x((4, 8)).slice((1, 2), (4, 7)),
    KOp.TABLE: lambda: ir.table(np.linspace(-2.0, 2.0, 32).reshape(4, 8), "float16"),
}


def case_arrays(op, seed: int = 0):
    """(node, its own-dtype value, its operands' values) for ``CASES[op]`` on random inputs."""
    node = CASES[op]()
    assert node.op is op
    rng = np.random.default_rng(seed)
    graph = ir.KernelGraph([node, *node.srcs]) if node.srcs else ir.KernelGraph([node])
    arrays = [rng.standard_normal(i.shape).astype(i.dtype.numpy) for i in graph.inputs]
    want, *operands = ir.interpret(graph, arrays, dtype="own")
    return node, want, operands
