"""Kernels inside JAX: a found μGraph as a JAX-traceable function that works under `jax.jit`,
`jax.grad` (a `jax.custom_vjp` whose backward is JAX's own VJP of the spec) and `jax.vmap`.

The launch plan runs step by step inside the traced program: library launches are JAX ops with
the library table's own-dtype meaning (`codegen.library_ops`, with `jax.numpy` as the array
module), custom kernels are one primitive each. `backend="cuda"` makes that primitive an XLA FFI
call that launches the NVRTC CUBIN on XLA's stream (`mugraph.jax_ffi`), generated for the GPU
present; `backend="harness"` a host callback that runs the generated CUDA on the CPU harness,
generated for the kernel's target GPU (sm_90a's TMA + wgmma code for h100 / h200: what that GPU
would run). Under `jax.vmap` both
primitives run once per batch element (`vmap_method="sequential"`), the documented fallback to
mapping the batch onto the grid. A plan's workspace (`LaunchPlan.workspace`: a split loop's
partials and counters) is never a JAX value: each launcher allocates it for the call, zeroed where
the plan says so.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mugraph.ir.errors import InvalidInput, NoDevice, UnsupportedOp
from mugraph.ir.graph import KernelGraph
from mugraph.ir.ops import KOp

BACKENDS = ("auto", "cuda", "harness")


# ---- the library table with jax.numpy as its array module ----------------------------------------
class _JaxArrays:
    """`jax.numpy` as `codegen.library_ops`' `xp`: fp32-accumulating matmul at full precision
    (XLA's default on GPUs is TF32), and JAX's scipy special functions."""

    scipy_special = jax.scipy.special

    def __getattr__(self, name):
        return getattr(jnp, name)

    @staticmethod
    def matmul(a, b, out=None):
        value = jnp.matmul(a, b, preferred_element_type=jnp.float32,
                           precision=jax.lax.Precision.HIGHEST)
        if out is None:
            return value
        out[...] = value
        return out


JAX_ARRAYS = _JaxArrays()


class _Result:
    """The `out` argument of a library entry: it keeps the value written to it, rounded once."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.value = None

    def __setitem__(self, key, value):
        value = jnp.asarray(value).astype(self.dtype)
        self.value = jnp.broadcast_to(value, self.shape)

    def fill(self, scalar):
        self.value = jnp.full(self.shape, scalar, self.dtype)


def library_value(node, srcs: Sequence):
    """`node` (any kernel op but input and custom) computed by JAX from its operands' values."""
    from mugraph.codegen.library_ops import library_op
    out = _Result(node.shape, node.dtype.numpy)
    library_op(node.op)(JAX_ARRAYS, node, list(srcs), out)
    return out.value


def graph_function(graph: KernelGraph) -> Callable:
    """The graph as a pure JAX function (its flat outputs as a tuple): JAX can differentiate it.

    Custom ops have no JAX meaning here; the spec a search starts from has none."""
    customs = [n for n in graph.nodes if n.op is KOp.CUSTOM]
    if customs:
        raise UnsupportedOp("a graph with custom kernels has no JAX form to differentiate",
                            primitive="custom",
                            hint="differentiate the spec: superoptimize a JAX function or a graph "
                                 "without custom ops")

    def run(*arrays):
        values = dict(zip(graph.inputs, arrays))
        for node in graph.nodes:
            if node not in values:
                values[node] = library_value(node, [values[s] for s in node.srcs])
        return tuple(values[o] for o in graph.outputs)

    return run


# ---- the launch plan as JAX steps ------------------------------------------------------------------
@dataclass(frozen=True)
class CustomStep:
    """One custom-kernel launch: the buffers it reads, the ones it writes (in `launch.args`), and the
    workspace the launcher allocates for it (never a JAX value: see `codegen.plan.Buffer`)."""

    launch: object                  # codegen.plan.KernelLaunch
    reads: tuple                    # buffer names, in the order the primitive receives them
    writes: tuple                   # buffer names it produces, in the order it returns them
    workspace: tuple = ()           # codegen.plan.Buffer per workspace argument, in argument order


def plan_steps(plan) -> list:
    """The plan's launches in order: `CustomStep`s and library `KernelLaunch`es."""
    defined = set(plan.inputs)
    steps = []
    for launch in plan.kernels:
        if launch.kind == "custom":
            workspace = plan.launch_workspace(launch)
            private = {b.name for b in workspace}
            reads = tuple(a for a in dict.fromkeys(launch.args) if a in defined)
            writes = tuple(a for a in launch.args if a not in defined and a not in private)
            steps.append(CustomStep(launch, reads, writes, workspace))
            defined.update(writes)
        else:
            steps.append(launch)
            defined.add(launch.args[-1])
    return steps


def run_plan(plan, arrays, launch_custom: Callable) -> tuple:
    """The plan's outputs from JAX values of its inputs; `launch_custom(step, inputs, results)`
    runs one custom kernel (`results`: a ShapeDtypeStruct per written buffer)."""
    buffers = {b.name: b for b in plan.buffers}
    env = dict(zip(plan.inputs, arrays))
    for step in plan_steps(plan):
        if isinstance(step, CustomStep):
            results = [jax.ShapeDtypeStruct(buffers[w].shape, buffers[w].dtype.numpy)
                       for w in step.writes]
            outs = launch_custom(step, [env[r] for r in step.reads], results)
            env.update(zip(step.writes, outs))
        else:
            *srcs, out = step.args
            env[out] = library_value(step.library_op, [env[s] for s in srcs])
    return tuple(env[o] for o in plan.outputs)


# ---- the harness primitive -------------------------------------------------------------------------
class HarnessLauncher:
    """Custom kernels on the CPU harness through `jax.pure_callback` (built once, on first use)."""

    def __init__(self, module):
        self.module = module
        self._cpu = None

    def cpu(self):
        if self._cpu is None:
            from mugraph.codegen.cpu import build_cpu
            names = [k.name for k in self.module.plan.kernels if k.kind == "custom"]
            self._cpu = build_cpu(self.module.source, list(dict.fromkeys(names)))
        return self._cpu

    def __call__(self, step: CustomStep, inputs, results):
        host = functools.partial(self._run, step, results)
        return jax.pure_callback(host, results, *inputs, vmap_method="sequential")

    def _run(self, step: CustomStep, results, *inputs):
        from mugraph.codegen.run_cpu import aligned_empty
        arrays = {}
        for name, value in zip(step.reads, inputs):
            value = np.asarray(value)
            arrays[name] = aligned_empty(value.shape, value.dtype)
            arrays[name][...] = value
        for name, spec in zip(step.writes, results):
            arrays[name] = aligned_empty(spec.shape, spec.dtype)
            arrays[name][...] = np.nan  # an element the kernel does not write shows up
        for buffer in step.workspace:  # this call's own; NaN where the plan promises nothing
            arrays[buffer.name] = aligned_empty(buffer.shape, buffer.dtype.numpy)
            arrays[buffer.name][...] = 0 if buffer.zero_init else np.nan
        launch = step.launch
        maps = [m.encode_cpu(arrays[m.buffer].ctypes.data) for m in launch.tensor_maps]  # sm_90a: TMA
        self.cpu().run(launch.name, [arrays[a] for a in launch.args] + maps, launch.grid, launch.block,
                       launch.smem_bytes, cluster=launch.cluster)
        return tuple(arrays[w] for w in step.writes)


# ---- the public function ---------------------------------------------------------------------------
def resolve_backend(backend: str) -> str:
    """`auto` -> `cuda` where JAX sees a GPU, else `harness`; an unknown name is InvalidInput."""
    if backend not in BACKENDS:
        raise InvalidInput(f"unknown backend {backend!r}", hint=f"one of: {', '.join(BACKENDS)}")
    if backend == "auto":
        return "cuda" if jax_has_gpu() else "harness"
    return backend


def jax_has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def as_jax(kernel, backend: str = "auto", *, spec_fn: Callable | None = None,
           out_dtypes: Sequence | None = None, require_device: bool = True) -> Callable:
    """`kernel` as a function of JAX arrays (an array for one output, else a tuple).

    `spec_fn` (flat arrays -> tuple of arrays) is what the backward pass differentiates; by
    default the spec graph run by JAX. `out_dtypes` casts the outputs (explicitly: a spec whose
    last cast the IR could not keep). `require_device=False` lets `backend="cuda"` be traced and
    lowered on a machine without a GPU (for inspecting the custom call)."""
    backend = resolve_backend(backend)
    graph = kernel.graph
    module, launcher = _launcher(kernel, backend, require_device)
    spec_fn = spec_fn or graph_function(kernel.spec)
    casts = tuple(out_dtypes) if out_dtypes is not None else None

    def forward(*arrays):
        outs = run_plan(module.plan, arrays, launcher)
        if casts is not None:
            outs = tuple(o.astype(d) for o, d in zip(outs, casts))
        return outs

    differentiable = _with_spec_vjp(forward, spec_fn)

    @functools.wraps(forward)
    def call(*arrays):
        arrays = [_to_jax(a) for a in arrays]
        _check_inputs(graph, arrays)
        outs = differentiable(*arrays)
        return outs[0] if len(outs) == 1 else outs

    call.backend = backend
    call.kernel = kernel
    return call


def _launcher(kernel, backend: str, require_device: bool):
    from mugraph.codegen import generate
    from mugraph.codegen.device import generate_for
    if backend == "harness":
        module = generate(kernel.graph, target_arch(kernel.target))
        return module, HarnessLauncher(module)
    from mugraph.jax_ffi import CudaLauncher, device_build, target_build
    if require_device and not jax_has_gpu():
        raise NoDevice("backend='cuda' needs a GPU that JAX sees (jax.devices() has none)",
                       hint="backend='harness' runs the generated CUDA on the CPU harness inside "
                            "the same JAX program")
    device = device_build() if require_device else target_build(kernel.target)
    module = generate_for(kernel.graph, device)
    return module, CudaLauncher(module, device)


def target_arch(target: str) -> str:
    """The generator's arch for the cost model's GPU `target` (sm_90a for h100 and h200)."""
    from mugraph.search.targets import get_target
    return get_target(target).arch


def _with_spec_vjp(forward: Callable, spec_fn: Callable) -> Callable:
    """`forward` with a custom VJP: the backward is JAX's VJP of `spec_fn` at the same inputs."""
    fn = jax.custom_vjp(forward)

    def fwd(*arrays):
        return forward(*arrays), arrays

    def bwd(arrays, cotangents):
        _, vjp = jax.vjp(lambda *a: tuple(spec_fn(*a)), *arrays)
        return vjp(tuple(cotangents))

    fn.defvjp(fwd, bwd)
    return fn


def _to_jax(x):
    """JAX values as they are; DLPack arrays (CuPy, NumPy) without a copy where JAX can share."""
    if isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        return x
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        try:
            return jax.dlpack.from_dlpack(x)
        except Exception:  # a device JAX does not manage: fall back to a copy
            pass
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise InvalidInput(f"a kernel input is a {type(x).__name__}, not an array",
                           hint="pass JAX, NumPy or CuPy arrays")
    return jnp.asarray(x)


def _check_inputs(graph: KernelGraph, arrays) -> None:
    if len(arrays) != len(graph.inputs):
        raise InvalidInput(f"the kernel takes {len(graph.inputs)} inputs {list(graph.input_names)}, "
                           f"got {len(arrays)}")
    for name, node, a in zip(graph.input_names, graph.inputs, arrays):
        if tuple(a.shape) != node.shape:
            raise InvalidInput(f"input {name!r} has shape {tuple(a.shape)}, the kernel expects "
                               f"{node.shape}",
                               hint="mugraph.jit(fn) compiles per shape; a Kernel has one")
        if np.dtype(a.dtype) != node.dtype.numpy:
            raise InvalidInput(f"input {name!r} has dtype {np.dtype(a.dtype)}, the kernel expects "
                               f"{node.dtype.value}",
                               hint=f"cast it explicitly: x.astype(jnp.{node.dtype.value})")


# ---- a user's function, flattened ------------------------------------------------------------------
@dataclass(frozen=True)
class FlatFunction:
    """`fn` over flat array leaves: `run(*leaves) -> tuple`, the pytrees to rebuild its arguments
    and results, and the result dtypes JAX gives it."""

    run: Callable
    in_tree: object
    out_tree: object
    out_dtypes: tuple


def flatten_function(fn: Callable, example_args: Sequence) -> FlatFunction:
    """`fn` at `example_args` (arrays or ShapeDtypeStructs, in pytrees) as a FlatFunction."""
    leaves, in_tree = jax.tree_util.tree_flatten(tuple(example_args))
    specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves]
    out_shape = jax.eval_shape(fn, *jax.tree_util.tree_unflatten(in_tree, specs))
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_shape)

    def run(*flat):
        return tuple(jax.tree_util.tree_leaves(fn(*jax.tree_util.tree_unflatten(in_tree, flat))))

    return FlatFunction(run, in_tree, out_tree, tuple(np.dtype(o.dtype) for o in out_leaves))
