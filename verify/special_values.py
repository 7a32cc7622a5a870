"""The special-value cases of the float test: inputs holding exact zeros, NaN, ±inf, softmax masks,
near-overflow values, denormals and values that underflow, placed where they mean something for
the program at hand.

* zeros: the random inputs with exact +0 and -0: the first element +0 and the last -0, a share
  of random positions ±0, and, for rank >= 2, one whole row (+0) and one whole column (-0) —
  where x / x, log(x), 0 · tanh(x), sqrt(x²)'s derivative and friends differ from the program;
* nan / inf: the random inputs with NaN (resp. +inf and −inf) at two positions of every input;
* mask: −inf in a quarter of the elements of every input that reaches exp or max without a
  matmul or sum between (a softmax operand, an attention mask), plus one whole masked row
  along the dim its reduction runs over; skipped when no input reaches exp or max so;
* large: positive values sized by the first reduction each input reaches (`large_value`): a sum
  or norm of K of them overflows the dtype by about 2× (min(max/2, 2·max/K)), a matmul over K
  comes to about max/2 (sqrt(max/2K)), and with no reduction they are max/2 — where a 16-bit
  intermediate or accumulator would overflow and fp32 accumulation, as XLA does, does not;
* denormal: N(0, 1) scaled into the dtype's subnormal range;
* underflow: magnitudes 2^U with U uniform from the dtype's smallest subnormal up to 1, random
  signs: a scaling by 2^-k (or a product of small values) underflows some elements to 0 or into
  the subnormals wherever a candidate scales where the program does not.

Every case's inputs are arrays of the input's own dtype. A 16-bit input's values come from a
2^16-entry table (N(0, 1) quantiles, or the case's uniform levels, rounded to the dtype once)
indexed by uniform 16-bit draws: no pass over a large weight in float64 and no float64 -> float16
conversion per element, which NumPy does in software (seconds for a 4096x6144 weight).
"""
from __future__ import annotations

import numpy as np

from scipy import special

from mugraph.ir.dtypes import DType
from mugraph.ir.errors import InvalidInput
from mugraph.ir.graph import KernelGraph
from mugraph.ir.ops import KERNEL_LAYOUT, KOp, TOp

CASES = ("random", "zeros", "nan", "inf", "mask", "large", "denormal", "underflow")
MASK_SHARE = 0.25
ZERO_DRAW = 16           # one in ZERO_DRAW elements is set to -0, one to +0
SPECIALS_PER_INPUT = 2


def _consumers(graph: KernelGraph) -> dict:
    users: dict = {}
    for node in graph.nodes:
        for s in node.srcs:
            users.setdefault(s, []).append(node)
    return users


_PASS_THROUGH = frozenset(TOp) | KERNEL_LAYOUT   # what a mask or a large value flows through unchanged in kind


def softmax_reach(graph: KernelGraph, node) -> int | None:
    """For an input that reaches exp or max through elementwise and layout ops only: the dim (of
    the input) a reduction of that path runs over (the last dim if none lines up); else None."""
    users, frontier, seen, found = _consumers(graph), [node], {node}, None
    while frontier:
        n = frontier.pop()
        for u in users.get(n, ()):
            if u.op in (TOp.EXP, KOp.REDUCE_MAX, TOp.MAX):
                found = -1 if found is None else found
                if u.op is KOp.REDUCE_MAX and u.srcs[0].shape == node.shape:
                    return u.arg
            if u.op in _PASS_THROUGH and u not in seen:
                seen.add(u)
                frontier.append(u)
    return None if found is None else node.rank - 1


_REDUCTIONS = {KOp.REDUCE_SUM: lambda n: n.srcs[0].shape[n.arg],
               KOp.RMS_NORM: lambda n: n.shape[n.arg[0]],
               KOp.MATMUL: lambda n: n.srcs[0].shape[-1]}


def first_reduction(graph: KernelGraph, node) -> tuple[KOp | None, int]:
    """The first sum, norm or matmul `node` reaches and how many elements it adds up (None, 1:
    none)."""
    users, frontier, seen = _consumers(graph), [node], {node}
    while frontier:
        n = frontier.pop(0)
        for u in users.get(n, ()):
            if u.op in _REDUCTIONS:
                return u.op, _REDUCTIONS[u.op](u)
            if u.op in _PASS_THROUGH | {KOp.REDUCE_MAX, KOp.CONCAT} and u not in seen:
                seen.add(u)
                frontier.append(u)
    return None, 1


def large_value(graph: KernelGraph, node) -> tuple[float, str]:
    """The magnitude of `node`'s values in the `large` case, and why: a sum or norm of K of them
    overflows the dtype by 2x; a matmul over K of two of them comes to half the largest value;
    with no reduction, half the largest value itself."""
    top = float(finfo(node.dtype).max)
    op, k = first_reduction(graph, node)
    if op is KOp.MATMUL:
        return (top / (2 * k)) ** 0.5, f"a matmul over {k} reaches max/2"
    if op is None:
        return top / 2, "max/2"
    return min(top / 2, 2 * top / k), f"a sum of {k} reaches 2 max"


def _rng(seed: int, case: str):
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(11, CASES.index(case))))


def finfo(dtype: DType):
    return np.finfo(dtype.numpy)


LEVELS = 1 << 16
_MIDPOINTS = (np.arange(LEVELS) + 0.5) / LEVELS
NORMAL_LEVELS = special.ndtri(_MIDPOINTS)          # N(0, 1) at the midpoints of 2^16 strata


def tabled(rng: np.random.Generator, shape, dtype: DType, levels: np.ndarray) -> np.ndarray:
    """Values of `dtype`: `levels` (2^16 float64 values) rounded to the dtype once, indexed by
    uniform 16-bit draws."""
    table = np.asarray(levels, np.float64).astype(dtype.numpy)
    return table[rng.integers(0, LEVELS, shape, dtype=np.uint16)]


def normal(rng: np.random.Generator, shape, dtype: DType, scale: float = 1.0) -> np.ndarray:
    """N(0, 1) · scale rounded to `dtype`: a 16-bit dtype through the quantile table (its own
    precision is coarser than 2^-16 of the distribution), float32 drawn directly."""
    if dtype.is_16bit:
        return tabled(rng, shape, dtype, NORMAL_LEVELS * scale)
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype.numpy)


def uniform(rng: np.random.Generator, shape, dtype: DType, low: float, high: float) -> np.ndarray:
    """Uniform on [low, high) rounded to `dtype` (tabled for a 16-bit dtype)."""
    if dtype.is_16bit:
        return tabled(rng, shape, dtype, low + (high - low) * _MIDPOINTS)
    return (low + (high - low) * rng.random(shape)).astype(dtype.numpy)


def _with_specials(base, graph, rng, values) -> dict:
    out = {}
    for node in graph.inputs:
        a = base[node.arg[0]].copy()
        flat = a.reshape(-1)
        where = rng.choice(flat.size, size=min(len(values), flat.size), replace=False)
        flat[where] = values[:len(where)]
        out[node.arg[0]] = a
    return out


def _zeros(base, graph, rng) -> tuple[dict, str]:
    out = {}
    for node in graph.inputs:
        a = base[node.arg[0]].copy()
        flat = a.reshape(-1)
        flat[0], flat[-1] = 0.0, -0.0
        draw = rng.integers(0, ZERO_DRAW, a.shape, dtype=np.uint8)   # 0: -0, 1: +0
        a[draw == 0], a[draw == 1] = -0.0, 0.0
        if a.ndim >= 2:
            a[..., int(rng.integers(a.shape[-2])), :] = 0.0
            a[..., int(rng.integers(a.shape[-1]))] = -0.0
        out[node.arg[0]] = a
    return out, (f"+0 and -0 at the first and last position and {2 / ZERO_DRAW:.1%} of the "
                 "others, a +0 row and a -0 column of every input")


def _underflow(graph, rng) -> tuple[dict, str]:
    out = {}
    for node in graph.inputs:
        low = float(np.log2(finfo(node.dtype).smallest_subnormal))
        if node.dtype.is_16bit:   # half the table negative: sign and magnitude in one draw
            half = np.exp2(low * (1.0 - _MIDPOINTS[::2]))
            out[node.arg[0]] = tabled(rng, node.shape, node.dtype, np.concatenate([-half, half]))
        else:
            sign = np.where(rng.random(node.shape, dtype=np.float32) < 0.5, -1.0, 1.0)
            out[node.arg[0]] = (sign * np.exp2(low * rng.random(node.shape))).astype(node.dtype.numpy)
    return out, "magnitudes 2^U, U uniform from the smallest subnormal to 1, random signs"


def _masked(base, graph, rng) -> tuple[dict | None, str]:
    out, masked = dict(base), []
    for node in graph.inputs:
        dim = softmax_reach(graph, node)
        if dim is None:
            continue
        a = base[node.arg[0]].copy()
        a[rng.random(a.shape, dtype=np.float32) < MASK_SHARE] = -np.inf
        row = [int(rng.integers(n)) for n in a.shape]
        row[dim] = slice(None)
        a[tuple(row)] = -np.inf
        out[node.arg[0]] = a
        masked.append(f"{node.arg[0]} (a row along dim {dim})")
    if not masked:
        return None, "no input reaches exp or max without a matmul or sum in between"
    return out, f"-inf in {MASK_SHARE:.0%} of " + ", ".join(masked)


def _large(graph, rng) -> tuple[dict, str]:
    out, parts = {}, []
    for node in graph.inputs:
        m, why = large_value(graph, node)
        out[node.arg[0]] = uniform(rng, node.shape, node.dtype, 0.75 * m, 1.25 * m)
        parts.append(f"{node.arg[0]} ~{m:.3g} ({why})")
    return out, "positive values near overflow: " + ", ".join(parts)


def _denormal(graph, rng) -> tuple[dict, str]:
    out = {}
    for node in graph.inputs:
        tiny = float(finfo(node.dtype).smallest_normal) / 4
        out[node.arg[0]] = normal(rng, node.shape, node.dtype, tiny)
    return out, "N(0, 1) scaled into the subnormal range"


def special_inputs(graph: KernelGraph, case: str, base: dict, seed: int) -> tuple[dict | None, str]:
    """The inputs of one case (None: the case does not apply to this program) and a description."""
    rng = _rng(seed, case)
    if case == "random":
        return base, "N(0, 1) · scale"
    if case == "zeros":
        return _zeros(base, graph, rng)
    if case == "underflow":
        return _underflow(graph, rng)
    if case == "nan":
        return _with_specials(base, graph, rng, [np.nan] * SPECIALS_PER_INPUT), \
            f"NaN at {SPECIALS_PER_INPUT} positions of every input"
    if case == "inf":
        return _with_specials(base, graph, rng, [np.inf, -np.inf]), \
            "+inf and -inf at one position each of every input"
    if case == "mask":
        return _masked(base, graph, rng)
    if case == "large":
        return _large(graph, rng)
    if case == "denormal":
        return _denormal(graph, rng)
    raise InvalidInput(f"float_diff case {case!r}", hint=f"use some of {CASES}")
