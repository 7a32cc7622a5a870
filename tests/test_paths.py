"""Every launch plan right on every path: each bundled workload (its hand-written graph and the search's winner,
at shapes whose plan splits its loop over CTAs and at shapes whose plan does not) and every winner of the
generality suite, run by ``Kernel.run_reference`` (the interpreter, float64), ``Kernel.run_on_cpu`` (the
generated CUDA on the CPU harness), ``Kernel.as_jax("harness")`` under ``jax.jit`` and ``mugraph.jit(...,
backend="harness")`` under ``jax.jit``. On random inputs run_on_cpu agrees with run_reference within the output
dtype's tolerance (and run_reference with the program's spec: the case computes its program); on those and on
inputs holding IEEE special values, as_jax and mugraph.jit agree with run_on_cpu to a few roundings (they run the
same kernels). Every comparison also wants NaN and ±inf at the same places.

A split plan's partials and counters are workspace its launchers own (``codegen.plan.Buffer``): they must never
reach JAX as values (filled with NaN by a callback, uninitialised by XLA), which gave all-NaN outputs here.

Arch: every path generates for the kernel's target GPU, so the harness runs what that GPU would. The workload
cases target h100 (sm_90a: the TMA pipeline with its producer warpgroup, mbarriers, wgmma where the model takes it,
tensor maps encoded for the harness), the generality winners a100 (sm_80: cp.async + mma.sync), so the matrix
covers both code paths at the cost of one build per case; ``test_the_matrix_runs_sm_90a_s_tma_and_wgmma_code``
checks the first claim.

Cost: every case builds its kernels once on the CPU harness (run_on_cpu, as_jax and mugraph.jit share the
build), at small shapes; the generality winners are stored (tests/generality_winners.py), not searched. The
``mugraph.jit`` column takes each case's graph as the search's answer (the search itself is tested elsewhere;
``test_mugraph_jit_searches_a_split_plan_and_runs_it_right`` runs one real search end to end).
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Callable

import jax
import numpy as np
import pytest

import mugraph
import mugraph.api
from mugraph import generality, ir, workloads
from mugraph.api import Kernel
from mugraph.codegen import generate
from mugraph.ir import DType
from mugraph.jax_integration import flatten_function
from tests import generality_winners

SEARCHED = Path(__file__).resolve().parents[1] / "kernels_generated"

# Shapes whose plan splits the hand-written graph's loop where the small shapes do not (a grid of one block, a long
# loop), and shapes whose plan does not where the small shapes do (one loop trip); the searched winners split at
# the small shapes when sized with the fewest blocks. test_the_matrix_covers... checks each claim.
SPLIT_SHAPES = {
    "rmsnorm_linear": dict(X=(16, 2048), W=(2048, 64)),
    "gated_mlp": dict(X=(8, 1024), W1=(1024, 64), W2=(1024, 64)),
    "lora": dict(X=(16, 1024), W=(1024, 256), A=(1024, 16), B=(16, 256)),
}
_ONE_TRIP_ATTENTION = dict(Q=(2, 128, 64), K=(2, 64, 128), V=(2, 128, 64))
UNSPLIT_SHAPES = {
    "lora": dict(X=(16, 64), W=(64, 256), A=(64, 16), B=(16, 256)),
    "gqa": _ONE_TRIP_ATTENTION, "gqa_safe": _ONE_TRIP_ATTENTION, "qknorm_gqa": _ONE_TRIP_ATTENTION,
}
# Searched winners the cost model sizes to a split plan at their small shapes (the issue-aware split choice), and
# shapes at which it does not: qknorm_gqa's structure walks keys 8 at a time, so 32 keys (4 trips) stay unsplit.
UNSPLIT_SEARCHED_SHAPES = {"gqa": _ONE_TRIP_ATTENTION, "gqa_safe": _ONE_TRIP_ATTENTION,
                           "qknorm_gqa": dict(Q=(2, 128, 64), K=(2, 64, 32), V=(2, 32, 64))}
# Structures with no loop to split (forloop 1 at every size): no split case exists.
UNLOOPED = {("ntrans", "reference"), ("lora", "searched"), ("ntrans", "searched")}

# Against the float64 interpreter: the kernel rounds to its own dtypes (fp32 accumulation, fp16/bf16 storage).
TOLERANCE = {DType.FLOAT16: 1e-2, DType.BFLOAT16: 2e-2, DType.FLOAT32: 1e-3}
# Between harness paths (the same kernels; library launches by NumPy or by XLA): a few roundings.
ROUNDINGS = 4


@dataclasses.dataclass(frozen=True)
class Case:
    """One graph at one set of shapes, the JAX program it computes, and inputs for it."""

    graph: ir.KernelGraph
    spec: ir.KernelGraph
    fn: Callable
    inputs: list
    special_inputs: list
    target: str = "h100"  # the GPU whose code the harness runs (see the module docstring)


def _case(graph, program, seed: int = 0, target: str = "h100") -> Case:
    inputs = program.random_inputs(seed)
    return Case(graph, program.spec(), program.fn, inputs, _with_specials(inputs), target)


def _with_specials(inputs: list, seed: int = 1) -> list:
    """``inputs`` with a few elements of the first one set to NaN, ±inf, ±0 and a large finite value."""
    rng = np.random.default_rng(seed)
    out = [a.copy() for a in inputs]
    first = out[0].reshape(-1)
    big = np.finfo(first.dtype).max / 4
    for value in (np.nan, np.inf, -np.inf, 0.0, -0.0, big):
        first[rng.integers(first.size)] = value
    return out


# ---- the cases ------------------------------------------------------------------------------------------------
def _at(w, shapes: dict):
    return dataclasses.replace(w, shapes=dict(shapes))


def _searched(name: str) -> ir.KernelGraph:
    return ir.from_json((SEARCHED / name / "searched" / "graph.json").read_text(encoding="utf-8"))


def _sized(name: str, shapes: dict, split: bool) -> ir.KernelGraph:
    """The search's winner (found at the full shapes) sized for ``shapes``: as the cost model ranks the sizings
    (``split`` False), or with the fewest blocks whose plan splits the loop (``split`` True; the cost model
    prefers wide grids at small shapes). ``test_every_path_runs_the_plan_right`` checks it against the spec."""
    from mugraph.search.buckets import derived_constants
    from mugraph.search.cost import estimate, fits
    from mugraph.search.instantiate import resize
    from mugraph.search.sizing import block_options, size_structure
    w = workloads.get(name)
    old, new = w.spec(), _at(w, shapes).spec()
    graph, constants = _searched(name), derived_constants(old, new)
    if not split:
        ranked = size_structure(graph, list(new.inputs), constants, "h100", estimate, lambda g: fits(g, "h100"))
        assert ranked, f"{name}: the searched structure does not re-size to {shapes}"
        return ranked[0][1]
    (key,) = graph.custom_ops()
    sources = []

    def sources_only(_key, srcs):  # the kernel's real-shape sources; None stops the rebuild there
        sources.append(srcs)
        return None

    resize(graph, list(new.inputs), sources_only, constants)
    for grid, trips in sorted(block_options(key[0], sources[0]), key=lambda o: (np.prod(o[0]), -o[1])):
        sized = resize(graph, list(new.inputs), lambda k, s: (grid, trips), constants)
        if sized is not None and fits(sized.custom_ops()[0][0], "h100") and _splits(sized):
            return sized
    raise AssertionError(f"{name}: no sizing of the searched structure at {shapes} splits its loop")


def _splits(graph) -> bool:
    return bool(generate(graph, "sm_80").plan.workspace)


def _workload_builders() -> dict:
    builders = {}
    for name in workloads.names():
        w = workloads.get(name)
        small = w.small()
        builders[f"{name}/reference/small"] = lambda w=small: _case(w.reference(), w)
        builders[f"{name}/searched/small"] = lambda name=name, w=small: _case(_sized(name, w.shapes, False), w)
        if (name, "searched") not in UNLOOPED:
            builders[f"{name}/searched/split"] = lambda name=name, w=small: _case(_sized(name, w.shapes, True), w)
        for label, table in (("split", SPLIT_SHAPES), ("unsplit", UNSPLIT_SHAPES)):
            if name in table:
                at = _at(w, table[name])
                builders[f"{name}/reference/{label}"] = lambda w=at: _case(w.reference(), w)
        if name in UNSPLIT_SEARCHED_SHAPES:
            at = _at(w, UNSPLIT_SEARCHED_SHAPES[name])
            builders[f"{name}/searched/unsplit"] = lambda name=name, w=at: _case(_sized(name, w.shapes, False), w)
    return builders


def _generality_builders() -> dict:
    return {f"generality/{name}": (lambda name=name: _case(_stored_winner(name), generality.get(name).small(),
                                                           target="a100"))
            for name in generality.names()}


@functools.cache
def _stored() -> dict:
    return generality_winners.load()


def _stored_winner(name: str) -> ir.KernelGraph:
    assert name in _stored(), f"no stored winner for {name}: run python -m tests.generality_winners"
    return _stored()[name]


BUILDERS = {**_workload_builders(), **_generality_builders()}


@functools.cache
def case(case_id: str) -> Case:
    return BUILDERS[case_id]()


# ---- comparing ------------------------------------------------------------------------------------------------
def _outputs(value) -> list:
    return [np.asarray(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _same_specials(what: str, got: np.ndarray, want: np.ndarray) -> None:
    for name, where in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        mismatch = where(got) != where(want)
        assert not mismatch.any(), (f"{what}: {name} at {int(mismatch.sum())} of {got.size} elements where the "
                                    f"other run differs (first at {np.argwhere(mismatch)[0].tolist()})")


def assert_agree(what: str, got, want, dtypes, tolerance: Callable) -> None:
    """Each output of ``got`` within ``tolerance(dtype)`` of ``want``'s relative to its finite scale, and with
    NaN and ±inf at the same places."""
    got, want = _outputs(got), _outputs(want)
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for i, (g, w, dtype) in enumerate(zip(got, want, dtypes)):
        assert g.shape == w.shape, f"{what} output {i}: shape {g.shape}, expected {w.shape}"
        g, w = g.astype(np.float64), w.astype(np.float64)
        _same_specials(f"{what} output {i}", g, w)
        finite = np.isfinite(w)
        if not finite.any():
            continue
        scale = max(float(np.abs(w[finite]).max()), 1e-30)
        error = float(np.abs(g[finite] - w[finite]).max()) / scale
        assert error <= tolerance(dtype), (f"{what} output {i}: max error {error:.2e} of the output scale, "
                                           f"tolerance {tolerance(dtype):.1e}")


def _roundings(dtype: DType) -> float:
    return ROUNDINGS * float(np.finfo(dtype.numpy).eps)


# ---- the paths ------------------------------------------------------------------------------------------------
def _through_mugraph_jit(c: Case, kernel: Kernel, monkeypatch) -> Callable:
    """``mugraph.jit(c.fn, backend="harness")``, whose search answers with ``kernel``'s graph: the plan
    (``mugraph.api._plan``) is the real one, and it must take the function whole as one kernel."""
    calls = []

    def answer(plan, config, **options):
        calls.append(plan)
        assert plan[0] == "kernel", f"mugraph.jit cut {c.fn.__name__} into regions: {plan[1]!r}"
        return Kernel(kernel.graph, c.spec, target=kernel.target, fn=plan[2])

    monkeypatch.setattr(mugraph.api, "_build", answer)
    f = mugraph.jit(c.fn, backend="harness")
    f.calls = calls
    return f


@pytest.mark.parametrize("case_id", list(BUILDERS))
def test_every_path_runs_the_plan_right(case_id, monkeypatch):
    c = case(case_id)
    kernel = Kernel(c.graph, c.spec, target=c.target)
    dtypes = [o.dtype for o in c.graph.outputs]
    as_jax = jax.jit(kernel.as_jax("harness"))
    via_jit = _through_mugraph_jit(c, kernel, monkeypatch)
    jitted = jax.jit(via_jit)
    for inputs, label in ((c.inputs, "random inputs"), (c.special_inputs, "special values")):
        cpu = kernel.run_on_cpu(*inputs)
        runs = {"as_jax('harness') under jax.jit": as_jax(*inputs),
                "mugraph.jit(backend='harness') under jax.jit": jitted(*inputs)}
        if label == "random inputs":
            want = kernel.run_reference(*inputs)
            assert_agree(f"{case_id}: the graph against its program (float64)", want, ir.interpret(c.spec, inputs),
                         dtypes, TOLERANCE.get)
            assert_agree(f"{case_id} run_on_cpu, {label}", cpu, want, dtypes, TOLERANCE.get)
        for path, got in runs.items():
            assert_agree(f"{case_id} {path}, {label}", got, cpu, dtypes, _roundings)
    assert len(via_jit.calls) == 1, "mugraph.jit compiles once per input signature"


def test_the_matrix_runs_sm_90a_s_tma_and_wgmma_code(monkeypatch):
    """The workload cases' kernels, as every harness path generates them, are sm_90a's: most stream their loop by
    TMA (tensor maps, a producer warpgroup), the attention ones multiply on wgmma; run_on_cpu and as_jax build
    the same source (one build per case)."""
    import mugraph.codegen
    from mugraph.jax_integration import _launcher
    ids = [i for i in BUILDERS if not i.startswith("generality/")]
    modules = {i: _launcher(Kernel(case(i).graph, case(i).spec, target=case(i).target), "harness", True)[0]
               for i in ids}
    assert {m.arch for m in modules.values()} == {"sm_90a"}
    tma = [i for i, m in modules.items() if any(k.tensor_maps for k in m.plan.kernels)]
    wgmma = [i for i, m in modules.items() if "mg_wgmma" in m.source]
    split = [i for i in tma if modules[i].plan.workspace]
    assert len(tma) >= 12 and len(wgmma) >= 6 and split, (tma, wgmma, split)
    for i in tma:
        (launch,) = [k for k in modules[i].plan.kernels if k.kind == "custom"]
        assert launch.block[0] == _block_threads(case(i).graph) + 128, i  # the producer warpgroup launches
    seen = []
    real = mugraph.codegen.run_on_cpu
    monkeypatch.setattr(mugraph.codegen, "run_on_cpu", lambda graph, arrays, **kw: seen.append(kw) or
                        real(graph, arrays, **kw))
    c = case(tma[0])
    Kernel(c.graph, c.spec, target=c.target).run_on_cpu(*c.inputs)
    assert seen == [{"arch": "sm_90a"}]


def _block_threads(graph) -> int:
    (bg, _), = graph.custom_ops()
    return bg.threads


@pytest.mark.parametrize("name", generality.names())
def test_each_stored_generality_winner_still_computes_its_program(name):
    from mugraph.verify import quick_equivalent
    program = generality.get(name).small()
    assert quick_equivalent(program.spec(), _stored_winner(name), tests=1, seed=7), \
        f"{name}: the stored winner no longer computes the program; run python -m tests.generality_winners"


@pytest.mark.parametrize("name", workloads.names())
def test_the_matrix_covers_split_and_unsplit_plans_of_every_workload(name):
    """The workload has a case whose plan splits a loop and one whose plan does not, for the hand-written graph
    and the searched winner, except where the structure has no loop (forloop 1 at every size)."""
    for source in ("reference", "searched"):
        plans = {i: _splits(case(i).graph) for i in BUILDERS if i.startswith(f"{name}/{source}/")}
        if (name, source) in UNLOOPED:
            assert case(f"{name}/{source}/small").graph.custom_ops()[0][0].forloop == 1
            assert not any(plans.values()), f"{name}/{source} splits after all: add its split case"
            continue
        assert any(plans.values()), f"{name}/{source}: no case splits ({sorted(plans)}): change SPLIT_SHAPES"
        assert not all(plans.values()), f"{name}/{source}: every case splits ({sorted(plans)}): change UNSPLIT_SHAPES"


def test_a_plans_workspace_is_the_launchers_never_a_value_the_caller_or_jax_sees():
    """Across the matrix's split plans: workspace buffers (partials, then counters, which alone start zeroed)
    belong to one launch each, are no plan output, and never become a JAX value (the primitive's results)."""
    from mugraph.jax_integration import CustomStep, plan_steps
    split = [i for i in BUILDERS if not i.startswith("generality/") and _splits(case(i).graph)]
    assert len(split) >= 8, split
    for case_id in split:
        plan = generate(case(case_id).graph, "sm_80").plan
        assert [b.role for b in plan.workspace][:2] == ["scratch", "counters"], case_id
        assert [b.zero_init for b in plan.workspace] == [b.role == "counters" for b in plan.workspace]
        names = {b.name for b in plan.workspace}
        assert not names & set(plan.outputs) and not names & set(plan.inputs)
        users = [k for k in plan.kernels for a in k.args if a in names]
        assert len(users) == len(names), f"{case_id}: a workspace buffer shared between launches"
        for step in (s for s in plan_steps(plan) if isinstance(s, CustomStep)):
            assert not {b.name for b in step.workspace} & set(step.writes + step.reads), case_id


def test_mugraph_jit_searches_a_split_plan_and_runs_it_right(tmp_path):
    """One real search end to end: a short, long-looped matmul whose winner's plan splits, inside jax.jit."""
    from mugraph.search import SearchConfig

    def layer(x, w):
        return jax.nn.relu(x @ w)

    f = mugraph.jit(layer, backend="harness", cache=tmp_path,
                    config=SearchConfig(max_kernel_ops=1, budget_states=300, budget_seconds=60))
    rng = np.random.default_rng(0)
    # K = 16384: at 8192 the model ranks a one-trip kernel (the whole K per CTA, no loop to split) 0.2 us first
    x = (rng.standard_normal((16, 16384)) * 0.5).astype(np.float16)
    w = (rng.standard_normal((16384, 64)) * 0.5).astype(np.float16)
    got = np.asarray(jax.jit(f)(x, w), np.float64)
    (kernel,) = f.kernels.values()
    assert kernel.graph.custom_ops() and _splits(kernel.graph), str(kernel.graph)
    want = np.asarray(jax.jit(layer)(x.astype(np.float32), w.astype(np.float32)), np.float64)
    assert_agree("mugraph.jit with a split plan", got, want, [DType.FLOAT16], TOLERANCE.get)
