"""Testing an emitted kernel against `jax.jit(fn)` in a user's CI: Hypothesis strategies of inputs
with IEEE special values (±inf, NaN, masked rows, values near the dtype's limits, subnormals) that
shrink to the smallest failing case, and `assert_kernel_matches`. Re-exported by `mugraph.testing`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings as hypothesis_settings, strategies as st

from mugraph.ir.errors import InvalidInput, NoDevice

SPECIAL_VALUES = ("nan", "inf", "-inf", "max", "-max", "subnormal", "-0")
REGIMES = ("normal", "large", "subnormal")   # the first is where shrinking ends
MAX_SPECIALS = 4
BACKENDS = ("harness", "cuda", "reference", "auto")
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}   # as the float test's own mode
SHOWN = 4   # positions listed per kind in a failure message


# ---- values ----------------------------------------------------------------------------------------
def special_value(name: str, dtype, large: float | None = None) -> float:
    """One named IEEE value in `dtype` ("max": its largest finite value, or twice `large` where
    that is less: the most an input whose first sum or matmul reaches the dtype's limit at
    `large` is given; "subnormal": a quarter of its smallest normal)."""
    info = np.finfo(dtype)
    top = float(info.max) if large is None else min(float(info.max), 2 * large)
    table = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "max": top, "-max": -top,
             "subnormal": float(info.smallest_normal) / 4, "-0": -0.0}
    if name not in table:
        raise InvalidInput(f"unknown special value {name!r}", hint=f"use one of {SPECIAL_VALUES}")
    return table[name]


def _base(rng, shape, dtype, regime: str, scale: float, large: float | None) -> np.ndarray:
    """The finite background: N(0, 1)·scale; near the dtype's limit (positive, large·(0.75..1.25)
    as the float test's `large` case, default max/2); N(0, 1) scaled into the subnormals; or
    "tiny": magnitudes 2^U, U uniform from the smallest subnormal to 1, random signs (as the
    float test's `underflow` case: a scaling by 2^-k underflows some of them)."""
    info = np.finfo(dtype)
    if regime == "tiny":
        low = float(np.log2(info.smallest_subnormal))
        signs = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
        values = signs * np.exp2(low * rng.random(shape))
    elif regime == "large":
        top = float(info.max) / 2 if large is None else large
        values = top * (0.75 + 0.5 * rng.random(shape))
        values = np.minimum(values, float(info.max))
    elif regime == "subnormal":
        values = rng.standard_normal(shape) * float(info.smallest_normal) / 4
    else:
        values = rng.standard_normal(shape) * scale
    return values.astype(dtype)


# ---- strategies ------------------------------------------------------------------------------------
def ieee_arrays(shape: Sequence[int], dtype="float32", *, scale: float = 1.0,
                large: float | None = None, specials: bool = True, masked_rows: bool = True,
                mask_dim: int | None = None, regimes=REGIMES, subnormals: bool = True,
                values=SPECIAL_VALUES, zeros: bool = True) -> st.SearchStrategy:
    """Arrays of `shape` and `dtype`: a seeded finite background in a drawn regime (normal, near
    the dtype's limit, subnormal), up to MAX_SPECIALS special values (SPECIAL_VALUES) at drawn
    positions and, for rank >= 2, maybe one masked row (-inf along `mask_dim`, the dim a softmax
    reduces; drawn when None). With `zeros`, maybe exact zeros too (+0 at a drawn position and,
    for rank >= 2, a whole +0 row), and maybe the "tiny" background instead (`_base`: values
    over every scale down to the smallest subnormal). Built from Hypothesis primitives, so a
    failing example shrinks toward seed 0, the normal regime, no masked row, no zeros, fewer
    specials at the first positions.

    `large`: the magnitude of the "large" regime (default max/2; `kernel_inputs` sizes it per
    input as the float test does); ±max values are at most twice it. `subnormals=False` leaves out the subnormal regime and value;
    `values` are the special values it may place.
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    size = int(np.prod(shape, dtype=np.int64))
    regimes = tuple(r for r in regimes if subnormals or r != "subnormal") or ("normal",)
    names = tuple(v for v in values if subnormals or v != "subnormal")
    overlay = st.lists(st.tuples(st.integers(0, size - 1), st.sampled_from(names)),
                       max_size=MAX_SPECIALS) if specials and size and names else st.just([])
    mask = st.none()
    if masked_rows and len(shape) >= 2:
        dims = st.just(mask_dim % len(shape)) if mask_dim is not None else \
            st.integers(0, len(shape) - 1)
        mask = st.none() | st.tuples(dims, st.tuples(*(st.integers(0, n - 1) for n in shape)))
    extra = _zeros_and_tiny(shape, size, subnormals and "subnormal" in regimes) if zeros and size \
        else st.just((None, False))
    parts = st.tuples(st.integers(0, 2**16 - 1), st.sampled_from(regimes), overlay, mask, extra)
    return parts.map(lambda p: _array(shape, dtype, scale, large, *p))


def _zeros_and_tiny(shape, size: int, tiny: bool) -> st.SearchStrategy:
    """(zeros, tiny): None or (a position for +0, None or (dim, a row) of +0); and whether the
    background is "tiny". Drawn after the other parts, so adding them kept every older draw."""
    row = st.none()
    if len(shape) >= 2:
        row = row | st.tuples(st.integers(0, len(shape) - 1),
                              st.tuples(*(st.integers(0, n - 1) for n in shape)))
    zeros = st.none() | st.tuples(st.integers(0, size - 1), row)
    return st.tuples(zeros, st.booleans() if tiny else st.just(False))


def _array(shape, dtype, scale, large, seed, regime, overlay, mask,
           extra=(None, False)) -> np.ndarray:
    zeros, tiny = extra
    a = _base(np.random.default_rng(seed), shape, dtype, "tiny" if tiny else regime, scale, large)
    flat = a.reshape(-1)
    if zeros is not None:
        position, row = zeros
        flat[position] = 0.0
        if row is not None:
            dim, where = row
            where = list(where)
            where[dim] = slice(None)
            a[tuple(where)] = 0.0
    for index, name in overlay:
        flat[index] = special_value(name, dtype, large)
    if mask is not None:
        dim, where = mask
        where = list(where)
        where[dim] = slice(None)
        a[tuple(where)] = -np.inf
    return a


def kernel_inputs(kernel, **options) -> st.SearchStrategy:
    """Input lists for a Kernel (or a KernelGraph), each array in its input's shape and dtype.

    What the spec does with each input places the values as the float test does
    (`verify.special_values`): the "large" regime is sized by the first sum or matmul the input
    reaches (`large_value`), and masked rows run along the dim of the softmax the input reaches
    (`softmax_reach`). `options` go to `ieee_arrays` for every input.

    Each list is one of two kinds, as the float test's cases are: special values (NaN, ±inf,
    masked rows, subnormals, -0 over normal or subnormal backgrounds) or a range test (the large
    regime and ±max, no infinities or NaN). Mixed, an inf meets a product that overflowed, and
    whether that is inf - inf depends on the order a kernel sums in, not on the program."""
    from mugraph.verify.special_values import large_value, softmax_reach
    graph = getattr(kernel, "graph", kernel)
    spec = getattr(kernel, "spec", graph)
    placed = []
    for node in graph.inputs:
        twin = next((n for n in spec.inputs if n.arg[0] == node.arg[0]), None)
        placed.append({} if twin is None else
                      {"large": large_value(spec, twin)[0], "mask_dim": softmax_reach(spec, twin)})
    kinds = [k for k in (_kind(graph, placed, options, kind) for kind in KINDS) if k is not None]
    if not kinds:
        raise InvalidInput(f"regimes={options.get('regimes')!r} leaves nothing to draw",
                           hint=f"use some of {REGIMES}")
    return st.one_of(*kinds)


SPECIALS_KIND = dict(regimes=("normal", "subnormal"), exclude=("max", "-max"), masked_rows=True)
RANGE_KIND = dict(regimes=("normal", "large"), exclude=("nan", "inf", "-inf", "subnormal"),
                  masked_rows=False)
KINDS = (SPECIALS_KIND, RANGE_KIND)   # the first is where shrinking ends


def _kind(graph, placed, options, kind) -> st.SearchStrategy | None:
    """One kind of input list (`kernel_inputs`) within what `options` allow; None if nothing."""
    regimes = tuple(r for r in options.get("regimes", REGIMES) if r in kind["regimes"])
    values = tuple(v for v in options.get("values", SPECIAL_VALUES) if v not in kind["exclude"])
    if not regimes:
        return None
    masked = options.get("masked_rows", True) and kind["masked_rows"]
    own = options | dict(regimes=regimes, values=values, masked_rows=masked)
    return st.tuples(*(ieee_arrays(n.shape, n.dtype.numpy, **(p | own))
                       for n, p in zip(graph.inputs, placed))).map(list)


# ---- the assertion ---------------------------------------------------------------------------------
def assert_kernel_matches(fn: Callable, kernel, backend: str = "harness", *, examples: int = 20,
                          rtol: float | None = None, scale: float = 1.0, settings=None,
                          **options) -> None:
    """Run the emitted kernel and `jax.jit(fn)` on Hypothesis-drawn inputs (`kernel_inputs`);
    raise AssertionError on the smallest input found where they disagree, naming the output,
    where it differs, both values and what the input holds.

    `kernel`: a Kernel (from `superoptimize`) or a KernelGraph. `backend`: "harness" runs the
    generated CUDA on the CPU harness (`mugraph.codegen.run_on_cpu`), "cuda" on the GPU (CuPy;
    NoDevice without one), "reference" runs the μGraph with the reference interpreter in its own
    dtypes (no compiler: fast, but not the emitted code), "auto" the GPU where there is one.

    Agreement, per output, with the kernel's output rounded to the dtype `fn` returns: where
    jax.jit(fn) is NaN or ±inf and `fn` run in float64 is the same, the kernel must be exactly
    that; where jax.jit(fn) is finite and within `rtol` of the float64 run, the kernel must be
    finite and within `rtol` of it too (relative to the output's largest finite magnitude, plus
    the dtype's smallest normal: subnormal differences and XLA's flushing of them on a CPU do not
    count), or the ±inf such a value rounds to in that dtype (fp16 -65521 is -inf). Default
    `rtol` by dtype: 1e-4 float32, 1e-2 float16/bfloat16. Elsewhere jax.jit(fn) itself lost
    range or precision in its own dtypes (an fp16 x*x that overflowed, an exp that underflowed
    to 0 and met an inf): no kernel is held to its answer there, and a failure message counts
    those elements. This is the float test's rule (`verify.float_diff`). Where an input holds
    float32-range subnormals, a kernel that agrees once they are read as zeros passes too: XLA on
    a CPU reads them so (`flushed`), a GPU and the kernel need not. Where jax.jit(fn) and its
    float64 run drop a NaN that the spec run in float64 by NumPy keeps (XLA's CPU max and min
    over axis 0 do), that element is not compared; the spec is `kernel.spec`, or `fn` lifted for
    a bare graph, and is used only if it agrees with fn on ordinary inputs.

    `scale`: the spread of the ordinary inputs, halved (up to 8 times) until jax.jit(fn) agrees
    with its float64 run on them (a softmax without max shift overflows fp16 at unit scale);
    VerificationError if it never does. `examples`: how many inputs to draw; `settings`: a
    hypothesis.settings to use instead (the current profile otherwise, e.g. derandomised in CI);
    `options` go to `ieee_arrays` (e.g. `regimes=("normal",)`, `masked_rows=False`).
    """
    if not callable(fn):
        raise InvalidInput(f"assert_kernel_matches takes the JAX function first, got "
                           f"{type(fn).__name__}", hint="assert_kernel_matches(fn, kernel)")
    kernel = _as_kernel(kernel)
    run = _runner(kernel, backend)
    _check_interface(fn, kernel)
    kernel, spec = _with_spec(kernel, fn)
    program = Program(fn, spec)
    scale = usable_scale(program, kernel, scale, rtol)
    config = settings or hypothesis_settings(
        max_examples=examples, deadline=None,
        phases=tuple(p for p in Phase if p is not Phase.explain),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    names = kernel.graph.input_names

    @config
    @given(kernel_inputs(kernel, scale=scale, **options))
    def check(arrays):
        i, mismatch = first_mismatch(program, run, arrays, rtol)
        zeroed = flushed(arrays) if mismatch else None   # subnormals read as XLA on a CPU does
        if zeroed is not None and not first_mismatch(program, run, zeroed, rtol)[1]:
            mismatch = ""
        if mismatch:
            raise AssertionError(f"output {i} of the kernel ({backend}) differs from "
                                 f"jax.jit(fn): {mismatch}\n  on this input (the smallest "
                                 f"Hypothesis found):\n{describe(arrays, names)}")

    check()


def first_mismatch(program, run, arrays, rtol) -> tuple[int, str]:
    """The first output where the kernel breaks what jax.jit(fn) is held to, and how."""
    own, exact = program(arrays)
    numpy = program.numpy(arrays)
    for i, (o, e, n, g) in enumerate(zip(own, exact, numpy, run(arrays))):
        mismatch = output_mismatch(o, g, _rtol(rtol, o), exact=e, numpy=n)
        if mismatch:
            return i, mismatch
    return -1, ""


def flushed(arrays) -> list | None:
    """`arrays` with float32-range subnormals (what fp16/bf16/fp32 compute in) as signed zeros,
    or None where there are none. XLA on a CPU reads subnormal inputs as zero (DAZ), so a
    kernel that keeps them (as IEEE and XLA on a GPU do) may differ from it by far more than a
    subnormal once a norm divides them by a small rms; the kit accepts either reading."""
    tiny = float(np.finfo(np.float32).smallest_normal)
    out, found = [], False
    for a in arrays:
        with np.errstate(all="ignore"):
            wide = np.asarray(a, np.float64)
            sub = (wide != 0) & (np.abs(wide) < tiny)
        found |= bool(sub.any())
        out.append(np.where(sub, np.copysign(0.0, wide), wide).astype(np.asarray(a).dtype))
    return out if found else None


class Program:
    """`fn` as jax.jit runs it, beside `fn` run in float64 (inputs widened exactly): what tells
    where jax.jit's own dtypes lost range or precision; and, with `spec` (fn lifted), the spec
    run in float64 by the NumPy interpreter: a second float64 that does not share XLA's CPU
    kernels (whose max and min over axis 0 drop NaN)."""

    def __init__(self, fn: Callable, spec=None):
        import jax
        self.own, self.exact = jax.jit(fn), jax.jit(fn)
        self.spec = spec

    def __call__(self, arrays) -> tuple[list, list]:
        import jax
        leaves = jax.tree_util.tree_leaves
        own = [np.asarray(o) for o in leaves(self.own(*arrays))]
        with jax.enable_x64(True):
            wide = [np.asarray(a, np.float64) for a in arrays]
            exact = [np.asarray(o, np.float64) for o in leaves(self.exact(*wide))]
        return own, exact

    def vet(self, arrays, own, exact, rtol) -> None:
        """Drop the spec unless it is fn on ordinary inputs (within each output's tolerance of
        fn run in float64): a spec that is not the program must not decide what is compared."""
        if self.spec is None:
            return
        outs = list(self.numpy(arrays))
        if len(outs) != len(exact) or any(n.shape != e.shape or Held.of(n, e, _rtol(rtol, o)).lost
                                          for n, o, e in zip(outs, own, exact)):
            self.spec = None

    def numpy(self, arrays):
        """The spec's float64 outputs, one per output (None each without a spec)."""
        from mugraph.ir.interpret import interpret
        if self.spec is None:
            return itertools.repeat(None)
        with np.errstate(all="ignore"):
            return [np.asarray(o, np.float64) for o in interpret(self.spec, arrays, dtype="float64")]


def usable_scale(program: Program, kernel, scale: float, rtol: float | None = None) -> float:
    """`scale`, halved until jax.jit(fn) holds everywhere on ordinary inputs (seed 0, N(0, 1) ·
    scale, no special values): else no kernel could be held to it."""
    from mugraph.ir.errors import VerificationError
    for _ in range(8):
        arrays = [_array(n.shape, n.dtype.numpy, scale, None, 0, "normal", [], None)
                  for n in kernel.graph.inputs]
        own, exact = program(arrays)
        if all(Held.of(o, e, _rtol(rtol, o)).lost == 0 for o, e in zip(own, exact)):
            program.vet(arrays, own, exact, rtol)
            return scale
        scale /= 2
    raise VerificationError(f"jax.jit(fn) does not agree with fn run in float64 even on N(0, 1) "
                            f"inputs scaled by {scale * 2:g}: its own dtypes lose range or "
                            f"precision, so there is nothing to hold the kernel to",
                            hint="compute fn in float32, or pass rtol= to allow more")


def _rtol(rtol: float | None, out) -> float:
    return rtol if rtol is not None else _tolerance(np.asarray(out).dtype)


def _tolerance(dtype) -> float:
    return TOLERANCE.get(np.dtype(dtype).name, 1e-2)


def _as_kernel(kernel):
    from mugraph.api import Kernel
    from mugraph.ir.graph import KernelGraph
    if isinstance(kernel, KernelGraph):
        return Kernel(kernel, kernel)
    if not isinstance(kernel, Kernel):
        raise InvalidInput(f"assert_kernel_matches takes a Kernel or a KernelGraph, got "
                           f"{type(kernel).__name__}",
                           hint="pass what mugraph.superoptimize returned, or kernel.graph")
    return kernel


def _with_spec(kernel, fn):
    """The kernel with its spec, and the spec (None where there is none): a Kernel from
    `superoptimize` has one; a bare KernelGraph's is `fn` lifted, where the front end can. The
    spec places the inputs (`kernel_inputs`) by what the program does with them, which a fused
    graph hides in its custom kernels (a weight a block's matmul reads would get max/2, not a
    size whose products stay in range), and is the NumPy float64 referee (`Program`)."""
    from mugraph.api import Kernel
    from mugraph.ir.errors import MugraphError
    if kernel.spec is not kernel.graph:
        return kernel, kernel.spec
    import jax
    args = [jax.ShapeDtypeStruct(n.shape, n.dtype.numpy) for n in kernel.graph.inputs]
    try:
        from mugraph.ir import from_jax
        spec = from_jax(fn, *args, input_names=kernel.graph.input_names)
    except MugraphError:
        return kernel, None
    return Kernel(kernel.graph, spec), spec


def _runner(kernel, backend: str) -> Callable:
    """A function from input arrays to the kernel's outputs (NumPy) on `backend`."""
    if backend not in BACKENDS:
        raise InvalidInput(f"unknown backend {backend!r}", hint=f"use one of {BACKENDS}")
    from mugraph.codegen.runtime_cupy import gpu_available, require_gpu
    if backend == "auto":
        backend = "cuda" if gpu_available() else "harness"
    if backend == "harness":
        return _harness(kernel.graph)
    if backend == "reference":
        from mugraph.ir.interpret import interpret
        return lambda arrays: interpret(kernel.graph, arrays, dtype="own")
    try:
        require_gpu()
    except NoDevice as e:
        raise NoDevice(f"assert_kernel_matches(backend='cuda') needs a GPU: {e}",
                       hint="use backend='harness' (the generated CUDA on the CPU) or 'auto'") \
            from None
    import cupy

    def on_gpu(arrays):
        outs = kernel(*arrays)
        return [cupy.asnumpy(o) for o in (outs if isinstance(outs, (list, tuple)) else [outs])]

    return on_gpu


def _harness(graph) -> Callable:
    """`mugraph.codegen.run_on_cpu(graph, arrays)` with the CUDA generated and built once, not per
    drawn input (a shrinking run calls it hundreds of times)."""
    from mugraph.codegen.run_cpu import bind_inputs, build_cpu, generate, run_plan
    module = generate(graph, "sm_80")
    customs = list(dict.fromkeys(k.name for k in module.plan.kernels if k.kind == "custom"))
    cpu = build_cpu(module.source, customs) if customs else None
    return lambda arrays: run_plan(module, cpu, bind_inputs(graph, arrays))


def _check_interface(fn, kernel) -> None:
    """`fn` takes the kernel's inputs and returns as many outputs, of the same shapes."""
    import jax
    args = [jax.ShapeDtypeStruct(n.shape, n.dtype.numpy) for n in kernel.graph.inputs]
    try:
        outs = jax.tree_util.tree_leaves(jax.eval_shape(fn, *args))
    except Exception as e:
        inputs = [f"{n.arg[0]}: {n.dtype.short}{list(n.shape)}" for n in kernel.graph.inputs]
        raise InvalidInput(f"fn cannot run on the kernel's inputs {inputs}: {type(e).__name__}: {e}",
                           hint="pass the function the kernel was made from") from None
    want = [tuple(o.shape) for o in outs]
    have = [tuple(o.shape) for o in kernel.graph.outputs]
    if want != have:
        raise InvalidInput(f"fn returns outputs of shapes {want}, the kernel {have}",
                           hint="pass the function the kernel was made from")


# ---- comparing one output --------------------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """What one output of the kernel is held to: jax.jit's output `own` where it agrees with `exact`
    (fn in float64): `right` (finite, within rtol·scale + tiny of exact) or the same NaN / ±inf.

    Not held: where the spec in float64 (NumPy, `numpy`) is NaN and `exact` is not (XLA on a CPU
    drops NaN in max/min over axis 0; NumPy and a GPU keep it)."""

    own: np.ndarray        # float64 copies of jax.jit's output and of the float64 run
    exact: np.ndarray
    right: np.ndarray
    special: np.ndarray
    scale: float           # the largest finite magnitude of the exact output
    tiny: float            # the output dtype's smallest normal: below it, no relative precision
    rtol: float
    limit: float = np.inf  # the least magnitude the output dtype rounds to ±inf

    @classmethod
    def of(cls, own, exact, rtol: float, numpy=None) -> "Held":
        own = np.asarray(own)
        floating = np.issubdtype(own.dtype, np.floating)
        tiny = float(np.finfo(own.dtype).smallest_normal) if floating else 0.0
        o, e = np.asarray(own, np.float64), np.asarray(exact, np.float64)
        disputed = np.zeros(o.shape, bool) if numpy is None or np.shape(numpy) != o.shape \
            else np.isnan(numpy) & ~np.isnan(e)
        with np.errstate(all="ignore"):
            finite = np.isfinite(o) & np.isfinite(e)
            scale = max(float(np.max(np.abs(e[finite]), initial=0.0)), tiny)
            right = finite & (np.abs(np.where(finite, o - e, 0.0)) <= rtol * scale + tiny)
        special = ~np.isfinite(o) & _same(o, e) & ~disputed
        return cls(o, e, right & ~disputed, special, scale, tiny, rtol,
                   overflow_limit(own.dtype) if floating else np.inf)

    @property
    def lost(self) -> int:
        """Elements not compared: jax.jit lost range or precision there (or see above)."""
        return int((~(self.right | self.special)).sum())

    def wrong(self, got) -> np.ndarray:
        """Where `got` (float64) breaks what is held."""
        with np.errstate(all="ignore"):
            off = np.abs(np.where(self.right, got - self.exact, 0.0))
            close = np.isfinite(got) & (off <= self.rtol * self.scale + self.tiny)
            close |= self.rounds_to(got)
        return (self.special & ~_same(got, self.own)) | (self.right & ~close)

    def rounds_to(self, got) -> np.ndarray:
        """Where `got` is the ±inf that a value within tolerance of the exact one rounds to in
        the output dtype: -65521 (float64) is -inf in fp16, the correctly rounded answer, even
        where jax.jit's own rounding kept -65440."""
        reach = np.abs(self.exact) + self.rtol * self.scale + self.tiny
        return np.isinf(got) & (np.sign(got) == np.sign(self.exact)) & (reach >= self.limit)


def overflow_limit(dtype) -> float:
    """The least magnitude that rounds to ±inf in `dtype`: its largest finite value plus half a
    unit in the last place (65520 in fp16)."""
    info = np.finfo(dtype)
    return float(info.max) + 2.0 ** (info.maxexp - 1 - info.nmant) / 2


def _same(a, b) -> np.ndarray:
    return (a == b) | (np.isnan(a) & np.isnan(b))


def output_mismatch(want, got, rtol: float, exact=None, numpy=None) -> str:
    """How `got` (the kernel's output) fails to match `want` (jax.jit's), or "" where it matches.

    `got` is rounded to `want`'s dtype first. With `exact` (fn run in float64), elements where
    `want` lost range or precision are not compared (see `assert_kernel_matches`); without it,
    every element is: NaN and ±inf exactly where `want` has them, finite values within
    rtol·scale + the dtype's smallest normal (scale: `want`'s largest finite magnitude).
    With `numpy` (the spec in float64), a NaN jax.jit drops and NumPy keeps is not compared."""
    want, got = np.asarray(want), np.asarray(got)
    exact = want if exact is None else np.asarray(exact)
    if got.shape != want.shape or exact.shape != want.shape:
        return f"its shape is {got.shape}, jax.jit's is {want.shape}"
    held = Held.of(want, exact, rtol, numpy)
    with np.errstate(all="ignore"):
        g = np.asarray(got.astype(want.dtype), np.float64)
    wrong = held.wrong(g)
    return _message(held, g, wrong) if wrong.any() else ""


def _message(held: Held, g, wrong) -> str:
    o, e = held.own, held.exact
    first = tuple(int(i) for i in np.argwhere(wrong)[0])
    with np.errstate(all="ignore"):
        error = np.where(held.right & np.isfinite(g), np.abs(g - e), 0.0) / held.scale
    worst = _at(np.unravel_index(int(np.argmax(error)), error.shape))
    what = f"relative error {error.max():.3g} > {held.rtol:g} (largest at {worst})" \
        if np.isfinite(g[first]) and held.right[first] else "a non-finite value out of place"
    exact_note = f" (float64 {float(e[first])!r})" if held.right[first] and e[first] != o[first] \
        else ""
    spots = ", ".join(f"{_at(p)} kernel {float(g[tuple(p)])!r} / jax {float(o[tuple(p)])!r}"
                      for p in np.argwhere(wrong)[:SHOWN])
    lost = (f"\n  not compared: {held.lost} elements where jax.jit(fn) is off fn in float64 "
            f"(range or precision lost in its own dtypes) or drops a NaN the spec in float64 "
            f"keeps") if held.lost else ""
    return (f"{what}; {int(wrong.sum())} of {o.size} elements differ, first at {_at(first)}: "
            f"kernel {float(g[first])!r}, jax.jit {float(o[first])!r}{exact_note}\n"
            f"  differing: {spots}{' ...' if wrong.sum() > SHOWN else ''}{lost}")


def _at(index) -> str:
    return "(" + ", ".join(str(int(i)) for i in index) + ")"


# ---- describing an input ---------------------------------------------------------------------------
def describe(arrays, names=None) -> str:
    """One line per input array: shape and dtype, its largest finite magnitude, subnormals,
    masked rows (-inf along a whole dim), zero rows, and where its other NaN and ±inf values
    are."""
    names = names or [f"#{k}" for k in range(len(arrays))]
    return "\n".join(f"    {name}: {_describe_one(np.asarray(a))}" for name, a in zip(names, arrays))


def _describe_one(a) -> str:
    x = np.asarray(a, np.float64)
    info = np.finfo(a.dtype) if np.issubdtype(a.dtype, np.floating) else None
    finite = np.abs(x[np.isfinite(x)])
    parts = [f"{a.dtype}{list(a.shape)}, max |finite| {finite.max(initial=0.0):.3g}"
             + (f" (the dtype's max is {float(info.max):.3g})" if info is not None else "")]
    if info is not None:
        tiny = int(np.sum((finite > 0) & (finite < float(info.smallest_normal))))
        if tiny:
            parts.append(f"{tiny} subnormal")
    masked = np.zeros(x.shape, bool)
    for dim in range(x.ndim if x.ndim >= 2 else 0):
        rows = np.all(np.isneginf(x), axis=dim, keepdims=True)
        for p in np.argwhere(rows[(...,)])[:SHOWN]:
            parts.append("masked row " + _row(p, dim) + " = -inf")
        masked |= np.broadcast_to(rows, x.shape)
        zeros = np.all(x == 0, axis=dim, keepdims=True)
        for p in np.argwhere(zeros[(...,)])[:SHOWN]:
            parts.append("zero row " + _row(p, dim) + " = 0")
    for label, where in (("NaN", np.isnan(x)), ("+inf", np.isposinf(x)),
                         ("-inf", np.isneginf(x) & ~masked)):
        spots = np.argwhere(where)
        if len(spots):
            more = f" (+{len(spots) - SHOWN} more)" if len(spots) > SHOWN else ""
            parts.append(f"{label} at " + ", ".join(_at(p) for p in spots[:SHOWN]) + more)
    return "; ".join(parts)


def _row(position, dim: int) -> str:
    return "[" + ", ".join(":" if d == dim else str(int(i)) for d, i in enumerate(position)) + "]"
