"""Kernels inside JAX: a mugraph kernel under jax.jit, jax.grad and jax.vmap on the CPU harness,
and the CUDA path's custom call traced and lowered without a GPU: its attributes (sm_90a's tensor
maps and clusters included) decoded by the FFI handler's own code on the CPU (`mugraph_describe`)
into the launch it would make, and its tensor-map encoding arguments against `TensorMapSpec`'s."""
from __future__ import annotations

import ctypes
import hashlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import workloads
from mugraph.api import Kernel
from mugraph.errors import InvalidInput, NoDevice
from mugraph.ir import interpret
from mugraph.jax_integration import as_jax, graph_function, jax_has_gpu
from mugraph.search import SearchConfig

QUICK = SearchConfig(max_kernel_ops=1, budget_seconds=60)


def layer(x, w):
    return jax.nn.relu(x @ w) * 2.0


@pytest.fixture(scope="module")
def jitted_layer():
    return mugraph.jit(layer, backend="harness", config=QUICK)


@pytest.fixture(scope="module")
def data():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (64, 32)) / 8, "w2": jax.random.normal(k2, (32, 8))}
    return params, jax.random.normal(k3, (16, 64))


def test_a_model_with_a_kernel_inside_matches_pure_jax_under_jit_and_grad(jitted_layer, data):
    params, x = data

    def model(p, x, f):
        return jnp.sum(jnp.tanh(f(x, p["w1"]) @ p["w2"]))

    loss, grads = jax.jit(jax.value_and_grad(lambda p, x: model(p, x, jitted_layer)))(params, x)
    want_loss, want = jax.value_and_grad(lambda p, x: model(p, x, layer))(params, x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-4)
    for name in ("w1", "w2"):  # w2's gradient reads the kernel's forward output
        scale = float(jnp.abs(want[name]).max())
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-3, atol=2e-3 * scale)
    kernel = next(iter(jitted_layer.kernels.values()))
    assert kernel.graph.custom_ops(), "the layer runs as a generated kernel"


def test_the_kernel_runs_inside_the_jitted_program(jitted_layer, data):
    params, x = data
    jaxpr = str(jax.make_jaxpr(lambda x: jitted_layer(x, params["w1"]))(x))
    assert "pure_callback" in jaxpr


def test_vmap_runs_the_kernel_per_batch_element(jitted_layer, data):
    params, x = data
    xs = jnp.stack([x, -x, 2 * x])
    got = jax.jit(jax.vmap(lambda xi: jitted_layer(xi, params["w1"])))(xs)
    want = jax.vmap(lambda xi: layer(xi, params["w1"]))(xs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_forward_value_is_the_kernels_not_the_specs():
    # a kernel whose graph computes something else than its spec: as_jax must show the graph's
    # values (the kernel ran), while the gradient still comes from the spec
    w = workloads.get("ntrans").small()
    spec, other = w.spec(), workloads.get("ntrans").small().reference()
    arrays = w.random_inputs(0)
    wrong = Kernel(_negated(other), spec)
    got = as_jax(wrong, "harness")(*arrays)
    np.testing.assert_allclose(np.asarray(got, np.float32),
                               -np.asarray(interpret(other, arrays)[0], np.float32),
                               rtol=2e-2, atol=2e-2)


def _negated(graph):
    from mugraph.ir import KernelGraph, KNode, TOp
    outs = [KNode(TOp.NEG, (o,), None) for o in graph.outputs]
    return KernelGraph(outs, graph.inputs, graph.output_names)


def test_graph_function_agrees_with_the_interpreter_on_every_workload_spec():
    for name in workloads.names():
        w = workloads.get(name).small()
        spec = w.spec()
        arrays = w.random_inputs(1)
        got = jax.jit(graph_function(spec))(*arrays)
        want = interpret(spec, arrays, dtype="own")
        for g, e in zip(got, want):
            scale = max(float(np.abs(e.astype(np.float32)).max()), 1e-3)
            assert np.abs(np.asarray(g, np.float32) - e.astype(np.float32)).max() <= 2e-2 * scale, name


def _lowered_calls(kernel) -> list[str]:
    f = as_jax(kernel, "cuda", require_device=False)
    specs = [jax.ShapeDtypeStruct(n.shape, n.dtype.numpy) for n in kernel.graph.inputs]
    text = jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
    return [line for line in text.splitlines() if "stablehlo.custom_call @mugraph_launch" in line]


def _attribute(call: str, name: str) -> str:
    return re.search(rf"\b{name} = (\"[^\"]*\"|dense<[^>]*>|-?\d+)", call).group(1)


def test_a_split_plan_lowers_with_its_workspace_as_attributes_not_as_xla_results():
    from mugraph.codegen import generate
    import dataclasses
    # a 16-trip loop on 4 blocks: the model splits it (lora's small shapes, 2 trips, stay unsplit)
    w = dataclasses.replace(workloads.get("lora").small(),
                            shapes=dict(X=(16, 1024), W=(1024, 256), A=(1024, 16), B=(16, 256)))
    kernel = Kernel(w.reference(), w.spec())  # target h100: sm_90a
    plan = generate(kernel.graph, "sm_90a").plan
    workspace = plan.workspace
    assert [b.role for b in workspace] == ["scratch", "counters"]  # this lora plan splits its loop
    (call,) = _lowered_calls(kernel)
    assert "@mugraph_launch_ws(" in call
    assert call.rstrip().endswith("-> tensor<16x256xf16>")  # one result: the output, no partials
    assert _attribute(call, "workspace_bytes") == f"dense<{[b.nbytes for b in workspace]}>"
    assert _attribute(call, "workspace_zero") == "dense<[0, 1]>"  # counters zeroed, partials not
    assert _attribute(call, "param_kind") == "dense<[0, 0, 0, 0, 1, 2, 2]>"  # 4 operands, 1 result, 2 workspace


def test_a_plan_without_workspace_lowers_to_the_command_buffer_compatible_target():
    w = workloads.get("ntrans").small()
    kernel = Kernel(w.reference(), w.spec())
    (call,) = _lowered_calls(kernel)
    assert "@mugraph_launch(" in call and "workspace" not in call
    assert _attribute(call, "param_kind") == "dense<[0, 0, 0, 1]>"


def test_the_custom_call_names_its_module_by_content_the_same_in_every_process():
    from mugraph.codegen import generate
    from mugraph.codegen.compile import compile_cuda
    from mugraph.jax_ffi import module_name
    lora, ntrans = (workloads.get(n).small() for n in ("lora", "ntrans"))
    compiled = compile_cuda(generate(lora.reference(), "sm_90a").source, "sm_90a", name="mugraph_kernel")
    want = module_name(compiled.cubin, compiled.ptx)
    assert want == hashlib.sha256(compiled.cubin + b"\0" + compiled.ptx.encode()).hexdigest()
    first = _attribute(_lowered_calls(Kernel(lora.reference(), lora.spec()))[0], "module")
    again = _attribute(_lowered_calls(Kernel(lora.reference(), lora.spec()))[0], "module")
    other = _attribute(_lowered_calls(Kernel(ntrans.reference(), ntrans.spec()))[0], "module")
    assert first == again == f'"{want}"' and other != first  # no per-process counter in the call


@pytest.fixture(scope="module")
def real_cubin():
    from mugraph.codegen.compile import compile_cuda
    source = 'extern "C" __global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }'
    return compile_cuda(source, "sm_90", name="scale")


def test_the_ffi_handler_accepts_a_real_cubin_and_refuses_anything_else(tmp_path, real_cubin):
    from mugraph.jax_ffi import (TARGETS, _loads, build_handler, find_module, handler_library,
                                 module_name, register_module, registry_dir)
    lib = ctypes.CDLL(str(build_handler()))
    for initialize, execute in TARGETS.values():
        assert getattr(lib, initialize) and getattr(lib, execute)
    garbage = tmp_path / "mugraph_launch-x.so"
    garbage.write_bytes(b"garbage")  # a damaged build counts as missing: it is removed and rebuilt
    assert not _loads(garbage) and not garbage.exists()

    name = register_module(real_cubin.cubin, real_cubin.ptx)
    assert name == module_name(real_cubin.cubin, real_cubin.ptx)
    assert register_module(real_cubin.cubin, real_cubin.ptx) == name
    assert find_module(name) is None  # the handler has it
    assert (registry_dir() / f"{name}.cubin").read_bytes() == real_cubin.cubin
    for blob in (b"\x7fELF not really a cubin", real_cubin.cubin[:16], b""):
        with pytest.raises(InvalidInput, match="not a CUBIN"):
            register_module(blob)
    elf_for_x86 = bytearray(real_cubin.cubin)
    elf_for_x86[18:20] = (62).to_bytes(2, "little")  # EM_X86_64: an ELF, but not for a GPU
    with pytest.raises(InvalidInput, match="not a CUBIN"):
        register_module(bytes(elf_for_x86))
    # the handler's own checks, for callers that skip Python's
    register = handler_library().mg_register_module
    assert register(b"0" * 64, bytes(elf_for_x86), len(elf_for_x86), b"", 0) == -2
    assert register(b"not-a-hash", real_cubin.cubin, len(real_cubin.cubin), b"", 0) == -1


def test_a_process_that_never_registered_a_module_loads_it_from_the_registry(real_cubin):
    from mugraph.jax_ffi import _write_registry, find_module, module_name
    ptx = real_cubin.ptx + "\n// another module: same CUBIN, other PTX\n"
    name = module_name(real_cubin.cubin, ptx)
    missing = hashlib.sha256(b"no such module").hexdigest()
    why = find_module(missing)
    assert missing in why and "as_jax('cuda')" in why and "MUGRAPH_CACHE_DIR" in why
    assert "not a SHA-256" in find_module("42")
    _write_registry(name, real_cubin.cubin, ptx)  # what another process left in the cache
    assert find_module(name) is None


@pytest.mark.skipif(jax_has_gpu(), reason="checks the no-GPU path")
def test_cuda_backend_without_a_gpu_names_the_harness():
    w = workloads.get("lora").small()
    with pytest.raises(NoDevice, match="harness"):
        Kernel(w.reference(), w.spec()).as_jax("cuda")


def test_bad_backend_and_bad_inputs_are_typed_errors():
    w = workloads.get("lora").small()
    kernel = Kernel(w.reference(), w.spec())
    with pytest.raises(InvalidInput, match="unknown backend"):
        kernel.as_jax("tpu")
    with pytest.raises(InvalidInput, match="unknown backend"):
        mugraph.jit(layer, backend="gpu")
    f = kernel.as_jax("harness")
    arrays = w.random_inputs(0)
    with pytest.raises(InvalidInput, match="(?s)dtype float32.*astype"):
        f(*[a.astype(np.float32) for a in arrays])
    with pytest.raises(InvalidInput, match="shape"):
        f(arrays[0][:8], *arrays[1:])
    with pytest.raises(InvalidInput, match="takes 4 inputs"):
        f(*arrays[:3])


# ---- sm_90a launches: tensor maps, producer warpgroup, clusters, as the FFI handler decodes them -----------------
def _steps(graph, arch="sm_90a"):
    from mugraph.codegen import generate
    from mugraph.jax_integration import CustomStep, plan_steps
    plan = generate(graph, arch).plan
    return plan, [s for s in plan_steps(plan) if isinstance(s, CustomStep)]


def _described(plan, step, inputs) -> list[int]:
    """The handler's description of `step`'s launch on `inputs` (XLA on the CPU hands it real buffers)."""
    from mugraph.jax_ffi import describe_launch
    buffers = {b.name: b for b in plan.buffers}
    results = [jax.ShapeDtypeStruct(buffers[w].shape, buffers[w].dtype.numpy) for w in step.writes]
    words = jax.jit(lambda *a: describe_launch(step, a, results))(*inputs)
    return [int(v) for v in np.asarray(words).view(np.uint64)]


def _parse(words: list[int]) -> dict:
    ex, grid, block, smem, cluster = words[0], words[1:4], words[4:7], words[7], words[8:11]
    n = words[11]
    pointers, rest = words[12:12 + n], words[12 + n:]
    maps, at = [], 1
    for _ in range(rest[0]):
        rank = rest[at + 1]
        size = 3 + 4 * rank - 1 + 4
        maps.append(tuple(rest[at:at + size]))
        at += size
    return dict(ex=ex, grid=tuple(grid), block=tuple(block), smem=smem, cluster=tuple(cluster), pointers=pointers,
                maps=maps)


@pytest.mark.parametrize("name", ["rmsnorm_linear", "gqa_safe", "lora"])
def test_the_handler_decodes_each_tensor_map_for_the_buffer_xla_hands_it(name):
    """Through XLA (on the CPU): the call's attributes, decoded by the handler, give the kernel's pointers in
    order and, per tensor map, cuTensorMapEncodeTiled's arguments at the address of the buffer it views: the
    same arguments TensorMapSpec.driver_args gives for that address (what the CuPy launcher encodes)."""
    from mugraph.jax_ffi import _slots
    w = workloads.get(name).small()
    plan, (step,) = _steps(w.reference())
    launch = step.launch
    assert launch.tensor_maps, f"{name}: the sm_90a plan takes no tensor maps"
    inputs = w.random_inputs(0)
    got = _parse(_described(plan, step, inputs))
    assert (got["grid"], got["block"], got["smem"]) == (launch.grid, launch.block, launch.smem_bytes)
    assert launch.block[0] == 128 + _custom_block(w.reference()).threads  # the producer warpgroup launches too
    assert got["cluster"] == (1, 1, 1) and got["ex"] == 0
    assert len(got["pointers"]) == len(launch.args)
    slots = _slots(step)
    pointer_of = {name: got["pointers"][launch.args.index(name)] for name in launch.args}
    buffers = [pointer_of[a] for a in (*step.reads, *step.writes)]  # workspace: 0 here (no allocator)
    assert 0 not in buffers and len(set(buffers)) == len(buffers)
    for spec, decoded in zip(launch.tensor_maps, got["maps"], strict=True):
        assert slots[spec.buffer][0] == 0  # maps view operands
        assert decoded == spec.driver_args(pointer_of[spec.buffer]).flat(), spec


def _custom_block(graph):
    (bg, _), = graph.custom_ops()
    return bg


def test_a_clustered_launch_is_described_as_cuLaunchKernelEx_with_its_cluster():
    """A launch in thread-block clusters goes through cuLaunchKernelEx with the cluster attribute (the
    plan's cluster travels as an attribute); the same launch without one through cuLaunchKernel."""
    import dataclasses
    w = workloads.get("gqa").small()
    plan, (step,) = _steps(w.reference())
    grid = step.launch.grid
    cluster = (2, 1, 1) if grid[0] % 2 == 0 else (1, 2, 1)
    clustered = dataclasses.replace(step, launch=dataclasses.replace(step.launch, cluster=cluster))
    got = _parse(_described(plan, clustered, w.random_inputs(0)))
    assert got["ex"] == 1 and got["cluster"] == cluster and got["grid"] == grid


@pytest.mark.parametrize("cluster,message", [((3, 1, 1), "whole number of clusters"),
                                             ((0, 1, 1), "whole number of clusters"),
                                             ((2, 2, 8), "at most 16 blocks")])
def test_the_handler_refuses_a_cluster_that_does_not_tile_the_grid(cluster, message):
    import dataclasses
    w = workloads.get("gqa").small()
    plan, (step,) = _steps(w.reference())
    grid = tuple(c * 8 for c in (2, 2, 8))
    bad = dataclasses.replace(step, launch=dataclasses.replace(step.launch, cluster=cluster,
                                                               grid=grid if "16" in message else step.launch.grid))
    with pytest.raises(Exception, match=message):
        _described(plan, bad, w.random_inputs(0))


def _maps_of_every_kind():
    from mugraph.codegen.hopper_layouts import SWIZZLE_32B, SWIZZLE_64B, SWIZZLE_128B, SWIZZLE_NONE
    from mugraph.codegen.tma import TensorMapSpec
    from mugraph.ir import DType
    specs = [TensorMapSpec("a", DType.FLOAT16, (64,), (2,), (64,), SWIZZLE_128B),
             TensorMapSpec("a", DType.BFLOAT16, (96, 40), (2, 192), (16, 8), SWIZZLE_32B),
             TensorMapSpec("a", DType.FLOAT32, (16, 4, 7), (4, 64, 256), (16, 4, 1), SWIZZLE_64B),
             TensorMapSpec("a", DType.FLOAT16, (8, 3, 5, 9), (2, 16, 48, 240), (8, 1, 5, 2), SWIZZLE_NONE),
             TensorMapSpec("a", DType.FLOAT32, (4, 2, 3, 2, 70000), (4, 16, 32, 96, 192), (4, 2, 3, 2, 256),
                           SWIZZLE_NONE)]
    for name in workloads.names():
        for k in _steps(workloads.get(name).reference())[0].kernels:
            specs.extend(k.tensor_maps)
    return specs


def test_the_handlers_encoding_arguments_are_tensor_map_specs_for_every_rank_dtype_and_swizzle():
    from mugraph.jax_ffi import tensor_map_args
    specs = _maps_of_every_kind()
    assert {s.rank for s in specs} == {1, 2, 3, 4, 5} and len({s.swizzle.width for s in specs}) == 4
    for i, spec in enumerate(specs):
        address = 0x7F0000000000 + 1024 * i
        assert tensor_map_args((0, i % 3, *spec.record()), address) == spec.driver_args(address).flat(), spec


def test_the_driver_enums_in_the_records_are_cuda_h_s():
    """DRIVER_DTYPE, the swizzle codes and the fixed enums agree with cuda-bindings' CUtensorMap enums (generated
    from cuda.h), so the handler (which has no CUDA headers) passes the driver the values it means."""
    driver = pytest.importorskip("cuda.bindings.driver")
    from mugraph.codegen import hopper_layouts as hl
    from mugraph.codegen import tma
    from mugraph.ir import DType
    names = {DType.FLOAT16: "FLOAT16", DType.BFLOAT16: "BFLOAT16", DType.FLOAT32: "FLOAT32"}
    for dtype, value in tma.DRIVER_DTYPE.items():
        assert int(getattr(driver.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{names[dtype]}")) == value
    for mode, name in ((hl.SWIZZLE_NONE, "NONE"), (hl.SWIZZLE_32B, "32B"), (hl.SWIZZLE_64B, "64B"),
                       (hl.SWIZZLE_128B, "128B")):
        assert int(getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{name}")) == mode.tma_code
    assert int(driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B) == tma.L2_PROMOTION_128B
    assert int(driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE) == tma.INTERLEAVE_NONE
    assert int(driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == tma.OOB_FILL_NONE


@pytest.mark.parametrize("change,message", [
    (lambda r: r[:-1], "record holds 28 values"),
    (lambda r: [r[0], r[1], r[2], 0, *r[4:]], "rank 0 is not 1..5"),
    (lambda r: [r[0], r[1], r[2], 6, *r[4:]], "rank 6 is not 1..5"),
    (lambda r: [5, *r[1:]], "unknown buffer kind 5"),
    (lambda r: [*r[:9], 24, *r[10:]], "stride not a positive multiple of 16"),
    (lambda r: [*r[:14], 300, *r[15:]], "box extent"),
    (lambda r: [*r[:25], 9, *r[26:]], "swizzle"),
])
def test_the_handler_refuses_a_malformed_record_naming_the_field(change, message):
    from mugraph.jax_ffi import tensor_map_args
    spec = _maps_of_every_kind()[2]  # rank 3: strides at 9 and 10, box from 14, swizzle at 25
    record = list((0, 1, *spec.record()))
    with pytest.raises(InvalidInput, match=message):
        tensor_map_args(change(record), 4096)


def test_a_launch_without_maps_or_clusters_lowers_them_empty_and_the_handler_reads_them_so():
    w = workloads.get("ntrans").small()  # sm_90a takes the cp.async path here: no loop to stream
    kernel = Kernel(w.reference(), w.spec())
    (call,) = _lowered_calls(kernel)
    assert "tensor_maps = dense<>" in call and "cluster = dense<1>" in call, call
    plan, (step,) = _steps(kernel.graph)
    got = _parse(_described(plan, step, w.random_inputs(0)))
    assert got["maps"] == [] and got["ex"] == 0 and len(got["pointers"]) == len(step.launch.args)


def test_a_tma_plan_lowers_with_its_tensor_maps_and_its_producer_warpgroup():
    from mugraph.jax_ffi import tensor_map_records
    w = workloads.get("gqa_safe").small()   # (gqa's small plan: cp.async, split 8 ways, the model's choice)
    kernel = Kernel(w.reference(), w.spec())
    (call,) = _lowered_calls(kernel)
    _, (step,) = _steps(kernel.graph)
    records = tensor_map_records(step)
    assert records.size == 28 * len(step.launch.tensor_maps) > 0
    text = call.replace(" ", "")
    assert "tensor_maps=dense<[" + ",".join(map(str, records)) + "]>" in text, call
    assert f"block=dense<[{step.launch.block[0]},1,1]>" in text, call


@pytest.mark.skipif(jax_has_gpu(), reason="checks the no-driver path")
def test_without_a_driver_the_handler_says_so_instead_of_encoding():
    from mugraph.jax_ffi import encode_tensor_map, handler_library
    spec = _maps_of_every_kind()[1]
    with pytest.raises(NoDevice, match="libcuda.so.1"):
        encode_tensor_map((0, 0, *spec.record()), 4096)
    assert handler_library().mg_device_smem_optin(0) == -1


def test_the_cuda_backend_builds_per_gpu_what_the_cupy_runtime_builds():
    from mugraph.codegen.device import for_device
    from mugraph.jax_ffi import arch_for, target_build
    assert [arch_for(c) for c in ("8.0", "8.9", "9.0", "10.0", "12.0")] == \
        ["sm_80", "sm_80", "sm_90a", "sm_90", "sm_90"]
    with pytest.raises(NoDevice, match="7.5"):
        arch_for("7.5")
    assert target_build("h200") == target_build("h100") == for_device("9.0")
    assert target_build("a100").codegen == "sm_80"


@pytest.mark.parametrize("size", [2, 4])
def test_a_clustered_plan_runs_right_through_the_harness_primitive_under_jit(size):
    """The harness launcher passes the plan's cluster (blocks of a cluster run together, sharing memory)."""
    from mugraph.jax_integration import HarnessLauncher, run_plan
    from tests.codegen import cluster_plan as cp
    module = cp.module(size)
    launcher = HarnessLauncher(module)
    arrays = cp.inputs(size)
    got = jax.jit(lambda *a: run_plan(module.plan, a, launcher))(*arrays)
    want = cp.expected(*arrays, size)
    np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])
    np.testing.assert_array_equal(np.asarray(got[2]), want[2])


_CUDA_H_ABI = r"""#include <cstddef>
#include <cstdio>
#include <cuda.h>
int main() {
  long v[] = {(long)sizeof(CUlaunchAttribute), (long)offsetof(CUlaunchAttribute, value),
              (long)sizeof(CUlaunchConfig), (long)offsetof(CUlaunchConfig, hStream),
              (long)offsetof(CUlaunchConfig, attrs), (long)offsetof(CUlaunchConfig, numAttrs),
              (long)sizeof(CUtensorMap), (long)alignof(CUtensorMap), CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
              CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
              CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
              CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
              CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CUDA_ERROR_NO_BINARY_FOR_GPU};
  for (long x : v) std::printf("%ld\n", x);
}
"""


def _cuda_include():
    import shutil
    from pathlib import Path
    nvcc = shutil.which("nvcc")
    candidates = [Path(nvcc).resolve().parent.parent / "include"] if nvcc else []
    candidates += [Path("/usr/local/cuda/include")]
    return next((c for c in candidates if (c / "cuda.h").is_file()), None)


def test_the_handlers_copy_of_the_driver_abi_is_cuda_h_s(tmp_path):
    """The handler builds without CUDA headers, so it declares CUlaunchConfig, CUlaunchAttribute, CUtensorMap
    and the enum values it passes; compiled against cuda.h, the same sizes, offsets and values."""
    import subprocess
    from mugraph.jax_ffi import handler_library
    include = _cuda_include()
    if include is None:
        pytest.skip("no CUDA toolkit headers (cuda.h) on this machine")
    (tmp_path / "abi.cc").write_text(_CUDA_H_ABI)
    subprocess.run(["g++", "-std=c++17", f"-I{include}", str(tmp_path / "abi.cc"), "-o", str(tmp_path / "abi")],
                   check=True, capture_output=True)
    want = [int(v) for v in subprocess.run([str(tmp_path / "abi")], capture_output=True, text=True,
                                           check=True).stdout.split()]
    out = (ctypes.c_int64 * 32)()
    n = handler_library().mg_driver_abi(out, 32)
    assert list(out[:n]) == want
