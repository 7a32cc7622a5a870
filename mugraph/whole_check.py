"""The stitched program checked against the whole program: the float test against `jax.jit(fn)`.

Each fused region's winner is verified against its own region spec by its search (finite-field
tests at reduced shapes, the float test and the check at the real shapes). This checks the
stitching: the program of regions, each fused region run by the reference interpreter (float64,
rounded to the value's dtype at the region's edge) and every other step by JAX, on the real shapes,
against `jax.jit(fn)` on the same arguments: random draws (N(0, 1) times a scale halved until
jax.jit's results are finite) and a special-value case (a row of +inf, a row of NaN and a row of
zeros in one activation). Every float result must agree within the float test's tolerance for a
different program (`disagreement_tolerance`: 8 roundings of its dtype, or the dtype's own
tolerance where larger), NaN and +-inf exactly where jax.jit has them; a result further than
that from jax.jit(fn) (a deep 16-bit stack, where roundings grow layer after layer) must be no
further from fn run in float32 than F32_SLACK times jax.jit(fn) itself is. Where the interpreter would
run more than `WHOLE_CHECK_FLOPS`, or the arguments drawn in float64 take more than
`WHOLE_CHECK_BYTES`, the check is not run at the real shapes and says so.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import jax
import numpy as np

from mugraph.ir.dtypes import DType

WHOLE_CHECK_FLOPS = 4e9        # interpreter work above which the real-shape run is skipped
WHOLE_CHECK_BYTES = 5e8        # float64 draws of the arguments above which it is skipped too
RANDOM_DRAWS = 2
SCALE_TRIES = 6


@dataclass(frozen=True)
class WholeCheck:
    """The verdict for the whole program, in words."""

    status: str                    # EQUIVALENT | NOT EQUIVALENT | not run | nothing fused
    text: str
    cases: tuple = ()              # (case, worst relative error, tolerance)

    @property
    def failed(self) -> bool:
        return self.status == "NOT EQUIVALENT"

    def __str__(self) -> str:
        return f"{self.status}: {self.text}" if self.status != "nothing fused" else self.text


def check_whole(program, seed: int = 0) -> WholeCheck:
    """The whole-program verdict for `program` (a mugraph.program.Program); an EQUIVALENT one is
    kept beside the result cache, keyed by everything the stitched program is made of, and
    reused by the next compile of the same program (whose regions' kernels the cache re-verifies)."""
    if not program.fused:
        return WholeCheck("nothing fused", "nothing is fused: the program is fn itself, run by "
                                           "JAX")
    folder = getattr(program._store, "folder", None)
    key = verdict_key(program) if folder is not None else None
    kept = _load(folder, key) if key is not None else None
    if kept is not None:
        return kept
    verdict = _check(program, seed)
    if key is not None and verdict.status == "EQUIVALENT":
        _save(folder, key, verdict)
    return verdict


def _check(program, seed: int) -> WholeCheck:
    flops = _interpreter_flops(program)
    flat = program.partition.program
    drawn = sum(8 * np.prod(flat.value(v).shape, dtype=np.float64) for v in flat.inputs)
    if flops > WHOLE_CHECK_FLOPS or drawn > WHOLE_CHECK_BYTES:
        why = (f"its fused regions are {flops / 1e9:.1f} GFLOP through the interpreter, over "
               f"{WHOLE_CHECK_FLOPS / 1e9:.0f}" if flops > WHOLE_CHECK_FLOPS else
               f"its arguments drawn in float64 take {drawn / 1e9:.1f} GB, over "
               f"{WHOLE_CHECK_BYTES / 1e9:.1f}")
        return WholeCheck("not run", f"the stitched program was not run at the real shapes ({why})"
                                     "; each fused region's winner was verified against its own "
                                     "spec by its search (at the real shapes, sampled where "
                                     "large)")
    cases, wider = [], False
    for name, args in _cases(program, seed):
        error, tol, where, via = _compare(program, args)
        cases.append((name, error, tol, where))
        wider = wider or via
        if error > tol:
            return WholeCheck("NOT EQUIVALENT", f"case {name}: relative error {error:.3g} "
                                                f"against jax.jit(fn), tolerance {tol:.3g}"
                                                f"{where}", tuple(cases))
    shown = ", ".join(f"{n} {e:.2g}" for n, e, _, _ in cases)
    how = (f"; where a result is further than that from jax.jit(fn), it is no further from a "
           f"float32 run of fn than {F32_SLACK:g}x jax.jit(fn) is (errors that grow layer after "
           "layer)" if wider else "")
    return WholeCheck("EQUIVALENT", f"the stitched program agrees with jax.jit(fn) at the real "
                                    f"shapes on {len(cases)} cases (max relative error: {shown}; "
                                    f"tolerance {max(c[2] for c in cases):.2g}){how}",
                      tuple(cases))


# ---- verdicts kept beside the result cache -------------------------------------------------------
def verdict_key(program) -> str:
    """A digest of the stitched program: every step (primitive, parameters, types, wiring), the
    closed-over constants, the fused regions' kernels, and mugraph's source."""
    import hashlib
    from mugraph.search.cache import source_digest
    flat = program.partition.program
    h = hashlib.sha256(source_digest().encode())
    h.update(repr([(flat.value(v).shape, flat.value(v).dtype.name) for v in flat.inputs]).encode())
    for step in flat.steps:
        eqn = step.eqn
        h.update(repr((eqn.primitive.name, sorted(eqn.params.items()), step.ins, step.outs,
                       [str(v.aval) for v in (*eqn.invars, *eqn.outvars)])).encode())
    for vid, c in sorted(flat.consts.items()):
        h.update(repr(vid).encode() + np.ascontiguousarray(np.asarray(c)).tobytes())
    for o in program.fused:
        h.update(f"R{o.region.index}:{program.kernels[o.region.index].graph.digest()}".encode())
    return h.hexdigest()


def _verdict_file(folder, key: str):
    from pathlib import Path
    return Path(folder) / "whole_checks" / f"{key[:32]}.json"


def _load(folder, key: str) -> WholeCheck | None:
    import json
    path = _verdict_file(folder, key)
    try:
        data = json.loads(path.read_text())
        if data["key"] != key:
            return None
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(data["created"]))
        return WholeCheck(data["status"], f"{data['text']} [checked {when}, kept beside the result "
                                          "cache; each region's kernel re-verified now]",
                          tuple(tuple(c) for c in data["cases"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save(folder, key: str, verdict: WholeCheck) -> None:
    import json
    path = _verdict_file(folder, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "status": verdict.status, "text": verdict.text,
                                    "cases": [list(c) for c in verdict.cases],
                                    "created": time.time()}))
    except OSError:
        pass   # a read-only cache keeps nothing: the next compile checks again


def _interpreter_flops(program) -> float:
    from mugraph.search.cost import kernel_node_flops
    return float(sum(sum(kernel_node_flops(n, pad=False)) for o in program.fused
                     for n in o.region.spec.nodes))


def _compare(program, args) -> tuple:
    """(worst error / tolerance ratio's error, its tolerance, where, via float32) over the float
    results: each within its tolerance of jax.jit(fn), or else (errors that grow layer after
    layer in a deep 16-bit program) no further from a float32 run of fn than
    F32_SLACK x jax.jit(fn) is."""
    want = jax.tree_util.tree_leaves(jax.jit(program.fn)(*args))
    got = jax.tree_util.tree_leaves(program.run_reference(*args))
    wider = _Wider(program.fn, args)
    found = [_result(i, np.asarray(w), np.asarray(g), wider) for i, (w, g) in
             enumerate(zip(want, got))]
    return max(found, key=lambda f: f[0] / f[1], default=(0.0, 1.0, "", False))


F32_SLACK = 2.0


class _Wider:
    """jax.jit(fn) on the arguments widened to float32, run on first need."""

    def __init__(self, fn, args):
        self.fn, self.args, self._outs = fn, args, None

    def outputs(self):
        if self._outs is None:
            widen = lambda x: np.asarray(x, np.float32) if _is_float(x) else x  # noqa: E731
            try:
                wide = jax.tree_util.tree_map(widen, self.args)
                self._outs = [np.asarray(o) for o in
                              jax.tree_util.tree_leaves(jax.jit(self.fn)(*wide))]
            except Exception:   # fn may not take float32 (a fixed dtype inside): no second test
                self._outs = []
        return self._outs


def _is_float(x) -> bool:
    return np.asarray(x).dtype.name in ("float16", "bfloat16", "float32")


def _result(i: int, w, g, wider: _Wider) -> tuple:
    from mugraph.verify.float_diff import compare, disagreement_tolerance
    from mugraph.verify.special_values import finfo
    if not _is_float(w):
        same = np.array_equal(w, g)
        return 0.0 if same else np.inf, 1.0, f" (result {i}, {w.dtype.name})", False
    dtype = DType.parse(w.dtype.name)
    floor = float(finfo(dtype).smallest_normal)
    d = compare(w.astype(np.float64), g.astype(np.float64), i, floor=floor)
    tol = disagreement_tolerance(dtype)
    where = f" (result {i}: {d.message})" if d.message else f" (result {i} at {d.index})"
    wide = wider.outputs()
    if d.error <= tol or not np.isfinite(d.error) or i >= len(wide) or \
            wide[i].shape != w.shape:
        return d.error, tol, where, False
    exact = wide[i].astype(np.float64)
    ours = compare(exact, g.astype(np.float64), i, floor=floor).error
    theirs = compare(exact, w.astype(np.float64), i, floor=floor).error
    bound = max(F32_SLACK * theirs, tol)
    return ours, bound, f"{where}; against a float32 run of fn {ours:.3g}, jax.jit(fn)'s " \
                        f"{theirs:.3g}", True


def _cases(program, seed: int):
    """(name, arguments) for the random draws and the special-value case."""
    draws = [_draw(program, seed + k) for k in range(RANDOM_DRAWS)]
    yield from ((f"random {k}", args) for k, args in enumerate(draws))
    special = _specials(program, draws[0])
    if special is not None:
        yield special


def _draw(program, seed: int):
    """Arguments: floats N(0, 1) * scale (halved until jax.jit's results are finite), integers
    small and nonnegative, booleans at random."""
    flat = program.partition.program
    rng = np.random.default_rng(seed)
    normals = [rng.standard_normal(flat.value(v).shape) for v in flat.inputs]
    others = [_non_float(rng, flat.value(v)) for v in flat.inputs]
    scale = 1.0
    for _ in range(SCALE_TRIES):
        leaves = [o if o is not None else (n * scale).astype(flat.value(v).dtype)
                  for v, n, o in zip(flat.inputs, normals, others)]
        args = jax.tree_util.tree_unflatten(flat.in_tree, leaves)
        if all(np.all(np.isfinite(np.asarray(x, np.float64))) for x in
               jax.tree_util.tree_leaves(jax.jit(program.fn)(*args))
               if np.asarray(x).dtype.kind == "f" or np.asarray(x).dtype.name == "bfloat16"):
            return args
        scale /= 2
    return args


def _non_float(rng, value):
    if value.dtype.kind == "b":
        return rng.integers(0, 2, value.shape).astype(bool)
    if value.dtype.kind in "iu":
        return rng.integers(0, 4, value.shape).astype(value.dtype)
    return None


def _specials(program, args):
    """A row of +inf, a row of NaN and a row of zeros in the last float argument with a dim of
    at least 3 (the activations or a cache, after the parameters)."""
    flat = program.partition.program
    leaves = list(jax.tree_util.tree_leaves(args))
    chosen = [i for i, v in enumerate(flat.inputs) if special_axis(flat.value(v).shape) is not None
              and flat.value(v).dtype.name in ("float16", "bfloat16", "float32")
              and len(flat.value(v).shape) >= 2]
    if not chosen:
        return None
    i = chosen[-1]
    leaves[i] = special_rows(leaves[i])
    name = flat.value(flat.inputs[i]).name
    return f"inf/NaN/zero rows in {name}", jax.tree_util.tree_unflatten(flat.in_tree, leaves)


def special_axis(shape) -> int | None:
    """The axis whose first three entries become the special rows: the next-to-last (rows of a
    matrix) where it has 3, else the first that has."""
    rank = len(shape)
    for axis in ([rank - 2] if rank >= 2 else []) + list(range(rank)):
        if shape[axis] >= 3:
            return axis
    return None


def special_rows(x) -> np.ndarray:
    """`x` with its first three rows (along `special_axis`) +inf, NaN and zero."""
    x = np.array(x)
    axis = special_axis(x.shape)
    moved = np.moveaxis(x, axis, 0)
    moved[0], moved[1], moved[2] = np.inf, np.nan, 0.0
    return x
