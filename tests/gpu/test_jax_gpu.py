"""Kernels inside JAX on a GPU: the NVRTC CUBIN launched by the XLA FFI handler on XLA's stream,
under jax.jit, jax.grad and jax.vmap, against pure JAX; CuPy arrays passed without a copy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mugraph
from mugraph import workloads
from mugraph.api import Kernel
from mugraph.jax_integration import jax_has_gpu
from mugraph.search import SearchConfig

pytestmark = pytest.mark.skipif(not jax_has_gpu(),
                                reason="JAX sees no GPU (install jax[cuda13] next to CuPy)")


def layer(x, w):
    return jax.nn.relu(x @ w) * 2.0


def test_a_model_with_a_cuda_kernel_matches_pure_jax_under_jit_grad_and_vmap():
    f = mugraph.jit(layer, backend="cuda", config=SearchConfig(max_kernel_ops=1, budget_seconds=60))
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    p = {"w1": jax.random.normal(k1, (64, 32)) / 8, "w2": jax.random.normal(k2, (32, 8))}
    x = jax.random.normal(k3, (16, 64))

    def model(p, x, g):
        return jnp.sum(jnp.tanh(g(x, p["w1"]) @ p["w2"]))

    loss, grads = jax.jit(jax.value_and_grad(lambda p, x: model(p, x, f)))(p, x)
    want_loss, want = jax.value_and_grad(lambda p, x: model(p, x, layer))(p, x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-3)
    for name in ("w1", "w2"):
        scale = float(jnp.abs(want[name]).max())
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-3, atol=2e-3 * scale)
    xs = jnp.stack([x, -x])
    got = jax.jit(jax.vmap(lambda xi: f(xi, p["w1"])))(xs)
    np.testing.assert_allclose(got, jax.vmap(lambda xi: layer(xi, p["w1"]))(xs), rtol=1e-3, atol=1e-3)
    text = jax.jit(lambda x: f(x, p["w1"])).lower(x).as_text()
    assert "custom_call @mugraph_launch" in text


@pytest.mark.parametrize("name", ["lora", "gqa", "rmsnorm_linear"])
def test_workload_kernels_through_xla_match_the_reference(name):
    w = workloads.get(name).small()
    kernel = Kernel(w.reference(), w.spec())
    arrays = w.random_inputs(0)
    got = jax.jit(kernel.as_jax("cuda"))(*arrays)
    got = got if isinstance(got, tuple) else (got,)
    want = kernel.run_reference(*arrays)
    for g, e in zip(got, want if isinstance(want, list) else [want]):
        scale = max(float(np.abs(e).max()), 1e-3)
        assert np.abs(np.asarray(g, np.float64) - e).max() <= 2e-2 * scale


def test_cupy_arrays_enter_without_a_copy():
    import cupy
    w = workloads.get("lora").small()
    kernel = Kernel(w.reference(), w.spec())
    arrays = [cupy.asarray(a) for a in w.random_inputs(0)]
    out = kernel.as_jax("cuda")(*arrays)
    assert isinstance(out, jax.Array)
    back = cupy.from_dlpack(out)
    want = kernel.run_reference(*[cupy.asnumpy(a) for a in arrays])
    assert np.abs(cupy.asnumpy(back).astype(np.float64) - want).max() <= 2e-2 * np.abs(want).max()
