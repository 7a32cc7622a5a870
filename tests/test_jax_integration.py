"""Kernels inside JAX: a mugraph kernel under jax.jit, jax.grad and jax.vmap on the CPU harness,
and the CUDA path's custom call traced and lowered without a GPU."""
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
    w = workloads.get("lora").small()
    kernel = Kernel(w.reference(), w.spec())
    plan = generate(kernel.graph, "sm_90").plan
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
    compiled = compile_cuda(generate(lora.reference(), "sm_90").source, "sm_90", name="mugraph_kernel")
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
