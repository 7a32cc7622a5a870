"""Testing an emitted kernel against `jax.jit(fn)` in a user's CI: Hypothesis strategies of inputs
with IEEE special values (±inf, NaN, masked rows, values near the dtype's limits, subnormals) that
shrink to the smallest failing case, and `assert_kernel_matches`. Re-exported by `mugraph.testing`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from hypothesis import HealthCheck, given, settings as hypothesis_settings, strategies as st

SPECIAL_VALUES = ("nan", "inf", "-inf", "max", "-max", "subnormal", "-0")
REGIMES = ("normal", "large", "subnormal")   # the first is where shrinking ends
MAX_SPECIALS = 4


def special_value(name: str, dtype) -> float:
    """One named IEEE value in `dtype` ("max" is its largest finite value)."""
    info = np.finfo(dtype)
    return {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "max": float(info.max),
            "-max": -float(info.max), "subnormal": float(info.smallest_normal) / 4,
            "-0": -0.0}[name]


def _base(rng, shape, dtype, regime: str, scale: float, large: float | None) -> np.ndarray:
    """The finite background: N(0, 1)·scale; near the dtype's limit (magnitudes from large/2 to
    large, default max/2); or subnormal."""
    info = np.finfo(dtype)
    if regime == "large":
        top = float(info.max) / 2 if large is None else large
        values = top * (0.5 + 0.5 * rng.random(shape)) * rng.choice([-1, 1], shape)
    elif regime == "subnormal":
        values = rng.standard_normal(shape) * float(info.smallest_normal) / 4
    else:
        values = rng.standard_normal(shape) * scale
    return values.astype(dtype)


@st.composite
def ieee_arrays(draw, shape: Sequence[int], dtype="float32", *, scale: float = 1.0,
                large: float | None = None, specials: bool = True, masked_rows: bool = True,
                regimes=REGIMES) -> np.ndarray:
    """One array of `shape` and `dtype`: a seeded finite background in a drawn regime (normal,
    near the dtype's limits, subnormal), up to MAX_SPECIALS special values at drawn positions and,
    for rank >= 2, maybe one row of -inf (a masked attention row). Shrinks toward seed 0, the
    normal regime, no specials and the first position.

    `large`: the magnitude of the "large" regime; `kernel_inputs` sizes it per input like the
    float test does (a sum or matmul of such values lands near the dtype's limit, rather than
    every product overflowing, where two correct programs differ by summation order)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    size = int(np.prod(shape, dtype=np.int64))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = _base(rng, shape, dtype, draw(st.sampled_from(tuple(regimes))), scale, large)
    if specials and size:
        overlay = draw(st.lists(st.tuples(st.integers(0, size - 1), st.sampled_from(SPECIAL_VALUES)),
                                max_size=MAX_SPECIALS))
        flat = a.reshape(-1)
        for index, name in overlay:
            flat[index] = special_value(name, dtype)
    if masked_rows and len(shape) >= 2 and draw(st.booleans()):
        dim = draw(st.integers(0, len(shape) - 1))
        where = [draw(st.integers(0, n - 1)) for n in shape]
        where[dim] = slice(None)
        a[tuple(where)] = -np.inf
    return a


def kernel_inputs(kernel, **options) -> st.SearchStrategy:
    """Input lists for a Kernel (or a KernelGraph), each array in its input's shape and dtype;
    `options` go to `ieee_arrays`; the "large" regime is sized by what the spec does with each
    input (`verify.special_values.large_value`)."""
    from mugraph.verify.special_values import large_value
    graph = getattr(kernel, "graph", kernel)
    spec = getattr(kernel, "spec", graph)
    strategies = []
    for node in graph.inputs:
        twin = next((n for n in spec.inputs if n.arg[0] == node.arg[0]), None)
        large = large_value(spec, twin)[0] if twin is not None else None
        strategies.append(ieee_arrays(node.shape, node.dtype.numpy,
                                      **({"large": large} | options)))
    return st.tuples(*strategies).map(list)


# ---- the assertion ---------------------------------------------------------------------------------
TOLERANCE = {np.dtype("float32"): 1e-4, np.dtype("float16"): 1e-2}


def _tolerance(dtype) -> float:
    dtype = np.dtype(dtype)
    return TOLERANCE.get(dtype, 1e-2)  # bfloat16 and other 16-bit types: 1e-2


def assert_kernel_matches(fn: Callable, kernel, backend: str = "harness", *, examples: int = 20,
                          rtol: float | None = None, settings=None, **options) -> None:
    """Run the emitted kernel (`backend`: "harness" runs the generated CUDA on the CPU harness,
    "cuda" on a GPU, "auto" the GPU where there is one) and `jax.jit(fn)` on Hypothesis-drawn
    inputs; raise AssertionError on the smallest input found where they disagree.

    Agreement: NaN where JAX has NaN, the same infinity where it has one, and finite values
    within `rtol` of the output's largest finite magnitude, subnormal results counting as zero
    (XLA on CPU flushes them; default `rtol` by the output dtype: 1e-4 for float32, 1e-2 for
    16-bit). A kernel that keeps an intermediate in fp32 where JAX rounds it to a 16-bit dtype
    disagrees where that rounding overflows; restrict `regimes`/`specials` if that is intended. `options` go to `ieee_arrays` (e.g. `regimes=("normal",)`);
    `settings` is a hypothesis.settings (default: `examples` examples, no deadline, no database).
    """
    import jax
    run = _runner(kernel, backend)
    reference = jax.jit(fn)
    if "regimes" not in options and jax.default_backend() == "cpu":
        # XLA on the CPU treats subnormal inputs and results as zero (DAZ/FTZ); the generated
        # CUDA and XLA on a GPU keep them: there is no agreement to ask for
        options["regimes"] = tuple(r for r in REGIMES if r != "subnormal")
    config = settings or hypothesis_settings(max_examples=examples, deadline=None, database=None,
                                             suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.data_too_large])

    @config
    @given(kernel_inputs(kernel, **options))
    def check(arrays):
        want = [np.asarray(o) for o in jax.tree_util.tree_leaves(reference(*arrays))]
        got = run(arrays)
        if len(want) != len(got):
            raise AssertionError(f"jax.jit(fn) gives {len(want)} outputs, the kernel {len(got)}")
        for i, (w, g) in enumerate(zip(want, got)):
            _check_output(i, w, g, rtol if rtol is not None else _tolerance(w.dtype), arrays)

    check()


def _runner(kernel, backend: str) -> Callable:
    from mugraph.api import Kernel
    from mugraph.ir.errors import InvalidInput
    from mugraph.ir.graph import KernelGraph
    if isinstance(kernel, KernelGraph):
        kernel = Kernel(kernel, kernel)
    if not isinstance(kernel, Kernel):
        raise InvalidInput(f"assert_kernel_matches takes a Kernel or a KernelGraph, got "
                           f"{type(kernel).__name__}")
    if backend == "auto":
        from mugraph.codegen.runtime_cupy import gpu_available
        backend = "cuda" if gpu_available() else "harness"
    if backend == "harness":
        return lambda arrays: _as_list(kernel.run_on_cpu(*arrays))
    if backend == "cuda":
        import cupy
        return lambda arrays: [cupy.asnumpy(o) for o in _as_list(kernel(*arrays))]
    raise InvalidInput(f"unknown backend {backend!r}", hint="harness, cuda or auto")


def _as_list(outputs) -> list:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _check_output(i: int, want, got, rtol: float, arrays) -> None:
    from mugraph.verify.float_diff import compare
    floor = float(np.finfo(want.dtype).smallest_normal) if np.issubdtype(want.dtype, np.floating) \
        else 0.0
    want, got = _flushed(want, floor), _flushed(got, floor)
    diff = compare(want, got, output=i, floor=floor)
    if diff.error <= rtol:
        return
    where = f" at {diff.index}: kernel {diff.candidate_value!r}, jax.jit {diff.spec_value!r}" \
        if diff.index is not None else ""
    raise AssertionError(f"output {i} differs from jax.jit(fn){where} (relative error "
                         f"{diff.error:.3g}, allowed {rtol:g}); {diff.message or ''}\n"
                         f"  inputs: {describe(arrays)}")


def _flushed(a, tiny: float) -> np.ndarray:
    """`a` in float64 with subnormal values as zero: XLA on CPU flushes them (FTZ), a kernel may
    not, and below the dtype's smallest normal there is no relative precision to compare."""
    a = np.asarray(a, np.float64)
    return np.where(np.abs(a) < tiny, 0.0, a)


def describe(arrays) -> str:
    """Where the drawn inputs hold non-finite values, and their largest finite magnitude."""
    parts = []
    for k, a in enumerate(arrays):
        a = np.asarray(a, np.float64)
        odd = np.argwhere(~np.isfinite(a))
        finite = np.abs(a[np.isfinite(a)])
        spots = ", ".join(f"{a[tuple(p)]} at {tuple(int(x) for x in p)}" for p in odd[:4])
        more = f" (+{len(odd) - 4} more)" if len(odd) > 4 else ""
        parts.append(f"#{k} max |finite| {finite.max(initial=0.0):.3g}"
                     + (f", {spots}{more}" if spots else ""))
    return "; ".join(parts)
