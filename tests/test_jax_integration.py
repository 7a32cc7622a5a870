"""Kernels inside JAX: a mugraph kernel under jax.jit, jax.grad and jax.vmap on the CPU harness,
and the CUDA path's custom call traced and lowered without a GPU."""
from __future__ import annotations

import ctypes

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


def test_the_cuda_path_lowers_to_the_mugraph_custom_call_without_a_gpu():
    w = workloads.get("lora").small()
    kernel = Kernel(w.reference(), w.spec())
    f = as_jax(kernel, "cuda", require_device=False)
    specs = [jax.ShapeDtypeStruct(n.shape, n.dtype.numpy) for n in kernel.graph.inputs]
    text = jax.jit(f).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @mugraph_launch" in line]
    assert len(calls) == len(kernel.graph.custom_ops())
    assert 'kernel = "mg_kernel0"' in calls[0] and "params = dense<" in calls[0]


def test_the_ffi_handler_builds_loads_and_registers(tmp_path):
    from mugraph.jax_ffi import _loads, build_handler, handler_library, register_cubin
    lib = ctypes.CDLL(str(build_handler()))
    assert lib.MugraphLaunch and lib.mg_register_module
    garbage = tmp_path / "mugraph_launch-x.so"
    garbage.write_bytes(b"garbage")  # a damaged build counts as missing: it is removed and rebuilt
    assert not _loads(garbage) and not garbage.exists()
    first = register_cubin(b"\x7fELF not really a cubin")
    assert register_cubin(b"\x7fELF not really a cubin") == first
    assert handler_library().mg_module_count() >= 1


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
