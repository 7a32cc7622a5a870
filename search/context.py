"""What every part of one search shares: the spec's expressions, op sets, constants, limits, counters."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from mugraph.ir import DType, KernelGraph
from mugraph.ir.ops import BOp, KOp, TOp
from mugraph.search import interrupt


class StopReason(Enum):
    """Why the enumeration ended. Only EXHAUSTED says the whole space at the config's limits
    was visited; every other value names the budget or cap that cut it short."""

    EXHAUSTED = "exhausted"
    TIME = "time"
    STATES = "states"
    CANDIDATES = "candidate cap"
    INTERRUPTED = "interrupted"     # Ctrl-C or SIGTERM (search.interrupt)


class Reject(Enum):
    """Why a partial candidate was cut: cheap enum values, never formatted exceptions."""

    SHAPE = "shape"
    LABEL = "label"
    PHASE = "phase"
    EXPRESSION = "expression"
    DUPLICATE = "duplicate"
    CANONICAL = "canonical"
    CONSTANT = "constant"
    MEMORY = "memory"


class BudgetExhausted(Exception):
    def __init__(self, reason: StopReason):
        self.reason = reason


class TaskCapReached(Exception):
    """A task used its share of states for this round; it runs again with a larger share."""


@dataclass
class Counters:
    states: int = 0
    block_graphs: int = 0
    pruned: dict = field(default_factory=lambda: {r.value: 0 for r in Reject})
    candidates: int = 0
    verified: int = 0
    rejected: int = 0

    def merge(self, other: "Counters") -> None:
        self.states += other.states
        self.block_graphs += other.block_graphs
        self.candidates += other.candidates
        self.verified += other.verified
        self.rejected += other.rejected
        for k, v in other.pruned.items():
            self.pruned[k] = self.pruned.get(k, 0) + v


@dataclass(frozen=True)
class OpSets:
    """The ops the enumerator may add, derived from the spec (and narrowed by the config)."""

    kernel: tuple
    block: tuple
    constants: tuple          # (value, dtype) pairs from the spec
    rms_args: tuple           # (eps,) of the spec's rms_norm ops

    @staticmethod
    def from_spec(spec: KernelGraph, config) -> "OpSets":
        ops = {n.op for n in spec.nodes}
        if KOp.RMS_NORM in ops:  # a norm may be split into the ops it abbreviates
            ops |= {TOp.MUL, TOp.DIV, TOp.ADD, TOp.RSQRT}
        elementwise = tuple(sorted((op for op in ops if isinstance(op, TOp)), key=lambda o: o.value))
        kernel = tuple(op for op in (KOp.MATMUL, KOp.REDUCE_SUM, KOp.REDUCE_MAX, KOp.RMS_NORM,
                                     KOp.TRANSPOSE) if op in ops) + elementwise
        block = [op for op, k in ((BOp.MATMUL, KOp.MATMUL), (BOp.REDUCE_SUM, KOp.REDUCE_SUM),
                                  (BOp.REDUCE_MAX, KOp.REDUCE_MAX), (BOp.RMS_NORM, KOp.RMS_NORM))
                 if k in ops]
        sums = ops & {KOp.MATMUL, KOp.REDUCE_SUM, KOp.RMS_NORM}
        block += [BOp.ACC_SUM, BOp.ACC_SUM_LAST] if sums else [BOp.ACC_SUM]
        if KOp.REDUCE_MAX in ops:
            block += [BOp.ACC_MAX, BOp.ACC_MAX_LAST, BOp.ACC_SUM_RESCALE, BOp.ACC_SUM_LAST_RESCALE]
        if KOp.RMS_NORM in ops:
            block += [BOp.ACC_RMS_LAST]
        block = tuple(block) + elementwise
        if config.kernel_ops:
            kernel = tuple(op for op in kernel if op.value in config.kernel_ops)
        if config.block_ops:
            block = tuple(op for op in block if op.value in config.block_ops)
        constants = {(n.arg[0], n.arg[2]) for n in spec.nodes if n.op is KOp.CONSTANT}
        for n in spec.nodes:
            if n.op is KOp.RMS_NORM:  # a norm split across accumulators needs its count and eps
                constants |= {(float(n.srcs[0].shape[n.arg[0]]), DType.FLOAT32),
                              (n.arg[1], DType.FLOAT32)}
        constants = tuple(sorted(constants, key=lambda c: (c[0], c[1].value)))
        rms = tuple(sorted({n.arg[1] for n in spec.nodes if n.op is KOp.RMS_NORM}))
        return OpSets(kernel, block, constants, rms)


@dataclass
class Budget:
    seconds: float
    states: int
    cap: int | None = None         # this task's share of states in this round
    started: float = field(default_factory=time.monotonic)

    def check(self, counters: Counters) -> None:
        if interrupt.requested():
            raise BudgetExhausted(StopReason.INTERRUPTED)
        if counters.states >= self.states:
            raise BudgetExhausted(StopReason.STATES)
        if self.cap is not None and counters.states >= self.cap:
            raise TaskCapReached()
        if counters.states % 256 == 0 and time.monotonic() - self.started > self.seconds:
            raise BudgetExhausted(StopReason.TIME)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
