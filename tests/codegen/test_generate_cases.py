"""One construct per case (tests/codegen/cases.py): every accumulator kind on registers and on tiles,
reductions along every dim, norms, products with M = 8, fp32 operands, bf16, odd sizes, batches, a transposed
input, several outputs, split partials and library ops, each on the CPU harness against the interpreter; all
of them also compile with NVRTC without spills."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mugraph import ir
from mugraph.codegen import compile_cuda, generate
from mugraph.codegen.arch import get_arch
from mugraph.codegen.cpu import build_cpu
from mugraph.codegen.run_cpu import run_plan
from tests.codegen.bundle import build_bundle, bundle_source, custom_names, generate_all, max_rel_error, \
    run_bundled
from tests.codegen.cases import CASES

TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def bundle():
    built = {name: make(0) for name, make in CASES.items()}
    modules = generate_all({name: g for name, (g, _) in built.items()})
    return built, modules, build_bundle(modules)


@pytest.mark.parametrize("name", list(CASES))
def test_case_matches_interpreter(bundle, name):
    built, modules, cpu = bundle
    graph, arrays = built[name]
    ref = ir.interpret(graph, arrays, dtype="float64")
    for schedule, seed in [("rr", 0), ("warpgreedy", 1), ("warpgreedy", 2)]:
        out = run_bundled(modules[name], cpu, arrays, schedule=schedule, seed=seed)
        err = max_rel_error(out, ref)
        assert err <= TOLERANCE, (name, schedule, seed, err)


def test_cases_compile_for_sm_90_without_spills(bundle):
    _, modules, _ = bundle
    kernel = compile_cuda(bundle_source(modules, "sm_90"), "sm_90", name="cases")
    for name in custom_names(modules):
        assert kernel.resources(name).spills == 0, name


def test_transposed_input_is_read_through_strides(bundle):
    """The custom op reads X itself (no library transpose), with scalar loads into the swizzled tile."""
    _, modules, _ = bundle
    plan = modules["transpose_fed"].plan
    assert [k.kind for k in plan.kernels] == ["custom"]
    assert plan.kernels[0].args[:3] == ("X", "W", "R")
    assert "scalar loads" in modules["transpose_fed"].source


def test_each_accumulator_kind_is_covered():
    from mugraph.ir.ops import ACCUMULATORS
    for op in ACCUMULATORS:
        assert f"{op.value}_products" in CASES and f"{op.value}_tiles" in CASES


def fp32_product(seed=0):
    rng = np.random.default_rng(seed)
    X = ir.input("X", (32, 64), "float32")
    W = ir.input("W", (64, 32), "float32")
    b = ir.BlockBuilder(grid=(1, 1, 1), forloop=2)
    out = (b.input(X, fmap=1) @ b.input(W, fmap=0)).acc_sum()
    return ir.KernelGraph(b.finish([(out, None)]), [X, W]), \
        [rng.standard_normal(X.shape).astype(np.float32), rng.standard_normal(W.shape).astype(np.float32)]


@pytest.mark.parametrize("mode,tolerance", [("bf16x3", 1e-4), ("simt", 1e-6)])
def test_fp32_products(mode, tolerance):
    """fp32 x fp32 block matmuls: three bf16 tensor-core products (close to fp32) or exact SIMT fp32."""
    spec = replace(get_arch("sm_80"), fp32_matmul=mode)
    for make in (fp32_product, CASES["matmul_f32_operands"]):
        graph, arrays = make(0)
        module = generate(graph, spec, prefix=f"{mode}_k")
        assert ("in fp32 (SIMT)" in module.source) == (mode == "simt")
        assert ("3 bf16 products" in module.source) == (mode == "bf16x3")
        cpu = build_cpu(module.source, custom_names({"m": module}))
        ref = ir.interpret(graph, arrays, dtype="float64")
        out = run_plan(module, cpu, arrays, schedule="warpgreedy", seed=1)
        limit = tolerance if make is fp32_product else TOLERANCE
        assert max_rel_error(out, ref) <= limit


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_decode_attention_splits_its_keys_keeps_q_in_registers_and_one_max_per_row(arch):
    """The packed decode cases really split their loop (the harness runs the hand-over), keep the query's mma
    fragments in registers across the loop, and publish the online softmax's running max once per row: O, m, l."""
    from mugraph.codegen.schedule import kernel_schedule
    for kind in ("plain", "online"):
        graph, _ = CASES[f"decode_attention_{kind}"](0)
        ((bg, _),) = graph.custom_ops()
        s = kernel_schedule(bg, arch)
        assert s.splits > 1
        assert s.state_bytes == 4 * (64 * 64 + 64 * (2 if kind == "online" else 1))
        src = generate(graph, arch).source
        assert "kept in registers across the loop" in src and "mg_atomic_inc" in src
