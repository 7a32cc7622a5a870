"""The public entry points: `superoptimize`, `Kernel` and `jit`."""
from __future__ import annotations

import functools
import importlib.util
import warnings
from pathlib import Path

import numpy as np

from mugraph import ir
from mugraph.ir import KernelGraph
from mugraph.ir.errors import InvalidInput, MugraphError


class Kernel:
    """A found μGraph with its report, its CUDA source and ways to run it."""

    def __init__(self, graph: KernelGraph, spec: KernelGraph, result=None, target: str = "h100"):
        self.graph = graph
        self.spec = spec
        self.result = result
        self.target = target
        self._cuda = None
        self._runtime = None

    @property
    def report(self):
        """The search report: counts, stop reason, verification, estimate and speedup."""
        return None if self.result is None else self.result.report

    @property
    def cuda_source(self) -> str:
        if self._cuda is None:
            from mugraph.codegen import generate_cuda
            from mugraph.search.targets import get_target
            self._cuda = generate_cuda(self.graph, arch=get_target(self.target).arch)
        return self._cuda

    def show(self) -> str:
        """The μGraph as text (kernel graph and each block's loop nest), plus the report."""
        text = str(self.graph)
        if self.result is not None:
            text += "\n\n" + self.result.summary()
        print(text)
        return text

    def run_reference(self, *arrays) -> list[np.ndarray]:
        """Run the μGraph with the reference interpreter (float64), anywhere."""
        return ir.interpret(self.graph, [np.asarray(a) for a in arrays])

    def run_on_cpu(self, *arrays) -> list[np.ndarray]:
        """Run the generated CUDA on the CPU harness (slow; for testing the emitted kernel)."""
        from mugraph.codegen import run_on_cpu
        return run_on_cpu(self.graph, [np.asarray(a) for a in arrays])

    def __call__(self, *arrays):
        """Launch on the GPU (CuPy or JAX arrays); outputs are CuPy arrays."""
        if self._runtime is None:
            from mugraph.codegen.runtime_cupy import load_kernel
            self._runtime = load_kernel(self.graph, target=self.target)
        return self._runtime(*arrays)

    def __repr__(self) -> str:
        return f"Kernel({self.graph!r})"


def superoptimize(fn_or_graph, *example_args, config=None, target: str | None = None,
                  progress=None) -> Kernel:
    """Trace (if given a JAX function), search, verify, rank and wrap the winner as a Kernel.

    Without a `config`, the search budget is $MUGRAPH_SEARCH_SECONDS (default 300 s); `target`
    defaults to the config's, else $MUGRAPH_TARGET (default h100).
    """
    from mugraph.search import search
    if isinstance(fn_or_graph, KernelGraph):
        if example_args:
            raise InvalidInput("superoptimize(graph) takes no example arguments",
                               hint="pass the graph alone, or a JAX function and its arguments")
        spec = fn_or_graph
    elif callable(fn_or_graph):
        spec = ir.from_jax(fn_or_graph, *example_args)
    else:
        raise InvalidInput(f"superoptimize takes a JAX function or a KernelGraph, got "
                           f"{type(fn_or_graph).__name__}")
    config = _config(config, target)
    result = search(spec, config, progress=progress)
    return Kernel(result.best, spec, result, config.target)


def _config(config, target: str | None):
    """The search config: the given one (its target replaced by `target` if given), else the
    defaults with the budget and target from the settings."""
    from mugraph.ir.settings import settings
    from mugraph.search import SearchConfig
    if config is None:
        config = SearchConfig(budget_seconds=settings.search_seconds, target=settings.target)
    return config if target is None or config.target == target else config.replace(target=target)


def jit(fn=None, *, config=None, target: str | None = None):
    """Compile `fn` on first call per input shapes; without a GPU, run `fn` itself (warned once)."""
    if fn is None:
        return functools.partial(jit, config=config, target=target)
    kernels: dict = {}
    warned = []

    @functools.wraps(fn)
    def wrapper(*arrays):
        from mugraph.codegen.runtime_cupy import gpu_available
        if not gpu_available():
            if not warned:
                warnings.warn("mugraph.jit: no CUDA device; running the JAX function instead",
                              RuntimeWarning, stacklevel=2)
                warned.append(True)
            return fn(*arrays)
        key = tuple((np.shape(a), str(getattr(a, "dtype", ""))) for a in arrays)
        if key not in kernels:
            kernels[key] = superoptimize(fn, *arrays, config=config, target=target)
        outs = kernels[key](*arrays)
        return outs[0] if len(outs) == 1 else tuple(outs)

    return wrapper


def load_function(spec: str):
    """`FILE.py:FUNCTION` -> (function, example args). The file defines FUNCTION and either
    `FUNCTION_args` / `EXAMPLE_ARGS` (a list of arrays or jax.ShapeDtypeStruct) for it."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise InvalidInput(f"{spec!r} is not FILE.py:FUNCTION")
    file = Path(path)
    if not file.is_file():
        raise InvalidInput(f"no such file {path!r}", hint="give a path to a Python file")
    module_spec = importlib.util.spec_from_file_location(f"mugraph_user_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report, do not crash
        raise MugraphError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InvalidInput(f"{path} has no function {name!r}")
    args = getattr(module, f"{name}_args", None) or getattr(module, "EXAMPLE_ARGS", None)
    if args is None:
        raise InvalidInput(f"{path} must define {name}_args (or EXAMPLE_ARGS): the example "
                           "arguments to trace it with",
                           hint=f"e.g. {name}_args = [jax.ShapeDtypeStruct((16, 64), jnp.float16)]")
    return fn, list(args)
